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

pub use engine_backend::{
    check_tensor_parallel, EngineBackend, MinAcceptance, DEFAULT_MIN_ACCEPTANCE,
};
pub use engine_context::ModelSet;
pub use kv_memory::{parse_kv_dtype, KvMemory, KvPlan};
pub use models::{check_same_tokenizer, time_forward, LoadedModel, Target};
pub use simulated::{require_chain_method, SimulationBackend};
pub use toy::{toy_pair, ToyBackend};

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};

use crate::config::{ExperimentConfig, LoadedConfig, MethodConfig, ModelSource, Prompt, Schedule};
use crate::error::{HarnessError, Result};
use crate::metrics::{summarize, MethodRun, RequestRecord, StepRecord};
use crate::report::{
    append_jsonl, files, read_appended_jsonl, write_jsonl, write_provenance, write_results,
    Provenance, RunResults, BUILD_COMMIT,
};

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

/// Runs a loaded config on a given backend and writes the results to `out_dir` (never stopped
/// early: see [`run_experiment_with`]).
pub fn run_experiment_on(
    loaded: &LoadedConfig,
    backend: &mut dyn Backend,
    out_dir: &Path,
    progress: bool,
) -> Result<RunResults> {
    let never = AtomicBool::new(false);
    let control = RunControl {
        progress,
        stop: &never,
    };
    run_experiment_with(loaded, backend, out_dir, &control, None)
}

/// How a run is driven: a progress bar or not, and the flag that stops it early (set by
/// SIGINT / SIGTERM in `specdec run`, see [`stop_on_signals`]).
#[derive(Debug, Clone, Copy)]
pub struct RunControl<'a> {
    /// Show a progress bar over prompts × methods.
    pub progress: bool,
    /// Checked before every backend call: once set, the run stops there, keeping what finished.
    pub stop: &'a AtomicBool,
}

/// What an earlier, incomplete run of a results folder finished (read by [`resume_experiment`]).
#[derive(Debug, Clone)]
pub struct Finished {
    /// Its provenance (the config as run).
    pub provenance: Provenance,
    /// Its per-method elapsed and set-up seconds so far.
    pub runs: Vec<MethodRun>,
    /// The requests it finished.
    pub requests: Vec<RequestRecord>,
    /// Their steps.
    pub steps: Vec<StepRecord>,
}

/// A flag set by SIGINT and SIGTERM; a second signal ends the process at once (exit status
/// 130), what finished being on disk already.
///
/// # Errors
/// [`HarnessError::InvalidEngine`] when the handlers cannot be installed.
pub fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // the order matters: the shutdown fires only when the flag is already set
        signal_hook::flag::register_conditional_shutdown(signal, 130, Arc::clone(&flag))
            .and_then(|_| signal_hook::flag::register(signal, Arc::clone(&flag)))
            .map_err(|e| {
                HarnessError::InvalidEngine(format!("cannot install the signal handlers: {e}"))
            })?;
    }
    Ok(flag)
}

/// Runs a loaded config on `backend`, writing into `out_dir` as it goes, and returns the
/// results.
///
/// The folder is written before any compute (so an unwritable path fails at once):
/// `provenance.json` marked incomplete, and empty `requests.jsonl` / `steps.jsonl` (or, when
/// resuming, `previous`'s records). After each backend call the finished requests' steps and
/// records are appended and flushed to the disk, and `runs.jsonl` rewritten. A method whose run
/// fails is recorded in the provenance's `failures` and left out from then on; the others carry
/// on. A set `control.stop` ends the run before the next backend call. At the end the records
/// of the methods that did not fail are rewritten, summarised (when a baseline has records)
/// and the derived files written, each through a temporary name; the provenance says whether
/// the run is complete.
///
/// # Errors
/// Prompts that cannot be loaded, a backend that cannot prepare, files that cannot be written.
/// A failed method or a stop is not an error here: see [`Provenance::complete`].
pub fn run_experiment_with(
    loaded: &LoadedConfig,
    backend: &mut dyn Backend,
    out_dir: &Path,
    control: &RunControl<'_>,
    previous: Option<Finished>,
) -> Result<RunResults> {
    let config = &loaded.config;
    let mut prompts = config.prompts.load(&loaded.base_dir())?;
    if prompts.is_empty() {
        return Err(HarnessError::ConfigInvalid {
            origin: loaded.origin(),
            field: "prompts".into(),
            problem: "the prompt set is empty".into(),
        });
    }
    let methods = &config.methods;
    // Later turns run after every first turn, conditioned on the baseline's answers.
    let phases: [Vec<usize>; 2] = [
        (0..prompts.len())
            .filter(|&i| prompts[i].answer_of.is_none())
            .collect(),
        (0..prompts.len())
            .filter(|&i| prompts[i].answer_of.is_some())
            .collect(),
    ];
    let (mut provenance, mut requests, mut steps, earlier_runs) = match previous {
        Some(finished) => {
            let mut provenance = finished.provenance;
            provenance.notes.push(format!(
                "resumed at unix {} with {} request records kept (git commit {})",
                unix_now(),
                finished.requests.len(),
                BUILD_COMMIT
            ));
            provenance.failures.clear();
            provenance.stopped = None;
            (provenance, finished.requests, finished.steps, finished.runs)
        }
        None => {
            let mut notes = loaded.notes.clone();
            if config.batch_size > 1 && backend.name() == "simulation" {
                notes.push(format!(
                    "batch_size {} is not modelled by the simulation: requests run one at a time",
                    config.batch_size
                ));
            }
            if !phases[1].is_empty() {
                notes.push(
                    "later turns continue the baseline's answer to the earlier turn, for every \
                     method (the same contexts for all methods)"
                        .into(),
                );
            }
            let provenance =
                Provenance::collect(config, loaded.path.as_deref(), backend.name(), notes)?;
            (provenance, Vec::new(), Vec::new(), Vec::new())
        }
    };
    provenance.complete = false;
    // the folder and every raw file exist before any compute
    std::fs::create_dir_all(out_dir).map_err(|e| HarnessError::io(out_dir, e))?;
    write_provenance(out_dir, &provenance)?;
    let requests_path = out_dir.join(files::REQUESTS_JSONL);
    let steps_path = out_dir.join(files::STEPS_JSONL);
    let runs_path = out_dir.join(files::RUNS);
    write_jsonl(&requests_path, &requests)?;
    write_jsonl(&steps_path, &steps)?;
    // (method, request, repeat) of every request already recorded
    let done: HashSet<(String, usize, usize)> = requests
        .iter()
        .map(|r| (r.method.clone(), r.request, r.repeat))
        .collect();
    let repeats = config.repeat.max(1);
    let total = (prompts.len() * methods.len() * repeats) as u64;
    let bar = if control.progress {
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
    let mut runs: Vec<MethodRun> = methods
        .iter()
        .map(|method| {
            let earlier = earlier_runs.iter().find(|r| r.method == method.name);
            let mut repeat_elapsed_s =
                earlier.map_or_else(Vec::new, |r| r.repeat_elapsed_s.clone());
            repeat_elapsed_s.resize(repeats, 0.0);
            MethodRun {
                method: method.name.clone(),
                description: method.describe(),
                is_baseline: method.is_baseline(),
                elapsed_s: earlier.map_or(0.0, |r| r.elapsed_s),
                setup_s: earlier.map_or(0.0, |r| r.setup_s),
                repeat_elapsed_s,
            }
        })
        .collect();
    write_jsonl(&runs_path, &runs)?;
    let baseline = methods
        .iter()
        .position(MethodConfig::is_baseline)
        .ok_or_else(|| HarnessError::Metrics("no baseline method".into()))?;
    let mut failed: Vec<Option<String>> = vec![None; methods.len()];
    let first = phases[0].first().map(|&index| RequestSpec {
        index,
        prompt: &prompts[index],
    });
    backend.prepare(methods, first.as_ref())?;
    'rounds: for repeat in 0..repeats {
        for (phase, indices) in phases.iter().enumerate() {
            if phase == 1 && repeat == 0 && !indices.is_empty() {
                if let Some(e) = &failed[baseline] {
                    provenance.stopped = Some(format!(
                        "later turns not run: they continue the baseline's answers, and the \
                         baseline `{}` failed ({e})",
                        methods[baseline].name
                    ));
                    break 'rounds;
                }
                condition_on_baseline(&mut prompts, indices, &methods[baseline].name, &requests)?;
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
                    if control.stop.load(Ordering::SeqCst) {
                        provenance.stopped = Some("interrupted by a signal".into());
                        break 'rounds;
                    }
                    let method = &methods[m];
                    let todo: Vec<RequestSpec> = specs[group.clone()]
                        .iter()
                        .filter(|s| !done.contains(&(method.name.clone(), s.index, repeat)))
                        .copied()
                        .collect();
                    bar.inc((group.len() - todo.len()) as u64);
                    if failed[m].is_some() || todo.is_empty() {
                        continue;
                    }
                    bar.set_message(method.name.clone());
                    let outcome = backend
                        .run_method(method, &todo, &mut |_| bar.inc(1))
                        .and_then(|o| check_outcome(method, &todo, &o).map(|()| o));
                    let outcome = match outcome {
                        Ok(outcome) => outcome,
                        Err(e) => {
                            failed[m] = Some(e.to_string());
                            continue;
                        }
                    };
                    runs[m].elapsed_s += outcome.elapsed_s;
                    runs[m].repeat_elapsed_s[repeat] += outcome.elapsed_s;
                    runs[m].setup_s += outcome.setup_s;
                    let (new_requests, new_steps) =
                        request_records(method, repeat, outcome.requests, &prompts);
                    // steps first: a request record on disk always has its steps
                    append_jsonl(&steps_path, &new_steps)?;
                    append_jsonl(&requests_path, &new_requests)?;
                    write_jsonl(&runs_path, &runs)?;
                    requests.extend(new_requests);
                    steps.extend(new_steps);
                }
            }
        }
    }
    bar.finish_and_clear();
    provenance.failures = methods
        .iter()
        .zip(&failed)
        .filter_map(|(m, f)| f.as_ref().map(|e| format!("{}: {e}", m.name)))
        .collect();
    // what is kept: the methods that did not fail, in method order, each by repeat and request
    let order: HashMap<&str, usize> = methods
        .iter()
        .zip(&failed)
        .enumerate()
        .filter(|(_, (_, f))| f.is_none())
        .map(|(i, (m, _))| (m.name.as_str(), i))
        .collect();
    runs.retain(|r| order.contains_key(r.method.as_str()));
    requests.retain(|r| order.contains_key(r.method.as_str()));
    requests.sort_by_key(|r| (order[r.method.as_str()], r.repeat, r.request));
    let kept: HashSet<(&str, usize, usize)> = requests
        .iter()
        .map(|r| (r.method.as_str(), r.request, r.repeat))
        .collect();
    steps.retain(|s| kept.contains(&(s.method.as_str(), s.request, s.repeat)));
    steps.sort_by_key(|s| (order[s.method.as_str()], s.repeat, s.request, s.step));
    let finished_all = requests.len() == prompts.len() * methods.len() * repeats;
    provenance.complete = finished_all && provenance.stopped.is_none();
    let summaries = match summarize(&runs, &requests, &steps) {
        Ok(summaries) => summaries,
        Err(e) if provenance.complete => return Err(e),
        Err(_) => Vec::new(),
    };
    let results = RunResults {
        provenance,
        runs,
        requests,
        steps,
        summaries,
    };
    if results.summaries.is_empty() {
        write_jsonl(&steps_path, &results.steps)?;
        write_jsonl(&requests_path, &results.requests)?;
        write_jsonl(&runs_path, &results.runs)?;
        write_provenance(out_dir, &results.provenance)?;
    } else {
        write_results(out_dir, &results)?;
    }
    Ok(results)
}

/// Gives each later-turn prompt at `indices` its conversation so far: the earlier turn's own
/// history, then (the earlier turn's text, the baseline's answer to it) from the first-repeat
/// request records of the method named `baseline` in `records` (this run's, and when resuming
/// the earlier run's).
///
/// # Errors
/// When the baseline has no text for the earlier turn (the simulation produces none).
fn condition_on_baseline(
    prompts: &mut [Prompt],
    indices: &[usize],
    baseline: &str,
    records: &[RequestRecord],
) -> Result<()> {
    for &i in indices {
        let Some(first) = prompts[i].answer_of else {
            continue;
        };
        let answer = records
            .iter()
            .find(|r| r.method == baseline && r.repeat == 0 && r.request == first)
            .and_then(|r| r.text.clone())
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

/// Reads what an incomplete run left in `dir` and continues it on the backend its config
/// picks: the (method, prompt, repeat) triples with a request record are kept, the rest run.
///
/// # Errors
/// A folder without a readable provenance, one whose run is complete, records that do not
/// parse (a last line cut short by a kill is dropped), and as [`run_experiment_with`].
pub fn resume_experiment(dir: &Path, control: &RunControl<'_>) -> Result<RunResults> {
    let finished = read_finished(dir)?;
    let mut backend = backend_for(&finished.provenance.config)?;
    resume_experiment_on(dir, backend.as_mut(), control, finished)
}

/// [`resume_experiment`] on a given backend, from what [`read_finished`] read.
///
/// # Errors
/// As [`resume_experiment`].
pub fn resume_experiment_on(
    dir: &Path,
    backend: &mut dyn Backend,
    control: &RunControl<'_>,
    finished: Finished,
) -> Result<RunResults> {
    let mut config = finished.provenance.config.clone();
    let origin = format!("{} (the config of the run to resume)", dir.display());
    let notes = config.validate(&origin)?;
    let loaded = LoadedConfig {
        config,
        path: finished.provenance.config_path.as_ref().map(Into::into),
        notes,
    };
    run_experiment_with(&loaded, backend, dir, control, Some(finished))
}

/// What an incomplete run left in `dir`: its provenance, runs, and the requests whose records
/// were written, with their steps.
///
/// # Errors
/// No readable provenance, a run already complete, records that do not parse.
pub fn read_finished(dir: &Path) -> Result<Finished> {
    let path = dir.join(files::PROVENANCE);
    let text = std::fs::read_to_string(&path).map_err(|e| HarnessError::io(&path, e))?;
    let provenance: Provenance =
        serde_json::from_str(&text).map_err(|e| HarnessError::ResultParse {
            path: path.clone(),
            line: e.line(),
            message: e.to_string(),
        })?;
    if provenance.complete {
        return Err(HarnessError::InvalidEngine(format!(
            "{} holds a complete run: nothing to resume",
            dir.display()
        )));
    }
    let runs: Vec<MethodRun> = read_appended_jsonl(&dir.join(files::RUNS))?;
    let requests: Vec<RequestRecord> = read_appended_jsonl(&dir.join(files::REQUESTS_JSONL))?;
    let done: HashSet<(&str, usize, usize)> = requests
        .iter()
        .map(|r| (r.method.as_str(), r.request, r.repeat))
        .collect();
    let mut steps: Vec<StepRecord> = read_appended_jsonl(&dir.join(files::STEPS_JSONL))?;
    steps.retain(|s| done.contains(&(s.method.as_str(), s.request, s.repeat)));
    Ok(Finished {
        provenance,
        runs,
        requests,
        steps,
    })
}

/// The request records (and their steps) of one backend call's outcomes in `repeat`, by
/// request, each labelled with its repeat and its prompt's category and turn.
fn request_records(
    method: &MethodConfig,
    repeat: usize,
    mut outcomes: Vec<RequestOutcome>,
    prompts: &[Prompt],
) -> (Vec<RequestRecord>, Vec<StepRecord>) {
    outcomes.sort_by_key(|r| r.request);
    let mut requests = Vec::with_capacity(outcomes.len());
    let mut steps = Vec::new();
    for mut r in outcomes {
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
    (requests, steps)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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
