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
    /// A configuration parameter is out of its allowed range.
    #[error("invalid parameter `{name}`: {reason}")]
    InvalidParameter {
        /// The parameter's name.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A draft-tree shape (static choices, ranks) is malformed.
    #[error("invalid tree shape: {reason}")]
    InvalidTreeShape {
        /// What is wrong with it.
        reason: String,
    },
    /// A step outcome reported to a policy contradicts itself.
    #[error("invalid step outcome: {reason}")]
    InvalidOutcome {
        /// What is wrong with it.
        reason: String,
    },
}

/// `Result` with [`AlgorithmError`].
pub type Result<T> = std::result::Result<T, AlgorithmError>;

/// Returns [`AlgorithmError::InvalidParameter`] unless `ok`.
pub(crate) fn ensure_param(ok: bool, name: &'static str, reason: impl Into<String>) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(AlgorithmError::InvalidParameter {
            name,
            reason: reason.into(),
        })
    }
}
