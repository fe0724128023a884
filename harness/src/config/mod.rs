//! Experiment configs: TOML files that say which models, prompts, sampling settings and methods an
//! experiment runs. Drafters, verifiers and policies are entries of the method registry
//! ([`crate::methods`]). Every table rejects unknown keys (the error names the key and the file), and
//! [`ExperimentConfig::validate`] rejects values that make no sense with the field named.
//!
//! A minimal config:
//!
//! ```toml
//! name = "quick"
//! max_tokens = 64
//! [models]
//! target = "qwen2.5-coder-1.5b"
//! draft = "qwen2.5-coder-0.5b"
//! [prompts]
//! source = "inline"
//! texts = ["def fib(n):"]
//! [[methods]]
//! name = "linear-k4"
//! drafter = { kind = "chain" }
//! policy = { kind = "fixed", k = 4 }
//! ```
//!
//! The plain-decoding baseline (`drafter = { kind = "plain" }`) is added as a method named
//! `baseline` when missing, unless `baseline = "require"` asks for it to be written out.
//!
//! Methods run interleaved by default (`schedule = "interleaved"`: every method on the first
//! `batch_size` prompts, then every method on the next, in rotating order), so that slow drift of
//! the machine does not favour one method; `schedule = "by_method"` runs them one after another.
//!
//! `op_split = true` (one request at a time, a real model on the CPU) records each target
//! forward split into its ops (qkv, attention, gate_up, down, lm_head, ...) in the step
//! records, `forward_ops.csv` and a `summary.md` table: where a drafter's work between forwards
//! slows the target, this says which ops pay. The clock itself slows a SmolLM2 forward by
//! 2–8 % (three alternations on a 2-core Xeon): compare methods within a run that has it on.

mod experiment;
mod method;
mod models;
mod prompts;

pub use experiment::{
    check_experiment_name, check_max_tokens, BaselineRule, ExperimentConfig, LoadedConfig,
    SamplingConfig, Schedule, ToyConfig, MAX_BATCH_SIZE, MAX_SYNTHETIC_PROMPTS,
    MAX_TENSOR_PARALLEL, MAX_TOKENS_LIMIT,
};
pub use method::{DrafterConfig, FallbackConfig, MethodConfig, PolicyConfig, VerifierConfig};
pub use models::{KnownModel, ModelSource, ModelsConfig};
pub use prompts::{Prompt, PromptSet};
