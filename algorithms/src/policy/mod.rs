//! Speculation policies: how many tokens (or which tree) to draft next, per sequence, from live
//! statistics.
//!
//! One policy instance belongs to one sequence. Each engine step calls
//! [`SpeculationPolicy::next_budget`] once before drafting, for a chain of deterministic drafts
//! [`SpeculationPolicy::keep_drafts`] once after it, then [`SpeculationPolicy::observe`] once
//! with that step's [`StepOutcome`] (a plain step's outcome included). A drafter may propose
//! fewer drafts than the budget allows (an n-gram drafter with no match proposes none); the
//! outcome reports what was actually proposed.
//!
//! Definitions used everywhere: **acceptance rate** = accepted drafts / proposed drafts;
//! **τ** (mean accepted length) = accepted drafts + 1 per target pass. Per-position conditional
//! acceptance α̂ is tracked with censoring handled by [`AcceptanceStats`].
//!
//! Policies here: [`FixedPolicy`], [`AimdPolicy`], [`PidPolicy`], [`CostModelPolicy`], and the
//! [`DisableGate`] wrapper that turns speculation off when α̂ falls below a threshold and probes
//! again periodically. [`FallbackPolicy`] pairs the policies of two drafters: a second (cheap)
//! drafter drafts whenever the first one's policy steps aside.
//!
//! # Adding a policy
//!
//! A policy needs four methods. This one drafts long chains while the last step was fully
//! accepted and short ones otherwise:
//!
//! ```
//! use specdec_algorithms::policy::{Budget, SpeculationPolicy, StepOutcome};
//!
//! #[derive(Clone)]
//! struct LongAfterFull { long: bool }
//!
//! impl SpeculationPolicy for LongAfterFull {
//!     fn name(&self) -> String { "long-after-full".to_string() }
//!     fn next_budget(&mut self) -> Budget {
//!         Budget::chain(if self.long { 8 } else { 2 })
//!     }
//!     fn observe(&mut self, outcome: &StepOutcome) {
//!         if outcome.proposed > 0 {
//!             self.long = outcome.fully_accepted();
//!         }
//!     }
//!     fn fork(&self) -> Box<dyn SpeculationPolicy> {
//!         Box::new(LongAfterFull { long: false })
//!     }
//! }
//!
//! let mut policy = LongAfterFull { long: false };
//! assert_eq!(policy.next_budget(), Budget::Chain(2));
//! policy.observe(&StepOutcome::chain(2, 2).unwrap());
//! assert_eq!(policy.next_budget(), Budget::Chain(8));
//! policy.observe(&StepOutcome::chain(8, 3).unwrap());
//! assert_eq!(policy.next_budget(), Budget::Chain(2));
//! ```

mod aimd;
mod cost;
mod cost_model;
mod fallback;
mod fixed;
mod gate;
mod measured;
mod outcome;
mod pid;
mod stats;
#[cfg(test)]
pub(crate) mod test_rng;

pub use aimd::AimdPolicy;
pub use cost::{expected_tokens, expected_tokens_constant, CostCurve, CostModel};
pub use cost_model::{CostModelPolicy, TreeSearch};
pub use fallback::{DrafterChoice, FallbackPolicy};
pub use fixed::FixedPolicy;
pub use gate::{DisableGate, Prober};
pub use measured::{ForwardCurve, LiveCosts, StepTiming};
pub use outcome::{Budget, DepthTrial, StepOutcome};
pub use pid::PidPolicy;
pub use stats::AcceptanceStats;

/// Chooses the speculation budget of one sequence, step by step, from what it observes.
///
/// Contract: `next_budget` is called once per step, then `observe` once with the outcome of that
/// step. Policies must accept any valid outcome, including plain steps and steps that proposed
/// fewer drafts than the budget; invalid outcomes (see [`StepOutcome::validate`]) are ignored.
pub trait SpeculationPolicy: Send {
    /// A short human-readable name with the configuration, for reports (e.g. `"fixed(K=4)"`).
    fn name(&self) -> String;
    /// The budget for this sequence's next step. [`Budget::Plain`] = plain decoding.
    fn next_budget(&mut self) -> Budget;
    /// How many of the `offered` drafts (≥ 1) to verify, after the drafter proposed them under
    /// this step's budget and before verification: a prefix of that many is verified (0: a plain
    /// step), and the step's outcome reports it. The engine asks only for a chain of
    /// deterministic drafts, whose prefix is verified losslessly whatever its length; a policy
    /// that prices each offer (a drafter that costs nothing offers its own confidence in how
    /// many drafts it proposes) overrides it, the default keeps them all. At most `offered`.
    fn keep_drafts(&mut self, offered: usize) -> usize {
        offered
    }
    /// Records the outcome of the step whose budget was last returned.
    fn observe(&mut self, outcome: &StepOutcome);
    /// Records the outcome together with the step's measured [`StepTiming`]. The engine calls
    /// this (instead of [`SpeculationPolicy::observe`]); policies that decide from measured
    /// costs override it, the default forwards the outcome to `observe` and drops the timings.
    fn observe_measured(&mut self, outcome: &StepOutcome, timing: &StepTiming) {
        let _ = timing;
        self.observe(outcome);
    }
    /// Records that the sequence advanced by `emitted` tokens in a step this policy did not
    /// choose (another drafter's, under a [`FallbackPolicy`]): its drafter has not seen them, and
    /// `remaining_tokens` may still be generated. There is no outcome of this policy's drafter
    /// to learn from; policies that price a drafter's catch-up override it, the default ignores
    /// it.
    fn observe_skipped(&mut self, emitted: usize, remaining_tokens: Option<usize>) {
        let _ = (emitted, remaining_tokens);
    }
    /// Tells the policy, before [`SpeculationPolicy::next_budget`], how many sequences share
    /// this step's target forward (≥ 1): policies that price a step under load override it
    /// (the budget per sequence should shrink as the batch grows), the default ignores it.
    fn observe_load(&mut self, sequences: usize) {
        let _ = sequences;
    }
    /// A fresh instance with the same configuration and no statistics, for a new sequence.
    fn fork(&self) -> Box<dyn SpeculationPolicy>;
    /// A fresh instance, as [`SpeculationPolicy::fork`], to be the prototype of another
    /// workload's sequences (a server's chat and code traffic): policies that start a sequence
    /// from the acceptance earlier sequences measured keep one such pool per workload and share
    /// the rest (measured costs); the default is [`SpeculationPolicy::fork`].
    fn fork_for_new_workload(&self) -> Box<dyn SpeculationPolicy> {
        self.fork()
    }
}

impl SpeculationPolicy for Box<dyn SpeculationPolicy> {
    fn name(&self) -> String {
        (**self).name()
    }
    fn next_budget(&mut self) -> Budget {
        (**self).next_budget()
    }
    fn keep_drafts(&mut self, offered: usize) -> usize {
        (**self).keep_drafts(offered)
    }
    fn observe(&mut self, outcome: &StepOutcome) {
        (**self).observe(outcome)
    }
    fn observe_measured(&mut self, outcome: &StepOutcome, timing: &StepTiming) {
        (**self).observe_measured(outcome, timing)
    }
    fn observe_skipped(&mut self, emitted: usize, remaining_tokens: Option<usize>) {
        (**self).observe_skipped(emitted, remaining_tokens)
    }
    fn observe_load(&mut self, sequences: usize) {
        (**self).observe_load(sequences)
    }
    fn fork(&self) -> Box<dyn SpeculationPolicy> {
        (**self).fork()
    }
    fn fork_for_new_workload(&self) -> Box<dyn SpeculationPolicy> {
        (**self).fork_for_new_workload()
    }
}
