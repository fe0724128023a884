//! The top-level experiment config, its loading and validation.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{MethodConfig, ModelSource, ModelsConfig, PromptSet};
use crate::error::{HarnessError, Result};
use crate::methods::validate_method;
use crate::simulation::SimulationConfig;
use specdec_kernels::cuda::Device;

/// A whole experiment: what to run and how. See the module docs for the TOML layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentConfig {
    /// Short name; the default results folder is `results/NAME`.
    pub name: String,
    /// Free text shown in the summary.
    #[serde(default)]
    pub description: String,
    /// Target and draft models.
    #[serde(default)]
    pub models: ModelsConfig,
    /// Which prompts to run.
    pub prompts: PromptSet,
    /// Sampling settings shared by every method.
    #[serde(default)]
    pub sampling: SamplingConfig,
    /// Tokens to generate per prompt (1..=[`MAX_TOKENS_LIMIT`]).
    pub max_tokens: usize,
    /// Requests in flight at once (1..=[`MAX_BATCH_SIZE`]).
    #[serde(default = "one")]
    pub batch_size: usize,
    /// How many times the whole schedule runs (≥ 1): every method over every prompt, `repeat`
    /// times, with the same seed (the same work; the spread of tokens/s over repeats is the
    /// run-to-run noise) [default: 1].
    #[serde(default = "one")]
    pub repeat: usize,
    /// What to do when no plain-decoding baseline is listed.
    #[serde(default)]
    pub baseline: BaselineRule,
    /// In which order methods and prompts run [default: interleaved].
    #[serde(default)]
    pub schedule: Schedule,
    /// Simulation mode: when present, an injected acceptance process and cost model replace the
    /// models.
    #[serde(default)]
    pub simulation: Option<SimulationConfig>,
    /// The toy models used when `models.target = "toy"` (defaults when absent).
    #[serde(default)]
    pub toy: Option<ToyConfig>,
    /// Record each target forward split into its ops (`steps.jsonl`'s `ops`, `forward_ops.csv`
    /// and a table in `summary.md`): the CPU forward of a target of one rank, one request at a
    /// time (`batch_size = 1`); refused for a simulation, the toy models, or a target without
    /// an op clock. The clock slows the forward by a few percent [default: false].
    #[serde(default)]
    pub op_split: bool,
    /// The method configurations to compare (the baseline among them after validation).
    pub methods: Vec<MethodConfig>,
}

fn one() -> usize {
    1
}

/// The most tokens a config or flag may ask to generate per prompt (`max_tokens`): 1,048,576
/// (2^20). No model this project runs has a longer context (the engine also refuses what
/// passes its model's context), and a toy or simulated run, which has no context, stops within
/// it: each generated token costs at most one step record, so 2^20 bounds a request's records
/// (about 200 MB of JSONL) and its run time.
pub const MAX_TOKENS_LIMIT: usize = 1 << 20;

/// The most requests a config may keep in flight at once (`batch_size`): 256. Each request in
/// flight holds its own KV cache in the target and every draft model; the batching study
/// (`specdec repro batching`) finds speculation stops paying by batch 16.
pub const MAX_BATCH_SIZE: usize = 256;

/// The most synthetic prompts a config may ask for (`prompts.count` of a synthetic set):
/// 100,000.
pub const MAX_SYNTHETIC_PROMPTS: usize = 100_000;

/// Checks that an experiment name is one plain folder name, so `results/NAME` stays inside
/// `results/`: no `/` or `\\`, not `.` or `..`, no leading `.` or `-`, no control characters.
///
/// # Errors
/// The message names what is wrong.
pub fn check_experiment_name(name: &str) -> std::result::Result<(), String> {
    if name.contains(['/', '\\']) || name == "." || name == ".." {
        return Err(format!(
            "`{name}` would leave the results folder: use a plain folder name (no `/`, `\\`, `..`)"
        ));
    }
    if name.starts_with(['.', '-']) || name.chars().any(char::is_control) {
        return Err(format!(
            "`{}` is not a plain folder name (no leading `.` or `-`, no control characters)",
            name.escape_debug()
        ));
    }
    Ok(())
}

/// Checks `max_tokens` (a config key or flag, named `field`) against [`MAX_TOKENS_LIMIT`].
///
/// # Errors
/// The message names `field`, the value and the limit.
pub fn check_max_tokens(field: &str, max_tokens: usize) -> std::result::Result<(), String> {
    match max_tokens {
        0 => Err(format!("{field} must be at least 1")),
        n if n > MAX_TOKENS_LIMIT => Err(format!(
            "{field} = {n} is over the limit of {MAX_TOKENS_LIMIT} tokens per prompt"
        )),
        _ => Ok(()),
    }
}

/// What to do when the methods list holds no plain-decoding baseline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BaselineRule {
    /// Add a method named `baseline` (drafter `none`) at the front.
    #[default]
    Add,
    /// Refuse the config.
    Require,
}

/// In which order an experiment runs its methods over its prompts.
///
/// Wall-clock speedups compare methods that ran at different times, so anything that drifts
/// with time (other load, clock boost, thermal state, page cache) biases a method-after-method
/// run against whoever ran during the bad stretch. Interleaving spreads every method over the
/// whole run instead.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// The prompts are cut into groups of `batch_size`; every method runs on the first group,
    /// then every method on the next, the method order rotating by one from group to group.
    /// Each method is built (drafters loaded, calibrated) once, before its first group.
    #[default]
    Interleaved,
    /// Each method runs over all prompts before the next method starts (config order).
    ByMethod,
}

/// The `[toy]` table: a seeded pair of toy probability-table models (`specdec_models::toy`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToyConfig {
    /// Vocabulary size, 2..=64 [default: 8].
    #[serde(default = "eight")]
    pub vocab: usize,
    /// Context length the tables condition on, 0..=3 (0: context-free, where the acceptance
    /// rate of chain rejection sampling is exactly Σ min(p, q)) [default: 1].
    #[serde(default = "one")]
    pub order: usize,
    /// Seed of the tables (target from `seed`, draft from `seed + 1`) [default: 0].
    #[serde(default)]
    pub seed: u64,
    /// Every entry positive (no zeros, no one-hot rows) [default: false].
    #[serde(default)]
    pub dense: bool,
}

fn eight() -> usize {
    8
}

impl Default for ToyConfig {
    fn default() -> Self {
        ToyConfig {
            vocab: 8,
            order: 1,
            seed: 0,
            dense: false,
        }
    }
}

/// The `[sampling]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingConfig {
    /// Softmax temperature (≥ 0; 0 means greedy).
    #[serde(default)]
    pub temperature: f64,
    /// Keep only the `top_k` most probable tokens (≥ 1) when set.
    #[serde(default)]
    pub top_k: Option<usize>,
    /// Nucleus sampling mass in (0, 1] when set.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Drop tokens below `min_p` times the most probable one's probability, in [0, 1], when set.
    #[serde(default)]
    pub min_p: Option<f64>,
    /// Seed of every random draw of the run.
    #[serde(default)]
    pub seed: u64,
    /// Repetition penalty r > 0 on the target's and the drafts' logits, each row with its own
    /// history (1 = off; see [`crate::engine::Penalties`]) [default: 1].
    #[serde(default = "no_repetition_penalty")]
    pub repetition_penalty: f32,
    /// Frequency penalty per occurrence (0 = off) [default: 0].
    #[serde(default)]
    pub frequency_penalty: f32,
    /// Presence penalty (0 = off) [default: 0].
    #[serde(default)]
    pub presence_penalty: f32,
}

fn no_repetition_penalty() -> f32 {
    1.0
}

impl SamplingConfig {
    /// The kernels' sampling parameters of this table (temperature, top-k, top-p, min-p).
    pub fn params(&self) -> specdec_kernels::sampling::SamplingParams {
        specdec_kernels::sampling::SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
        }
    }

    /// The penalties of this table.
    pub fn penalties(&self) -> crate::engine::Penalties {
        crate::engine::Penalties {
            repetition: self.repetition_penalty,
            frequency: self.frequency_penalty,
            presence: self.presence_penalty,
        }
    }
}

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            min_p: None,
            seed: 0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
        }
    }
}

/// A loaded, validated config with where it came from.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// The config, baseline included.
    pub config: ExperimentConfig,
    /// The file it was read from (`None` for inline text).
    pub path: Option<PathBuf>,
    /// Notes for the user (e.g. "added the baseline").
    pub notes: Vec<String>,
}

impl LoadedConfig {
    /// Where the config came from, as errors name it: its path, or `<inline>`.
    pub fn origin(&self) -> String {
        self.path
            .as_ref()
            .map_or_else(|| "<inline>".into(), |p| p.display().to_string())
    }

    /// The folder relative paths resolve against (the config's folder, or `.`).
    pub fn base_dir(&self) -> PathBuf {
        self.path
            .as_ref()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from("."))
    }
}

/// Most tensor-parallel ranks a config may ask for.
pub const MAX_TENSOR_PARALLEL: usize = 64;

impl ExperimentConfig {
    /// Reads, parses and validates a config file (see [`ExperimentConfig::from_toml`]).
    pub fn load(path: &Path) -> Result<LoadedConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| HarnessError::io(path, e))?;
        let mut loaded = Self::from_toml(&text, &path.display().to_string())?;
        loaded.path = Some(path.to_path_buf());
        Ok(loaded)
    }

    /// Parses and validates config text. `origin` names the source in errors. Unknown keys are
    /// refused by [`HarnessError::ConfigParse`] naming the key; bad values by
    /// [`HarnessError::ConfigInvalid`] naming the field. A missing baseline is added or refused
    /// per [`BaselineRule`].
    pub fn from_toml(text: &str, origin: &str) -> Result<LoadedConfig> {
        let mut config: ExperimentConfig =
            toml::from_str(text).map_err(|e| HarnessError::ConfigParse {
                origin: origin.to_string(),
                message: e.to_string().trim_end().to_string(),
            })?;
        let notes = config.validate(origin)?;
        Ok(LoadedConfig {
            config,
            path: None,
            notes,
        })
    }

    /// Checks every value, and adds the baseline when missing and allowed. Returns notes on what
    /// was changed.
    pub fn validate(&mut self, origin: &str) -> Result<Vec<String>> {
        let invalid = |field: &str, problem: String| HarnessError::ConfigInvalid {
            origin: origin.to_string(),
            field: field.to_string(),
            problem,
        };
        let mut notes = Vec::new();
        if self.name.trim().is_empty() {
            return Err(invalid("name", "must not be empty".into()));
        }
        check_experiment_name(&self.name).map_err(|e| invalid("name", e))?;
        check_max_tokens("max_tokens", self.max_tokens).map_err(|e| invalid("max_tokens", e))?;
        if !(1..=MAX_BATCH_SIZE).contains(&self.batch_size) {
            return Err(invalid(
                "batch_size",
                format!("{} is not in 1..={MAX_BATCH_SIZE}", self.batch_size),
            ));
        }
        if self.repeat == 0 {
            return Err(invalid("repeat", "must be at least 1".into()));
        }
        if self.op_split {
            if self.batch_size != 1 {
                return Err(invalid(
                    "op_split",
                    format!(
                        "splits the forward of one request at a time; batch_size is {}",
                        self.batch_size
                    ),
                ));
            }
            if self.simulation.is_some() || self.models.target == "toy" {
                return Err(invalid(
                    "op_split",
                    "times a model's forward; a simulation or the toy models have none".into(),
                ));
            }
        }
        let s = &self.sampling;
        if !(s.temperature.is_finite() && s.temperature >= 0.0) {
            return Err(invalid(
                "sampling.temperature",
                format!("{} is not a finite number ≥ 0", s.temperature),
            ));
        }
        if s.top_k == Some(0) {
            return Err(invalid("sampling.top_k", "must be at least 1".into()));
        }
        if let Some(p) = s.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(invalid("sampling.top_p", format!("{p} is not in (0, 1]")));
            }
        }
        if let Some(m) = s.min_p {
            if !(0.0..=1.0).contains(&m) {
                return Err(invalid("sampling.min_p", format!("{m} is not in [0, 1]")));
            }
        }
        s.penalties()
            .validate()
            .map_err(|e| invalid("sampling.repetition_penalty", e.to_string()))?;
        if !s.penalties().is_off() && self.simulation.is_some() {
            return Err(invalid(
                "sampling",
                "penalties act on model logits; the simulation has none".into(),
            ));
        }
        let target =
            ModelSource::parse(&self.models.target).map_err(|e| invalid("models.target", e))?;
        let device = specdec_models::llama::parse_device(&self.models.device)
            .map_err(|e| invalid("models.device", e.to_string()))?;
        if let Some(d) = self.models.draft.as_ref().filter(|d| *d != "layer_skip") {
            ModelSource::parse(d).map_err(|e| invalid("models.draft", e))?;
        }
        if let Some(kv_memory) = &self.models.kv_memory {
            crate::runner::KvMemory::parse(kv_memory)
                .map_err(|e| invalid("models.kv_memory", e.to_string()))?;
            if matches!(target, ModelSource::Simulated | ModelSource::Toy)
                || self.simulation.is_some()
            {
                return Err(invalid(
                    "models.kv_memory",
                    "only real models (run by the engine) have a KV cache to size".into(),
                ));
            }
        }
        if let Some(kv_dtype) = &self.models.kv_dtype {
            let dtype = crate::runner::parse_kv_dtype(kv_dtype, &self.models.device)
                .map_err(|e| invalid("models.kv_dtype", e.to_string()))?;
            if dtype != specdec_kernels::kv::KvDtype::F32
                && (matches!(target, ModelSource::Simulated | ModelSource::Toy)
                    || self.simulation.is_some())
            {
                return Err(invalid(
                    "models.kv_dtype",
                    "only real models (run by the engine) have a KV cache to store".into(),
                ));
            }
        }
        if let Some(ranks) = self.models.tensor_parallel {
            if !(1..=MAX_TENSOR_PARALLEL).contains(&ranks) {
                return Err(invalid(
                    "models.tensor_parallel",
                    format!("{ranks} is not in 1..={MAX_TENSOR_PARALLEL}"),
                ));
            }
            if ranks > 1 {
                if matches!(target, ModelSource::Simulated | ModelSource::Toy)
                    || self.simulation.is_some()
                {
                    return Err(invalid(
                        "models.tensor_parallel",
                        "only real models (run by the engine) are split into ranks".into(),
                    ));
                }
                if let Device::Cuda(ordinal @ 1..) = device {
                    return Err(invalid(
                        "models.tensor_parallel",
                        format!(
                            "{ranks} GPU ranks take CUDA devices 0..{ranks}, one each; they \
                             cannot start at cuda:{ordinal} (use device = \"cuda\")"
                        ),
                    ));
                }
            }
        }
        if target == ModelSource::Simulated && self.simulation.is_none() {
            return Err(invalid(
                "simulation",
                "models.target is `simulated` (the default) but there is no [simulation] table; \
                 name a target model or add [simulation]"
                    .into(),
            ));
        }
        if let Some(toy) = &self.toy {
            if !(2..=64).contains(&toy.vocab) {
                return Err(invalid(
                    "toy.vocab",
                    format!("{} is not in 2..=64", toy.vocab),
                ));
            }
            if toy.order > 3 {
                return Err(invalid(
                    "toy.order",
                    format!("{} is not in 0..=3", toy.order),
                ));
            }
        }
        if let Some(sim) = &self.simulation {
            sim.validate()
                .map_err(|e| invalid("simulation", e.to_string()))?;
        }
        match &self.prompts {
            PromptSet::Inline { texts, .. } if texts.is_empty() => {
                return Err(invalid("prompts.texts", "holds no prompt".into()))
            }
            PromptSet::Synthetic { count, .. } if !(1..=MAX_SYNTHETIC_PROMPTS).contains(count) => {
                return Err(invalid(
                    "prompts.count",
                    format!("{count} is not in 1..={MAX_SYNTHETIC_PROMPTS}"),
                ))
            }
            PromptSet::Synthetic { prompt_tokens, .. } if *prompt_tokens > MAX_TOKENS_LIMIT => {
                return Err(invalid(
                    "prompts.prompt_tokens",
                    format!("{prompt_tokens} is over the limit of {MAX_TOKENS_LIMIT} tokens"),
                ))
            }
            PromptSet::Humaneval { count: Some(0), .. }
            | PromptSet::File { count: Some(0), .. } => {
                return Err(invalid("prompts.count", "must be at least 1".into()))
            }
            PromptSet::Mtbench {
                per_category: Some(0),
                ..
            }
            | PromptSet::File {
                per_category: Some(0),
                ..
            } => return Err(invalid("prompts.per_category", "must be at least 1".into())),
            PromptSet::Mtbench { turns: Some(t), .. } | PromptSet::File { turns: Some(t), .. }
                if !(1..=2).contains(t) =>
            {
                return Err(invalid("prompts.turns", format!("{t} is not 1 or 2")))
            }
            _ => {}
        }
        let mut names = HashSet::new();
        for (i, m) in self.methods.iter_mut().enumerate() {
            let at = |f: &str| format!("methods[{i}]{f}");
            if m.name.trim().is_empty() {
                return Err(invalid(&at(".name"), "must not be empty".into()));
            }
            if !names.insert(m.name.clone()) {
                return Err(invalid(
                    &at(".name"),
                    format!("`{}` is used by two methods", m.name),
                ));
            }
            validate_method(m).map_err(|p| match p.is_parse {
                true => HarnessError::ConfigParse {
                    origin: origin.to_string(),
                    message: format!("{}: {}", at(&p.field), p.problem),
                },
                false => invalid(&at(&p.field), p.problem),
            })?;
            let needs_draft_model = m.needs_draft_model();
            if needs_draft_model && self.models.draft.is_none() && self.simulation.is_none() {
                return Err(invalid(
                    "models.draft",
                    format!(
                        "method `{}` uses a draft model but models.draft is not set",
                        m.name
                    ),
                ));
            }
        }
        let baselines = self.methods.iter().filter(|m| m.is_baseline()).count();
        match (baselines, self.baseline) {
            (0, BaselineRule::Require) => {
                return Err(invalid(
                    "methods",
                    "no plain-decoding baseline (drafter = { kind = \"plain\" }) and baseline = \"require\""
                        .into(),
                ))
            }
            (0, BaselineRule::Add) => {
                let mut b = MethodConfig::baseline();
                while names.contains(&b.name) {
                    b.name.push('_');
                }
                notes.push(format!(
                    "added the plain-decoding baseline as method `{}` (set baseline = \"require\" to refuse instead)",
                    b.name
                ));
                self.methods.insert(0, b);
            }
            (1, _) => {}
            (n, _) => {
                return Err(invalid(
                    "methods",
                    format!("{n} plain-decoding baselines; keep exactly one"),
                ))
            }
        }
        if self.methods.len() < 2 {
            notes.push("only the baseline is listed: nothing to compare".into());
        }
        Ok(notes)
    }

    /// The baseline method (present after validation).
    pub fn baseline_method(&self) -> Option<&MethodConfig> {
        self.methods.iter().find(|m| m.is_baseline())
    }
}
