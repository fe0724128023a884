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
