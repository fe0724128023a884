//! Trained draft heads: small networks that draft from the target's own hidden features.
//!
//! Two families, both trained by `specdec train-head` and stored as one safetensors file
//! ([`HeadFile`]) whose metadata names the target it was trained for; [`EagleHead`] and
//! [`MedusaHeads`] run them next to the target ([`crate::llama::LlamaModel`]), sharing its token
//! embedding and final norm.
//!
//! # The math (the contract between the trainer and inference)
//!
//! Notation: `H` the target's hidden size, `F = feature_blocks.len() · H` the feature width
//! ([`HeadMeta::feature_dim`]), `V_d` the draft vocabulary size, matrices `[rows, cols]` with
//! `y = W · x`. `rms_norm(v; g, eps)_i = v_i / sqrt(mean_i(v_i²) + eps) · g_i`, and
//! `silu(z) = z / (1 + e^(−z))`. A *final norm* is `rms_norm` with the target's
//! `output_norm.weight` gains and the target's RMSNorm epsilon (its GGUF
//! `{arch}.attention.layer_norm_rms_epsilon`, which the file does not store).
//!
//! - **EAGLE-style** ([`HeadKind::Eagle`]). Head position `j` reads the pair (feature `f_j`,
//!   token `t_{j+1}`), where `f_j` is the target's feature at position `j` (the token `t_j`) and
//!   `t_{j+1}` the token after it:
//!   1. `e = embed(t_{j+1})`: row `t_{j+1}` of the target's token embedding, dequantised to f32
//!      (frozen);
//!   2. `x = fc · [e; f_j]` (the embedding first, then the feature; no bias); with
//!      [`EagleShape::input_norms`], `x = fc · [rms_norm(e; embed_norm, rms_eps);
//!      rms_norm(f_j; feature_norm, rms_eps)]` (EAGLE-3's input norms; one norm over the whole
//!      feature row);
//!   3. one Llama decoder layer over the head's own KV cache of the sequence's earlier pairs,
//!      with the constants of [`EagleShape`] (the trainer copies the target's attention
//!      geometry, epsilon, RoPE base and layout into it; inference uses what the file says):
//!      `h = rms_norm(x; attn_norm, rms_eps)`; `q = wq·h (+ bq)`, `k = wk·h (+ bk)`,
//!      `v = wv·h (+ bv)`; RoPE on every query and key head at position `j`: pair `i`
//!      (`i < head_dim/2`) of a head is rotated by the angle `j · rope_base^(−2i/head_dim)`,
//!      `(u, w) → (u·cos − w·sin, u·sin + w·cos)`, the pair being elements `(2i, 2i+1)` for
//!      `rope_layout = "interleaved"` and `(i, i + head_dim/2)` for `"half_split"`; query head
//!      `r` attends with KV head `r / (n_heads / n_kv_heads)` over the keys of positions
//!      `0..=j` (causal; within a draft tree, the node's root-to-node path), scores
//!      `q·k / sqrt(head_dim)`, softmax, weighted sum of the values; the heads' outputs side by
//!      side (head 0 first) form `o`; `x' = x + wo·o`;
//!      `g = rms_norm(x'; ffn_norm, rms_eps)`; `x'' = x' + w_down·(silu(w_gate·g) ⊙ (w_up·g))`;
//!   4. the predicted feature is `f̂_{j+1} = x''` (no norm), and the draft logits are
//!      `lm_head · final_norm(f̂_{j+1})`, `V_d` of them: `q = softmax(logits)` over the draft
//!      vocabulary is the draft distribution of token `t_{j+2}`.
//!
//!   Depth `d > 1` feeds the head its own output: the pair (`f̂_{j+1}`, drafted `t_{j+2}`) at
//!   position `j + 1`. The first pair of a sequence, (`f_0`, `t_1`), sits at position 0, and
//!   the head's cache holds one entry per pair. So after the target has verified `t_0 ..
//!   t_{L-1}` (features `f_0 .. f_{L-1}`) and chosen `t_L`, the head's next root is the pair
//!   (`f_{L-1}`, `t_L`) at position `L − 1`, drafting `t_{L+1}`. Features are the target's
//!   last block output before the final norm ([`crate::LanguageModel::tap_features`]).
//! - **Medusa-style** ([`HeadKind::Medusa`]). Head `k` (`k = 0..K`) predicts the token `k + 2`
//!   positions after the feature's: with `n = final_norm(f_j)`,
//!   `h_k = n + silu(W_k · n + b_k)` (`W_k = medusa.{k}.weight`, `b_k = medusa.{k}.bias`) and
//!   logits `lm_head · h_k` (no further norm) over the draft vocabulary. A Medusa head reads one
//!   feature block (`F = H`).
//!
//! The draft vocabulary is a list of target token ids (`d2t`, most frequent in the training
//! data first): draft logit `i` is the logit of target token `d2t[i]`; `q` is zero for every
//! other id.
//!
//! # Precision at inference
//!
//! The matrices (every 2-D tensor) are stored as [`HeadPrecision`] says; the vectors (norm
//! gains, biases) are used as the file's f32 values. [`HeadPrecision::Bf16`] rounds each matrix
//! entry to bfloat16 (nearest, ties to even; a BF16 file loses nothing more) and multiplies
//! exactly in f32 — what a trainer in BF16 computes, up to summation order.

pub mod eagle;
pub mod file;
pub mod medusa;
pub mod synthetic;

use std::sync::Arc;

use specdec_kernels::kv::KvDtype;
use specdec_kernels::quant::int8_q32::Q32_BLOCK;
use specdec_kernels::quant::{Int8PackedMatrix, QuantType, SimdLevel};

pub use eagle::{EagleHead, HeadOutput, HeadStep};
pub use file::{
    rope_layout_name, EagleShape, HeadFile, HeadKind, HeadMeta, HeadTarget, HeadTensor,
    StoredDtype, TrainingInfo, HEAD_FORMAT_VERSION,
};
pub use medusa::MedusaHeads;

use crate::error::{ModelError, Result};

/// Where `specdec train-head` writes, and the `eagle` / `medusa` drafters look for, the head of
/// `kind` for the target called `target` (its registry name or file stem):
/// `<cache>/heads/<target>-<kind>.safetensors`.
pub fn default_head_path(target: &str, kind: HeadKind) -> std::path::PathBuf {
    crate::registry::cache_dir()
        .join("heads")
        .join(format!("{target}-{}.safetensors", kind.name()))
}
use crate::llama::{LlamaModel, MatmulPath, ModelWeights, WeightMatrix};

/// How a head's matrices are stored and multiplied at inference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeadPrecision {
    /// BF16 matrices, exact f32 products ([`MatmulPath::Exact`]): the reference the trainer's
    /// math is checked against.
    Bf16,
    /// Q8_0 matrices (blocks of 32, see [`WeightMatrix::quantize`]) multiplied on the 8-bit
    /// path ([`MatmulPath::Int8`]: activations quantised per 32-block, integer dot products,
    /// AVX-512 tiles where available), as the target's Q8_0 matrices. A matrix whose input
    /// width is not a multiple of 32 stays BF16 (exact product). Outputs differ from
    /// [`HeadPrecision::Bf16`] by 8-bit quantisation noise.
    #[default]
    Int8,
    /// Q4_0 matrices (blocks of 32, 4-bit quants and an f16 scale, as llama.cpp's Q4_0: see
    /// [`specdec_kernels::quant::quantize_values`]) on the same 8-bit activation path: about
    /// half the bytes a depth step reads at [`HeadPrecision::Int8`], for a coarser head. A
    /// matrix whose input width is not a multiple of 32 stays BF16 (exact product).
    Int4,
}

impl HeadPrecision {
    /// The matmul path of this precision.
    pub fn matmul_path(self) -> MatmulPath {
        match self {
            HeadPrecision::Bf16 => MatmulPath::Exact,
            HeadPrecision::Int8 | HeadPrecision::Int4 => MatmulPath::Int8,
        }
    }
}

/// Options of an [`EagleHead`]: its precision and the sizing of its KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadOptions {
    /// How the matrices are stored and multiplied.
    pub precision: HeadPrecision,
    /// Pair slots in the head's KV cache, over all sequences (rounded up to whole blocks).
    pub kv_capacity_tokens: usize,
    /// Pair slots per KV block.
    pub kv_block_size: usize,
    /// Element type of the head's KV cache.
    pub kv_dtype: KvDtype,
}

impl Default for HeadOptions {
    /// [`HeadPrecision::Int8`], 4096 slots in blocks of 16 (as the target's defaults).
    fn default() -> Self {
        Self {
            precision: HeadPrecision::default(),
            kv_capacity_tokens: 4096,
            kv_block_size: 16,
            kv_dtype: KvDtype::F32,
        }
    }
}

/// What every draft head ([`EagleHead`], [`MedusaHeads`]) tells about itself, from its file.
pub trait DraftHead {
    /// The file's metadata.
    fn meta(&self) -> &HeadMeta;

    /// The draft vocabulary: draft id → target token id (`meta().draft_vocab` distinct ids).
    fn d2t(&self) -> &[u32];

    /// Number of draft logits per prediction (the draft vocabulary size).
    fn draft_vocab(&self) -> usize {
        self.d2t().len()
    }

    /// The target's hidden size (the width of an EAGLE head's predicted feature).
    fn hidden(&self) -> usize {
        self.meta().target.hidden
    }

    /// The width of an input feature row ([`HeadMeta::feature_dim`]).
    fn feature_dim(&self) -> usize {
        self.meta().feature_dim()
    }
}

/// What both head kinds take from their file and target: the checked metadata, the draft
/// vocabulary, the LM head, and the target's weights (shared, for its token embedding and final
/// norm).
pub(crate) struct HeadBase {
    /// The file's metadata.
    pub(crate) meta: HeadMeta,
    /// Draft id → target token id.
    pub(crate) d2t: Vec<u32>,
    /// `[V_d, H]`, stored as the precision says.
    pub(crate) lm_head: WeightMatrix,
    /// The target's weights (shared, nothing copied).
    pub(crate) target: Arc<ModelWeights>,
    /// The target's RMSNorm epsilon (of the final norm).
    pub(crate) final_norm_eps: f32,
    /// The target's vocabulary size (the range of token ids a step may hold).
    pub(crate) target_vocab: usize,
    /// The target's longest context.
    pub(crate) max_context: usize,
    /// How the products run.
    pub(crate) path: MatmulPath,
    /// How the matrices are stored.
    pub(crate) precision: HeadPrecision,
}

impl HeadBase {
    /// Checks that `file` is a valid head of `kind` trained for a target like `target`
    /// (architecture, hidden size, vocabulary), then takes what both kinds share.
    ///
    /// # Errors
    /// [`HeadFile::validate`]'s errors; [`ModelError::Config`] for a head of the other kind or
    /// for another kind of target, naming both sides.
    pub(crate) fn new(
        file: &HeadFile,
        kind: HeadKind,
        target: &LlamaModel,
        precision: HeadPrecision,
    ) -> Result<Self> {
        file.validate()?;
        let meta = &file.meta;
        let trained = &meta.target;
        if meta.kind != kind {
            return Err(ModelError::Config(format!(
                "this is a {} head file (for `{}`), but the kind asked for is {}",
                meta.kind.name(),
                trained.name,
                kind.name()
            )));
        }
        let config = target.config();
        let mismatch = |what: &str, head: &dyn std::fmt::Display, ours: &dyn std::fmt::Display| {
            ModelError::Config(format!(
                "this {} head was trained for a target with {what} {head} (`{}`), but the \
                 target has {what} {ours}",
                kind.name(),
                trained.name
            ))
        };
        let architecture = config.arch.key_prefix();
        if trained.architecture != architecture {
            return Err(mismatch(
                "architecture",
                &trained.architecture,
                &architecture,
            ));
        }
        if trained.hidden != config.hidden {
            return Err(mismatch("hidden size", &trained.hidden, &config.hidden));
        }
        if trained.vocab_size != config.vocab_size {
            return Err(mismatch(
                "vocabulary size",
                &trained.vocab_size,
                &config.vocab_size,
            ));
        }
        Ok(Self {
            meta: meta.clone(),
            d2t: file.d2t.clone(),
            lm_head: head_matrix(file, "lm_head", precision)?,
            target: Arc::clone(target.shared_weights()),
            final_norm_eps: config.rms_eps,
            target_vocab: config.vocab_size,
            max_context: config.context_length,
            path: precision.matmul_path(),
            precision,
        })
    }

    /// The target's final RMSNorm gains.
    pub(crate) fn output_norm(&self) -> &[f32] {
        &self.target.output_norm
    }
}

/// The 2-D tensor `name` of `file` as a matrix stored as `precision` says (module docs), packed
/// for the AVX-512 8-bit kernels when they will read it.
///
/// # Errors
/// A missing or non-2-D tensor ([`ModelError::Config`]); quantisation errors (a non-finite
/// value).
pub(crate) fn head_matrix(
    file: &HeadFile,
    name: &str,
    precision: HeadPrecision,
) -> Result<WeightMatrix> {
    let tensor = file.tensor(name)?;
    let &[rows, cols] = tensor.shape.as_slice() else {
        return Err(ModelError::Config(format!(
            "head tensor `{name}` has shape {:?}, a matrix expected",
            tensor.shape
        )));
    };
    let ty = match precision {
        HeadPrecision::Int8 if cols.is_multiple_of(Q32_BLOCK) => QuantType::Q8_0,
        HeadPrecision::Int4 if cols.is_multiple_of(Q32_BLOCK) => QuantType::Q4_0,
        _ => QuantType::BF16,
    };
    let mut matrix = WeightMatrix::quantize(rows, cols, &tensor.data, ty)
        .map_err(|e| ModelError::Config(format!("head tensor `{name}`: {e}")))?;
    if Int8PackedMatrix::has_kernels(ty, SimdLevel::detect()) {
        matrix.pack_for_int8()?;
    }
    Ok(matrix)
}

/// The 1-D tensor `name` of `file` (f32, as stored).
///
/// # Errors
/// A missing tensor ([`ModelError::Config`]).
pub(crate) fn head_vector(file: &HeadFile, name: &str) -> Result<Vec<f32>> {
    Ok(file.tensor(name)?.data.clone())
}

/// `silu(z) = z / (1 + e^(−z))` in f32, with the kernels' exponential (as the SwiGLU kernel's
/// portable loop).
pub(crate) fn silu(z: f32) -> f32 {
    z / (1.0 + specdec_kernels::ops::activation::exp_f32(-z))
}
