//! Training on synthetic targets (no model file, no download): the loss falls, the head file
//! loads for its target and no other, a paused run resumes into the same parameters, and bad
//! settings are refused before any step.
//!
//! Data: sequences of 4 random tokens followed by 20 tokens the target picks greedily, so the
//! continuation (and the target's features along it) is a function of the context a head can
//! learn. Sizes are kept small (FFN 64, batches of 4) so each run takes a few seconds.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use common::{cache, config, greedy_sequences, target, temp_dir};
use safetensors::SafeTensors;
use specdec_models::heads::{HeadFile, HeadKind};
use specdec_models::llama::Architecture;
use specdec_train::{
    evaluate_head, fitted_steps, train, FeatureCache, FrozenTarget, KindArg, Schedule,
    ScheduleChange, StopReason, TrainConfig, TrainControl, TrainData, TrainHeadOptions, TrainPaths,
    TrainReport,
};

/// The EAGLE loss must fall at least this much: mean of the last tenth of the steps ≤ this
/// fraction of the mean of the first tenth (the feature regression has a floor near 0).
const LOSS_MARGIN: f32 = 0.8;
/// The Medusa loss is cross-entropy alone, whose floor is the labels' entropy (the synthetic
/// targets' distributions are flat: about 3.35 of the ~3.55 nats per head at the start), so
/// its margin is small; the KL divergence to the labels (floor 0) carries the weight.
const MEDUSA_LOSS_MARGIN: f32 = 0.97;
/// The KL parts must fall at least this much (last tenth against first tenth).
const KL_MARGIN: f32 = 0.6;

/// Mean of component `name` over the first and the last tenth of the steps.
fn component_tenths(report: &TrainReport, name: &str) -> (f32, f32) {
    let i = report
        .component_names
        .iter()
        .position(|n| n == name)
        .unwrap_or_else(|| panic!("no component {name}"));
    let values: Vec<f32> = report.history.iter().map(|r| r.components[i]).collect();
    let tenth = (values.len() / 10).max(1);
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    (
        mean(&values[..tenth]),
        mean(&values[values.len() - tenth..]),
    )
}

fn data(cache: &FeatureCache) -> TrainData<'_> {
    TrainData {
        cache,
        data_sha256: cache.key().data_sha256.clone(),
        extra: BTreeMap::from([("data".to_string(), "greedy synthetic".to_string())]),
    }
}

/// A small, quick configuration of `kind` (then `edit`).
fn small(kind: KindArg, edit: impl FnOnce(&mut TrainHeadOptions)) -> TrainConfig {
    config(kind, |o| {
        o.steps = Some(120);
        o.batch = 4;
        o.lr = 3e-3;
        o.holdout = 6;
        o.draft_vocab = 48;
        if kind == KindArg::Eagle {
            o.ffn = Some(64);
        }
        edit(o);
    })
}

struct Setup {
    dir: std::path::PathBuf,
    target: FrozenTarget,
    cache: FeatureCache,
}

fn setup(name: &str, arch: Architecture) -> Setup {
    let dir = temp_dir(name);
    let target = target(arch, 11);
    let sequences = greedy_sequences(&target, 30, 4, 20, 1);
    let cache = cache(&target, &sequences, &dir.join("features"));
    Setup { dir, target, cache }
}

fn run(s: &Setup, cfg: &TrainConfig, head: &str, control: &TrainControl) -> TrainReport {
    let paths = TrainPaths::next_to(&s.dir.join(head));
    train(&s.target, &data(&s.cache), cfg, &paths, control).unwrap()
}

fn assert_loss_falls(report: &TrainReport, margin: f32, what: &str) {
    assert_eq!(report.history.len() as u64, report.steps);
    assert!(
        report.loss_last_tenth <= margin * report.loss_first_tenth,
        "{what}: loss {} → {} did not fall below {margin} of its start\n{}",
        report.loss_first_tenth,
        report.loss_last_tenth,
        report.summary()
    );
}

/// The saved head loads, validates, describes its training, and refuses another target.
fn assert_head_file(report: &TrainReport, s: &Setup, kind: HeadKind) -> HeadFile {
    let head = HeadFile::load(&report.paths.head).unwrap();
    let m = &head.meta;
    assert_eq!(m.kind, kind);
    assert_eq!(&m.target, s.target.identity());
    assert_eq!(m.feature_blocks, [s.target.config().n_layers - 1]);
    assert_eq!((m.draft_vocab, head.d2t.len()), (48, 48));
    assert_eq!(m.training.steps, report.steps);
    assert_eq!(m.training.tokens_seen, report.positions_seen);
    assert_eq!(m.training.data_sha256, s.cache.key().data_sha256);
    for key in [
        "lr",
        "agreement_depth1",
        "agreement_depth2",
        "positions_per_s",
        "final_loss",
    ] {
        assert!(m.training.extra.contains_key(key), "extra lacks {key}");
    }
    let me = &s.target.identity().sha256;
    head.check_target(&s.target.identity().name, me).unwrap();
    let other = "0123456789ab".repeat(5) + "cdef";
    let err = head
        .check_target("another.gguf", &other)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("another.gguf") && err.contains(&s.target.identity().name),
        "{err}"
    );
    // The recorded agreement is the stored (bf16) head's, measured as `specdec eval-head` does.
    let holdout: usize = m.training.extra["holdout_sequences"].parse().unwrap();
    let n = s.cache.len();
    let measured = evaluate_head(&head, &s.target, &s.cache, n - holdout..n, 2, 4).unwrap();
    assert_eq!(measured.agreement, report.agreement);
    assert_eq!(measured.positions, report.agreement_positions);
    assert_eq!(measured.sequences, holdout);
    let svg = std::fs::read_to_string(&report.paths.loss_svg).unwrap();
    assert!(
        svg.contains("<svg") && svg.contains("total"),
        "a loss curve with a legend"
    );
    assert!(report.head_bytes > 0 && report.positions_per_s > 0.0);
    head
}

/// Trains a small head of `kind` on a fresh synthetic `arch` target and checks what every run
/// must give: the loss falls by `margin`, the head file is right.
fn trained(
    name: &str,
    arch: Architecture,
    kind: KindArg,
    edit: impl FnOnce(&mut TrainHeadOptions),
    margin: f32,
) -> (TrainReport, HeadFile) {
    let s = setup(name, arch);
    let report = run(
        &s,
        &small(kind, edit),
        "head.safetensors",
        &TrainControl::default(),
    );
    eprintln!("{}", report.summary());
    assert_loss_falls(&report, margin, name);
    let head = assert_head_file(&report, &s, kind.into());
    (report, head)
}

#[test]
fn eagle_training_lowers_the_loss_and_writes_a_head_for_its_target() {
    let (report, head) = trained(
        "eagle-llama",
        Architecture::Llama,
        KindArg::Eagle,
        |_| {},
        LOSS_MARGIN,
    );
    assert_eq!(
        report.component_names,
        ["feat@1", "ce@1", "kl@1", "feat@2", "ce@2", "kl@2"]
    );
    assert!(report.history.iter().all(|r| r.components.len() == 6));
    // Both parts fall at depth 2 too (training-time test), not only at depth 1.
    for name in ["feat@1", "kl@1", "feat@2", "kl@2"] {
        let (first, last) = component_tenths(&report, name);
        assert!(last <= KL_MARGIN * first, "{name}: {first} → {last}");
    }
    // Trained well above chance (1/48) at both depths.
    assert_eq!(report.agreement.len(), 2);
    assert!(
        report.agreement.iter().all(|&a| a > 0.1),
        "{:?}",
        report.agreement
    );
    let e = head.meta.eagle.as_ref().unwrap();
    assert_eq!(
        (e.ffn, e.qkv_bias, e.rope_layout.as_str()),
        (64, false, "interleaved")
    );
    assert_eq!(head.meta.training.extra["unroll"], "2");
}

#[test]
fn qwen2_eagle_heads_train_with_qkv_bias_and_half_split_rope() {
    let (report, head) = trained(
        "eagle-qwen2",
        Architecture::Qwen2,
        KindArg::Eagle,
        |o| o.unroll = Some(3),
        LOSS_MARGIN,
    );
    assert_eq!(report.component_names.len(), 9, "three unrolled steps");
    let e = head.meta.eagle.as_ref().unwrap();
    assert_eq!((e.qkv_bias, e.rope_layout.as_str()), (true, "half_split"));
    assert!(head.tensors.contains_key("bq"));
}

#[test]
fn medusa_training_lowers_the_loss() {
    let (report, head) = trained(
        "medusa",
        Architecture::Llama,
        KindArg::Medusa,
        |o| o.medusa_heads = Some(3),
        MEDUSA_LOSS_MARGIN,
    );
    assert_eq!(
        report.component_names,
        ["ce@1", "kl@1", "ce@2", "kl@2", "ce@3", "kl@3"]
    );
    for k in 1..=3 {
        let (first, last) = component_tenths(&report, &format!("kl@{k}"));
        assert!(last <= KL_MARGIN * first, "kl@{k}: {first} → {last}");
    }
    assert_eq!(head.meta.medusa_heads, 3);
    assert!(head.tensors.contains_key("medusa.2.weight"));
}

/// The `param.*` tensors of a checkpoint, by name, as raw bytes (F32).
fn checkpoint_params(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let bytes = std::fs::read(path).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .filter(|(name, _)| name.starts_with("param.") || name.starts_with("adam_"))
        .map(|(name, view)| (name, view.data().to_vec()))
        .collect()
}

#[test]
fn a_paused_run_resumes_into_the_same_parameters_as_an_uninterrupted_one() {
    let s = setup("resume", Architecture::Llama);
    let cfg = small(KindArg::Eagle, |o| o.steps = Some(24));
    // The uninterrupted run measures its learning curve every 8 steps; the final point is the
    // run's own final measurement.
    let whole = run(
        &s,
        &cfg,
        "whole.safetensors",
        &TrainControl {
            eval_every: 8,
            ..TrainControl::default()
        },
    );
    assert_eq!(whole.stop, StopReason::Finished);
    let steps = |r: &TrainReport| r.agreement_curve.iter().map(|a| a.step).collect::<Vec<_>>();
    assert_eq!(steps(&whole), [8, 16, 24]);
    assert_eq!(whole.agreement_curve[2].agreement, whole.agreement);
    assert!(
        whole.summary().contains("held-out agreement by step"),
        "{}",
        whole.summary()
    );
    let recorded = HeadFile::load(&whole.paths.head)
        .unwrap()
        .meta
        .training
        .extra;
    let curve = &recorded["agreement_curve_percent"];
    assert_eq!(curve.split(',').count(), 3, "{curve}");
    assert!(curve.starts_with("8:") && curve.contains(",24:"), "{curve}");
    let paused = run(
        &s,
        &cfg,
        "parts.safetensors",
        &TrainControl {
            pause_at: Some(9),
            checkpoint_every: 4,
            ..TrainControl::default()
        },
    );
    assert_eq!((paused.stop, paused.steps), (StopReason::Paused, 9));
    // the paused run's head file is written and says how far it got
    let head = HeadFile::load(&paused.paths.head).unwrap();
    assert_eq!(head.meta.training.steps, 9);
    let resumed = run(
        &s,
        &cfg,
        "parts.safetensors",
        &TrainControl {
            resume: true,
            eval_every: 8,
            ..TrainControl::default()
        },
    );
    assert_eq!((resumed.stop, resumed.steps), (StopReason::Finished, 24));
    // Measuring changes no parameter (the first part ran without it; the comparison of the
    // checkpoints below covers the rest): the curve from step 16 on is the whole run's.
    assert!(paused.agreement_curve.is_empty());
    assert_eq!(resumed.agreement_curve, whole.agreement_curve[1..]);
    // The step count and the loss curve continue: the same 24 records as the whole run.
    assert_eq!(resumed.history, whole.history);
    assert_eq!(resumed.positions_seen, whole.positions_seen);
    // Parameters and AdamW moments are bit-identical (CPU kernels are deterministic).
    let (a, b) = (
        checkpoint_params(&whole.paths.checkpoint),
        checkpoint_params(&resumed.paths.checkpoint),
    );
    assert!(
        a.len() > 20,
        "params and both moments of every trainable tensor"
    );
    assert_eq!(a, b);
    // Resuming a finished run takes no step and changes nothing.
    let again = run(
        &s,
        &cfg,
        "parts.safetensors",
        &TrainControl {
            resume: true,
            ..TrainControl::default()
        },
    );
    assert_eq!(again.steps, 24);
    assert_eq!(checkpoint_params(&again.paths.checkpoint), a);
}

#[test]
fn a_schedule_sized_to_the_time_limit_comes_from_the_probe_and_survives_a_resume() {
    let s = setup("fitted", Architecture::Llama);
    // the steps here are a placeholder the fitted schedule replaces
    let cfg = small(KindArg::Eagle, |o| o.steps = Some(7));
    let limit = Duration::from_millis(1500);
    let fit = TrainControl {
        time_limit: Some(limit),
        schedule: Schedule::FitTimeLimit,
        pause_at: Some(2),
        ..TrainControl::default()
    };
    let first = run(&s, &cfg, "fit.safetensors", &fit);
    let probe_s = first
        .probe_step_s
        .expect("a new fitted run times its steps");
    assert!(probe_s.is_finite() && probe_s > 0.0, "{probe_s}");
    assert_eq!(first.steps_planned, fitted_steps(limit, probe_s));
    assert!(first.steps_planned > 2, "{}", first.summary());
    assert_eq!((first.stop, first.steps), (StopReason::Paused, 2));
    assert!(first
        .summary()
        .contains("schedule sized to the time budget"));
    // the fitted schedule warms up over 5 % of its steps, as the head file records
    let extra = HeadFile::load(&first.paths.head)
        .unwrap()
        .meta
        .training
        .extra;
    assert_eq!(
        extra["warmup_steps"],
        (first.steps_planned / 20).to_string()
    );
    assert_eq!(extra["steps_planned"], first.steps_planned.to_string());
    // resumed: the checkpoint's schedule, no new probe
    let resume = TrainControl {
        resume: true,
        pause_at: None,
        ..fit.clone()
    };
    let second = run(&s, &cfg, "fit.safetensors", &resume);
    assert_eq!(second.steps_planned, first.steps_planned);
    assert_eq!(second.probe_step_s, None);
    assert!(second.steps > 2 && second.steps <= second.steps_planned);
    // sizing needs a budget
    let paths = TrainPaths::next_to(&s.dir.join("unbounded.safetensors"));
    let unbounded = TrainControl {
        schedule: Schedule::FitTimeLimit,
        ..TrainControl::default()
    };
    let err = train(&s.target, &data(&s.cache), &cfg, &paths, &unbounded)
        .unwrap_err()
        .to_string();
    assert!(err.contains("--minutes"), "{err}");
    assert!(!paths.checkpoint.exists());
}

#[test]
fn a_resumed_run_keeps_its_schedule_or_is_replanned_to_new_steps() {
    let s = setup("replan", Architecture::Llama);
    let cfg = small(KindArg::Eagle, |o| {
        o.steps = Some(10);
        o.warmup_steps = Some(2);
    });
    let head = "replan.safetensors";
    let pause = |at| TrainControl {
        pause_at: Some(at),
        ..TrainControl::default()
    };
    let first = run(&s, &cfg, head, &pause(4));
    assert_eq!(
        (first.stop, first.steps, first.steps_planned),
        (StopReason::Paused, 4, 10)
    );
    // resumed with another config's length, kept: the checkpoint's schedule
    let placeholder = small(KindArg::Eagle, |o| o.steps = Some(99));
    let stored = TrainControl {
        resume: true,
        schedule: Schedule::Stored,
        pause_at: Some(5),
        ..TrainControl::default()
    };
    let kept = run(&s, &placeholder, head, &stored);
    assert_eq!((kept.steps, kept.steps_planned), (5, 10));
    assert!(kept.schedule_changes.is_empty());
    // re-planned to fewer steps than done: refused, naming both
    let replan = TrainControl {
        resume: true,
        schedule: Schedule::Replan,
        ..TrainControl::default()
    };
    let paths = TrainPaths::next_to(&s.dir.join(head));
    let short = small(KindArg::Eagle, |o| o.steps = Some(4));
    let err = train(&s.target, &data(&s.cache), &short, &paths, &replan)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--steps: 4 is fewer than the 5 steps the checkpoint has done"),
        "{err}"
    );
    // re-planned to 7 steps: the warm-up kept, the cosine spread to step 7 from here on
    let shorter = small(KindArg::Eagle, |o| o.steps = Some(7));
    let replanned = run(&s, &shorter, head, &replan);
    assert_eq!(
        (replanned.stop, replanned.steps, replanned.steps_planned),
        (StopReason::Finished, 7, 7)
    );
    let change = ScheduleChange {
        at_step: 5,
        from_steps: 10,
        to_steps: 7,
    };
    assert_eq!(replanned.schedule_changes, [change]);
    let old = cfg.optimizer;
    let new = specdec_train::optim::AdamWConfig {
        total_steps: 7,
        ..old
    };
    for record in &replanned.history {
        let expected = if record.step < 5 { old } else { new }.lr_at(record.step);
        assert_eq!(record.lr, expected, "step {}", record.step);
    }
    assert_ne!(
        old.lr_at(5),
        new.lr_at(5),
        "the curves differ where it resumed"
    );
    assert!(replanned
        .summary()
        .contains("schedule re-planned at step 5: 10 -> 7 steps"));
    let extra = HeadFile::load(&replanned.paths.head)
        .unwrap()
        .meta
        .training
        .extra;
    assert_eq!(extra["schedule_changes"], "5:10->7");
    assert_eq!(
        (
            extra["steps_planned"].as_str(),
            extra["warmup_steps"].as_str()
        ),
        ("7", "2")
    );
    // the re-plan is the run's now: resuming keeps it, and another setting is still refused
    let again = run(&s, &placeholder, head, &stored);
    assert_eq!((again.steps, again.steps_planned), (7, 7));
    assert_eq!(again.schedule_changes, [change]);
    let other = small(KindArg::Eagle, |o| {
        o.steps = Some(8);
        o.lr = 1e-4;
    });
    let err = train(&s.target, &data(&s.cache), &other, &paths, &replan)
        .unwrap_err()
        .to_string();
    assert!(err.contains("another run") && err.contains("lr"), "{err}");
    // a schedule from a checkpoint needs a resumed run
    let paths = TrainPaths::next_to(&s.dir.join("new.safetensors"));
    let unresumed = TrainControl {
        resume: false,
        ..stored
    };
    let err = train(&s.target, &data(&s.cache), &cfg, &paths, &unresumed)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--resume: a schedule taken from a checkpoint"),
        "{err}"
    );
    assert!(!paths.checkpoint.exists());
}

#[test]
fn a_stop_signal_ends_the_run_cleanly_and_resume_continues() {
    let s = setup("interrupted", Architecture::Llama);
    let cfg = small(KindArg::Eagle, |o| o.steps = Some(6));
    let head = "interrupted.safetensors";
    let paused = run(
        &s,
        &cfg,
        head,
        &TrainControl {
            pause_at: Some(2),
            ..TrainControl::default()
        },
    );
    assert_eq!((paused.stop, paused.steps), (StopReason::Paused, 2));
    // the flag a signal sets, already set: the run stops before its next step
    let stopped = TrainControl {
        resume: true,
        stop: Some(Arc::new(AtomicBool::new(true))),
        ..TrainControl::default()
    };
    let interrupted = run(&s, &cfg, head, &stopped);
    assert_eq!(
        (interrupted.stop, interrupted.steps),
        (StopReason::Interrupted, 2)
    );
    let written = HeadFile::load(&interrupted.paths.head).unwrap();
    assert_eq!(written.meta.training.steps, 2);
    assert_eq!(written.meta.training.extra["stopped"], "Interrupted");
    let resume = TrainControl {
        resume: true,
        stop: Some(Arc::new(AtomicBool::new(false))),
        ..TrainControl::default()
    };
    let finished = run(&s, &cfg, head, &resume);
    assert_eq!((finished.stop, finished.steps), (StopReason::Finished, 6));
}

#[test]
fn resuming_another_runs_checkpoint_or_none_is_refused() {
    let s = setup("resume-refused", Architecture::Llama);
    let cfg = small(KindArg::Eagle, |o| o.steps = Some(3));
    run(&s, &cfg, "head.safetensors", &TrainControl::default());
    let resume = TrainControl {
        resume: true,
        ..TrainControl::default()
    };
    let other = small(KindArg::Eagle, |o| {
        o.steps = Some(3);
        o.lr = 1e-4;
    });
    let paths = TrainPaths::next_to(&s.dir.join("head.safetensors"));
    let err = train(&s.target, &data(&s.cache), &other, &paths, &resume)
        .unwrap_err()
        .to_string();
    assert!(err.contains("another run") && err.contains("lr"), "{err}");
    let paths = TrainPaths::next_to(&s.dir.join("none.safetensors"));
    let err = train(&s.target, &data(&s.cache), &cfg, &paths, &resume)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no checkpoint"), "{err}");
}

#[test]
fn bad_settings_are_refused_before_any_step() {
    let s = setup("refused", Architecture::Llama);
    let paths = TrainPaths::next_to(&s.dir.join("head.safetensors"));
    let refuse = |cfg: TrainConfig, needle: &str| {
        let err = train(
            &s.target,
            &data(&s.cache),
            &cfg,
            &paths,
            &TrainControl::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(needle), "expected `{needle}` in: {err}");
        assert!(!paths.checkpoint.exists(), "no step ran for `{needle}`");
    };
    refuse(
        small(KindArg::Eagle, |o| o.draft_vocab = 65),
        "--draft-vocab: 65 is outside 1..=64",
    );
    refuse(small(KindArg::Eagle, |o| o.holdout = 30), "--holdout");
    // eval-head's refusals: depths, sequences, a head of another target.
    let (_, head) = {
        let cfg = small(KindArg::Eagle, |o| o.steps = Some(2));
        let report = run(&s, &cfg, "eval.safetensors", &TrainControl::default());
        let head = HeadFile::load(&report.paths.head).unwrap();
        (report, head)
    };
    let eval_err = |target: &FrozenTarget, range: std::ops::Range<usize>, depths: usize| {
        // the message with its causes, as `specdec` prints it
        let err = evaluate_head(&head, target, &s.cache, range, depths, 4).unwrap_err();
        let mut text = err.to_string();
        let mut cause = std::error::Error::source(&err);
        while let Some(c) = cause {
            text += &format!(": {c}");
            cause = c.source();
        }
        text
    };
    assert!(eval_err(&s.target, 0..4, 0).contains("--depths: 0 is outside 1..=8"));
    assert!(eval_err(&s.target, 0..4, 9).contains("--depths"));
    assert!(eval_err(&s.target, 28..31, 2).contains("--skip"));
    assert!(eval_err(&s.target, 4..4, 2).contains("--skip"));
    let other = target(Architecture::Llama, 12);
    let err = eval_err(&other, 0..4, 2);
    assert!(
        err.contains("the head to measure") && err.contains("trained for target"),
        "{err}"
    );
    // Option-level refusals (no target needed).
    let options_err = |edit: fn(&mut TrainHeadOptions)| {
        let mut o = TrainHeadOptions::new("synthetic", KindArg::Eagle);
        edit(&mut o);
        o.train_config().unwrap_err().to_string()
    };
    assert!(options_err(|o| o.unroll = Some(1)).contains("--unroll: 1 is outside 2..=8"));
    assert!(options_err(|o| o.lr = -1.0).contains("--lr"));
    assert!(options_err(|o| o.beta2 = 1.0).contains("--beta2"));
    assert!(options_err(|o| o.warmup_steps = Some(5000)).contains("--warmup-steps"));
    assert!(options_err(|o| o.medusa_heads = Some(2)).contains("--medusa-heads"));
    assert!(options_err(|o| o.minutes = Some(0.0)).contains("--minutes"));
    // a budget past any run, which no clock could hold, before any work
    assert!(options_err(|o| o.minutes = Some(1e300)).contains("--minutes: must be at most 525600"));
    // a schedule sized by --minutes sets its own warm-up
    let err = options_err(|o| {
        o.minutes = Some(5.0);
        o.warmup_steps = Some(10);
    });
    assert!(err.contains("--warmup-steps: needs --steps"), "{err}");
    // a resumed run keeps its warm-up; its schedule is the checkpoint's unless --steps re-plans it
    let err = options_err(|o| {
        o.resume = true;
        o.warmup_steps = Some(10);
    });
    assert!(err.contains("--warmup-steps: a resumed run keeps"), "{err}");
    let schedule = |resume, steps, minutes| {
        let mut o = TrainHeadOptions::new("synthetic", KindArg::Eagle);
        (o.resume, o.steps, o.minutes) = (resume, steps, minutes);
        o.schedule()
    };
    assert_eq!(schedule(false, None, None), Schedule::Configured);
    assert_eq!(schedule(false, Some(5), Some(1.0)), Schedule::Configured);
    assert_eq!(schedule(false, None, Some(1.0)), Schedule::FitTimeLimit);
    assert_eq!(schedule(true, None, Some(1.0)), Schedule::Stored);
    assert_eq!(schedule(true, None, None), Schedule::Stored);
    assert_eq!(schedule(true, Some(5), None), Schedule::Replan);
    let mut o = TrainHeadOptions::new("synthetic", KindArg::Medusa);
    o.unroll = Some(2);
    let err = o.train_config().unwrap_err().to_string();
    assert!(
        err.contains("--unroll: applies to --kind eagle only"),
        "{err}"
    );
    let mut o = TrainHeadOptions::new("synthetic", KindArg::Medusa);
    o.input_norms = true;
    let err = o.train_config().unwrap_err().to_string();
    assert!(
        err.contains("--input-norms: applies to --kind eagle only"),
        "{err}"
    );
}
