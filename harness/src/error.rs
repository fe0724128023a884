//! The one error type of `specdec-harness`.

use std::path::PathBuf;

use thiserror::Error;

/// Everything running an experiment can refuse.
#[derive(Debug, Error)]
pub enum HarnessError {
    /// An engine cannot be built or run as configured (batch size, sampling, a drafter that
    /// broke its contract, NaN logits), with the reason.
    #[error("engine: {0}")]
    InvalidEngine(String),
    /// A request cannot be served (empty prompt, prompt longer than the context).
    #[error("request {id}: {reason}")]
    InvalidRequest {
        /// The request's id.
        id: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// An error from an algorithm.
    #[error(transparent)]
    Algorithm(#[from] specdec_algorithms::AlgorithmError),
    /// An error from a model.
    #[error(transparent)]
    Model(#[from] specdec_models::ModelError),
    /// An error from a kernel.
    #[error(transparent)]
    Kernel(#[from] specdec_kernels::KernelError),
    /// An experiment config could not be parsed (syntax, unknown key, wrong type). `origin` is the
    /// file (or `<inline>`), `message` names the key and the line.
    #[error("config {origin}: {message}")]
    ConfigParse {
        /// Where the config came from (a path, or `<inline>`).
        origin: String,
        /// The parser's message, naming the offending key.
        message: String,
    },
    /// A config parsed but holds a value that makes no sense (temperature < 0, K = 0 for a
    /// linear method, duplicate method names, ...).
    #[error("config {origin}: invalid {field}: {problem}")]
    ConfigInvalid {
        /// Where the config came from.
        origin: String,
        /// The dotted path of the offending field, e.g. `methods[2].policy.k`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A run stopped before the end (a signal, a failed method); what finished is on disk.
    #[error("run incomplete: {0}")]
    Incomplete(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory concerned.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A saved result line could not be read back.
    #[error("{path}:{line}: {message}")]
    ResultParse {
        /// The JSONL file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// A feature the config asks for exists in the design but not yet in this build.
    #[error("not yet available: {0}")]
    NotYetAvailable(String),
    /// Metrics were asked of records that cannot give them (no records, no baseline, ...).
    #[error("metrics: {0}")]
    Metrics(String),
    /// A plot could not be drawn.
    #[error("plot {path}: {message}")]
    Plot {
        /// The SVG file being drawn.
        path: PathBuf,
        /// The plotting library's message.
        message: String,
    },
    /// A benchmark cannot run as asked (zero tokens or repeats, a length beyond the context, a
    /// time that could not be measured), with the reason.
    #[error("bench: {0}")]
    Bench(String),
    /// A simulation parameter is out of range (alpha outside [0, 1], a cost curve that is not
    /// increasing in tokens, ...).
    #[error("simulation: {0}")]
    Simulation(String),
}

impl HarnessError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        HarnessError::Io {
            path: path.into(),
            source,
        }
    }
}

/// `Result` with [`HarnessError`].
pub type Result<T> = std::result::Result<T, HarnessError>;
