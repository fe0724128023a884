//! [`FallbackPolicy`]: two drafters, each with its own policy; the second drafts whenever the
//! first one's policy steps aside.
//!
//! A model drafter pays only where its drafts are accepted often enough to repay its passes;
//! where its policy falls back to plain decoding, a drafter that costs (almost) nothing, such as
//! n-gram prompt lookup, may still pay. Each step is an ordinary speculative step of one of the
//! two drafters, verified losslessly with that drafter's paired verifier, and which drafter
//! drafts depends only on what earlier steps observed, so the composition is lossless whenever
//! both drafters' pairs are (the exact tests enumerate it).
//!
//! Each policy sees its own drafter's steps in full ([`SpeculationPolicy::observe_measured`]),
//! plain steps too (both were asked and both chose plain: both learn what a plain step costs),
//! and hears of the other drafter's steps only as tokens its drafter missed
//! ([`SpeculationPolicy::observe_skipped`]): a model drafter's catch-up grows by them.

use crate::policy::{Budget, SpeculationPolicy, StepOutcome, StepTiming};

/// Which drafter of a [`FallbackPolicy`] a step's budget is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrafterChoice {
    /// The first drafter (also for a plain step).
    Primary,
    /// The second drafter: the primary's policy chose plain decoding, the fallback's did not.
    Fallback,
}

/// The policies of a primary drafter and, optionally, a fallback drafter, for one sequence (see
/// the module docs). Without a fallback it is the primary policy alone.
///
/// Contract, as for [`SpeculationPolicy`]: [`FallbackPolicy::next_budget`] once per step, then
/// [`FallbackPolicy::observe_measured`] once with that step's outcome.
#[derive(Debug, Clone)]
pub struct FallbackPolicy<P = Box<dyn SpeculationPolicy>, F = Box<dyn SpeculationPolicy>> {
    primary: P,
    fallback: Option<F>,
    /// The last step's choice, and whether the fallback's policy was asked for a budget.
    last: (DrafterChoice, bool),
}

impl<P: SpeculationPolicy, F: SpeculationPolicy> FallbackPolicy<P, F> {
    /// The primary's policy, and the fallback's if there is a second drafter.
    pub fn new(primary: P, fallback: Option<F>) -> Self {
        Self {
            primary,
            fallback,
            last: (DrafterChoice::Primary, false),
        }
    }

    /// The same primary policy, with `fallback` as the fallback drafter's.
    pub fn with_fallback(self, fallback: F) -> Self {
        Self::new(self.primary, Some(fallback))
    }

    /// `"primary, else fallback"` (or the primary's name alone), for reports.
    pub fn name(&self) -> String {
        match &self.fallback {
            Some(fallback) => format!("{}, else {}", self.primary.name(), fallback.name()),
            None => self.primary.name(),
        }
    }

    /// True if there is a fallback drafter.
    pub fn has_fallback(&self) -> bool {
        self.fallback.is_some()
    }

    /// The next step's drafter and budget: the primary's budget unless it is plain decoding,
    /// then the fallback's (which may be plain too: a plain step, reported as
    /// [`DrafterChoice::Primary`]).
    pub fn next_budget(&mut self) -> (DrafterChoice, Budget) {
        let budget = self.primary.next_budget();
        let fallback = match (&mut self.fallback, budget.is_plain()) {
            (Some(fallback), true) => fallback.next_budget(),
            _ => {
                self.last = (DrafterChoice::Primary, false);
                return (DrafterChoice::Primary, budget);
            }
        };
        if fallback.is_plain() {
            self.last = (DrafterChoice::Primary, true);
            (DrafterChoice::Primary, budget)
        } else {
            self.last = (DrafterChoice::Fallback, true);
            (DrafterChoice::Fallback, fallback)
        }
    }

    /// How many of the `offered` drafts of a deterministic chain to verify: the choice of the
    /// policy whose drafter proposed them ([`SpeculationPolicy::keep_drafts`]).
    pub fn keep_drafts(&mut self, offered: usize) -> usize {
        match (self.last.0, &mut self.fallback) {
            (DrafterChoice::Fallback, Some(fallback)) => fallback.keep_drafts(offered),
            _ => self.primary.keep_drafts(offered),
        }
    }

    /// Records the outcome of the step whose budget was last returned, with its timings: every
    /// policy that was asked sees a step that proposed nothing (a plain step); otherwise the
    /// chosen drafter's policy sees the step and the other hears of the tokens it added
    /// (`accepted + 1`) through [`SpeculationPolicy::observe_skipped`].
    pub fn observe_measured(&mut self, outcome: &StepOutcome, timing: &StepTiming) {
        let (choice, fallback_asked) = self.last;
        let plain_step = outcome.proposed == 0;
        let emitted = outcome.accepted + 1;
        let remaining = timing.remaining_tokens;
        match choice {
            DrafterChoice::Primary => self.primary.observe_measured(outcome, timing),
            DrafterChoice::Fallback if plain_step => self.primary.observe_measured(outcome, timing),
            DrafterChoice::Fallback => self.primary.observe_skipped(emitted, remaining),
        }
        if let Some(fallback) = &mut self.fallback {
            if choice == DrafterChoice::Fallback || (fallback_asked && plain_step) {
                fallback.observe_measured(outcome, timing);
            } else {
                fallback.observe_skipped(emitted, remaining);
            }
        }
    }

    /// Tells both policies how many sequences share this step's forward (before
    /// [`FallbackPolicy::next_budget`]; see [`SpeculationPolicy::observe_load`]).
    pub fn observe_load(&mut self, sequences: usize) {
        self.primary.observe_load(sequences);
        if let Some(fallback) = &mut self.fallback {
            fallback.observe_load(sequences);
        }
    }

    /// The primary drafter's policy.
    pub fn primary(&self) -> &P {
        &self.primary
    }

    /// The fallback drafter's policy, if any.
    pub fn fallback(&self) -> Option<&F> {
        self.fallback.as_ref()
    }
}

impl FallbackPolicy {
    /// A fresh instance for a new sequence: each policy forked.
    pub fn fork(&self) -> Self {
        Self::new(
            self.primary.fork(),
            self.fallback.as_ref().map(|fallback| fallback.fork()),
        )
    }

    /// The prototype of another workload's sequences: each policy forked by
    /// [`SpeculationPolicy::fork_for_new_workload`].
    pub fn fork_for_new_workload(&self) -> Self {
        Self::new(
            self.primary.fork_for_new_workload(),
            self.fallback
                .as_ref()
                .map(|fallback| fallback.fork_for_new_workload()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::FixedPolicy;

    /// A policy that records what it was told.
    #[derive(Debug, Clone)]
    struct Scripted {
        budget: Budget,
        measured: Vec<usize>,
        skipped: Vec<usize>,
    }

    impl Scripted {
        fn new(budget: Budget) -> Self {
            Self {
                budget,
                measured: Vec::new(),
                skipped: Vec::new(),
            }
        }
    }

    impl SpeculationPolicy for Scripted {
        fn name(&self) -> String {
            format!("scripted({:?})", self.budget)
        }
        fn next_budget(&mut self) -> Budget {
            self.budget.clone()
        }
        fn observe(&mut self, outcome: &StepOutcome) {
            self.measured.push(outcome.proposed);
        }
        fn observe_skipped(&mut self, emitted: usize, _remaining: Option<usize>) {
            self.skipped.push(emitted);
        }
        fn fork(&self) -> Box<dyn SpeculationPolicy> {
            Box::new(Self::new(self.budget.clone()))
        }
    }

    /// A primary policy always choosing `primary`, a fallback one always choosing `fallback`.
    fn scripted(primary: Budget, fallback: Budget) -> FallbackPolicy<Scripted, Scripted> {
        FallbackPolicy::new(Scripted::new(primary), Some(Scripted::new(fallback)))
    }

    fn step(
        policy: &mut FallbackPolicy<Scripted, Scripted>,
        proposed: usize,
        accepted: usize,
    ) -> DrafterChoice {
        let (choice, _) = policy.next_budget();
        let outcome = StepOutcome::chain(proposed, accepted).unwrap();
        policy.observe_measured(&outcome, &StepTiming::default());
        choice
    }

    #[test]
    fn the_fallback_drafts_only_when_the_primary_steps_aside() {
        let mut speculating = scripted(Budget::Chain(3), Budget::Chain(2));
        assert_eq!(
            speculating.next_budget(),
            (DrafterChoice::Primary, Budget::Chain(3))
        );
        let mut aside = scripted(Budget::Plain, Budget::Chain(2));
        assert_eq!(
            aside.next_budget(),
            (DrafterChoice::Fallback, Budget::Chain(2))
        );
        let mut both_aside = scripted(Budget::Plain, Budget::Plain);
        assert_eq!(
            both_aside.next_budget(),
            (DrafterChoice::Primary, Budget::Plain)
        );
        let mut alone = FallbackPolicy::<_, FixedPolicy>::new(Scripted::new(Budget::Plain), None);
        assert_eq!(alone.next_budget(), (DrafterChoice::Primary, Budget::Plain));
        assert!(!alone.has_fallback());
    }

    #[test]
    fn each_policy_sees_its_own_steps_and_hears_of_the_others_tokens() {
        // The primary speculates: the fallback (not asked) hears of 2 + 1 tokens.
        let mut policy = scripted(Budget::Chain(3), Budget::Chain(2));
        assert_eq!(step(&mut policy, 3, 2), DrafterChoice::Primary);
        assert_eq!(policy.primary().measured, vec![3]);
        assert_eq!(policy.fallback().unwrap().skipped, vec![3]);
        assert!(policy.fallback().unwrap().measured.is_empty());

        // The primary steps aside, the fallback drafts 2 and 1 is accepted: the primary's drafter
        // missed 2 tokens; then the fallback finds nothing to propose: a plain step both see.
        let mut policy = scripted(Budget::Plain, Budget::Chain(2));
        assert_eq!(step(&mut policy, 2, 1), DrafterChoice::Fallback);
        assert_eq!(step(&mut policy, 0, 0), DrafterChoice::Fallback);
        assert_eq!(policy.primary().skipped, vec![2]);
        assert_eq!(policy.primary().measured, vec![0]);
        assert_eq!(policy.fallback().unwrap().measured, vec![2, 0]);
        assert!(policy.fallback().unwrap().skipped.is_empty());

        // Both step aside: a plain step both see.
        let mut policy = scripted(Budget::Plain, Budget::Plain);
        assert_eq!(step(&mut policy, 0, 0), DrafterChoice::Primary);
        assert_eq!(policy.primary().measured, vec![0]);
        assert_eq!(policy.fallback().unwrap().measured, vec![0]);
    }
}
