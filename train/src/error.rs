//! The one error type of `specdec-train`.

use thiserror::Error;

/// Everything training a head can refuse or fail at. Each variant names the option, file or
/// value at fault; causes (a model or I/O error) are kept as the error's source.
#[derive(Debug, Error)]
pub enum TrainError {
    /// A command-line option (or its combination with the target) is refused before any work
    /// starts.
    #[error("option --{name}: {reason}")]
    Option {
        /// The option's long name, without dashes.
        name: &'static str,
        /// Why it is refused.
        reason: String,
    },
    /// Loading or running the target model, its tokenizer, or the head file failed.
    #[error("{context}")]
    Model {
        /// What was being done.
        context: String,
        /// The model crate's error.
        #[source]
        source: specdec_models::ModelError,
    },
    /// A tensor computation failed (a shape bug, or memory).
    #[error("tensor computation ({context})")]
    Tensor {
        /// What was being computed.
        context: &'static str,
        /// candle's error.
        #[source]
        source: candle_core::Error,
    },
    /// Reading or writing a file failed.
    #[error("{path}")]
    Io {
        /// The file or folder.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The training data is unusable (malformed JSON, too few usable conversations).
    #[error("training data {path}: {reason}")]
    Data {
        /// The data file (or a description of in-memory data).
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The feature cache on disk does not match what this run needs, or is damaged.
    #[error("feature cache {path}: {reason}")]
    FeatureCache {
        /// The cache folder.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A checkpoint is unreadable or belongs to a different run.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// The checkpoint file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The loss became NaN or infinite.
    #[error("training diverged at step {step}: the loss is {loss} (lower --lr or --grad-clip)")]
    Diverged {
        /// The optimiser step (0-based) whose loss was not finite.
        step: u64,
        /// The loss value.
        loss: f32,
    },
    /// Drawing the loss curve failed.
    #[error("loss curve {path}: {reason}")]
    Plot {
        /// The SVG file.
        path: String,
        /// The plotting library's message.
        reason: String,
    },
}

/// `Result` with [`TrainError`].
pub type Result<T, E = TrainError> = std::result::Result<T, E>;

/// Adds context to a model-crate result.
pub(crate) trait ModelContext<T> {
    /// Wraps the error as [`TrainError::Model`] with `context` (evaluated only on error).
    fn model_context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> ModelContext<T> for std::result::Result<T, specdec_models::ModelError> {
    fn model_context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| TrainError::Model {
            context: context(),
            source,
        })
    }
}

impl<T> ModelContext<T> for std::result::Result<T, specdec_kernels::KernelError> {
    fn model_context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| TrainError::Model {
            context: context(),
            source: e.into(),
        })
    }
}

/// Adds context to a candle result.
pub(crate) trait TensorContext<T> {
    /// Wraps the error as [`TrainError::Tensor`] with `context`.
    fn tensor_context(self, context: &'static str) -> Result<T>;
}

impl<T> TensorContext<T> for candle_core::Result<T> {
    fn tensor_context(self, context: &'static str) -> Result<T> {
        self.map_err(|source| TrainError::Tensor { context, source })
    }
}

/// An I/O error naming `path`.
pub(crate) fn io_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.display().to_string(),
        source,
    }
}
