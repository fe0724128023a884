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
    /// A verifier was paired with a draft kind it does not declare (the pairing rule).
    #[error(
        "verifier {verifier} is not lossless for {kind} draft trees (it declares: {declared}); \
         pair it with a drafter of a declared kind, or choose a verifier for {kind} trees"
    )]
    MismatchedPair {
        /// The verifier's name.
        verifier: String,
        /// The draft kind asked for.
        kind: specdec_kernels::verification::DraftKind,
        /// The kinds the verifier declares, comma-separated.
        declared: String,
    },
    /// A draft tree of another kind than the paired one was handed to a verifier.
    #[error("verifier {verifier} is paired with {expected} drafts but got a {found} tree")]
    DraftKindMismatch {
        /// The verifier's name.
        verifier: String,
        /// The kind it was paired with.
        expected: specdec_kernels::verification::DraftKind,
        /// The tree's kind.
        found: specdec_kernels::verification::DraftKind,
    },
    /// The exact enumeration could not run the code (e.g. it asked for a raw uniform, or the
    /// branch count exceeded the limit).
    #[error("enumeration failed: {reason}")]
    Enumeration {
        /// What went wrong.
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
