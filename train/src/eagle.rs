//! The EAGLE-style head (math: `specdec_models::heads`), trained with EAGLE-3's training-time
//! test.
//!
//! Head position `j` reads the pair (`f_j`, `t_{j+1}`): `x = fc · [embed(t_{j+1}); f_j]`, then one
//! pre-norm Llama decoder layer (`x += wo · attn(rope(wq·n + bq), rope(wk·n + bk), wv·n + bv)`
//! with `n = rms_norm(x; attn_norm)`; `x += w_down · (silu(w_gate·m) ⊙ w_up·m)` with
//! `m = rms_norm(x; ffn_norm)`), the target's attention geometry and RoPE layout, RoPE at
//! position `j`, scores scaled by `1/√head_dim`; its output is `f̂_{j+1}` and the draft logits are
//! `lm_head · rms_norm(f̂_{j+1}; output_norm)` (the target's final norm).
//!
//! **Training-time test** over `unroll` steps. Step 1 is teacher forced (true features, causal
//! attention). At step `s ≥ 2` position `j` reads (`f̂_j` = step `s−1`'s output at `j−1`,
//! `t_{j+1}`) and its query attends to exactly what it would see when drafting at depth `s`:
//! the step-1 keys/values at positions `0..=j−s+1`, then the step-`i` keys/values at position
//! `j−s+i` for `i = 2..=s` (its own chain of earlier draft positions) — [`ttt_mask`]. Positions
//! `j < s−1` have no such chain and take no loss. The loss at every step is
//! `w_feat · SmoothL1(f̂_{j+1}, f_{j+1}) + w_ce · CE(p_{j+1}, q_{j+1})`, summed over steps.
//! Gradients flow through `f̂` from one step into the next unless `detach` is set.

use candle_core::{Device, Tensor, D};
use specdec_kernels::ops::RopeLayout;
use specdec_models::heads::{EagleShape, HeadFile, HeadKind, HeadMeta};

use crate::batch::{Batch, Frozen};
use crate::error::{Result, TensorContext, TrainError};
use crate::head::{cross_entropy_and_kl, Agreement, HeadModel, StepLoss};
use crate::nn::{
    apply_rope, linear, linear_bias, rms_norm, rope_tables, smooth_l1, softmax, swiglu,
};
use crate::params::{uniform_init, Params};
use crate::target::FrozenTarget;

/// Additive mask value of a hidden key (finite, so no row ever becomes NaN).
const HIDDEN: f32 = -1e9;

/// What the layer computes with: the head file's shape, the widths, the parsed RoPE layout.
#[derive(Debug, Clone)]
struct Geometry {
    shape: EagleShape,
    hidden: usize,
    feature_dim: usize,
    rope_layout: RopeLayout,
}

impl Geometry {
    /// The geometry `meta` describes.
    ///
    /// # Errors
    /// [`TrainError::Data`] for metadata that is not EAGLE's or whose shape cannot run
    /// ([`EagleShape::check`]).
    fn of(meta: &HeadMeta) -> Result<Self> {
        let bad = |reason: String| TrainError::Data {
            path: "head metadata".into(),
            reason,
        };
        let shape = match (meta.kind, &meta.eagle) {
            (HeadKind::Eagle, Some(e)) => e.clone(),
            _ => return Err(bad("not an EAGLE head".into())),
        };
        shape.check().map_err(|e| bad(e.to_string()))?;
        let rope_layout = shape.rope().map_err(|e| bad(e.to_string()))?;
        Ok(Self {
            shape,
            hidden: meta.target.hidden,
            feature_dim: meta.feature_dim(),
            rope_layout,
        })
    }
}

/// Which keys the queries of training-time-test step `step` (1-based) see, for `len` positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TttMask {
    /// The step.
    pub step: usize,
    /// Positions.
    pub len: usize,
    /// `[len × len]`: entry `j · len + p` says whether the query at `j` sees the step-1 key at
    /// `p`.
    pub prefix: Vec<bool>,
    /// `[step − 1][len]`: `chain[i − 2][j]` says whether the query at `j` sees the step-`i` key
    /// at position `j − step + i` (`i = 2..=step`).
    pub chain: Vec<Vec<bool>>,
}

/// The mask of step `step` ≥ 1 over `len` positions: the step-1 key at `p` is visible to the
/// query at `j` iff `p ≤ j − step + 1`; the step-`i` key at `j − step + i` iff that position
/// exists (`j − step + i ≥ 0`; always for `i = step`, so every query sees at least itself).
pub fn ttt_mask(step: usize, len: usize) -> TttMask {
    assert!(step >= 1, "steps count from 1");
    let prefix = (0..len)
        .flat_map(|j| (0..len).map(move |p| p + step <= j + 1))
        .collect();
    let chain = (2..=step)
        .map(|i| (0..len).map(|j| j + i >= step).collect())
        .collect();
    TttMask {
        step,
        len,
        prefix,
        chain,
    }
}

impl TttMask {
    /// The keys the query at `j` sees, as `(step, position)` pairs: step-1 keys by position,
    /// then the chain by step.
    pub fn visible(&self, j: usize) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = (0..self.len)
            .filter(|&p| self.prefix[j * self.len + p])
            .map(|p| (1, p))
            .collect();
        for (n, row) in self.chain.iter().enumerate() {
            let i = n + 2;
            if row[j] {
                out.push((i, j + i - self.step));
            }
        }
        out
    }
}

/// An EAGLE head: geometry, tensors, RoPE tables, and the training-time-test settings.
pub(crate) struct EagleHead {
    geom: Geometry,
    params: Params,
    cos: Tensor,
    sin: Tensor,
    unroll: usize,
    w_feat: f64,
    w_ce: f64,
    detach: bool,
}

/// Training settings of an EAGLE head.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EagleSettings {
    pub unroll: usize,
    pub w_feat: f64,
    pub w_ce: f64,
    pub detach: bool,
    pub train_lm_head: bool,
    pub max_positions: usize,
}

impl EagleHead {
    /// A freshly initialised head: linear maps uniform in `±1/√fan_in` (PyTorch's default),
    /// norm gains 1, biases 0, `lm_head` the target's rows of the draft vocabulary
    /// (`frozen.lm_head`).
    /// `meta` describes the head.
    pub(crate) fn init(
        meta: &HeadMeta,
        frozen: &Frozen<'_>,
        settings: EagleSettings,
        seed: u64,
    ) -> Result<Self> {
        let geom = Geometry::of(meta)?;
        let mut params = Params::new();
        for (index, (name, shape)) in shapes_of(meta)?.iter().enumerate() {
            let n: usize = shape.iter().product();
            let values = match name.as_str() {
                "attn_norm" | "ffn_norm" | "embed_norm" | "feature_norm" => vec![1.0; n],
                "bq" | "bk" | "bv" => vec![0.0; n],
                "lm_head" => frozen
                    .lm_head
                    .flatten_all()
                    .and_then(|t| t.to_vec1::<f32>())
                    .tensor_context("draft LM head")?,
                _ => uniform_init(seed, index as u64, n, 1.0 / (shape[1] as f32).sqrt()),
            };
            let trainable = name != "lm_head" || settings.train_lm_head;
            params.push(name, shape, values, trainable)?;
        }
        Self::assemble(geom, params, settings)
    }

    /// A head over a head file's tensors (all frozen), for [`eagle_chain`] and measurements,
    /// with RoPE tables for `max_positions` positions.
    pub(crate) fn from_head_file(head: &HeadFile, max_positions: usize) -> Result<Self> {
        let geom = Geometry::of(&head.meta)?;
        let mut params = Params::new();
        for (name, shape) in shapes_of(&head.meta)? {
            let t = head.tensor(&name).map_err(|e| TrainError::Data {
                path: "head file".into(),
                reason: e.to_string(),
            })?;
            params.push(&name, &shape, t.data.clone(), false)?;
        }
        let settings = EagleSettings {
            unroll: 1,
            w_feat: 1.0,
            w_ce: 0.0,
            detach: true,
            train_lm_head: false,
            max_positions,
        };
        Self::assemble(geom, params, settings)
    }

    fn assemble(geom: Geometry, params: Params, settings: EagleSettings) -> Result<Self> {
        let (cos, sin) = rope_tables(
            settings.max_positions.max(1),
            geom.shape.head_dim,
            geom.shape.rope_base,
            &Device::Cpu,
        )?;
        Ok(Self {
            geom,
            params,
            cos,
            sin,
            unroll: settings.unroll,
            w_feat: settings.w_feat,
            w_ce: settings.w_ce,
            detach: settings.detach,
        })
    }

    /// Step outputs `f̂` (`[B, T, H]` each, `T = batch.rows − 1`) of `depth` unrolled steps.
    fn forward(&self, frozen: &Frozen<'_>, batch: &Batch, depth: usize) -> Result<Vec<Tensor>> {
        let (b, rows) = (batch.size(), batch.rows);
        let t = rows - 1;
        let next_tokens: Vec<u32> = (0..b)
            .flat_map(|s| batch.tokens[s * rows + 1..(s + 1) * rows].iter().copied())
            .collect();
        let embeddings = frozen.embed(&next_tokens)?;
        let run = || -> candle_core::Result<Vec<Tensor>> {
            let embeddings = embeddings.reshape((b, t, self.geom.hidden))?;
            let features = batch.features.narrow(1, 0, t)?;
            self.unrolled(&embeddings, &features, depth)
        };
        run().tensor_context("EAGLE forward")
    }

    /// The unrolled steps over pairs (`embeddings: [B, T, H]` of `t_{j+1}`, `features:
    /// [B, T, F]` of `f_j`).
    fn unrolled(
        &self,
        embeddings: &Tensor,
        features: &Tensor,
        depth: usize,
    ) -> candle_core::Result<Vec<Tensor>> {
        let h = self.geom.hidden;
        let fc = self.params.get("fc");
        let fc_embed = fc.narrow(1, 0, h)?.contiguous()?;
        let fc_feature = fc.narrow(1, h, self.geom.feature_dim)?.contiguous()?;
        let eps = self.geom.shape.rms_eps;
        // EAGLE-3's input norms, when the head has them: each half of the fc input normalised.
        let norm = |x: &Tensor, gains: &str| -> candle_core::Result<Tensor> {
            if self.geom.shape.input_norms {
                rms_norm(x, self.params.get(gains), eps)
            } else {
                Ok(x.clone())
            }
        };
        let embed_part = linear(&norm(embeddings, "embed_norm")?, &fc_embed)?;
        let mut kvs: Vec<(Tensor, Tensor)> = Vec::with_capacity(depth);
        let mut outs: Vec<Tensor> = Vec::with_capacity(depth);
        for step in 1..=depth {
            let input = match outs.last() {
                None => features.clone(),
                Some(prev) => {
                    let shifted = shift_time(prev, 1, 1)?;
                    if self.detach {
                        shifted.detach()
                    } else {
                        shifted
                    }
                }
            };
            let x = (&embed_part + linear(&norm(&input, "feature_norm")?, &fc_feature)?)?;
            outs.push(self.layer(&x, &mut kvs, step)?);
        }
        Ok(outs)
    }

    /// The decoder layer at training-time-test step `step`; appends this step's K/V to `kvs`.
    fn layer(
        &self,
        x: &Tensor,
        kvs: &mut Vec<(Tensor, Tensor)>,
        step: usize,
    ) -> candle_core::Result<Tensor> {
        let (g, p) = (&self.geom.shape, &self.params);
        let (b, t, _) = x.dims3()?;
        let n = rms_norm(x, p.get("attn_norm"), g.rms_eps)?;
        // `[B, count, T, head_dim]`, rotated when `rotate`.
        let heads = |w: &str, bias: &str, count: usize, rotate: bool| {
            let y = linear_bias(&n, p.get(w), p.try_get(bias))?
                .reshape((b, t, count, g.head_dim))?
                .transpose(1, 2)?
                .contiguous()?;
            if rotate {
                apply_rope(&y, &self.cos, &self.sin, self.geom.rope_layout)
            } else {
                Ok(y)
            }
        };
        let q = heads("wq", "bq", g.n_heads, true)?;
        let k = heads("wk", "bk", g.n_kv_heads, true)?;
        kvs.push((k, heads("wv", "bv", g.n_kv_heads, false)?));
        let attn = self.attention(&q, kvs, step)?;
        let x = (x + linear(&attn, p.get("wo"))?)?;
        let m = rms_norm(&x, p.get("ffn_norm"), g.rms_eps)?;
        let inner = swiglu(&linear(&m, p.get("w_gate"))?, &linear(&m, p.get("w_up"))?)?;
        x + linear(&inner, p.get("w_down"))?
    }

    /// Attention of step `step`'s queries `q: [B, nh, T, d]` over the step-1 keys (masked to
    /// the prefix) and the chain keys of steps `2..=step` (shifted so the query at `j` meets
    /// the step-`i` key at `j − step + i`), per [`ttt_mask`]. Returns `[B, T, nh·d]`.
    fn attention(
        &self,
        q: &Tensor,
        kvs: &[(Tensor, Tensor)],
        step: usize,
    ) -> candle_core::Result<Tensor> {
        let g = &self.geom.shape;
        let (b, nh, t, d) = q.dims4()?;
        let (nkv, group) = (g.n_kv_heads, g.n_heads / g.n_kv_heads);
        let scale = 1.0 / (d as f64).sqrt();
        let mask = ttt_mask(step, t);
        let dev = q.device();
        // Query head h uses KV head h / group: rows (group member, position) per KV head.
        let q = q.reshape((b, nkv, group * t, d))?;
        let prefix_mask: Vec<f32> = (0..group * t)
            .flat_map(|r| {
                let j = r % t;
                mask.prefix[j * t..(j + 1) * t]
                    .iter()
                    .map(|&v| if v { 0.0 } else { HIDDEN })
            })
            .collect();
        let prefix_mask = Tensor::from_vec(prefix_mask, (group * t, t), dev)?;
        let (k1, v1) = &kvs[0];
        let mut scores = vec![(q.matmul(&k1.t()?)? * scale)?.broadcast_add(&prefix_mask)?];
        let q5 = q.reshape((b, nkv, group, t, d))?;
        let mut chain_values = Vec::with_capacity(step - 1);
        for i in 2..=step {
            let shift = step - i;
            let (ki, vi) = &kvs[i - 1];
            let k_shifted = shift_time(ki, 2, shift)?.unsqueeze(2)?;
            let dots = q5.broadcast_mul(&k_shifted)?.sum_keepdim(D::Minus1)?;
            let row_mask: Vec<f32> = (0..group * t)
                .map(|r| {
                    if mask.chain[i - 2][r % t] {
                        0.0
                    } else {
                        HIDDEN
                    }
                })
                .collect();
            let row_mask = Tensor::from_vec(row_mask, (group * t, 1), dev)?;
            scores.push((dots.reshape((b, nkv, group * t, 1))? * scale)?.broadcast_add(&row_mask)?);
            chain_values.push(shift_time(vi, 2, shift)?.unsqueeze(2)?);
        }
        let probs = softmax(&Tensor::cat(&scores, D::Minus1)?)?;
        let mut out = probs.narrow(D::Minus1, 0, t)?.contiguous()?.matmul(v1)?;
        for (n, v_shifted) in chain_values.iter().enumerate() {
            let p = probs
                .narrow(D::Minus1, t + n, 1)?
                .reshape((b, nkv, group, t, 1))?;
            out = (out
                + p.broadcast_mul(v_shifted)?
                    .reshape((b, nkv, group * t, d))?)?;
        }
        out.reshape((b, nh, t, d))?
            .transpose(1, 2)?
            .reshape((b, t, nh * d))
    }

    /// Rows of step `step` that take a loss: output rows `(b, j)` with `step − 1 ≤ j < L_b`
    /// (flat `b · T + j`), their label feature rows `(b, j + 1)`, and the labels' index among
    /// step 1's rows.
    fn step_rows(batch: &Batch, step: usize) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
        let (rows, t) = (batch.rows, batch.rows - 1);
        let (mut out, mut label, mut in_step1) = (Vec::new(), Vec::new(), Vec::new());
        let mut offset = 0u32;
        for (b, &len) in batch.lens.iter().enumerate() {
            for j in step - 1..len {
                out.push((b * t + j) as u32);
                label.push((b * rows + j + 1) as u32);
                in_step1.push(offset + j as u32);
            }
            offset += len as u32;
        }
        (out, label, in_step1)
    }
}

/// `meta`'s tensor shapes.
fn shapes_of(meta: &HeadMeta) -> Result<Vec<(String, Vec<usize>)>> {
    meta.tensor_shapes().map_err(|e| TrainError::Data {
        path: "head metadata".into(),
        reason: e.to_string(),
    })
}

/// `x` shifted by `by` along dimension `dim`, zeros entering at the front: entry `j` of the
/// result is entry `j − by` of `x`.
fn shift_time(x: &Tensor, dim: usize, by: usize) -> candle_core::Result<Tensor> {
    if by == 0 {
        return Ok(x.clone());
    }
    let len = x.dim(dim)?;
    let mut zeros_shape = x.dims().to_vec();
    zeros_shape[dim] = by.min(len);
    let zeros = Tensor::zeros(zeros_shape, x.dtype(), x.device())?;
    if by >= len {
        return Ok(zeros);
    }
    Tensor::cat(&[&zeros, &x.narrow(dim, 0, len - by)?], dim)
}

impl HeadModel for EagleHead {
    fn params(&self) -> &Params {
        &self.params
    }

    fn component_names(&self) -> Vec<String> {
        (1..=self.unroll)
            .flat_map(|s| [format!("feat@{s}"), format!("ce@{s}"), format!("kl@{s}")])
            .collect()
    }

    fn loss(&self, frozen: &Frozen<'_>, batch: &Batch) -> Result<StepLoss> {
        let outs = self.forward(frozen, batch, self.unroll)?;
        let h = self.geom.hidden;
        let run = || -> candle_core::Result<StepLoss> {
            let features = batch.features.reshape((batch.size() * batch.rows, h))?;
            let step1_rows = Tensor::new(batch.feature_rows(1, 0), &Device::Cpu)?;
            let labels = frozen.label_log_probs(&features.index_select(&step1_rows, 0)?)?;
            let mut total = Tensor::zeros((), candle_core::DType::F32, &Device::Cpu)?;
            let mut components = Vec::with_capacity(3 * self.unroll);
            let mut positions = 0u64;
            for (s, out) in outs.iter().enumerate() {
                let (out_rows, label_rows, label_index) = Self::step_rows(batch, s + 1);
                if out_rows.is_empty() {
                    components.extend([0.0, 0.0, 0.0]);
                    continue;
                }
                positions += out_rows.len() as u64;
                let (b, t) = (batch.size(), batch.rows - 1);
                let pred = out
                    .reshape((b * t, h))?
                    .index_select(&Tensor::new(out_rows, &Device::Cpu)?, 0)?;
                let truth = features.index_select(&Tensor::new(label_rows, &Device::Cpu)?, 0)?;
                let log_p = labels.index_select(&Tensor::new(label_index, &Device::Cpu)?, 0)?;
                let feat = smooth_l1(&pred, &truth)?;
                let logits = frozen.logits(&pred, self.params.get("lm_head"))?;
                let (ce, kl) = cross_entropy_and_kl(&logits, &log_p)?;
                components.extend([feat.to_scalar::<f32>()?, ce.to_scalar::<f32>()?, kl]);
                total = ((total + (feat * self.w_feat)?)? + (ce * self.w_ce)?)?;
            }
            Ok(StepLoss {
                total,
                components,
                positions,
            })
        };
        run().tensor_context("EAGLE loss")
    }

    fn agreement(
        &self,
        frozen: &Frozen<'_>,
        batch: &Batch,
        depths: usize,
        skip_tokens: usize,
    ) -> Result<Vec<Agreement>> {
        let outs = self.forward(frozen, batch, depths)?;
        let h = self.geom.hidden;
        let (b, t) = (batch.size(), batch.rows - 1);
        let features = batch
            .features
            .reshape((b * batch.rows, h))
            .tensor_context("agreement")?;
        outs.iter()
            .enumerate()
            .map(|(s, out)| {
                let (out_rows, label_rows, _) = Self::step_rows(batch, s + 1);
                if out_rows.is_empty() {
                    return Ok(Agreement::default());
                }
                let compute = || -> candle_core::Result<(Tensor, Tensor)> {
                    let pred = out.reshape((b * t, h))?.index_select(
                        &Tensor::from_slice(&out_rows, out_rows.len(), &Device::Cpu)?,
                        0,
                    )?;
                    let truth =
                        features.index_select(&Tensor::new(label_rows, &Device::Cpu)?, 0)?;
                    Ok((
                        frozen.logits(&pred, self.params.get("lm_head"))?,
                        frozen.label_logits(&truth)?,
                    ))
                };
                let (q, p) = compute().tensor_context("agreement")?;
                // output row (b, j) drafts token t_{j+2}
                let counted: Vec<bool> = out_rows
                    .iter()
                    .map(|&r| r as usize % t + 2 >= skip_tokens)
                    .collect();
                Agreement::of(&q, &p, &counted)
            })
            .collect()
    }
}

/// An EAGLE head's outputs on a chain of pairs.
#[derive(Debug, Clone, PartialEq)]
pub struct EagleChainOutput {
    /// Predicted features `f̂`, `[n × hidden]` row-major: row `i` is the head's output at
    /// position `i`.
    pub features: Vec<f32>,
    /// Draft logits over the draft vocabulary, `[n × draft_vocab]` row-major.
    pub logits: Vec<f32>,
}

/// Runs the EAGLE head of `head` over a chain of `n = tokens.len()` pairs, in f32: pair `i`
/// (`features` row `i` of the head's feature width, `tokens[i]`) sits at position `i`, causal
/// attention over the chain (what a head's KV cache holds after reading these pairs one by one),
/// with `target`'s token embedding and final norm. For comparing another implementation of the
/// head math with this trainer's.
///
/// # Errors
/// [`TrainError::Data`] for a head that is not EAGLE or does not match `target`'s width;
/// [`TrainError::Model`] for a token outside the vocabulary; a feature buffer of the wrong size.
pub fn eagle_chain(
    head: &HeadFile,
    target: &FrozenTarget,
    features: &[f32],
    tokens: &[u32],
) -> Result<EagleChainOutput> {
    let n = tokens.len();
    if n == 0 && features.is_empty() {
        return Ok(EagleChainOutput {
            features: Vec::new(),
            logits: Vec::new(),
        });
    }
    let model = EagleHead::from_head_file(head, n)?;
    let g = model.geom.clone();
    if g.hidden != target.config().hidden || features.len() != n * g.feature_dim {
        return Err(TrainError::Data {
            path: "eagle_chain".into(),
            reason: format!(
                "{} feature values for {n} pairs of width {} (head hidden {}, target {})",
                features.len(),
                g.feature_dim,
                g.hidden,
                target.config().hidden
            ),
        });
    }
    let embeddings = target.embedding_rows(tokens)?;
    let output_norm = target.output_norm().to_vec();
    let run = || -> candle_core::Result<EagleChainOutput> {
        let dev = Device::Cpu;
        let e = Tensor::from_vec(embeddings, (1, n, g.hidden), &dev)?;
        let f = Tensor::from_slice(features, (1, n, g.feature_dim), &dev)?;
        let out = model
            .unrolled(&e, &f, 1)?
            .remove(0)
            .reshape((n, g.hidden))?;
        let norm = Tensor::from_vec(output_norm, g.hidden, &dev)?;
        let logits = linear(
            &rms_norm(&out, &norm, target.config().rms_eps)?,
            model.params.get("lm_head"),
        )?;
        Ok(EagleChainOutput {
            features: out.flatten_all()?.to_vec1()?,
            logits: logits.flatten_all()?.to_vec1()?,
        })
    };
    run().tensor_context("EAGLE chain")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use specdec_models::heads::{HeadTarget, TrainingInfo, HEAD_FORMAT_VERSION};
    use specdec_models::llama::synthetic::synthetic;
    use specdec_models::llama::Architecture;

    fn synthetic_target(arch: Architecture) -> FrozenTarget {
        let file = synthetic(arch, 3);
        let sha = crate::target::sha256_of_bytes(file.bytes());
        FrozenTarget::from_gguf(Arc::clone(&file), "synthetic.gguf", "synthetic", sha).unwrap()
    }

    fn meta_for(target: &FrozenTarget, shape: EagleShape, draft_vocab: usize) -> HeadMeta {
        let t: &HeadTarget = target.identity();
        HeadMeta {
            format_version: HEAD_FORMAT_VERSION,
            kind: HeadKind::Eagle,
            target: t.clone(),
            feature_blocks: vec![target.config().n_layers - 1],
            draft_vocab,
            eagle: Some(shape),
            medusa_heads: 0,
            training: TrainingInfo::default(),
        }
    }

    /// Training-time-test step `s` at position `j` computes what drafting at depth `s` computes:
    /// the head reads the true pairs up to position `j − s + 1`, then its own outputs (with the
    /// true tokens) for `s − 1` more positions, one at a time, each seeing the chain before it.
    #[test]
    fn ttt_step_s_is_drafting_at_depth_s() {
        for (arch, input_norms) in [
            (Architecture::Llama, false),
            (Architecture::Qwen2, false),
            (Architecture::Llama, true),
        ] {
            let target = synthetic_target(arch);
            let h = target.config().hidden;
            let d2t: Vec<u32> = (0..40).collect();
            let frozen = Frozen::new(&target, &d2t).unwrap();
            let shape = EagleShape {
                input_norms,
                ..EagleShape::for_target(target.config(), 96)
            };
            let meta = meta_for(&target, shape, d2t.len());
            let settings = EagleSettings {
                unroll: 3,
                w_feat: 1.0,
                w_ce: 0.1,
                detach: false,
                train_lm_head: false,
                max_positions: 16,
            };
            let head = EagleHead::init(&meta, &frozen, settings, 9).unwrap();
            let len = 9; // positions; tokens t_0..t_9
            let tokens: Vec<u32> = (0..=len as u32).map(|i| (i * 7 + 3) % 64).collect();
            let features = uniform_init(5, 0, (len + 1) * h, 2.0);
            let batch =
                Batch::from_parts(vec![len], len + 1, tokens.clone(), features.clone(), h).unwrap();
            let outs = head.forward(&frozen, &batch, 3).unwrap();
            let file = HeadFile {
                meta,
                d2t: d2t.clone(),
                tensors: head.params.to_head_tensors().unwrap(),
            };
            for step in 1..=3usize {
                let ttt = outs[step - 1].squeeze(0).unwrap().to_vec2::<f32>().unwrap();
                for j in step - 1..len {
                    let start = j + 1 - step; // last position read with the true feature
                    let mut pair_features: Vec<f32> = features[..(start + 1) * h].to_vec();
                    let mut pair_tokens: Vec<u32> = tokens[1..=start + 1].to_vec();
                    let mut out = eagle_chain(&file, &target, &pair_features, &pair_tokens)
                        .unwrap()
                        .features;
                    for p in start + 1..=j {
                        // the head's own output at p − 1 with the true token t_{p+1}
                        pair_features.extend_from_slice(&out[(p - 1) * h..p * h]);
                        pair_tokens.push(tokens[p + 1]);
                        out = eagle_chain(&file, &target, &pair_features, &pair_tokens)
                            .unwrap()
                            .features;
                    }
                    let drafted = &out[j * h..(j + 1) * h];
                    for (d, (a, b)) in ttt[j].iter().zip(drafted).enumerate() {
                        assert!(
                            (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                            "{arch:?} step {step} j {j} [{d}]: ttt {a} vs drafting {b}"
                        );
                    }
                }
            }
        }
    }

    /// The keys of query `(step, j)` as the specification lists them (valid queries: `j ≥
    /// step − 1`).
    fn spec_keys(step: usize, j: usize) -> Vec<(usize, usize)> {
        let mut keys: Vec<(usize, usize)> = (0..=j + 1 - step).map(|p| (1, p)).collect();
        keys.extend((2..=step).map(|i| (i, j + i - step)));
        keys
    }

    #[test]
    fn the_ttt_mask_is_the_specified_one() {
        let len = 9;
        for step in 1..=4 {
            let mask = ttt_mask(step, len);
            for j in step - 1..len {
                assert_eq!(mask.visible(j), spec_keys(step, j), "step {step}, j {j}");
            }
            // Queries without a chain still see themselves (no all-hidden row).
            for j in 0..step - 1 {
                assert_eq!(
                    mask.visible(j).last(),
                    Some(&(step, j)),
                    "step {step}, j {j}"
                );
                assert!(mask.visible(j).iter().all(|&(i, _)| i > 1));
            }
        }
        // Spelled out: step 3, position 5 sees step-1 keys 0..=3, then (2, 4) and (3, 5).
        assert_eq!(
            ttt_mask(3, 6).visible(5),
            [(1, 0), (1, 1), (1, 2), (1, 3), (2, 4), (3, 5)]
        );
    }

    #[test]
    fn shifting_moves_entries_later_with_zeros_in_front() {
        let x = Tensor::new(&[[1f32, 2., 3.], [4., 5., 6.]], &Device::Cpu).unwrap();
        let s = shift_time(&x, 1, 1).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(s, [[0., 1., 2.], [0., 4., 5.]]);
        let s = shift_time(&x, 1, 5).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(s, [[0.; 3], [0.; 3]]);
    }
}
