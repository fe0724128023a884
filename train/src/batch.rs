//! Batches of cached sequences, the frozen target pieces on the tensor side (labels, the
//! target's final norm and draft LM head), and the seeded data order.

use candle_core::{Device, Tensor};
use specdec_kernels::sampling::mix64;

use crate::error::{Result, TensorContext};
use crate::features::FeatureCache;
use crate::nn::{linear, log_softmax, rms_norm};
use crate::target::FrozenTarget;

/// Sequences of one step, padded to the longest. Sequence `b` holds tokens `t_0..t_{L_b}` and
/// features `f_0..f_{L_b}` (`L_b + 1 = lens[b] + 1` of each); feature row `(b, i)` is flat row
/// `b · rows + i` of [`Batch::features`].
#[derive(Debug, Clone)]
pub(crate) struct Batch {
    /// `L_b` per sequence (tokens − 1: the head positions of an EAGLE head).
    pub lens: Vec<usize>,
    /// Rows per sequence after padding: `max L_b + 1`.
    pub rows: usize,
    /// `[B × rows]` token ids, padded with 0.
    pub tokens: Vec<u32>,
    /// `[B, rows, H]` features, padded with zeros.
    pub features: Tensor,
}

impl Batch {
    /// Sequences `indices` of `cache`.
    ///
    /// # Errors
    /// Cache read errors.
    pub(crate) fn load(cache: &FeatureCache, indices: &[usize]) -> Result<Self> {
        let h = cache.hidden();
        let rows = indices.iter().map(|&i| cache.seq_len(i)).max().unwrap_or(1);
        let mut tokens = vec![0u32; indices.len() * rows];
        let mut features = vec![0f32; indices.len() * rows * h];
        let mut lens = Vec::with_capacity(indices.len());
        for (b, &i) in indices.iter().enumerate() {
            let t = cache.tokens(i)?;
            let f = cache.features(i)?;
            tokens[b * rows..b * rows + t.len()].copy_from_slice(&t);
            features[b * rows * h..b * rows * h + f.len()].copy_from_slice(&f);
            lens.push(t.len() - 1);
        }
        Self::from_parts(lens, rows, tokens, features, h)
    }

    /// A batch over given rows (`tokens: [B × rows]`, `features: [B × rows × h]`).
    pub(crate) fn from_parts(
        lens: Vec<usize>,
        rows: usize,
        tokens: Vec<u32>,
        features: Vec<f32>,
        h: usize,
    ) -> Result<Self> {
        let features = Tensor::from_vec(features, (lens.len(), rows, h), &Device::Cpu)
            .tensor_context("batch features")?;
        Ok(Self {
            lens,
            rows,
            tokens,
            features,
        })
    }

    /// Number of sequences.
    pub(crate) fn size(&self) -> usize {
        self.lens.len()
    }

    /// The flat feature rows `(b, i)` with `first ≤ i ≤ L_b − last_gap`, by sequence then `i`.
    pub(crate) fn feature_rows(&self, first: usize, last_gap: usize) -> Vec<u32> {
        let mut out = Vec::new();
        for (b, &len) in self.lens.iter().enumerate() {
            if len < last_gap {
                continue;
            }
            for i in first..=len - last_gap {
                out.push((b * self.rows + i) as u32);
            }
        }
        out
    }
}

/// The target's frozen pieces a head's loss needs, as tensors: the final norm and the LM head
/// rows of the draft vocabulary, and the token embedding (rows gathered per batch).
pub(crate) struct Frozen<'a> {
    pub target: &'a FrozenTarget,
    /// `[H]`.
    pub output_norm: Tensor,
    /// `[V_d, H]`: the target's LM head rows of the draft ids (what the labels come from).
    pub lm_head: Tensor,
}

impl<'a> Frozen<'a> {
    /// Dequantises the final norm and the draft vocabulary's LM head rows of `target`.
    ///
    /// # Errors
    /// An id of `d2t` outside the vocabulary.
    pub(crate) fn new(target: &'a FrozenTarget, d2t: &[u32]) -> Result<Self> {
        let h = target.config().hidden;
        let dev = Device::Cpu;
        let lm_head = Tensor::from_vec(target.lm_head_rows(d2t)?, (d2t.len(), h), &dev)
            .tensor_context("draft LM head")?;
        let output_norm =
            Tensor::from_slice(target.output_norm(), h, &dev).tensor_context("final norm")?;
        Ok(Self {
            target,
            output_norm,
            lm_head,
        })
    }

    /// The target's RMSNorm epsilon.
    pub(crate) fn rms_eps(&self) -> f32 {
        self.target.config().rms_eps
    }

    /// Token embeddings of `ids`, `[ids.len(), H]`.
    ///
    /// # Errors
    /// An id outside the vocabulary.
    pub(crate) fn embed(&self, ids: &[u32]) -> Result<Tensor> {
        let h = self.target.config().hidden;
        Tensor::from_vec(
            self.target.embedding_rows(ids)?,
            (ids.len(), h),
            &Device::Cpu,
        )
        .tensor_context("token embedding")
    }

    /// Draft-vocabulary logits `lm_head · rms_norm(x)` of `x: [rows, H]` with the head `w`.
    pub(crate) fn logits(&self, x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
        linear(&rms_norm(x, &self.output_norm, self.rms_eps())?, w)
    }

    /// The labels: the target's own distribution over the draft vocabulary at features
    /// `f: [rows, H]`, `softmax(lm_head · rms_norm(f))` (constant: no gradient).
    pub(crate) fn label_logits(&self, f: &Tensor) -> candle_core::Result<Tensor> {
        Ok(self.logits(f, &self.lm_head)?.detach())
    }

    /// [`Frozen::label_logits`] as log-probabilities.
    pub(crate) fn label_log_probs(&self, f: &Tensor) -> candle_core::Result<Tensor> {
        log_softmax(&self.label_logits(f)?)
    }
}

/// The order training sequences are visited in: epoch `e` is a permutation of `0..n` seeded by
/// `(seed, e)`; the data position is the number of sequences consumed, so a resumed run takes
/// the same batches.
#[derive(Debug, Clone)]
pub(crate) struct DataOrder {
    n: usize,
    seed: u64,
    epoch: Option<(u64, Vec<usize>)>,
}

impl DataOrder {
    pub(crate) fn new(n: usize, seed: u64) -> Self {
        assert!(n > 0, "a data order over no sequence");
        Self {
            n,
            seed,
            epoch: None,
        }
    }

    /// The `count` sequences after the first `consumed` ones.
    pub(crate) fn take(&mut self, consumed: u64, count: usize) -> Vec<usize> {
        (consumed..consumed + count as u64)
            .map(|k| {
                let epoch = k / self.n as u64;
                if self.epoch.as_ref().is_none_or(|(e, _)| *e != epoch) {
                    self.epoch =
                        Some((epoch, permutation(self.n, mix64(self.seed ^ mix64(epoch)))));
                }
                self.epoch.as_ref().expect("just set").1[(k % self.n as u64) as usize]
            })
            .collect()
    }
}

/// A seeded Fisher–Yates permutation of `0..n`.
pub(crate) fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut out: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (mix64(seed ^ (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d)) % (i as u64 + 1))
            as usize;
        out.swap(i, j);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_order_is_a_seeded_permutation_per_epoch() {
        let mut order = DataOrder::new(5, 3);
        let first: Vec<usize> = order.take(0, 5);
        let mut sorted = first.clone();
        sorted.sort();
        assert_eq!(sorted, [0, 1, 2, 3, 4]);
        // the same positions give the same sequences, across epochs and fresh orders
        let across = order.take(3, 4);
        assert_eq!(&across[..2], &first[3..]);
        assert_eq!(DataOrder::new(5, 3).take(5, 2), across[2..]);
        assert_ne!(DataOrder::new(5, 4).take(0, 5), first, "another seed");
    }
}
