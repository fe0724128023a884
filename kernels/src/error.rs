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
    /// A parameter is out of its documented range.
    #[error("invalid parameter {name}: {reason}")]
    InvalidParameter {
        /// The parameter's name.
        name: String,
        /// What is wrong with its value.
        reason: String,
    },
    /// A probability distribution (or logits vector) cannot be used.
    #[error("invalid distribution ({what}): {reason}")]
    InvalidDistribution {
        /// Which distribution.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A temperature other than 0 or 1/k was asked of an exact (rational) number type.
    #[error("temperature {temperature} is not 0 or 1/k: exact rationals cannot represent p^(1/T)")]
    InexactTemperature {
        /// The temperature asked for, as written.
        temperature: String,
    },
    /// A draft tree and its inputs do not fit together.
    #[error("invalid draft tree: {reason}")]
    InvalidDraftTree {
        /// What is wrong.
        reason: String,
    },
}

/// `Result` with [`KernelError`].
pub type Result<T> = std::result::Result<T, KernelError>;
