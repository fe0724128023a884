//! The one error type of `specdec-models`.

use thiserror::Error;

/// Everything loading or running a model can refuse. Variants name the file, tensor or value at
/// fault.
#[derive(Debug, Error)]
pub enum ModelError {
    /// An error from a kernel (shapes, trees, KV cache).
    #[error(transparent)]
    Kernel(#[from] specdec_kernels::KernelError),
    /// An I/O error, with the path involved.
    #[error("{path}: {source}")]
    Io {
        /// The file being read.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A toy probability table is malformed.
    #[error("invalid toy model: {reason}")]
    InvalidToyModel {
        /// What is wrong.
        reason: String,
    },
}

/// `Result` with [`ModelError`].
pub type Result<T> = std::result::Result<T, ModelError>;
