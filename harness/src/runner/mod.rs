//! Runs an experiment: every method over every prompt on a [`Backend`], with a progress bar, then
//! aggregates and writes the results folder.
//!
//! A backend implements [`Backend`]: run one method over a list of requests, batching them as
//! it likes, and return one [`RequestOutcome`] per request with its [`StepRecord`]s.
//! [`backend_for`] picks the backend from the config: the simulation (an injected acceptance
//! process), the toy models (the [`crate::engine`] loop on `specdec_models::toy` tables), or
//! the engine on real models ([`EngineBackend`]: [`models`] opens and places them,
//! [`engine_context`] lends them to the method registry). The toy and engine backends build
//! every method through the registry ([`crate::methods::build_method`]).

mod engine_backend;
pub mod engine_context;
pub mod kv_memory;
pub mod layer_skip_tune;
pub mod models;
mod simulated;
mod toy;

pub use engine_backend::EngineBackend;
pub use engine_context::ModelSet;
pub use kv_memory::{KvMemory, KvPlan};
pub use models::{check_same_tokenizer, time_forward, LoadedModel, Target};
pub use simulated::{require_chain_method, SimulationBackend};
pub use toy::{toy_pair, ToyBackend};

use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};

use crate::config::{ExperimentConfig, LoadedConfig, MethodConfig, ModelSource, Prompt, Schedule};
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
    /// Seconds for the whole method (wall time, or simulated time), one-time set-up excluded; > 0.
    pub elapsed_s: f64,
    /// Seconds of one-time set-up spent in this call (building the method on its first call:
    /// loading draft models, calibrating); ≥ 0, excluded from `elapsed_s`.
    pub setup_s: f64,
    /// One outcome per request, any order.
    pub requests: Vec<RequestOutcome>,
}

/// Something that runs methods: the simulation, the toy models, the real engine.
pub trait Backend {
    /// Short name recorded in provenance (`simulation`, `toy`, `cpu`, `cuda`).
    fn name(&self) -> &str;

    /// Readies every method before the run starts (`first`: the run's first request, to
    /// calibrate on), so that one that cannot be built stops the run before any work. Default:
    /// nothing (methods are built by `run_method`).
    ///
    /// # Errors
    /// A method that cannot be built.
    fn prepare(&mut self, methods: &[MethodConfig], first: Option<&RequestSpec<'_>>) -> Result<()> {
        let _ = (methods, first);
        Ok(())
    }

    /// Runs `method` over `requests` (sampling, max_tokens and batch size come from the config the
    /// backend was built with) and calls `on_request_done(index)` as each request retires.
    ///
    /// Under an interleaved [`Schedule`] the same method is run again on later prompt groups: a
    /// backend may keep what it built for a method (by name) and must then report the building
    /// only as `setup_s` of the first call.
    fn run_method(
        &mut self,
        method: &MethodConfig,
        requests: &[RequestSpec<'_>],
        on_request_done: &mut dyn FnMut(usize),
    ) -> Result<MethodOutcome>;
}

/// Picks the backend for a config: `[simulation]` → [`SimulationBackend`]; target `toy` →
/// [`ToyBackend`]; real models → [`EngineBackend`].
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
    let mut prompts = config.prompts.load(&loaded.base_dir())?;
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
    // Later turns run after every first turn, conditioned on the baseline's answers.
    let phases: [Vec<usize>; 2] = [
        (0..prompts.len())
            .filter(|&i| prompts[i].answer_of.is_none())
            .collect(),
        (0..prompts.len())
            .filter(|&i| prompts[i].answer_of.is_some())
            .collect(),
    ];
    if !phases[1].is_empty() {
        notes.push(
            "later turns continue the baseline's answer to the earlier turn, for every method \
             (the same contexts for all methods)"
                .into(),
        );
    }
    let provenance = Provenance::collect(config, loaded.path.as_deref(), backend.name(), notes)?;
    let repeats = config.repeat.max(1);
    let total = (prompts.len() * config.methods.len() * repeats) as u64;
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
    let methods = &config.methods;
    let mut runs: Vec<MethodRun> = methods
        .iter()
        .map(|method| MethodRun {
            method: method.name.clone(),
            description: method.describe(),
            is_baseline: method.is_baseline(),
            elapsed_s: 0.0,
            setup_s: 0.0,
            repeat_elapsed_s: vec![0.0; repeats],
        })
        .collect();
    let baseline = methods
        .iter()
        .position(MethodConfig::is_baseline)
        .ok_or_else(|| HarnessError::Metrics("no baseline method".into()))?;
    // (repeat, outcome) per method
    let mut outcomes: Vec<Vec<(usize, RequestOutcome)>> = vec![Vec::new(); methods.len()];
    let first = phases[0].first().map(|&index| RequestSpec {
        index,
        prompt: &prompts[index],
    });
    backend.prepare(methods, first.as_ref())?;
    for repeat in 0..repeats {
        for (phase, indices) in phases.iter().enumerate() {
            if phase == 1 && repeat == 0 {
                condition_on_baseline(&mut prompts, indices, &outcomes[baseline])?;
            }
            let specs: Vec<RequestSpec> = indices
                .iter()
                .map(|&index| RequestSpec {
                    index,
                    prompt: &prompts[index],
                })
                .collect();
            for (group, order) in schedule_order(
                config.schedule,
                specs.len(),
                config.batch_size,
                methods.len(),
            ) {
                for m in order {
                    let method = &methods[m];
                    bar.set_message(method.name.clone());
                    let group_specs = &specs[group.clone()];
                    let outcome = backend.run_method(method, group_specs, &mut |_| bar.inc(1))?;
                    check_outcome(method, group_specs, &outcome)?;
                    runs[m].elapsed_s += outcome.elapsed_s;
                    runs[m].repeat_elapsed_s[repeat] += outcome.elapsed_s;
                    runs[m].setup_s += outcome.setup_s;
                    outcomes[m].extend(outcome.requests.into_iter().map(|r| (repeat, r)));
                }
            }
        }
    }
    let mut requests = Vec::new();
    let mut steps = Vec::new();
    for (method, mut outs) in methods.iter().zip(outcomes) {
        outs.sort_by_key(|(repeat, r)| (*repeat, r.request));
        for (repeat, mut r) in outs {
            for s in &mut r.steps {
                s.repeat = repeat;
            }
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
            rec.repeat = repeat;
            rec.category = prompt.category.clone();
            rec.turn = prompt.turn;
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

/// Gives each later-turn prompt at `indices` its conversation so far: the earlier turn's own
/// history, then (the earlier turn's text, the baseline's answer to it) from the baseline's
/// first-repeat outcomes `baseline`.
///
/// # Errors
/// When the baseline has no text for the earlier turn (the simulation produces none).
fn condition_on_baseline(
    prompts: &mut [Prompt],
    indices: &[usize],
    baseline: &[(usize, RequestOutcome)],
) -> Result<()> {
    for &i in indices {
        let Some(first) = prompts[i].answer_of else {
            continue;
        };
        let answer = baseline
            .iter()
            .find(|(repeat, r)| *repeat == 0 && r.request == first)
            .and_then(|(_, r)| r.text.clone())
            .ok_or_else(|| {
                HarnessError::Metrics(format!(
                    "prompt `{}` continues the baseline's answer to `{}`, but the backend gave \
                     no text for it (multi-turn prompts need a backend with a tokenizer)",
                    prompts[i].id, prompts[first].id
                ))
            })?;
        let mut history = prompts[first].history.clone();
        history.push((prompts[first].text.clone(), answer));
        prompts[i].history = history;
    }
    Ok(())
}

/// The order of an experiment's backend calls: `(prompt range, method indices)` per round.
/// [`Schedule::ByMethod`]: one round per method over all prompts; [`Schedule::Interleaved`]:
/// one round per group of `batch_size` prompts, running every method, the order rotated by the
/// group's index so that no method is always first.
fn schedule_order(
    schedule: Schedule,
    prompts: usize,
    batch_size: usize,
    methods: usize,
) -> Vec<(std::ops::Range<usize>, Vec<usize>)> {
    match schedule {
        Schedule::ByMethod => (0..methods).map(|m| (0..prompts, vec![m])).collect(),
        Schedule::Interleaved => {
            let group = batch_size.max(1);
            (0..prompts.div_ceil(group))
                .map(|g| {
                    let range = g * group..((g + 1) * group).min(prompts);
                    (range, (0..methods).map(|m| (m + g) % methods).collect())
                })
                .collect()
        }
    }
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
    let mut unseen: std::collections::HashSet<usize> = specs.iter().map(|s| s.index).collect();
    for r in &outcome.requests {
        if !unseen.remove(&r.request) {
            return bad(format!(
                "request index {} was not asked for or is repeated",
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (prompt, method) pair exactly once, in groups of the batch size.
    fn pairs(rounds: &[(std::ops::Range<usize>, Vec<usize>)]) -> Vec<(usize, usize)> {
        let mut all: Vec<(usize, usize)> = rounds
            .iter()
            .flat_map(|(r, ms)| ms.iter().flat_map(move |&m| r.clone().map(move |p| (p, m))))
            .collect();
        all.sort_unstable();
        all
    }

    #[test]
    fn schedules_cover_every_prompt_and_method_once() {
        let expected: Vec<(usize, usize)> =
            (0..7).flat_map(|p| (0..3).map(move |m| (p, m))).collect();
        for batch in [1, 2, 3, 7, 9] {
            for schedule in [Schedule::Interleaved, Schedule::ByMethod] {
                assert_eq!(
                    pairs(&schedule_order(schedule, 7, batch, 3)),
                    expected,
                    "{schedule:?} batch {batch}"
                );
            }
        }
    }

    #[test]
    fn interleaved_rounds_are_batch_groups_with_rotating_method_order() {
        let rounds = schedule_order(Schedule::Interleaved, 5, 2, 3);
        let ranges: Vec<_> = rounds.iter().map(|(r, _)| r.clone()).collect();
        assert_eq!(ranges, vec![0..2, 2..4, 4..5]);
        let orders: Vec<_> = rounds.iter().map(|(_, o)| o.clone()).collect();
        assert_eq!(orders, vec![vec![0, 1, 2], vec![1, 2, 0], vec![2, 0, 1]]);
        let by_method = schedule_order(Schedule::ByMethod, 5, 2, 3);
        assert_eq!(
            by_method,
            vec![(0..5, vec![0]), (0..5, vec![1]), (0..5, vec![2])]
        );
    }
}
