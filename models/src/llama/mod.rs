//! The Llama-family runner (Llama, SmolLM2, Qwen2): RMSNorm, RoPE, GQA, SwiGLU, tied or separate
//! LM head, QKV bias — forwarding ragged batches of token trees over a paged KV cache.

mod config;

pub use config::{Architecture, LlamaConfig, RopeLayout};
