//! Batch-size modelling: a step over a batch pays for the total tokens in the batch, so a
//! simulated continuous-batching run over batch sizes shows where speculation stops paying.
//!
//! **Cost of a batched step** with draft lengths `k_i` for the `B` sequences in flight:
//! drafting runs level by level over the sequences still drafting (`Σ_{l=1..max k} draft_pass(#{i:
//! k_i ≥ l})`), the target runs one pass over `Σ (k_i + 1)` tokens (`target(n)` is the cost curve
//! over tokens *in the batch*), verify and commit are paid per speculating sequence, overhead once.
//! With one sequence this is [`CostModel::step`].

use specdec_algorithms::policy::{SpeculationPolicy, StepOutcome};

use super::next_chain_len;
use super::{AcceptanceProcess, CostCurve, CostModel, SplitMix64, StepCost};
use crate::error::{HarnessError, Result};

impl CostModel {
    /// The cost of one batched step where sequence `i` drafts a chain of `ks[i]` (0: plain) (see
    /// the module docs). `draft` is the draft pass curve (see [`CostModel::draft_pass_ms`]).
    pub fn batch_step(&self, ks: &[usize], draft: Option<&CostCurve>) -> StepCost {
        let k_max = ks.iter().copied().max().unwrap_or(0);
        let draft_ms: f64 = (1..=k_max)
            .map(|level| self.draft_pass_ms(ks.iter().filter(|&&k| k >= level).count(), draft))
            .sum();
        let drafts: usize = ks.iter().sum();
        let speculating = ks.iter().filter(|&&k| k > 0).count() as f64;
        let link = match &self.link {
            Some(l) if drafts > 0 => l.ms(drafts),
            _ => 0.0,
        };
        StepCost {
            draft_s: (draft_ms + link) / 1e3,
            target_s: self.target.ms(drafts + ks.len()) / 1e3,
            verify_s: self.verify_ms * speculating / 1e3,
            commit_s: self.commit_ms * speculating / 1e3,
            overhead_s: self.overhead_ms / 1e3,
        }
    }

    /// The per-sequence view of a full batch of `batch` sequences that all draft the same K, as a
    /// single-sequence cost model (for the cost-model policy, which then weighs K against what
    /// a step costs at this load): target(n) = target(batch · n) / batch, draft per token =
    /// draft_pass(batch) / batch, overhead / batch; verify and commit unchanged (per sequence);
    /// no link. Exact for `n` in `1..=k_max + 1`.
    pub fn per_sequence_at_batch(
        &self,
        batch: usize,
        k_max: usize,
        draft: Option<&CostCurve>,
    ) -> CostModel {
        let b = batch.max(1);
        let tokens: Vec<usize> = (1..=k_max.max(1) + 1).collect();
        let ms = tokens
            .iter()
            .map(|&n| self.target.ms(b * n) / b as f64)
            .collect();
        CostModel {
            draft_ms_per_token: self.draft_pass_ms(b, draft) / b as f64,
            target: CostCurve::Points { tokens, ms },
            verify_ms: self.verify_ms,
            commit_ms: self.commit_ms,
            overhead_ms: self.overhead_ms / b as f64,
            link: None,
        }
    }
}

/// Totals of a simulated continuous-batching run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchRun {
    /// Tokens generated over all requests.
    pub tokens: usize,
    /// Simulated seconds from the first admission to the last retirement.
    pub elapsed_s: f64,
    /// Batched steps (target passes).
    pub steps: usize,
    /// Σ drafts proposed over sequences and steps.
    pub proposed: usize,
    /// Σ drafts accepted.
    pub accepted: usize,
    /// Sequence-steps (Σ over steps of the sequences in flight).
    pub sequence_steps: usize,
    /// Sequence-steps that speculated (K > 0).
    pub speculative_steps: usize,
}

impl BatchRun {
    /// Tokens per simulated second.
    pub fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.elapsed_s
    }

    /// Accepted / proposed drafts (`None` when nothing was proposed).
    pub fn acceptance(&self) -> Option<f64> {
        (self.proposed > 0).then(|| self.accepted as f64 / self.proposed as f64)
    }

    /// Fraction of sequence-steps that speculated.
    pub fn speculative_fraction(&self) -> f64 {
        self.speculative_steps as f64 / self.sequence_steps.max(1) as f64
    }
}

/// Simulates `requests` requests of `max_tokens` tokens each under continuous batching with at
/// most `batch` in flight: each step every sequence in flight asks its own policy (forked from
/// `policy`) for K, draws its accepted length from `acceptance` (request i uses
/// `acceptance.for_request(i)` and random stream i of `seed`), and the step costs
/// [`CostModel::batch_step`]. Finished requests retire and waiting ones are admitted at once.
///
/// # Errors
/// [`HarnessError::Simulation`] for zero requests, batch or tokens; a policy asking for a tree.
#[allow(clippy::too_many_arguments)]
pub fn simulate_batched(
    requests: usize,
    batch: usize,
    max_tokens: usize,
    acceptance: &AcceptanceProcess,
    cost: &CostModel,
    draft: Option<&CostCurve>,
    policy: &dyn SpeculationPolicy,
    seed: u64,
) -> Result<BatchRun> {
    if requests == 0 || batch == 0 || max_tokens == 0 {
        return Err(HarnessError::Simulation(
            "a batched simulation needs requests, batch and max_tokens ≥ 1".into(),
        ));
    }
    struct Seq {
        acceptance: AcceptanceProcess,
        policy: Box<dyn SpeculationPolicy>,
        rng: SplitMix64,
        generated: usize,
    }
    let mut next = 0usize;
    let mut active: Vec<Seq> = Vec::new();
    let mut run = BatchRun {
        tokens: 0,
        elapsed_s: 0.0,
        steps: 0,
        proposed: 0,
        accepted: 0,
        sequence_steps: 0,
        speculative_steps: 0,
    };
    loop {
        while active.len() < batch && next < requests {
            active.push(Seq {
                acceptance: acceptance.for_request(next),
                policy: policy.fork(),
                rng: SplitMix64::stream(seed, next as u64),
                generated: 0,
            });
            next += 1;
        }
        if active.is_empty() {
            break;
        }
        let mut ks = Vec::with_capacity(active.len());
        for s in &mut active {
            ks.push(next_chain_len(s.policy.as_mut(), "the batched simulation")?);
        }
        for (s, &k) in active.iter_mut().zip(&ks) {
            let rng = &mut s.rng;
            let accepted = if k == 0 {
                0
            } else {
                s.acceptance.draw_accepted(k, || rng.uniform())
            };
            s.policy.observe(&StepOutcome::chain(k, accepted)?);
            let emitted = (accepted + 1).min(max_tokens - s.generated);
            s.generated += emitted;
            run.tokens += emitted;
            run.proposed += k;
            run.accepted += accepted;
            run.speculative_steps += usize::from(k > 0);
        }
        run.sequence_steps += active.len();
        run.steps += 1;
        run.elapsed_s += cost.batch_step(&ks, draft).total_s();
        active.retain(|s| s.generated < max_tokens);
    }
    Ok(run)
}

#[cfg(test)]
mod tests {
    use specdec_algorithms::policy::{Budget, FixedPolicy};

    use super::*;

    fn cost() -> CostModel {
        CostModel {
            draft_ms_per_token: 2.0,
            target: CostCurve::Points {
                tokens: vec![1, 8, 32],
                ms: vec![10.0, 17.0, 81.0],
            },
            verify_ms: 0.5,
            commit_ms: 0.25,
            overhead_ms: 1.0,
            link: None,
        }
    }

    #[test]
    fn one_sequence_is_the_single_step_and_batches_add_tokens() {
        let m = cost();
        for k in 0..6 {
            let a = m.batch_step(&[k], None).total_s();
            assert!((a - m.step(k).total_s()).abs() < 1e-15, "k {k}");
        }
        // Plain batch of 8: one target pass over 8 tokens + overhead.
        let plain = m.batch_step(&[0; 8], None);
        assert!((plain.total_s() - (17.0 + 1.0) / 1e3).abs() < 1e-15);
        // Ragged: K = 2, 0, 1 → draft passes over 2 then 1 sequence; target over 6 tokens;
        // verify/commit for 2 speculating sequences.
        let s = m.batch_step(&[2, 0, 1], None);
        let draft = m.draft_pass_ms(2, None) + m.draft_pass_ms(1, None);
        assert!((s.draft_s - draft / 1e3).abs() < 1e-15);
        assert!((s.target_s - m.target.ms(6) / 1e3).abs() < 1e-15);
        assert!((s.verify_s - 1.0 / 1e3).abs() < 1e-15);
        // The per-sequence view at batch 4 matches the batched step divided by 4.
        let view = m.per_sequence_at_batch(4, 5, None);
        for k in 0..=5 {
            let full = m.batch_step(&[k; 4], None).total_s() / 4.0;
            assert!((view.step(k).total_s() - full).abs() < 1e-12, "k {k}");
        }
    }

    #[test]
    fn batched_run_counts_tokens_and_time() {
        let m = cost();
        // α = 1, K = 3: every step emits 4 tokens; 10 requests × 8 tokens, batch 4 → 2 steps per
        // request wave; waves of 4, 4, 2 requests.
        let run = simulate_batched(
            10,
            4,
            8,
            &AcceptanceProcess::Fixed { alpha: 1.0 },
            &m,
            None,
            &FixedPolicy::chain(3),
            1,
        )
        .unwrap();
        assert_eq!(run.tokens, 80);
        assert_eq!(run.steps, 6);
        assert_eq!(run.sequence_steps, 20);
        assert_eq!(run.acceptance(), Some(1.0));
        let expected = 4.0 * m.batch_step(&[3; 4], None).total_s()
            + 2.0 * m.batch_step(&[3; 2], None).total_s();
        assert!((run.elapsed_s - expected).abs() < 1e-12);
        // Plain decoding: one token per sequence-step.
        let plain = simulate_batched(
            10,
            4,
            8,
            &AcceptanceProcess::Fixed { alpha: 1.0 },
            &m,
            None,
            &FixedPolicy::new(Budget::Plain),
            1,
        )
        .unwrap();
        assert_eq!(plain.sequence_steps, 80);
        assert_eq!(plain.speculative_fraction(), 0.0);
        assert!(simulate_batched(
            0,
            1,
            1,
            &AcceptanceProcess::Fixed { alpha: 1.0 },
            &m,
            None,
            &FixedPolicy::chain(1),
            0
        )
        .is_err());
    }
}
