//! The one error type of `specdec-harness`.

use thiserror::Error;

/// Everything running an experiment can refuse.
#[derive(Debug, Error)]
pub enum HarnessError {
    /// An error from an algorithm.
    #[error(transparent)]
    Algorithm(#[from] specdec_algorithms::AlgorithmError),
    /// An error from a model.
    #[error(transparent)]
    Model(#[from] specdec_models::ModelError),
    /// An error from a kernel.
    #[error(transparent)]
    Kernel(#[from] specdec_kernels::KernelError),
}

/// `Result` with [`HarnessError`].
pub type Result<T> = std::result::Result<T, HarnessError>;
