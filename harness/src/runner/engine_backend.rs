//! The engine backend: real models (GGUF through the registry) run by the [`Engine`].
//!
//! [`EngineBackend`] loads the target (and, when the config names one, the draft) once, checks
//! that a draft shares the target's tokenizer, tokenizes the prompts, and for each method builds
//! a [`BuiltMethod`] — drafter, paired verifier, policy — from its [`MethodConfig`]
//! ([`build_method`]). Every method, the baseline included, runs through the same engine loop
//! (the baseline is [`NoDrafter`] with a budget of 0).
//!
//! Method mapping (T = the sampling temperature):
//!
//! | drafter        | draft tree                                    | `auto` verifier             |
//! |----------------|-----------------------------------------------|-----------------------------|
//! | `none`         | root only                                      | greedy (T = 0) / target-only |
//! | `chain`        | draft model chain, argmax (T = 0) or sampled   | greedy / chain rejection    |
//! | `layer_skip`   | as `chain`, the target with blocks skipped     | greedy / chain rejection    |
//! | `tree`         | k-ary shape, top-ranked (T = 0) or without replacement | greedy / recursive rejection |
//! | `sequoia`      | Sequoia shape (default α vector), as `tree`    | as `tree`                   |
//! | `dynamic_tree` | EAGLE-2-style dynamic tree (deterministic)     | greedy / target-only        |
//! | `ngram`        | prompt lookup (deterministic)                  | greedy / target-only        |
//! | `staged`       | n-gram → level-1 model (an i.i.d. chain of q1) | chain rejection             |
//!
//! Policies: the policy's K is the chain length for linear drafters and the draft-node budget for
//! trees (capped by the tree's shape). `cost_optimal` runs [`CostModelPolicy::measured`]: it
//! decides from the costs the engine measures while decoding (plain step, target forward per
//! size, draft pass, the drafter's catch-up), starting with plain decoding. The only calibration
//! is one single-token forward of the draft model (best of two, on an empty sequence: no
//! prefill), which prices a draft pass before any speculative step.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use specdec_algorithms::drafters::{
    ChainDrafter, ChainMode, Drafter, DynamicTreeDrafter, NgramConfig, NgramDrafter, ShapeDrafter,
    StagedDrafter, TreeFill,
};
use specdec_algorithms::policy::{
    Budget, CostModelPolicy, DisableGate, FixedPolicy, SpeculationPolicy, TreeSearch,
};
use specdec_algorithms::trees::{sequoia_tree, TreeShape};
use specdec_algorithms::verify::PairedVerifier;
use specdec_kernels::cuda::Device;
use specdec_kernels::sampling::SamplingParams;
use specdec_kernels::verification::{DraftKind, VerifyMethod};
use specdec_kernels::TreeTopology;
use specdec_models::gguf::GgufFile;
use specdec_models::llama::cuda::GpuMatmul;
use specdec_models::llama::{
    default_skip_layers, load_on_device, parse_device, DeviceModelOptions, LlamaModel, LlamaOptions,
};
use specdec_models::tokenizer::{ChatMessage, Tokenizer};
use specdec_models::{registry, LanguageModel, SequenceStep};

use super::{Backend, MethodOutcome, RequestOutcome, RequestSpec};
use crate::config::{DrafterConfig, ExperimentConfig, MethodConfig, PolicyConfig, VerifierConfig};
use crate::engine::{Engine, EngineOptions, Generation, LmDraftModel, NoDrafter, Penalties};
use crate::engine::{Request, StopRule};
use crate::error::{HarnessError, Result};
use crate::policies::policy_for;
use crate::runner::layer_skip_tune::tune_layer_skip;

/// The acceptance-by-rank vector the `sequoia` drafter plans its tree from.
pub const SEQUOIA_ALPHAS: [f64; 7] = [0.7, 0.15, 0.07, 0.04, 0.02, 0.01, 0.01];

/// The depth limit of the `sequoia` drafter's tree.
pub const SEQUOIA_MAX_DEPTH: usize = 8;

/// KV slots per sequence a backend reserves (prompt + output + draft tree slack).
const KV_TOKENS_PER_SEQUENCE: usize = 2048;

/// A model file opened once: its parsed GGUF and tokenizer.
pub struct LoadedModel {
    /// The name it was asked by (registry name or path).
    pub name: String,
    /// The file.
    pub path: PathBuf,
    file: Arc<GgufFile>,
    /// Its tokenizer.
    pub tokenizer: Arc<Tokenizer>,
}

impl LoadedModel {
    /// Opens `name` (a registry name such as `smollm2-135m`, or a path to a GGUF file).
    ///
    /// # Errors
    /// [`HarnessError::Model`] when the name is unknown, the file is missing from the cache (the
    /// message names `scripts/fetch-models.sh`), or the file is not a usable GGUF.
    pub fn open(name: &str) -> Result<Self> {
        let path = registry::resolve(name)?;
        let file = Arc::new(GgufFile::open(&path)?);
        let tokenizer = Arc::new(Tokenizer::from_gguf(&file)?);
        Ok(Self {
            name: name.to_string(),
            path,
            file,
            tokenizer,
        })
    }

    /// A runnable model with room for `sequences` sequences of `KV_TOKENS_PER_SEQUENCE` (2048) tokens.
    ///
    /// # Errors
    /// As [`LlamaModel::from_gguf`].
    pub fn instantiate(&self, sequences: usize) -> Result<LlamaModel> {
        Ok(LlamaModel::from_gguf(&self.file, kv_options(sequences))?)
    }

    /// [`LoadedModel::instantiate`] on `device`: the CPU runner, or the CUDA runner in its
    /// batch-invariant mode (the engine's greedy equality rests on batch invariance).
    ///
    /// # Errors
    /// As [`load_on_device`]: no usable GPU is an error naming the problem.
    pub fn instantiate_on(&self, device: Device, sequences: usize) -> Result<DeviceModel> {
        if device == Device::Cpu {
            return Ok(Box::new(self.instantiate(sequences)?));
        }
        let cpu = kv_options(sequences);
        let options = DeviceModelOptions {
            device,
            kv_capacity_tokens: cpu.kv_capacity_tokens,
            kv_block_size: cpu.kv_block_size,
            cpu_matmul: cpu.matmul,
            gpu_matmul: GpuMatmul::BatchInvariant,
        };
        Ok(load_on_device(&self.file, options)?)
    }
}

/// A model on whichever device the config chose.
pub type DeviceModel = Box<dyn LanguageModel>;

/// The target of an [`EngineBackend`]: the CPU runner (whose layers a layer-skip drafter can
/// share), or another runner behind the trait (the CUDA one).
pub enum Target {
    /// The CPU Llama-family runner.
    Cpu(Box<LlamaModel>),
    /// A runner on another device.
    Device(DeviceModel),
}

impl Target {
    /// The model, whatever its device.
    pub fn model(&mut self) -> &mut dyn LanguageModel {
        match self {
            Target::Cpu(m) => m.as_mut(),
            Target::Device(m) => m.as_mut(),
        }
    }

    /// The model, read-only.
    pub fn model_ref(&self) -> &dyn LanguageModel {
        match self {
            Target::Cpu(m) => m.as_ref(),
            Target::Device(m) => m.as_ref(),
        }
    }

    /// The CPU runner, for what only it offers (`what` names the feature for the error).
    ///
    /// # Errors
    /// [`HarnessError::InvalidEngine`] when the target runs on another device.
    pub fn cpu(&mut self, what: &str) -> Result<&mut LlamaModel> {
        match self {
            Target::Cpu(m) => Ok(m.as_mut()),
            Target::Device(_) => Err(HarnessError::InvalidEngine(format!(
                "{what} needs the CPU runner (models.device = \"cpu\"): the GPU runner has no \
                 layer subsets"
            ))),
        }
    }
}

fn kv_options(sequences: usize) -> LlamaOptions {
    LlamaOptions {
        kv_capacity_tokens: sequences.max(1) * KV_TOKENS_PER_SEQUENCE,
        ..LlamaOptions::default()
    }
}

/// Refuses a draft whose tokenizer differs from the target's: same vocabulary size and the same
/// strings at a spread of token ids (first, last, and 14 in between).
///
/// # Errors
/// [`HarnessError::InvalidEngine`] naming both models and the first difference.
pub fn check_same_tokenizer(target: &LoadedModel, draft: &LoadedModel) -> Result<()> {
    let (t, d) = (&target.tokenizer, &draft.tokenizer);
    let refuse = |what: String| {
        Err(HarnessError::InvalidEngine(format!(
            "draft `{}` cannot draft for target `{}`: their tokenizers differ ({what}); \
             speculative decoding needs the same token ids — use an n-gram or layer_skip \
             drafter instead",
            draft.name, target.name
        )))
    };
    if t.vocab_size() != d.vocab_size() {
        return refuse(format!(
            "vocabulary {} vs {} tokens",
            t.vocab_size(),
            d.vocab_size()
        ));
    }
    let n = t.vocab_size() as u32;
    for i in 0..16u32 {
        let id = (n - 1) * i / 15;
        if t.token_str(id) != d.token_str(id) {
            return refuse(format!(
                "token {id} is {:?} vs {:?}",
                t.token_str(id),
                d.token_str(id)
            ));
        }
    }
    Ok(())
}

/// A method ready for the engine.
pub struct BuiltMethod {
    /// Proposes the draft trees.
    pub drafter: Box<dyn Drafter<f32>>,
    /// Verifies them (paired with the drafter's kind).
    pub verifier: PairedVerifier<f32>,
    /// Chooses each step's budget (forked per request).
    pub policy: Box<dyn SpeculationPolicy>,
    /// The method's fallback drafter, verifier and policy (`MethodConfig::fallback`), if any.
    pub fallback: Option<Box<BuiltMethod>>,
}

/// Everything [`build_method`] may need: the target (for layer skip), the models it may load as
/// drafts and the sampling settings.
pub struct ModelSet<'m> {
    /// The target model (its weights are shared by layer-skip drafters on the CPU).
    pub target: &'m mut Target,
    /// The target's file.
    pub target_file: &'m LoadedModel,
    /// Draft models opened so far, by name (the config's `models.draft` among them).
    pub drafts: &'m mut HashMap<String, LoadedModel>,
    /// The config's `models.draft`, if any.
    pub default_draft: Option<&'m str>,
    /// Sampling applied to target and drafts.
    pub sampling: SamplingParams,
    /// Requests in flight at once (sizes the draft KV pools).
    pub batch_size: usize,
    /// Where draft models run (the target's device).
    pub device: Device,
    /// A prompt to calibrate on (layer-skip tuning), usually the run's first.
    pub calibration: Option<&'m [u32]>,
    /// The target's relative forward costs `t(n) / t(1)` (index `n - 1`) timed so far, shared by
    /// the run's cost-model policies (timed on first use, `ModelSet::verify_curve`).
    pub verify_curve: &'m mut Vec<f64>,
}

impl ModelSet<'_> {
    /// The target's relative forward costs `t(n) / t(1)` for `n = 1..=tokens` (the cost-model
    /// policy's verify-cost prior, [`CostModelPolicy::with_verify_curve`]), timed with
    /// [`time_forward`] the first time a size is asked for and kept for the run.
    ///
    /// # Errors
    /// The target's errors.
    fn verify_curve(&mut self, tokens: usize) -> Result<Vec<f64>> {
        if self.verify_curve.len() < tokens {
            let model = self.target.model();
            let t1 = time_forward(model, 1)?;
            let mut curve = vec![1.0];
            for n in 2..=tokens {
                curve.push(time_forward(model, n)? / t1);
            }
            *self.verify_curve = curve;
        }
        Ok(self.verify_curve[..tokens].to_vec())
    }

    fn draft_model(&mut self, name: &str) -> Result<DeviceModel> {
        if name == "layer_skip" {
            return self.layer_skip(None);
        }
        if !self.drafts.contains_key(name) {
            let loaded = LoadedModel::open(name)?;
            check_same_tokenizer(self.target_file, &loaded)?;
            self.drafts.insert(name.to_string(), loaded);
        }
        self.drafts[name].instantiate_on(self.device, self.batch_size + 2)
    }

    fn layer_skip(&mut self, keep: Option<&[usize]>) -> Result<DeviceModel> {
        let sequences = self.batch_size + 2;
        let target = self.target.cpu("layer-skip drafting")?;
        let default = default_skip_layers(target.active_layers());
        let keep = keep.unwrap_or(&default);
        Ok(Box::new(target.layer_skip(keep, kv_options(sequences))?))
    }

    /// The kept blocks [`tune_layer_skip`] picks on `prompt` (its table goes to stderr).
    fn tuned_keep(&mut self, prompt: &[u32]) -> Result<Vec<usize>> {
        let target = self.target.cpu("layer-skip tuning")?;
        let ranked = tune_layer_skip(target, prompt, kv_options(1))?;
        eprintln!(
            "layer-skip tuning on {} prompt tokens (best first):",
            prompt.len()
        );
        for c in &ranked {
            eprintln!(
                "  {:<12} {:>2} blocks  agreement {:.3}  cost {:.3}  score {:.3} (K={})",
                c.label,
                c.keep.len(),
                c.agreement,
                c.cost,
                c.score,
                c.best_k
            );
        }
        ranked.into_iter().next().map(|c| c.keep).ok_or_else(|| {
            HarnessError::InvalidEngine("layer-skip tuning: the model has one block".into())
        })
    }

    fn lm(&self, model: DeviceModel) -> LmDraftModel<DeviceModel> {
        LmDraftModel::new(model, self.sampling, self.batch_size + 2)
    }

    /// A draft model for deterministic top-ranked trees: at T = 0 its distribution is the plain
    /// softmax (T = 1), whose ranking gives the siblings (a one-hot `q` would leave one child);
    /// greedy verification does not read `q`.
    fn lm_ranked(&self, model: DeviceModel) -> LmDraftModel<DeviceModel> {
        let mut params = self.sampling;
        if params.temperature == 0.0 {
            params.temperature = 1.0;
        }
        LmDraftModel::new(model, params, self.batch_size + 2)
    }

    fn named_draft(&self, method: &MethodConfig) -> Result<String> {
        self.default_draft.map(str::to_string).ok_or_else(|| {
            HarnessError::InvalidEngine(format!(
                "method `{}` ({}) needs a draft model: set models.draft (e.g. \
                 \"qwen2.5-coder-0.5b\"), or use an ngram or layer_skip drafter",
                method.name,
                method.drafter.kind()
            ))
        })
    }

    /// Seconds of one draft pass of `model` when `needed` (for the cost-model policy's prior),
    /// `None` otherwise. Cheap: a single-token forward on an empty sequence, best of two.
    fn draft_pass_s(&mut self, model: &mut dyn LanguageModel, needed: bool) -> Result<Option<f64>> {
        if !needed {
            return Ok(None);
        }
        let mut best = f64::INFINITY;
        for _ in 0..2 {
            let seq = model.new_sequence()?;
            let t0 = Instant::now();
            let forward =
                model.forward(&[SequenceStep::chain(seq, &[100], &TreeTopology::chain(1))]);
            best = best.min(t0.elapsed().as_secs_f64());
            model.release(seq)?;
            forward?;
        }
        Ok(Some(best))
    }
}

/// Median seconds of a forward of `n` chained tokens after a 32-token prefix (3 runs): one
/// point of a model's cost curve over tokens per pass.
///
/// # Errors
/// The model's errors (no free sequence, KV capacity).
pub fn time_forward(model: &mut dyn LanguageModel, n: usize) -> Result<f64> {
    let seq = model.new_sequence()?;
    let result = (|| -> Result<f64> {
        let prefix: Vec<u32> = (0..32u32).map(|i| 100 + i).collect();
        let chain = TreeTopology::chain(prefix.len());
        model.forward(&[SequenceStep::chain(seq, &prefix, &chain)])?;
        model.commit(seq, &(0..prefix.len()).collect::<Vec<_>>())?;
        let tokens: Vec<u32> = (0..n as u32).map(|i| 200 + i).collect();
        let tree = TreeTopology::chain(n);
        let mut times = Vec::new();
        for _ in 0..3 {
            let t0 = Instant::now();
            model.forward(&[SequenceStep::chain(seq, &tokens, &tree)])?;
            times.push(t0.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        Ok(times[1].max(1e-9))
    })();
    model.release(seq)?;
    result
}

/// The verifier `auto` picks for a drafter's kind at `temperature`.
fn auto_verifier(kind: DraftKind, is_chain: bool, temperature: f64) -> VerifyMethod {
    match kind {
        DraftKind::Deterministic if temperature == 0.0 => VerifyMethod::Greedy,
        DraftKind::Deterministic => VerifyMethod::TargetOnly,
        DraftKind::Iid if is_chain => VerifyMethod::ChainRejection,
        DraftKind::Iid => VerifyMethod::MultiRoundIid,
        DraftKind::WithoutReplacement => VerifyMethod::RecursiveRejection,
    }
}

fn verifier_for(
    method: &MethodConfig,
    kind: DraftKind,
    is_chain: bool,
    temperature: f64,
) -> Result<PairedVerifier<f32>> {
    let chosen = match &method.verifier {
        VerifierConfig::Auto => auto_verifier(kind, is_chain, temperature),
        VerifierConfig::Greedy => VerifyMethod::Greedy,
        VerifierConfig::Rejection => VerifyMethod::ChainRejection,
        VerifierConfig::MultiRound => VerifyMethod::MultiRoundIid,
        VerifierConfig::WithoutReplacement => VerifyMethod::RecursiveRejection,
        VerifierConfig::TargetOnly => VerifyMethod::TargetOnly,
        VerifierConfig::Typical { epsilon, delta } => VerifyMethod::Typical {
            epsilon: *epsilon,
            delta: *delta,
        },
    };
    Ok(PairedVerifier::new(Arc::new(chosen), kind)?)
}

/// Builds the drafter, verifier and policy of `method` (see the module docs for the mapping).
///
/// # Errors
/// A method needing a draft model when none is configured or loadable, a draft with another
/// tokenizer, a verifier that does not pair with the drafter's kind, invalid policy parameters.
pub fn build_method(method: &MethodConfig, models: &mut ModelSet<'_>) -> Result<BuiltMethod> {
    let temperature = models.sampling.temperature;
    let greedy = temperature == 0.0;
    let chain_mode = if greedy {
        ChainMode::Argmax
    } else {
        ChainMode::Sample
    };
    let tree_fill = if greedy {
        TreeFill::TopRanked
    } else {
        TreeFill::WithoutReplacement
    };
    let needs_cost = matches!(method.policy, Some(PolicyConfig::CostOptimal { .. }));
    // (drafter, is a chain, tree shape cap, seconds of one draft pass if timed)
    let (drafter, is_chain, shape, pass_cost): (
        Box<dyn Drafter<f32>>,
        bool,
        Option<TreeShape>,
        Option<f64>,
    ) = match &method.drafter {
        DrafterConfig::None => (Box::new(NoDrafter), true, None, Some(0.0)),
        DrafterConfig::Chain => {
            let name = models.named_draft(method)?;
            let mut model = models.draft_model(&name)?;
            limit_draft_vocab(&mut model, method)?;
            let ratio = models.draft_pass_s(model.as_mut(), needs_cost)?;
            let lm = models.lm(model);
            (
                Box::new(ChainDrafter::new(lm, chain_mode)),
                true,
                None,
                ratio,
            )
        }
        DrafterConfig::LayerSkip { keep, tune } => {
            let tuned = match (keep, tune, models.calibration) {
                (None, true, Some(prompt)) => Some(models.tuned_keep(prompt)?),
                _ => None,
            };
            let mut model = models.layer_skip(keep.as_deref().or(tuned.as_deref()))?;
            limit_draft_vocab(&mut model, method)?;
            let ratio = models.draft_pass_s(model.as_mut(), needs_cost)?;
            let lm = models.lm(model);
            (
                Box::new(ChainDrafter::new(lm, chain_mode)),
                true,
                None,
                ratio,
            )
        }
        DrafterConfig::Tree { branching } => {
            let name = models.named_draft(method)?;
            let shape = TreeShape::from_branching(branching);
            let mut model = models.draft_model(&name)?;
            limit_draft_vocab(&mut model, method)?;
            let ratio = models.draft_pass_s(model.as_mut(), needs_cost)?;
            let lm = models.lm_ranked(model);
            (
                Box::new(ShapeDrafter::new(lm, tree_fill, shape.clone())),
                false,
                Some(shape),
                ratio,
            )
        }
        DrafterConfig::Sequoia { nodes } => {
            let name = models.named_draft(method)?;
            let shape = sequoia_tree(&SEQUOIA_ALPHAS, *nodes, SEQUOIA_MAX_DEPTH)?.shape;
            let mut model = models.draft_model(&name)?;
            limit_draft_vocab(&mut model, method)?;
            let ratio = models.draft_pass_s(model.as_mut(), needs_cost)?;
            let lm = models.lm_ranked(model);
            (
                Box::new(ShapeDrafter::new(lm, tree_fill, shape.clone())),
                false,
                Some(shape),
                ratio,
            )
        }
        DrafterConfig::DynamicTree { nodes, top_k } => {
            let name = models.named_draft(method)?;
            let mut model = models.draft_model(&name)?;
            limit_draft_vocab(&mut model, method)?;
            let ratio = models.draft_pass_s(model.as_mut(), needs_cost)?;
            let lm = models.lm_ranked(model);
            (
                Box::new(DynamicTreeDrafter::new(lm, *nodes, *top_k, *top_k)?),
                false,
                Some(TreeShape::chain(*nodes)),
                ratio,
            )
        }
        DrafterConfig::Ngram { n } => {
            let config = NgramConfig {
                max_n: (*n).max(1),
                min_n: 1,
                max_matches: 4,
            };
            (
                Box::new(NgramDrafter::new(config, 16)?),
                true,
                None,
                Some(0.0),
            )
        }
        DrafterConfig::Staged { levels } => {
            let name = levels.last().cloned().ok_or_else(|| {
                HarnessError::InvalidEngine(format!(
                    "method `{}`: staged.levels is empty",
                    method.name
                ))
            })?;
            let level0 = NgramDrafter::new(NgramConfig::default(), 16)?;
            let mut model = models.draft_model(&name)?;
            limit_draft_vocab(&mut model, method)?;
            let ratio = models.draft_pass_s(model.as_mut(), needs_cost)?;
            let lm = models.lm(model);
            (Box::new(StagedDrafter::new(level0, lm)), true, None, ratio)
        }
    };
    if method.draft_vocab.is_some()
        && matches!(
            method.drafter,
            DrafterConfig::None | DrafterConfig::Ngram { .. }
        )
    {
        return Err(HarnessError::InvalidEngine(format!(
            "method `{}`: draft_vocab applies to drafters with a model, not to {}",
            method.name,
            method.drafter.kind()
        )));
    }
    let verifier = verifier_for(method, drafter.kind(), is_chain, temperature)?;
    let verify_curve = match method.policy {
        // a pass verifies at most k_max drafts and the root
        Some(PolicyConfig::CostOptimal { k_max, .. }) => Some(models.verify_curve(k_max + 1)?),
        _ => None,
    };
    let policy = build_policy(
        method,
        is_chain,
        shape.as_ref(),
        pass_cost,
        verify_curve.as_deref(),
    )?;
    let fallback = match method.fallback_method() {
        Some(fallback) => Some(Box::new(build_method(&fallback, models)?)),
        None => None,
    };
    Ok(BuiltMethod {
        drafter,
        verifier,
        policy,
        fallback,
    })
}

/// Applies `method.draft_vocab` (if set) to its draft model.
fn limit_draft_vocab(model: &mut DeviceModel, method: &MethodConfig) -> Result<()> {
    match method.draft_vocab {
        Some(rows) => model.limit_logits(rows).map_err(|err| {
            HarnessError::InvalidEngine(format!("method `{}`: draft_vocab: {err}", method.name))
        }),
        None => Ok(()),
    }
}

/// The budget of `k` for a drafter: a chain of `k`, or up to `k` tree nodes (within `shape`).
fn budget_of(k: usize, is_chain: bool, shape: Option<&TreeShape>) -> Budget {
    match (is_chain, shape) {
        (true, _) => Budget::chain(k),
        (false, Some(shape)) if k >= shape.drafts() => Budget::Tree(Arc::new(shape.clone())),
        (false, _) if k == 0 => Budget::Plain,
        (false, _) => Budget::TreeNodes(k),
    }
}

fn build_policy(
    method: &MethodConfig,
    is_chain: bool,
    shape: Option<&TreeShape>,
    draft_pass_s: Option<f64>,
    verify_curve: Option<&[f64]>,
) -> Result<Box<dyn SpeculationPolicy>> {
    let Some(policy) = &method.policy else {
        return Ok(Box::new(FixedPolicy::new(Budget::Plain)));
    };
    Ok(match policy {
        PolicyConfig::CostOptimal {
            k_max,
            min_gain,
            probe_every,
        } => {
            // Decides from costs measured while decoding (see the module docs).
            let search = if is_chain {
                TreeSearch::Chain { max_k: *k_max }
            } else {
                TreeSearch::Tree {
                    max_nodes: *k_max,
                    max_depth: 8,
                    max_ranks: 4,
                }
            };
            let mut policy = CostModelPolicy::measured(search, draft_pass_s)?
                .with_min_gain(*min_gain, *probe_every)?
                .with_probe_back_off(*probe_every, 16 * *probe_every)?;
            if let Some(curve) = verify_curve {
                policy = policy.with_verify_curve(curve)?;
            }
            Box::new(policy)
        }
        _ if is_chain => policy_for(policy, None)?,
        // Tree drafters: K is a node budget within the drafter's shape.
        PolicyConfig::Fixed { k } => Box::new(FixedPolicy::new(budget_of(*k, false, shape))),
        PolicyConfig::Threshold {
            k,
            min_acceptance,
            probe_every,
        } => Box::new(
            DisableGate::new(FixedPolicy::new(budget_of(*k, false, shape)))
                .with_threshold(*min_acceptance)?
                .with_probe(*probe_every, Budget::TreeNodes(1))?,
        ),
        PolicyConfig::Aimd { .. } | PolicyConfig::Pid { .. } => {
            return Err(HarnessError::InvalidEngine(format!(
                "method `{}`: the {} policy steers a chain length; drafter `{}` drafts trees \
                 (use fixed, threshold or cost_optimal)",
                method.name,
                if matches!(policy, PolicyConfig::Aimd { .. }) {
                    "aimd"
                } else {
                    "pid"
                },
                method.drafter.kind()
            )))
        }
    })
}

/// Runs real models through the [`Engine`].
pub struct EngineBackend {
    target_file: LoadedModel,
    target: Target,
    device: Device,
    drafts: HashMap<String, LoadedModel>,
    default_draft: Option<String>,
    sampling: SamplingParams,
    seed: u64,
    max_tokens: usize,
    batch_size: usize,
    calibration: Option<Vec<u32>>,
    /// The target's verify-cost curve timed so far (`ModelSet::verify_curve`).
    verify_curve: Vec<f64>,
    /// Methods built by [`Backend::run_method`], by name: an interleaved schedule calls it once
    /// per prompt group, and the drafters (with their draft-model KV pools) are built once.
    built: HashMap<String, BuiltMethod>,
}

impl EngineBackend {
    /// Loads the config's target (and draft, checking its tokenizer).
    ///
    /// # Errors
    /// A model that cannot be resolved or loaded (the message names the fetch command), a draft
    /// with another tokenizer.
    pub fn new(config: &ExperimentConfig) -> Result<Self> {
        let device = parse_device(&config.models.device)?;
        Self::open(
            &config.models.target,
            config.models.draft.as_deref(),
            SamplingParams {
                temperature: config.sampling.temperature,
                top_k: config.sampling.top_k,
                top_p: config.sampling.top_p,
            },
            config.sampling.seed,
            config.max_tokens,
            config.batch_size,
        )?
        .on_device(device)
    }

    /// Loads `target` (and `draft`, checking its tokenizer), each a registry name or a GGUF path.
    ///
    /// # Errors
    /// As [`EngineBackend::new`].
    pub fn open(
        target: &str,
        draft: Option<&str>,
        sampling: SamplingParams,
        seed: u64,
        max_tokens: usize,
        batch_size: usize,
    ) -> Result<Self> {
        let target_file = LoadedModel::open(target)?;
        let mut target = Target::Cpu(Box::new(target_file.instantiate(batch_size)?));
        // One untimed forward pages the memory-mapped weights in and warms the thread pool
        // before the first timed method (the baseline runs first and would otherwise pay it).
        time_forward(target.model(), 1)?;
        let mut drafts = HashMap::new();
        if let Some(name) = draft.filter(|n| *n != "layer_skip") {
            let loaded = LoadedModel::open(name)?;
            check_same_tokenizer(&target_file, &loaded)?;
            drafts.insert(name.to_string(), loaded);
        }
        Ok(Self {
            target_file,
            target,
            drafts,
            default_draft: draft.map(str::to_string),
            sampling,
            seed,
            max_tokens,
            batch_size: batch_size.max(1),
            calibration: None,
            verify_curve: Vec::new(),
            built: HashMap::new(),
            device: Device::Cpu,
        })
    }

    /// Moves the target (and the draft models built from now on) to `device`: the CUDA runner
    /// is loaded from the same file in its batch-invariant mode. The CPU is a no-op.
    ///
    /// # Errors
    /// As [`LoadedModel::instantiate_on`] (no usable GPU is an error naming the problem).
    pub fn on_device(mut self, device: Device) -> Result<Self> {
        if device == Device::Cpu || device == self.device {
            return Ok(self);
        }
        let mut target = self.target_file.instantiate_on(device, self.batch_size)?;
        time_forward(target.as_mut(), 1)?;
        self.target = Target::Device(target);
        self.device = device;
        self.built.clear();
        self.verify_curve.clear();
        Ok(self)
    }

    /// The target's tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.target_file.tokenizer
    }

    /// The target model.
    pub fn target_mut(&mut self) -> &mut dyn LanguageModel {
        self.target.model()
    }

    /// Sets the seed of the production random generator for later runs.
    pub fn set_seed(&mut self, seed: u64) {
        self.seed = seed;
    }

    /// Builds `method` against this backend's models.
    ///
    /// # Errors
    /// As [`build_method`].
    pub fn build(&mut self, method: &MethodConfig) -> Result<BuiltMethod> {
        let mut models = ModelSet {
            target: &mut self.target,
            target_file: &self.target_file,
            drafts: &mut self.drafts,
            default_draft: self.default_draft.as_deref(),
            sampling: self.sampling,
            batch_size: self.batch_size,
            device: self.device,
            calibration: self.calibration.as_deref(),
            verify_curve: &mut self.verify_curve,
        };
        build_method(method, &mut models)
    }

    /// The stop rule of a request: the model's EOS ids and the config's max tokens.
    pub fn stop_rule(&self, max_tokens: usize) -> StopRule {
        let mut eos = self.target.model_ref().eos_ids().to_vec();
        if let Some(id) = self.target_file.tokenizer.eos_id() {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
        StopRule::new(max_tokens, &eos)
    }

    /// Tokenizes a prompt (with the chat template when `chat`).
    ///
    /// # Errors
    /// Tokenizer errors; `chat` with a model that has no chat template.
    pub fn encode(&self, text: &str, chat: bool) -> Result<Vec<u32>> {
        let tokenizer = &self.target_file.tokenizer;
        Ok(if chat {
            let rendered = tokenizer.apply_chat_template(&[ChatMessage::user(text)], true)?;
            tokenizer.encode(&rendered)?
        } else {
            tokenizer.encode_prompt(text)?
        })
    }

    /// Runs `method` over `requests` with the engine, calling `on_tokens(request id, tokens)` as
    /// tokens are emitted and `on_done(index)` as each request retires.
    ///
    /// # Errors
    /// As [`build_method`] and [`Engine::run`].
    pub fn run_requests(
        &mut self,
        method: &MethodConfig,
        requests: &[Request],
        on_tokens: &mut dyn FnMut(u64, &[u32]),
        on_done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Generation>> {
        if let Some(first) = requests.first() {
            self.calibration = Some(first.prompt.clone());
        }
        let mut built = self.build(method)?;
        let options = self.engine_options(method);
        run_built(
            self.target.model(),
            &mut built,
            options,
            requests,
            on_tokens,
            on_done,
        )
    }

    fn engine_options(&self, method: &MethodConfig) -> EngineOptions {
        EngineOptions {
            method: method.name.clone(),
            sampling: self.sampling,
            penalties: Penalties::default(),
            seed: self.seed,
            batch_size: self.batch_size,
        }
    }
}

/// Runs `requests` through an [`Engine`] over `target` with an already built method (its policy
/// prototype forked, so the method can run again).
fn run_built(
    target: &mut dyn LanguageModel,
    built: &mut BuiltMethod,
    options: EngineOptions,
    requests: &[Request],
    on_tokens: &mut dyn FnMut(u64, &[u32]),
    on_done: &mut dyn FnMut(usize),
) -> Result<Vec<Generation>> {
    let mut engine = Engine::new(
        target,
        built.drafter.as_mut(),
        built.verifier.clone(),
        built.policy.fork(),
        options,
    )?
    .on_tokens(on_tokens);
    if let Some(fallback) = built.fallback.as_mut() {
        engine = engine.with_fallback(
            fallback.drafter.as_mut(),
            fallback.verifier.clone(),
            fallback.policy.fork(),
        )?;
    }
    engine.run(requests, on_done)
}

impl Backend for EngineBackend {
    fn name(&self) -> &str {
        match self.device {
            Device::Cpu => "cpu",
            Device::Cuda(_) => "cuda",
        }
    }

    fn run_method(
        &mut self,
        method: &MethodConfig,
        requests: &[RequestSpec<'_>],
        on_request_done: &mut dyn FnMut(usize),
    ) -> Result<MethodOutcome> {
        let stop = self.stop_rule(self.max_tokens);
        let engine_requests = requests
            .iter()
            .map(|spec| {
                Ok(Request {
                    id: spec.index as u64,
                    prompt: self.encode(&spec.prompt.text, false)?,
                    stop: stop.clone(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // Built once per method name; taken out of the cache for the run and put back after.
        let setup_started = Instant::now();
        let mut built = match self.built.remove(&method.name) {
            Some(built) => built,
            None => {
                if let Some(first) = engine_requests.first() {
                    self.calibration = Some(first.prompt.clone());
                }
                self.build(method)?
            }
        };
        let setup_s = setup_started.elapsed().as_secs_f64();
        let options = self.engine_options(method);
        let started = Instant::now();
        let generations = run_built(
            self.target.model(),
            &mut built,
            options,
            &engine_requests,
            &mut |_, _| {},
            &mut |i| on_request_done(requests[i].index),
        );
        self.built.insert(method.name.clone(), built);
        let generations = generations?;
        let elapsed_s = started.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
        let tokenizer = self.target_file.tokenizer.clone();
        let outcomes = generations
            .into_iter()
            .zip(requests)
            .map(|(g, spec)| {
                let mut steps = g.steps;
                for s in &mut steps {
                    s.request = spec.index;
                }
                Ok(RequestOutcome {
                    request: spec.index,
                    prompt_tokens: g.prompt_tokens,
                    elapsed_s: g.elapsed_s,
                    steps,
                    text: Some(tokenizer.decode_skip_special(&g.tokens)?),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(MethodOutcome {
            elapsed_s,
            setup_s,
            requests: outcomes,
        })
    }
}
