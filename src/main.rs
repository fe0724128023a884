//! The `specdec` command: a thin dispatcher over `specdec_harness::cli` (and, for `prove`, the
//! algorithms crate).

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use specdec_harness::cli;
use specdec_harness::generate::{generate, generate_method_help, GenerateOptions};

/// specdec: speculative decoding, kernel first.
///
/// Start with `scripts/quickstart.sh` (real models), or `specdec run experiments/toy-chain.toml`
/// (no model needed), then look at results/NAME/summary.md and its SVG plots. One prompt:
/// `specdec generate --target smollm2-135m --method ngram --prompt "def fib(n):"`.
#[derive(Debug, Parser)]
#[command(name = "specdec", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the versions of the workspace crates.
    Version,
    /// Generate from one prompt, streaming the text, then print one summary line (tokens,
    /// tokens/s, acceptance rate, mean accepted length τ).
    ///
    /// --method names a drafter of the method registry (or an alias) drafting K tokens per step,
    /// or auto (see --method's help below; experiments/README.md lists every drafter, verifier
    /// and policy with its aliases).
    ///
    /// Example: specdec generate --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b
    /// --method linear --k 4 --prompt "def quicksort(xs):"
    Generate {
        /// Target model: smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b (fetched by
        /// scripts/fetch-models.sh), or a path to a .gguf file.
        #[arg(long)]
        target: String,
        /// Draft model (same tokenizer as the target), as for --target.
        #[arg(long)]
        draft: Option<String>,
        /// A drafter (chain, tree, ngram, layer_skip, staged, plain, ... or an alias) or auto.
        #[arg(long, default_value = "ngram", long_help = generate_method_help())]
        method: String,
        /// Drafts per step (chain length; node budget for trees, whose full shape has 21 nodes;
        /// largest K for auto).
        #[arg(long, default_value_t = 4)]
        k: usize,
        /// The prompt text.
        #[arg(long)]
        prompt: String,
        /// Softmax temperature; 0 is greedy.
        #[arg(long, default_value_t = 0.0)]
        temperature: f64,
        /// Most tokens to generate.
        #[arg(long, default_value_t = 128)]
        max_tokens: usize,
        /// Wrap the prompt in the model's chat template (instruct models).
        #[arg(long)]
        chat: bool,
        /// Seed of the random draws (T > 0).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Where the models run: cpu, cuda (GPU 0) or cuda:N.
        #[arg(long, default_value = "cpu")]
        device: String,
        /// A trained head file (safetensors) for --method eagle or medusa [default: the one
        /// `specdec train-head` wrote for the target into the cache].
        #[arg(long)]
        head: Option<String>,
    },
    /// Run an experiment config (TOML) and write JSONL, CSV, a markdown summary and SVG plots.
    ///
    /// The config lists models, prompts, sampling settings and methods; the plain-decoding
    /// baseline is added when missing. See experiments/README.md for the format and the
    /// registry's drafters, verifiers and policies with their aliases. Simulation
    /// configs ([simulation] table), toy-model configs (target = "toy") and real models (run by
    /// the engine) all run. Try experiments/quickstart.toml, toy-chain.toml or sim-fixed-k.toml.
    Run {
        /// The experiment file, e.g. experiments/sim-fixed-k.toml.
        config: PathBuf,
        /// Results folder [default: results/NAME, NAME from the config].
        #[arg(long)]
        out: Option<PathBuf>,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Re-render the summary, CSV and plots of a results folder from its saved JSONL.
    Report {
        /// A folder written by `specdec run`, e.g. results/sim-fixed-k.
        results_dir: PathBuf,
    },
    /// Simulate fixed-K chains against plain decoding with an injected acceptance rate and a
    /// given cost curve (no models): a quick what-if.
    ///
    /// Example: specdec simulate --alpha 0.8 --k 1,2,4,8 --draft-ms 1 --target-ms 10
    Simulate {
        #[command(flatten)]
        args: cli::SimulateArgs,
        /// Results folder [default: results/simulate].
        #[arg(long)]
        out: Option<PathBuf>,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Reproduce a paper's table and plot (see experiments/repro/NAME/README.md).
    ///
    /// leviathan: expected tokens per pass E(α, γ) and walltime gain, analytic vs simulated.
    ///
    /// placement: co-located vs remote draft behind PCIe / NVLink / network links.
    ///
    /// acceptance-temperature: acceptance and τ vs temperature, Qwen pair (real models).
    ///
    /// tree-scaling: chain vs k-ary vs dynamic vs Sequoia trees against node budget.
    ///
    /// multi-level: staged (n-gram → 0.5B → 1.5B) vs linear vs n-gram (real models).
    ///
    /// batching: continuous batching over batch sizes 1–16, where speculation stops paying.
    Repro {
        /// Which reproduction.
        #[arg(value_parser = cli::REPRODUCTIONS)]
        name: String,
        /// Smoke-test size: seconds; no model for tree-scaling and batching.
        #[arg(long)]
        quick: bool,
        /// Output folder [default: results/repro/NAME].
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Prove the verifiers exact: enumerate every verifier x tree kind (and the negative
    /// controls) on seeded toy models and print the total-variation table.
    Prove,
    /// Train an EAGLE-style or Medusa-style draft head for a target on ShareGPT (CPU), writing
    /// the head file with its checkpoint and loss curve next to it; prints throughput, losses
    /// and held-out agreement at depths 1 and 2.
    ///
    /// Features are extracted once into the cache (resumable); --minutes stops cleanly with a
    /// checkpoint and --resume continues. Example: specdec train-head --target smollm2-135m
    /// --kind eagle --minutes 10
    TrainHead(specdec::train::TrainHeadOptions),
    /// Benchmark a GGUF model end to end (tokens/s, verify-cost curve, memory) or split its
    /// forward into kernels; see scripts/bench-vs-llamacpp.sh for the llama.cpp baseline.
    Bench(specdec::harness::bench::cli::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    let args = Cli::parse();
    match args.command {
        Command::Version => {
            println!("specdec {}", env!("CARGO_PKG_VERSION"));
        }
        Command::Generate {
            target,
            draft,
            method,
            k,
            prompt,
            temperature,
            max_tokens,
            chat,
            seed,
            device,
            head,
        } => {
            let options = GenerateOptions {
                target,
                draft,
                method,
                k,
                prompt,
                temperature,
                max_tokens,
                chat,
                seed,
                device,
                head,
            };
            let summary = generate(&options, &mut std::io::stdout().lock())?;
            eprintln!("{}", summary.line());
        }
        Command::Run { config, out, quiet } => {
            cli::run(&config, out.as_deref(), quiet)?;
        }
        Command::Report { results_dir } => cli::report(&results_dir)?,
        Command::Simulate { args, out, quiet } => {
            cli::simulate(&args, out.as_deref(), quiet)?;
        }
        Command::Repro { name, quick, out } => {
            cli::repro(&name, quick, out.as_deref())?;
        }
        Command::Prove => prove()?,
        Command::Bench(args) => args.run()?,
        Command::TrainHead(options) => {
            println!("{}", specdec::train::train_head(&options)?.summary());
        }
    }
    Ok(())
}

/// `specdec prove`: prints the proof table; fails if any row fails.
fn prove() -> anyhow::Result<()> {
    let rows = specdec::harness::prove::prove(&mut std::io::stdout().lock())?;
    let failed = rows.iter().filter(|r| !r.passed()).count();
    anyhow::ensure!(failed == 0, "{failed} proof rows failed");
    Ok(())
}
