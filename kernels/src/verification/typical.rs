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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::Replay;
    use crate::tree::TreeTopology;
    use crate::verification::{DraftKind, DraftTree};

    #[test]
    fn threshold_is_the_smaller_of_epsilon_and_delta_times_exp_minus_entropy() {
        // H(1/2, 1/2) = ln 2, so delta · exp(−H) = delta / 2; a zero entry adds no entropy.
        for p in [vec![0.5f64, 0.5], vec![0.5, 0.0, 0.5]] {
            let threshold = typical_threshold(&p, 0.3, 0.2);
            assert!((threshold - 0.1).abs() < 1e-12, "{p:?}: {threshold}");
            assert_eq!(typical_threshold(&p, 0.05, 0.2), 0.05);
        }
        // A one-hot row has zero entropy: the entropy term is delta itself.
        assert_eq!(typical_threshold(&[0.0f64, 1.0], 0.3, 0.2), 0.2);
    }

    #[test]
    fn only_children_strictly_above_the_threshold_are_typical() {
        // Root children: token 1 (p = 1/4, exactly the threshold: not typical), then token 0
        // (p = 1/2: typical). epsilon = 1/4 < delta · exp(−H) = 2^-1.5.
        let fork = TreeTopology::from_parents(&[None, Some(0), Some(0)]).unwrap();
        let tree =
            DraftTree::<f32>::new(fork, vec![4, 1, 0], vec![None; 3], DraftKind::Deterministic)
                .unwrap();
        let p = vec![
            vec![0.5f32, 0.25, 0.25],
            vec![0.0, 1.0, 0.0],
            vec![0.0, 0.0, 1.0],
        ];
        assert_eq!(typical_threshold(&p[0], 0.25, 1.0), 0.25);
        let input = VerifyInput {
            sequence: 1,
            step: 0,
            tree: &tree,
            target_probs: &p,
        };
        let verdict = verify_typical(&input, &mut Replay::production(0), 0.25, 1.0);
        assert_eq!(verdict, Verdict::new(vec![2], 2));
    }
}
