//! [`PidPolicy`]: PID control of the chain length toward an acceptance-rate set point.

use crate::error::{ensure_param, Result};
use crate::policy::{Budget, SpeculationPolicy, StepOutcome};

/// Steers the chain length so the per-step acceptance rate (accepted / proposed) tracks a set
/// point: longer chains lower the acceptance rate, so the error `e = rate − set_point` drives K
/// up when acceptance is above the set point and down when below.
///
/// Position form: `K = clamp(round(base_k + kp·e + ki·Σe + kd·Δe), min_k, max_k)`, the integral
/// clamped to `±integral_limit` (anti-windup). Plain steps are skipped.
#[derive(Debug, Clone, PartialEq)]
pub struct PidPolicy {
    set_point: f64,
    base_k: f64,
    kp: f64,
    ki: f64,
    kd: f64,
    min_k: usize,
    max_k: usize,
    integral_limit: f64,
    integral: f64,
    last_error: Option<f64>,
    k: usize,
}

impl PidPolicy {
    /// A controller around `base_k` with gains `kp, ki, kd` (in drafts per unit of acceptance
    /// error), K within `min_k..=max_k`. The integral limit defaults to `max_k / ki` (or ∞).
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] unless `0 < set_point < 1`,
    /// `1 ≤ min_k ≤ max_k`, `base_k` within the range and the gains are finite and ≥ 0.
    pub fn new(
        set_point: f64,
        base_k: f64,
        gains: [f64; 3],
        min_k: usize,
        max_k: usize,
    ) -> Result<Self> {
        ensure_param(
            set_point > 0.0 && set_point < 1.0,
            "set_point",
            format!("must be in (0, 1), got {set_point}"),
        )?;
        ensure_param(
            1 <= min_k && min_k <= max_k,
            "k",
            format!("need 1 ≤ min_k ≤ max_k, got {min_k}, {max_k}"),
        )?;
        ensure_param(
            base_k >= min_k as f64 && base_k <= max_k as f64,
            "base_k",
            format!("{base_k} is outside [{min_k}, {max_k}]"),
        )?;
        ensure_param(
            gains.iter().all(|g| g.is_finite() && *g >= 0.0),
            "gains",
            format!("must be finite and ≥ 0, got {gains:?}"),
        )?;
        let [kp, ki, kd] = gains;
        Ok(Self {
            set_point,
            base_k,
            kp,
            ki,
            kd,
            min_k,
            max_k,
            integral_limit: if ki > 0.0 {
                max_k as f64 / ki
            } else {
                f64::INFINITY
            },
            integral: 0.0,
            last_error: None,
            k: base_k.round() as usize,
        })
    }

    /// A controller with the gains the tests use (`kp = 2, ki = 0.5, kd = 0`, in drafts per unit
    /// of acceptance error) around the middle of `min_k..=max_k`.
    ///
    /// # Errors
    /// As [`PidPolicy::new`].
    pub fn with_default_gains(set_point: f64, min_k: usize, max_k: usize) -> Result<Self> {
        Self::new(
            set_point,
            (min_k + max_k) as f64 / 2.0,
            [2.0, 0.5, 0.0],
            min_k,
            max_k,
        )
    }

    /// The current chain length.
    pub fn k(&self) -> usize {
        self.k
    }
}

impl SpeculationPolicy for PidPolicy {
    fn name(&self) -> String {
        format!(
            "pid(set={}, kp={}, ki={}, kd={})",
            self.set_point, self.kp, self.ki, self.kd
        )
    }

    fn next_budget(&mut self) -> Budget {
        Budget::chain(self.k)
    }

    fn observe(&mut self, outcome: &StepOutcome) {
        let Some(rate) = outcome.acceptance_rate() else {
            return;
        };
        if outcome.validate().is_err() {
            return;
        }
        let error = rate - self.set_point;
        self.integral = (self.integral + error).clamp(-self.integral_limit, self.integral_limit);
        let derivative = self.last_error.map_or(0.0, |last| error - last);
        self.last_error = Some(error);
        let k = self.base_k + self.kp * error + self.ki * self.integral + self.kd * derivative;
        self.k = (k.round().max(0.0) as usize).clamp(self.min_k, self.max_k);
    }

    fn fork(&self) -> Box<dyn SpeculationPolicy> {
        let mut fresh = self.clone();
        fresh.integral = 0.0;
        fresh.last_error = None;
        fresh.k = fresh.base_k.round() as usize;
        Box::new(fresh)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_rng::SplitMix;

    fn simulate(alpha: f64, steps: usize) -> f64 {
        let mut p = PidPolicy::new(0.6, 3.0, [2.0, 0.5, 0.0], 1, 12).unwrap();
        let mut rng = SplitMix::new(11);
        let (mut sum_k, mut proposed, mut accepted) = (0, 0, 0);
        for step in 0..steps {
            let k = p.next_budget().max_drafts();
            let a = rng.chain_accepted(k, alpha);
            p.observe(&StepOutcome::chain(k, a).unwrap());
            if step >= steps / 2 {
                sum_k += k;
                proposed += k;
                accepted += a;
            }
        }
        let rate = accepted as f64 / proposed as f64;
        assert!((rate - 0.6).abs() < 0.06, "α={alpha}: rate {rate}");
        sum_k as f64 / (steps - steps / 2) as f64
    }

    #[test]
    fn holds_the_set_point() {
        // Rate(K) = α(1 − α^K) / ((1 − α) K): for α = 0.8 it crosses 0.6 between K = 3 and 4;
        // for α = 0.9 between K = 6 and 7.
        let k8 = simulate(0.8, 4000);
        let k9 = simulate(0.9, 4000);
        assert!((2.5..=5.0).contains(&k8), "{k8}");
        assert!(k9 > k8 + 1.5, "{k9} vs {k8}");
    }

    #[test]
    fn validation_and_fork() {
        assert!(PidPolicy::new(1.0, 3.0, [1.0, 0.0, 0.0], 1, 4).is_err());
        assert!(PidPolicy::new(0.5, 5.0, [1.0, 0.0, 0.0], 1, 4).is_err());
        assert!(PidPolicy::new(0.5, 3.0, [-1.0, 0.0, 0.0], 1, 4).is_err());
        let mut p = PidPolicy::new(0.5, 2.0, [4.0, 0.0, 0.0], 1, 4).unwrap();
        p.observe(&StepOutcome::chain(2, 2).unwrap());
        assert_eq!(p.k(), 4);
        p.observe(&StepOutcome::plain());
        assert_eq!(p.k(), 4);
        assert_eq!(p.fork().next_budget(), Budget::Chain(2));
        let d = PidPolicy::with_default_gains(0.5, 2, 6).unwrap();
        assert_eq!(d.k(), 4);
        assert!(PidPolicy::with_default_gains(0.5, 0, 6).is_err());
    }
}
