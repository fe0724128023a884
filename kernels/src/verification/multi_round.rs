//! Multi-round rejection sampling over a draft tree, with the true draft distribution `q`.
//!
//! At the current node (starting at the root) with target `p`, set the residual `r = p` and the
//! proposal `s = q` (the node's recorded draft distribution), then try the children in index
//! order; child `c` with token `x`:
//! - **accept** with probability `min(1, r(x) / s(x))` (key: `c`, [`Purpose::Accept`]) → descend
//!   into `c` and start again there;
//! - on rejection `r ← norm(max(0, r − s))` (falling back to `p` when that has no mass) and, for
//!   children drawn **without replacement**, `s ← norm(s with x removed)` (recursive rejection
//!   sampling); for i.i.d. children `s` stays `q` (SpecInfer-style multi-round sampling).
//!
//! If every child is rejected, the next token is drawn from `r` (key: node,
//! [`Purpose::Residual`]); at a leaf the bonus is drawn from `p` (key: leaf, [`Purpose::Bonus`]).
//! With one child per node this is exactly chain speculative sampling (Leviathan / Chen).
//!
//! Each round is the rejection-sampling lemma applied to target `r` and proposal `s`, conditional
//! on the siblings drawn before, so the emitted path + next token is distributed as the target's
//! own continuation whenever the children really were drawn as declared.

use super::input::{Verdict, VerifyInput};
use crate::error::{KernelError, Result};
use crate::sampling::{normalize, residual, sample_bonus, sample_or, Decisions, Prob, Purpose};

/// How the siblings were drawn, as far as the proposal update is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiblingDraws {
    /// Independently from `q`: the proposal stays `q`.
    Independent,
    /// Without replacement: each rejected token is removed from the proposal.
    WithoutReplacement,
}

/// Multi-round verification of one sequence (input already validated).
///
/// # Errors
/// [`KernelError::InvalidDraftTree`] if an expanded node has no recorded draft distribution.
pub fn verify_multi_round<N: Prob, D: Decisions<N> + ?Sized>(
    input: &VerifyInput<'_, N>,
    decisions: &mut D,
    siblings: SiblingDraws,
) -> Result<Verdict> {
    let tree = input.tree;
    let topology = tree.topology();
    let mut node = 0;
    let mut path = Vec::new();
    loop {
        let p = &input.target_probs[node];
        let children = topology.children(node);
        if children.is_empty() {
            let bonus = sample_bonus(decisions, input.key(node, Purpose::Bonus), p);
            return Ok(Verdict::new(path, bonus as u32));
        }
        let q = tree
            .draft_probs(node)
            .ok_or_else(|| KernelError::InvalidDraftTree {
                reason: format!("verification with q needs the draft distribution at node {node}"),
            })?;
        let mut r = p.clone();
        let mut s = q.to_vec();
        let mut accepted = None;
        for &child in children {
            let x = tree.token(child) as usize;
            if decisions.accept(input.key(child, Purpose::Accept), &r[x], &s[x]) {
                accepted = Some(child);
                break;
            }
            r = normalize(&residual(&r, &s)).unwrap_or_else(|| p.clone());
            if siblings == SiblingDraws::WithoutReplacement {
                s[x] = N::zero();
                if let Some(renormalized) = normalize(&s) {
                    s = renormalized;
                }
            }
        }
        match accepted {
            Some(child) => {
                path.push(child);
                node = child;
            }
            None => {
                let next = sample_or(decisions, input.key(node, Purpose::Residual), &r, p);
                return Ok(Verdict::new(path, next as u32));
            }
        }
    }
}
