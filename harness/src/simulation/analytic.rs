//! Closed forms: expected tokens per target pass and expected speedup.

use specdec_algorithms::policy::{expected_tokens as expected_tokens_of, expected_tokens_constant};

use super::{AcceptanceProcess, CostModel};

/// Leviathan et al. (2023), eq. 1: expected tokens per target pass with γ drafts, each accepted
/// with probability α independently: (1 − α^(γ+1)) / (1 − α); γ + 1 at α = 1.
pub fn leviathan_expected_tokens(alpha: f64, gamma: usize) -> f64 {
    expected_tokens_constant(alpha, gamma)
}

/// Leviathan et al. (2023), theorem 3.8: expected walltime improvement
/// (1 − α^(γ+1)) / ((1 − α)(γc + 1)), c = draft cost / target cost per token, assuming a target
/// pass over γ + 1 tokens costs as much as over one.
pub fn leviathan_walltime_gain(alpha: f64, gamma: usize, c: f64) -> f64 {
    leviathan_expected_tokens(alpha, gamma) / (gamma as f64 * c + 1.0)
}

/// Expected tokens per target pass for a chain of `k` drafts under `acceptance`:
/// 1 + Σ_{d=1..k} Π_{j≤d} α_j.
pub fn expected_tokens(acceptance: &AcceptanceProcess, k: usize) -> f64 {
    let alphas: Vec<f64> = (1..=k).map(|d| acceptance.alpha_at(d)).collect();
    expected_tokens_of(&alphas)
}

/// Expected speedup over plain decoding of a fixed-K chain under a cost model, ignoring the
/// cut at max_tokens: expected_tokens(K) · plain step time / speculative step time.
pub fn expected_speedup(acceptance: &AcceptanceProcess, cost: &CostModel, k: usize) -> f64 {
    expected_tokens(acceptance, k) * cost.step(0).total_s() / cost.step(k).total_s()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leviathan_numbers() {
        // α = 0.8, γ = 4: (1 − 0.8⁵) / 0.2 = 3.3616.
        assert!((leviathan_expected_tokens(0.8, 4) - 3.3616).abs() < 1e-12);
        assert_eq!(leviathan_expected_tokens(1.0, 4), 5.0);
        assert_eq!(leviathan_expected_tokens(0.0, 4), 1.0);
        assert_eq!(leviathan_expected_tokens(0.5, 0), 1.0);
        assert!((leviathan_walltime_gain(0.8, 4, 0.05) - 3.3616 / 1.2).abs() < 1e-12);
    }

    #[test]
    fn general_form_matches_leviathan_for_fixed_alpha() {
        for &a in &[0.0, 0.3, 0.8, 0.99, 1.0] {
            for k in 0..10 {
                let e = expected_tokens(&AcceptanceProcess::Fixed { alpha: a }, k);
                assert!(
                    (e - leviathan_expected_tokens(a, k)).abs() < 1e-9,
                    "{a} {k}"
                );
            }
        }
        let by_depth = AcceptanceProcess::ByDepth {
            alphas: vec![0.5, 0.5, 1.0],
        };
        // 1 + 0.5 + 0.25 + 0.25 + 0.25
        assert!((expected_tokens(&by_depth, 4) - 2.25).abs() < 1e-12);
    }
}
