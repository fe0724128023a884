//! The `specdec` command: a thin dispatcher over `specdec_harness::cli` (and, for `prove`, the
//! algorithms crate).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use specdec_harness::cli;
use specdec_harness::engine::Penalties;
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
    /// Print the versions of the workspace crates, the git commit built in, and the main
    /// third-party crates' versions.
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
        /// scripts/fetch-models.sh), a path to a .gguf file, or a Hugging Face model folder.
        #[arg(long, short = 'm', visible_alias = "model")]
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
        /// The prompt text (or --file).
        #[arg(long, short = 'p', conflicts_with = "file")]
        prompt: Option<String>,
        /// Read the prompt from a file; `-` reads standard input (also read when neither
        /// --prompt nor --file is given and stdin is not a terminal).
        #[arg(long, short = 'f')]
        file: Option<PathBuf>,
        /// Softmax temperature; 0 is greedy.
        #[arg(long, default_value_t = 0.0)]
        temperature: f64,
        /// Keep only the K most probable tokens (applied to the target and, by the drafters, to
        /// the draft distribution).
        #[arg(long)]
        top_k: Option<usize>,
        /// Nucleus sampling: keep the most probable tokens up to this mass, in (0, 1].
        #[arg(long)]
        top_p: Option<f64>,
        /// min-p: drop the tokens whose probability is below this share of the most probable
        /// one's, in [0, 1] (after top-k and top-p).
        #[arg(long)]
        min_p: Option<f64>,
        /// Repetition penalty r > 0 on the target's and the drafts' logits (1 = off).
        #[arg(long, default_value_t = 1.0)]
        repetition_penalty: f32,
        /// Frequency penalty per occurrence (0 = off).
        #[arg(long, default_value_t = 0.0)]
        frequency_penalty: f32,
        /// Presence penalty (0 = off).
        #[arg(long, default_value_t = 0.0)]
        presence_penalty: f32,
        /// Most tokens to generate (0: nothing).
        #[arg(long, short = 'n', default_value_t = 128)]
        max_tokens: usize,
        /// Wrap the prompt in the model's chat template [default: when the model has one].
        #[arg(long, overrides_with = "no_chat")]
        chat: bool,
        /// Feed the prompt raw, without the chat template.
        #[arg(long, overrides_with = "chat")]
        no_chat: bool,
        /// Print one JSON object (text, tokens, timings, acceptance, τ) instead of streaming.
        #[arg(long)]
        json: bool,
        /// CPU threads for the model [default: all cores].
        #[arg(long, short = 't')]
        threads: Option<usize>,
        /// Seed of the random draws (T > 0).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Where the models run: cpu, cuda (GPU 0) or cuda:N.
        #[arg(long, default_value = "cpu")]
        device: String,
        /// A trained head file (safetensors) for --method eagle, medusa, or staged --draft eagle [default: the one
        /// `specdec train-head` wrote for the target into the cache].
        #[arg(long)]
        head: Option<String>,
        /// KV memory budget of the target's and the drafter's paged KV pools together, e.g.
        /// 8GiB or 512MiB [default: a quarter of the machine's memory].
        #[arg(long)]
        kv_memory: Option<String>,
        /// Element type of the KV caches: f32, bf16 or f16 (half the bytes per token, so twice
        /// the tokens in --kv-memory; values rounded when stored, attention in f32; CPU only).
        #[arg(long, default_value = "f32")]
        kv_dtype: String,
        /// Split the target among N tensor-parallel ranks (one all-reduce after each block's
        /// attention and MLP): CPU ranks on threads of this process, or with --device cuda one
        /// rank per GPU (devices 0..N, NCCL); the draft stays whole on rank 0.
        #[arg(long = "tp", value_name = "N", default_value_t = 1)]
        tensor_parallel: usize,
        /// Write one JSON line per target pass here (drafts proposed and accepted, timings, the
        /// policy's decision): the record --replay reads.
        #[arg(long, value_name = "FILE")]
        steps: Option<PathBuf>,
        /// Take each step's speculation decision from a --steps file of an earlier run instead
        /// of the policy, so that a method whose budgets follow measured timings (auto) gives
        /// the same text again at T > 0 with the same seed; a step that turns out otherwise
        /// than recorded stops the run with an error naming it.
        #[arg(long, value_name = "FILE")]
        replay: Option<PathBuf>,
    },
    /// Serve the target over an OpenAI-compatible HTTP API (completions and chat completions,
    /// streamed or not; /v1/models, /health, /metrics), speculating with --method.
    ///
    /// Requests wait in a bounded queue (full: 503 with Retry-After) and join the running batch
    /// between steps (requests with other sampling settings wait for the batch to drain); a
    /// client that goes away is dropped at the next step, its KV blocks freed. /health answers
    /// 200 once the models are loaded. SIGINT / SIGTERM stop admitting and let running requests
    /// finish.
    ///
    /// CONFIG (optional): a TOML file with an experiment config's [models] and [[methods]]
    /// tables only; --method then names one of its methods (default: its only one), and
    /// --target / --draft override its models.
    Serve {
        /// A serve config: [models] and [[methods]] tables.
        config: Option<PathBuf>,
        /// Target model: smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b or a .gguf path;
        /// also the model id clients ask for (the file stem for a path). Required without
        /// CONFIG.
        #[arg(long)]
        target: Option<String>,
        /// Draft model (same tokenizer as the target), as for --target.
        #[arg(long)]
        draft: Option<String>,
        /// A drafter or auto, as for `specdec generate --method` [default: plain]; with CONFIG,
        /// the name of one of its methods.
        #[arg(long, long_help = generate_method_help())]
        method: Option<String>,
        /// Drafts per step of the fixed-budget methods [default: 4]; not with CONFIG (its
        /// methods set their own policies).
        #[arg(long)]
        k: Option<usize>,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Port to listen on (0: any free one).
        #[arg(long, default_value_t = 8000)]
        port: u16,
        /// Require `Authorization: Bearer KEY` on the /v1 routes.
        #[arg(long)]
        api_key: Option<String>,
        /// Requests that may wait for the engine; beyond them the server answers 503.
        #[arg(long, default_value_t = 64)]
        queue: usize,
        /// Requests in the running batch at most (continuous batching).
        #[arg(long, default_value_t = 8)]
        batch_size: usize,
        /// Split the target among N tensor-parallel ranks (as `specdec generate --tp`);
        /// with CONFIG, its models.tensor_parallel unless given.
        #[arg(long = "tp", value_name = "N")]
        tensor_parallel: Option<usize>,
        /// Acceptance below which a request stops speculating and probes again later (0:
        /// never) [default: 0.3, except for a lookup drafter (n-gram, history) under the
        /// cost-model policy, as `auto` without --draft: that policy verifies each of its
        /// offers only where it pays, so no gate applies to it unless this is given].
        #[arg(long)]
        min_acceptance: Option<f64>,
        /// Seed of the requests that give none.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Run an experiment config (TOML) and write JSONL, CSV, a markdown summary and SVG plots.
    ///
    /// The config lists models, prompts, sampling settings and methods; the plain-decoding
    /// baseline is added when missing. See experiments/README.md for the format and the
    /// registry's drafters, verifiers and policies with their aliases. Simulation
    /// configs ([simulation] table), toy-model configs (target = "toy") and real models (run by
    /// the engine) all run. Try experiments/quickstart.toml, toy-chain.toml or sim-fixed-k.toml.
    ///
    /// Records are appended to requests.jsonl / steps.jsonl as requests finish; Ctrl-C or
    /// SIGTERM stops the run at the next batch, keeping them (a second Ctrl-C exits at once);
    /// `specdec run --resume DIR` continues it.
    Run {
        /// The experiment file, e.g. experiments/sim-fixed-k.toml.
        #[arg(required_unless_present = "resume")]
        config: Option<PathBuf>,
        /// Results folder [default: results/NAME, NAME from the config]. One holding another
        /// run's results is kept: the run writes to NAME-2 (NAME-3, ...) and says so.
        #[arg(long, conflicts_with = "resume")]
        out: Option<PathBuf>,
        /// Replace the results in the --out folder instead.
        #[arg(long, conflicts_with = "resume")]
        force: bool,
        /// Continue the incomplete run in this results folder.
        #[arg(long, value_name = "DIR", conflicts_with = "config")]
        resume: Option<PathBuf>,
        /// Run only these of the config's methods (names, comma-separated), and the
        /// plain-decoding baseline; a name the config does not list is refused.
        #[arg(
            long,
            value_delimiter = ',',
            value_name = "NAMES",
            conflicts_with = "resume"
        )]
        methods: Vec<String>,
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
    /// dynamic-k: adaptive K policies vs the best fixed K (simulated; experiments/sim-policies.toml).
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
    /// Measure a trained head as stored: top-1 agreement of its argmax with the target's by
    /// drafting depth (teacher-forced, true features), on data prepared as train-head does
    /// (ShareGPT, or any ShareGPT-format file; --regenerate for the target's own answers).
    ///
    /// Example, a run's held-out sequences: specdec eval-head --target smollm2-135m --skip 1968
    EvalHead(specdec::train::EvalHeadOptions),
    /// Rank a model's vocabulary by frequency in ShareGPT (or any ShareGPT-format file), for a
    /// draft model's limited LM head: `draft_vocab = N` with `draft_vocab_ranking = FILE` keeps
    /// the N most frequent ids (FR-Spec), still lossless. Tokenizes only (no forward).
    ///
    /// Example: specdec rank-vocab --target qwen2.5-coder-0.5b
    RankVocab(specdec::train::RankVocabOptions),
    /// Write a GGUF model as a Hugging Face model folder (config.json, tokenizer.json,
    /// tokenizer_config.json, model.safetensors), dequantised to --dtype, llama Q/K un-permuted
    /// to the rotate-half layout; no hub, no PyTorch. The folder then loads wherever a model is
    /// accepted (--target, --draft, [models]).
    ///
    /// Example: specdec export-hf smollm2-135m /tmp/smollm2-hf --dtype bf16
    ExportHf {
        /// The GGUF model: a registry name (smollm2-135m, ...) or a path to a .gguf file.
        model: String,
        /// The folder to create (it must not exist or be empty).
        dir: PathBuf,
        /// How the weights are stored.
        #[arg(long, default_value = "f32", value_parser = cli::EXPORT_DTYPES)]
        dtype: String,
    },
    /// Benchmark a GGUF model end to end (tokens/s, verify-cost curve, memory) or split its
    /// forward into kernels (see scripts/bench-vs-llamacpp.sh for the llama.cpp baseline), or
    /// load-test `specdec serve` with speculation on and off.
    Bench(BenchCommand),
}

/// `specdec bench`: the harness's model benchmarks, and `serve`.
#[derive(Debug, clap::Args)]
struct BenchCommand {
    /// What to benchmark.
    #[command(subcommand)]
    what: BenchKind,
}

#[derive(Debug, Subcommand)]
enum BenchKind {
    /// Load-test `specdec serve` on 127.0.0.1: start a plain and a speculative server, measure
    /// plain decoding's capacity, then offer open-loop Poisson arrivals at multiples of it and
    /// closed-loop saturation (N clients) to both, interleaved; write requests.jsonl,
    /// summary.csv, summary.md and SVG plots (TTFT, TPOT p50 / p99, throughput, acceptance,
    /// the share of speculative steps, and the speculative / plain ratios).
    ///
    /// Example: specdec bench serve --target smollm2-135m --method ngram --requests 50
    Serve(specdec::server::bench::ServeBenchArgs),
    #[command(flatten)]
    Harness(specdec::harness::bench::cli::BenchWhat),
}

/// Runs the command; an error is printed as a message with its causes (never a backtrace,
/// whatever `RUST_BACKTRACE` says) and exits with status 1.
fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let mut said = err.to_string();
            eprintln!("error: {said}");
            // causes the message does not already spell out
            for cause in err.chain().skip(1).map(|c| c.to_string()) {
                if !said.contains(&cause) {
                    eprintln!("  caused by: {cause}");
                    said.push_str(&cause);
                }
            }
            ExitCode::FAILURE
        }
    }
}

fn run(args: Cli) -> anyhow::Result<()> {
    match args.command {
        Command::Version => print!("{}", version_text()),
        Command::Generate {
            target,
            draft,
            method,
            k,
            prompt,
            file,
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            frequency_penalty,
            presence_penalty,
            max_tokens,
            chat,
            no_chat,
            json,
            threads,
            seed,
            device,
            head,
            kv_memory,
            kv_dtype,
            tensor_parallel,
            steps,
            replay,
        } => {
            if let Some(n) = threads {
                specdec_harness::generate::use_threads(n)?;
            }
            let options = GenerateOptions {
                target,
                draft,
                method,
                k,
                prompt: read_prompt(prompt, file)?,
                temperature,
                top_k,
                top_p,
                min_p,
                penalties: Penalties {
                    repetition: repetition_penalty,
                    frequency: frequency_penalty,
                    presence: presence_penalty,
                },
                max_tokens,
                chat: match (chat, no_chat) {
                    (true, _) => Some(true),
                    (_, true) => Some(false),
                    _ => None,
                },
                seed,
                device,
                head,
                kv_memory,
                kv_dtype: Some(kv_dtype),
                tensor_parallel,
                steps_out: steps,
                replay,
            };
            let mut loading = |line: &str| eprintln!("{line}");
            if json {
                let summary = generate(&options, &mut std::io::sink(), &mut loading)?;
                println!("{}", summary.to_json());
            } else {
                let summary = generate(&options, &mut std::io::stdout().lock(), &mut loading)?;
                eprintln!("{}", summary.line());
            }
        }
        Command::Serve {
            config,
            target,
            draft,
            method,
            k,
            host,
            port,
            api_key,
            queue,
            batch_size,
            tensor_parallel,
            min_acceptance,
            seed,
        } => {
            use specdec::server::{ServeConfig, ServeOptions};
            let base = match (&config, &target) {
                (Some(_), _) if k.is_some() => anyhow::bail!(
                    "specdec serve: --k is for the --method names of specdec generate; a CONFIG \
                     method sets its budget in its policy table"
                ),
                (Some(path), _) => {
                    ServeOptions::from_config(&ServeConfig::load(path)?, method.as_deref())?
                }
                (None, Some(target)) => ServeOptions {
                    method: method.unwrap_or_else(|| "plain".into()),
                    ..ServeOptions::new(target)
                },
                (None, None) => anyhow::bail!("specdec serve: give a CONFIG file or --target"),
            };
            let options = ServeOptions {
                target: target.unwrap_or(base.target.clone()),
                draft: draft.or(base.draft.clone()),
                k: k.unwrap_or(base.k),
                host,
                port,
                api_key,
                queue,
                batch_size,
                min_acceptance,
                seed,
                tensor_parallel: tensor_parallel.unwrap_or(base.tensor_parallel),
                ..base
            };
            specdec::server::serve(&options)?;
        }
        Command::Run {
            config,
            out,
            force,
            resume,
            methods,
            quiet,
        } => match (resume, config) {
            (Some(dir), _) => {
                cli::resume(&dir, quiet)?;
            }
            (None, Some(config)) => {
                let options = cli::RunOptions {
                    out: out.as_deref(),
                    quiet,
                    force,
                    methods: &methods,
                };
                cli::run(&config, &options)?;
            }
            (None, None) => anyhow::bail!("give a config file or --resume DIR"),
        },
        Command::Report { results_dir } => cli::report(&results_dir)?,
        Command::Simulate { args, out, quiet } => {
            cli::simulate(&args, out.as_deref(), quiet)?;
        }
        Command::Repro { name, quick, out } => {
            cli::repro(&name, quick, out.as_deref())?;
        }
        Command::Prove => prove()?,
        Command::Bench(BenchCommand { what }) => match what {
            BenchKind::Serve(args) => {
                specdec::server::bench::run(&args)?;
            }
            BenchKind::Harness(what) => specdec::harness::bench::cli::BenchArgs { what }.run()?,
        },
        Command::ExportHf { model, dir, dtype } => cli::export_hf(&model, &dir, &dtype)?,
        Command::TrainHead(options) => {
            println!("{}", specdec::train::train_head(&options)?.summary());
        }
        Command::EvalHead(options) => {
            println!("{}", specdec::train::eval_head(&options)?.summary());
        }
        Command::RankVocab(options) => {
            println!("{}", specdec::train::rank_vocab(&options)?.summary());
        }
    }
    Ok(())
}

/// `specdec version`: the workspace crates' version, the git commit built in, and the main
/// third-party crates' versions.
fn version_text() -> String {
    use specdec_harness::report::{build_dirty, crate_versions, BUILD_COMMIT};
    let mut text = format!(
        "specdec {} (git commit {BUILD_COMMIT}{})\n",
        env!("CARGO_PKG_VERSION"),
        match build_dirty() {
            Some(true) => ", uncommitted changes",
            _ => "",
        }
    );
    for krate in [
        "specdec-kernels",
        "specdec-models",
        "specdec-algorithms",
        "specdec-harness",
        "specdec-train",
    ] {
        text.push_str(&format!("  {krate} {}\n", env!("CARGO_PKG_VERSION")));
    }
    for (krate, version) in crate_versions() {
        text.push_str(&format!("  {krate} {version}\n"));
    }
    text
}

/// The prompt: `--prompt`, else the `--file` (`-`: stdin), else stdin when it is not a terminal.
fn read_prompt(prompt: Option<String>, file: Option<PathBuf>) -> anyhow::Result<String> {
    use std::io::{IsTerminal, Read};
    let from_stdin = || -> anyhow::Result<String> {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| anyhow::anyhow!("reading the prompt from standard input: {e}"))?;
        Ok(text)
    };
    match (prompt, file) {
        (Some(p), _) => Ok(p),
        (None, Some(f)) if f.as_os_str() == "-" => from_stdin(),
        (None, Some(f)) => std::fs::read_to_string(&f)
            .map_err(|e| anyhow::anyhow!("reading the prompt file {}: {e}", f.display())),
        (None, None) if !std::io::stdin().is_terminal() => from_stdin(),
        (None, None) => {
            anyhow::bail!("no prompt: give --prompt TEXT, --file PATH, or pipe it into stdin")
        }
    }
}

/// `specdec prove`: prints the proof table; fails if any row fails.
fn prove() -> anyhow::Result<()> {
    let rows = specdec::harness::prove::prove(&mut std::io::stdout().lock())?;
    let failed = rows.iter().filter(|r| !r.passed()).count();
    anyhow::ensure!(failed == 0, "{failed} proof rows failed");
    Ok(())
}
