//! `chain`: the draft model proposes a chain of K tokens.

use serde::{Deserialize, Serialize};

use super::{
    chain_over, check_min_confidence, run_draft_model, BuiltDrafter, DraftContext, DraftSetup,
    DrafterKind,
};
use crate::error::Result;
use crate::methods::Kind;

/// The draft model (`models.draft`) drafts K tokens one after another (K from the policy):
/// argmax at T = 0 (greedy verification), sampled from `q` above (chain rejection sampling).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chain {
    /// Stop a chain before K once the draft's probability of the whole chain falls below this
    /// (in (0, 1]; dynamic K within a step, lossless:
    /// [`ChainDrafter`](specdec_algorithms::drafters::ChainDrafter)) [default: draft all K].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_confidence: Option<f64>,
}

impl Kind for Chain {
    const NAME: &'static str = "chain";
    const ALIASES: &'static [&'static str] = &["linear"];
    const SUMMARY: &'static str =
        "the draft model drafts a chain of K tokens (needs a draft model)";

    fn check(&self) -> std::result::Result<(), String> {
        check_min_confidence("chain.min_confidence", self.min_confidence)
    }
}

impl DrafterKind for Chain {
    fn is_chain(&self) -> bool {
        true
    }
    fn needs_draft_model(&self) -> bool {
        true
    }
    fn for_generate(_draft: Option<&str>) -> Option<Self> {
        Some(Chain::default())
    }
    fn build(&self, ctx: &mut dyn DraftContext, setup: &DraftSetup<'_>) -> Result<BuiltDrafter> {
        let model = run_draft_model(ctx, setup, Self::NAME)?;
        chain_over(ctx, setup, model, self.min_confidence)
    }
}
