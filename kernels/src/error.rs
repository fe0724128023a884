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
    /// A GGML tensor type id that this crate cannot read (unknown, or known but unsupported).
    #[error("unsupported GGML tensor type id {id} ({name})")]
    UnsupportedQuantType {
        /// The type id as stored in the GGUF tensor table.
        id: u32,
        /// The GGML name of the type when known, otherwise "unknown".
        name: &'static str,
    },
    /// A row length that is not a whole number of quantisation blocks.
    #[error("{quant}: row length {len} is not a multiple of the block length {block_len}")]
    NotBlockAligned {
        /// The tensor type's name (e.g. "Q4_K").
        quant: &'static str,
        /// The number of elements asked for.
        len: usize,
        /// Elements per block of that type.
        block_len: usize,
    },
    /// A numeric parameter outside its valid range (e.g. an odd RoPE head dimension).
    #[error("invalid parameter {what}: {reason}")]
    InvalidParameter {
        /// Which parameter.
        what: &'static str,
        /// Why it is refused, with the value.
        reason: String,
    },
    /// A configuration value (a layout dimension, a pool size) is unusable.
    #[error("invalid configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// An index (layer, head, block id, token slot) lies outside its range `0..limit`.
    #[error("{what} out of range: {index} not in 0..{limit}")]
    OutOfRange {
        /// Which index.
        what: String,
        /// The index given.
        index: usize,
        /// The exclusive upper bound.
        limit: usize,
    },
    /// The KV block pool has fewer free blocks than an operation needs; nothing was changed.
    #[error("out of KV blocks: need {needed}, {free} free")]
    OutOfBlocks {
        /// Blocks the operation needed.
        needed: usize,
        /// Blocks free at the time.
        free: usize,
    },
    /// A sequence id the KV cache does not know (never created, or already freed).
    #[error("unknown sequence {seq}")]
    UnknownSequence {
        /// The id given.
        seq: u64,
    },
    /// A rewind asked to drop more committed tokens than the sequence holds; nothing was changed.
    #[error("cannot rewind sequence {seq} by {requested} tokens: it holds only {len}")]
    RewindPastStart {
        /// The sequence.
        seq: u64,
        /// Tokens asked to drop.
        requested: usize,
        /// Committed tokens it holds.
        len: usize,
    },
    /// An operation that needs a sequence without speculative (pending) tokens found some.
    #[error("sequence {seq} has {pending} pending speculative tokens; {operation} needs none")]
    PendingTokens {
        /// The sequence.
        seq: u64,
        /// Pending tokens it holds.
        pending: usize,
        /// The refused operation.
        operation: String,
    },
    /// An accepted path to commit is not a strictly increasing list of pending node indices.
    #[error("invalid accepted path at entry {entry}: {reason}")]
    InvalidAcceptedPath {
        /// Position in the accepted list of the first bad entry.
        entry: usize,
        /// What is wrong with it.
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
