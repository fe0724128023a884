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
use crate::runner::run_experiment;
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
    let optional = [
        files::CATEGORIES_CSV,
        files::CATEGORIES_SVG,
        files::SPEEDUP_BY_K_SVG,
        files::TAU_BY_K_SVG,
    ];
    for f in files::ALL.iter().chain(&optional) {
        if files::ALL.contains(f) || dir.join(f).exists() {
            println!("  {}", dir.join(f).display());
        }
    }
}

/// `specdec run CONFIG [--out DIR]`: loads and validates the config, runs it (progress bar unless
/// `quiet`), writes the results folder (default `results/NAME`) and prints the summary.
pub fn run(config: &Path, out: Option<&Path>, quiet: bool) -> Result<PathBuf> {
    let loaded = ExperimentConfig::load(config)?;
    for note in &loaded.notes {
        eprintln!("note: {note}");
    }
    let dir = out.map_or_else(
        || PathBuf::from("results").join(&loaded.config.name),
        Path::to_path_buf,
    );
    let results = run_experiment(&loaded, &dir, !quiet)?;
    print_outcome(&results, &dir);
    Ok(dir)
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
        methods: a
            .ks
            .iter()
            .map(|&k| {
                let fixed = Some(PolicyConfig::of(Fixed { k }));
                MethodConfig::new(format!("chain-k{k}"), DrafterConfig::of(Chain {}), fixed)
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
    let dir = out.map_or_else(|| PathBuf::from("results/simulate"), Path::to_path_buf);
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

#[cfg(test)]
mod tests {
    use super::*;

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
