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

/// Row-major f32 logits `[rows, vocab]`: row `i` belongs to new token (tree node) `i`. When the
/// model taps features ([`crate::LanguageModel::tap_features`]) they come along, one row per new
/// token.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    vocab: usize,
    data: Vec<f32>,
    features: Option<Features>,
}

/// Row-major f32 hidden states `[rows, dim]` of the new tokens of one forward: for each token,
/// the outputs of the tapped blocks ([`crate::LanguageModel::tap_features`]) side by side, in
/// tap order (`dim` = taps × hidden size). The residual stream after a block, before any norm.
#[derive(Debug, Clone, PartialEq)]
pub struct Features {
    dim: usize,
    data: Vec<f32>,
}

impl Features {
    /// Wraps `data` of `rows * dim` values.
    ///
    /// # Errors
    /// [`ModelError::Shape`] when `dim` is zero or does not divide `data.len()`.
    pub fn new(dim: usize, data: Vec<f32>) -> Result<Self> {
        if dim == 0 || !data.len().is_multiple_of(dim) {
            return Err(ModelError::Shape {
                what: "features".to_string(),
                reason: format!("{} values do not form rows of {dim}", data.len()),
            });
        }
        Ok(Self { dim, data })
    }

    /// Number of rows (new tokens).
    pub fn rows(&self) -> usize {
        self.data.len() / self.dim
    }

    /// Row length: taps × hidden size.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The features of new token `i`. Panics if `i >= rows()`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    /// All values, row-major.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// Consumes the features, returning the row-major values.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }
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
        Ok(Self {
            vocab,
            data,
            features: None,
        })
    }

    /// These logits with `features` attached (one row per logits row).
    ///
    /// # Errors
    /// [`ModelError::Shape`] when the row counts differ.
    pub fn with_features(mut self, features: Features) -> Result<Self> {
        if features.rows() != self.rows() {
            return Err(ModelError::Shape {
                what: "features".to_string(),
                reason: format!(
                    "{} rows of features for {} rows of logits",
                    features.rows(),
                    self.rows()
                ),
            });
        }
        self.features = Some(features);
        Ok(self)
    }

    /// The tapped features of the new tokens, when the model taps any.
    pub fn features(&self) -> Option<&Features> {
        self.features.as_ref()
    }

    /// Takes the features out (leaving none).
    pub fn take_features(&mut self) -> Option<Features> {
        self.features.take()
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
