//! Target-only tree sampling, for deterministic (e.g. top-k) draft trees.
//!
//! At each node draw `y ~ p(node)` (key: node, [`Purpose::Sample`]); descend into the first
//! child whose token is `y`, or emit `y` as the next token when no child matches (at a leaf `y`
//! is the bonus). The draft distribution is never used, so this is lossless for every tree,
//! however it was drawn; it is the right verifier when drafts were not sampled from `q`.

use super::input::{walk_tree, Verdict, VerifyInput};
use crate::sampling::{sample_bonus, Decisions, Prob, Purpose};

/// Target-only verification of one sequence (input already validated).
pub fn verify_target_only<N: Prob, D: Decisions<N> + ?Sized>(
    input: &VerifyInput<'_, N>,
    decisions: &mut D,
) -> Verdict {
    walk_tree(|node| {
        let p = &input.target_probs[node];
        let y = sample_bonus(decisions, input.key(node, Purpose::Sample), p) as u32;
        input.tree.child_with_token(node, y).ok_or(y)
    })
}
