//! Results survive: records are on disk as requests finish, a failed method or a stop keeps
//! what finished (marked incomplete), `--resume` continues, and no run's folder is silently
//! overwritten.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use specdec_harness::cli::results_dir;
use specdec_harness::config::{ExperimentConfig, LoadedConfig, MethodConfig};
use specdec_harness::metrics::RequestRecord;
use specdec_harness::report::{files, read_jsonl};
use specdec_harness::runner::{
    read_finished, resume_experiment_on, run_experiment_with, Backend, MethodOutcome, RequestSpec,
    RunControl, SimulationBackend,
};
use specdec_harness::{HarnessError, Result};

const SIM: &str = r#"
name = "survive"
max_tokens = 8
batch_size = 2
[prompts]
source = "synthetic"
count = 4
prompt_tokens = 8
[simulation]
acceptance = { kind = "fixed", alpha = 0.75 }
[simulation.cost]
draft_ms_per_token = 1.0
target = { kind = "points", tokens = [1, 8], ms = [10.0, 12.0] }
[[methods]]
name = "k2"
drafter = { kind = "chain" }
policy = { kind = "fixed", k = 2 }
[[methods]]
name = "k4"
drafter = { kind = "chain" }
policy = { kind = "fixed", k = 4 }
"#;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("specdec-survive-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn loaded() -> LoadedConfig {
    ExperimentConfig::from_toml(SIM, "survive.toml").unwrap()
}

fn simulation(loaded: &LoadedConfig) -> SimulationBackend {
    let c = &loaded.config;
    SimulationBackend::new(c.simulation.clone().unwrap(), c.max_tokens, c.sampling.seed)
}

/// The simulation, failing `fail_method` from its `fail_from`-th call on (counting from 0), and
/// setting `stop` after `stop_after` calls in all. Each answer's text names its method and
/// prompt; `seen` records the history each later-turn prompt arrived with.
struct Faulty<'a> {
    inner: SimulationBackend,
    calls: usize,
    per_method: std::collections::HashMap<String, usize>,
    fail_method: &'a str,
    fail_from: usize,
    stop: &'a AtomicBool,
    stop_after: usize,
    seen: Vec<(String, Vec<(String, String)>)>,
}

impl Backend for Faulty<'_> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn run_method(
        &mut self,
        method: &MethodConfig,
        requests: &[RequestSpec<'_>],
        on_request_done: &mut dyn FnMut(usize),
    ) -> Result<MethodOutcome> {
        self.calls += 1;
        if self.calls >= self.stop_after {
            self.stop.store(true, Ordering::SeqCst);
        }
        let n = self.per_method.entry(method.name.clone()).or_default();
        *n += 1;
        if method.name == self.fail_method && *n > self.fail_from {
            return Err(HarnessError::InvalidEngine("injected failure".into()));
        }
        for spec in requests.iter().filter(|s| s.prompt.answer_of.is_some()) {
            self.seen
                .push((spec.prompt.id.clone(), spec.prompt.history.clone()));
        }
        let mut outcome = self.inner.run_method(method, requests, on_request_done)?;
        for r in &mut outcome.requests {
            let spec = requests.iter().find(|s| s.index == r.request).unwrap();
            r.text = Some(format!("{} answers {}", method.name, spec.prompt.id));
        }
        Ok(outcome)
    }
}

impl<'a> Faulty<'a> {
    fn new(loaded: &LoadedConfig, stop: &'a AtomicBool) -> Self {
        Faulty {
            inner: simulation(loaded),
            calls: 0,
            per_method: Default::default(),
            fail_method: "",
            fail_from: 0,
            stop,
            stop_after: usize::MAX,
            seen: Vec::new(),
        }
    }
}

fn requests_on_disk(dir: &Path) -> Vec<RequestRecord> {
    read_jsonl(&dir.join(files::REQUESTS_JSONL)).unwrap()
}

fn count(records: &[RequestRecord], method: &str) -> usize {
    records.iter().filter(|r| r.method == method).count()
}

#[test]
fn a_failing_method_keeps_the_ones_that_finished() {
    let dir = temp_dir("fail");
    let loaded = loaded();
    let stop = AtomicBool::new(false);
    let mut backend = Faulty {
        fail_method: "k4",
        fail_from: 1, // its second group fails
        ..Faulty::new(&loaded, &stop)
    };
    let control = RunControl {
        progress: false,
        stop: &stop,
    };
    let results = run_experiment_with(&loaded, &mut backend, &dir, &control, None).unwrap();
    let p = &results.provenance;
    assert!(!p.complete);
    assert_eq!(p.failures.len(), 1, "{:?}", p.failures);
    assert!(p.failures[0].starts_with("k4: ") && p.failures[0].contains("injected"));
    // baseline and k2 ran over every prompt and are summarised; k4's half is left out
    let on_disk = requests_on_disk(&dir);
    assert_eq!(
        (
            count(&on_disk, "baseline"),
            count(&on_disk, "k2"),
            count(&on_disk, "k4")
        ),
        (4, 4, 0)
    );
    let names: Vec<&str> = results
        .summaries
        .iter()
        .map(|s| s.method.as_str())
        .collect();
    assert_eq!(names, ["baseline", "k2"]);
    for f in files::ALL {
        assert!(dir.join(f).exists(), "{f} missing");
    }
    let prov: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(files::PROVENANCE)).unwrap())
            .unwrap();
    assert_eq!(prov["complete"], false);
    // no temporary file is left behind
    let temps: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(temps.is_empty(), "{temps:?}");

    // resuming runs k4 again (on every prompt), and the run is complete
    let finished = read_finished(&dir).unwrap();
    let mut again = simulation(&loaded);
    let never = AtomicBool::new(false);
    let control = RunControl {
        progress: false,
        stop: &never,
    };
    let resumed = resume_experiment_on(&dir, &mut again, &control, finished).unwrap();
    assert!(resumed.provenance.complete);
    assert_eq!(resumed.summaries.len(), 3);
    assert_eq!(count(&requests_on_disk(&dir), "k4"), 4);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_stopped_run_keeps_what_finished_and_resume_completes_it() {
    let dir = temp_dir("stop");
    let loaded = loaded();
    let stop = AtomicBool::new(false);
    // 3 methods × 2 groups of 2 prompts: stop after the first group's three calls and one more
    let mut backend = Faulty {
        stop_after: 4,
        ..Faulty::new(&loaded, &stop)
    };
    let control = RunControl {
        progress: false,
        stop: &stop,
    };
    let results = run_experiment_with(&loaded, &mut backend, &dir, &control, None).unwrap();
    let p = &results.provenance;
    assert!(!p.complete);
    assert_eq!(p.stopped.as_deref(), Some("interrupted by a signal"));
    assert_eq!(backend.calls, 4, "no backend call after the stop");
    let on_disk = requests_on_disk(&dir);
    assert_eq!(on_disk.len(), 4 * 2, "four calls of two prompts each");
    // a record cut short by a kill (no final newline) is dropped on resume
    let steps = dir.join(files::STEPS_JSONL);
    let mut text = std::fs::read_to_string(&steps).unwrap();
    text.push_str("{\"method\":\"k4\",\"requ");
    std::fs::write(&steps, text).unwrap();

    let finished = read_finished(&dir).unwrap();
    assert_eq!(finished.requests.len(), 8);
    let mut again = simulation(&loaded);
    let never = AtomicBool::new(false);
    let control = RunControl {
        progress: false,
        stop: &never,
    };
    let resumed = resume_experiment_on(&dir, &mut again, &control, finished).unwrap();
    assert!(resumed.provenance.complete);
    assert!(resumed
        .provenance
        .notes
        .iter()
        .any(|n| n.contains("resumed")));
    let on_disk = requests_on_disk(&dir);
    for m in ["baseline", "k2", "k4"] {
        assert_eq!(count(&on_disk, m), 4, "{m}");
        let mut requests: Vec<usize> = on_disk
            .iter()
            .filter(|r| r.method == m)
            .map(|r| r.request)
            .collect();
        requests.sort_unstable();
        assert_eq!(requests, [0, 1, 2, 3], "{m}: each prompt once");
    }
    // a complete run has nothing to resume
    let err = read_finished(&dir).unwrap_err().to_string();
    assert!(err.contains("complete"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_output_path_is_checked_before_any_compute() {
    let dir = temp_dir("blocked");
    std::fs::create_dir_all(&dir).unwrap();
    let blocked = dir.join("a-file");
    std::fs::write(&blocked, b"not a folder").unwrap();
    let loaded = loaded();
    let stop = AtomicBool::new(false);
    let mut backend = Faulty::new(&loaded, &stop);
    let control = RunControl {
        progress: false,
        stop: &stop,
    };
    let err = run_experiment_with(&loaded, &mut backend, &blocked.join("out"), &control, None)
        .unwrap_err();
    assert!(matches!(err, HarnessError::Io { .. }), "{err}");
    assert_eq!(backend.calls, 0, "nothing ran");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_folder_holding_results_is_never_silently_overwritten() {
    let dir = temp_dir("taken");
    // absent or without results: used as given
    assert_eq!(results_dir(&dir, false).unwrap(), dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), b"mine").unwrap();
    assert_eq!(results_dir(&dir, false).unwrap(), dir);
    // holding a run: the next free NAME-i, the old one untouched
    std::fs::write(dir.join(files::PROVENANCE), b"{}").unwrap();
    std::fs::write(dir.join(files::REQUESTS_JSONL), b"old").unwrap();
    let next = results_dir(&dir, false).unwrap();
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(next, dir.with_file_name(format!("{name}-2")));
    std::fs::create_dir_all(&next).unwrap();
    assert_eq!(
        results_dir(&dir, false).unwrap(),
        dir.with_file_name(format!("{name}-3"))
    );
    assert_eq!(
        std::fs::read(dir.join(files::REQUESTS_JSONL)).unwrap(),
        b"old"
    );
    // --force: the same folder, its results removed, other files kept
    assert_eq!(results_dir(&dir, true).unwrap(), dir);
    assert!(!dir.join(files::PROVENANCE).exists());
    assert!(!dir.join(files::REQUESTS_JSONL).exists());
    assert!(dir.join("notes.txt").exists());
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&next).unwrap();
}

#[test]
fn experiment_names_that_leave_results_are_refused() {
    for name in [
        "../escape",
        "a/b",
        "/abs",
        "..",
        ".",
        ".hidden",
        "a\\\\b",
        "line\\nbreak",
    ] {
        let text = SIM.replace("name = \"survive\"", &format!("name = \"{name}\""));
        let err = ExperimentConfig::from_toml(&text, "survive.toml").unwrap_err();
        assert!(
            matches!(err, HarnessError::ConfigInvalid { ref field, .. } if field == "name"),
            "{name}: {err}"
        );
    }
    let ok = SIM.replace("name = \"survive\"", "name = \"qwen-pair_2 (v3)\"");
    ExperimentConfig::from_toml(&ok, "survive.toml").unwrap();
}

#[test]
fn repeats_stop_and_resume_by_repeat() {
    let dir = temp_dir("repeat");
    let text = SIM.replace("max_tokens = 8", "max_tokens = 8\nrepeat = 2");
    let loaded = ExperimentConfig::from_toml(&text, "survive.toml").unwrap();
    let stop = AtomicBool::new(false);
    // 2 repeats × 2 groups × 3 methods = 12 calls: stop inside the second repeat
    let mut backend = Faulty {
        stop_after: 8,
        ..Faulty::new(&loaded, &stop)
    };
    let control = RunControl {
        progress: false,
        stop: &stop,
    };
    let results = run_experiment_with(&loaded, &mut backend, &dir, &control, None).unwrap();
    assert!(!results.provenance.complete);
    assert_eq!(backend.calls, 8);
    let on_disk = requests_on_disk(&dir);
    assert_eq!(on_disk.len(), 8 * 2);
    assert_eq!(on_disk.iter().filter(|r| r.repeat == 1).count(), 2 * 2);

    let finished = read_finished(&dir).unwrap();
    let mut again = simulation(&loaded);
    let never = AtomicBool::new(false);
    let control = RunControl {
        progress: false,
        stop: &never,
    };
    let resumed = resume_experiment_on(&dir, &mut again, &control, finished).unwrap();
    assert!(resumed.provenance.complete);
    let on_disk = requests_on_disk(&dir);
    for m in ["baseline", "k2", "k4"] {
        for repeat in 0..2 {
            let mut requests: Vec<usize> = on_disk
                .iter()
                .filter(|r| r.method == m && r.repeat == repeat)
                .map(|r| r.request)
                .collect();
            requests.sort_unstable();
            assert_eq!(
                requests,
                [0, 1, 2, 3],
                "{m} repeat {repeat}: each prompt once"
            );
        }
    }
    // every step belongs to a kept request of its repeat
    let steps: Vec<specdec_harness::metrics::StepRecord> =
        read_jsonl(&dir.join(files::STEPS_JSONL)).unwrap();
    assert!(steps.iter().all(|s| on_disk
        .iter()
        .any(|r| r.method == s.method && r.request == s.request && r.repeat == s.repeat)));
    // the time of each repeat is kept across the resume
    for run in &resumed.runs {
        assert_eq!(run.repeat_elapsed_s.len(), 2, "{}", run.method);
        assert!(run.repeat_elapsed_s.iter().all(|&t| t > 0.0), "{run:?}");
        let sum: f64 = run.repeat_elapsed_s.iter().sum();
        assert!((sum - run.elapsed_s).abs() < 1e-9 * run.elapsed_s.max(1.0));
    }
    for s in &resumed.summaries {
        assert_eq!(s.tokens_per_s_by_repeat.len(), 2, "{}", s.method);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn second_turns_resume_from_the_baselines_recorded_answers() {
    let dir = temp_dir("turns");
    std::fs::create_dir_all(&dir).unwrap();
    let questions = dir.join("question.jsonl");
    std::fs::write(
        &questions,
        r#"{"question_id": 1, "category": "writing", "turns": ["Write a poem.", "Shorter."]}
{"question_id": 2, "category": "math", "turns": ["2 + 2?", "Why?"]}
"#,
    )
    .unwrap();
    let text = SIM.replace(
        "source = \"synthetic\"\ncount = 4\nprompt_tokens = 8",
        &format!(
            "source = \"file\"\npath = {:?}\nturns = 2",
            questions.display().to_string()
        ),
    );
    let loaded = ExperimentConfig::from_toml(&text, "survive.toml").unwrap();
    let out = dir.join("out");
    let stop = AtomicBool::new(false);
    // the first turns take one group × 3 methods: stop before any second turn
    let mut backend = Faulty {
        stop_after: 3,
        ..Faulty::new(&loaded, &stop)
    };
    let control = RunControl {
        progress: false,
        stop: &stop,
    };
    let results = run_experiment_with(&loaded, &mut backend, &out, &control, None).unwrap();
    assert!(!results.provenance.complete);
    assert!(backend.seen.is_empty(), "no second turn ran");
    let on_disk = requests_on_disk(&out);
    assert_eq!(on_disk.len(), 3 * 2);
    assert!(on_disk.iter().all(|r| r.turn == 1 && r.category.is_some()));

    // the resumed run conditions the second turns on the answers the first run recorded
    let finished = read_finished(&out).unwrap();
    let never = AtomicBool::new(false);
    let mut again = Faulty::new(&loaded, &never);
    let control = RunControl {
        progress: false,
        stop: &never,
    };
    let resumed = resume_experiment_on(&out, &mut again, &control, finished).unwrap();
    assert!(resumed.provenance.complete);
    assert_eq!(again.calls, 3, "only the second turns ran");
    assert_eq!(again.seen.len(), 3 * 2);
    for (id, history) in &again.seen {
        let first = id.strip_suffix("/turn2").unwrap();
        assert_eq!(history.len(), 1, "{id}");
        assert_eq!(history[0].1, format!("baseline answers {first}"), "{id}");
    }
    let on_disk = requests_on_disk(&out);
    assert_eq!(on_disk.len(), 3 * 4);
    assert_eq!(on_disk.iter().filter(|r| r.turn == 2).count(), 3 * 2);
    // the per-category files are written, and nothing is left under a temporary name
    for f in [files::CATEGORIES_CSV, files::CATEGORIES_SVG] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let temps: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(temps.is_empty(), "{temps:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
