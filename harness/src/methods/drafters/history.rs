//! `history`: prompt lookup over the context and the prompts and outputs of finished requests.

use serde::{Deserialize, Serialize};
use specdec_algorithms::drafters::{HistoryDrafter, NgramConfig};

use super::{BuiltDrafter, DraftContext, DraftSetup, DrafterKind, NGRAM_MAX_N};
use crate::error::Result;
use crate::methods::Kind;

/// Tokens of finished requests the history holds by default (the oldest requests leave first):
/// 2^18, at most about 50 MB with its index at `n = 4` ([`HistoryDrafter`]'s memory bound).
pub const HISTORY_DEFAULT_TOKENS: usize = 1 << 18;

/// Drafts per matched token by default: 1, SuffixDecoding's default, which drafted more
/// accurately than no cap (SmolLM2 at T = 0: 1.35× against 1.28× plain decoding on HumanEval,
/// 1.15× against 0.97× on MT-Bench; `experiments/history/README.md`).
pub const HISTORY_DEFAULT_SPEC_FACTOR: f64 = 1.0;

/// The most tokens `history_tokens` may ask for: 2^26.
pub const HISTORY_MAX_TOKENS: usize = 1 << 26;

/// The most index entries `history_tokens · n` may ask for: 2^28, at most about 12 GB (an
/// entry is a 4-byte chain link and at most one hash entry of about 20 bytes, up to twice that
/// while a table grows).
pub const HISTORY_MAX_INDEX_ENTRIES: usize = 1 << 28;

/// History lookup (deterministic, free): match the last `n` tokens (down to 1) in the context,
/// then in the requests that finished before, and propose what followed. Within one run or one
/// server the history is shared by every request, so a request's drafts (never its output)
/// depend on what was generated before it, and so may its speed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct History {
    /// Longest suffix matched (1..=[`NGRAM_MAX_N`]).
    pub n: usize,
    /// Tokens of finished requests kept (1..=[`HISTORY_MAX_TOKENS`]) [default:
    /// [`HISTORY_DEFAULT_TOKENS`]].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_tokens: Option<usize>,
    /// Drafts at most `max(1, ⌊spec_factor · m⌋)` tokens after an `m`-token match, within the
    /// policy's K (finite, positive; SuffixDecoding's `max_spec_factor`; `n` or more: no cap)
    /// [default: [`HISTORY_DEFAULT_SPEC_FACTOR`]].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_factor: Option<f64>,
}

impl Kind for History {
    const NAME: &'static str = "history";
    const ALIASES: &'static [&'static str] = &["suffix"];
    const SUMMARY: &'static str = "prompt lookup over the context and earlier requests' prompts \
                                   and outputs: continue the longest match of the last `n` tokens \
                                   (no model)";

    fn check(&self) -> std::result::Result<(), String> {
        if !(1..=NGRAM_MAX_N).contains(&self.n) {
            return Err(format!(
                "history.n = {} is outside 1..={NGRAM_MAX_N} tokens",
                self.n
            ));
        }
        let tokens = self.history_tokens.unwrap_or(HISTORY_DEFAULT_TOKENS);
        if !(1..=HISTORY_MAX_TOKENS).contains(&tokens) {
            return Err(format!(
                "history.history_tokens = {tokens} is outside 1..={HISTORY_MAX_TOKENS}"
            ));
        }
        if tokens * self.n > HISTORY_MAX_INDEX_ENTRIES {
            return Err(format!(
                "history.history_tokens = {tokens} with history.n = {} needs {} index entries, \
                 over the limit of {HISTORY_MAX_INDEX_ENTRIES} (about 12 GB)",
                self.n,
                tokens * self.n
            ));
        }
        match self.spec_factor {
            Some(factor) if !(factor.is_finite() && factor > 0.0) => Err(format!(
                "history.spec_factor = {factor} must be finite and positive"
            )),
            _ => Ok(()),
        }
    }
}

impl DrafterKind for History {
    fn is_chain(&self) -> bool {
        true
    }
    fn for_generate(_draft: Option<&str>) -> Option<Self> {
        Some(History {
            n: 4,
            history_tokens: None,
            spec_factor: None,
        })
    }
    fn build(&self, _ctx: &mut dyn DraftContext, _setup: &DraftSetup<'_>) -> Result<BuiltDrafter> {
        let config = NgramConfig {
            max_n: self.n,
            min_n: 1,
            max_matches: 4,
        };
        let tokens = self.history_tokens.unwrap_or(HISTORY_DEFAULT_TOKENS);
        Ok(BuiltDrafter {
            drafter: Box::new(
                HistoryDrafter::new(config, 16, tokens)?.with_spec_factor(Some(
                    self.spec_factor.unwrap_or(HISTORY_DEFAULT_SPEC_FACTOR),
                ))?,
            ),
            is_chain: true,
            shape: None,
            draft_pass_s: Some(0.0),
        })
    }
}
