//! # specdec-kernels
//!
//! The four kernel families of speculative decoding (SD), each as a readable CPU reference (the
//! oracle, and the CPU backend) and, where a GPU is present, a CUDA twin with the same contract:
//!
//! 1. tree attention over a paged KV cache,
//! 2. batched verification of draft trees,
//! 3. rejection sampling,
//! 4. paged KV commit / rewind.
//!
//! Shared vocabulary lives here too: [`tree::TreeTopology`], the shape of the new tokens of one
//! sequence in one step (a prefill chunk, a chain of drafts, or a token tree).
//!
//! Nothing in this crate depends on any other specdec crate.

pub mod attention;
pub mod cuda;
pub mod error;
pub mod kv;
pub mod ops;
pub mod quant;
pub mod sampling;
pub mod tree;
pub mod verification;

pub use error::{KernelError, Result};
pub use tree::TreeTopology;
