//! The drafter entries: one file each, one line each in [`DRAFTERS`].
//!
//! A drafter entry is a parameter struct implementing [`DrafterKind`]: its name, aliases and
//! help ([`Kind`]), what it needs from the backend, and [`DrafterKind::build`], which turns the
//! parameters into a [`Drafter`] using what the backend lends ([`DraftContext`]). The set-up
//! every drafter over a draft model shares (open the model, cut its vocabulary, time a pass for
//! the cost model, wrap it as a [`DraftModel`](specdec_algorithms::drafters::DraftModel)) is
//! [`model_drafter_setup`].

mod chain;
mod dynamic_tree;
mod eagle;
mod history;
mod layer_skip;
mod medusa;
mod ngram;
mod plain;
mod sequoia;
mod staged;
mod tree;

pub use chain::Chain;
pub use dynamic_tree::{DynamicTree, DYNAMIC_TREE_MAX_TOP_K};
pub use eagle::Eagle;
pub use history::{
    History, HISTORY_DEFAULT_SPEC_FACTOR, HISTORY_DEFAULT_TOKENS, HISTORY_MAX_INDEX_ENTRIES,
    HISTORY_MAX_TOKENS,
};
pub use layer_skip::LayerSkip;
pub use medusa::Medusa;
pub use ngram::{Ngram, NGRAM_MAX_N};
pub use plain::Plain;
pub use sequoia::{Sequoia, SEQUOIA_ALPHAS, SEQUOIA_MAX_DEPTH};
pub use staged::Staged;
pub use tree::Tree;

use specdec_algorithms::drafters::{ChainDrafter, ChainMode, Drafter, ShapeDrafter, TreeFill};
use specdec_algorithms::trees::TreeShape;
use specdec_kernels::sampling::SamplingParams;
use specdec_models::heads::{EagleHead, HeadPrecision, MedusaHeads};
use specdec_models::{LanguageModel, VocabRanking};

use super::spec::{Entry, Kind, Registered, Role};
use crate::engine::{LmDraftModel, Penalties};
use crate::error::{HarnessError, Result};

/// Every drafter, in the order `--help` lists them.
pub static DRAFTERS: &[&dyn DrafterEntry] = &[
    &Registered::<Plain>::ENTRY,
    &Registered::<Chain>::ENTRY,
    &Registered::<Tree>::ENTRY,
    &Registered::<DynamicTree>::ENTRY,
    &Registered::<Sequoia>::ENTRY,
    &Registered::<Ngram>::ENTRY,
    &Registered::<History>::ENTRY,
    &Registered::<Staged>::ENTRY,
    &Registered::<LayerSkip>::ENTRY,
    &Registered::<Eagle>::ENTRY,
    &Registered::<Medusa>::ENTRY,
];

/// The drafter role of [`super::Spec`].
pub enum DrafterRole {}

impl Role for DrafterRole {
    const WHAT: &'static str = "drafter";
    type Entry = dyn DrafterEntry;
    fn entries() -> &'static [&'static dyn DrafterEntry] {
        DRAFTERS
    }
}

/// A model on whichever device the run uses.
pub type DeviceModel = Box<dyn LanguageModel>;

/// What a backend lends the drafters it builds: models, timings and settings.
pub trait DraftContext {
    /// Sampling applied to the target and, by drafters, to `q`.
    fn sampling(&self) -> SamplingParams;
    /// The target's repetition / frequency / presence penalties, which the draft-model drafters
    /// apply to their own logits too (default: off).
    fn penalties(&self) -> Penalties {
        Penalties::default()
    }
    /// Requests in flight at once (sizes the draft models' KV pools).
    fn batch_size(&self) -> usize;
    /// The run's draft model name (`models.draft`), if any.
    fn default_draft(&self) -> Option<String>;
    /// The draft model `name` (a registry name or GGUF path; `layer_skip`: the target with its
    /// default blocks skipped), checked to share the target's tokenizer, with KV room for the
    /// run's sequences.
    ///
    /// # Errors
    /// A model that cannot be opened, another tokenizer, a backend without draft models.
    fn draft_model(&mut self, name: &str) -> Result<DeviceModel>;
    /// The target running only blocks `keep` (its weights shared); without `keep`, the default
    /// subset, or with `tune` the subset measured best on the run's first prompt.
    ///
    /// # Errors
    /// A backend whose target has no block subsets, bad block indices.
    fn layer_skip(&mut self, keep: Option<&[usize]>, tune: bool) -> Result<DeviceModel>;
    /// The trained EAGLE head at `path` (default: the cache's head for the run's target,
    /// [`specdec_models::heads::default_head_path`]), refused unless trained for the target, with
    /// the target made to hand back the features it reads.
    ///
    /// # Errors
    /// A missing or invalid file, a head for another target, a target without features (the
    /// GPU runner), a backend without trained heads (the default).
    fn eagle_head(&mut self, path: Option<&str>, precision: HeadPrecision) -> Result<EagleHead> {
        let _ = (path, precision);
        Err(HarnessError::NotYetAvailable(
            "this backend has no trained heads (they run on real models)".into(),
        ))
    }
    /// The trained Medusa heads at `path`, as [`DraftContext::eagle_head`].
    ///
    /// # Errors
    /// As [`DraftContext::eagle_head`].
    fn medusa_heads(
        &mut self,
        path: Option<&str>,
        precision: HeadPrecision,
    ) -> Result<MedusaHeads> {
        let _ = (path, precision);
        Err(HarnessError::NotYetAvailable(
            "this backend has no trained heads (they run on real models)".into(),
        ))
    }
    /// Whether this backend measures costs (so the cost-model policy can run on them, with a
    /// timed draft pass and verify-cost curve as priors).
    fn measures_costs(&self) -> bool;
    /// Seconds of one draft pass of `model` (the cost-model policy's prior).
    ///
    /// # Errors
    /// The model's errors; a backend without timings.
    fn time_draft_pass(&mut self, model: &mut dyn LanguageModel) -> Result<f64>;
    /// The target's relative forward costs `(n, t(n) / t(1))`: every `n ≤ tokens` (one
    /// sequence's largest tree), then sparser sizes up to `tokens ×` the batch size (the shape
    /// of a full batch's forward, which prices speculation under load).
    ///
    /// # Errors
    /// The target's errors; a backend without timings.
    fn verify_curve(&mut self, tokens: usize) -> Result<Vec<(usize, f64)>>;
}

/// What [`DrafterKind::build`] knows of the method it builds for.
#[derive(Debug, Clone, Copy)]
pub struct DraftSetup<'a> {
    /// The method's name (for messages).
    pub method: &'a str,
    /// `MethodConfig::draft_vocab`: how many ids' logits the draft model computes.
    pub draft_vocab: Option<usize>,
    /// `MethodConfig::draft_vocab_ranking`, read: which ids (its first `draft_vocab`; the
    /// lowest ids without it).
    pub draft_vocab_ranking: Option<&'a VocabRanking>,
    /// Whether the policy prices draft passes (time one).
    pub time_passes: bool,
}

/// A drafter ready for the engine, with what its policy needs to know of it.
pub struct BuiltDrafter {
    /// The drafter.
    pub drafter: Box<dyn Drafter<f32>>,
    /// Whether it drafts chains (the policy's K is a chain length) rather than trees (a node
    /// budget).
    pub is_chain: bool,
    /// The largest tree it drafts (caps a tree policy's budget).
    pub shape: Option<TreeShape>,
    /// Seconds of one draft pass, when timed (0 for free drafters).
    pub draft_pass_s: Option<f64>,
}

/// A drafter's parameters: [`Kind`] plus how it is built.
pub trait DrafterKind: Kind {
    /// Whether it drafts chains (else trees).
    fn is_chain(&self) -> bool;
    /// Whether it needs the run's draft model (`models.draft`).
    fn needs_draft_model(&self) -> bool {
        false
    }
    /// Whether it runs a model at all (so `draft_vocab` applies).
    fn uses_model(&self) -> bool {
        self.needs_draft_model()
    }
    /// The drafter `specdec generate --method NAME` runs (its budget from `--k`), when it can
    /// run from flags alone; `draft` is the `--draft` model.
    fn for_generate(draft: Option<&str>) -> Option<Self> {
        let _ = draft;
        None
    }
    /// Builds the drafter.
    ///
    /// # Errors
    /// What the backend cannot lend, invalid parameters.
    fn build(&self, ctx: &mut dyn DraftContext, setup: &DraftSetup<'_>) -> Result<BuiltDrafter>;
}

/// The object-safe face of a drafter entry (see [`DrafterKind`]).
pub trait DrafterEntry: Entry {
    /// [`DrafterKind::is_chain`] of `params` (true when they do not parse).
    fn is_chain(&self, params: &toml::Table) -> bool;
    /// [`DrafterKind::needs_draft_model`] of `params`.
    fn needs_draft_model(&self, params: &toml::Table) -> bool;
    /// [`DrafterKind::uses_model`] of `params`.
    fn uses_model(&self, params: &toml::Table) -> bool;
    /// [`DrafterKind::for_generate`] as config parameters.
    fn generate_params(&self, draft: Option<&str>) -> Option<toml::Table>;
    /// Parses `params`, checks their values ([`Kind::check`]: the limits too) and builds the
    /// drafter.
    ///
    /// # Errors
    /// The parse error, as [`DrafterKind::build`].
    fn build(
        &self,
        params: &toml::Table,
        ctx: &mut dyn DraftContext,
        setup: &DraftSetup<'_>,
    ) -> Result<BuiltDrafter>;
}

impl<K: DrafterKind> DrafterEntry for Registered<K> {
    fn is_chain(&self, params: &toml::Table) -> bool {
        Self::parse(params).map_or(true, |k| k.is_chain())
    }
    fn needs_draft_model(&self, params: &toml::Table) -> bool {
        Self::parse(params).is_ok_and(|k| k.needs_draft_model())
    }
    fn uses_model(&self, params: &toml::Table) -> bool {
        Self::parse(params).is_ok_and(|k| k.uses_model())
    }
    fn generate_params(&self, draft: Option<&str>) -> Option<toml::Table> {
        match toml::Value::try_from(K::for_generate(draft)?) {
            Ok(toml::Value::Table(table)) => Some(table),
            _ => None,
        }
    }
    fn build(
        &self,
        params: &toml::Table,
        ctx: &mut dyn DraftContext,
        setup: &DraftSetup<'_>,
    ) -> Result<BuiltDrafter> {
        let kind = Self::parse(params).map_err(HarnessError::InvalidEngine)?;
        kind.check().map_err(HarnessError::InvalidEngine)?;
        kind.build(ctx, setup)
    }
}

/// How chains are drawn at the run's temperature: argmax at T = 0, sampled from `q` above.
pub fn chain_mode(sampling: &SamplingParams) -> ChainMode {
    if sampling.temperature == 0.0 {
        ChainMode::Argmax
    } else {
        ChainMode::Sample
    }
}

/// How static trees are filled: top-ranked at T = 0, sampled without replacement above.
pub fn tree_fill(sampling: &SamplingParams) -> TreeFill {
    if sampling.temperature == 0.0 {
        TreeFill::TopRanked
    } else {
        TreeFill::WithoutReplacement
    }
}

/// The run's draft model for `kind`'s method, or an error saying to set one.
///
/// # Errors
/// [`HarnessError::InvalidEngine`] naming the method when `models.draft` is not set.
pub fn run_draft_model(
    ctx: &mut dyn DraftContext,
    setup: &DraftSetup<'_>,
    kind: &str,
) -> Result<DeviceModel> {
    let name = ctx.default_draft().ok_or_else(|| {
        HarnessError::InvalidEngine(format!(
            "method `{}` ({kind}) needs a draft model: set models.draft (e.g. \
             \"qwen2.5-coder-0.5b\"), or use an ngram or layer_skip drafter",
            setup.method
        ))
    })?;
    ctx.draft_model(&name)
}

/// The set-up every drafter over a model shares: `model`'s vocabulary cut to `draft_vocab`,
/// one pass timed when the policy prices passes, and the model wrapped for drafters with the
/// run's sampling — `ranked` for top-ranked trees, whose siblings come from the plain softmax
/// (T = 1) at T = 0 (a one-hot `q` would leave one child; greedy verification reads no `q`).
///
/// # Errors
/// A bad `draft_vocab`, the timing's errors.
pub fn model_drafter_setup(
    ctx: &mut dyn DraftContext,
    setup: &DraftSetup<'_>,
    mut model: DeviceModel,
    ranked: bool,
) -> Result<(LmDraftModel<DeviceModel>, Option<f64>)> {
    if let Some(size) = setup.draft_vocab {
        draft_vocab_ids(setup, size, model.vocab_size())
            .and_then(|ids| model.limit_logits(&ids).map_err(|err| err.to_string()))
            .map_err(|err| {
                HarnessError::InvalidEngine(format!(
                    "method `{}`: draft_vocab: {err}",
                    setup.method
                ))
            })?;
    }
    let pass_s = match setup.time_passes {
        true => Some(ctx.time_draft_pass(model.as_mut())?),
        false => None,
    };
    let mut sampling = ctx.sampling();
    if ranked && sampling.temperature == 0.0 {
        sampling.temperature = 1.0;
    }
    let lm =
        LmDraftModel::new(model, sampling, ctx.batch_size() + 2).with_penalties(ctx.penalties());
    Ok((lm, pass_s))
}

/// The `size` ids a draft model of `vocab` ids keeps: the first `size` of the setup's ranking
/// (made for a vocabulary of this size), else `0..size`.
///
/// # Errors
/// `size` past the vocabulary or the ranking; a ranking of another vocabulary size.
fn draft_vocab_ids(
    setup: &DraftSetup<'_>,
    size: usize,
    vocab: usize,
) -> std::result::Result<Vec<u32>, String> {
    if size > vocab {
        return Err(format!(
            "{size} ids exceed the draft model's vocabulary of {vocab}"
        ));
    }
    match setup.draft_vocab_ranking {
        Some(ranking) if ranking.vocab_size != vocab => Err(format!(
            "the ranking is of a vocabulary of {} ids ({}), the draft model's has {vocab}",
            ranking.vocab_size, ranking.source
        )),
        Some(ranking) => Ok(ranking.top(size).map_err(|e| e.to_string())?.to_vec()),
        None => Ok((0..size as u32).collect()),
    }
}

/// A chain drafter over `model` ([`model_drafter_setup`], drawn as [`chain_mode`] says),
/// stopping each chain below `min_confidence` when given ([`confident_chain`]).
///
/// # Errors
/// As [`model_drafter_setup`] and [`confident_chain`].
pub fn chain_over(
    ctx: &mut dyn DraftContext,
    setup: &DraftSetup<'_>,
    model: DeviceModel,
    min_confidence: Option<f64>,
) -> Result<BuiltDrafter> {
    // at T = 0 the confidence needs the draft's softmax, not a one-hot q
    let ranked = min_confidence.is_some();
    let (lm, draft_pass_s) = model_drafter_setup(ctx, setup, model, ranked)?;
    Ok(BuiltDrafter {
        drafter: Box::new(confident_chain(lm, &ctx.sampling(), min_confidence)?),
        is_chain: true,
        shape: None,
        draft_pass_s,
    })
}

/// The chain drafter over `model` drawn as [`chain_mode`] says for `sampling`, drawing a token
/// only while the draft's probability of the chain can stay at `min_confidence` when given
/// ([`ChainDrafter::with_min_confidence`]; a step may then draft nothing). At T = 0 that
/// probability is only meaningful over the draft's plain softmax, so `model` must then give `q`
/// at T = 1 (argmax is unchanged).
///
/// # Errors
/// [`HarnessError::InvalidEngine`] naming `min_confidence` outside (0, 1].
pub fn confident_chain<M>(
    model: M,
    sampling: &SamplingParams,
    min_confidence: Option<f64>,
) -> Result<ChainDrafter<M>> {
    let chain = ChainDrafter::new(model, chain_mode(sampling));
    match min_confidence {
        None => Ok(chain),
        Some(h) => chain
            .with_min_confidence(h)
            .map_err(|err| HarnessError::InvalidEngine(err.to_string())),
    }
}

/// Checks a chain drafter's `min_confidence`: absent, or in (0, 1].
///
/// # Errors
/// The message names `field`, the value and the range.
pub(super) fn check_min_confidence(
    field: &str,
    min_confidence: Option<f64>,
) -> std::result::Result<(), String> {
    match min_confidence {
        Some(h) if !(h > 0.0 && h <= 1.0) => Err(format!(
            "{field} = {h}: must be in (0, 1] (the draft's probability of the whole chain \
             below which it stops growing)"
        )),
        _ => Ok(()),
    }
}

/// A drafter filling `shape` from the run's draft model ([`model_drafter_setup`], filled as
/// [`tree_fill`] says).
///
/// # Errors
/// No draft model; as [`model_drafter_setup`].
pub fn shape_over(
    ctx: &mut dyn DraftContext,
    setup: &DraftSetup<'_>,
    kind: &str,
    shape: TreeShape,
) -> Result<BuiltDrafter> {
    let model = run_draft_model(ctx, setup, kind)?;
    let (lm, draft_pass_s) = model_drafter_setup(ctx, setup, model, true)?;
    let fill = tree_fill(&ctx.sampling());
    Ok(BuiltDrafter {
        drafter: Box::new(ShapeDrafter::new(lm, fill, shape.clone())),
        is_chain: false,
        shape: Some(shape),
        draft_pass_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draft_vocabulary_is_the_rankings_first_ids_or_the_lowest() {
        let ranking = VocabRanking::from_counts(&[1, 9, 4, 0], &[], "counts".into()).unwrap();
        let setup = |ranking| DraftSetup {
            method: "m",
            draft_vocab: Some(2),
            draft_vocab_ranking: ranking,
            time_passes: false,
        };
        assert_eq!(draft_vocab_ids(&setup(None), 2, 4).unwrap(), [0, 1]);
        assert_eq!(
            draft_vocab_ids(&setup(Some(&ranking)), 2, 4).unwrap(),
            [1, 2]
        );
        let err = draft_vocab_ids(&setup(Some(&ranking)), 2, 5).unwrap_err();
        assert!(
            err.contains("4 ids (counts)") && err.contains("has 5"),
            "{err}"
        );
        let err = draft_vocab_ids(&setup(None), 6, 4).unwrap_err();
        assert!(
            err.contains("6 ids exceed") && err.contains("of 4"),
            "{err}"
        );
    }
}
