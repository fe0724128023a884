//! `ngram`: prompt lookup, continuing the longest earlier match of the recent tokens.

use serde::{Deserialize, Serialize};
use specdec_algorithms::drafters::{NgramConfig, NgramDrafter};

use super::{BuiltDrafter, DraftContext, DraftSetup, DrafterKind};
use crate::error::Result;
use crate::methods::Kind;

/// The longest match `ngram` looks for (`n`): 64 tokens. Every step tries each length from `n`
/// down to 1 over the whole context, so the cost grows with `n`; prompt lookup's published
/// settings match 1 to 4 tokens, and a 64-token repeat is already found by its last 4.
pub const NGRAM_MAX_N: usize = 64;

/// Prompt-lookup / n-gram drafting (deterministic, free): match the last `n` tokens (down to 1)
/// in the context and propose what followed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ngram {
    /// Match length (1..=[`NGRAM_MAX_N`]).
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
        if self.n > NGRAM_MAX_N {
            return Err(format!(
                "ngram.n = {} is over the limit of {NGRAM_MAX_N} tokens",
                self.n
            ));
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
