//! `specdec train-head`: the command-line options ([`TrainHeadOptions`]) and the whole pipeline
//! behind them ([`train_head`]): open the target, read and tokenize ShareGPT, extract (or reuse)
//! the cached features, train, and write the head.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use specdec_models::heads::{default_head_path, EagleShape, HeadKind};
use specdec_models::registry;
use specdec_models::tokenizer::Tokenizer;

use crate::batch::permutation;
use crate::error::{io_error, ModelContext, Result, TrainError};
use crate::features::{ExtractionStats, FeatureCache, FeatureCacheKey};
use crate::optim::AdamWConfig;
use crate::regenerate::{first_turn_prompt, regenerate};
use crate::sharegpt::{parse_conversations, tokenize_conversations, Conversation, TokenizeStats};
use crate::target::{sha256_of_bytes, FrozenTarget};
use crate::trainer::{
    train, Schedule, TrainConfig, TrainControl, TrainData, TrainPaths, TrainReport,
};
use crate::vocab::check_draft_vocab;

/// The most training-time-test steps accepted.
pub const MAX_UNROLL: usize = 8;
/// The most Medusa heads accepted.
pub const MAX_MEDUSA_HEADS: usize = 8;
/// Conversations shorter than this many tokens (after the chat template) are skipped.
pub const MIN_SEQUENCE_TOKENS: usize = 16;
/// The longest time budget `--minutes` takes: a year.
pub const MAX_MINUTES: f64 = 525_600.0;

/// Default optimiser steps of a run (`--steps`).
pub const DEFAULT_STEPS: u64 = 1000;

/// Default training-time-test steps.
pub const DEFAULT_UNROLL: usize = 2;
/// Default EAGLE feature-loss weight (EAGLE-1).
pub const DEFAULT_W_FEAT: f64 = 1.0;
/// Default EAGLE cross-entropy weight (EAGLE-1).
pub const DEFAULT_W_CE: f64 = 0.1;
/// Default number of Medusa heads.
pub const DEFAULT_MEDUSA_HEADS: usize = 3;

/// The head kind on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KindArg {
    /// EAGLE-style: one decoder layer over (feature, token) pairs, trained with TTT.
    Eagle,
    /// Medusa-style: K residual heads over the last feature.
    Medusa,
}

impl From<KindArg> for HeadKind {
    fn from(k: KindArg) -> Self {
        match k {
            KindArg::Eagle => HeadKind::Eagle,
            KindArg::Medusa => HeadKind::Medusa,
        }
    }
}

/// Which conversations a head is trained or measured on, and how they become sequences (the
/// feature cache's key).
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct DataOptions {
    /// The data: a ShareGPT JSON array (`[{id, conversations: [{from, value}]}]`, may be
    /// cut off mid-element), the registry name `sharegpt` (scripts/fetch-models.sh sharegpt) or
    /// a path.
    #[arg(long, default_value = "sharegpt")]
    pub data: String,
    /// Conversations to use (the first N usable ones after a seeded shuffle).
    #[arg(long, default_value_t = 2000)]
    pub conversations: usize,
    /// Seed of the shuffle that picks the conversations (part of the feature cache's key).
    #[arg(long, default_value_t = 0)]
    pub data_seed: u64,
    /// Tokens per sequence: each conversation is cut to its first N tokens.
    #[arg(long, default_value_t = 256)]
    pub max_len: usize,
    /// Use the target's own answers instead of the data's (self-distillation): each
    /// conversation's first user turn, continued greedily by the target to --max-len tokens
    /// (regenerated when its feature cache is not complete, in its own cache).
    #[arg(long)]
    pub regenerate: bool,
}

impl DataOptions {
    /// Checks the target-independent data options, where the first `reserve` of the
    /// conversations (option `--reserve_name`) are set aside and the rest are `left_for` use.
    ///
    /// # Errors
    /// [`TrainError::Option`] for no conversations, a `reserve` that leaves none, or a
    /// `--max-len` below [`MIN_SEQUENCE_TOKENS`].
    pub fn check(&self, reserve: usize, reserve_name: &'static str, left_for: &str) -> Result<()> {
        let refuse = |name: &'static str, reason: String| Err(TrainError::Option { name, reason });
        if self.conversations == 0 {
            return refuse("conversations", "at least one is needed".into());
        }
        if reserve >= self.conversations {
            return refuse(
                reserve_name,
                format!(
                    "{reserve} of --conversations {} leave none to {left_for}",
                    self.conversations
                ),
            );
        }
        if self.max_len < MIN_SEQUENCE_TOKENS {
            return refuse(
                "max-len",
                format!(
                    "{} is below the {MIN_SEQUENCE_TOKENS} tokens a sequence needs",
                    self.max_len
                ),
            );
        }
        Ok(())
    }
}

/// Options of `specdec train-head` (every one is honoured or refused; the EAGLE-only and
/// Medusa-only ones are refused for the other kind).
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct TrainHeadOptions {
    /// Target model: smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b (fetched by
    /// scripts/fetch-models.sh), or a path to a .gguf file.
    #[arg(long)]
    pub target: String,
    /// Head kind.
    #[arg(long, value_enum)]
    pub kind: KindArg,
    /// The head file [default: CACHE/heads/TARGET-KIND.safetensors, CACHE being
    /// $SPECDEC_CACHE or ~/.cache/specdec, TARGET the registry name or the GGUF file stem]; its
    /// checkpoint (NAME.ckpt.safetensors) and loss curve (NAME.loss.svg) go next to it.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The data: which conversations, cut how, answered by whom.
    #[command(flatten)]
    pub data: DataOptions,
    /// Sequences held out (the last ones picked) for the agreement measurement.
    #[arg(long, default_value_t = 32)]
    pub holdout: usize,
    /// Draft vocabulary size (the most frequent training tokens); at most 16384 for
    /// vocabularies up to 65536 ids, 32768 above.
    #[arg(long, default_value_t = 8192)]
    pub draft_vocab: usize,
    /// Optimiser steps of the run (the learning-rate schedule's length) [default: 1000; with
    /// --minutes alone, as many as fit in the budget]. With --resume: the run's new length, at
    /// least the steps done (the schedule re-planned: its warm-up kept, the cosine decay
    /// spread to the new last step); without, a resumed run keeps its checkpoint's schedule.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Time budget of the training steps of this invocation, in minutes: stop cleanly with a
    /// checkpoint when it runs out (feature extraction, cached and resumable, is not counted).
    /// Without --steps the schedule is sized to it: a few probe steps are timed, and the run
    /// plans as many steps as fill 90 % of the budget at that pace, warmed up over 5 % of them
    /// (a resumed run keeps its schedule unless --steps re-plans it).
    #[arg(long)]
    pub minutes: Option<f64>,
    /// Stop cleanly once this many steps are done; continue later with --resume.
    #[arg(long)]
    pub pause_at: Option<u64>,
    /// Continue the run from its checkpoint (same settings required).
    #[arg(long)]
    pub resume: bool,
    /// Start a new run where a head or checkpoint already is, replacing them; without it (or
    /// --resume) an existing head or checkpoint at the output is refused before any work.
    #[arg(long, conflicts_with = "resume")]
    pub force: bool,
    /// Seed of initialisation and data order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Sequences per optimiser step.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Peak learning rate (AdamW).
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Linear warm-up steps [default: 5% of --steps].
    #[arg(long)]
    pub warmup_steps: Option<u64>,
    /// Decoupled weight decay (matrices only).
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    /// AdamW β₁.
    #[arg(long, default_value_t = 0.9)]
    pub beta1: f64,
    /// AdamW β₂.
    #[arg(long, default_value_t = 0.95)]
    pub beta2: f64,
    /// Largest global gradient norm (clipped above).
    #[arg(long, default_value_t = 0.5)]
    pub grad_clip: f64,
    /// Write the checkpoint every N steps (and at the end); 0: only at the end.
    #[arg(long, default_value_t = 50)]
    pub checkpoint_every: u64,
    /// Measure the held-out agreement every N steps too (printed, and in the head file's
    /// training record: the learning curve); 0: only at the end. Not counted in --minutes.
    #[arg(long, default_value_t = 0)]
    pub eval_every: u64,
    /// Train the draft LM head too (frozen to the target's rows by default).
    #[arg(long)]
    pub train_lm_head: bool,
    /// EAGLE: training-time-test steps, ≥ 2 [default: 2].
    #[arg(long)]
    pub unroll: Option<usize>,
    /// EAGLE: weight of the feature (smooth L1) loss [default: 1].
    #[arg(long)]
    pub w_feat: Option<f64>,
    /// EAGLE: weight of the cross-entropy loss [default: 0.1].
    #[arg(long)]
    pub w_ce: Option<f64>,
    /// EAGLE: FFN width of the head's layer [default: the target's].
    #[arg(long)]
    pub ffn: Option<usize>,
    /// EAGLE: no gradient through f̂ from one unrolled step into the next.
    #[arg(long)]
    pub detach_unrolled: bool,
    /// EAGLE: RMS-normalise the token embedding and the feature, each with its own trained
    /// gains, before `fc` (EAGLE-3's input norms).
    #[arg(long)]
    pub input_norms: bool,
    /// Medusa: number of heads K [default: 3].
    #[arg(long)]
    pub medusa_heads: Option<usize>,
    /// No progress (bars, or the plain lines printed where stderr is not a terminal); results
    /// still print.
    #[arg(long)]
    pub quiet: bool,
}

impl TrainHeadOptions {
    /// Options with every default, for `target` and `kind`.
    pub fn new(target: &str, kind: KindArg) -> Self {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            options: TrainHeadOptions,
        }
        let kind = match kind {
            KindArg::Eagle => "eagle",
            KindArg::Medusa => "medusa",
        };
        let target = format!("--target={target}");
        Wrapper::try_parse_from(["train-head", target.as_str(), "--kind", kind])
            .expect("the defaults parse")
            .options
    }

    /// Whether the schedule is sized to the time budget: `--minutes` without `--steps`.
    pub fn fits_steps_to_minutes(&self) -> bool {
        self.steps.is_none() && self.minutes.is_some()
    }

    /// Where the run's schedule comes from: a resumed run keeps its checkpoint's, or is
    /// re-planned to `--steps`; a new run is sized to `--minutes` when `--steps` is not given.
    pub fn schedule(&self) -> Schedule {
        match (self.resume, self.steps.is_some()) {
            (true, false) => Schedule::Stored,
            (true, true) => Schedule::Replan,
            (false, _) if self.fits_steps_to_minutes() => Schedule::FitTimeLimit,
            (false, _) => Schedule::Configured,
        }
    }

    /// The run-defining settings these options give (target-independent checks included).
    /// Where [`TrainHeadOptions::schedule`] is not [`Schedule::Configured`], [`train`] replaces
    /// the schedule (the steps being a placeholder, [`DEFAULT_STEPS`], without --steps).
    ///
    /// # Errors
    /// [`TrainError::Option`] naming the first refused option.
    pub fn train_config(&self) -> Result<TrainConfig> {
        let kind: HeadKind = self.kind.into();
        let refuse = |name: &'static str, reason: String| TrainError::Option { name, reason };
        let eagle_only: [(&'static str, bool); 6] = [
            ("unroll", self.unroll.is_some()),
            ("w-feat", self.w_feat.is_some()),
            ("w-ce", self.w_ce.is_some()),
            ("ffn", self.ffn.is_some()),
            ("detach-unrolled", self.detach_unrolled),
            ("input-norms", self.input_norms),
        ];
        match kind {
            HeadKind::Eagle => {
                if self.medusa_heads.is_some() {
                    return Err(refuse(
                        "medusa-heads",
                        "applies to --kind medusa only".into(),
                    ));
                }
            }
            HeadKind::Medusa => {
                if let Some((name, _)) = eagle_only.iter().find(|(_, given)| *given) {
                    return Err(refuse(name, "applies to --kind eagle only".into()));
                }
            }
        }
        let positive = |name: &'static str, v: f64| -> Result<()> {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(refuse(name, format!("{v} must be a finite number > 0")))
            }
        };
        if let Some(m) = self.minutes {
            positive("minutes", m)?;
            if m > MAX_MINUTES {
                return Err(refuse(
                    "minutes",
                    format!("must be at most {MAX_MINUTES} (a year)"),
                ));
            }
        }
        if self.resume && self.warmup_steps.is_some() {
            return Err(refuse(
                "warmup-steps",
                "a resumed run keeps its checkpoint's warm-up".into(),
            ));
        }
        if self.fits_steps_to_minutes() && self.warmup_steps.is_some() {
            return Err(refuse(
                "warmup-steps",
                "needs --steps: a schedule sized by --minutes warms up over 5 % of its steps"
                    .into(),
            ));
        }
        let steps = self.steps.unwrap_or(DEFAULT_STEPS);
        self.data.check(self.holdout, "holdout", "train on")?;
        let config = TrainConfig {
            kind,
            steps,
            batch: self.batch,
            optimizer: AdamWConfig {
                lr: self.lr,
                beta1: self.beta1,
                beta2: self.beta2,
                eps: 1e-8,
                weight_decay: self.weight_decay,
                grad_clip: self.grad_clip,
                warmup_steps: self.warmup_steps.unwrap_or(steps / 20),
                total_steps: steps,
            },
            seed: self.seed,
            draft_vocab: self.draft_vocab,
            holdout: self.holdout,
            train_lm_head: self.train_lm_head,
            unroll: if kind == HeadKind::Eagle {
                self.unroll.unwrap_or(DEFAULT_UNROLL)
            } else {
                1
            },
            w_feat: self.w_feat.unwrap_or(DEFAULT_W_FEAT),
            w_ce: self.w_ce.unwrap_or(DEFAULT_W_CE),
            detach_unrolled: self.detach_unrolled,
            eagle_ffn: self.ffn,
            input_norms: self.input_norms,
            medusa_heads: if kind == HeadKind::Medusa {
                self.medusa_heads.unwrap_or(DEFAULT_MEDUSA_HEADS)
            } else {
                0
            },
        };
        check_train_config(&config)?;
        Ok(config)
    }
}

/// Checks the target-independent settings of a run.
///
/// # Errors
/// [`TrainError::Option`] naming the first refused setting.
pub fn check_train_config(c: &TrainConfig) -> Result<()> {
    let refuse = |name: &'static str, reason: String| Err(TrainError::Option { name, reason });
    let o = &c.optimizer;
    if c.steps == 0 {
        return refuse("steps", "at least one step".into());
    }
    if c.batch == 0 {
        return refuse("batch", "at least one sequence per step".into());
    }
    if !(o.lr.is_finite() && o.lr > 0.0) {
        return refuse("lr", format!("{} must be a finite number > 0", o.lr));
    }
    for (name, beta) in [("beta1", o.beta1), ("beta2", o.beta2)] {
        if !(0.0..1.0).contains(&beta) {
            return refuse(name, format!("{beta} is outside [0, 1)"));
        }
    }
    if !(o.weight_decay.is_finite() && o.weight_decay >= 0.0) {
        return refuse("weight-decay", format!("{} must be ≥ 0", o.weight_decay));
    }
    if !(o.grad_clip.is_finite() && o.grad_clip > 0.0) {
        return refuse(
            "grad-clip",
            format!("{} must be a finite number > 0", o.grad_clip),
        );
    }
    if o.warmup_steps > o.total_steps || o.total_steps != c.steps {
        return refuse(
            "warmup-steps",
            format!(
                "{} exceeds the {} steps of the run",
                o.warmup_steps, c.steps
            ),
        );
    }
    match c.kind {
        HeadKind::Eagle => {
            if !(2..=MAX_UNROLL).contains(&c.unroll) {
                return refuse(
                    "unroll",
                    format!("{} is outside 2..={MAX_UNROLL}", c.unroll),
                );
            }
            for (name, w) in [("w-feat", c.w_feat), ("w-ce", c.w_ce)] {
                if !(w.is_finite() && w >= 0.0) {
                    return refuse(name, format!("{w} must be ≥ 0"));
                }
            }
            if c.w_feat == 0.0 && c.w_ce == 0.0 {
                return refuse("w-ce", "--w-feat and --w-ce cannot both be 0".into());
            }
            if c.eagle_ffn == Some(0) {
                return refuse("ffn", "the FFN needs a width ≥ 1".into());
            }
        }
        HeadKind::Medusa => {
            if !(1..=MAX_MEDUSA_HEADS).contains(&c.medusa_heads) {
                return refuse(
                    "medusa-heads",
                    format!("{} is outside 1..={MAX_MEDUSA_HEADS}", c.medusa_heads),
                );
            }
        }
    }
    Ok(())
}

/// Where the ShareGPT data file is and what identifies it.
pub(crate) struct DataSource {
    pub(crate) path: PathBuf,
    pub(crate) sha256: String,
}

pub(crate) fn resolve_data(name_or_path: &str) -> Result<DataSource> {
    if let Some(entry) = registry::entry(name_or_path) {
        let path = entry
            .locate()
            .model_context(|| format!("training data `{name_or_path}`"))?;
        return Ok(DataSource {
            path,
            sha256: entry.sha256.clone(),
        });
    }
    let path = PathBuf::from(name_or_path);
    if !path.is_file() {
        return Err(TrainError::Data {
            path: name_or_path.to_string(),
            reason: "neither a file nor a registry name (`sharegpt`: run \
                     `scripts/fetch-models.sh sharegpt`)"
                .into(),
        });
    }
    let sha256 = registry::sha256_of_file(&path)
        .model_context(|| format!("hashing the training data {}", path.display()))?;
    Ok(DataSource { path, sha256 })
}

/// Runs `specdec train-head`: checks every option (sizes against the target too) before any
/// work, opens the target, reads ShareGPT (the first `--conversations` usable conversations after
/// a `--data-seed` shuffle, rendered with the target's chat template, cut to `--max-len`),
/// extracts their features into `<cache>/features/<key>/` (resumable; reused when complete),
/// and trains the head (see [`train`]). Once training starts, SIGINT and SIGTERM stop it
/// cleanly at the next step ([`crate::stop_on_signals`]); before, they end the process as usual.
///
/// # Errors
/// [`TrainError::Option`] for refused options; missing files (naming the fetch command); model,
/// data, checkpoint and I/O errors as [`train`] and [`FeatureCache::build`] report them.
pub fn train_head(options: &TrainHeadOptions) -> Result<TrainReport> {
    let config = options.train_config()?;
    let target = FrozenTarget::open(&options.target)?;
    let tc = target.config();
    check_draft_vocab(options.draft_vocab, tc.vocab_size)?;
    if HeadKind::from(options.kind) == HeadKind::Eagle {
        EagleShape::check_rope_scaling(tc).map_err(|e| TrainError::Option {
            name: "kind",
            reason: e.to_string(),
        })?;
    }
    let paths = TrainPaths::next_to(
        &options
            .out
            .clone()
            .unwrap_or_else(|| default_head_path(target.short_name(), config.kind)),
    );
    refuse_overwrite(&paths, options.resume || options.force)?;
    if options.resume && !paths.checkpoint.exists() {
        return Err(TrainError::Checkpoint {
            path: paths.checkpoint.display().to_string(),
            reason: "--resume was given but there is no checkpoint to continue".into(),
        });
    }
    let prepared = prepare_data(
        &options.data,
        &target,
        options.holdout,
        "--holdout",
        options.quiet,
    )?;
    let train_data = TrainData {
        cache: &prepared.cache,
        data_sha256: prepared.data_sha256.clone(),
        extra: prepared.extra.clone(),
    };
    let control = TrainControl {
        resume: options.resume,
        time_limit: options.minutes.map(|m| Duration::from_secs_f64(m * 60.0)),
        schedule: options.schedule(),
        pause_at: options.pause_at,
        checkpoint_every: options.checkpoint_every,
        eval_every: options.eval_every,
        progress: !options.quiet,
        // from here on, SIGINT / SIGTERM stop the run cleanly at the next step (extraction
        // above, resumable, ends at once as before)
        stop: Some(crate::trainer::stop_on_signals()?),
    };
    let mut report = train(&target, &train_data, &config, &paths, &control)?;
    report.extraction = Some(prepared.extraction);
    Ok(report)
}

/// Refuses a new run whose head or checkpoint would replace an earlier run's, unless `allowed`
/// (`--resume` continues that run, `--force` replaces it).
///
/// # Errors
/// [`TrainError::Option`] (`--out`) naming the file found.
fn refuse_overwrite(paths: &TrainPaths, allowed: bool) -> Result<()> {
    if allowed {
        return Ok(());
    }
    match [&paths.head, &paths.checkpoint]
        .into_iter()
        .find(|p| p.exists())
    {
        Some(found) => Err(TrainError::Option {
            name: "out",
            reason: format!(
                "{} is an earlier run's; --resume continues that run, --force starts a new \
                 one and replaces it, or give another --out",
                found.display()
            ),
        }),
        None => Ok(()),
    }
}

/// A data set made ready: its feature cache and where it came from.
pub(crate) struct PreparedData {
    /// Tokens and target features of every sequence.
    pub cache: FeatureCache,
    /// What extraction did now.
    pub extraction: ExtractionReport,
    /// SHA-256 of the data the sequences come from.
    pub data_sha256: String,
    /// Provenance for a head file's `training.extra` (data name, sizes, …).
    pub extra: BTreeMap<String, String>,
}

/// Reads the data `data` names, picks and tokenizes its conversations (or regenerates their
/// answers with `target`), and extracts (or reuses) their features in
/// `<cache>/features/<key>/`; refuses (as option `reserve_name`) a data set of no more than
/// `reserve` usable sequences.
///
/// # Errors
/// [`TrainError::Option`] for a `--max-len` past the target's context; missing files (naming the
/// fetch command); data, model and I/O errors.
pub(crate) fn prepare_data(
    data: &DataOptions,
    target: &FrozenTarget,
    reserve: usize,
    reserve_name: &str,
    quiet: bool,
) -> Result<PreparedData> {
    let options = data;
    let context = target.config().context_length;
    if options.max_len > context {
        return Err(TrainError::Option {
            name: "max-len",
            reason: format!(
                "{} exceeds the target's context of {}",
                options.max_len, context
            ),
        });
    }
    let data = resolve_data(&options.data)?;

    let bytes = std::fs::read(&data.path).map_err(io_error(&data.path))?;
    let what = data.path.display().to_string();
    let parsed = parse_conversations(&bytes, &what)?;
    drop(bytes);
    let tokenizer = Tokenizer::from_gguf(target.file())
        .model_context(|| format!("the tokenizer of {}", target.identity().name))?;
    let order = permutation(parsed.conversations.len(), options.data_seed);
    let key = FeatureCacheKey {
        target_sha256: target.identity().sha256.clone(),
        // regenerated answers are other data: their own cache
        data_sha256: match options.regenerate {
            true => sha256_of_bytes(format!("{} regenerated greedily", data.sha256).as_bytes()),
            false => data.sha256.clone(),
        },
        max_len: options.max_len,
        count: options.conversations,
        data_seed: options.data_seed,
    };
    let dir = registry::cache_dir()
        .join("features")
        .join(key.folder_name());
    let cached = options.regenerate && FeatureCache::open(&dir, &key).is_ok();
    let (sequences, stats) = match (options.regenerate, cached) {
        // the complete cache holds the regenerated sequences already
        (true, true) => (Vec::new(), TokenizeStats::default()),
        (true, false) => {
            let (prompts, stats) = first_turn_prompts(
                &parsed.conversations,
                &order,
                &tokenizer,
                options.conversations,
            )?;
            let mut answers = regenerate(target, &prompts, options.max_len, !quiet)?;
            answers.retain(|a| a.len() >= MIN_SEQUENCE_TOKENS);
            (answers, stats)
        }
        (false, _) => tokenize_conversations(
            &parsed.conversations,
            &order,
            &tokenizer,
            options.max_len,
            MIN_SEQUENCE_TOKENS,
            options.conversations,
        )?,
    };
    if !cached && sequences.len() <= reserve {
        return Err(TrainError::Data {
            path: what,
            reason: format!(
                "{} usable conversations (of {}), not more than {reserve_name} {reserve}",
                sequences.len(),
                parsed.conversations.len(),
            ),
        });
    }
    let (cache, extraction) = match cached {
        true => (FeatureCache::open(&dir, &key)?, ExtractionStats::default()),
        false => FeatureCache::build(&dir, &key, target, &sequences, !quiet)?,
    };
    let mut extra = BTreeMap::new();
    extra.insert("data".to_string(), options.data.clone());
    if options.regenerate {
        extra.insert(
            "answers".into(),
            "regenerated greedily by the target".into(),
        );
    }
    extra.insert("conversations".into(), cache.len().to_string());
    extra.insert("conversations_skipped".into(), stats.skipped.to_string());
    extra.insert("data_seed".into(), options.data_seed.to_string());
    extra.insert("max_len".into(), options.max_len.to_string());
    extra.insert("feature_cache".into(), key.folder_name());
    extra.insert("feature_tokens".into(), cache.total_tokens().to_string());
    Ok(PreparedData {
        extraction: ExtractionReport {
            stats: extraction,
            cache_dir: dir,
            cache_bytes: cache.size_bytes(),
            sequences: cache.len(),
            tokens: cache.total_tokens(),
        },
        cache,
        data_sha256: data.sha256,
        extra,
    })
}

/// The tokenized first-turn prompts ([`first_turn_prompt`]) of the first `count` usable
/// conversations in `order` (a prompt must hold at least one token past the template).
///
/// # Errors
/// Tokenizer errors.
fn first_turn_prompts(
    conversations: &[Conversation],
    order: &[usize],
    tokenizer: &Tokenizer,
    count: usize,
) -> Result<(Vec<Vec<u32>>, TokenizeStats)> {
    let mut prompts = Vec::with_capacity(count);
    let mut stats = TokenizeStats::default();
    for &index in order {
        if prompts.len() == count {
            break;
        }
        stats.examined += 1;
        let conversation = &conversations[index];
        let Some(text) = first_turn_prompt(conversation, tokenizer) else {
            stats.skipped += 1;
            continue;
        };
        let tokens = tokenizer
            .encode_prompt(&text)
            .model_context(|| format!("tokenizing conversation `{}`", conversation.id))?;
        if tokens.len() < 2 {
            stats.skipped += 1;
            continue;
        }
        prompts.push(tokens);
    }
    Ok((prompts, stats))
}

/// What feature extraction did for a [`train_head`] run.
#[derive(Debug, Clone, PartialEq)]
pub struct ExtractionReport {
    /// This invocation's extraction (zero when the cache was complete already).
    pub stats: ExtractionStats,
    /// The cache folder.
    pub cache_dir: PathBuf,
    /// Bytes of its token and feature files.
    pub cache_bytes: u64,
    /// Sequences in it.
    pub sequences: usize,
    /// Tokens in it.
    pub tokens: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_runs_head_or_checkpoint_is_kept_unless_resumed_or_forced() {
        let dir = std::env::temp_dir().join(format!("specdec-overwrite-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let paths = TrainPaths::next_to(&dir.join("head.safetensors"));
        assert!(refuse_overwrite(&paths, false).is_ok(), "nothing there yet");
        for file in [&paths.checkpoint, &paths.head] {
            std::fs::write(file, b"earlier").unwrap();
            let err = refuse_overwrite(&paths, false).unwrap_err().to_string();
            assert!(
                err.starts_with("option --out: ") && err.contains("--force"),
                "{err}"
            );
            assert!(refuse_overwrite(&paths, true).is_ok());
        }
        assert_eq!(std::fs::read(&paths.head).unwrap(), b"earlier");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
