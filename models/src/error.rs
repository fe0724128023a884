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
    /// A forward step that cannot run: unknown or repeated sequence, bad token, shape mismatch.
    #[error("invalid step for seq {seq}: {reason}")]
    InvalidStep {
        /// The sequence id (the number inside its `SeqId`).
        seq: u64,
        /// What is wrong.
        reason: String,
    },
    /// A buffer or tensor has the wrong shape.
    #[error("bad shape of {what}: {reason}")]
    Shape {
        /// The buffer or tensor.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// A model file lacks a metadata key or tensor the architecture needs, or holds an
    /// inconsistent value.
    #[error("model config: {0}")]
    Config(String),
    /// A tensor-parallel communicator failed (a rank panicked or gave mismatched buffers).
    #[error("communicator: {0}")]
    Communicator(String),
}

/// `Result` with [`ModelError`].
pub type Result<T> = std::result::Result<T, ModelError>;
