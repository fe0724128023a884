//! `ngram`: prompt lookup, continuing the longest earlier match of the recent tokens.

use serde::{Deserialize, Serialize};
use specdec_algorithms::drafters::{NgramConfig, NgramDrafter};

use super::{BuiltDrafter, DraftContext, DraftSetup, DrafterKind};
use crate::error::Result;
use crate::methods::Kind;

/// Prompt-lookup / n-gram drafting (deterministic, free): match the last `n` tokens (down to 1)
/// in the context and propose what followed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ngram {
    /// Match length (≥ 1).
    pub n: usize,
}

impl Kind for Ngram {
    const NAME: &'static str = "ngram";
    const ALIASES: &'static [&'static str] = &["prompt_lookup"];
    const SUMMARY: &'static str =
        "prompt lookup: continue the longest earlier match of the last `n` tokens (no model)";

    fn check(&self) -> std::result::Result<(), String> {
        if self.n == 0 {
            return Err("ngram needs n ≥ 1".into());
        }
        Ok(())
    }
}

impl DrafterKind for Ngram {
    fn is_chain(&self) -> bool {
        true
    }
    fn for_generate(_draft: Option<&str>) -> Option<Self> {
        Some(Ngram { n: 3 })
    }
    fn build(&self, _ctx: &mut dyn DraftContext, _setup: &DraftSetup<'_>) -> Result<BuiltDrafter> {
        let config = NgramConfig {
            max_n: self.n.max(1),
            min_n: 1,
            max_matches: 4,
        };
        Ok(BuiltDrafter {
            drafter: Box::new(NgramDrafter::new(config, 16)?),
            is_chain: true,
            shape: None,
            draft_pass_s: Some(0.0),
        })
    }
}
