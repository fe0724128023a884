//! # specdec
//!
//! A kernel-first research framework for speculative decoding. This facade re-exports the
//! workspace crates:
//!
//! - [`kernels`]: tree attention, batched verification, rejection sampling, paged KV (CPU + CUDA);
//! - [`models`]: the `LanguageModel` trait, toy tables, GGUF, tokenizers, the Llama/Qwen2 runner;
//! - [`algorithms`]: drafters, verifiers, speculation policies, exact proofs;
//! - [`harness`]: the engine loop, metrics, experiments and reports;
//! - [`train`]: training EAGLE-style and Medusa-style draft heads (`specdec train-head`).

pub use specdec_algorithms as algorithms;
pub use specdec_harness as harness;
pub use specdec_kernels as kernels;
pub use specdec_models as models;
pub use specdec_server as server;
pub use specdec_train as train;
