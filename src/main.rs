//! The `specdec` command: a thin dispatcher over `specdec_harness::cli` (and, for `prove`, the
//! algorithms crate).

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use specdec_harness::cli;

/// specdec: speculative decoding, kernel first.
///
/// Start with `specdec run experiments/toy-chain.toml` (no model needed), then look at
/// results/toy-chain/summary.md and its SVG plots.
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
    /// Run an experiment config (TOML) and write JSONL, CSV, a markdown summary and SVG plots.
    ///
    /// The config lists models, prompts, sampling settings and methods; the plain-decoding
    /// baseline is added when missing. See experiments/README.md for the format. Today
    /// simulation configs ([simulation] table) and toy-model configs (target = "toy", run by the
    /// engine loop) run; configs naming real models report that the model runner is not yet
    /// wired in. Try experiments/sim-fixed-k.toml, sim-policies.toml or toy-chain.toml.
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
    /// placement: co-located vs remote draft behind PCIe / NVLink / network links.
    Repro {
        /// Which reproduction: leviathan or placement.
        #[arg(value_parser = cli::REPRODUCTIONS)]
        name: String,
        /// Output folder [default: results/repro/NAME].
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Prove the verifiers exact: enumerate every verifier x tree kind (and the negative
    /// controls) on seeded toy models and print the total-variation table.
    Prove,
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
        Command::Run { config, out, quiet } => {
            cli::run(&config, out.as_deref(), quiet)?;
        }
        Command::Report { results_dir } => cli::report(&results_dir)?,
        Command::Simulate { args, out, quiet } => {
            cli::simulate(&args, out.as_deref(), quiet)?;
        }
        Command::Repro { name, out } => {
            cli::repro(&name, out.as_deref())?;
        }
        Command::Prove => prove()?,
        Command::Bench(args) => args.run()?,
    }
    Ok(())
}

/// `specdec prove`: prints the proof table; fails if any row fails.
fn prove() -> anyhow::Result<()> {
    let rows = specdec::algorithms::proof::prove(&mut std::io::stdout().lock())?;
    let failed = rows.iter().filter(|r| !r.passed()).count();
    anyhow::ensure!(failed == 0, "{failed} proof rows failed");
    Ok(())
}
