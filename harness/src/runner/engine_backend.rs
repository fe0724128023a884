//! The engine backend: real models (GGUF through the registry) run by the [`Engine`].
//!
//! [`EngineBackend`] loads the target (and, when the config names one, the draft) once, checks
//! that a draft shares the target's tokenizer, tokenizes the prompts, and builds each method
//! through the method registry ([`build_method`], lending it a [`ModelSet`]: models, layer
//! subsets of the target, timings). Every method, the baseline included, runs through the same
//! engine loop (the baseline is the `plain` drafter with a budget of 0). The cost-model policy
//! decides from the costs the engine measures while decoding (plain step, target forward per
//! size, draft pass, the drafter's catch-up), starting from one timed single-token draft pass
//! and the target's verify-cost curve.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use specdec_algorithms::policy::{DisableGate, FixedPolicy};
use specdec_kernels::cuda::Device;
use specdec_kernels::sampling::SamplingParams;
use specdec_models::llama::parse_device;
use specdec_models::tokenizer::{ChatMessage, Tokenizer};
use specdec_models::LanguageModel;

use super::engine_context::ModelSet;
use super::kv_memory::{KvMemory, KvPlan};
use super::models::{check_same_tokenizer, time_forward, LoadedModel, Target};
use super::{Backend, MethodOutcome, RequestOutcome, RequestSpec};
use crate::config::{ExperimentConfig, MethodConfig, Prompt, MAX_TENSOR_PARALLEL};
use crate::engine::{EngineOptions, Generation, Penalties, RecordedDecisions};
use crate::engine::{Request, RequestQueue, StopRule};
use crate::error::Result;
use crate::methods::{build_method, BuiltMethod};

/// The acceptance below which a served request stops speculating by default (the switch-off
/// rule of production speculative servers, about 0.3).
pub const DEFAULT_MIN_ACCEPTANCE: f64 = 0.3;

/// Which served requests stop speculating when their acceptance falls low (a [`DisableGate`]
/// around a level's policy; see [`EngineBackend::serve_queue`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MinAcceptance {
    /// Every level of the method, below this acceptance in [0, 1] (0: never).
    Every(f64),
    /// [`DEFAULT_MIN_ACCEPTANCE`] for every level except one whose policy prices each of its
    /// drafter's offers ([`MethodConfig::levels_pricing_offers`]: a lookup drafter under
    /// `cost_optimal`). That drafter's drafts cost only their verification, and the policy
    /// verifies an offer only where its length's measured acceptance pays at the measured
    /// cost: its average acceptance is low because it offers many short drafts, which the
    /// policy already refuses where they do not pay; a gate would switch off the long offers
    /// with them.
    Default,
}

impl MinAcceptance {
    /// The threshold of a level whose policy prices its offers (`prices_offers`) or not;
    /// `None`: no gate.
    pub fn threshold(self, prices_offers: bool) -> Option<f64> {
        match self {
            MinAcceptance::Every(threshold) => (threshold > 0.0).then_some(threshold),
            MinAcceptance::Default => (!prices_offers).then_some(DEFAULT_MIN_ACCEPTANCE),
        }
    }
}

/// Runs real models through the [`Engine`].
pub struct EngineBackend {
    target_file: LoadedModel,
    target: Target,
    device: Device,
    drafts: HashMap<String, LoadedModel>,
    default_draft: Option<String>,
    sampling: SamplingParams,
    penalties: Penalties,
    seed: u64,
    max_tokens: usize,
    batch_size: usize,
    /// The KV budget and the token slots of the target's and the drafters' pools.
    kv: KvPlan,
    calibration: Option<Vec<u32>>,
    /// The target's verify-cost curve timed so far (`ModelSet::verify_curve`).
    verify_curve: Vec<(usize, f64)>,
    /// Methods built by [`Backend::prepare`] or [`Backend::run_method`], by name: an
    /// interleaved schedule calls `run_method` once per prompt group, and the drafters (with
    /// their draft-model KV pools) are built once.
    built: HashMap<String, BuiltMethod>,
    /// Seconds [`Backend::prepare`] spent building each method, reported by its first run.
    prepared_s: HashMap<String, f64>,
    /// A recorded run's decisions to replay ([`EngineOptions::replay`]).
    replay: Option<Arc<RecordedDecisions>>,
    /// Record each target forward's op split ([`EngineOptions::op_split`]).
    op_split: bool,
}

impl EngineBackend {
    /// Loads the config's target (and draft, checking its tokenizer).
    ///
    /// # Errors
    /// A model that cannot be resolved or loaded (the message names the fetch command), a draft
    /// with another tokenizer.
    pub fn new(config: &ExperimentConfig) -> Result<Self> {
        let device = parse_device(&config.models.device)?;
        let kv_memory = KvMemory::configured(
            config.models.kv_memory.as_deref(),
            config.models.kv_dtype.as_deref(),
            &config.models.device,
        )?;
        Self::open_with(
            kv_memory,
            &config.models.target,
            config.models.draft.as_deref(),
            config.sampling.params(),
            config.sampling.seed,
            config.max_tokens,
            config.batch_size,
        )?
        .with_penalties(config.sampling.penalties())?
        .place(device, config.models.tensor_parallel.unwrap_or(1))?
        .with_op_split(config.op_split)
    }

    /// Records each target forward split into its ops in every later run (`on`), switching
    /// the target's op clock on ([`LanguageModel::set_op_clock`]).
    ///
    /// # Errors
    /// [`crate::HarnessError::InvalidEngine`] when the target (as placed) has no op clock.
    pub fn with_op_split(mut self, on: bool) -> Result<Self> {
        if on && !self.target.model().set_op_clock(true) {
            return Err(crate::HarnessError::InvalidEngine(
                "op_split: this target has no op clock (the CPU forward of a target of one rank \
                 has one; a GPU or tensor-parallel target has not)"
                    .into(),
            ));
        }
        self.op_split = on;
        Ok(self)
    }

    /// Applies `penalties` to the target's logits of every later run.
    ///
    /// # Errors
    /// [`crate::HarnessError::InvalidEngine`] for invalid penalties.
    pub fn with_penalties(mut self, penalties: Penalties) -> Result<Self> {
        penalties.validate()?;
        self.penalties = penalties;
        Ok(self)
    }

    /// Loads `target` (and `draft`, checking its tokenizer), each a registry name or a GGUF path,
    /// with the machine's default KV budget ([`KvMemory::machine_default`]).
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
        let memory = KvMemory::machine_default();
        Self::open_with(
            memory, target, draft, sampling, seed, max_tokens, batch_size,
        )
    }

    /// [`EngineBackend::open`] with the KV pools sized by `kv_memory` (see
    /// [`super::kv_memory`]: the target's pool and one drafter's together stay within it).
    ///
    /// # Errors
    /// As [`EngineBackend::new`]; a budget too small for the models ([`KvMemory::plan`]).
    pub fn open_with(
        kv_memory: KvMemory,
        target: &str,
        draft: Option<&str>,
        sampling: SamplingParams,
        seed: u64,
        max_tokens: usize,
        batch_size: usize,
    ) -> Result<Self> {
        let target_file = LoadedModel::open(target)?;
        let mut drafts = HashMap::new();
        if let Some(name) = draft.filter(|n| *n != "layer_skip") {
            let loaded = LoadedModel::open(name)?;
            check_same_tokenizer(&target_file, &loaded)?;
            drafts.insert(name.to_string(), loaded);
        }
        let dtype = kv_memory.dtype();
        let (target_bytes, context) = target_file.kv_shape(dtype)?;
        // a draft model's KV per token, or the target's: a bound for layer skip and heads
        let draft_bytes = match drafts.values().next() {
            Some(loaded) => loaded.kv_shape(dtype)?.0,
            None => target_bytes,
        };
        let kv = kv_memory.plan(target_bytes, draft_bytes, batch_size, context)?;
        let mut target = Target::Cpu(Box::new(target_file.instantiate(kv.target_tokens, dtype)?));
        // One untimed forward pages the memory-mapped weights in and warms the thread pool
        // before the first timed method (the baseline runs first and would otherwise pay it).
        time_forward(target.model(), 1)?;
        Ok(Self {
            target_file,
            target,
            drafts,
            default_draft: draft.map(str::to_string),
            sampling,
            penalties: Penalties::default(),
            seed,
            max_tokens,
            batch_size: batch_size.max(1),
            kv,
            calibration: None,
            verify_curve: Vec::new(),
            built: HashMap::new(),
            prepared_s: HashMap::new(),
            device: Device::Cpu,
            replay: None,
            op_split: false,
        })
    }

    /// Places the target on `device` split among `world` tensor-parallel ranks: CPU ranks on
    /// threads of this process ([`EngineBackend::tensor_parallel`]), or GPU ranks, one per GPU
    /// (devices `0..world`), joined by NCCL; `world` = 1 is [`EngineBackend::on_device`]. Drafts
    /// stay whole, on rank 0's thread and device (the draft co-located with rank 0, its drafts
    /// reaching every rank as the step's tokens).
    ///
    /// # Errors
    /// As [`check_tensor_parallel`], [`EngineBackend::tensor_parallel`],
    /// [`EngineBackend::on_device`] and [`LoadedModel::instantiate_sharded_on`] (more ranks
    /// than GPUs, no NCCL, a group not starting at device 0).
    pub fn place(mut self, device: Device, world: usize) -> Result<Self> {
        check_tensor_parallel(world)?;
        if device == Device::Cpu {
            return self.tensor_parallel(world);
        }
        if world == 1 {
            return self.on_device(device);
        }
        let target = self.target_file.instantiate_sharded_on(
            device,
            self.kv.target_tokens,
            self.kv.memory.dtype(),
            world,
        )?;
        self.replace_target(Target::Sharded(target), device)?;
        Ok(self)
    }

    /// Splits the target among `world` tensor-parallel CPU ranks on threads of this process
    /// (each holding its share of the weights and of the KV heads, joined by the thread
    /// communicator); `world` = 1 keeps the single runner. Drafts stay whole, on the caller's
    /// thread (rank 0's). GPU ranks are placed by [`EngineBackend::place`].
    ///
    /// # Errors
    /// As [`check_tensor_parallel`]; [`HarnessError::InvalidEngine`] once the target is on a GPU
    /// (use [`EngineBackend::place`]); as [`LoadedModel::instantiate_sharded`] (a `world` the KV
    /// heads or quantisation blocks cannot be split into).
    pub fn tensor_parallel(mut self, world: usize) -> Result<Self> {
        check_tensor_parallel(world)?;
        if world == 1 {
            return Ok(self);
        }
        if self.device != Device::Cpu {
            return Err(crate::HarnessError::InvalidEngine(format!(
                "tensor_parallel = {world} after the target moved to a GPU: place the ranks \
                 and the device together (EngineBackend::place)"
            )));
        }
        let sharded = self.target_file.instantiate_sharded(
            self.kv.target_tokens,
            self.kv.memory.dtype(),
            world,
        )?;
        self.replace_target(Target::Sharded(Box::new(sharded)), Device::Cpu)?;
        Ok(self)
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
        if matches!(self.target, Target::Sharded(_)) {
            return Err(crate::HarnessError::InvalidEngine(
                "a tensor-parallel target is moved with its ranks: place the ranks and the \
                 device together (EngineBackend::place)"
                    .into(),
            ));
        }
        let target = self.target_file.instantiate_on(
            device,
            self.kv.target_tokens,
            self.kv.memory.dtype(),
        )?;
        self.replace_target(Target::Device(target), device)?;
        Ok(self)
    }

    /// Makes `target`, on `device`, the target (after one timed forward warms it up) and drops
    /// what was built or timed against the old one: the methods, their set-up times and the
    /// verify-cost curve.
    ///
    /// # Errors
    /// The warm-up forward's.
    fn replace_target(&mut self, mut target: Target, device: Device) -> Result<()> {
        time_forward(target.model(), 1)?;
        self.target = target;
        self.device = device;
        self.built.clear();
        self.prepared_s.clear();
        self.verify_curve.clear();
        Ok(())
    }

    /// The KV budget and the pools' token slots.
    pub fn kv_plan(&self) -> KvPlan {
        self.kv
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

    /// Sets the sampling of the runs from now on (temperature, top-k, top-p of the target, and
    /// of the drafters built from now on: methods built before are dropped).
    pub fn set_sampling(&mut self, sampling: SamplingParams) {
        if sampling != self.sampling {
            self.sampling = sampling;
            self.built.clear();
        }
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
            penalties: self.penalties,
            batch_size: self.batch_size,
            kv: self.kv,
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
        Ok(if chat {
            self.encode_messages(&[ChatMessage::user(text)])?
        } else {
            self.target_file.tokenizer.encode_prompt(text)?
        })
    }

    /// Tokenizes a conversation rendered with the target's chat template, ending with the
    /// assistant's turn opened.
    ///
    /// # Errors
    /// A model without a chat template; tokenizer errors.
    pub fn encode_messages(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        let tokenizer = &self.target_file.tokenizer;
        let rendered = tokenizer.apply_chat_template(messages, true)?;
        Ok(tokenizer.encode(&rendered)?)
    }

    /// Tokenizes an experiment prompt: its conversation through the chat template when
    /// [`Prompt::chat`], else its raw text ([`Prompt::raw_text`]).
    ///
    /// # Errors
    /// As [`EngineBackend::encode`].
    pub fn encode_prompt(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        Ok(if prompt.chat {
            self.encode_messages(&prompt.messages())?
        } else {
            self.target_file
                .tokenizer
                .encode_prompt(&prompt.raw_text())?
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
        built
            .engine(self.target.model(), options)?
            .on_tokens(on_tokens)
            .run(requests, on_done)
    }

    /// Serves `method` to the requests of `queue` until it has none left ([`Engine::serve`]:
    /// requests join and leave the running batch between steps). Where `min_acceptance` gives
    /// a level of the method (its drafter, its fallback's) a threshold, that level's policy is
    /// wrapped in a [`DisableGate`]: a request whose acceptance falls below it decodes plainly
    /// and probes again later.
    ///
    /// # Errors
    /// As [`build_method`] and [`Engine::serve`]; a threshold outside [0, 1].
    pub fn serve_queue(
        &mut self,
        method: &MethodConfig,
        min_acceptance: MinAcceptance,
        queue: &mut dyn RequestQueue,
    ) -> Result<()> {
        let mut built = self.build(method)?;
        let mut level = Some(&mut built);
        for prices_offers in method.levels_pricing_offers() {
            let Some(built) = level else { break };
            if let Some(threshold) = min_acceptance.threshold(prices_offers) {
                let policy = std::mem::replace(&mut built.policy, Box::new(FixedPolicy::chain(0)));
                built.policy = Box::new(DisableGate::new(policy).with_threshold(threshold)?);
            }
            level = built.fallback.as_deref_mut();
        }
        let options = self.engine_options(method);
        built.engine(self.target.model(), options)?.serve(queue)
    }

    fn engine_options(&self, method: &MethodConfig) -> EngineOptions {
        EngineOptions {
            method: method.name.clone(),
            sampling: self.sampling,
            penalties: self.penalties,
            seed: self.seed,
            batch_size: self.batch_size,
            replay: self.replay.clone(),
            op_split: self.op_split,
        }
    }

    /// Replays `recorded`'s decisions in every method this backend runs, instead of asking the
    /// methods' policies (see [`RecordedDecisions`]).
    pub fn with_replay(mut self, recorded: RecordedDecisions) -> Self {
        self.replay = Some(Arc::new(recorded));
        self
    }
}

impl Backend for EngineBackend {
    /// Builds every method before any runs (drafters loaded, heads checked, calibrated on the
    /// first prompt), so that a method that cannot be built stops the run before any work; each
    /// method's build time is reported as the set-up of its first run.
    fn prepare(&mut self, methods: &[MethodConfig], first: Option<&RequestSpec<'_>>) -> Result<()> {
        if let Some(spec) = first {
            self.calibration = Some(self.encode_prompt(spec.prompt)?);
        }
        for method in methods {
            if self.built.contains_key(&method.name) {
                continue;
            }
            let started = Instant::now();
            let built = self.build(method)?;
            self.prepared_s
                .insert(method.name.clone(), started.elapsed().as_secs_f64());
            self.built.insert(method.name.clone(), built);
        }
        Ok(())
    }

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
                    seed: None,
                    workload: None,
                    prompt: self.encode_prompt(spec.prompt)?,
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
        let setup_s = setup_started.elapsed().as_secs_f64()
            + self.prepared_s.remove(&method.name).unwrap_or(0.0);
        let options = self.engine_options(method);
        let started = Instant::now();
        let generations = built
            .engine(self.target.model(), options)
            .and_then(|mut engine| {
                engine.run(&engine_requests, &mut |i| {
                    on_request_done(requests[i].index)
                })
            });
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

/// Checks a tensor-parallel rank count before anything loads: 1..=[`MAX_TENSOR_PARALLEL`].
///
/// # Errors
/// [`HarnessError::InvalidEngine`] naming the count and the range.
pub fn check_tensor_parallel(world: usize) -> Result<()> {
    if !(1..=MAX_TENSOR_PARALLEL).contains(&world) {
        return Err(crate::HarnessError::InvalidEngine(format!(
            "tensor_parallel = {world} is not in 1..={MAX_TENSOR_PARALLEL}"
        )));
    }
    Ok(())
}
