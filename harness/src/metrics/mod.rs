//! Metrics: per-step and per-request records (what the engine or the simulation produces), and
//! per-configuration aggregates (what tables and plots show).
//!
//! Definitions used everywhere:
//! - acceptance rate = accepted drafts / proposed drafts;
//! - τ (mean accepted length) = accepted drafts + 1 per target pass, i.e. (Σ accepted + passes) /
//!   passes for one request; per configuration the mean over prompts of the per-prompt τ with a
//!   95 % Student-t interval over prompts;
//! - tokens/s = generated tokens / elapsed seconds of the configuration's run;
//! - speedup = tokens/s of the configuration / tokens/s of the baseline in the same run.

mod aggregate;
mod records;
mod stats;

pub use aggregate::{acceptance_by_depth, summarize, MethodSummary, TimeSplit};
pub use records::{MethodRun, RequestRecord, StepRecord};
pub use stats::{mean, student_t_975, t_interval, Interval};
