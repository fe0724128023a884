//! Shared pieces of the reproductions that run the Qwen2.5-Coder pair (0.5B drafting for 1.5B)
//! on HumanEval prompts: experiment configs built in code, run through the ordinary runner (so
//! every sub-run writes a full results folder with provenance), and measured cost curves.

use crate::methods::kinds::*;
use std::path::Path;

use serde::Serialize;

use crate::config::{
    BaselineRule, DrafterConfig, ExperimentConfig, LoadedConfig, MethodConfig, ModelsConfig,
    PolicyConfig, PromptSet, SamplingConfig,
};
use crate::error::{HarnessError, Result};
use crate::metrics::MethodSummary;
use crate::report::RunResults;
use crate::runner::{run_experiment_on, time_forward, Backend, EngineBackend};
use crate::simulation::CostCurve;

/// The target model of the real-model reproductions.
pub const TARGET: &str = "qwen2.5-coder-1.5b";
/// The draft model of the real-model reproductions.
pub const DRAFT: &str = "qwen2.5-coder-0.5b";

/// Tokens per pass at which the reproductions measure cost curves (a batch of 16 sequences
/// with 4 drafts each verifies 80 tokens).
pub const CURVE_POINTS: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 96];

/// Size of a real-model sub-run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RealSize {
    /// HumanEval prompts (the first N).
    pub prompts: usize,
    /// Tokens generated per prompt.
    pub max_tokens: usize,
}

/// A method: `drafter` with a fixed budget `k` (auto verifier).
pub fn fixed(name: &str, drafter: DrafterConfig, k: usize) -> MethodConfig {
    with_policy(name, drafter, PolicyConfig::of(Fixed { k }))
}

/// A method: `drafter` with `policy` (auto verifier).
pub fn with_policy(name: &str, drafter: DrafterConfig, policy: PolicyConfig) -> MethodConfig {
    MethodConfig::new(name, drafter, Some(policy))
}

/// The plain-decoding baseline.
pub fn baseline() -> MethodConfig {
    MethodConfig::baseline()
}

/// A validated config for the Qwen pair on the first `size.prompts` HumanEval prompts.
///
/// # Errors
/// A config the validator refuses (e.g. a bad method).
pub fn qwen_config(
    name: &str,
    temperature: f64,
    size: RealSize,
    batch_size: usize,
    methods: Vec<MethodConfig>,
) -> Result<LoadedConfig> {
    let mut config = ExperimentConfig {
        name: name.into(),
        description: format!("reproduction `{name}`: {TARGET} with {DRAFT} drafting"),
        models: ModelsConfig {
            target: TARGET.into(),
            draft: Some(DRAFT.into()),
            ..ModelsConfig::default()
        },
        prompts: PromptSet::Humaneval {
            count: Some(size.prompts),
            chat: None,
        },
        sampling: SamplingConfig {
            temperature,
            seed: 7,
            ..SamplingConfig::default()
        },
        max_tokens: size.max_tokens,
        batch_size,
        repeat: 1,
        baseline: BaselineRule::Add,
        schedule: Default::default(),
        toy: None,
        simulation: None,
        op_split: false,
        methods,
    };
    let notes = config.validate(name)?;
    Ok(LoadedConfig {
        config,
        path: None,
        notes,
    })
}

/// Loads the models of `loaded` and runs it into `dir` (progress bar on stderr).
///
/// # Errors
/// A missing model (the message names `scripts/fetch-models.sh`), engine errors.
pub fn run_config(loaded: &LoadedConfig, dir: &Path) -> Result<RunResults> {
    let mut backend = EngineBackend::new(&loaded.config)?;
    run_on(loaded, &mut backend, dir)
}

/// Runs `loaded` on an already loaded backend into `dir`.
///
/// # Errors
/// Engine errors.
pub fn run_on(loaded: &LoadedConfig, backend: &mut dyn Backend, dir: &Path) -> Result<RunResults> {
    eprintln!("running {} into {}", loaded.config.name, dir.display());
    run_experiment_on(loaded, backend, dir, true)
}

/// The summary of `method` in `results`.
///
/// # Errors
/// [`HarnessError::Metrics`] when the method is missing.
pub fn summary<'r>(results: &'r RunResults, method: &str) -> Result<&'r MethodSummary> {
    results
        .summaries
        .iter()
        .find(|s| s.method == method)
        .ok_or_else(|| HarnessError::Metrics(format!("no summary for method `{method}`")))
}

/// A cost curve measured on `model`: milliseconds of one forward over `n` chained tokens (median
/// of 3) at each of `tokens`.
///
/// # Errors
/// Model errors; an empty `tokens`.
pub fn measure_curve(
    model: &mut dyn specdec_models::LanguageModel,
    tokens: &[usize],
) -> Result<CostCurve> {
    let mut ms = Vec::with_capacity(tokens.len());
    for &n in tokens {
        ms.push(time_forward(model, n)? * 1e3);
    }
    let curve = CostCurve::Points {
        tokens: tokens.to_vec(),
        ms,
    };
    curve.validate()?;
    Ok(curve)
}

/// Serialises `value` as pretty JSON into `dir/name` and records the file.
///
/// # Errors
/// I/O and serialisation errors.
pub fn write_json<T: Serialize>(
    dir: &Path,
    name: &str,
    value: &T,
    files: &mut Vec<std::path::PathBuf>,
) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| HarnessError::Metrics(format!("serialising {name}: {e}")))?;
    super::write_text(dir, name, &(text + "\n"), files)
}
