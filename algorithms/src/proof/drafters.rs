//! Toy drafters for the proofs: chains and trees drawn from a toy draft model.
//!
//! These are the minimal drafters the exact proofs need (the general `Drafter` trait lives
//! elsewhere in `specdec-algorithms`). Every node's draft distribution `q` — the draft model's row
//! after the node's path, prepared with the same [`SamplingParams`] as the target — is recorded in
//! the [`DraftTree`], at expanded nodes and leaves alike. Nodes are numbered breadth first, so
//! parents precede children and siblings keep their drawing order.
//!
//! Draft decisions are keyed `(sequence, step, new node, Purpose::Draft)`.

use crate::error::Result;
use specdec_kernels::sampling::{
    argmax, prepare_probs, Decisions, DrawKey, Prob, Purpose, SamplingParams,
};
use specdec_kernels::verification::{DraftKind, DraftTree};
use specdec_kernels::TreeTopology;
use specdec_models::toy::ToyModel;

/// A toy drafter's shape and drawing rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToyDrafter {
    /// A chain of `k` drafts, each drawn from `q` after the previous ones ([`DraftKind::Iid`]).
    Chain {
        /// Number of drafted tokens.
        k: usize,
    },
    /// A tree where every node at depth `d` gets `widths[d]` children, drawn per `kind`:
    /// i.i.d. from `q`; from `q` without replacement (fewer children when `q` runs out of
    /// tokens); or deterministically as the top `widths[d]` tokens of `q` (ties: lower id).
    Tree {
        /// Children per node at each depth (the tree's depth is `widths.len()`).
        widths: Vec<usize>,
        /// How children are drawn.
        kind: DraftKind,
    },
}

impl ToyDrafter {
    /// The kind of tree this drafter produces.
    pub fn kind(&self) -> DraftKind {
        match self {
            ToyDrafter::Chain { .. } => DraftKind::Iid,
            ToyDrafter::Tree { kind, .. } => *kind,
        }
    }

    /// Children per node at each depth.
    pub fn widths(&self) -> Vec<usize> {
        match self {
            ToyDrafter::Chain { k } => vec![1; *k],
            ToyDrafter::Tree { widths, .. } => widths.clone(),
        }
    }

    /// A short description for tables: `chain K=3`, `tree 2x1 without-replacement`.
    pub fn describe(&self) -> String {
        match self {
            ToyDrafter::Chain { k } => format!("chain K={k}"),
            ToyDrafter::Tree { widths, kind } => {
                let shape: Vec<String> = widths.iter().map(usize::to_string).collect();
                format!("tree {} {kind}", shape.join("x"))
            }
        }
    }

    /// Drafts a tree after `context` (whose last token becomes the root).
    ///
    /// # Errors
    /// An empty `context`, or preparation errors (e.g. an inexact temperature for rationals).
    pub fn draft<N: Prob>(
        &self,
        model: &ToyModel,
        params: &SamplingParams,
        context: &[u32],
        sequence: u64,
        step: u64,
        decisions: &mut dyn Decisions<N>,
    ) -> Result<DraftTree<N>> {
        let root =
            *context
                .last()
                .ok_or_else(|| specdec_kernels::KernelError::InvalidDraftTree {
                    reason: "drafting needs a non-empty context (the root token)".into(),
                })?;
        let kind = self.kind();
        let mut parents: Vec<Option<usize>> = vec![None];
        let mut tokens = vec![root];
        let mut contexts = vec![context.to_vec()];
        let mut draft_probs: Vec<Option<Vec<N>>> = Vec::new();
        let mut frontier = vec![0usize];
        for &width in &self.widths() {
            let mut next_frontier = Vec::new();
            for &node in &frontier {
                let q = prepare_probs(&model.next_probs_as::<N>(&contexts[node]), params)?;
                let children = draw_children(
                    &q,
                    width,
                    kind,
                    |child| DrawKey::new(sequence, step, parents.len() + child, Purpose::Draft),
                    decisions,
                );
                for token in children {
                    let child = parents.len();
                    parents.push(Some(node));
                    tokens.push(token);
                    let mut child_context = contexts[node].clone();
                    child_context.push(token);
                    contexts.push(child_context);
                    next_frontier.push(child);
                }
                record(&mut draft_probs, node, q);
            }
            frontier = next_frontier;
        }
        for &leaf in &frontier {
            let q = prepare_probs(&model.next_probs_as::<N>(&contexts[leaf]), params)?;
            record(&mut draft_probs, leaf, q);
        }
        draft_probs.resize(parents.len(), None);
        Ok(DraftTree::new(
            TreeTopology::from_parents(&parents)?,
            tokens,
            draft_probs,
            kind,
        )?)
    }
}

fn record<N>(draft_probs: &mut Vec<Option<Vec<N>>>, node: usize, q: Vec<N>) {
    if draft_probs.len() <= node {
        draft_probs.resize_with(node + 1, || None);
    }
    draft_probs[node] = Some(q);
}

/// The tokens of up to `width` children drawn from `q` per `kind`; `key(i)` keys the `i`-th draw.
fn draw_children<N: Prob>(
    q: &[N],
    width: usize,
    kind: DraftKind,
    key: impl Fn(usize) -> DrawKey,
    decisions: &mut dyn Decisions<N>,
) -> Vec<u32> {
    match kind {
        DraftKind::Iid => (0..width)
            .map(|i| {
                decisions
                    .categorical(key(i), q)
                    .unwrap_or_else(|| argmax(q)) as u32
            })
            .collect(),
        DraftKind::WithoutReplacement => {
            let mut remaining = q.to_vec();
            let mut drawn = Vec::new();
            for i in 0..width {
                match decisions.categorical(key(i), &remaining) {
                    Some(token) => {
                        remaining[token] = N::zero();
                        drawn.push(token as u32);
                    }
                    None => break,
                }
            }
            drawn
        }
        DraftKind::Deterministic => {
            let mut order: Vec<usize> = (0..q.len()).collect();
            order.sort_by(|&a, &b| q[b].partial_cmp(&q[a]).unwrap_or(std::cmp::Ordering::Equal));
            order.into_iter().take(width).map(|t| t as u32).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proof::enumerate::{enumerate, Enumerator};
    use specdec_kernels::sampling::{ratio, BigRational, Replay};

    fn model() -> ToyModel {
        ToyModel::from_weights(3, 0, &[vec![1, 1, 2]]).unwrap()
    }

    #[test]
    fn deterministic_trees_take_top_tokens_with_low_ids_first() {
        let tree = ToyDrafter::Tree {
            widths: vec![2, 1],
            kind: DraftKind::Deterministic,
        }
        .draft::<f64>(
            &model(),
            &SamplingParams::default(),
            &[0],
            0,
            0,
            &mut Replay::production(0),
        )
        .unwrap();
        assert_eq!(tree.tokens(), &[0, 2, 0, 2, 2]);
        assert_eq!(
            tree.topology().parents(),
            &[None, Some(0), Some(0), Some(1), Some(2)]
        );
        assert!(tree.draft_probs(4).is_some(), "q recorded at leaves too");
    }

    #[test]
    fn without_replacement_draws_distinct_siblings_with_exact_law() {
        let drafter = ToyDrafter::Tree {
            widths: vec![2],
            kind: DraftKind::WithoutReplacement,
        };
        let dist = enumerate(|e: &mut Enumerator<BigRational>| {
            let tree = drafter.draft(&model(), &SamplingParams::default(), &[0], 0, 0, e)?;
            Ok(tree.tokens().to_vec())
        })
        .unwrap();
        // First 2 (1/2), then 0 or 1 (1/2 each of the rest).
        assert_eq!(dist.prob(&vec![0, 2, 0]), ratio(1, 4));
        assert_eq!(dist.prob(&vec![0, 0, 2]), ratio(1, 4) * ratio(2, 3));
        assert!(dist.iter().all(|(t, _)| t[1] != t[2]));
        assert_eq!(dist.total(), ratio(1, 1));
    }

    #[test]
    fn greedy_without_replacement_stops_when_q_runs_out() {
        let drafter = ToyDrafter::Tree {
            widths: vec![3],
            kind: DraftKind::WithoutReplacement,
        };
        let tree = drafter
            .draft::<f64>(
                &model(),
                &SamplingParams::greedy(),
                &[0],
                0,
                0,
                &mut Replay::production(0),
            )
            .unwrap();
        assert_eq!(tree.tokens(), &[0, 2]);
    }
}
