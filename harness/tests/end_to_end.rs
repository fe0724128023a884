//! One small experiment on the simulation, end to end: every output file is written, the records
//! add up, and `report` re-renders the same summary from the saved JSONL.

use std::path::PathBuf;

use specdec_harness::config::ExperimentConfig;
use specdec_harness::metrics::{MethodRun, RequestRecord, StepRecord};
use specdec_harness::report::{files, read_jsonl, rerender, RunResults};
use specdec_harness::repro;
use specdec_harness::runner::run_experiment;

const SIM: &str = r#"
name = "e2e"
max_tokens = 24
[prompts]
source = "synthetic"
count = 4
prompt_tokens = 20
[sampling]
seed = 5
[simulation]
acceptance = { kind = "fixed", alpha = 0.75 }
[simulation.cost]
draft_ms_per_token = 1.0
target = { kind = "points", tokens = [1, 8], ms = [10.0, 12.0] }
verify_ms = 0.1
commit_ms = 0.1
overhead_ms = 0.2
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
    let d = std::env::temp_dir().join(format!("specdec-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn a_simulated_experiment_writes_every_output() {
    let dir = temp_dir("e2e");
    let loaded = ExperimentConfig::from_toml(SIM, "e2e.toml").unwrap();
    let results = run_experiment(&loaded, &dir, false).unwrap();

    for f in files::ALL {
        let p = dir.join(f);
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(!text.trim().is_empty(), "{f} is empty");
        if f.ends_with(".svg") {
            assert!(text.starts_with("<svg"), "{f} is not an SVG");
        }
    }
    // Baseline added in front; three methods × four prompts.
    assert_eq!(results.runs.len(), 3);
    assert!(results.runs[0].is_baseline);
    let runs: Vec<MethodRun> = read_jsonl(&dir.join(files::RUNS)).unwrap();
    assert_eq!(runs, results.runs);
    let requests: Vec<RequestRecord> = read_jsonl(&dir.join(files::REQUESTS_JSONL)).unwrap();
    assert_eq!(requests.len(), 12);
    assert!(requests.iter().all(|r| r.generated_tokens == 24));
    let steps: Vec<StepRecord> = read_jsonl(&dir.join(files::STEPS_JSONL)).unwrap();
    for r in &requests {
        let mine: Vec<&StepRecord> = steps
            .iter()
            .filter(|s| s.method == r.method && s.request == r.request)
            .collect();
        assert_eq!(mine.len(), r.target_passes);
        assert_eq!(mine.iter().map(|s| s.emitted).sum::<usize>(), 24);
    }
    // Baseline: one pass per token at 10 + 0.2 ms.
    let base = &results.summaries[0];
    assert_eq!(base.target_passes, 4 * 24);
    assert!((base.tokens_per_s - 1e3 / 10.2).abs() < 1e-9);
    assert_eq!(base.speedup, 1.0);
    // Speculative methods: τ within [1, K+1], acceptance in [0, 1], draft time recorded.
    for (s, k) in results.summaries[1..].iter().zip([2usize, 4]) {
        assert!(s.tau.mean >= 1.0 && s.tau.mean <= (k + 1) as f64, "{s:?}");
        let a = s.acceptance_rate.unwrap();
        assert!((0.0..=1.0).contains(&a));
        assert!(s.time_split.draft_s > 0.0);
        assert_eq!(s.acceptance_by_depth.len(), k);
        // every interval inside the statistic's range, over the 4 prompts
        assert!(
            s.tau.lo >= 1.0 && s.tau.lo <= s.tau.hi && s.tau.n == 4,
            "{:?}",
            s.tau
        );
        let ai = s.acceptance_interval.unwrap();
        assert!(ai.lo >= 0.0 && ai.hi <= 1.0, "{ai:?}");
        let si = s.speedup_interval.unwrap();
        assert!(si.lo > 0.0 && (si.mean - s.speedup).abs() < 1e-9, "{si:?}");
        // the histogram counts every drafting step once
        assert_eq!(
            s.accepted_lengths.iter().sum::<usize>(),
            s.target_passes,
            "{s:?}"
        );
        assert_eq!(s.accepted_lengths.len(), k + 1);
    }
    // The target forward by size, as the run met it: the simulation's cost curve (10 ms at one
    // token, 12 ms at eight, linear between), for the baseline one-token forwards only.
    for s in &results.summaries {
        for p in &s.pass_times {
            let want_s = (10.0 + 2.0 * (p.tokens - 1) as f64 / 7.0) / 1e3;
            assert!((p.median_s - want_s).abs() < 1e-12, "{}: {p:?}", s.method);
        }
        let passes: usize = s.pass_times.iter().map(|p| p.passes).sum();
        assert_eq!(passes, s.target_passes, "{}", s.method);
    }
    assert_eq!(base.pass_times.len(), 1);
    assert_eq!(base.pass_times[0].tokens, 1);
    for (s, k) in results.summaries[1..].iter().zip([2usize, 4]) {
        let largest = s.pass_times.last().unwrap();
        assert_eq!(largest.tokens, k + 1, "{}", s.method);
    }
    // k2 and k4 differ only in K: speedup and τ against K, one series with both points
    for f in [files::SPEEDUP_BY_K_SVG, files::TAU_BY_K_SVG] {
        let svg = std::fs::read_to_string(dir.join(f)).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("chain"), "{f}");
    }
    // The CSV has a header and one row per method; the markdown names every method.
    let csv = std::fs::read_to_string(dir.join(files::SUMMARY_CSV)).unwrap();
    assert_eq!(csv.lines().count(), 4);
    let baseline_row = csv.lines().nth(1).unwrap();
    assert!(baseline_row.ends_with(",1:0.01"), "{baseline_row}");
    let md = std::fs::read_to_string(dir.join(files::SUMMARY_MD)).unwrap();
    for m in [
        "baseline",
        "k2",
        "k4",
        "git commit",
        "Warning: only 4 prompts",
        "Acceptance by position",
        "unconditional",
        "Accepted drafts per step",
        "Target forward by tokens verified",
        "10.00 (1.00×, 96)",
    ] {
        assert!(md.contains(m), "summary.md lacks {m}");
    }
    // Provenance: the config as run, with its baseline, and the seed.
    let prov: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(files::PROVENANCE)).unwrap())
            .unwrap();
    assert_eq!(prov["seed"], 5);
    assert_eq!(prov["backend"], "simulation");
    assert_eq!(prov["config"]["methods"].as_array().unwrap().len(), 3);

    // `report` re-renders the same summaries from the saved JSONL.
    std::fs::remove_file(dir.join(files::TAU_SVG)).unwrap();
    let (again, _) = rerender(&dir).unwrap();
    assert_eq!(again.summaries, results.summaries);
    assert!(dir.join(files::TAU_SVG).exists());

    // The same seed gives the same records.
    let dir2 = temp_dir("e2e-again");
    let twice = run_experiment(&loaded, &dir2, false).unwrap();
    assert_eq!(twice.steps, results.steps);
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&dir2).unwrap();
}

/// A real-model config runs through the engine backend: SmolLM2, plain vs n-gram, greedy; both
/// produce the same text and the results folder is written.
/// A config named `name`: SmolLM2 on one code prompt, 8 tokens, n-gram K = 3 against the
/// baseline, with `top` (top-level keys) added.
fn smollm2_ngram(name: &str, top: &str) -> String {
    format!(
        r#"
name = "{name}"
max_tokens = 8
{top}[models]
target = "smollm2-135m"
[prompts]
source = "inline"
texts = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"]
[[methods]]
name = "ngram"
drafter = {{ kind = "ngram", n = 3 }}
policy = {{ kind = "fixed", k = 3 }}
"#
    )
}

#[test]
fn real_model_configs_run_through_the_engine() {
    if specdec_models::registry::cached_for_test("smollm2-135m").is_none() {
        return;
    }
    let dir = temp_dir("real");
    let loaded = ExperimentConfig::from_toml(&smollm2_ngram("real", ""), "real.toml").unwrap();
    let results = run_experiment(&loaded, &dir, false).unwrap();
    assert_eq!(results.requests.len(), 2);
    let texts: Vec<_> = results.requests.iter().map(|r| r.text.clone()).collect();
    assert!(
        texts[0].as_deref().is_some_and(|t| !t.is_empty()),
        "{texts:?}"
    );
    assert_eq!(
        texts[0], texts[1],
        "greedy n-gram output differs from plain"
    );
    assert!(dir.join("summary.md").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `op_split = true` on a real model: every step records its target forward's ops, which add
/// up to no more than the forward's time, and the results hold their CSV and table.
#[test]
fn a_real_run_records_each_target_forwards_op_split() {
    if specdec_models::registry::cached_for_test("smollm2-135m").is_none() {
        return;
    }
    let dir = temp_dir("ops");
    let text = smollm2_ngram("ops", "op_split = true\n");
    let loaded = ExperimentConfig::from_toml(&text, "ops.toml").unwrap();
    let results = run_experiment(&loaded, &dir, false).unwrap();
    assert!(!results.steps.is_empty());
    for s in &results.steps {
        let names: Vec<&str> = s.ops.iter().map(|o| o.op.as_str()).collect();
        for op in ["qkv", "attention", "lm_head"] {
            assert!(
                names.contains(&op),
                "{}: {op} missing from {names:?}",
                s.method
            );
        }
        let sum: f64 = s.ops.iter().map(|o| o.seconds).sum();
        assert!(
            sum > 0.0 && sum <= s.target_s * 1.02 + 1e-5,
            "{}: ops {sum} s against the forward's {} s",
            s.method,
            s.target_s
        );
    }
    for summary in &results.summaries {
        assert!(!summary.forward_ops.is_empty(), "{}", summary.method);
    }
    let csv = std::fs::read_to_string(dir.join(files::FORWARD_OPS_CSV)).unwrap();
    assert!(csv.starts_with("method,tokens,passes,op,median_s"));
    assert!(csv
        .lines()
        .any(|l| l.starts_with("baseline,1,") && l.contains(",attention,")));
    let md = std::fs::read_to_string(dir.join(files::SUMMARY_MD)).unwrap();
    assert!(md.contains("Target forward by op"), "{md}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The toy backend runs real chain rejection sampling: on a context-free pair the acceptance
/// rate of K = 1 estimates α = Σ min(p, q) exactly, and every output file is written.
#[test]
fn a_toy_experiment_runs_end_to_end() {
    let text = include_str!("../../experiments/toy-chain.toml")
        .replace("count = 20", "count = 6")
        .replace("max_tokens = 200", "max_tokens = 150");
    let loaded = ExperimentConfig::from_toml(&text, "toy-chain.toml").unwrap();
    let dir = temp_dir("toy");
    let results = run_experiment(&loaded, &dir, false).unwrap();
    for f in files::ALL {
        assert!(dir.join(f).exists(), "{f} missing");
    }
    let backend = specdec_harness::runner::ToyBackend::new(&loaded.config).unwrap();
    let alpha = backend.alpha_after(&[]).unwrap();
    let k1 = results
        .summaries
        .iter()
        .find(|s| s.method == "chain-k1")
        .unwrap();
    // ≈ 6 × 150 / 1.7 ≈ 530 Bernoulli(α) trials: sd ≤ 0.022, so 0.1 is over 4 sd.
    let rate = k1.acceptance_rate.unwrap();
    assert!((rate - alpha).abs() < 0.1, "rate {rate} vs exact α {alpha}");
    // Every request generated exactly max_tokens tokens, with text.
    assert!(results
        .requests
        .iter()
        .all(|r| r.generated_tokens == 150 && r.text.as_ref().is_some_and(|t| !t.is_empty())));
    assert_eq!(results.provenance.backend, "toy");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reproductions_write_their_tables_and_plots() {
    let dir = temp_dir("repro");
    let lev = repro::leviathan::run(
        &dir,
        &repro::leviathan::LeviathanParams {
            alphas: vec![0.6, 0.9],
            gamma_max: 3,
            requests: 5,
            tokens: 100,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        lev.markdown.contains("| 0.9 | 3 | 3.439 |"),
        "{}",
        lev.markdown
    );
    let place = repro::placement::run(
        &dir,
        &repro::placement::PlacementParams {
            requests: 3,
            tokens: 64,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(place.markdown.contains("co-located"));
    for f in lev.files.iter().chain(&place.files) {
        assert!(std::fs::metadata(f).unwrap().len() > 0, "{}", f.display());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The shipped experiment configs parse, and the policy study runs every policy kind through the
/// simulation: each adaptive policy must beat plain decoding there (per-prompt α 0.2–0.95, where
/// the cost model makes speculation pay for most prompts).
#[test]
fn shipped_experiments_parse_and_the_policy_study_runs() {
    let shipped = [
        (
            "sim-fixed-k.toml",
            include_str!("../../experiments/sim-fixed-k.toml"),
        ),
        (
            "sim-policies.toml",
            include_str!("../../experiments/sim-policies.toml"),
        ),
    ];
    for (name, text) in shipped {
        ExperimentConfig::from_toml(text, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let text = shipped[1].1.replace("count = 40", "count = 8");
    let loaded = ExperimentConfig::from_toml(&text, "sim-policies.toml").unwrap();
    let dir = temp_dir("policies");
    let results = run_experiment(&loaded, &dir, false).unwrap();
    assert_eq!(results.summaries.len(), 8);
    for s in &results.summaries[4..] {
        assert!(s.speedup > 1.0, "{}: {}", s.method, s.speedup);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every config shipped under `experiments/` (its subfolders included) parses and validates:
/// names, kinds, keys and limits, before any model is opened.
#[test]
fn every_shipped_config_parses() {
    fn configs(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                configs(&path, found);
            } else if path.extension().is_some_and(|e| e == "toml") {
                found.push(path);
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments");
    let mut found = Vec::new();
    configs(&root, &mut found);
    assert!(
        found.len() > 20,
        "{} configs under {}",
        found.len(),
        root.display()
    );
    for path in found {
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path.display().to_string();
        ExperimentConfig::from_toml(&text, &name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// Continuous batching through the harness: the toy engine run with 4 requests in flight gives
/// the same tokens and per-step acceptance as one at a time (randomness is keyed by request, not
/// by batch position), and the steps record the batch they ran in.
#[test]
fn toy_results_do_not_depend_on_the_batch_size() {
    let base = include_str!("../../experiments/toy-chain.toml")
        .replace("count = 20", "count = 5")
        .replace("max_tokens = 200", "max_tokens = 40");
    let run = |batch: usize, tag: &str| {
        let text = base.replace(
            "max_tokens = 40",
            &format!("max_tokens = 40\nbatch_size = {batch}"),
        );
        let loaded = ExperimentConfig::from_toml(&text, "toy-chain.toml").unwrap();
        let dir = temp_dir(tag);
        let r = run_experiment(&loaded, &dir, false).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        r
    };
    let one = run(1, "toy-b1");
    let four = run(4, "toy-b4");
    let texts = |r: &specdec_harness::report::RunResults| -> Vec<Option<String>> {
        r.requests.iter().map(|q| q.text.clone()).collect()
    };
    assert_eq!(texts(&one), texts(&four));
    let shape = |r: &specdec_harness::report::RunResults| -> Vec<(usize, usize, usize)> {
        r.steps
            .iter()
            .map(|s| (s.proposed, s.accepted, s.emitted))
            .collect()
    };
    assert_eq!(shape(&one), shape(&four));
    assert!(one.steps.iter().all(|s| s.batch == 1));
    assert!(four.steps.iter().any(|s| s.batch > 1));
}

#[test]
fn toy_results_do_not_depend_on_the_schedule() {
    let base = include_str!("../../experiments/toy-chain.toml")
        .replace("count = 20", "count = 5")
        .replace("max_tokens = 200", "max_tokens = 40\nbatch_size = 2");
    let run = |schedule: &str| {
        let text = base.replace(
            "batch_size = 2",
            &format!("batch_size = 2\nschedule = \"{schedule}\""),
        );
        let loaded = ExperimentConfig::from_toml(&text, "toy-chain.toml").unwrap();
        let dir = temp_dir(&format!("toy-{schedule}"));
        let r = run_experiment(&loaded, &dir, false).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        r
    };
    let by_method = run("by_method");
    let interleaved = run("interleaved");
    let records = |r: &specdec_harness::report::RunResults| {
        r.requests
            .iter()
            .map(|q| (q.method.clone(), q.request, q.text.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(records(&by_method), records(&interleaved));
    assert!(by_method.runs.len() >= 2);
    assert_eq!(by_method.steps.len(), interleaved.steps.len());
}

/// `repeat = 2` runs the schedule twice: twice the records, each labelled with its repeat, one
/// decode tokens/s per repeat, and intervals still over the 4 prompts.
#[test]
fn repeats_run_the_schedule_again() {
    let dir = temp_dir("e2e-repeat");
    let text = SIM.replace("max_tokens = 24", "max_tokens = 24\nrepeat = 2");
    let loaded = ExperimentConfig::from_toml(&text, "repeat.toml").unwrap();
    let results = run_experiment(&loaded, &dir, false).unwrap();
    assert_eq!(results.requests.len(), 2 * 12);
    for repeat in 0..2 {
        assert_eq!(
            results
                .requests
                .iter()
                .filter(|r| r.repeat == repeat)
                .count(),
            12
        );
    }
    assert!(results.steps.iter().any(|s| s.repeat == 1));
    for s in &results.summaries {
        assert_eq!(s.tokens_per_s_by_repeat.len(), 2, "{s:?}");
        assert_eq!(s.tau.n, 4);
        // the same seed: the same simulated work in both repeats
        assert_eq!(s.tokens_per_s_by_repeat[0], s.tokens_per_s_by_repeat[1]);
    }
    let md = std::fs::read_to_string(dir.join(files::SUMMARY_MD)).unwrap();
    assert!(md.contains("Repeats"), "{md}");
    let err = ExperimentConfig::from_toml(
        &SIM.replace("max_tokens = 24", "max_tokens = 24\nrepeat = 0"),
        "r0.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("repeat"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// MT-Bench with both turns on SmolLM2 at T = 1: the second turn runs after the first, carries
/// the baseline's first-turn answer for every method (the same context, so the same prompt
/// length), and the per-category files are written.
#[test]
fn mtbench_second_turns_continue_the_baselines_answer() {
    if specdec_models::registry::cached_for_test("smollm2-135m").is_none()
        || specdec_models::registry::cached_for_test("mtbench").is_none()
    {
        return;
    }
    let config = r#"
name = "mt2"
max_tokens = 6
[models]
target = "smollm2-135m"
[prompts]
source = "mtbench"
categories = ["writing", "math"]
per_category = 1
turns = 2
[sampling]
temperature = 1.0
seed = 3
[[methods]]
name = "ngram"
drafter = { kind = "ngram", n = 3 }
policy = { kind = "fixed", k = 3 }
"#;
    let dir = temp_dir("mt2");
    let loaded = ExperimentConfig::from_toml(config, "mt2.toml").unwrap();
    let results = run_experiment(&loaded, &dir, false).unwrap();
    assert_eq!(results.requests.len(), 2 * 4);
    let of = |method: &str, turn: usize| -> Vec<&RequestRecord> {
        results
            .requests
            .iter()
            .filter(|r| r.method == method && r.turn == turn)
            .collect()
    };
    for (first, second) in of("baseline", 1).iter().zip(of("baseline", 2)) {
        assert_eq!(first.category, second.category);
        assert!(second.prompt_id.ends_with("/turn2"), "{}", second.prompt_id);
        // turn 2's prompt holds turn 1 and its answer
        assert!(second.prompt_tokens > first.prompt_tokens + 4, "{second:?}");
    }
    // every method's second turn starts from the same context: the same prompt length
    for (b, n) in of("baseline", 2).iter().zip(of("ngram", 2)) {
        assert_eq!(b.prompt_tokens, n.prompt_tokens, "{}", b.prompt_id);
    }
    assert!(dir.join(files::CATEGORIES_CSV).exists());
    let md = std::fs::read_to_string(dir.join(files::SUMMARY_MD)).unwrap();
    assert!(
        md.contains("Per category") && md.contains("baseline's"),
        "{md}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A method name holding `|` and a line break keeps the summary table's shape: every row of the
/// table has as many unescaped cell separators as the header.
#[test]
fn method_names_that_break_markdown_are_escaped() {
    let dir = temp_dir("e2e-markdown");
    let text = SIM.replace("name = \"k2\"", "name = \"k|2\\nrow\"");
    let loaded = ExperimentConfig::from_toml(&text, "e2e.toml").unwrap();
    run_experiment(&loaded, &dir, false).unwrap();
    let md = std::fs::read_to_string(dir.join(files::SUMMARY_MD)).unwrap();
    let separators = |line: &str| {
        line.char_indices()
            .filter(|&(i, c)| c == '|' && !line[..i].ends_with('\\'))
            .count()
    };
    // the first table: the per-configuration summary
    let rows: Vec<&str> = md
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert_eq!(rows.len(), 2 + 3, "header, rule and three methods:\n{md}");
    let header = separators(rows[0]);
    for row in &rows {
        assert_eq!(separators(row), header, "{row}");
    }
    assert!(md.contains("k\\|2 row"), "{md}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `experiments/toy-chain.toml` cut to 3 prompts of `max_tokens` tokens on its order-1
/// pair at `temperature`, with plain decoding (`plain`) and then `methods` (`[[methods]]`
/// tables); `name` names the scratch folder.
fn run_toy_methods(name: &str, temperature: &str, max_tokens: usize, methods: &str) -> RunResults {
    let text = include_str!("../../experiments/toy-chain.toml")
        .replace("count = 20", "count = 3")
        .replace("max_tokens = 200", &format!("max_tokens = {max_tokens}"))
        .replace("order = 0 ", "order = 1 ")
        .replace("temperature = 1.0", &format!("temperature = {temperature}"));
    let methods_at = text.find("[[methods]]").unwrap();
    let text = format!(
        "{}[[methods]]\nname = \"plain\"\ndrafter = {{ kind = \"plain\" }}\n\n{methods}",
        &text[..methods_at]
    );
    let loaded = ExperimentConfig::from_toml(&text, &format!("{name}.toml")).unwrap();
    let dir = temp_dir(&format!("{name}-{temperature}"));
    let results = run_experiment(&loaded, &dir, false).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    results
}

/// `depth` bounds a dynamic tree's layers (one draft pass each): with `depth = 2` no step drafts
/// deeper than 2, while the same 6-node tree (one child per layer) drafts deeper without it;
/// both give plain decoding's greedy text.
#[test]
fn a_dynamic_tree_depth_bounds_the_drafted_layers() {
    let results = run_toy_methods(
        "depth",
        "0.0",
        40,
        r#"[[methods]]
name = "tree-6"
drafter = { kind = "dynamic_tree", nodes = 6, top_k = 1 }
verifier = { kind = "greedy" }
policy = { kind = "fixed", k = 6 }

[[methods]]
name = "tree-6-depth-2"
drafter = { kind = "dynamic_tree", nodes = 6, top_k = 1, depth = 2 }
verifier = { kind = "greedy" }
policy = { kind = "fixed", k = 6 }
"#,
    );
    let deepest = |method: &str| {
        results
            .steps
            .iter()
            .filter(|s| s.method == method)
            .map(|s| s.draft_depth)
            .max()
            .unwrap()
    };
    assert!(deepest("tree-6") > 2, "deepest {}", deepest("tree-6"));
    assert_eq!(deepest("tree-6-depth-2"), 2);
    let texts = |method: &str| -> Vec<Option<String>> {
        results
            .requests
            .iter()
            .filter(|r| r.method == method)
            .map(|r| r.text.clone())
            .collect()
    };
    assert_eq!(texts("tree-6"), texts("plain"));
    assert_eq!(texts("tree-6-depth-2"), texts("plain"));
}

/// `min_confidence` stops a chain where the draft's probability of it falls below the minimum:
/// at T = 1 steps of the same K = 6 chain then draft fewer tokens, how many following the drawn
/// tokens, where without it every step drafts six; at T = 0 (confidence over the draft's plain softmax) both give
/// plain decoding's greedy text.
#[test]
fn a_minimum_confidence_stops_chains_early_and_keeps_the_greedy_text() {
    let run = |temperature: &str| {
        run_toy_methods(
            "confidence",
            temperature,
            60,
            r#"[[methods]]
name = "chain-6"
drafter = { kind = "chain" }
policy = { kind = "fixed", k = 6 }

[[methods]]
name = "chain-6-confident"
drafter = { kind = "chain", min_confidence = 0.001 }
policy = { kind = "fixed", k = 6 }
"#,
        )
    };
    let sampled = run("1.0");
    let depths = |method: &str| -> Vec<usize> {
        sampled
            .steps
            .iter()
            .filter(|s| s.method == method && s.draft_depth > 0)
            .map(|s| s.draft_depth)
            .collect()
    };
    let (full, confident) = (depths("chain-6"), depths("chain-6-confident"));
    // the last steps of a request may draft less than K where its tokens run out
    let short = |depths: &[usize]| depths.iter().filter(|&&d| d < 6).count();
    assert!(short(&full) <= 3, "without the key: {full:?}");
    let distinct: std::collections::BTreeSet<usize> = confident.iter().copied().collect();
    assert!(
        short(&confident) > 3 && distinct.len() >= 2,
        "stopped early, at depths that follow the drawn tokens: {confident:?}"
    );
    let greedy = run("0.0");
    let texts = |method: &str| -> Vec<Option<String>> {
        greedy
            .requests
            .iter()
            .filter(|r| r.method == method)
            .map(|r| r.text.clone())
            .collect()
    };
    assert_eq!(texts("chain-6"), texts("plain"));
    assert_eq!(texts("chain-6-confident"), texts("plain"));
}
