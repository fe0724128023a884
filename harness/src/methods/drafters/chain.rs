//! `chain`: the draft model proposes a chain of K tokens.

use serde::{Deserialize, Serialize};

use super::{chain_over, run_draft_model, BuiltDrafter, DraftContext, DraftSetup, DrafterKind};
use crate::error::Result;
use crate::methods::Kind;

/// The draft model (`models.draft`) drafts K tokens one after another (K from the policy):
/// argmax at T = 0 (greedy verification), sampled from `q` above (chain rejection sampling).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chain {}

impl Kind for Chain {
    const NAME: &'static str = "chain";
    const ALIASES: &'static [&'static str] = &["linear"];
    const SUMMARY: &'static str =
        "the draft model drafts a chain of K tokens (needs a draft model)";
}

impl DrafterKind for Chain {
    fn is_chain(&self) -> bool {
        true
    }
    fn needs_draft_model(&self) -> bool {
        true
    }
    fn for_generate(_draft: Option<&str>) -> Option<Self> {
        Some(Chain {})
    }
    fn build(&self, ctx: &mut dyn DraftContext, setup: &DraftSetup<'_>) -> Result<BuiltDrafter> {
        let model = run_draft_model(ctx, setup, Self::NAME)?;
        chain_over(ctx, setup, model)
    }
}
