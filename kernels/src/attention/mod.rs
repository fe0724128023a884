//! Tree attention over the paged KV cache: ragged batches of prefill chunks, chains and token
//! trees, GQA, online softmax in f32, batch-invariant by construction (see [`cpu`]).

pub mod cpu;
pub mod cuda;
mod simd;

#[cfg(test)]
mod tests;

pub use cpu::{
    tree_attention, tree_attention_into, tree_attention_into_with, AttentionParams, AttentionSeq,
    KEY_CHUNK,
};
