//! The training loop, one for both head kinds: seeded initialisation and data order, AdamW with
//! warm-up and cosine decay, checkpoints every N steps and at the end (resumable), a time
//! budget, held-out agreement, and the outputs (the head file, its loss curve).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use specdec_kernels::quant::float16::{bf16_to_f32, f32_to_bf16};
use specdec_models::heads::{
    EagleShape, HeadFile, HeadKind, HeadMeta, StoredDtype, TrainingInfo, HEAD_FORMAT_VERSION,
};

use crate::batch::{Batch, DataOrder, Frozen};
use crate::checkpoint::{self, AgreementRecord, CheckpointState, LossRecord, ScheduleChange};
use crate::eagle::{EagleHead, EagleSettings};
use crate::error::{io_error, ModelContext, Result, TensorContext, TrainError};
use crate::evaluate::evaluate_head;
use crate::features::FeatureCache;
use crate::head::HeadModel;
use crate::medusa::{MedusaHead, MEDUSA_DECAY};
use crate::optim::{AdamW, AdamWConfig};
use crate::progress::Progress;
use crate::target::{sha256_of_bytes, FrozenTarget};
use crate::vocab::{coverage, draft_vocabulary};

/// Drafting depths the held-out agreement is measured at (1 and 2).
pub const AGREEMENT_DEPTHS: usize = 2;

/// Timed steps of the probe that sizes a schedule to a time limit
/// ([`Schedule::FitTimeLimit`]), after one untimed step.
pub const PROBE_STEPS: usize = 3;

/// The share of the time limit a fitted schedule plans to fill, leaving room for steps that run
/// slower than the probe's (the run still stops at the limit).
pub const FIT_SHARE: f64 = 0.9;

/// The steps of a schedule fitted to `limit` at `step_s` seconds a step: as many as fill
/// [`FIT_SHARE`] of it, at least one.
pub fn fitted_steps(limit: Duration, step_s: f64) -> u64 {
    let steps = FIT_SHARE * limit.as_secs_f64() / step_s.max(f64::MIN_POSITIVE);
    (steps.floor() as u64).max(1)
}

/// The settings that define a training run (a resumed run must have the same).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainConfig {
    /// Which head.
    pub kind: HeadKind,
    /// Optimiser steps of the whole run (the schedule's length).
    pub steps: u64,
    /// Sequences per step.
    pub batch: usize,
    /// Optimiser and schedule.
    pub optimizer: AdamWConfig,
    /// Seed of initialisation and data order.
    pub seed: u64,
    /// Draft vocabulary size.
    pub draft_vocab: usize,
    /// Held-out sequences (the last ones of the cache), for the agreement measurement.
    pub holdout: usize,
    /// Whether the draft LM head is trained (frozen to the target's rows otherwise).
    pub train_lm_head: bool,
    /// EAGLE: training-time-test steps (≥ 2).
    pub unroll: usize,
    /// EAGLE: weight of the feature regression loss.
    pub w_feat: f64,
    /// EAGLE: weight of the cross-entropy loss.
    pub w_ce: f64,
    /// EAGLE: whether `f̂` is detached between unrolled steps (no gradient through it).
    pub detach_unrolled: bool,
    /// EAGLE: FFN width (the target's when `None`).
    pub eagle_ffn: Option<usize>,
    /// EAGLE: whether the `fc` input's halves are RMS-normalised ([`EagleShape::input_norms`]).
    pub input_norms: bool,
    /// Medusa: number of heads K.
    pub medusa_heads: usize,
}

impl TrainConfig {
    /// This configuration with a schedule of `steps` steps, warmed up over the first 5 % of
    /// them (the rule of a schedule sized by its time limit).
    pub fn with_steps(&self, steps: u64) -> Self {
        self.with_schedule(steps, steps / 20)
    }

    /// This configuration with a schedule of `steps` steps warmed up over `warmup_steps`.
    pub fn with_schedule(&self, steps: u64, warmup_steps: u64) -> Self {
        Self {
            steps,
            optimizer: AdamWConfig {
                warmup_steps,
                total_steps: steps,
                ..self.optimizer
            },
            ..self.clone()
        }
    }
}

/// Where a run's schedule (its length and warm-up) comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Schedule {
    /// `config`'s; a resumed run's must equal its checkpoint's.
    #[default]
    Configured,
    /// Sized to [`TrainControl::time_limit`]: a new run times [`PROBE_STEPS`] steps (their
    /// results thrown away), plans [`fitted_steps`] and warms up over 5 % of them
    /// ([`TrainConfig::with_steps`]); a resumed run keeps its checkpoint's. Needs a time limit.
    FitTimeLimit,
    /// A resumed run's: its checkpoint's (`config`'s length and warm-up are not read).
    Stored,
    /// A resumed run's, re-planned: `config.steps` (at least the steps done) replaces the
    /// checkpoint's length, and its warm-up is kept, so the cosine decay runs from the end of
    /// the warm-up to the new last step (the learning rate moves onto the new curve at the
    /// step the run resumes from). Recorded in the head file (`schedule_changes`).
    Replan,
}

/// Where a run's files go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainPaths {
    /// The head file (`HeadFile::save`, BF16).
    pub head: PathBuf,
    /// The checkpoint (F32 tensors, AdamW moments, run state).
    pub checkpoint: PathBuf,
    /// The loss curve.
    pub loss_svg: PathBuf,
}

impl TrainPaths {
    /// The head at `head`, with `NAME.ckpt.safetensors` and `NAME.loss.svg` next to it
    /// (`NAME` = the head's file name without its extension).
    pub fn next_to(head: &Path) -> Self {
        let stem = head
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "head".into());
        let sibling = |suffix: &str| head.with_file_name(format!("{stem}.{suffix}"));
        Self {
            head: head.to_path_buf(),
            checkpoint: sibling("ckpt.safetensors"),
            loss_svg: sibling("loss.svg"),
        }
    }
}

/// The data of a run: the feature cache and its provenance.
#[derive(Debug)]
pub struct TrainData<'a> {
    /// Tokens and target features.
    pub cache: &'a FeatureCache,
    /// SHA-256 of the data the sequences come from (recorded in the head file).
    pub data_sha256: String,
    /// Provenance written to the head's `training.extra` (data name, sizes, …).
    pub extra: BTreeMap<String, String>,
}

/// How a run is driven (none of it changes the result, except where it stops).
#[derive(Debug, Clone, Default)]
pub struct TrainControl {
    /// Continue from the checkpoint at [`TrainPaths::checkpoint`] (which must exist and belong
    /// to the same run); otherwise start from step 0, replacing any checkpoint there.
    pub resume: bool,
    /// Stop cleanly (checkpoint, head, curve) once the training steps of this invocation have
    /// taken this long; the step in progress finishes first.
    pub time_limit: Option<Duration>,
    /// Where the schedule comes from ([`Schedule::Configured`]: `config`'s).
    pub schedule: Schedule,
    /// Stop cleanly once this many steps of the run are done (before `steps`); `--resume`
    /// continues.
    pub pause_at: Option<u64>,
    /// Write the checkpoint every this many steps (and always at the end); 0 means only at the
    /// end.
    pub checkpoint_every: u64,
    /// Measure the held-out agreement every this many steps, as at the end (the head rounded to
    /// BF16, through `eval-head`'s path), into [`TrainReport::agreement_curve`]; 0 means only
    /// at the end. The measurements count neither as training time nor against `time_limit`.
    pub eval_every: u64,
    /// Show progress: a bar on a terminal, plain lines where stderr is not one.
    pub progress: bool,
    /// Checked before every step: once set, the run stops there as at a pause (checkpoint,
    /// head file, loss curve; `--resume` continues). `specdec train-head` sets it on SIGINT or
    /// SIGTERM ([`stop_on_signals`]).
    pub stop: Option<Arc<AtomicBool>>,
}

/// A flag set by SIGINT and SIGTERM, for [`TrainControl::stop`]; a second signal ends the
/// process at once (exit status 130), the last periodic checkpoint being on disk.
///
/// # Errors
/// [`TrainError::Io`] when the handlers cannot be installed.
pub fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // the order matters: the shutdown fires only when the flag is already set
        signal_hook::flag::register_conditional_shutdown(signal, 130, Arc::clone(&flag))
            .and_then(|_| signal_hook::flag::register(signal, Arc::clone(&flag)))
            .map_err(|source| TrainError::Io {
                path: "installing the SIGINT / SIGTERM handlers".into(),
                source,
            })?;
    }
    Ok(flag)
}

impl TrainControl {
    /// Whether the learning curve has a point at `step` ([`TrainControl::eval_every`]).
    fn measures_at(&self, step: u64) -> bool {
        self.eval_every > 0 && step.is_multiple_of(self.eval_every)
    }
}

/// The stop the plan makes before a run's next step, `step` steps done: all of `config.steps`
/// done, or [`TrainControl::pause_at`] reached (the time budget is checked apart).
fn planned_stop(config: &TrainConfig, control: &TrainControl, step: u64) -> Option<StopReason> {
    if step >= config.steps {
        Some(StopReason::Finished)
    } else if control.pause_at.is_some_and(|p| step >= p) {
        Some(StopReason::Paused)
    } else {
        None
    }
}

/// Why a run stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// All planned steps are done.
    Finished,
    /// The time budget ran out.
    TimeLimit,
    /// [`TrainControl::pause_at`] was reached.
    Paused,
    /// [`TrainControl::stop`] was set (SIGINT or SIGTERM).
    Interrupted,
}

/// What a run did and measured.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainReport {
    /// The files written.
    pub paths: TrainPaths,
    /// Which head.
    pub kind: HeadKind,
    /// Why it stopped.
    pub stop: StopReason,
    /// Steps done (over all invocations of the run).
    pub steps: u64,
    /// Steps planned.
    pub steps_planned: u64,
    /// Seconds a step took in the probe that sized the schedule, when this invocation sized it
    /// ([`Schedule::FitTimeLimit`]).
    pub probe_step_s: Option<f64>,
    /// The schedule's re-plans ([`Schedule::Replan`]) over all invocations, in order.
    pub schedule_changes: Vec<ScheduleChange>,
    /// Training positions seen (each head position once per unrolled step or Medusa head).
    pub positions_seen: u64,
    /// Head positions (tokens with a label) seen.
    pub tokens_seen: u64,
    /// Seconds spent in training steps (over all invocations).
    pub train_seconds: f64,
    /// `positions_seen / train_seconds`.
    pub positions_per_s: f64,
    /// Mean total loss over the first tenth of the steps (at least one step).
    pub loss_first_tenth: f32,
    /// Mean total loss over the last tenth of the steps.
    pub loss_last_tenth: f32,
    /// Names of the loss parts (`feat@1`, `ce@1`, …).
    pub component_names: Vec<String>,
    /// Every step's record.
    pub history: Vec<LossRecord>,
    /// Held-out top-1 agreement of the head's argmax with the label's argmax at depths 1, 2,
    /// leaving out the predictions of tokens in the prefix every sequence shares.
    pub agreement: Vec<f64>,
    /// Length of that shared prefix (a chat template's system prompt and first role header).
    pub shared_prefix_tokens: usize,
    /// Held-out positions compared at each depth.
    pub agreement_positions: Vec<u64>,
    /// The held-out agreement at every multiple of [`TrainControl::eval_every`] steps, over
    /// all invocations of the run (at the step the run stopped, when a multiple, it is
    /// [`TrainReport::agreement`]).
    pub agreement_curve: Vec<AgreementRecord>,
    /// The draft vocabulary size.
    pub draft_vocab: usize,
    /// Fraction of the held-out label tokens inside the draft vocabulary.
    pub draft_vocab_coverage: f64,
    /// Trainable values.
    pub trainable_params: usize,
    /// Size of the head file in bytes.
    pub head_bytes: u64,
    /// The feature extraction behind the run, when [`crate::train_head`] did it.
    pub extraction: Option<crate::options::ExtractionReport>,
}

impl TrainReport {
    /// A few lines for people: what was written, throughput, losses, agreement.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        if let Some(x) = &self.extraction {
            let s = &x.stats;
            out.push_str(&format!(
                "features: {} sequences, {} tokens, {:.1} MB in {} ({} sequences extracted \
                 now at {:.0} tokens/s, {} reused)\n",
                x.sequences,
                x.tokens,
                x.cache_bytes as f64 / 1e6,
                x.cache_dir.display(),
                s.sequences,
                s.tokens_per_s(),
                s.resumed_from
            ));
        }
        out.push_str(&format!(
            "{} head: {}/{} steps ({:?}), {} positions ({} head positions) in {:.1} s = {:.0} \
             positions/s ({:.0} head positions/s)\n",
            self.kind.name(),
            self.steps,
            self.steps_planned,
            self.stop,
            self.positions_seen,
            self.tokens_seen,
            self.train_seconds,
            self.positions_per_s,
            self.tokens_seen as f64 / self.train_seconds.max(1e-9)
        ));
        if let Some(step_s) = self.probe_step_s {
            out.push_str(&format!(
                "schedule sized to the time budget: {} steps at {step_s:.2} s a step (the probe's)\n",
                self.steps_planned
            ));
        }
        for change in &self.schedule_changes {
            out.push_str(&format!(
                "schedule re-planned at step {}: {} -> {} steps\n",
                change.at_step, change.from_steps, change.to_steps
            ));
        }
        out.push_str(&format!(
            "loss: first tenth {:.4}, last tenth {:.4}",
            self.loss_first_tenth, self.loss_last_tenth
        ));
        if let Some(last) = self.history.last() {
            for (name, v) in self.component_names.iter().zip(&last.components) {
                out.push_str(&format!(", {name} {v:.4}"));
            }
        }
        out.push('\n');
        let depths: Vec<String> = self
            .agreement
            .iter()
            .zip(&self.agreement_positions)
            .enumerate()
            .map(|(d, (a, n))| format!("depth {} {:.1}% of {n}", d + 1, 100.0 * a))
            .collect();
        out.push_str(&format!(
            "held-out top-1 agreement (after the {}-token prefix all sequences share): {}; draft \
             vocabulary {} ids covering {:.1}% of held-out tokens\n",
            self.shared_prefix_tokens,
            depths.join(", "),
            self.draft_vocab,
            100.0 * self.draft_vocab_coverage
        ));
        if !self.agreement_curve.is_empty() {
            out.push_str(&format!(
                "held-out agreement by step (depth 1 / 2, %): {}\n",
                curve_text(&self.agreement_curve, " ", ", ")
            ));
        }
        out.push_str(&format!(
            "wrote {} ({:.2} MB, {} trainable values), {}, {}",
            self.paths.head.display(),
            self.head_bytes as f64 / 1e6,
            self.trainable_params,
            self.paths.loss_svg.display(),
            self.paths.checkpoint.display()
        ));
        out
    }
}

/// Agreements as percentages joined by `/` (`42.2/39.1`).
fn percents(agreement: &[f64]) -> String {
    let parts: Vec<String> = agreement
        .iter()
        .map(|a| format!("{:.1}", 100.0 * a))
        .collect();
    parts.join("/")
}

/// A learning curve as text: each point's step, `step_sep`, its [`percents`], the points joined
/// by `point_sep`.
fn curve_text(curve: &[AgreementRecord], step_sep: &str, point_sep: &str) -> String {
    let points: Vec<String> = curve
        .iter()
        .map(|r| format!("{}{step_sep}{}", r.step, percents(&r.agreement)))
        .collect();
    points.join(point_sep)
}

/// The head as it is written: the parameters of `head` rounded to BF16, with `meta` and `d2t`.
fn written_head(meta: &HeadMeta, d2t: &[u32], head: &dyn HeadModel) -> Result<HeadFile> {
    let mut file = HeadFile {
        meta: meta.clone(),
        d2t: d2t.to_vec(),
        tensors: head.params().to_head_tensors()?,
    };
    for t in file.tensors.values_mut() {
        for v in &mut t.data {
            *v = bf16_to_f32(f32_to_bf16(*v));
        }
    }
    Ok(file)
}

/// Mean of `values[range]` as f32 (0 for an empty range).
fn mean(values: &[f32]) -> f32 {
    if values.is_empty() {
        0.0
    } else {
        (values.iter().map(|&v| f64::from(v)).sum::<f64>() / values.len() as f64) as f32
    }
}

/// The means of the first and last tenth of `history`'s total losses (a tenth is at least one
/// step).
pub fn tenth_means(history: &[LossRecord]) -> (f32, f32) {
    let losses: Vec<f32> = history.iter().map(|r| r.loss).collect();
    let tenth = (losses.len() / 10).max(1).min(losses.len());
    (
        mean(&losses[..tenth]),
        mean(&losses[losses.len() - tenth..]),
    )
}

/// Checks a configuration against the data before anything runs.
fn check(config: &TrainConfig, cache: &FeatureCache, target: &FrozenTarget) -> Result<()> {
    let refuse = |name: &'static str, reason: String| Err(TrainError::Option { name, reason });
    if cache.hidden() != target.config().hidden {
        return Err(TrainError::FeatureCache {
            path: cache.dir().display().to_string(),
            reason: format!(
                "features of width {}, the target's is {}",
                cache.hidden(),
                target.config().hidden
            ),
        });
    }
    if config.holdout >= cache.len() {
        return refuse(
            "holdout",
            format!(
                "{} held-out sequences leave none of the {} to train on",
                config.holdout,
                cache.len()
            ),
        );
    }
    if (0..cache.len()).any(|i| cache.seq_len(i) < 2) {
        return Err(TrainError::FeatureCache {
            path: cache.dir().display().to_string(),
            reason: "a sequence of fewer than 2 tokens has nothing to predict".into(),
        });
    }
    crate::options::check_train_config(config)
}

/// Seconds one training step takes: the mean of [`PROBE_STEPS`] loss-and-gradient passes over
/// the run's first batches, after one untimed pass. Nothing is updated (the optimiser's step,
/// a small part of a step, is left out).
fn probe_step_seconds(
    head: &dyn HeadModel,
    frozen: &Frozen,
    cache: &FeatureCache,
    n_train: usize,
    config: &TrainConfig,
) -> Result<f64> {
    let mut order = DataOrder::new(n_train, config.seed);
    let mut consumed = 0u64;
    let mut timed = Duration::ZERO;
    for pass in 0..=PROBE_STEPS {
        let indices = order.take(consumed, config.batch);
        consumed += indices.len() as u64;
        let batch = Batch::load(cache, &indices)?;
        let start = Instant::now();
        let loss = head.loss(frozen, &batch)?;
        loss.total
            .backward()
            .tensor_context("backward pass (timing the schedule's steps)")?;
        if pass > 0 {
            timed += start.elapsed();
        }
    }
    Ok(timed.as_secs_f64() / PROBE_STEPS as f64)
}

/// The training labels' token ids (`t_1..t_L` of each sequence in `indices`).
fn label_tokens(cache: &FeatureCache, indices: std::ops::Range<usize>) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for i in indices {
        out.extend_from_slice(&cache.tokens(i)?[1..]);
    }
    Ok(out)
}

/// The head file's metadata for this run (its training record filled in at the end).
fn head_meta(
    config: &TrainConfig,
    target: &FrozenTarget,
    block: usize,
    draft_vocab: usize,
) -> HeadMeta {
    HeadMeta {
        format_version: HEAD_FORMAT_VERSION,
        kind: config.kind,
        target: target.identity().clone(),
        feature_blocks: vec![block],
        draft_vocab,
        eagle: (config.kind == HeadKind::Eagle).then(|| EagleShape {
            input_norms: config.input_norms,
            ..EagleShape::for_target(
                target.config(),
                config.eagle_ffn.unwrap_or(target.config().ffn),
            )
        }),
        medusa_heads: if config.kind == HeadKind::Medusa {
            config.medusa_heads
        } else {
            0
        },
        training: TrainingInfo::default(),
    }
}

/// Trains a head of `config.kind` for `target` on `data`, writing the files of `paths` (see
/// [`TrainControl`] for resuming, time limits and pauses).
///
/// # Errors
/// [`TrainError::Option`] for settings the data cannot satisfy, or a schedule to fit without a
/// time limit (all refused before the first step); [`TrainError::Checkpoint`] for a missing
/// checkpoint or one of another run on resume;
/// [`TrainError::Diverged`] for a non-finite loss; model, tensor and I/O errors.
pub fn train(
    target: &FrozenTarget,
    data: &TrainData<'_>,
    config: &TrainConfig,
    paths: &TrainPaths,
    control: &TrainControl,
) -> Result<TrainReport> {
    let cache = data.cache;
    check(config, cache, target)?;
    let n_train = cache.len() - config.holdout;
    let vocab = target.config().vocab_size;
    let d2t = draft_vocabulary(label_tokens(cache, 0..n_train)?, vocab, config.draft_vocab)?;
    let heldout_labels = label_tokens(cache, n_train..cache.len())?;
    let draft_vocab_coverage = coverage(heldout_labels, &d2t, vocab);
    let frozen = Frozen::new(target, &d2t)?;
    let meta = head_meta(config, target, cache.feature_block(), d2t.len());
    let shapes = meta
        .tensor_shapes()
        .model_context(|| "the head's tensor shapes".into())?;
    let max_positions = (0..cache.len())
        .map(|i| cache.seq_len(i))
        .max()
        .unwrap_or(1);
    let head: Box<dyn HeadModel> = match config.kind {
        HeadKind::Eagle => Box::new(EagleHead::init(
            &meta,
            &frozen,
            EagleSettings {
                unroll: config.unroll,
                w_feat: config.w_feat,
                w_ce: config.w_ce,
                detach: config.detach_unrolled,
                train_lm_head: config.train_lm_head,
                max_positions,
            },
            config.seed,
        )?),
        HeadKind::Medusa => Box::new(MedusaHead::init(
            &shapes,
            &frozen,
            config.medusa_heads,
            config.train_lm_head,
        )?),
    };
    if control.resume && !paths.checkpoint.exists() {
        return Err(TrainError::Checkpoint {
            path: paths.checkpoint.display().to_string(),
            reason: "--resume was given but there is no checkpoint to continue".into(),
        });
    }
    let stored = if control.resume {
        Some(checkpoint::stored_schedule(&paths.checkpoint)?)
    } else {
        None
    };
    // the schedule this invocation follows, the probe that sized it, and the re-plan it makes
    let (scheduled, probe_step_s, change) = match (control.schedule, stored) {
        (Schedule::Configured, _) => (None, None, None),
        (Schedule::FitTimeLimit, None) => {
            let limit = control.time_limit.ok_or_else(|| TrainError::Option {
                name: "minutes",
                reason: "a schedule sized to the time budget needs one".into(),
            })?;
            let step_s = probe_step_seconds(head.as_ref(), &frozen, cache, n_train, config)?;
            let steps = fitted_steps(limit, step_s);
            if control.progress {
                eprintln!(
                    "schedule: {steps} steps ({step_s:.2} s a step over {PROBE_STEPS} probe \
                     steps; {:.0} % of {:.1} minutes)",
                    100.0 * FIT_SHARE,
                    limit.as_secs_f64() / 60.0
                );
            }
            (Some(config.with_steps(steps)), Some(step_s), None)
        }
        (Schedule::FitTimeLimit | Schedule::Stored, Some(s)) => (
            Some(config.with_schedule(s.steps, s.warmup_steps)),
            None,
            None,
        ),
        (Schedule::Replan, Some(s)) => {
            if config.steps < s.done {
                return Err(TrainError::Option {
                    name: "steps",
                    reason: format!(
                        "{} is fewer than the {} steps the checkpoint has done",
                        config.steps, s.done
                    ),
                });
            }
            let change = (config.steps != s.steps).then_some(ScheduleChange {
                at_step: s.done,
                from_steps: s.steps,
                to_steps: config.steps,
            });
            (
                Some(config.with_schedule(config.steps, s.warmup_steps)),
                None,
                change,
            )
        }
        (Schedule::Stored | Schedule::Replan, None) => {
            return Err(TrainError::Option {
                name: "resume",
                reason: "a schedule taken from a checkpoint needs a resumed run".into(),
            })
        }
    };
    if let Some(scheduled) = &scheduled {
        crate::options::check_train_config(scheduled)?;
    }
    let config = scheduled.as_ref().unwrap_or(config);
    let vars = head
        .params()
        .trainable()
        .into_iter()
        .map(|(_, v)| v.clone())
        .collect();
    let mut opt = AdamW::new(config.optimizer, vars)?;
    let run = serde_json::json!({
        "config": config,
        "target_sha256": target.identity().sha256,
        "data_sha256": data.data_sha256,
        "feature_cache": cache.key(),
        "draft_vocab_sha256": sha256_of_bytes(
            &d2t.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>()
        ),
    });
    let mut state = if control.resume {
        let mut state = checkpoint::restore(
            &paths.checkpoint,
            &run,
            change.is_some(),
            head.params(),
            &mut opt,
        )?;
        if let Some(change) = change {
            if control.progress {
                eprintln!(
                    "schedule re-planned at step {}: {} -> {} steps",
                    change.at_step, change.from_steps, change.to_steps
                );
            }
            // the new plan is the run's from here on (a later resume keeps it)
            state.schedule_changes.push(change);
            state.run = run;
        }
        state
    } else {
        CheckpointState::new(run)
    };
    let mut order = DataOrder::new(n_train, config.seed);
    let mut bar = Progress::new(
        control.progress,
        config.steps,
        &format!("training {} head", config.kind.name()),
        "steps",
        "{msg} [{bar:30}] {pos}/{len} steps, eta {eta}",
    );
    bar.start_at(state.step);
    let started = Instant::now();
    let mut eval_time = Duration::ZERO;
    let measure = |file: &HeadFile| {
        evaluate_head(
            file,
            target,
            cache,
            n_train..cache.len(),
            AGREEMENT_DEPTHS,
            config.batch,
        )
    };
    let stop = loop {
        if let Some(reason) = planned_stop(config, control, state.step) {
            break reason;
        }
        if control
            .time_limit
            .is_some_and(|t| started.elapsed().saturating_sub(eval_time) >= t)
        {
            break StopReason::TimeLimit;
        }
        if control
            .stop
            .as_ref()
            .is_some_and(|stop| stop.load(Ordering::Relaxed))
        {
            bar.println(&format!(
                "interrupted after step {}: writing the checkpoint and the head (a second \
                 signal ends the process at once; --resume continues)",
                state.step
            ));
            break StopReason::Interrupted;
        }
        let indices = order.take(state.consumed, config.batch);
        let batch = Batch::load(cache, &indices)?;
        let step_start = Instant::now();
        let loss = head.loss(&frozen, &batch)?;
        let value = loss.total.to_scalar::<f32>().tensor_context("loss")?;
        if !value.is_finite() {
            return Err(TrainError::Diverged {
                step: state.step,
                loss: value,
            });
        }
        let grads = loss.total.backward().tensor_context("backward pass")?;
        let lr = config.optimizer.lr_at(state.step);
        let grad_norm = opt.step(&grads)?;
        state.train_seconds += step_start.elapsed().as_secs_f64();
        state.history.push(LossRecord {
            step: state.step,
            loss: value,
            components: loss.components,
            lr,
            grad_norm,
        });
        state.step += 1;
        state.consumed += indices.len() as u64;
        state.positions += loss.positions;
        state.tokens += batch.lens.iter().map(|&l| l as u64).sum::<u64>();
        bar.set_message(format!(
            "training {} head, loss {value:.4}",
            config.kind.name()
        ));
        bar.set_position(state.step);
        // (the step the run stops at is measured once, after the loop)
        let stops_next = planned_stop(config, control, state.step).is_some();
        if control.measures_at(state.step) && !stops_next {
            let eval_start = Instant::now();
            let agreement = measure(&written_head(&meta, &d2t, head.as_ref())?)?.agreement;
            eval_time += eval_start.elapsed();
            bar.println(&format!(
                "step {}: held-out agreement (depth 1 / 2) {} %",
                state.step,
                percents(&agreement)
            ));
            state.agreement_curve.push(AgreementRecord {
                step: state.step,
                agreement,
            });
        }
        if control.checkpoint_every > 0 && state.step.is_multiple_of(control.checkpoint_every) {
            checkpoint::save(&paths.checkpoint, &state, head.params(), &opt)?;
        }
    };
    bar.finish();
    checkpoint::save(&paths.checkpoint, &state, head.params(), &opt)?;

    // Measured on the head as it is written (BF16), through the path `eval-head` takes.
    let mut file = written_head(&meta, &d2t, head.as_ref())?;
    let evaluation = measure(&file)?;
    let agreement = evaluation.agreement.clone();
    let measured_here = state.agreement_curve.last().map(|r| r.step) == Some(state.step);
    if control.measures_at(state.step) && !measured_here {
        state.agreement_curve.push(AgreementRecord {
            step: state.step,
            agreement: agreement.clone(),
        });
        // the curve's last point, kept for a resumed run
        checkpoint::save(&paths.checkpoint, &state, head.params(), &opt)?;
    }
    let shared_prefix_tokens = evaluation.shared_prefix_tokens;
    let (loss_first_tenth, loss_last_tenth) = tenth_means(&state.history);
    let positions_per_s = if state.train_seconds > 0.0 {
        state.positions as f64 / state.train_seconds
    } else {
        0.0
    };
    let component_names = head.component_names();
    file.meta.training = TrainingInfo {
        data_sha256: data.data_sha256.clone(),
        steps: state.step,
        tokens_seen: state.positions,
        seed: config.seed,
        extra: training_extra(
            config,
            data,
            &state,
            &component_names,
            (loss_first_tenth, loss_last_tenth),
            &agreement,
            positions_per_s,
            draft_vocab_coverage,
            stop,
            shared_prefix_tokens,
        ),
    };
    file.save(&paths.head, StoredDtype::Bf16)
        .model_context(|| format!("writing the head to {}", paths.head.display()))?;
    let title = format!(
        "{} head for {}: loss per step",
        config.kind.name(),
        target.identity().name
    );
    crate::plot::loss_curve(&paths.loss_svg, &title, &state.history, &component_names)?;
    let head_bytes = std::fs::metadata(&paths.head)
        .map_err(io_error(&paths.head))?
        .len();
    Ok(TrainReport {
        paths: paths.clone(),
        kind: config.kind,
        stop,
        steps: state.step,
        steps_planned: config.steps,
        probe_step_s,
        schedule_changes: state.schedule_changes,
        positions_seen: state.positions,
        tokens_seen: state.tokens,
        train_seconds: state.train_seconds,
        positions_per_s,
        loss_first_tenth,
        loss_last_tenth,
        component_names,
        history: state.history,
        agreement_curve: state.agreement_curve,
        agreement,
        agreement_positions: evaluation.positions,
        shared_prefix_tokens,
        draft_vocab: config.draft_vocab,
        draft_vocab_coverage,
        trainable_params: head.params().trainable_count(),
        head_bytes,
        extraction: None,
    })
}

/// The head file's `training.extra`: the settings, the data provenance, the measurements.
#[allow(clippy::too_many_arguments)]
fn training_extra(
    config: &TrainConfig,
    data: &TrainData<'_>,
    state: &CheckpointState,
    component_names: &[String],
    (first, last): (f32, f32),
    agreement: &[f64],
    positions_per_s: f64,
    draft_vocab_coverage: f64,
    stop: StopReason,
    shared_prefix_tokens: usize,
) -> BTreeMap<String, String> {
    let o = &config.optimizer;
    let mut extra = data.extra.clone();
    let mut put = |k: &str, v: String| {
        extra.insert(k.to_string(), v);
    };
    put("lr", o.lr.to_string());
    put("warmup_steps", o.warmup_steps.to_string());
    put("weight_decay", o.weight_decay.to_string());
    put("betas", format!("{},{}", o.beta1, o.beta2));
    put("grad_clip", o.grad_clip.to_string());
    put("batch", config.batch.to_string());
    put("steps_planned", config.steps.to_string());
    if !state.schedule_changes.is_empty() {
        let changes: Vec<String> = state
            .schedule_changes
            .iter()
            .map(|c| format!("{}:{}->{}", c.at_step, c.from_steps, c.to_steps))
            .collect();
        put("schedule_changes", changes.join(","));
    }
    put("stopped", format!("{stop:?}"));
    put("holdout_sequences", config.holdout.to_string());
    put("train_lm_head", config.train_lm_head.to_string());
    match config.kind {
        HeadKind::Eagle => {
            put("unroll", config.unroll.to_string());
            put("w_feat", config.w_feat.to_string());
            put("w_ce", config.w_ce.to_string());
            put(
                "grad_through_unrolled",
                (!config.detach_unrolled).to_string(),
            );
        }
        HeadKind::Medusa => put("medusa_decay", MEDUSA_DECAY.to_string()),
    }
    put("head_positions_seen", state.tokens.to_string());
    put("train_seconds", format!("{:.1}", state.train_seconds));
    put("positions_per_s", format!("{positions_per_s:.1}"));
    put("draft_vocab_coverage", format!("{draft_vocab_coverage:.4}"));
    put("loss_first_tenth", first.to_string());
    put("loss_last_tenth", last.to_string());
    if let Some(r) = state.history.last() {
        put("final_loss", r.loss.to_string());
        for (name, v) in component_names.iter().zip(&r.components) {
            put(&format!("final_{name}"), v.to_string());
        }
    }
    for (d, a) in agreement.iter().enumerate() {
        put(&format!("agreement_depth{}", d + 1), format!("{a:.4}"));
    }
    if !state.agreement_curve.is_empty() {
        put(
            "agreement_curve_percent",
            curve_text(&state.agreement_curve, ":", ","),
        );
    }
    put(
        "agreement_skips_shared_prefix",
        shared_prefix_tokens.to_string(),
    );
    extra
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenths_are_at_least_one_step() {
        let record = |loss| LossRecord {
            step: 0,
            loss,
            components: Vec::new(),
            lr: 0.0,
            grad_norm: 0.0,
        };
        let h: Vec<LossRecord> = (0..20).map(|i| record(i as f32)).collect();
        assert_eq!(tenth_means(&h), (0.5, 18.5));
        assert_eq!(tenth_means(&h[..3]), (0.0, 2.0));
    }
}
