//! When a request stops: end-of-sequence tokens, stop token sequences, stop strings, max tokens.
//!
//! Stops are checked token by token **inside** an accepted block: a verification step may emit
//! several tokens at once, and the output is cut right after the token that triggers a stop (the
//! stop token itself is kept, as in plain decoding). The engine then rewinds the KV of the tokens
//! it committed past the cut.

use std::fmt;
use std::sync::Arc;

/// Turns output token ids into text, for stop strings (usually a tokenizer's `decode`).
pub type Detokenizer = Arc<dyn Fn(&[u32]) -> String + Send + Sync>;

/// Why a request finished.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FinishReason {
    /// An end-of-sequence token was generated.
    Eos,
    /// A stop token sequence or stop string appeared in the output.
    Stop,
    /// `max_new_tokens` were generated.
    MaxTokens,
    /// The model's context is full.
    ContextFull,
    /// The client cancelled the request (a serving run, [`super::RequestQueue::cancelled`]).
    Cancelled,
}

/// The stop conditions of one request.
#[derive(Clone, Default)]
pub struct StopRule {
    /// Tokens that end generation (typically the model's EOS ids).
    pub eos_ids: Vec<u32>,
    /// Token sequences that end generation once the output ends with one of them.
    pub stop_sequences: Vec<Vec<u32>>,
    /// Strings that end generation once the decoded output contains one (needs `detokenizer`).
    pub stop_strings: Vec<String>,
    /// Decodes the output for `stop_strings`.
    pub detokenizer: Option<Detokenizer>,
    /// Most tokens to generate.
    pub max_new_tokens: usize,
}

impl fmt::Debug for StopRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopRule")
            .field("eos_ids", &self.eos_ids)
            .field("stop_sequences", &self.stop_sequences)
            .field("stop_strings", &self.stop_strings)
            .field("max_new_tokens", &self.max_new_tokens)
            .finish_non_exhaustive()
    }
}

impl StopRule {
    /// Stops after `max_new_tokens` tokens or any of `eos_ids`.
    pub fn new(max_new_tokens: usize, eos_ids: &[u32]) -> Self {
        Self {
            eos_ids: eos_ids.to_vec(),
            max_new_tokens,
            ..Self::default()
        }
    }

    /// Whether the output (generated tokens only, the last one just appended) must stop here.
    pub fn check(&self, output: &[u32]) -> Option<FinishReason> {
        let last = *output.last()?;
        if self.eos_ids.contains(&last) {
            return Some(FinishReason::Eos);
        }
        if self
            .stop_sequences
            .iter()
            .any(|stop| !stop.is_empty() && output.ends_with(stop))
        {
            return Some(FinishReason::Stop);
        }
        if let (false, Some(decode)) = (self.stop_strings.is_empty(), &self.detokenizer) {
            let text = decode(output);
            if self.stop_strings.iter().any(|s| text.contains(s.as_str())) {
                return Some(FinishReason::Stop);
            }
        }
        (output.len() >= self.max_new_tokens).then_some(FinishReason::MaxTokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_condition_fires_on_its_token() {
        let mut rule = StopRule::new(5, &[9]);
        rule.stop_sequences = vec![vec![3, 4]];
        rule.stop_strings = vec!["xy".into()];
        rule.detokenizer = Some(Arc::new(|ids: &[u32]| {
            ids.iter().map(|&i| char::from(b'a' + i as u8)).collect()
        }));
        assert_eq!(rule.check(&[1, 9]), Some(FinishReason::Eos));
        assert_eq!(rule.check(&[1, 3, 4]), Some(FinishReason::Stop));
        assert_eq!(rule.check(&[23, 24]), Some(FinishReason::Stop), "\"xy\"");
        assert_eq!(rule.check(&[1, 1, 1, 1]), None);
        assert_eq!(rule.check(&[1, 1, 1, 1, 1]), Some(FinishReason::MaxTokens));
        assert_eq!(rule.check(&[]), None);
    }
}
