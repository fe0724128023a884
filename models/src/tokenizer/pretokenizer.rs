//! The normalizer and pre-tokenizer each `tokenizer.ggml.pre` value calls for.

use tokenizers::normalizers::unicode::NFC;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use crate::error::{ModelError, Result};

/// The Qwen2 split regex (contractions, letters with one leading non-letter, single digits,
/// punctuation runs, newlines, whitespace).
pub const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The `tokenizer.ggml.pre` values this crate builds a tokenizer for.
pub const SUPPORTED_PRE: &[&str] = &["qwen2", "smollm", "gpt2", "default"];

/// The normalizer and pre-tokenizer for `tokenizer.ggml.pre = pre`:
/// - `qwen2`: NFC, then [`QWEN2_PATTERN`] split (matches isolated), then ByteLevel without
///   prefix space and without its own regex;
/// - `smollm`: individual digits, then ByteLevel with the GPT-2 regex, no prefix space;
/// - `gpt2` / `default` (and a missing key): ByteLevel with the GPT-2 regex, no prefix space.
///
/// # Errors
/// [`ModelError::Tokenizer`] naming an unsupported `pre` value.
pub fn for_pre(pre: &str) -> Result<(Option<NormalizerWrapper>, PreTokenizerWrapper)> {
    let byte_level = |use_regex| ByteLevel::new(false, true, use_regex).into();
    Ok(match pre {
        "qwen2" => {
            let split = Split::new(
                SplitPattern::Regex(QWEN2_PATTERN.to_owned()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| ModelError::Tokenizer(format!("the qwen2 split regex: {e}")))?;
            (
                Some(NFC.into()),
                Sequence::new(vec![split.into(), byte_level(false)]).into(),
            )
        }
        "smollm" => (
            None,
            Sequence::new(vec![Digits::new(true).into(), byte_level(true)]).into(),
        ),
        "gpt2" | "default" => (None, byte_level(true)),
        other => {
            return Err(ModelError::Tokenizer(format!(
                "tokenizer.ggml.pre `{other}` is not supported (supported: {})",
                SUPPORTED_PRE.join(", ")
            )))
        }
    })
}
