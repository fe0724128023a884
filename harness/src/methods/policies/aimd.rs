//! `aimd`: additive increase, multiplicative decrease of the chain length.

use serde::{Deserialize, Serialize};
use specdec_algorithms::policy::{AimdPolicy, SpeculationPolicy};

use super::{chains_only, check_by_building, PolicyContext, PolicyKind};
use crate::error::Result;
use crate::methods::limits::check_drafts;
use crate::methods::Kind;

/// Additive increase after a fully accepted step, multiplicative decrease after a rejection,
/// within `[k_min, k_max]` (`AimdPolicy`; chains only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Aimd {
    /// Smallest K (≥ 1).
    pub k_min: usize,
    /// Largest K (≥ k_min).
    pub k_max: usize,
    /// First K [default: k_min].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_k: Option<usize>,
    /// Drafts added after a fully accepted step [default: 1].
    #[serde(default = "one")]
    pub increase: usize,
    /// Factor in (0, 1) applied after a rejection.
    pub decrease: f64,
}

fn one() -> usize {
    1
}

impl Kind for Aimd {
    const NAME: &'static str = "aimd";
    const SUMMARY: &'static str =
        "chain length up by `increase` after a fully accepted step, times `decrease` after a rejection";

    fn check(&self) -> std::result::Result<(), String> {
        check_drafts("aimd.k_max", self.k_max)?;
        check_drafts("aimd.increase", self.increase)?;
        check_by_building(self)
    }

    fn describe(&self) -> String {
        format!("aimd k={}..{}", self.k_min, self.k_max)
    }
}

impl PolicyKind for Aimd {
    fn build(&self, ctx: &PolicyContext<'_>) -> Result<Box<dyn SpeculationPolicy>> {
        if !ctx.is_chain {
            return Err(chains_only(ctx, Self::NAME));
        }
        Ok(Box::new(AimdPolicy::new(
            self.start_k.unwrap_or(self.k_min),
            self.k_min,
            self.k_max,
            self.increase,
            self.decrease,
        )?))
    }
}
