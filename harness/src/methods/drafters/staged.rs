//! `staged`: multi-level speculation, n-gram → draft model → target.

use serde::{Deserialize, Serialize};
use specdec_algorithms::drafters::{NgramConfig, NgramDrafter, StagedDrafter};

use super::{model_drafter_setup, BuiltDrafter, DraftContext, DraftSetup, DrafterKind};
use crate::config::ModelSource;
use crate::error::Result;
use crate::methods::Kind;

/// Multi-level speculation: an n-gram level 0 proposes, the model level checks it losslessly
/// against its own distribution and extends it, and the target verifies the result (chain
/// rejection). `levels` names the model levels, smallest first; today one model level runs:
/// the last entry (a known name, a `.gguf` path, or `layer_skip` for the target with its
/// default blocks skipped).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Staged {
    /// Model names, smallest first.
    pub levels: Vec<String>,
}

impl Kind for Staged {
    const NAME: &'static str = "staged";
    const ALIASES: &'static [&'static str] = &["multi_level"];
    const SUMMARY: &'static str =
        "n-gram proposes, a draft model (`levels`, or layer_skip) checks and extends, the target verifies";

    fn check(&self) -> std::result::Result<(), String> {
        if self.levels.is_empty() {
            return Err("staged.levels is empty".into());
        }
        for level in self.levels.iter().filter(|l| *l != "layer_skip") {
            ModelSource::parse(level)?;
        }
        Ok(())
    }
}

impl DrafterKind for Staged {
    fn is_chain(&self) -> bool {
        true
    }
    fn uses_model(&self) -> bool {
        true
    }
    /// Level 1 is `--draft`, or layer skip without one.
    fn for_generate(draft: Option<&str>) -> Option<Self> {
        Some(Staged {
            levels: vec![draft.unwrap_or("layer_skip").to_string()],
        })
    }
    fn build(&self, ctx: &mut dyn DraftContext, setup: &DraftSetup<'_>) -> Result<BuiltDrafter> {
        self.check().map_err(crate::HarnessError::InvalidEngine)?;
        let name = self.levels.last().expect("checked non-empty");
        let level0 = NgramDrafter::new(NgramConfig::default(), 16)?;
        let model = ctx.draft_model(name)?;
        let (lm, draft_pass_s) = model_drafter_setup(ctx, setup, model, false)?;
        Ok(BuiltDrafter {
            drafter: Box::new(StagedDrafter::new(level0, lm)),
            is_chain: true,
            shape: None,
            draft_pass_s,
        })
    }
}
