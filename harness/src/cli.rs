//! The work behind the `specdec` subcommands `run`, `report`, `simulate` and `repro`, so the
//! binary stays a thin argument parser. Each function prints what the user needs (notes, the
//! summary table, where the files are) and returns an error to show on failure.

use crate::methods::kinds::*;
use std::path::{Path, PathBuf};

use crate::config::{
    BaselineRule, DrafterConfig, ExperimentConfig, LoadedConfig, MethodConfig, ModelsConfig,
    PolicyConfig, PromptSet, SamplingConfig,
};
use crate::error::{HarnessError, Result};
use crate::report::{files, rerender, RunResults};
use crate::repro;
use crate::runner::{
    backend_for, resume_experiment, run_experiment, run_experiment_with, stop_on_signals,
    RunControl,
};
use crate::simulation::{AcceptanceProcess, CostCurve, CostModel, SimulationConfig};

fn print_outcome(results: &RunResults, dir: &Path) {
    let md = std::fs::read_to_string(dir.join(files::SUMMARY_MD)).unwrap_or_default();
    // The table only: stop at the provenance section.
    let table = md.split("## Provenance").next().unwrap_or("");
    println!("{}", table.trim_end());
    println!(
        "\n{} methods × {} prompts. Results in {}:",
        results.runs.len(),
        results.summaries.first().map_or(0, |s| s.requests),
        dir.display()
    );
    for f in files::ALL.iter().chain(&files::OPTIONAL) {
        if files::ALL.contains(f) || dir.join(f).exists() {
            println!("  {}", dir.join(f).display());
        }
    }
}

/// The options of `specdec run CONFIG`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions<'a> {
    /// The results folder (default `results/NAME`).
    pub out: Option<&'a Path>,
    /// No progress bar.
    pub quiet: bool,
    /// Replace the results in `out` instead of writing beside them.
    pub force: bool,
    /// Only these methods of the config (and its baseline); empty: all of them.
    pub methods: &'a [String],
}

/// `specdec run CONFIG [--out DIR] [--force] [--methods A,B]`: loads and validates the
/// config, keeps only the chosen methods ([`keep_methods`]), picks the results folder
/// ([`results_dir`]: default `results/NAME`; a folder holding another run's results is kept and
/// a new one used unless `force`), runs it (progress bar unless `quiet`; SIGINT / SIGTERM stop
/// it keeping what finished), and prints the summary.
///
/// # Errors
/// A bad config, method name or folder; a run stopped by a signal or with failed methods, after
/// what finished is written (the message says how to resume).
pub fn run(config: &Path, options: &RunOptions<'_>) -> Result<PathBuf> {
    let mut loaded = ExperimentConfig::load(config)?;
    keep_methods(&mut loaded, options.methods)?;
    for note in &loaded.notes {
        eprintln!("note: {note}");
    }
    let requested = options.out.map_or_else(
        || PathBuf::from("results").join(&loaded.config.name),
        Path::to_path_buf,
    );
    let (quiet, force) = (options.quiet, options.force);
    let dir = results_dir(&requested, force)?;
    if dir != requested {
        eprintln!(
            "note: {} holds another run's results; writing to {} (--force replaces them)",
            requested.display(),
            dir.display()
        );
    }
    let stop = stop_on_signals()?;
    let mut backend = backend_for(&loaded.config)?;
    let control = RunControl {
        progress: !quiet,
        stop: &stop,
    };
    let results = run_experiment_with(&loaded, backend.as_mut(), &dir, &control, None)?;
    finish(&results, &dir)
}

/// Keeps only the methods of `config` named in `names` and its plain-decoding baseline, in the
/// config's order; `names` empty keeps every method.
///
/// # Errors
/// [`HarnessError::InvalidConfig`] naming a method the config does not list, and the ones it
/// does.
pub fn keep_methods(config: &mut LoadedConfig, names: &[String]) -> Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let origin = config.origin();
    let methods = &mut config.config.methods;
    if let Some(unknown) = names
        .iter()
        .find(|n| !methods.iter().any(|m| &m.name == *n))
    {
        let listed: Vec<&str> = methods.iter().map(|m| m.name.as_str()).collect();
        return Err(HarnessError::ConfigInvalid {
            origin,
            field: "--methods".into(),
            problem: format!(
                "the config has no method `{unknown}` (it lists {})",
                listed.join(", ")
            ),
        });
    }
    methods.retain(|m| m.is_baseline() || names.contains(&m.name));
    Ok(())
}

/// `specdec run --resume DIR`: continues the incomplete run in `DIR` (its config as recorded),
/// running only the (method, prompt, repeat) triples without a record.
///
/// # Errors
/// As [`run`]; a folder with nothing to resume.
pub fn resume(dir: &Path, quiet: bool) -> Result<PathBuf> {
    let stop = stop_on_signals()?;
    let control = RunControl {
        progress: !quiet,
        stop: &stop,
    };
    let results = resume_experiment(dir, &control)?;
    finish(&results, dir)
}

/// Prints a run's outcome, or says why it is incomplete and how to continue it.
fn finish(results: &RunResults, dir: &Path) -> Result<PathBuf> {
    let p = &results.provenance;
    if !results.summaries.is_empty() {
        print_outcome(results, dir);
    }
    if p.complete {
        return Ok(dir.to_path_buf());
    }
    let mut why = Vec::new();
    if let Some(stopped) = &p.stopped {
        why.push(stopped.clone());
    }
    for failure in &p.failures {
        why.push(format!("method {failure}"));
    }
    Err(HarnessError::Incomplete(format!(
        "{}; the {} finished request records are in {} (provenance.json says incomplete); \
         continue with `specdec run --resume {}`",
        why.join("; "),
        results.requests.len(),
        dir.display(),
        dir.display()
    )))
}

/// The folder a run writes into: `requested` when it holds no results (absent, empty, or
/// without `provenance.json`); with `force`, `requested` after removing the results files
/// there; else the first of `requested-2`, `requested-3`, … that does not exist.
///
/// # Errors
/// A results file that cannot be removed.
pub fn results_dir(requested: &Path, force: bool) -> Result<PathBuf> {
    if !requested.join(files::PROVENANCE).exists() {
        return Ok(requested.to_path_buf());
    }
    if force {
        for name in files::ALL.iter().chain(&files::OPTIONAL) {
            let p = requested.join(name);
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(HarnessError::io(&p, e)),
            }
        }
        return Ok(requested.to_path_buf());
    }
    let name = requested.file_name().map_or_else(
        || "results".to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    (2..)
        .map(|i| requested.with_file_name(format!("{name}-{i}")))
        .find(|p| !p.exists())
        .ok_or_else(|| HarnessError::io(requested, std::io::ErrorKind::AlreadyExists.into()))
}

/// `specdec report DIR`: re-renders summary, CSV, markdown and plots from the saved JSONL.
pub fn report(dir: &Path) -> Result<()> {
    let (results, _) = rerender(dir)?;
    print_outcome(&results, dir);
    Ok(())
}

/// Parameters of `specdec simulate` (also its command-line flags).
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct SimulateArgs {
    /// Acceptance probability per draft; several values give α by depth (the last repeats).
    #[arg(long = "alpha", value_delimiter = ',', default_value = "0.8")]
    pub alphas: Vec<f64>,
    /// Draft lengths K to compare (one fixed-K chain method each).
    #[arg(long = "k", value_delimiter = ',', default_value = "1,2,4,8")]
    pub ks: Vec<usize>,
    /// Draft cost per token, ms.
    #[arg(long, default_value_t = 1.0)]
    pub draft_ms: f64,
    /// Target pass over one token, ms.
    #[arg(long, default_value_t = 10.0)]
    pub target_ms: f64,
    /// Extra target cost per additional token in one pass, ms.
    #[arg(long, default_value_t = 0.0)]
    pub target_per_token_ms: f64,
    /// Number of simulated prompts.
    #[arg(long, default_value_t = 20)]
    pub prompts: usize,
    /// Tokens generated per prompt.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Seed of the acceptance draws.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Builds the experiment config `specdec simulate` runs: a baseline and one fixed-K chain per
/// `ks` entry on an injected acceptance process and an affine cost curve.
pub fn simulate_config(a: &SimulateArgs) -> Result<LoadedConfig> {
    let acceptance = match a.alphas.as_slice() {
        [alpha] => AcceptanceProcess::Fixed { alpha: *alpha },
        _ => AcceptanceProcess::ByDepth {
            alphas: a.alphas.clone(),
        },
    };
    let mut config = ExperimentConfig {
        name: "simulate".into(),
        description: format!(
            "simulate: α {:?}, draft {} ms/token, target {} ms + {} ms/extra token",
            a.alphas, a.draft_ms, a.target_ms, a.target_per_token_ms
        ),
        models: ModelsConfig::default(),
        prompts: PromptSet::Synthetic {
            count: a.prompts,
            prompt_tokens: 64,
        },
        sampling: SamplingConfig {
            seed: a.seed,
            ..SamplingConfig::default()
        },
        max_tokens: a.max_tokens,
        batch_size: 1,
        repeat: 1,
        baseline: BaselineRule::Add,
        schedule: Default::default(),
        toy: None,
        simulation: Some(SimulationConfig {
            acceptance,
            cost: CostModel {
                draft_ms_per_token: a.draft_ms,
                target: CostCurve::Affine {
                    base_ms: a.target_ms,
                    per_token_ms: a.target_per_token_ms,
                },
                verify_ms: 0.0,
                commit_ms: 0.0,
                overhead_ms: 0.0,
                link: None,
            },
        }),
        op_split: false,
        methods: a
            .ks
            .iter()
            .map(|&k| {
                let fixed = Some(PolicyConfig::of(Fixed { k }));
                MethodConfig::new(
                    format!("chain-k{k}"),
                    DrafterConfig::of(Chain::default()),
                    fixed,
                )
            })
            .collect(),
    };
    let notes = config.validate("specdec simulate")?;
    Ok(LoadedConfig {
        config,
        path: None,
        notes,
    })
}

/// `specdec simulate …`: runs [`simulate_config`] and writes the results (default
/// `results/simulate`).
pub fn simulate(args: &SimulateArgs, out: Option<&Path>, quiet: bool) -> Result<PathBuf> {
    let loaded = simulate_config(args)?;
    let requested = out.map_or_else(|| PathBuf::from("results/simulate"), Path::to_path_buf);
    let dir = results_dir(&requested, false)?;
    if dir != requested {
        eprintln!(
            "note: {} holds another run's results; writing to {}",
            requested.display(),
            dir.display()
        );
    }
    let results = run_experiment(&loaded, &dir, !quiet)?;
    print_outcome(&results, &dir);
    Ok(dir)
}

/// The reproductions `specdec repro` knows (the table of experiments/README.md, in its order).
pub const REPRODUCTIONS: [&str; 7] = [
    "leviathan",
    "placement",
    "dynamic-k",
    "acceptance-temperature",
    "tree-scaling",
    "multi-level",
    "batching",
];

/// The config of the `dynamic-k` reproduction.
const DYNAMIC_K: &str = include_str!("../../experiments/sim-policies.toml");

/// `specdec repro NAME [--quick] [--out DIR]`: runs a reproduction (default folder
/// `results/repro/NAME`), prints its table and the files written. `quick` picks the smoke-test
/// size (seconds; no model for tree-scaling and batching, one short prompt for the other
/// real-model ones); leviathan and placement have one size.
pub fn repro(name: &str, quick: bool, out: Option<&Path>) -> Result<PathBuf> {
    use repro::{acceptance_temperature as at, batching, multi_level as ml, tree_scaling as ts};
    let dir = out.map_or_else(
        || PathBuf::from("results/repro").join(name),
        Path::to_path_buf,
    );
    let output = match name {
        "leviathan" => repro::leviathan::run(&dir, &repro::leviathan::LeviathanParams::default())?,
        "placement" => repro::placement::run(&dir, &repro::placement::PlacementParams::default())?,
        "dynamic-k" => {
            // the experiment config is the reproduction (see experiments/repro/dynamic-k)
            let loaded = ExperimentConfig::from_toml(DYNAMIC_K, "experiments/sim-policies.toml")?;
            let results = run_experiment(&loaded, &dir, false)?;
            print_outcome(&results, &dir);
            return Ok(dir);
        }
        "acceptance-temperature" => at::run(
            &dir,
            &if quick {
                at::TemperatureParams::quick()
            } else {
                at::TemperatureParams::full()
            },
        )?,
        "tree-scaling" => ts::run(
            &dir,
            &if quick {
                ts::TreeScalingParams::quick()
            } else {
                ts::TreeScalingParams::full()
            },
        )?,
        "multi-level" => ml::run(
            &dir,
            &if quick {
                ml::MultiLevelParams::quick()
            } else {
                ml::MultiLevelParams::full()
            },
        )?,
        "batching" => batching::run(
            &dir,
            &if quick {
                batching::BatchingParams::quick()
            } else {
                batching::BatchingParams::full()
            },
        )?,
        other => {
            return Err(HarnessError::NotYetAvailable(format!(
                "no reproduction named `{other}`; available: {}",
                REPRODUCTIONS.join(", ")
            )))
        }
    };
    println!("{}", output.markdown.trim_end());
    println!("\nFiles:");
    for f in &output.files {
        println!("  {}", f.display());
    }
    Ok(dir)
}

/// The dtypes `specdec export-hf --dtype` takes.
pub use specdec_models::hf_folder::EXPORT_DTYPES;

/// `specdec export-hf MODEL DIR [--dtype f32|f16|bf16]`: writes the GGUF model `model` (a
/// registry name or a path) as a Hugging Face model folder `dir` (see
/// [`specdec_models::hf_folder::export_gguf`]) and prints what it wrote.
///
/// # Errors
/// An unknown dtype or model, a non-empty `dir`, a GGUF file that does not load; I/O errors.
pub fn export_hf(model: &str, dir: &Path, dtype: &str) -> Result<()> {
    use specdec_models::hf_folder::{export_gguf, parse_dtype};
    let dt = parse_dtype(dtype)?;
    let path = specdec_models::registry::resolve(model)?;
    let file = specdec_models::gguf::GgufFile::open(&path)?;
    let summary = export_gguf(&file, dir, dt)?;
    println!(
        "wrote {} ({} tensors, {:.1} MB of {dtype} weights, config.json, tokenizer.json, \
         tokenizer_config.json); use it as --target {}",
        summary.dir.display(),
        summary.tensors,
        summary.bytes as f64 / 1e6,
        summary.dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--methods` keeps the named methods and the baseline, in the config's order, and
    /// refuses a name the config does not list, naming the ones it does.
    #[test]
    fn chosen_methods_are_kept_with_the_baseline_and_unknown_ones_refused() {
        let text = include_str!("../../experiments/toy-chain.toml");
        let names = |c: &LoadedConfig| -> Vec<String> {
            c.config.methods.iter().map(|m| m.name.clone()).collect()
        };
        let mut loaded = ExperimentConfig::from_toml(text, "<inline>").unwrap();
        let all = names(&loaded);
        assert_eq!(all.len(), 5, "the baseline is added: {all:?}");
        keep_methods(&mut loaded, &[]).unwrap();
        assert_eq!(names(&loaded), all);
        keep_methods(&mut loaded, &["aimd".into(), "chain-k2".into()]).unwrap();
        assert_eq!(
            names(&loaded),
            [all[0].clone(), "chain-k2".into(), "aimd".into()]
        );
        let err = keep_methods(&mut loaded, &["eagle".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("no method `eagle`"), "{err}");
        assert!(err.contains("chain-k2"), "{err}");
    }

    /// `specdec repro`'s list is the README's table of reproductions, in order.
    #[test]
    fn reproductions_match_the_readme() {
        let readme = include_str!("../../experiments/README.md");
        let listed: Vec<&str> = readme
            .lines()
            .filter_map(|l| l.strip_prefix("| [`"))
            .filter_map(|l| l.split_once("`](repro/").map(|(name, _)| name))
            .collect();
        assert_eq!(listed, REPRODUCTIONS);
    }

    #[test]
    fn the_dynamic_k_config_loads() {
        let loaded = ExperimentConfig::from_toml(DYNAMIC_K, "sim-policies.toml").unwrap();
        assert!(loaded.config.simulation.is_some());
    }
}
