//! Metrics: per-step and per-request records (what the engine or the simulation produces), and
//! per-configuration aggregates (what tables and plots show).
//!
//! Every statistic a report shows is defined here, once:
//! - **acceptance rate** = Σ accepted drafts / Σ proposed drafts over the configuration's
//!   requests (pooled), with a bootstrap interval over the prompts that drafted;
//! - **τ** (mean accepted length) = accepted drafts + 1 per target pass, i.e. (Σ accepted +
//!   passes) / passes for one prompt; per configuration the mean over prompts of the per-prompt
//!   τ, with a bootstrap interval over prompts (τ ≥ 1 always, the interval too);
//! - **tokens/s** = generated tokens / elapsed seconds of the configuration's run;
//! - **speedup** = tokens/s of the configuration / tokens/s of the baseline in the same run; its
//!   interval is the bootstrap over prompts of that same ratio (the whisker of the speedup bar);
//! - **per-prompt speedup** = baseline seconds per token / the configuration's on the same
//!   prompt, summarised by the geometric mean over prompts (ratios average on a log scale), with
//!   a bootstrap interval;
//! - **accepted-length histogram**: how many drafting steps accepted 0, 1, 2, … drafts;
//! - **acceptance by position** d: *conditional* = P(depth d accepted | depth d − 1 accepted and
//!   depth d proposed), with the number of such steps; *unconditional* (vLLM's per-position
//!   rate) = P(depth d accepted | depth d proposed), with the number of steps that proposed it;
//! - **target forward time by size** (the verify-cost curve as the run met it): the median
//!   seconds of one target forward over n tokens (a step's root and its n − 1 drafts), over the
//!   steps that ran alone (batch 1) ([`PassTime`]). Two methods' forwards of one size differ
//!   by what runs between them (the drafter above all) and by their prefixes; `specdec bench
//!   model` measures the same curve with nothing between forwards.
//!
//! - **per category** (MT-Bench, Spec-Bench questions; every turn of a question in its
//!   category): τ, speedup and decode tokens/s as above on that category's prompts
//!   ([`CategorySummary`]).
//!
//! Intervals are 95 % percentile-bootstrap intervals over prompts ([`bootstrap`]: 2000
//! resamples, fixed seed), reported with their n; under [`FEW_PROMPTS`] prompts reports warn
//! that they are rough. Repeats of a prompt (`repeat = N`) are summed into that prompt first:
//! the prompt, not the repeat, is the unit resampled.

mod aggregate;
pub(crate) use aggregate::first_seen;
mod records;
mod stats;

pub use aggregate::{
    acceptance_by_depth, accepted_lengths, forward_ops, pass_times, summarize,
    summarize_categories, CategorySummary, DepthAcceptance, ForwardOps, MethodSummary, OpMedian,
    PassTime, TimeSplit,
};
pub use records::{BudgetRecord, MethodRun, OpSeconds, PolicyDecision, RequestRecord, StepRecord};
pub use stats::{
    bootstrap, geometric_mean_interval, mean, mean_interval, median, quantile, ratio_interval,
    Interval, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, FEW_PROMPTS,
};
