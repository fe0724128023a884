//! Layer-skip self-drafting: the target model with a subset of its blocks, as a cheap draft model
//! for targets with no same-tokenizer partner (Draft & Verify / SWIFT style, no training).
//!
//! [`LlamaModel::layer_skip`] builds a sibling [`LlamaModel`] that **shares** the target's weights
//! (an `Arc`, nothing copied) and runs only the listed blocks, in order, then the final norm and
//! the LM head. It has its own KV cache (one layer per kept block), so it drafts independently of
//! the target's sequences. [`default_skip_layers`] picks a default subset.

use super::model::{LlamaModel, LlamaOptions};
use crate::error::{ModelError, Result};

impl LlamaModel {
    /// A layer-skip view of this model running blocks `keep` (indices into this model's blocks,
    /// strictly increasing, non-empty), sharing the weights, with a fresh KV cache sized by
    /// `options`. Skipping from a layer-skip view indexes that view's blocks.
    ///
    /// # Errors
    /// [`ModelError::Config`] if `keep` is empty, not strictly increasing, or names a block
    /// outside `0..n_layers`; KV layout errors.
    pub fn layer_skip(&self, keep: &[usize], options: LlamaOptions) -> Result<LlamaModel> {
        let (config, plan, weights, layers, special, comm) = self.parts();
        if keep.is_empty() {
            return Err(ModelError::Config(
                "layer skip: keep at least one block".into(),
            ));
        }
        if let Some(bad) = keep.iter().find(|&&b| b >= layers.len()) {
            return Err(ModelError::Config(format!(
                "layer skip: block {bad} is outside 0..{}",
                layers.len()
            )));
        }
        if keep.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ModelError::Config(format!(
                "layer skip: blocks {keep:?} are not strictly increasing"
            )));
        }
        let blocks = keep.iter().map(|&b| layers[b]).collect();
        LlamaModel::assemble(
            config.clone(),
            plan.clone(),
            weights.clone(),
            blocks,
            special.clone(),
            options,
            comm.clone(),
        )
    }

    /// Number of blocks this model runs (fewer than `config().n_layers` for a layer-skip view).
    pub fn active_layers(&self) -> usize {
        self.parts().3.len()
    }
}

/// The default blocks a layer-skip drafter keeps out of `n_layers`: the first and last quarter
/// whole, and every other block of the middle half (about 3/4 of the blocks run). Empty input
/// gives an empty list.
pub fn default_skip_layers(n_layers: usize) -> Vec<usize> {
    let edge = n_layers / 4;
    (0..n_layers)
        .filter(|&i| i < edge || i >= n_layers - edge || (i - edge).is_multiple_of(2))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::default_skip_layers;

    #[test]
    fn default_keeps_edges_and_half_the_middle() {
        let keep = default_skip_layers(30);
        assert_eq!(&keep[..7], &[0, 1, 2, 3, 4, 5, 6]);
        assert!(keep.ends_with(&[23, 24, 25, 26, 27, 28, 29]));
        assert!(keep.len() < 30 && keep.len() > 15);
        assert!(keep.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(default_skip_layers(1), vec![0]);
    }
}
