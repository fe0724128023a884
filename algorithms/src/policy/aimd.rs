//! [`AimdPolicy`]: additive increase on full acceptance, multiplicative decrease on a rejection.

use crate::error::{ensure_param, Result};
use crate::policy::{Budget, SpeculationPolicy, StepOutcome};

/// Chain length control by additive increase / multiplicative decrease (as TCP's congestion
/// window): after a step whose drafts were all accepted, `K ← min(K + increase, max_k)`; after a
/// step with a rejection, `K ← max(floor(K · decrease), min_k)`. Steps that proposed nothing
/// leave K unchanged.
#[derive(Debug, Clone, PartialEq)]
pub struct AimdPolicy {
    k: usize,
    start_k: usize,
    min_k: usize,
    max_k: usize,
    increase: usize,
    decrease: f64,
}

impl AimdPolicy {
    /// Starts at `start_k` and stays within `min_k..=max_k`; `increase ≥ 1` drafts per fully
    /// accepted step, `decrease ∈ (0, 1)` factor per rejection.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] unless `1 ≤ min_k ≤ start_k ≤ max_k`,
    /// `increase ≥ 1`, `0 < decrease < 1`.
    pub fn new(
        start_k: usize,
        min_k: usize,
        max_k: usize,
        increase: usize,
        decrease: f64,
    ) -> Result<Self> {
        ensure_param(
            1 <= min_k && min_k <= start_k && start_k <= max_k,
            "k",
            format!("need 1 ≤ min_k ≤ start_k ≤ max_k, got {min_k}, {start_k}, {max_k}"),
        )?;
        ensure_param(increase >= 1, "increase", "must be at least 1")?;
        ensure_param(
            decrease > 0.0 && decrease < 1.0,
            "decrease",
            format!("must be in (0, 1), got {decrease}"),
        )?;
        Ok(Self {
            k: start_k,
            start_k,
            min_k,
            max_k,
            increase,
            decrease,
        })
    }

    /// The current chain length.
    pub fn k(&self) -> usize {
        self.k
    }
}

impl SpeculationPolicy for AimdPolicy {
    fn name(&self) -> String {
        format!(
            "aimd(K∈[{},{}], +{}, ×{})",
            self.min_k, self.max_k, self.increase, self.decrease
        )
    }

    fn next_budget(&mut self) -> Budget {
        Budget::chain(self.k)
    }

    fn observe(&mut self, outcome: &StepOutcome) {
        if outcome.proposed == 0 || outcome.validate().is_err() {
            return;
        }
        self.k = if outcome.fully_accepted() {
            (self.k + self.increase).min(self.max_k)
        } else {
            ((self.k as f64 * self.decrease).floor() as usize).max(self.min_k)
        };
    }

    fn fork(&self) -> Box<dyn SpeculationPolicy> {
        Box::new(Self {
            k: self.start_k,
            ..self.clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_rng::SplitMix;

    #[test]
    fn increases_and_decreases() {
        let mut p = AimdPolicy::new(4, 1, 6, 1, 0.5).unwrap();
        p.observe(&StepOutcome::chain(4, 4).unwrap());
        assert_eq!(p.next_budget(), Budget::Chain(5));
        p.observe(&StepOutcome::chain(5, 5).unwrap());
        p.observe(&StepOutcome::chain(6, 6).unwrap());
        assert_eq!(p.k(), 6);
        p.observe(&StepOutcome::chain(6, 2).unwrap());
        assert_eq!(p.k(), 3);
        p.observe(&StepOutcome::plain());
        assert_eq!(p.k(), 3);
        for _ in 0..5 {
            p.observe(&StepOutcome::chain(3, 0).unwrap());
        }
        assert_eq!(p.k(), 1);
        assert_eq!(p.fork().next_budget(), Budget::Chain(4));
        assert!(AimdPolicy::new(0, 0, 4, 1, 0.5).is_err());
        assert!(AimdPolicy::new(2, 1, 4, 1, 1.0).is_err());
    }

    #[test]
    fn tracks_acceptance_level() {
        // Higher acceptance gives longer chains on average.
        let mean_k = |alpha: f64| {
            let mut rng = SplitMix::new(3);
            let mut p = AimdPolicy::new(2, 1, 16, 1, 0.5).unwrap();
            let mut sum = 0;
            for _ in 0..2000 {
                let k = p.next_budget().max_drafts();
                sum += k;
                p.observe(&StepOutcome::chain(k, rng.chain_accepted(k, alpha)).unwrap());
            }
            sum as f64 / 2000.0
        };
        let (low, high) = (mean_k(0.5), mean_k(0.95));
        assert!(low < 2.5 && high > 4.0 && high > 2.5 * low, "{low} {high}");
    }
}
