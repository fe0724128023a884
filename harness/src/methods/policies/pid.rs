//! `pid`: a PID controller on the acceptance rate.

use serde::{Deserialize, Serialize};
use specdec_algorithms::policy::{PidPolicy, SpeculationPolicy};

use super::{chains_only, check_by_building, PolicyContext, PolicyKind};
use crate::error::Result;
use crate::methods::limits::check_drafts;
use crate::methods::Kind;

/// A PID controller steering the acceptance rate to `target_acceptance` by changing K
/// (`PidPolicy`; chains only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pid {
    /// Acceptance rate to hold, in (0, 1).
    pub target_acceptance: f64,
    /// Smallest K (≥ 1).
    pub k_min: usize,
    /// Largest K (≥ k_min).
    pub k_max: usize,
    /// K at zero error [default: the middle of the range].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_k: Option<f64>,
    /// Gains [kp, ki, kd], drafts per unit of acceptance error [default: [2.0, 0.5, 0.0]].
    #[serde(default = "default_gains")]
    pub gains: [f64; 3],
}

fn default_gains() -> [f64; 3] {
    [2.0, 0.5, 0.0]
}

impl Kind for Pid {
    const NAME: &'static str = "pid";
    const SUMMARY: &'static str =
        "chain length steered so the acceptance rate holds `target_acceptance`";

    fn check(&self) -> std::result::Result<(), String> {
        check_drafts("pid.k_max", self.k_max)?;
        check_by_building(self)
    }

    fn describe(&self) -> String {
        format!("pid target={}", self.target_acceptance)
    }
}

impl PolicyKind for Pid {
    fn build(&self, ctx: &PolicyContext<'_>) -> Result<Box<dyn SpeculationPolicy>> {
        if !ctx.is_chain {
            return Err(chains_only(ctx, Self::NAME));
        }
        Ok(Box::new(PidPolicy::new(
            self.target_acceptance,
            self.base_k
                .unwrap_or((self.k_min + self.k_max) as f64 / 2.0),
            self.gains,
            self.k_min,
            self.k_max,
        )?))
    }
}
