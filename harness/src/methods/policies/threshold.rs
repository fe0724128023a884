//! `threshold`: a fixed budget, switched off while acceptance is low.

use serde::{Deserialize, Serialize};
use specdec_algorithms::policy::{Budget, DisableGate, FixedPolicy, SpeculationPolicy};

use super::check_probe_every;
use super::{check_by_building, PolicyContext, PolicyKind};
use crate::error::Result;
use crate::methods::limits::check_drafts;
use crate::methods::Kind;

/// Fixed K, switched off (plain decoding) when the acceptance estimate falls below
/// `min_acceptance`, probing with one draft every `probe_every` plain steps (`DisableGate`
/// around `FixedPolicy`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Threshold {
    /// K while speculating (≥ 1).
    pub k: usize,
    /// Acceptance below which speculation stops, in [0, 1].
    pub min_acceptance: f64,
    /// Plain steps between probes while off (≥ 1).
    pub probe_every: usize,
}

impl Kind for Threshold {
    const NAME: &'static str = "threshold";
    const ALIASES: &'static [&'static str] = &["gate"];
    const SUMMARY: &'static str =
        "fixed K, off while acceptance is below `min_acceptance`, probing every `probe_every` steps";

    fn check(&self) -> std::result::Result<(), String> {
        check_drafts("threshold.k", self.k)?;
        check_probe_every("threshold.probe_every", self.probe_every)?;
        check_by_building(self)
    }

    fn describe(&self) -> String {
        format!("threshold k={} off<{}", self.k, self.min_acceptance)
    }
}

impl PolicyKind for Threshold {
    fn build(&self, ctx: &PolicyContext<'_>) -> Result<Box<dyn SpeculationPolicy>> {
        let probe = match ctx.is_chain {
            true => Budget::Chain(1),
            false => Budget::TreeNodes(1),
        };
        Ok(Box::new(
            DisableGate::new(FixedPolicy::new(ctx.budget_of(self.k)))
                .with_threshold(self.min_acceptance)?
                .with_probe(self.probe_every, probe)?,
        ))
    }
}
