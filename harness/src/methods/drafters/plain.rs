//! `plain`: no drafts, plain autoregressive decoding (the baseline).

use serde::{Deserialize, Serialize};

use super::{BuiltDrafter, DraftContext, DraftSetup, DrafterKind};
use crate::engine::NoDrafter;
use crate::error::Result;
use crate::methods::Kind;

/// No drafter: every step is plain decoding (budget 0). Takes no parameters and no policy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plain {}

impl Kind for Plain {
    const NAME: &'static str = "plain";
    const ALIASES: &'static [&'static str] = &["none", "baseline"];
    const SUMMARY: &'static str = "no drafts: plain autoregressive decoding (the baseline)";
}

impl DrafterKind for Plain {
    fn is_chain(&self) -> bool {
        true
    }
    fn for_generate(_draft: Option<&str>) -> Option<Self> {
        Some(Plain {})
    }
    fn build(&self, _ctx: &mut dyn DraftContext, _setup: &DraftSetup<'_>) -> Result<BuiltDrafter> {
        Ok(BuiltDrafter {
            drafter: Box::new(NoDrafter),
            is_chain: true,
            shape: None,
            draft_pass_s: Some(0.0),
        })
    }
}
