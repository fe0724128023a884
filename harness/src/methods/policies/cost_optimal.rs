//! `cost_optimal`: the budget that maximises expected tokens per second.

use serde::{Deserialize, Serialize};
use specdec_algorithms::policy::{CostModelPolicy, SpeculationPolicy, TreeSearch};

use super::check_probe_every;
use super::{PolicyContext, PolicyCosts, PolicyKind};
use crate::error::{HarnessError, Result};
use crate::methods::limits::check_drafts;
use crate::methods::Kind;

/// argmax_K E\[tokens\](α̂, K) / (draft_cost(K) + verify_cost(K)), α̂ estimated online
/// (`CostModelPolicy`): over chains, or trees of up to `k_max` nodes for a tree drafter. In
/// simulation the `[simulation]` cost model prices steps; on real models the engine's measured
/// costs do, starting from a timed draft pass and the target's verify-cost curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostOptimal {
    /// Largest K considered (1..=[`MAX_DRAFTS`](crate::methods::limits::MAX_DRAFTS)).
    pub k_max: usize,
    /// Predicted gain over plain decoding needed to speculate [default: 0.02].
    #[serde(default = "default_min_gain")]
    pub min_gain: f64,
    /// Plain steps between 1-draft probes while not speculating [default: 16].
    #[serde(default = "sixteen")]
    pub probe_every: usize,
}

fn default_min_gain() -> f64 {
    0.02
}
fn sixteen() -> usize {
    16
}

impl CostOptimal {
    /// The defaults with `k_max`.
    pub fn up_to(k_max: usize) -> Self {
        Self {
            k_max,
            min_gain: default_min_gain(),
            probe_every: sixteen(),
        }
    }
}

impl Kind for CostOptimal {
    const NAME: &'static str = "cost_optimal";
    const ALIASES: &'static [&'static str] = &["cost_model"];
    const SUMMARY: &'static str =
        "the K (≤ `k_max`) that maximises expected tokens per second under measured costs";

    fn check(&self) -> std::result::Result<(), String> {
        if self.k_max == 0 {
            return Err("cost_optimal needs k_max ≥ 1".into());
        }
        if !(self.min_gain.is_finite() && self.min_gain >= 0.0) {
            return Err(format!(
                "cost_optimal.min_gain {} must be ≥ 0",
                self.min_gain
            ));
        }
        if self.probe_every == 0 {
            return Err("cost_optimal needs probe_every ≥ 1".into());
        }
        check_drafts("cost_optimal.k_max", self.k_max)?;
        check_probe_every("cost_optimal.probe_every", self.probe_every)
    }

    fn describe(&self) -> String {
        format!("cost_optimal k<={}", self.k_max)
    }
}

impl PolicyKind for CostOptimal {
    fn prices_drafts(&self) -> bool {
        true
    }

    /// A pass verifies at most `k_max` drafts and the root.
    fn verify_tokens(&self) -> Option<usize> {
        Some(self.k_max + 1)
    }

    fn build(&self, ctx: &PolicyContext<'_>) -> Result<Box<dyn SpeculationPolicy>> {
        let search = match ctx.is_chain {
            true => TreeSearch::Chain { max_k: self.k_max },
            false => TreeSearch::Tree {
                max_nodes: self.k_max,
                max_depth: 8,
                max_ranks: 4,
            },
        };
        match ctx.costs {
            PolicyCosts::Unknown => Err(HarnessError::NotYetAvailable(
                "policy cost_optimal needs a cost model: the simulation's, or on real models the \
                 engine backend's measured costs"
                    .into(),
            )),
            PolicyCosts::Given(costs) => Ok(Box::new(
                CostModelPolicy::new(costs.clone(), search)?
                    .with_min_gain(self.min_gain, self.probe_every)?,
            )),
            PolicyCosts::Measured {
                draft_pass_s,
                verify_curve,
            } => {
                let mut policy = CostModelPolicy::measured(search, draft_pass_s)?
                    .with_min_gain(self.min_gain, self.probe_every)?
                    .with_probe_back_off(self.probe_every, 16 * self.probe_every)?;
                if let Some(curve) = verify_curve {
                    policy = policy.with_verify_curve(curve)?;
                }
                Ok(Box::new(policy))
            }
        }
    }
}
