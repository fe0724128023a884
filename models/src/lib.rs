//! # specdec-models
//!
//! The models speculative decoding runs: the `LanguageModel` abstraction, toy conditional
//! probability tables for exact tests, GGUF loading, tokenizers, the Llama/Qwen2 runner with
//! tensor-parallel sharding, and trained draft heads.

pub mod checkpoint;
pub mod error;
pub mod gguf;
pub mod heads;
pub mod hf_folder;
pub mod llama;
pub mod model;
pub mod registry;
pub mod safetensors_file;
pub mod shard;
pub mod tokenizer;
pub mod toy;
pub mod vocab_ranking;

pub use checkpoint::Checkpoint;
pub use error::{HashMismatch, ModelError, Result};
pub use model::{
    check_logit_ids, Features, KvRoom, LanguageModel, Logits, SeqId, SequenceStep, VerifiedBatch,
    VerifyRequest, PREFILL_CHUNK,
};
pub use vocab_ranking::VocabRanking;
