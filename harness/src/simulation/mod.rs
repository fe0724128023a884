//! Simulation mode: an injected acceptance process and a cost model replace the draft and target
//! models, so speculation policies and schedulers can be studied without model quality in the way.
//!
//! The `[simulation]` table of an experiment:
//!
//! ```toml
//! [simulation]
//! acceptance = { kind = "fixed", alpha = 0.8 }        # or { kind = "by_depth", alphas = [0.9, 0.8, 0.7] }
//! [simulation.cost]
//! draft_ms_per_token = 15.2
//! target = { kind = "points", tokens = [1, 2, 4, 8, 16], ms = [26.5, 39.2, 63.6, 96.7, 115.3] }
//! # or target = { kind = "affine", base_ms = 26.5, per_token_ms = 2.0 }
//! verify_ms = 0.1      # per speculative step
//! commit_ms = 0.05     # per speculative step
//! overhead_ms = 0.0    # per step, speculative or not
//! link = { latency_us = 5.0, bandwidth_gb_per_s = 25.0, bytes_per_draft_token = 4.0 }   # optional
//! ```

mod acceptance;
mod analytic;
mod batch;
mod cost;
mod engine;
mod rng;
mod tree;

pub use acceptance::AcceptanceProcess;
pub use analytic::{
    expected_speedup, expected_tokens, leviathan_expected_tokens, leviathan_walltime_gain,
};
pub use batch::{simulate_batched, BatchRun};
pub use cost::{CostCurve, CostModel, LinkModel, StepCost};
pub use engine::{simulate_request, SimulatedRequest};
pub use rng::SplitMix64;
pub use tree::{
    accepted_length, dynamic_tree, level_widths, walk_accepted, StepWorld, TreeAcceptance,
};

use serde::{Deserialize, Serialize};
use specdec_algorithms::policy::{Budget, SpeculationPolicy};

use crate::error::{HarnessError, Result};

/// The next chain length the policy asks for (0 for plain decoding). `who` names the caller in
/// the error a tree budget gets ([`HarnessError::NotYetAvailable`]: the simulation models
/// chains only).
pub fn next_chain_len(policy: &mut dyn SpeculationPolicy, who: &str) -> Result<usize> {
    match policy.next_budget() {
        Budget::Plain => Ok(0),
        Budget::Chain(k) => Ok(k),
        other => Err(HarnessError::NotYetAvailable(format!(
            "policy `{}` asked for {other:?}; {who} runs chains only",
            policy.name()
        ))),
    }
}

/// The `[simulation]` table: what replaces the models.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimulationConfig {
    /// Whether each draft is accepted.
    pub acceptance: AcceptanceProcess,
    /// What each step costs.
    pub cost: CostModel,
}

impl SimulationConfig {
    /// Checks the acceptance process and the cost model.
    pub fn validate(&self) -> Result<()> {
        self.acceptance.validate()?;
        self.cost.validate()
    }
}
