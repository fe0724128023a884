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
}

/// `Result` with [`KernelError`].
pub type Result<T> = std::result::Result<T, KernelError>;
