//! Turning speculation off for a sequence whose drafts are rarely accepted, and probing again.

use std::collections::VecDeque;

use crate::error::{ensure_param, Result};
use crate::policy::{AcceptanceStats, Budget, SpeculationPolicy, StepOutcome, StepTiming};

/// Counts plain steps and says when a periodic probe is due; optionally backs off (the interval
/// doubles after each unsuccessful probe, up to a cap).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prober {
    every: usize,
    base: usize,
    max_every: usize,
    waited: usize,
}

impl Prober {
    /// A probe after every `every` plain steps (`every = 0`: never probe), no back-off.
    pub fn new(every: usize) -> Self {
        Self {
            every,
            base: every,
            max_every: every,
            waited: 0,
        }
    }

    /// Like [`Prober::new`], but [`Prober::back_off`] doubles the interval up to `max_every`
    /// (at least `every`).
    pub fn with_back_off(every: usize, max_every: usize) -> Self {
        Self {
            max_every: max_every.max(every),
            ..Self::new(every)
        }
    }

    /// Plain steps between probes now.
    pub fn interval(&self) -> usize {
        self.every
    }

    /// A probe did not pay: doubles the interval (up to the cap given at construction).
    pub fn back_off(&mut self) {
        self.every = (self.every.saturating_mul(2)).min(self.max_every);
    }

    /// Speculation paid again: the interval returns to its initial value.
    pub fn reset_interval(&mut self) {
        self.every = self.base;
    }

    /// Records one more plain step about to be taken; true if this step should be a probe instead
    /// (the count then restarts).
    pub fn probe_due(&mut self) -> bool {
        if self.every == 0 {
            return false;
        }
        self.waited += 1;
        if self.waited > self.every {
            self.waited = 0;
            true
        } else {
            false
        }
    }

    /// Restarts the count (e.g. when speculation is switched off).
    pub fn restart(&mut self) {
        self.waited = 0;
    }
}

/// Wraps a policy with the **disable rule**: when the sequence's pooled conditional acceptance
/// α̂ (raw successes / tries over draft positions, with geometric decay so it follows the recent
/// past; see [`AcceptanceStats::pooled_alpha_raw`]) drops below `threshold` after at least
/// `min_trials` weighted position tries, speculation is switched off (budget [`Budget::Plain`]).
/// While off, every `probe_every` plain steps one short speculative step (`probe`, default a
/// chain of 1) is taken, if the inner policy would speculate at that step (it is asked then,
/// and only then): a probe the inner policy judges not to pay, such as one that would widen a
/// full batch's forward under a cost model, is skipped. When the last `probe_window` probes
/// together show α̂ ≥ `threshold` (over at least 2 tries), speculation is switched back on, with
/// the statistics restarted from those probes.
///
/// The inner policy chooses every budget while speculation is on and observes every outcome.
#[derive(Debug, Clone)]
pub struct DisableGate<P> {
    inner: P,
    threshold: f64,
    min_trials: f64,
    probe: Budget,
    prober: Prober,
    probe_window: usize,
    decay: f64,
    stats: AcceptanceStats,
    probes: VecDeque<(usize, usize)>,
    disabled: bool,
}

impl<P: SpeculationPolicy> DisableGate<P> {
    /// The default rule around `inner`: threshold 0.3, at least 8 tries before deciding, decay
    /// 0.95 per step, a 1-draft probe every 16 plain steps, a window of 4 probes.
    pub fn new(inner: P) -> Self {
        Self {
            inner,
            threshold: 0.3,
            min_trials: 8.0,
            probe: Budget::Chain(1),
            prober: Prober::new(16),
            probe_window: 4,
            decay: 0.95,
            stats: AcceptanceStats::new()
                .with_decay(0.95)
                .expect("valid decay"),
            probes: VecDeque::new(),
            disabled: false,
        }
    }

    /// Sets the α̂ threshold (default 0.3).
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] unless `0 ≤ threshold ≤ 1`.
    pub fn with_threshold(mut self, threshold: f64) -> Result<Self> {
        ensure_param(
            (0.0..=1.0).contains(&threshold),
            "threshold",
            format!("must be in [0, 1], got {threshold}"),
        )?;
        self.threshold = threshold;
        Ok(self)
    }

    /// Sets how often to probe (every `every` plain steps; 0 = never) and with what budget.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] if `probe` is a plain budget.
    pub fn with_probe(mut self, every: usize, probe: Budget) -> Result<Self> {
        ensure_param(
            !probe.is_plain(),
            "probe",
            "a probe must draft at least one token",
        )?;
        self.prober = Prober::new(every);
        self.probe = probe;
        Ok(self)
    }

    /// Sets the tries needed before the first decision and the per-step decay of the statistics.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] unless `min_trials ≥ 1` and `0 < decay ≤ 1`.
    pub fn with_evidence(mut self, min_trials: f64, decay: f64) -> Result<Self> {
        ensure_param(
            min_trials >= 1.0,
            "min_trials",
            format!("must be ≥ 1, got {min_trials}"),
        )?;
        self.stats = AcceptanceStats::new().with_decay(decay)?;
        self.decay = decay;
        self.min_trials = min_trials;
        Ok(self)
    }

    /// True while speculation is switched off.
    pub fn is_disabled(&self) -> bool {
        self.disabled
    }

    /// The wrapped policy.
    pub fn inner(&self) -> &P {
        &self.inner
    }
}

impl<P: SpeculationPolicy + 'static> SpeculationPolicy for DisableGate<P> {
    fn name(&self) -> String {
        format!("{} | off below α̂={}", self.inner.name(), self.threshold)
    }

    fn next_budget(&mut self) -> Budget {
        if !self.disabled {
            return self.inner.next_budget();
        }
        // a due probe is taken only where the inner policy would speculate at all
        if self.prober.probe_due() && !self.inner.next_budget().is_plain() {
            self.probe.clone()
        } else {
            Budget::Plain
        }
    }

    /// A probe verifies what it drafted (it exists to measure); otherwise the inner policy
    /// decides.
    fn keep_drafts(&mut self, offered: usize) -> usize {
        match self.disabled {
            true => offered,
            false => self.inner.keep_drafts(offered),
        }
    }

    fn observe(&mut self, outcome: &StepOutcome) {
        if outcome.validate().is_err() {
            return;
        }
        self.inner.observe(outcome);
        self.gate(outcome);
    }

    fn observe_measured(&mut self, outcome: &StepOutcome, timing: &StepTiming) {
        if outcome.validate().is_err() {
            return;
        }
        self.inner.observe_measured(outcome, timing);
        self.gate(outcome);
    }

    fn observe_skipped(&mut self, emitted: usize, remaining_tokens: Option<usize>) {
        self.inner.observe_skipped(emitted, remaining_tokens);
    }

    fn observe_load(&mut self, sequences: usize) {
        self.inner.observe_load(sequences);
    }

    fn fork(&self) -> Box<dyn SpeculationPolicy> {
        Box::new(self.fresh_over(self.inner.fork()))
    }

    fn fork_for_new_workload(&self) -> Box<dyn SpeculationPolicy> {
        Box::new(self.fresh_over(self.inner.fork_for_new_workload()))
    }
}

impl<P: SpeculationPolicy> DisableGate<P> {
    /// This gate's configuration, with fresh statistics, over `inner` (a fork of its policy).
    fn fresh_over(
        &self,
        inner: Box<dyn SpeculationPolicy>,
    ) -> DisableGate<Box<dyn SpeculationPolicy>> {
        DisableGate {
            inner,
            threshold: self.threshold,
            min_trials: self.min_trials,
            probe: self.probe.clone(),
            prober: Prober::new(self.prober.base),
            probe_window: self.probe_window,
            decay: self.decay,
            stats: AcceptanceStats::new()
                .with_decay(self.decay)
                .expect("valid decay"),
            probes: VecDeque::new(),
            disabled: false,
        }
    }

    /// The disable rule's bookkeeping for one validated outcome.
    fn gate(&mut self, outcome: &StepOutcome) {
        if !self.disabled {
            self.stats.observe(outcome).expect("validated above");
            if self.stats.position_trials() >= self.min_trials
                && self
                    .stats
                    .pooled_alpha_raw()
                    .is_some_and(|a| a < self.threshold)
            {
                self.disabled = true;
                self.prober.restart();
                self.probes.clear();
            }
        } else if outcome.proposed > 0 {
            self.probes
                .push_back((outcome.trials.len(), outcome.accepted));
            if self.probes.len() > self.probe_window {
                self.probes.pop_front();
            }
            let (tries, accepted) = self
                .probes
                .iter()
                .fold((0, 0), |(t, a), p| (t + p.0, a + p.1));
            if tries >= 2 && accepted as f64 >= self.threshold * tries as f64 {
                self.disabled = false;
                self.stats.reset();
                // Restart from the probes' evidence only.
                for &(t, a) in &self.probes {
                    if let Ok(o) = StepOutcome::chain(t, a) {
                        self.stats.observe(&o).expect("valid chain outcome");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_rng::SplitMix;
    use crate::policy::FixedPolicy;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn prober_cadence() {
        let mut p = Prober::new(2);
        let due: Vec<bool> = (0..6).map(|_| p.probe_due()).collect();
        assert_eq!(due, [false, false, true, false, false, true]);
        let mut never = Prober::new(0);
        assert!((0..10).all(|_| !never.probe_due()));
    }

    /// Runs the gate over a sequence whose acceptance changes at step `switch`.
    fn run(alpha_before: f64, alpha_after: f64, switch: usize, steps: usize) -> Vec<Budget> {
        let mut gate = DisableGate::new(FixedPolicy::chain(4))
            .with_probe(4, Budget::Chain(1))
            .unwrap();
        let mut rng = SplitMix::new(5);
        let mut budgets = Vec::new();
        for step in 0..steps {
            let b = gate.next_budget();
            let alpha = if step < switch {
                alpha_before
            } else {
                alpha_after
            };
            let k = b.max_drafts();
            let outcome = if k == 0 {
                StepOutcome::plain()
            } else {
                StepOutcome::chain(k, rng.chain_accepted(k, alpha)).unwrap()
            };
            gate.observe(&outcome);
            budgets.push(b);
        }
        budgets
    }

    #[test]
    fn switches_off_probes_and_recovers() {
        let budgets = run(0.05, 0.9, 100, 200);
        // Off within the first 100 steps, mostly plain there, probing with chains of 1.
        let early = &budgets[40..100];
        let plain = early.iter().filter(|b| b.is_plain()).count();
        assert!(plain > 40, "{plain} plain steps of 60");
        assert!(early.contains(&Budget::Chain(1)), "probes while off");
        assert!(early
            .iter()
            .all(|b| matches!(b, Budget::Plain | Budget::Chain(1))));
        // Back on after acceptance recovers.
        let late = &budgets[150..];
        assert!(late.iter().all(|b| *b == Budget::Chain(4)), "{late:?}");
    }

    /// A policy that speculates (a chain of 3) while its flag is set, and decodes plainly
    /// otherwise; counts how often it is asked.
    struct Switch {
        speculate: Arc<AtomicBool>,
        asked: Arc<AtomicUsize>,
    }

    impl SpeculationPolicy for Switch {
        fn name(&self) -> String {
            "switch".into()
        }
        fn next_budget(&mut self) -> Budget {
            self.asked.fetch_add(1, Ordering::Relaxed);
            match self.speculate.load(Ordering::Relaxed) {
                true => Budget::Chain(3),
                false => Budget::Plain,
            }
        }
        fn observe(&mut self, _outcome: &StepOutcome) {}
        fn fork(&self) -> Box<dyn SpeculationPolicy> {
            Box::new(Switch {
                speculate: Arc::clone(&self.speculate),
                asked: Arc::clone(&self.asked),
            })
        }
    }

    #[test]
    fn a_probe_is_skipped_where_the_inner_policy_would_not_speculate() {
        let speculate = Arc::new(AtomicBool::new(true));
        let asked = Arc::new(AtomicUsize::new(0));
        let inner = Switch {
            speculate: Arc::clone(&speculate),
            asked: Arc::clone(&asked),
        };
        let mut gate = DisableGate::new(inner)
            .with_probe(2, Budget::Chain(1))
            .unwrap()
            .with_evidence(1.0, 1.0)
            .unwrap();
        assert_eq!(gate.next_budget(), Budget::Chain(3));
        gate.observe(&StepOutcome::chain(3, 0).unwrap());
        assert!(gate.is_disabled());
        let mut budgets = |n: usize| -> Vec<Budget> {
            (0..n)
                .map(|_| {
                    let b = gate.next_budget();
                    // probes keep failing: the gate stays off
                    let outcome = match b.max_drafts() {
                        0 => StepOutcome::plain(),
                        k => StepOutcome::chain(k, 0).unwrap(),
                    };
                    gate.observe(&outcome);
                    b
                })
                .collect()
        };
        // the inner policy would speculate: a 1-draft probe every third step
        let probing = budgets(6);
        assert_eq!(
            probing.iter().filter(|b| **b == Budget::Chain(1)).count(),
            2
        );
        // it would not (e.g. under load): due probes are skipped, and it is asked only then
        speculate.store(false, Ordering::Relaxed);
        let asked_before = asked.load(Ordering::Relaxed);
        assert!(budgets(12).iter().all(Budget::is_plain));
        assert_eq!(
            asked.load(Ordering::Relaxed) - asked_before,
            4,
            "asked at the 4 due probes only"
        );
        speculate.store(true, Ordering::Relaxed);
        assert!(budgets(3).contains(&Budget::Chain(1)));
    }

    #[test]
    fn stays_on_when_acceptance_is_high() {
        let budgets = run(0.7, 0.7, 0, 300);
        assert!(budgets.iter().all(|b| *b == Budget::Chain(4)));
    }

    #[test]
    fn configuration_errors_and_fork() {
        let gate = DisableGate::new(FixedPolicy::chain(2));
        assert!(gate.clone().with_threshold(1.5).is_err());
        assert!(gate.clone().with_probe(3, Budget::Plain).is_err());
        assert!(gate.clone().with_evidence(0.0, 0.9).is_err());
        assert!(gate.clone().with_evidence(4.0, 0.0).is_err());
        let mut off = gate.with_evidence(1.0, 1.0).unwrap();
        off.observe(&StepOutcome::chain(2, 0).unwrap());
        assert!(off.is_disabled());
        assert_eq!(off.fork().next_budget(), Budget::Chain(2));
        assert_eq!(off.next_budget(), Budget::Plain);
    }
}
