//! One simulated request: the policy picks K, the acceptance process decides, the cost model
//! charges time.

use specdec_algorithms::policy::{SpeculationPolicy, StepOutcome};

use super::next_chain_len;
use super::{AcceptanceProcess, CostModel, SplitMix64};
use crate::error::Result;
use crate::metrics::StepRecord;

/// KV cache block size (tokens) assumed by the simulation's block count.
pub const SIM_BLOCK_TOKENS: usize = 16;

/// The steps of one simulated request and the time it took.
#[derive(Debug, Clone, PartialEq)]
pub struct SimulatedRequest {
    /// One record per target pass.
    pub steps: Vec<StepRecord>,
    /// Simulated seconds from admission to the last token.
    pub elapsed_s: f64,
}

/// Simulates one request of `max_tokens` tokens (≥ 1) after a prompt of `prompt_tokens` tokens.
/// Each step: the policy's budget gives K (plain: K = 0, a plain step emitting one token);
/// otherwise the accepted length a is drawn from `acceptance`, a + 1 tokens are emitted (cut at
/// `max_tokens`) and the policy observes the chain outcome. Time per step comes from
/// `cost.step(K)`. KV blocks count committed tokens in blocks of `SIM_BLOCK_TOKENS`.
/// Tree budgets are refused ([`crate::HarnessError::NotYetAvailable`]): the simulation models chains.
#[allow(clippy::too_many_arguments)]
pub fn simulate_request(
    method: &str,
    request: usize,
    prompt_tokens: usize,
    max_tokens: usize,
    acceptance: &AcceptanceProcess,
    cost: &CostModel,
    policy: &mut dyn SpeculationPolicy,
    rng: &mut SplitMix64,
) -> Result<SimulatedRequest> {
    let mut steps = Vec::new();
    let mut generated = 0usize;
    let mut elapsed_s = 0.0;
    while generated < max_tokens {
        let k = next_chain_len(policy, "the simulation")?;
        let accepted = if k == 0 {
            0
        } else {
            acceptance.draw_accepted(k, || rng.uniform())
        };
        policy.observe(&StepOutcome::chain(k, accepted)?);
        let emitted = (accepted + 1).min(max_tokens - generated);
        generated += emitted;
        let c = cost.step(k);
        elapsed_s += c.total_s();
        steps.push(StepRecord {
            method: method.to_string(),
            request,
            step: steps.len(),
            repeat: 0,
            proposed: k,
            draft_depth: k,
            accepted,
            emitted,
            draft_s: c.draft_s,
            target_s: c.target_s,
            verify_s: c.verify_s,
            commit_s: c.commit_s,
            overhead_s: c.overhead_s,
            prefill_s: 0.0,
            prefill_work_s: None,
            kv_blocks: (prompt_tokens + generated).div_ceil(SIM_BLOCK_TOKENS),
            batch: 1,
            drafter: if k > 0 { "simulated" } else { "none" }.into(),
            decision: None,
            tokens: Vec::new(),
            ops: Vec::new(),
        });
    }
    Ok(SimulatedRequest { steps, elapsed_s })
}

#[cfg(test)]
mod tests {
    use specdec_algorithms::policy::{Budget, FixedPolicy};

    use super::super::{expected_tokens, CostCurve};
    use super::*;

    fn cost() -> CostModel {
        CostModel {
            draft_ms_per_token: 1.0,
            target: CostCurve::Affine {
                base_ms: 10.0,
                per_token_ms: 0.0,
            },
            verify_ms: 0.0,
            commit_ms: 0.0,
            overhead_ms: 0.0,
            link: None,
        }
    }

    #[test]
    fn plain_decoding_takes_one_pass_per_token() {
        let r = simulate_request(
            "b",
            0,
            10,
            7,
            &AcceptanceProcess::Fixed { alpha: 0.9 },
            &cost(),
            &mut FixedPolicy::new(Budget::Plain),
            &mut SplitMix64::new(1),
        )
        .unwrap();
        assert_eq!(r.steps.len(), 7);
        assert!((r.elapsed_s - 0.07).abs() < 1e-12);
        assert_eq!(r.steps.last().unwrap().kv_blocks, 2);
    }

    #[test]
    fn alpha_one_and_zero_are_exact() {
        let all = simulate_request(
            "m",
            0,
            0,
            10,
            &AcceptanceProcess::Fixed { alpha: 1.0 },
            &cost(),
            &mut FixedPolicy::chain(4),
            &mut SplitMix64::new(1),
        )
        .unwrap();
        // 5 + 5 tokens in two passes.
        assert_eq!(all.steps.len(), 2);
        assert!(all.steps.iter().all(|s| s.accepted == 4));
        let none = simulate_request(
            "m",
            0,
            0,
            3,
            &AcceptanceProcess::Fixed { alpha: 0.0 },
            &cost(),
            &mut FixedPolicy::chain(4),
            &mut SplitMix64::new(1),
        )
        .unwrap();
        assert_eq!(none.steps.len(), 3);
        assert!(none.steps.iter().all(|s| s.accepted == 0 && s.emitted == 1));
    }

    #[test]
    fn mean_tokens_per_pass_matches_the_closed_form() {
        // ≈ 20 000 passes at α = 0.7, K = 3: E = 2.533; per-pass sd ≤ 1.2, so the mean's sd
        // ≤ 0.009 and 0.05 is over 5 sd.
        let acc = AcceptanceProcess::Fixed { alpha: 0.7 };
        let r = simulate_request(
            "m",
            0,
            0,
            50_000,
            &acc,
            &cost(),
            &mut FixedPolicy::chain(3),
            &mut SplitMix64::new(3),
        )
        .unwrap();
        let passes = r.steps.len() as f64;
        let tau = r.steps.iter().map(|s| s.accepted + 1).sum::<usize>() as f64 / passes;
        assert!((tau - expected_tokens(&acc, 3)).abs() < 0.05, "tau {tau}");
    }
}
