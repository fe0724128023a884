//! Runs an experiment: every method over every prompt on a [`Backend`], with a progress bar, then
//! aggregates and writes the results folder.
//!
//! The engine plugs in here: it implements [`Backend`] (run one method over a list of requests,
//! batching them as it likes, and return one [`RequestOutcome`] per request with its
//! [`StepRecord`]s). [`backend_for`] picks the backend from the config: the simulation, the toy
//! models (the [`crate::engine`] loop on `specdec_models::toy` tables), or — until a model
//! runner backend is wired — a
//! [`HarnessError::NotYetAvailable`] for real models.

mod engine_backend;
pub mod layer_skip_tune;
mod simulated;
mod toy;

pub use engine_backend::{
    build_method, check_same_tokenizer, time_forward, BuiltMethod, EngineBackend, LoadedModel,
    ModelSet, SEQUOIA_ALPHAS, SEQUOIA_MAX_DEPTH,
};
pub use simulated::SimulationBackend;
pub use toy::{toy_pair, ToyBackend};

use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};

use crate::config::{ExperimentConfig, LoadedConfig, MethodConfig, ModelSource, Prompt};
use crate::error::{HarnessError, Result};
use crate::metrics::{summarize, MethodRun, RequestRecord, StepRecord};
use crate::report::{write_results, Provenance, RunResults};

/// One request handed to a backend.
#[derive(Debug, Clone, Copy)]
pub struct RequestSpec<'a> {
    /// Index of the prompt in the experiment's prompt list (the `request` field of its records).
    pub index: usize,
    /// The prompt.
    pub prompt: &'a Prompt,
}

/// What a backend reports for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOutcome {
    /// The request's index ([`RequestSpec::index`]).
    pub request: usize,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Seconds from admission to retirement.
    pub elapsed_s: f64,
    /// One record per target pass, in order, each with `method` and `request` set to this
    /// method's name and this request's index, `step` numbered 0, 1, ...
    pub steps: Vec<StepRecord>,
    /// Generated text, when the backend has a tokenizer.
    pub text: Option<String>,
}

/// What a backend reports for one method over all its requests.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodOutcome {
    /// Seconds for the whole method (wall time, or simulated time); > 0.
    pub elapsed_s: f64,
    /// One outcome per request, any order.
    pub requests: Vec<RequestOutcome>,
}

/// Something that runs methods: the simulation, the toy models, the real engine.
pub trait Backend {
    /// Short name recorded in provenance (`simulation`, `toy`, `cpu`, `cuda`).
    fn name(&self) -> &str;

    /// Runs `method` over `requests` (sampling, max_tokens and batch size come from the config the
    /// backend was built with) and calls `on_request_done(index)` as each request retires.
    fn run_method(
        &mut self,
        method: &MethodConfig,
        requests: &[RequestSpec<'_>],
        on_request_done: &mut dyn FnMut(usize),
    ) -> Result<MethodOutcome>;
}

/// Picks the backend for a config: `[simulation]` → [`SimulationBackend`]; target `toy` →
/// [`ToyBackend`]; real models → [`HarnessError::NotYetAvailable`] until the engine lands.
pub fn backend_for(config: &ExperimentConfig) -> Result<Box<dyn Backend>> {
    if let Some(sim) = &config.simulation {
        return Ok(Box::new(SimulationBackend::new(
            sim.clone(),
            config.max_tokens,
            config.sampling.seed,
        )));
    }
    let target = ModelSource::parse(&config.models.target).map_err(HarnessError::Simulation)?;
    if target == ModelSource::Toy {
        return Ok(Box::new(ToyBackend::new(config)?));
    }
    Ok(Box::new(EngineBackend::new(config)?))
}

/// Runs a loaded config on the backend [`backend_for`] picks, and writes the results to
/// `out_dir`. Shows a progress bar over prompts × methods when `progress`.
pub fn run_experiment(loaded: &LoadedConfig, out_dir: &Path, progress: bool) -> Result<RunResults> {
    let mut backend = backend_for(&loaded.config)?;
    run_experiment_on(loaded, backend.as_mut(), out_dir, progress)
}

/// Runs a loaded config on a given backend and writes the results to `out_dir`.
pub fn run_experiment_on(
    loaded: &LoadedConfig,
    backend: &mut dyn Backend,
    out_dir: &Path,
    progress: bool,
) -> Result<RunResults> {
    let config = &loaded.config;
    let prompts = config.prompts.load(&loaded.base_dir())?;
    if prompts.is_empty() {
        return Err(HarnessError::ConfigInvalid {
            origin: loaded
                .path
                .as_ref()
                .map_or("<inline>".into(), |p| p.display().to_string()),
            field: "prompts".into(),
            problem: "the prompt set is empty".into(),
        });
    }
    let mut notes = loaded.notes.clone();
    if config.batch_size > 1 && backend.name() == "simulation" {
        notes.push(format!(
            "batch_size {} is not modelled by the simulation: requests run one at a time",
            config.batch_size
        ));
    }
    let provenance = Provenance::collect(config, loaded.path.as_deref(), backend.name(), notes)?;
    let specs: Vec<RequestSpec> = prompts
        .iter()
        .enumerate()
        .map(|(index, prompt)| RequestSpec { index, prompt })
        .collect();
    let total = (prompts.len() * config.methods.len()) as u64;
    let bar = if progress {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template(
                "{msg:>16} [{bar:40}] {pos}/{len} prompt×method runs ({elapsed}, eta {eta})",
            )
            .map_err(|e| HarnessError::Metrics(e.to_string()))?
            .progress_chars("=> "),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let mut runs = Vec::new();
    let mut requests = Vec::new();
    let mut steps = Vec::new();
    for method in &config.methods {
        bar.set_message(method.name.clone());
        let outcome = backend.run_method(method, &specs, &mut |_| bar.inc(1))?;
        check_outcome(method, &specs, &outcome)?;
        runs.push(MethodRun {
            method: method.name.clone(),
            description: method.describe(),
            is_baseline: method.is_baseline(),
            elapsed_s: outcome.elapsed_s,
        });
        let mut outs = outcome.requests;
        outs.sort_by_key(|r| r.request);
        for r in outs {
            let prompt = &prompts[r.request];
            let mut rec = RequestRecord::from_steps(
                &method.name,
                r.request,
                &prompt.id,
                r.prompt_tokens,
                r.elapsed_s,
                &r.steps,
            );
            rec.text = r.text;
            requests.push(rec);
            steps.extend(r.steps);
        }
    }
    bar.finish_and_clear();
    let summaries = summarize(&runs, &requests, &steps)?;
    let results = RunResults {
        provenance,
        runs,
        requests,
        steps,
        summaries,
    };
    write_results(out_dir, &results)?;
    Ok(results)
}

/// Refuses a backend outcome whose records do not line up with what was asked.
fn check_outcome(
    method: &MethodConfig,
    specs: &[RequestSpec<'_>],
    outcome: &MethodOutcome,
) -> Result<()> {
    let bad = |m: String| {
        Err(HarnessError::Metrics(format!(
            "method `{}`: {m}",
            method.name
        )))
    };
    if !(outcome.elapsed_s.is_finite() && outcome.elapsed_s > 0.0) {
        return bad(format!("elapsed {} s is not > 0", outcome.elapsed_s));
    }
    if outcome.requests.len() != specs.len() {
        return bad(format!(
            "{} request outcomes for {} requests",
            outcome.requests.len(),
            specs.len()
        ));
    }
    let mut seen = vec![false; specs.len()];
    for r in &outcome.requests {
        if r.request >= specs.len() || std::mem::replace(&mut seen[r.request], true) {
            return bad(format!(
                "request index {} is out of range or repeated",
                r.request
            ));
        }
        for (i, s) in r.steps.iter().enumerate() {
            if s.method != method.name || s.request != r.request || s.step != i {
                return bad(format!(
                    "step record {i} of request {} is labelled ({}, {}, {})",
                    r.request, s.method, s.request, s.step
                ));
            }
            if s.accepted > s.draft_depth || s.draft_depth > s.proposed {
                return bad(format!(
                    "step {i} of request {} accepts {} of depth {} with {} proposed",
                    r.request, s.accepted, s.draft_depth, s.proposed
                ));
            }
        }
    }
    Ok(())
}
