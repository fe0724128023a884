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
    /// A target row of a forward that cannot become a distribution (a non-finite logit, no
    /// mass left after top-k / top-p), named by the request and the node of its draft tree.
    #[error("request {request}: target logits at tree node {node}: {source}")]
    TargetRow {
        /// The request (sequence) id that keys the row's decisions.
        request: u64,
        /// The node of the request's draft tree.
        node: usize,
        /// What preparing the row found.
        source: specdec_kernels::KernelError,
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
    /// A GGUF file is malformed: truncated, bad magic, unsupported version, unknown value type,
    /// absurd count or length, out-of-bounds or misaligned tensor data, duplicate names.
    #[error("{path}: invalid GGUF at byte {offset}: {reason}")]
    Gguf {
        /// The file (or `<memory>` for a buffer).
        path: String,
        /// Byte offset in the file where the problem was found.
        offset: u64,
        /// What is wrong, in words.
        reason: String,
    },
    /// A metadata key the caller needs is absent from the GGUF file.
    #[error("{path}: metadata key `{key}` is missing")]
    MissingMetadata {
        /// The file.
        path: String,
        /// The key looked up.
        key: String,
    },
    /// A metadata value has a different type (or does not fit the requested integer type).
    #[error("{path}: metadata key `{key}` is {found}, expected {expected}")]
    MetadataType {
        /// The file.
        path: String,
        /// The key looked up.
        key: String,
        /// The type the caller asked for.
        expected: &'static str,
        /// The value's actual type (and value, for scalars).
        found: String,
    },
    /// A tensor the caller needs is absent from the GGUF tensor table.
    #[error("{path}: tensor `{name}` is missing")]
    MissingTensor {
        /// The file.
        path: String,
        /// The tensor name looked up.
        name: String,
    },
    /// A model name is not in `models/registry.toml`, or its file is not in the cache.
    #[error("{0}")]
    ModelNotFound(String),
    /// A registered file's bytes are not the pinned ones (corrupt, truncated to the same size,
    /// or another version).
    #[error("{0}")]
    HashMismatch(Box<HashMismatch>),
    /// Building or running the tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Rendering the chat template failed.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A toy probability table is malformed.
    #[error("invalid toy model: {reason}")]
    InvalidToyModel {
        /// What is wrong.
        reason: String,
    },
}

/// What [`ModelError::HashMismatch`] reports: the file and both hashes.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "{name}: {path} has SHA-256 {actual}, but models/registry.toml pins {expected}: the file is \
     corrupt or another version; {fix}"
)]
pub struct HashMismatch {
    /// The registry name.
    pub name: String,
    /// The file.
    pub path: String,
    /// The pinned SHA-256.
    pub expected: String,
    /// The file's SHA-256.
    pub actual: String,
    /// What to do (the fetch command).
    pub fix: String,
}

/// `Result` with [`ModelError`].
pub type Result<T> = std::result::Result<T, ModelError>;
