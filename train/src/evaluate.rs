//! Measuring a trained head as it is stored: top-1 agreement of its argmax with the target's
//! argmax by drafting depth, on any data set ([`evaluate_head`], and `specdec eval-head`:
//! [`eval_head`]).
//!
//! At temperature 0 the agreement at depth 1 is the acceptance rate of the head's first draft
//! token, teacher-forced on the data's tokens with the target's true features; depth `d > 1`
//! drafts from the head's own features after `d − 1` true tokens (the training-time test), so it
//! bounds what a chain accepts at depth `d` once the tokens before it were accepted.

use std::ops::Range;
use std::path::PathBuf;

use specdec_models::heads::{default_head_path, HeadFile, HeadKind};

use crate::batch::{Batch, Frozen};
use crate::eagle::EagleHead;
use crate::error::{ModelContext, Result, TrainError};
use crate::features::FeatureCache;
use crate::head::{Agreement, HeadModel};
use crate::medusa::MedusaHead;
use crate::options::{prepare_data, DataOptions, ExtractionReport};
use crate::target::FrozenTarget;
use crate::vocab::coverage;

/// The most drafting depths measured.
pub const MAX_EVAL_DEPTHS: usize = 8;

/// A head's agreement with its target on some sequences.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadEvaluation {
    /// Top-1 agreement at depths `1..=depths` (a Medusa head measures at most its head count).
    pub agreement: Vec<f64>,
    /// Positions compared at each depth.
    pub positions: Vec<u64>,
    /// Sequences measured.
    pub sequences: usize,
    /// Leading tokens every sequence of the cache shares (a chat template's system prompt),
    /// whose predictions are left out.
    pub shared_prefix_tokens: usize,
    /// Fraction of the measured label tokens inside the head's draft vocabulary.
    pub draft_vocab_coverage: f64,
}

/// The model of the head in `file`, every tensor frozen, with room for `max_positions`.
pub(crate) fn head_model(file: &HeadFile, max_positions: usize) -> Result<Box<dyn HeadModel>> {
    Ok(match file.meta.kind {
        HeadKind::Eagle => Box::new(EagleHead::from_head_file(file, max_positions)?),
        HeadKind::Medusa => Box::new(MedusaHead::from_head_file(file)?),
    })
}

/// Measures the head `file` (for `target`) on the sequences `indices` of `cache` at depths
/// `1..=depths`, `batch` sequences per pass, leaving out predictions of the tokens every
/// sequence of the cache starts with.
///
/// # Errors
/// [`TrainError::Option`] for `depths` outside `1..=MAX_EVAL_DEPTHS`, an empty or out-of-range
/// `indices` or a zero `batch`; [`TrainError::Data`] for a head of another target or width than
/// `target` and `cache`; model, tensor and I/O errors.
pub fn evaluate_head(
    file: &HeadFile,
    target: &FrozenTarget,
    cache: &FeatureCache,
    indices: Range<usize>,
    depths: usize,
    batch: usize,
) -> Result<HeadEvaluation> {
    check_measurement(depths, batch)?;
    if indices.is_empty() || indices.end > cache.len() {
        return Err(TrainError::Option {
            name: "skip",
            reason: format!(
                "sequences {indices:?} are not a non-empty part of the {} in the data",
                cache.len()
            ),
        });
    }
    let id = target.identity();
    file.check_target(&id.name, &id.sha256)
        .model_context(|| "the head to measure".into())?;
    if cache.hidden() != target.config().hidden || cache.key().target_sha256 != id.sha256 {
        return Err(TrainError::FeatureCache {
            path: cache.dir().display().to_string(),
            reason: format!("features of another target than `{}`", id.name),
        });
    }
    let depths = match file.meta.kind {
        HeadKind::Eagle => depths,
        HeadKind::Medusa => depths.min(file.meta.medusa_heads),
    };
    let max_positions = (0..cache.len())
        .map(|i| cache.seq_len(i))
        .max()
        .unwrap_or(1);
    let model = head_model(file, max_positions)?;
    let frozen = Frozen::new(target, &file.d2t)?;
    let all_tokens = (0..cache.len())
        .map(|i| cache.tokens(i))
        .collect::<Result<Vec<_>>>()?;
    let shared_prefix_tokens = shared_prefix(&all_tokens);
    let mut total = vec![Agreement::default(); depths];
    let measured: Vec<usize> = indices.clone().collect();
    for chunk in measured.chunks(batch) {
        let b = Batch::load(cache, chunk)?;
        let counts = model.agreement(&frozen, &b, depths, shared_prefix_tokens)?;
        for (sum, a) in total.iter_mut().zip(counts) {
            sum.hits += a.hits;
            sum.total += a.total;
        }
    }
    let labels = measured
        .iter()
        .flat_map(|&i| all_tokens[i][1..].iter().copied());
    Ok(HeadEvaluation {
        agreement: total.iter().map(Agreement::rate).collect(),
        positions: total.iter().map(|a| a.total).collect(),
        sequences: measured.len(),
        shared_prefix_tokens,
        draft_vocab_coverage: coverage(labels, &file.d2t, target.config().vocab_size),
    })
}

/// Refuses `depths` outside `1..=MAX_EVAL_DEPTHS` and a zero `batch` ([`TrainError::Option`]).
fn check_measurement(depths: usize, batch: usize) -> Result<()> {
    if !(1..=MAX_EVAL_DEPTHS).contains(&depths) {
        return Err(TrainError::Option {
            name: "depths",
            reason: format!("{depths} is outside 1..={MAX_EVAL_DEPTHS}"),
        });
    }
    if batch == 0 {
        return Err(TrainError::Option {
            name: "batch",
            reason: "at least one sequence per pass".into(),
        });
    }
    Ok(())
}

/// The number of leading tokens every one of (at least two) `sequences` shares — a chat
/// template's system prompt and first role header — below the shortest one's length; 0 for
/// fewer than two sequences.
pub(crate) fn shared_prefix(sequences: &[Vec<u32>]) -> usize {
    let Some((first, rest)) = sequences.split_first().filter(|(_, rest)| !rest.is_empty()) else {
        return 0;
    };
    rest.iter().fold(first.len().saturating_sub(1), |len, t| {
        first
            .iter()
            .zip(t)
            .take(len.min(t.len().saturating_sub(1)))
            .take_while(|(a, b)| a == b)
            .count()
    })
}

/// Options of `specdec eval-head` (every one honoured or refused).
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct EvalHeadOptions {
    /// Target model: a registry name (smollm2-135m, qwen2.5-coder-1.5b, …) or a .gguf path.
    #[arg(long)]
    pub target: String,
    /// The head file [default: the cache's head of --kind for the target].
    #[arg(long)]
    pub head: Option<PathBuf>,
    /// The kind of the cache's head when --head is not given.
    #[arg(long, value_enum, default_value = "eagle")]
    pub kind: crate::options::KindArg,
    /// The data to measure on (the same options as train-head's: with train-head's values
    /// and --skip CONVERSATIONS − HOLDOUT it measures exactly a run's held-out sequences).
    #[command(flatten)]
    pub data: DataOptions,
    /// Leave out the first N sequences picked (a training run's, say).
    #[arg(long, default_value_t = 0)]
    pub skip: usize,
    /// Drafting depths to measure, 1..=8.
    #[arg(long, default_value_t = 3)]
    pub depths: usize,
    /// Sequences per pass.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
}

/// What `specdec eval-head` measured.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalReport {
    /// The head measured.
    pub head: PathBuf,
    /// Its kind.
    pub kind: HeadKind,
    /// The measurement.
    pub evaluation: HeadEvaluation,
    /// The data's feature extraction.
    pub extraction: ExtractionReport,
}

impl EvalReport {
    /// A few lines for people.
    pub fn summary(&self) -> String {
        let e = &self.evaluation;
        let x = &self.extraction;
        let depths: Vec<String> = e
            .agreement
            .iter()
            .zip(&e.positions)
            .enumerate()
            .map(|(d, (a, n))| format!("depth {} {:.1}% of {n}", d + 1, 100.0 * a))
            .collect();
        format!(
            "features: {} sequences, {} tokens in {} ({} extracted now)\n{} head {}: top-1 \
             agreement on {} sequences (after the {}-token shared prefix): {}; draft vocabulary \
             covers {:.1}% of their tokens",
            x.sequences,
            x.tokens,
            x.cache_dir.display(),
            x.stats.sequences,
            self.kind.name(),
            self.head.display(),
            e.sequences,
            e.shared_prefix_tokens,
            depths.join(", "),
            100.0 * e.draft_vocab_coverage
        )
    }
}

/// Runs `specdec eval-head`: checks the options, opens the target and the head (refused for
/// another target before any extraction), prepares the data as `train-head` does (its feature
/// cache reused when complete), and measures the head on the sequences after `--skip`.
///
/// # Errors
/// [`TrainError::Option`] for refused options; missing files; a head of another target; the
/// errors of [`evaluate_head`] and of the data preparation.
pub fn eval_head(options: &EvalHeadOptions) -> Result<EvalReport> {
    check_measurement(options.depths, options.batch)?;
    options.data.check(options.skip, "skip", "measure")?;
    let target = FrozenTarget::open(&options.target)?;
    let path = options
        .head
        .clone()
        .unwrap_or_else(|| default_head_path(target.short_name(), options.kind.into()));
    let file = HeadFile::load(&path).model_context(|| format!("the head {}", path.display()))?;
    let id = target.identity();
    file.check_target(&id.name, &id.sha256)
        .model_context(|| format!("the head {}", path.display()))?;
    let prepared = prepare_data(
        &options.data,
        &target,
        options.skip,
        "--skip",
        options.quiet,
    )?;
    let evaluation = evaluate_head(
        &file,
        &target,
        &prepared.cache,
        options.skip..prepared.cache.len(),
        options.depths,
        options.batch,
    )?;
    Ok(EvalReport {
        head: path,
        kind: file.meta.kind,
        evaluation,
        extraction: prepared.extraction,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        options: EvalHeadOptions,
    }

    /// The error of `specdec eval-head ARGS` for a target that does not exist: a refused option
    /// is named before the target is opened.
    fn refusal(args: &str) -> String {
        use clap::Parser;
        let argv = format!("eval-head --target /nonexistent/model.gguf {args}");
        let cli = Cli::try_parse_from(argv.split_whitespace()).unwrap();
        eval_head(&cli.options).unwrap_err().to_string()
    }

    #[test]
    fn bad_options_are_refused_before_the_target_is_opened() {
        assert!(refusal("--depths 9").contains("--depths: 9 is outside 1..=8"));
        assert!(refusal("--depths 0").contains("--depths"));
        assert!(refusal("--batch 0").contains("--batch"));
        let err = refusal("--conversations 10 --skip 10");
        assert!(
            err.contains("--skip: 10 of --conversations 10 leave none to measure"),
            "{err}"
        );
        assert!(refusal("--conversations 0").contains("--conversations"));
        assert!(refusal("--max-len 4").contains("--max-len"));
        // with good options, the missing target is what is named
        assert!(refusal("").contains("/nonexistent/model.gguf"));
    }

    #[test]
    fn the_shared_prefix_is_what_every_sequence_starts_with() {
        let s = |v: &[u32]| v.to_vec();
        assert_eq!(
            shared_prefix(&[s(&[1, 2, 3, 4]), s(&[1, 2, 3, 9]), s(&[1, 2, 7])]),
            2
        );
        // never the whole of the shortest sequence, never anything for one sequence
        assert_eq!(shared_prefix(&[s(&[1, 2, 3]), s(&[1, 2, 3, 4])]), 2);
        assert_eq!(shared_prefix(&[s(&[1, 2, 3])]), 0);
        assert_eq!(shared_prefix(&[s(&[5, 2]), s(&[1, 2])]), 0);
    }
}
