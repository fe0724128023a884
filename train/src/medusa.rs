//! The Medusa-style heads (math: `specdec_models::heads`): with `n = rms_norm(f_j; output_norm)`
//! (the target's final norm), head `k` computes `h_k = n + silu(W_k · n + b_k)` and logits
//! `lm_head · h_k` over the draft vocabulary, predicting token `t_{j+k+2}`; its label is the
//! target's distribution `p_{j+k+2}` at `f_{j+k+1}`. Loss `Σ_k 0.8^k · CE_k` (each head's KL
//! divergence `CE_k − H(p)` is recorded beside it). `W_k` and `b_k`
//! start at zero (Medusa's initialisation: every head starts as the target's own next-token
//! head).

use candle_core::{Device, Tensor};
use specdec_models::heads::{HeadFile, HeadKind};

use crate::batch::{Batch, Frozen};
use crate::error::{Result, TensorContext, TrainError};
use crate::head::{cross_entropy_and_kl, Agreement, HeadModel, StepLoss};
use crate::nn::{linear, linear_bias, log_softmax, rms_norm};
use crate::params::Params;
use crate::target::FrozenTarget;

/// The weight of head `k`'s loss is `MEDUSA_DECAY^k` (Medusa-1's choice).
pub const MEDUSA_DECAY: f64 = 0.8;

/// K Medusa heads with their (frozen or trainable) draft LM head.
pub(crate) struct MedusaHead {
    params: Params,
    heads: usize,
    hidden: usize,
}

impl MedusaHead {
    /// Fresh heads: `W_k = 0`, `b_k = 0`, `lm_head` the target's rows of the draft vocabulary;
    /// `shapes` are the head's `HeadMeta::tensor_shapes`.
    pub(crate) fn init(
        shapes: &[(String, Vec<usize>)],
        frozen: &Frozen<'_>,
        heads: usize,
        train_lm_head: bool,
    ) -> Result<Self> {
        let mut params = Params::new();
        for (name, shape) in shapes {
            let n: usize = shape.iter().product();
            let (values, trainable) = if name == "lm_head" {
                let rows = frozen
                    .lm_head
                    .flatten_all()
                    .and_then(|t| t.to_vec1::<f32>())
                    .tensor_context("draft LM head")?;
                (rows, train_lm_head)
            } else {
                (vec![0.0; n], true)
            };
            params.push(name, shape, values, trainable)?;
        }
        Ok(Self {
            params,
            heads,
            hidden: frozen.target.config().hidden,
        })
    }

    /// Heads over a head file's tensors (all frozen).
    ///
    /// # Errors
    /// [`TrainError::Data`] for a file that is not a Medusa head or lacks a tensor.
    pub(crate) fn from_head_file(head: &HeadFile) -> Result<Self> {
        let bad = |reason: String| TrainError::Data {
            path: "Medusa head file".into(),
            reason,
        };
        if head.meta.kind != HeadKind::Medusa {
            return Err(bad(format!("a {} head", head.meta.kind.name())));
        }
        let mut params = Params::new();
        let shapes = head.meta.tensor_shapes().map_err(|e| bad(e.to_string()))?;
        for (name, shape) in &shapes {
            let t = head.tensor(name).map_err(|e| bad(e.to_string()))?;
            params.push(name, shape, t.data.clone(), false)?;
        }
        Ok(Self {
            params,
            heads: head.meta.medusa_heads,
            hidden: head.meta.target.hidden,
        })
    }

    /// The residual heads' logits at normed features `n: [rows, H]` for head `k`.
    fn head_logits(&self, n: &Tensor, k: usize) -> candle_core::Result<Tensor> {
        let w = self.params.get(&format!("medusa.{k}.weight"));
        let b = self.params.get(&format!("medusa.{k}.bias"));
        let h = (n + linear_bias(n, w, Some(b))?.silu()?)?;
        linear(&h, self.params.get("lm_head"))
    }

    /// For head `k`: the input feature rows `(b, j)`, `0 ≤ j ≤ L_b − k − 1`, and their labels'
    /// index among the rows `(b, i)`, `1 ≤ i ≤ L_b` (label row `i = j + k + 1`).
    fn head_rows(batch: &Batch, k: usize) -> (Vec<u32>, Vec<u32>) {
        let (mut input, mut label) = (Vec::new(), Vec::new());
        let mut offset = 0u32;
        for (b, &len) in batch.lens.iter().enumerate() {
            for j in 0..len.saturating_sub(k) {
                input.push((b * batch.rows + j) as u32);
                label.push(offset + (j + k) as u32);
            }
            offset += len as u32;
        }
        (input, label)
    }

    /// Per head: the head's logits at its input rows and the label logits (the target's, at
    /// the rows `k + 1` later), for `depths` heads.
    fn outputs(
        &self,
        frozen: &Frozen<'_>,
        batch: &Batch,
        depths: usize,
    ) -> candle_core::Result<Vec<Option<(Tensor, Tensor)>>> {
        let dev = Device::Cpu;
        let features = batch
            .features
            .reshape((batch.size() * batch.rows, self.hidden))?;
        let label_rows = Tensor::new(batch.feature_rows(1, 0), &dev)?;
        let label_logits = frozen.label_logits(&features.index_select(&label_rows, 0)?)?;
        let normed = rms_norm(&features, &frozen.output_norm, frozen.rms_eps())?;
        (0..depths.min(self.heads))
            .map(|k| {
                let (input, label) = Self::head_rows(batch, k);
                if input.is_empty() {
                    return Ok(None);
                }
                let n = normed.index_select(&Tensor::new(input, &dev)?, 0)?;
                let p = label_logits.index_select(&Tensor::new(label, &dev)?, 0)?;
                Ok(Some((self.head_logits(&n, k)?, p)))
            })
            .collect()
    }
}

impl HeadModel for MedusaHead {
    fn params(&self) -> &Params {
        &self.params
    }

    fn component_names(&self) -> Vec<String> {
        (1..=self.heads)
            .flat_map(|k| [format!("ce@{k}"), format!("kl@{k}")])
            .collect()
    }

    fn loss(&self, frozen: &Frozen<'_>, batch: &Batch) -> Result<StepLoss> {
        let run = || -> candle_core::Result<StepLoss> {
            let mut total = Tensor::zeros((), candle_core::DType::F32, &Device::Cpu)?;
            let mut components = Vec::with_capacity(2 * self.heads);
            let mut positions = 0u64;
            for (k, out) in self
                .outputs(frozen, batch, self.heads)?
                .into_iter()
                .enumerate()
            {
                let Some((logits, label_logits)) = out else {
                    components.extend([0.0, 0.0]);
                    continue;
                };
                positions += logits.dim(0)? as u64;
                let (ce, kl) = cross_entropy_and_kl(&logits, &log_softmax(&label_logits)?)?;
                components.extend([ce.to_scalar::<f32>()?, kl]);
                total = (total + (ce * MEDUSA_DECAY.powi(k as i32))?)?;
            }
            Ok(StepLoss {
                total,
                components,
                positions,
            })
        };
        run().tensor_context("Medusa loss")
    }

    fn agreement(
        &self,
        frozen: &Frozen<'_>,
        batch: &Batch,
        depths: usize,
        skip_tokens: usize,
    ) -> Result<Vec<Agreement>> {
        let outs = self
            .outputs(frozen, batch, depths)
            .tensor_context("agreement")?;
        outs.into_iter()
            .enumerate()
            .map(|(k, out)| {
                let Some((q, p)) = out else {
                    return Ok(Agreement::default());
                };
                // head k at input row (b, j) drafts token t_{j+k+2}
                let counted: Vec<bool> = Self::head_rows(batch, k)
                    .0
                    .iter()
                    .map(|&r| r as usize % batch.rows + k + 2 >= skip_tokens)
                    .collect();
                Agreement::of(&q, &p, &counted)
            })
            .collect()
    }
}

/// Runs the Medusa heads of `head` on `n` features (`features: [n × hidden]`, the target's last
/// block output before its final norm), in f32, with `target`'s final norm: one
/// `[n × draft_vocab]` row-major logits buffer per head, head `k` drafting the token `k + 2`
/// positions after each feature's. For comparing another implementation with this trainer's.
///
/// # Errors
/// [`TrainError::Data`] for a head that is not Medusa or a buffer of the wrong size.
pub fn medusa_logits(
    head: &HeadFile,
    target: &FrozenTarget,
    features: &[f32],
) -> Result<Vec<Vec<f32>>> {
    let h = target.config().hidden;
    let bad = |reason: String| TrainError::Data {
        path: "medusa_logits".into(),
        reason,
    };
    if head.meta.kind != HeadKind::Medusa || head.meta.target.hidden != h {
        return Err(bad(format!(
            "a {} head of width {} for a target of width {h}",
            head.meta.kind.name(),
            head.meta.target.hidden
        )));
    }
    if features.is_empty() {
        return Ok(vec![Vec::new(); head.meta.medusa_heads]);
    }
    if !features.len().is_multiple_of(h) {
        return Err(bad(format!(
            "{} values are not rows of {h}",
            features.len()
        )));
    }
    let model = MedusaHead::from_head_file(head)?;
    let run = || -> candle_core::Result<Vec<Vec<f32>>> {
        let dev = Device::Cpu;
        let f = Tensor::from_slice(features, (features.len() / h, h), &dev)?;
        let norm = Tensor::from_slice(target.output_norm(), h, &dev)?;
        let n = rms_norm(&f, &norm, target.config().rms_eps)?;
        (0..model.heads)
            .map(|k| model.head_logits(&n, k)?.flatten_all()?.to_vec1())
            .collect()
    };
    run().tensor_context("Medusa logits")
}
