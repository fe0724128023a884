//! CPU reference of the per-token operations of a Llama / Qwen2 layer: RMSNorm, RoPE (both
//! layouts), SwiGLU, embedding gather from a quantised table, softmax and argmax; and the
//! rank-order sum of a tensor-parallel all-reduce.
//!
//! Every op works token by token: a token's result depends only on its own inputs, so all ops
//! are batch-invariant (bit-identical alone or in any batch). Activations are row-major
//! `[n_tokens × dim]` f32 slices.

pub mod activation;
pub mod cuda;
pub mod embedding;
pub mod norm;
pub mod reduce;
pub mod rope;

pub use activation::{argmax, exp_scaled, softmax_in_place, swiglu};
pub use embedding::embed_rows;
pub use norm::rms_norm;
pub use reduce::{join_rank_columns, split_even, sum_ranks};
pub use rope::{apply_rope, RopeAngles, RopeLayout, RopeScaling};
