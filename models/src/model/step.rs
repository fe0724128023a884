//! The inputs and outputs of one forward step.

use specdec_kernels::TreeTopology;

use crate::error::{ModelError, Result};

/// Identifies one sequence (one request's token stream) inside a model's KV cache; the KV
/// cache's own id type, handed out by [`crate::LanguageModel::new_sequence`].
pub use specdec_kernels::kv::SeqId;

/// The new tokens of one sequence in one forward: `tokens[i]` is node `i` of `tree`.
///
/// A prefill chunk or a plain decoding step is a chain ([`TreeTopology::chain`]); a draft tree
/// being verified is any tree whose root is the last token not yet in the cache.
#[derive(Debug, Clone, Copy)]
pub struct SequenceStep<'a> {
    /// The sequence these tokens extend.
    pub seq: SeqId,
    /// Token ids, one per tree node, in node order.
    pub tokens: &'a [u32],
    /// The shape of the new tokens; `tree.len() == tokens.len()`.
    pub tree: &'a TreeTopology,
}

impl<'a> SequenceStep<'a> {
    /// A step whose tokens form one chain.
    pub fn chain(seq: SeqId, tokens: &'a [u32], tree: &'a TreeTopology) -> Self {
        Self { seq, tokens, tree }
    }

    /// Checks the step's own shape: as many tokens as tree nodes, at least one token, and every
    /// token below `vocab_size`.
    ///
    /// # Errors
    /// [`ModelError::InvalidStep`] naming the sequence and the fault.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        if self.tokens.len() != self.tree.len() {
            return Err(ModelError::InvalidStep {
                seq: self.seq.0,
                reason: format!(
                    "{} tokens but the tree has {} nodes",
                    self.tokens.len(),
                    self.tree.len()
                ),
            });
        }
        if self.tokens.is_empty() {
            return Err(ModelError::InvalidStep {
                seq: self.seq.0,
                reason: "no new tokens".to_string(),
            });
        }
        if let Some(&bad) = self.tokens.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(ModelError::InvalidStep {
                seq: self.seq.0,
                reason: format!("token id {bad} is outside the vocabulary of {vocab_size}"),
            });
        }
        Ok(())
    }
}

/// Row-major f32 logits `[rows, vocab]`: row `i` belongs to new token (tree node) `i`.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    vocab: usize,
    data: Vec<f32>,
}

impl Logits {
    /// Wraps `data` of `rows * vocab` values.
    ///
    /// # Errors
    /// [`ModelError::Shape`] when `data.len()` is not a
    /// multiple of `vocab` or `vocab` is zero.
    pub fn new(vocab: usize, data: Vec<f32>) -> Result<Self> {
        if vocab == 0 || !data.len().is_multiple_of(vocab) {
            return Err(ModelError::Shape {
                what: "logits".to_string(),
                reason: format!("{} values do not form rows of {vocab}", data.len()),
            });
        }
        Ok(Self { vocab, data })
    }

    /// Number of rows (new tokens).
    pub fn rows(&self) -> usize {
        self.data.len() / self.vocab
    }

    /// Vocabulary size (row length).
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Logits of new token `i`. Panics if `i >= rows()`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }

    /// All values, row-major.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// Consumes the logits, returning the row-major values.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }

    /// The id with the largest logit in row `i` (ties go to the lowest id; NaN never wins).
    pub fn argmax(&self, i: usize) -> u32 {
        argmax(self.row(i))
    }
}

/// Index of the largest value (the lowest index among ties; NaN values never win). 0 for an
/// empty slice.
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_value = f32::NEG_INFINITY;
    for (i, &v) in values.iter().enumerate() {
        if v > best_value {
            best = i;
            best_value = v;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_the_fault() {
        let tree = TreeTopology::chain(2);
        let step = SequenceStep::chain(SeqId(3), &[1, 2], &tree);
        assert!(step.validate(3).is_ok());
        let err = step.validate(2).unwrap_err().to_string();
        assert!(err.contains("seq 3") && err.contains("token id 2"), "{err}");
        let short = SequenceStep::chain(SeqId(4), &[1], &tree);
        let err = short.validate(3).unwrap_err().to_string();
        assert!(err.contains("1 tokens but the tree has 2 nodes"), "{err}");
    }

    #[test]
    fn logits_rows_and_argmax() {
        let logits = Logits::new(3, vec![0.0, 2.0, 2.0, 5.0, f32::NAN, 1.0]).unwrap();
        assert_eq!(logits.rows(), 2);
        assert_eq!(logits.argmax(0), 1);
        assert_eq!(logits.argmax(1), 0);
        assert!(Logits::new(4, vec![0.0; 6]).is_err());
    }
}
