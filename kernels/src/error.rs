//! The one error type of `specdec-kernels`.

use thiserror::Error;

/// Everything a kernel or a host-side structure of this crate can refuse.
///
/// Every variant names the offending value, so a caller can report it without extra context.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// A parent array does not describe a tree in topological order.
    #[error("invalid tree: node {node}: {reason}")]
    InvalidTree {
        /// The first node found at fault.
        node: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// Two inputs that must agree in size do not.
    #[error("shape mismatch in {what}: expected {expected}, got {actual}")]
    ShapeMismatch {
        /// Which input (and which dimension) disagrees.
        what: String,
        /// The size implied by the other inputs.
        expected: usize,
        /// The size given.
        actual: usize,
    },
    /// A GGML tensor type id that this crate cannot read (unknown, or known but unsupported).
    #[error("unsupported GGML tensor type id {id} ({name})")]
    UnsupportedQuantType {
        /// The type id as stored in the GGUF tensor table.
        id: u32,
        /// The GGML name of the type when known, otherwise "unknown".
        name: &'static str,
    },
    /// A row length that is not a whole number of quantisation blocks.
    #[error("{quant}: row length {len} is not a multiple of the block length {block_len}")]
    NotBlockAligned {
        /// The tensor type's name (e.g. "Q4_K").
        quant: &'static str,
        /// The number of elements asked for.
        len: usize,
        /// Elements per block of that type.
        block_len: usize,
    },
    /// A numeric parameter outside its valid range (e.g. an odd RoPE head dimension).
    #[error("invalid parameter {what}: {reason}")]
    InvalidParameter {
        /// Which parameter.
        what: &'static str,
        /// Why it is refused, with the value.
        reason: String,
    },
}

/// `Result` with [`KernelError`].
pub type Result<T> = std::result::Result<T, KernelError>;
