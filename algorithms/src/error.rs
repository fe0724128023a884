//! The one error type of `specdec-algorithms`.

use thiserror::Error;

/// Everything an algorithm can refuse.
#[derive(Debug, Error)]
pub enum AlgorithmError {
    /// An error from a kernel.
    #[error(transparent)]
    Kernel(#[from] specdec_kernels::KernelError),
    /// An error from a model.
    #[error(transparent)]
    Model(#[from] specdec_models::ModelError),
}

/// `Result` with [`AlgorithmError`].
pub type Result<T> = std::result::Result<T, AlgorithmError>;
