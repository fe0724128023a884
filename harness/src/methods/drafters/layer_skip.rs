//! `layer_skip`: self-speculation by the target with some of its blocks skipped.

use serde::{Deserialize, Serialize};

use super::{
    chain_over, check_min_confidence, BuiltDrafter, DraftContext, DraftSetup, DrafterKind,
};
use crate::error::Result;
use crate::methods::Kind;

/// Layer-skip self-drafting: the target running only some of its blocks (shared weights)
/// drafts a chain, drawn as `chain` draws.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerSkip {
    /// Blocks kept, strictly increasing [default: first and last quarter, every other block of
    /// the middle half].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<Vec<usize>>,
    /// When `keep` is not given: pick the kept blocks on the first prompt of the run by
    /// measuring a few candidate subsets (greedy agreement with the target on the prompt prefill
    /// × prefill cost; see `runner::layer_skip_tune`). Its time counts in the run.
    #[serde(default)]
    pub tune: bool,
    /// Stop a chain before K once the draft's probability of it falls below this, as `chain`'s
    /// key of the same name [default: draft all K].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_confidence: Option<f64>,
}

impl Kind for LayerSkip {
    const NAME: &'static str = "layer_skip";
    const ALIASES: &'static [&'static str] = &["self_draft"];
    const SUMMARY: &'static str =
        "the target with about a quarter of its blocks skipped drafts a chain (no draft model)";

    fn check(&self) -> std::result::Result<(), String> {
        check_min_confidence("layer_skip.min_confidence", self.min_confidence)
    }
}

impl DrafterKind for LayerSkip {
    fn is_chain(&self) -> bool {
        true
    }
    fn uses_model(&self) -> bool {
        true
    }
    fn for_generate(_draft: Option<&str>) -> Option<Self> {
        Some(LayerSkip::default())
    }
    fn build(&self, ctx: &mut dyn DraftContext, setup: &DraftSetup<'_>) -> Result<BuiltDrafter> {
        let model = ctx.layer_skip(self.keep.as_deref(), self.tune)?;
        chain_over(ctx, setup, model, self.min_confidence)
    }
}
