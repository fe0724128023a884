//! Greedy verification: accept a child iff its token is the target's argmax at its parent.
//!
//! From the root, repeatedly take `t = argmax p(node)` (lowest id on ties) and descend into the
//! first child (lowest index) whose token is `t`; when none is, `t` is the next token (a
//! correction, or the bonus at a leaf). No random decisions. Equals greedy decoding of the
//! target for every draft tree.

use super::input::{Verdict, VerifyInput};
use crate::sampling::{argmax, Prob};

/// Greedy verification of one sequence (input already validated).
pub fn verify_greedy<N: Prob>(input: &VerifyInput<'_, N>) -> Verdict {
    let topology = input.tree.topology();
    let mut node = 0;
    let mut path = Vec::new();
    loop {
        let best = argmax(&input.target_probs[node]) as u32;
        match topology
            .children(node)
            .iter()
            .find(|&&c| input.tree.token(c) == best)
        {
            Some(&child) => {
                path.push(child);
                node = child;
            }
            None => return Verdict::new(path, best),
        }
    }
}
