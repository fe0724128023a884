//! The `specdec bench` subcommand (clap), kept here so that `src/main.rs` only forwards to it.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Subcommand};
use specdec_kernels::kv::KvLayout;
use specdec_models::gguf::GgufFile;
use specdec_models::llama::{read_config, read_weights, LlamaModel, LlamaOptions, MatmulPath};

use super::kernels::{bench_attention, bench_matmuls, bench_ops};
use super::model::{bench_model, ModelBenchConfig};
use super::process::{cpu_times, peak_rss_bytes};
use super::stats::timed;
use super::table::{render_model, render_ops, render_split};
use super::BenchReport;
use crate::error::{HarnessError, Result};

/// `specdec bench`: benchmarks on a GGUF model. Threads: rayon's pool, set with
/// RAYON_NUM_THREADS. For the llama.cpp baseline on the same files run
/// scripts/bench-vs-llamacpp.sh.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to benchmark.
    #[command(subcommand)]
    pub what: BenchWhat,
}

/// The benchmark kinds.
#[derive(Debug, Subcommand)]
pub enum BenchWhat {
    /// End to end: prompt processing (one forward of N tokens), decode (one token per forward),
    /// the verify-cost curve (one forward of K tokens after a prefix, relative to K = 1) and
    /// peak memory.
    Model(ModelArgs),
    /// The forward split into its quantised matmuls (per projection group, all layers), its
    /// attention (all layers, after the verify prefix) and the rest, for each K of the
    /// verify-cost curve, each kernel timed alone; then the forward's ops timed inside it.
    Kernels(ModelArgs),
}

/// Options shared by `bench model` and `bench kernels`.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// Registry name (smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b) or a GGUF path.
    pub model: String,
    /// Prompt-processing length (tokens in one forward).
    #[arg(long, default_value_t = 64)]
    pub prompt_tokens: usize,
    /// Decode length (forwards of one token each).
    #[arg(long, default_value_t = 64)]
    pub decode_tokens: usize,
    /// Committed tokens before each verify forward.
    #[arg(long, default_value_t = 64)]
    pub verify_prefix: usize,
    /// K values of the verify-cost curve, comma-separated (1 is always added).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub ks: Vec<usize>,
    /// Timed repetitions of each measure, after one warm-up; medians are reported.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl BenchArgs {
    /// Runs the benchmark, prints its table to stdout and writes the JSON file if asked.
    ///
    /// # Errors
    /// An unknown model or unreadable file, an invalid size, a model error, or an unwritable
    /// JSON path.
    pub fn run(&self) -> Result<()> {
        let (args, split) = match &self.what {
            BenchWhat::Model(a) => (a, false),
            BenchWhat::Kernels(a) => (a, true),
        };
        let path = specdec_models::registry::resolve(&args.model)?;
        let file_bytes = std::fs::metadata(&path)
            .map_err(|e| HarnessError::io(&path, e))?
            .len();
        let (loaded, load_s) = timed(|| -> Result<_> {
            let file = Arc::new(GgufFile::open(&path)?);
            let config = ModelBenchConfig {
                prompt_tokens: args.prompt_tokens,
                decode_tokens: args.decode_tokens,
                verify_prefix: args.verify_prefix,
                verify_ks: args.ks.clone(),
                repeats: args.reps,
                ..ModelBenchConfig::default()
            };
            // every size checked against the model's context before the KV cache they imply
            // is allocated
            config.validate(read_config(&file)?.context_length)?;
            let needed = config.prompt_tokens.max(config.decode_tokens)
                + config.verify_prefix
                + config.ks().last().copied().unwrap_or(1);
            let options = LlamaOptions {
                kv_capacity_tokens: needed.max(LlamaOptions::default().kv_capacity_tokens),
                ..LlamaOptions::default()
            };
            let model = LlamaModel::from_gguf(&file, options)?;
            Ok((file, config, model))
        });
        let (file, config, mut model) = loaded?;
        let cpu_before = cpu_times();
        let (result, bench_wall_s) = timed(|| bench_model(&mut model, &config));
        let result = result?;
        let cpu = cpu_before.zip(cpu_times()).map(|(b, a)| a.since(&b));
        let ops = if split {
            Some(bench_ops(&mut model, &config)?)
        } else {
            None
        };
        let (matmuls, attention) = if split {
            // the config the model was loaded with (read once, before the model)
            let model_config = model.config().clone();
            let mut weights = read_weights(&file, &model_config)?;
            // as the model's forward reads them (the bench splits the Int8 path)
            MatmulPath::Int8.prepare(&mut weights)?;
            let matmuls = bench_matmuls(&weights, &config.ks(), config.repeats)?;
            let layout = KvLayout::new(
                model_config.n_layers,
                model_config.n_kv_heads,
                model_config.head_dim,
                LlamaOptions::default().kv_block_size,
            )?;
            let attention = bench_attention(
                layout,
                model_config.n_heads,
                config.verify_prefix,
                &config.ks(),
                config.repeats,
            )?;
            (Some(matmuls), Some(attention))
        } else {
            (None, None)
        };
        let report = BenchReport {
            model: args.model.clone(),
            path: path.display().to_string(),
            file_bytes,
            threads: rayon::current_num_threads(),
            load_s,
            bench_wall_s,
            cpu,
            peak_rss_bytes: peak_rss_bytes(),
            result,
            matmuls,
            attention,
            ops,
        };
        print!("{}", render_model(&report));
        if let Some(m) = &report.matmuls {
            let attention = report.attention.as_deref().unwrap_or_default();
            print!("{}", render_split(&report, m, attention));
        }
        if let Some(ops) = &report.ops {
            print!("{}", render_ops(&report, ops));
        }
        if let Some(json) = &args.json {
            let text = serde_json::to_string_pretty(&report)
                .map_err(|e| HarnessError::Bench(format!("cannot serialise the report: {e}")))?;
            std::fs::write(json, text + "\n").map_err(|e| HarnessError::io(json, e))?;
        }
        Ok(())
    }
}
