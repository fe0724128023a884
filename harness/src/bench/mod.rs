//! `specdec bench`: end-to-end model benchmarks and in-process kernel timings.
//!
//! - [`model`]: prompt-processing and decode tokens/s and the verify-cost curve (one forward of
//!   K new tokens after a fixed prefix, relative to K = 1) over any [`specdec_models::LanguageModel`];
//! - [`kernels`]: the quantised matmuls of one forward at a real model's shapes, per projection
//!   group, and its tree attention over all layers, to split a forward's time into matmuls,
//!   attention and the rest; and the forward's ops timed inside the forward itself;
//! - [`process`]: peak resident memory (VmHWM), CPU and run-queue wait time of the run;
//! - [`table`]: plain-text tables; [`cli`]: the `specdec bench` subcommand.
//!
//! Threads are rayon's global pool (`RAYON_NUM_THREADS`). The llama.cpp baseline on the same
//! files is run by `scripts/bench-vs-llamacpp.sh`, which calls `specdec bench model … --json`.

pub mod cli;
pub mod kernels;
pub mod model;
pub mod process;
pub mod stats;
pub mod table;

use serde::{Deserialize, Serialize};

pub use kernels::{
    bench_attention, bench_matmuls, bench_ops, AttentionTiming, MatmulTiming, OpShare, OpSplit,
};
pub use model::{bench_model, ModelBenchConfig, ModelBenchResult, VerifyCost};
pub use process::CpuTimes;

/// One model's benchmark with its context: what `specdec bench model --json` writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// The model as named on the command line (registry name or path).
    pub model: String,
    /// The GGUF file benchmarked.
    pub path: String,
    /// Size of the GGUF file, bytes.
    pub file_bytes: u64,
    /// Threads in rayon's pool during the run.
    pub threads: usize,
    /// Seconds to open and load the model.
    pub load_s: f64,
    /// Peak resident memory of the process at the end of the run, bytes (`None` off Linux).
    pub peak_rss_bytes: Option<u64>,
    /// Wall time of the measurements (after loading), seconds.
    pub bench_wall_s: f64,
    /// CPU time and run-queue waiting of the process's threads during the measurements: on a
    /// shared machine a large wait means the figures are slowed by other work.
    pub cpu: Option<CpuTimes>,
    /// The measurements.
    pub result: ModelBenchResult,
    /// Matmul timings per projection group (`specdec bench kernels` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matmuls: Option<Vec<MatmulTiming>>,
    /// Attention timings over all layers per K, after the verify prefix (`specdec bench
    /// kernels` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<Vec<AttentionTiming>>,
    /// The forward split into its ops, timed inside it, per K (`specdec bench kernels` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<Vec<OpSplit>>,
}

#[cfg(test)]
mod tests;
