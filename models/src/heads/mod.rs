//! Trained draft heads: small networks that draft from the target's own hidden features.
//!
//! Two families, both trained by `specdec train-head` and stored as one safetensors file
//! ([`HeadFile`]) whose metadata names the target it was trained for:
//!
//! - **EAGLE-style** ([`HeadKind::Eagle`]). Head position `j` reads the pair (feature `f_j`,
//!   token `t_{j+1}`): `x_j = fc · [embed(t_{j+1}); f_j]` (the target's token embedding,
//!   frozen), then one Llama decoder layer over the head's own KV cache (pre-norm attention and
//!   SwiGLU, RoPE at position `j`, the target's attention geometry), whose output is the
//!   predicted feature `f̂_{j+1}`; the draft distribution over the **draft vocabulary** is
//!   `softmax(lm_head · rms_norm(f̂_{j+1}))` with the target's final norm. Depth `d > 1` feeds
//!   the head its own output: the pair (`f̂_{j+1}`, drafted `t_{j+2}`) at position `j + 1`.
//!   Features are the target's last block output before the final norm
//!   ([`crate::LanguageModel::tap_features`]).
//! - **Medusa-style** ([`HeadKind::Medusa`]). Head `k` (`k = 0..K`) predicts the token `k + 2`
//!   positions after the feature's: with `n = rms_norm(f_j)` (the target's final norm),
//!   `h_k = n + silu(W_k · n + b_k)` and logits `lm_head · h_k` over the draft vocabulary.
//!
//! The draft vocabulary is a list of target token ids (`d2t`, most frequent in the training
//! data first); `q` is zero for every other id.

pub mod file;

pub use file::{
    EagleShape, HeadFile, HeadKind, HeadMeta, HeadTarget, HeadTensor, StoredDtype, TrainingInfo,
    HEAD_FORMAT_VERSION,
};
