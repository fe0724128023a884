//! The Llama-family runner (Llama, SmolLM2, Qwen2): RMSNorm, RoPE, GQA, SwiGLU, tied or separate
//! LM head, QKV bias — forwarding ragged batches of token trees over a paged KV cache.
//!
//! Forward of a batch of `N` new tokens (all sequences concatenated), per layer:
//! `h = rmsnorm(x)`, `q, k, v = h·Wqᵀ (+b)`, RoPE on q and k at `prefix_len + depth`, K/V written
//! to the sequence's speculative cache slots, tree attention (prefix, then ancestors), `x += o·Woᵀ`,
//! `h = rmsnorm(x)`, `x += (silu(h·Wgᵀ) ⊙ h·Wuᵀ)·Wdᵀ`; then `logits = rmsnorm(x)·Woutᵀ`. This
//! forward is written once (`forward`), over a device backend implemented for the host (`cpu`)
//! and for a CUDA GPU (`cuda`); the EAGLE draft head ([`crate::heads::EagleHead`]) runs the same
//! block.

pub(crate) mod block;
mod config;
pub(crate) mod cpu;
pub mod cuda;
mod device;
pub(crate) mod forward;
mod layer_skip;
mod load;
mod model;
mod op_times;
pub(crate) mod product;
pub(crate) mod step_checks;
pub mod synthetic;
mod weights;

pub use config::{rope_scaling_from, Architecture, LlamaConfig, RopeLayout, RopeScaling};
pub use device::{load_on_device, parse_device, DeviceModelOptions};
pub use layer_skip::default_skip_layers;
pub use load::{read_config, read_special_tokens, read_weights, SpecialTokens};
pub use model::{LlamaModel, LlamaOptions, MatmulPath};
pub use op_times::OpTime;
pub use product::products_on;
pub use weights::{LayerWeights, ModelWeights, WeightMatrix};
