//! The limit every method shares on the drafts one step proposes, and the checks that hold a
//! config's sizes to it before anything is built.
//!
//! One speculation step drafts at most [`MAX_DRAFTS`] tokens: a chain of K, or a tree of K
//! draft nodes. The limit is checked on every size a method config sets that counts drafts (a
//! policy's K or `k_max`, a tree's `nodes`, the node count a `branching` list implies), so a
//! config asking for more is refused at validation with the number, not by an abort, an
//! out-of-memory kill or a hang once the run has started. The limits of one entry alone (the
//! n-gram match length, the dynamic tree's `top_k`) live in that entry's file.

/// The most draft tokens one step may propose (chain length or tree nodes): 1024.
///
/// Why 1024: the verify pass scores every draft at once and tree attention keeps a node × node
/// ancestor mask, so the cost of a step grows with the square of its drafts (a million nodes,
/// `branching = [1000, 1000]`, would need 125 GB of mask); the largest trees the literature
/// finds worth drafting are a few hundred nodes (Sequoia's 768 on an A100; EAGLE-2 uses 60,
/// Medusa 64), and at 1024 a CPU verify pass already costs far more than the drafts can repay.
pub const MAX_DRAFTS: usize = 1024;

/// Checks that `field` (a count of drafts per step) is at most [`MAX_DRAFTS`].
///
/// # Errors
/// The message names `field`, its value and the limit.
pub fn check_drafts(field: &str, value: usize) -> Result<(), String> {
    if value > MAX_DRAFTS {
        return Err(format!(
            "{field} = {value} drafts per step is over the limit of {MAX_DRAFTS} (a verify pass \
             scores every draft at once, and tree attention costs the square of the nodes)"
        ));
    }
    Ok(())
}

/// The draft nodes of the static tree `branching` describes (`b0 + b0·b1 + …`), computed with
/// checked arithmetic and held to [`MAX_DRAFTS`] before any tree is built.
///
/// # Errors
/// An empty list, a 0 entry, or more than [`MAX_DRAFTS`] nodes (the message names `field`).
pub fn branching_drafts(field: &str, branching: &[usize]) -> Result<usize, String> {
    if branching.is_empty() {
        return Err(format!(
            "{field} is empty: give children per depth, e.g. [3, 2, 1]"
        ));
    }
    if branching.contains(&0) {
        return Err(format!(
            "{field} holds 0: every depth needs at least 1 child"
        ));
    }
    let over = || {
        format!(
            "{field} = {branching:?} makes a tree of more than {MAX_DRAFTS} draft nodes (the \
             limit per step: a verify pass scores every draft at once, and tree attention costs \
             the square of the nodes)"
        )
    };
    let (mut level, mut total) = (1usize, 0usize);
    for &children in branching {
        level = level.checked_mul(children).ok_or_else(over)?;
        total = total.checked_add(level).ok_or_else(over)?;
        if total > MAX_DRAFTS {
            return Err(over());
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use specdec_algorithms::trees::TreeShape;

    #[test]
    fn branching_drafts_counts_the_tree_and_refuses_what_is_over() {
        for branching in [vec![3, 2, 1], vec![1], vec![4, 4, 4, 4], vec![32, 31]] {
            assert_eq!(
                branching_drafts("b", &branching),
                Ok(TreeShape::from_branching(&branching).drafts()),
                "{branching:?}"
            );
        }
        assert_eq!(branching_drafts("b", &[1; MAX_DRAFTS]), Ok(MAX_DRAFTS));
        for bad in [
            vec![1000, 1000],
            vec![1; MAX_DRAFTS + 1],
            vec![usize::MAX, usize::MAX],
            vec![2; 64],
        ] {
            let err = branching_drafts("tree.branching", &bad).unwrap_err();
            assert!(
                err.contains("tree.branching") && err.contains("1024"),
                "{err}"
            );
        }
        assert!(branching_drafts("b", &[]).unwrap_err().contains("empty"));
        assert!(branching_drafts("b", &[2, 0]).unwrap_err().contains("0"));
    }

    #[test]
    fn check_drafts_names_field_value_and_limit() {
        assert!(check_drafts("k", MAX_DRAFTS).is_ok());
        let err = check_drafts("policy.k", 100_000).unwrap_err();
        assert!(
            err.contains("policy.k") && err.contains("100000") && err.contains("1024"),
            "{err}"
        );
    }
}
