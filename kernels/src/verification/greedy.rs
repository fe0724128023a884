//! Greedy verification: accept a child iff its token is the target's argmax at its parent.
//!
//! From the root, repeatedly take `t = argmax p(node)` (lowest id on ties) and descend into the
//! first child (lowest index) whose token is `t`; when none is, `t` is the next token (a
//! correction, or the bonus at a leaf). No random decisions. Equals greedy decoding of the
//! target for every draft tree.

use super::input::{walk_tree, Verdict, VerifyInput};
use crate::sampling::{argmax, Prob};

/// Greedy verification of one sequence (input already validated).
pub fn verify_greedy<N: Prob>(input: &VerifyInput<'_, N>) -> Verdict {
    walk_tree(|node| {
        let best = argmax(&input.target_probs[node]) as u32;
        input.tree.child_with_token(node, best).ok_or(best)
    })
}
