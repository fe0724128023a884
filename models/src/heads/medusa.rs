//! [`MedusaHeads`]: K Medusa-style residual heads over the target's last feature (see the module
//! docs of [`crate::heads`] for the math). Stateless: no cache, any rows in any order.

use specdec_kernels::ops::rms_norm;

use super::{
    head_matrix, head_vector, silu, DraftHead, HeadBase, HeadFile, HeadKind, HeadMeta,
    HeadPrecision,
};
use crate::error::{ModelError, Result};
use crate::llama::block::on_pool;
use crate::llama::product::ProductInput;
use crate::llama::{LlamaModel, WeightMatrix};

/// The Medusa heads of one target: `K` residual blocks `h_k = n + silu(W_k · n + b_k)` on the
/// final-normed feature `n`, and one LM head over the draft vocabulary. The target's final norm
/// is shared with it, not copied.
///
/// Row-independent: a row's logits depend only on its own feature, bit for bit, whatever other
/// rows share the call.
pub struct MedusaHeads {
    base: HeadBase,
    /// `W_k`, `[H, H]` each.
    weights: Vec<WeightMatrix>,
    /// `b_k`, `[H]` each.
    biases: Vec<Vec<f32>>,
}

impl std::fmt::Debug for MedusaHeads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MedusaHeads")
            .field("target", &self.base.meta.target.name)
            .field("heads", &self.weights.len())
            .field("precision", &self.base.precision)
            .finish_non_exhaustive()
    }
}

impl DraftHead for MedusaHeads {
    fn meta(&self) -> &HeadMeta {
        &self.base.meta
    }

    fn d2t(&self) -> &[u32] {
        &self.base.d2t
    }
}

impl MedusaHeads {
    /// The heads of `file` (kind medusa) for `target`, with matrices stored as `precision`
    /// says. The target's identity (SHA-256) is not checked here; see
    /// [`HeadFile::check_target`].
    ///
    /// # Errors
    /// [`ModelError::Config`] for an invalid file, an EAGLE file, or heads trained for another
    /// architecture, hidden size or vocabulary (naming both).
    pub fn new(file: &HeadFile, target: &LlamaModel, precision: HeadPrecision) -> Result<Self> {
        let base = HeadBase::new(file, HeadKind::Medusa, target, precision)?;
        let k = base.meta.medusa_heads;
        Ok(Self {
            weights: (0..k)
                .map(|k| head_matrix(file, &format!("medusa.{k}.weight"), precision))
                .collect::<Result<_>>()?,
            biases: (0..k)
                .map(|k| head_vector(file, &format!("medusa.{k}.bias")))
                .collect::<Result<_>>()?,
            base,
        })
    }

    /// Number of heads `K`: head `k` predicts the token `k + 2` positions after its feature's.
    pub fn heads(&self) -> usize {
        self.weights.len()
    }

    /// The logits of every head for `rows` features (`features: [rows, feature_dim]`
    /// row-major): `[rows, K, draft_vocab]`, head `k` of row `r` at
    /// `(r · K + k) · draft_vocab`. Zero rows give an empty vector.
    ///
    /// # Errors
    /// [`ModelError::Shape`] when `features` is not `rows · feature_dim` long or holds a
    /// non-finite value.
    pub fn forward(&self, features: &[f32], rows: usize) -> Result<Vec<f32>> {
        let hidden = self.hidden();
        if features.len() != rows * self.feature_dim() {
            return Err(ModelError::Shape {
                what: "Medusa features".into(),
                reason: format!(
                    "{} values for {rows} rows of {} (the heads' feature_dim)",
                    features.len(),
                    self.feature_dim()
                ),
            });
        }
        if let Some(i) = features.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::Shape {
                what: "Medusa features".into(),
                reason: format!(
                    "value {} of row {} is {}",
                    i % hidden,
                    i / hidden,
                    features[i]
                ),
            });
        }
        if rows == 0 {
            return Ok(Vec::new());
        }
        on_pool(|| self.forward_rows(features, rows))
    }

    fn forward_rows(&self, features: &[f32], rows: usize) -> Result<Vec<f32>> {
        let (hidden, heads, path) = (self.hidden(), self.heads(), self.base.path);
        let mut normed = vec![0.0f32; rows * hidden];
        rms_norm(
            features,
            self.base.output_norm(),
            self.base.final_norm_eps,
            &mut normed,
        )?;
        // W_k · n for every head k: `[K, rows, H]`, one call sharing the quantised input.
        let mut projected = vec![0.0f32; heads * rows * hidden];
        let mut pairs: Vec<(&WeightMatrix, &mut [f32])> = self
            .weights
            .iter()
            .zip(projected.chunks_exact_mut(rows * hidden))
            .collect();
        ProductInput::new(&normed, rows, path).products(&mut pairs)?;
        // h_k = n + silu(W_k n + b_k), laid out `[rows, K, H]` for one LM head call.
        let mut residual = vec![0.0f32; rows * heads * hidden];
        for (k, (head_rows, bias)) in projected
            .chunks_exact(rows * hidden)
            .zip(&self.biases)
            .enumerate()
        {
            for (r, (projection, n)) in head_rows
                .chunks_exact(hidden)
                .zip(normed.chunks_exact(hidden))
                .enumerate()
            {
                let at = (r * heads + k) * hidden;
                let out = &mut residual[at..at + hidden];
                for (((o, &p), &b), &n) in out.iter_mut().zip(projection).zip(bias).zip(n) {
                    *o = n + silu(p + b);
                }
            }
        }
        let mut logits = vec![0.0f32; rows * heads * self.draft_vocab()];
        ProductInput::new(&residual, rows * heads, path)
            .product(&self.base.lm_head, &mut logits)?;
        Ok(logits)
    }
}
