//! Typical acceptance (Medusa, Cai et al. 2024) — **lossy**.
//!
//! A child with token `x` is accepted when `p(x) > min(epsilon, delta * exp(−H(p)))`, `H` the
//! entropy of the target row at its parent (computed in `f64`); the first such child (lowest
//! index) is descended into. When none qualifies, the next token is drawn from `p` (key: node,
//! [`Purpose::Sample`]). The emitted distribution differs from the target's in general; the proof
//! machinery shows it (a negative control).

use super::input::{walk_tree, Verdict, VerifyInput};
use crate::sampling::{sample_bonus, Decisions, Prob, Purpose};

/// The acceptance threshold `min(epsilon, delta * exp(−H(p)))` for a target row.
pub fn typical_threshold<N: Prob>(p: &[N], epsilon: f64, delta: f64) -> f64 {
    let entropy: f64 = p
        .iter()
        .map(|v| v.to_f64())
        .filter(|&v| v > 0.0)
        .map(|v| -v * v.ln())
        .sum();
    epsilon.min(delta * (-entropy).exp())
}

/// Typical-acceptance verification of one sequence (input already validated).
pub fn verify_typical<N: Prob, D: Decisions<N> + ?Sized>(
    input: &VerifyInput<'_, N>,
    decisions: &mut D,
    epsilon: f64,
    delta: f64,
) -> Verdict {
    walk_tree(|node| {
        let p = &input.target_probs[node];
        let threshold = typical_threshold(p, epsilon, delta);
        let typical = input
            .tree
            .topology()
            .children(node)
            .iter()
            .copied()
            .find(|&c| p[input.tree.token(c) as usize].to_f64() > threshold);
        typical.ok_or_else(|| sample_bonus(decisions, input.key(node, Purpose::Sample), p) as u32)
    })
}
