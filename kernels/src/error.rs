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
    /// A CUDA library or device this operation needs is not available (probed without panicking).
    #[error("CUDA unavailable: {what}")]
    CudaUnavailable {
        /// What is missing (a library, a device ordinal).
        what: String,
    },
    /// A CUDA driver, NVRTC or cuBLAS call failed.
    #[error("CUDA call {call} failed: {message}")]
    Cuda {
        /// The call (and the kernel or buffer it concerned).
        call: String,
        /// The error as the library reported it.
        message: String,
    },
    /// NVRTC refused to compile a kernel source.
    #[error("NVRTC could not compile {source_name} for {arch}:\n{log}")]
    KernelCompile {
        /// The `.cu` file.
        source_name: String,
        /// The architecture asked for (`sm_90`, …).
        arch: String,
        /// The compiler log.
        log: String,
    },
    /// An argument outside its valid range (a NaN probability, a zero size, a bad device name).
    #[error("invalid argument {what}: {reason}")]
    InvalidArgument {
        /// Which argument.
        what: String,
        /// Why it is refused, with the value.
        reason: String,
    },
}

/// `Result` with [`KernelError`].
pub type Result<T> = std::result::Result<T, KernelError>;
