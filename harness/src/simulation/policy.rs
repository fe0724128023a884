//! The budget-policy interface the simulation drives.
//!
//! This is a small internal trait standing in for `specdec_algorithms`' `SpeculationPolicy`
//! (being written by helper "algos"); once that lands, an adapter implements [`BudgetPolicy`] for
//! it and [`budget_policy_for`] builds the algorithm crate's policies from the config.

use crate::config::{MethodConfig, PolicyConfig};
use crate::error::{HarnessError, Result};

/// Chooses the draft budget of one sequence step by step.
pub trait BudgetPolicy {
    /// Drafts to propose next (0 = plain decoding this step).
    fn next_budget(&mut self) -> usize;
    /// Feedback after verification: `proposed` drafts, of which `accepted` were accepted.
    fn observe(&mut self, proposed: usize, accepted: usize);
}

/// Always the same budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedBudget(pub usize);

impl BudgetPolicy for FixedBudget {
    fn next_budget(&mut self) -> usize {
        self.0
    }
    fn observe(&mut self, _proposed: usize, _accepted: usize) {}
}

/// Builds the policy of a method for one sequence: plain decoding gets a budget of 0, `fixed`
/// gets K; the adaptive kinds wait for the algorithms crate's policies
/// ([`HarnessError::NotYetAvailable`]).
pub fn budget_policy_for(method: &MethodConfig) -> Result<Box<dyn BudgetPolicy>> {
    match &method.policy {
        None => Ok(Box::new(FixedBudget(0))),
        Some(PolicyConfig::Fixed { k }) => Ok(Box::new(FixedBudget(*k))),
        Some(other) => Err(HarnessError::NotYetAvailable(format!(
            "policy `{}` of method `{}` needs specdec_algorithms' SpeculationPolicy",
            other.describe(),
            method.name
        ))),
    }
}
