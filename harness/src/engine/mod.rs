//! The engine loop: speculative decoding end to end over a real [`LanguageModel`].
//!
//! Each step, for every active request of the batch:
//!
//! 1. **policy** — its [`SpeculationPolicy`] picks a [`Budget`] (0 = plain decoding this step);
//!    with a fallback drafter ([`Engine::with_fallback`]), the fallback's own policy picks one
//!    whenever the first chose plain decoding ([`FallbackPolicy`]); a replay
//!    ([`EngineOptions::replay`]) takes a recorded run's decisions instead (see [`recorded`]);
//! 2. **draft** — the chosen [`Drafter`] proposes a [`DraftTree`] whose root is the request's
//!    last token (sampled last step, not yet in the target's KV cache); of a chain of
//!    deterministic drafts the policy keeps a prefix ([`SpeculationPolicy::keep_drafts`]: a
//!    drafter that costs nothing offers what it is confident of, and the policy prices it);
//! 3. **target** — one forward over all requests' trees at once (ragged batch, tree
//!    attention), logits at every node;
//! 4. **verify** — each node's logits are prepared (temperature, top-k, top-p) and the drafter's
//!    [`PairedVerifier`] accepts a path and draws the next token. When the batch shares one
//!    kernel verifier and no penalties apply, stages 3 and 4 are one
//!    [`LanguageModel::forward_verify`]: the target verifies the whole batch where its logits
//!    are (on a GPU one batched prepare and verify launch; only the verdicts reach the host).
//!    Otherwise [`LanguageModel::forward`] brings the logits to the host, each node's row goes
//!    through the path-dependent [`Penalties`] (with the node's own history) and
//!    [`prepare_logits`], and each request is verified on its own;
//! 5. **commit** — the accepted path (root + accepted drafts) is committed to the target's KV,
//!    the rest of the tree is dropped; stop conditions are checked token by token and KV past a
//!    stop is rewound;
//! 6. **observe** — the policy sees the [`StepOutcome`] with the step's measured [`StepTiming`]
//!    (draft, target and verify + commit seconds; the prompt prefill on the first step; tokens
//!    left), through [`SpeculationPolicy::observe_measured`], so a cost-model policy decides
//!    from this machine's costs as they are now; every drafter hears the verdict
//!    ([`Drafter::observe`]: the new context and what the target committed, with the target's
//!    features of the committed tokens for a drafter that [`Drafter::wants_features`]), after
//!    admission too, and is told when a request retires, with its final text
//!    ([`Drafter::finished`], then [`Drafter::release`]).
//!
//! Invariant between steps: the target's KV holds the request's context except its last token.
//! Requests are admitted when a batch slot is free (and their KV need fits) and retired
//! independently (continuous batching): [`Engine::run`] takes them from a slice known up front,
//! [`Engine::serve`] from a [`RequestQueue`] between steps (a server's arrivals, cancellations
//! and streamed tokens), one loop for both. An admitted request's prompt is prefilled in chunks of
//! [`PREFILL_CHUNK`] tokens, one chunk per step while other requests decode (chunked prefill,
//! interleaved: a long prompt never stalls the batch for its whole prefill), and steps once it
//! is in. Plain decoding is this very loop with a budget of 0, so the baseline
//! and every method share one numeric path; with a batch-invariant model greedy speculative
//! output equals greedy plain output token for token.
//!
//! Randomness: one production [`Replay`] generator keyed by (seed, request id, step, node,
//! purpose), so results do not depend on batch composition or order; a request with its own
//! seed ([`Request::seed`]) draws from that seed instead, so requests with different seeds share
//! a batch and each still decides as it would alone.

mod draft_lm;
mod recorded;
mod stop;

pub use draft_lm::LmDraftModel;
pub use recorded::RecordedDecisions;
pub use specdec_kernels::sampling::Penalties;
pub use stop::{Detokenizer, FinishReason, StopRule};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use specdec_algorithms::drafters::{DraftFeedback, DraftRequest, Drafter};
use specdec_algorithms::policy::{
    Budget, DrafterChoice, FallbackPolicy, SpeculationPolicy, StepOutcome, StepTiming,
};
use specdec_algorithms::verify::PairedVerifier;
use specdec_kernels::sampling::{prepare_logits, Replay, SamplingParams, SeededSequences};
use specdec_kernels::verification::{DraftKind, DraftTree, Verdict, VerifyInput, VerifySequence};
use specdec_models::{
    Features, KvRoom, LanguageModel, Logits, ModelError, SeqId, SequenceStep, VerifyRequest,
    PREFILL_CHUNK,
};

use crate::error::{HarnessError, Result};
use crate::metrics::{OpSeconds, PolicyDecision, StepRecord};

/// Token slots a request's admission reserves in the target's KV pool beyond its prompt and
/// `max_new_tokens`: room for the draft tree's speculative slots at the end of its output. A
/// step's tree may use more while the pool has unreserved blocks; when it has none, the
/// request's budget is cut to a chain that fits its reservation.
pub const KV_TREE_ROOM: usize = 64;

/// A drafter that never drafts: every step is plain decoding. The baseline's drafter.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoDrafter;

impl<N: specdec_kernels::sampling::Prob> Drafter<N> for NoDrafter {
    fn name(&self) -> String {
        "none".into()
    }

    fn kind(&self) -> DraftKind {
        DraftKind::Deterministic
    }

    fn propose(
        &mut self,
        request: &DraftRequest<'_>,
        _decisions: &mut dyn specdec_kernels::sampling::Decisions<N>,
    ) -> specdec_algorithms::Result<DraftTree<N>> {
        Ok(DraftTree::root_only(
            request.root()?,
            DraftKind::Deterministic,
        ))
    }
}

/// Settings shared by every request of a run.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Method name written into the step records.
    pub method: String,
    /// Temperature / top-k / top-p applied to the target (and by drafters to `q`).
    pub sampling: SamplingParams,
    /// Penalties applied to the target's logits at each node.
    pub penalties: Penalties,
    /// Seed of the production random generator (of the requests without a seed of their own).
    pub seed: u64,
    /// Most requests in flight at once (≥ 1).
    pub batch_size: usize,
    /// Decisions of a recorded run to take in place of the policy's, step by step, each step
    /// checked against its record ([`RecordedDecisions`]); `None` lets the policy decide.
    pub replay: Option<Arc<RecordedDecisions>>,
    /// Record each target forward's op split in its steps' records ([`StepRecord::ops`]); the
    /// target's op clock must be on ([`LanguageModel::set_op_clock`]).
    pub op_split: bool,
}

/// One request: a prompt and its stop conditions.
#[derive(Debug, Clone)]
pub struct Request {
    /// Stable id: keys the request's random decisions (results do not depend on batch order).
    pub id: u64,
    /// Prompt token ids (non-empty; with `stop.max_new_tokens` it fits the model's context).
    pub prompt: Vec<u32>,
    /// When to stop.
    pub stop: StopRule,
    /// The request's own seed: with one, its random decisions are those of request 0 of a run
    /// seeded with it, whatever its id, the run's seed or the requests sharing its batch
    /// ([`SeededSequences`]); `None` draws from the run's seed by its id.
    pub seed: Option<u64>,
    /// The traffic the request belongs to (a server's chat and code requests are two): a
    /// policy that starts a request from the acceptance earlier requests measured pools it per
    /// workload ([`SpeculationPolicy::fork_for_new_workload`]); `None` is the engine's default
    /// workload. At most [`MAX_WORKLOADS`] names per engine.
    pub workload: Option<String>,
}

/// Workload names one engine keeps a policy prototype for ([`Request::workload`]); a request
/// naming one more is refused.
pub const MAX_WORKLOADS: usize = 64;

/// What one request produced.
#[derive(Debug, Clone)]
pub struct Generation {
    /// The request's id.
    pub id: u64,
    /// Generated token ids (prompt excluded), cut at the stop.
    pub tokens: Vec<u32>,
    /// Why it finished.
    pub finish: FinishReason,
    /// One record per target pass (`request` = position of the request in the input slice).
    pub steps: Vec<StepRecord>,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Seconds from admission (prefill included) to retirement.
    pub elapsed_s: f64,
}

/// A request in flight.
struct Active {
    index: usize,
    request: Request,
    seq: SeqId,
    /// Prompt + output; the target's KV holds all but the last token.
    context: Vec<u32>,
    policy: FallbackPolicy,
    step: u64,
    steps: Vec<StepRecord>,
    started: Instant,
    /// Seconds the target spent prefilling the prompt (its chunks' forwards): the policy's
    /// cost sample.
    prefill_s: f64,
    /// Seconds from admission until the prompt was in (other requests' steps between its
    /// chunks included): the request's time to its first step, as a client waits it.
    prefill_wall_s: f64,
    prefill_tokens: usize,
    /// Prompt tokens in the target's KV so far; the request steps once all but the last are.
    prefilled: usize,
    /// Forwards the prefill took so far (one per chunk).
    prefill_forwards: usize,
    /// Width and rows of the features the prefilled chunks handed back.
    prefill_features: Option<(usize, Vec<f32>)>,
    /// Blocks of the target's KV pool reserved for this request at admission (its prompt,
    /// `max_new_tokens` and [`KV_TREE_ROOM`]); 0 for a model without a bounded pool.
    kv_blocks: usize,
    /// Tokens the last step added to the output (after a cut at a stop).
    last_emitted: usize,
    /// Drafts the last step proposed.
    last_proposed: usize,
}

impl Active {
    fn output(&self) -> &[u32] {
        &self.context[self.request.prompt.len()..]
    }

    /// What the request produced so far, as it retires for `finish`.
    fn into_generation(self, finish: FinishReason) -> Generation {
        Generation {
            id: self.request.id,
            tokens: self.output().to_vec(),
            finish,
            prompt_tokens: self.request.prompt.len(),
            elapsed_s: self.started.elapsed().as_secs_f64(),
            steps: self.steps,
        }
    }
}

/// Where a serving run ([`Engine::serve`]) takes its requests from and hands its results to,
/// between steps: requests join the running batch as they arrive and leave it as they finish
/// or are cancelled.
pub trait RequestQueue {
    /// The next request to admit, if one is waiting. With `wait` (nothing is in flight) it may
    /// block until one arrives; `None` then ends the run. Without `wait` it must not block.
    fn next(&mut self, wait: bool) -> Option<Request>;
    /// Whether request `id` (in flight) was cancelled: it is dropped before the next step, its
    /// KV blocks freed, and handed to [`RequestQueue::finished`] with
    /// [`FinishReason::Cancelled`].
    fn cancelled(&mut self, id: u64) -> bool {
        let _ = id;
        false
    }
    /// Tokens the last step added to request `id`'s output (cut at a stop), in order.
    fn tokens(&mut self, id: u64, tokens: &[u32]) {
        let _ = (id, tokens);
    }
    /// Request number `index` (in order of arrival) finished.
    fn finished(&mut self, index: usize, generation: Generation);
    /// A request that can never run (an empty prompt, or one past the context or the KV pool
    /// even alone), refused without stopping the others.
    fn refused(&mut self, request: Request, error: HarnessError);
    /// After every step and every cancellation: the batch as it stands.
    fn stepped(&mut self, status: &BatchStatus) {
        let _ = status;
    }
}

/// The batch of a serving run between two steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchStatus {
    /// Requests decoding.
    pub decoding: usize,
    /// Requests still prefilling their prompts.
    pub prefilling: usize,
    /// Drafts proposed in the last step, all its requests together (0 after a cancellation).
    pub proposed: usize,
    /// Requests cancelled and dropped just now (0 after a step).
    pub cancelled: usize,
    /// The target's KV pool now (`None`: an unbounded cache).
    pub kv: Option<KvRoom>,
}

/// Streaming callback: `(request id, tokens this step added to its output)`.
pub type TokenCallback<'c> = dyn FnMut(u64, &[u32]) + 'c;

/// The queue of [`Engine::run`]: a slice of requests, all known up front, in order.
struct SliceQueue<'q, 'a> {
    waiting: std::slice::Iter<'q, Request>,
    /// By position in the slice (= order of arrival).
    results: Vec<Option<Generation>>,
    on_tokens: Option<&'a mut TokenCallback<'a>>,
    on_done: &'q mut dyn FnMut(usize),
    /// The first request refused (none are: [`Engine::run`] checks them all first).
    refused: Option<HarnessError>,
}

impl RequestQueue for SliceQueue<'_, '_> {
    fn next(&mut self, _wait: bool) -> Option<Request> {
        self.waiting.next().cloned()
    }

    fn tokens(&mut self, id: u64, tokens: &[u32]) {
        if let Some(callback) = self.on_tokens.as_mut() {
            callback(id, tokens);
        }
    }

    fn finished(&mut self, index: usize, generation: Generation) {
        self.results[index] = Some(generation);
        (self.on_done)(index);
    }

    fn refused(&mut self, _request: Request, error: HarnessError) {
        self.refused.get_or_insert(error);
    }
}

/// The engine (see the module docs): a target model, a drafter, a paired verifier and a policy
/// prototype (forked per request), optionally a fallback drafter with its own verifier and policy.
pub struct Engine<'a> {
    target: &'a mut dyn LanguageModel,
    drafter: &'a mut dyn Drafter<f32>,
    verifier: PairedVerifier<f32>,
    fallback: Option<(&'a mut dyn Drafter<f32>, PairedVerifier<f32>)>,
    /// Whether a drafter reads the target's features (handed over in the feedback).
    features_wanted: bool,
    policy: FallbackPolicy,
    /// The policy prototype of each named workload ([`Request::workload`]), forked from
    /// `policy` when its first request is admitted.
    workload_policies: BTreeMap<String, FallbackPolicy>,
    options: EngineOptions,
    on_tokens: Option<&'a mut TokenCallback<'a>>,
}

impl<'a> Engine<'a> {
    /// Calls `callback(request id, new tokens)` after each step with the tokens that step added
    /// to a request's output (cut at a stop), in order: for streaming.
    pub fn on_tokens(mut self, callback: &'a mut TokenCallback<'a>) -> Self {
        self.on_tokens = Some(callback);
        self
    }

    /// Builds an engine.
    ///
    /// # Errors
    /// [`HarnessError::Algorithm`] with [`specdec_algorithms::AlgorithmError::DraftKindMismatch`] when the drafter's
    /// trees are not of the kind the verifier is paired with (the pairing rule);
    /// [`HarnessError::InvalidEngine`] for a batch size of 0 or invalid sampling / penalties.
    pub fn new(
        target: &'a mut dyn LanguageModel,
        drafter: &'a mut dyn Drafter<f32>,
        verifier: PairedVerifier<f32>,
        policy: Box<dyn SpeculationPolicy>,
        options: EngineOptions,
    ) -> Result<Self> {
        verifier.check_kind(drafter.kind())?;
        check_features(&*target, &*drafter)?;
        let features_wanted = drafter.wants_features();
        if options.batch_size == 0 {
            return Err(HarnessError::InvalidEngine(
                "batch size must be at least 1".into(),
            ));
        }
        options.sampling.validate()?;
        options.penalties.validate()?;
        Ok(Self {
            target,
            drafter,
            verifier,
            fallback: None,
            features_wanted,
            policy: FallbackPolicy::new(policy, None),
            workload_policies: BTreeMap::new(),
            options,
            on_tokens: None,
        })
    }

    /// Adds a fallback drafter, verified by `verifier` and steered by `policy`: it drafts on the
    /// steps where the main policy chooses plain decoding and its own does not (see
    /// [`FallbackPolicy`]).
    ///
    /// # Errors
    /// [`HarnessError::Algorithm`] with [`specdec_algorithms::AlgorithmError::DraftKindMismatch`]
    /// when the fallback's trees are not of the kind its verifier is paired with.
    pub fn with_fallback(
        mut self,
        drafter: &'a mut dyn Drafter<f32>,
        verifier: PairedVerifier<f32>,
        policy: Box<dyn SpeculationPolicy>,
    ) -> Result<Self> {
        verifier.check_kind(drafter.kind())?;
        check_features(&*self.target, &*drafter)?;
        self.features_wanted |= drafter.wants_features();
        self.policy = self.policy.with_fallback(policy);
        self.fallback = Some((drafter, verifier));
        Ok(self)
    }

    /// Runs every request to completion, at most `batch_size` at once, calling `on_done(index)`
    /// as each retires ([`Engine::serve`] over the slice). Returns one [`Generation`] per
    /// request, in input order.
    ///
    /// # Errors
    /// An empty prompt, or a prompt and `max_new_tokens` that do not fit the model's context
    /// ([`check_fits_context`]), or one workload more than [`MAX_WORKLOADS`] (every request
    /// checked before any is admitted);
    /// any model, drafter or verifier error (NaN logits included). Requests already in flight
    /// are released from the target's KV cache before the error returns.
    pub fn run(
        &mut self,
        requests: &[Request],
        on_done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Generation>> {
        let (context, room) = (self.target.max_context(), self.target.kv_room());
        let mut new_workloads = BTreeSet::new();
        for request in requests {
            check_fits(request, context, room.as_ref())?;
            self.check_workload(request, &new_workloads)?;
            if let Some(name) = request.workload.as_deref() {
                if !self.workload_policies.contains_key(name) {
                    new_workloads.insert(name);
                }
            }
        }
        let mut queue = SliceQueue {
            waiting: requests.iter(),
            results: vec![None; requests.len()],
            on_tokens: self.on_tokens.take(),
            on_done,
            refused: None,
        };
        let served = self.serve(&mut queue);
        self.on_tokens = queue.on_tokens.take();
        served?;
        if let Some(error) = queue.refused {
            return Err(error);
        }
        Ok(queue
            .results
            .into_iter()
            .map(|g| g.expect("every request retired"))
            .collect())
    }

    /// Serves requests from `queue` until it has none left: each request joins the running batch
    /// (at most `batch_size` at once) when it arrives and its KV need fits beside the requests in
    /// flight (otherwise it waits, and the ones behind it too: arrival order is kept), is
    /// prefilled in chunks interleaved with the others' steps, and leaves when it finishes or is
    /// cancelled ([`RequestQueue::cancelled`], checked before every step), its KV blocks freed
    /// for the next step. A request that cannot run even alone, or that names one workload more than
    /// [`MAX_WORKLOADS`], is [`RequestQueue::refused`].
    ///
    /// # Errors
    /// Any model, drafter or verifier error (NaN logits included): the run stops, and the
    /// requests in flight are released from the target's KV cache before the error returns.
    pub fn serve(&mut self, queue: &mut dyn RequestQueue) -> Result<()> {
        let mut decisions = Replay::new(SeededSequences::new(self.options.seed));
        // requests in flight: decoding, and still prefilling their prompts
        let mut active: Vec<Active> = Vec::new();
        let mut prefilling: Vec<Active> = Vec::new();
        // the request at the head of the line, waiting for KV room
        let mut held: Option<Request> = None;
        let mut arrived = 0;
        let outcome = (|| -> Result<()> {
            loop {
                let seeds = decisions.source_mut();
                let cancelled = self.drop_cancelled(&mut active, queue, seeds)?
                    + self.drop_cancelled(&mut prefilling, queue, seeds)?;
                if cancelled > 0 {
                    queue.stepped(&BatchStatus {
                        cancelled,
                        ..self.status(&active, &prefilling)
                    });
                }
                while active.len() + prefilling.len() < self.options.batch_size {
                    let idle = active.is_empty() && prefilling.is_empty();
                    let Some(request) = held.take().or_else(|| queue.next(idle)) else {
                        break;
                    };
                    let (context, room) = (self.target.max_context(), self.target.kv_room());
                    let checked = check_fits(&request, context, room.as_ref())
                        .and_then(|()| self.check_workload(&request, &BTreeSet::new()));
                    if let Err(error) = checked {
                        queue.refused(request, error);
                        continue;
                    }
                    // admitted only when its whole need fits beside the requests in flight;
                    // otherwise it waits for one of them to retire (it fits alone: checked)
                    if let Some(room) = self.target.kv_room() {
                        let in_flight = active.iter().chain(&prefilling);
                        let reserved: usize = in_flight.map(|a| a.kv_blocks).sum();
                        if !idle && reserved + kv_need(&request, &room) > room.total_blocks {
                            held = Some(request);
                            break;
                        }
                    }
                    decisions
                        .source_mut()
                        .seed_sequence(request.id, request.seed);
                    prefilling.push(self.admit(arrived, request)?);
                    arrived += 1;
                }
                // Chunked prefill, interleaved: one chunk of every prefilling prompt per step,
                // so a long prompt delays the decoding requests by one chunk's forward per
                // step, never by its whole prefill; chunk after chunk while nothing decodes.
                loop {
                    for position in (0..prefilling.len()).rev() {
                        if self.prefill_chunk(&mut prefilling[position])? {
                            active.push(prefilling.swap_remove(position));
                        }
                    }
                    if !active.is_empty() || prefilling.is_empty() {
                        break;
                    }
                }
                if active.is_empty() {
                    // nothing in flight after asking with `wait`: the queue has ended
                    return Ok(());
                }
                let finished = self.step(&mut active, &mut decisions)?;
                let proposed = active.iter().map(|a| a.last_proposed).sum();
                for seq in &active {
                    if seq.last_emitted > 0 {
                        let len = seq.context.len();
                        queue.tokens(seq.request.id, &seq.context[len - seq.last_emitted..]);
                    }
                }
                for (position, finish) in finished.into_iter().rev() {
                    let done = active.swap_remove(position);
                    if let Some(recorded) = &self.options.replay {
                        recorded.check_finished(done.request.id, done.step)?;
                    }
                    self.retire(&done, decisions.source_mut())?;
                    queue.finished(done.index, done.into_generation(finish));
                }
                queue.stepped(&BatchStatus {
                    proposed,
                    ..self.status(&active, &prefilling)
                });
            }
        })();
        if let Err(err) = outcome {
            for in_flight in active.iter().chain(&prefilling) {
                let _ = self.retire(in_flight, decisions.source_mut());
            }
            return Err(err);
        }
        Ok(())
    }

    /// Drops the requests of `in_flight` that `queue` says were cancelled: their target
    /// sequences and drafter state are released, and they are handed back as finished with
    /// [`FinishReason::Cancelled`].
    /// Returns how many were.
    fn drop_cancelled(
        &mut self,
        in_flight: &mut Vec<Active>,
        queue: &mut dyn RequestQueue,
        seeds: &mut SeededSequences,
    ) -> Result<usize> {
        let before = in_flight.len();
        for position in (0..in_flight.len()).rev() {
            if queue.cancelled(in_flight[position].request.id) {
                let gone = in_flight.swap_remove(position);
                self.retire(&gone, seeds)?;
                queue.finished(gone.index, gone.into_generation(FinishReason::Cancelled));
            }
        }
        Ok(before - in_flight.len())
    }

    /// The batch as it stands, for [`RequestQueue::stepped`] (no step's drafts, none cancelled).
    fn status(&self, active: &[Active], prefilling: &[Active]) -> BatchStatus {
        BatchStatus {
            decoding: active.len(),
            prefilling: prefilling.len(),
            proposed: 0,
            cancelled: 0,
            kv: self.target.kv_room(),
        }
    }

    /// Releases a request's target sequence, its drafters' state and its own seed in `seeds`,
    /// after telling its drafters its final text ([`Drafter::finished`]).
    fn retire(&mut self, seq: &Active, seeds: &mut SeededSequences) -> Result<()> {
        seeds.seed_sequence(seq.request.id, None);
        self.target.release(seq.seq)?;
        let id = seq.request.id;
        self.each_drafter(|d| d.finished(id, &seq.context))?;
        self.each_drafter(|d| d.release(id))
    }

    /// Tells every drafter (the main one and the fallback) a sequence's verdict.
    fn observe_drafts(&mut self, feedback: &DraftFeedback<'_>) -> Result<()> {
        self.each_drafter(|d| d.observe(feedback))
    }

    /// Runs `tell` on every drafter: the main one, then the fallback.
    fn each_drafter(
        &mut self,
        mut tell: impl FnMut(&mut dyn Drafter<f32>) -> specdec_algorithms::Result<()>,
    ) -> Result<()> {
        tell(&mut *self.drafter)?;
        if let Some((fallback, _)) = self.fallback.as_mut() {
            tell(&mut **fallback)?;
        }
        Ok(())
    }

    /// Whether the engine keeps a policy prototype for `request`'s workload or has room for
    /// one more, besides the `pending` names not yet admitted ([`check_workload_room`]).
    fn check_workload(&self, request: &Request, pending: &BTreeSet<&str>) -> Result<()> {
        let Some(name) = request.workload.as_deref() else {
            return Ok(());
        };
        let known = self.workload_policies.contains_key(name) || pending.contains(name);
        check_workload_room(
            request.id,
            name,
            known,
            self.workload_policies.len() + pending.len(),
        )
    }

    /// A fresh policy for a request of `workload` (see [`Request::workload`]); the caller
    /// checked the workload ([`Engine::check_workload`]).
    fn policy_for(&mut self, workload: Option<&str>) -> FallbackPolicy {
        let Some(name) = workload else {
            return self.policy.fork();
        };
        self.workload_policies
            .entry(name.to_owned())
            .or_insert_with(|| self.policy.fork_for_new_workload())
            .fork()
    }

    /// Creates the request's target sequence; its prompt is prefilled by [`Engine::prefill_chunk`].
    fn admit(&mut self, index: usize, request: Request) -> Result<Active> {
        let started = Instant::now();
        let policy = self.policy_for(request.workload.as_deref());
        let seq = self.target.new_sequence()?;
        Ok(Active {
            kv_blocks: self
                .target
                .kv_room()
                .map_or(0, |room| kv_need(&request, &room)),
            index,
            context: request.prompt.clone(),
            prefill_tokens: request.prompt.len() - 1,
            request,
            seq,
            policy,
            step: 0,
            steps: Vec::new(),
            started,
            prefill_s: 0.0,
            prefill_wall_s: 0.0,
            prefilled: 0,
            prefill_forwards: 0,
            prefill_features: None,
            last_emitted: 0,
            last_proposed: 0,
        })
    }

    /// Forwards the next chunk (at most [`PREFILL_CHUNK`] tokens) of `seq`'s prompt, all but its
    /// last token, into the target's KV; once the prompt is in, tells the drafters (with the
    /// prompt's features, for those that read them). Returns whether the prompt is in: the
    /// request may step.
    fn prefill_chunk(&mut self, seq: &mut Active) -> Result<bool> {
        let t0 = Instant::now();
        let prompt = &seq.request.prompt;
        let prefix = &prompt[..prompt.len() - 1];
        let end = (seq.prefilled + PREFILL_CHUNK).min(prefix.len());
        if end > seq.prefilled {
            let chunk = &prefix[seq.prefilled..end];
            if let Some(features) = self.target.prefill(seq.seq, chunk)? {
                let (_, rows) = seq
                    .prefill_features
                    .get_or_insert_with(|| (features.dim(), Vec::new()));
                rows.extend_from_slice(features.as_slice());
            }
            seq.prefilled = end;
            seq.prefill_forwards += 1;
        }
        let done = seq.prefilled == prefix.len();
        if done {
            let features = match seq.prefill_features.take() {
                Some((dim, rows)) => Some(Features::new(dim, rows)?),
                None => None,
            };
            self.observe_drafts(&DraftFeedback {
                sequence: seq.request.id,
                context: prompt,
                prompt_len: prompt.len(),
                committed: prefix.len(),
                accepted: 0,
                features: features.as_ref(),
            })?;
        }
        seq.prefill_s += t0.elapsed().as_secs_f64();
        if done {
            seq.prefill_wall_s = seq.started.elapsed().as_secs_f64();
        }
        Ok(done)
    }

    /// One engine step over all active requests; returns the finished ones (position, reason),
    /// positions ascending.
    fn step(
        &mut self,
        active: &mut [Active],
        decisions: &mut Replay<SeededSequences>,
    ) -> Result<Vec<(usize, FinishReason)>> {
        let max_context = self.target.max_context();
        // KV blocks free beyond what the requests in flight have reserved (between steps the
        // target holds each request's context but its last token, no speculative slots)
        let room = self.target.kv_room();
        let mut spare_blocks = room.map_or(0, |room| {
            let outstanding: usize = active
                .iter()
                .map(|a| {
                    a.kv_blocks
                        .saturating_sub(room.blocks_for(a.context.len() - 1))
                })
                .sum();
            room.free_blocks.saturating_sub(outstanding)
        });
        // 1: budgets, held to the context and to the KV pool (a tree may take up to its
        // budget's nodes: those blocks beyond the request's reservation come from the spare).
        let sequences = active.len();
        let mut budgets = Vec::with_capacity(sequences);
        let mut choices = Vec::with_capacity(sequences);
        for seq in active.iter_mut() {
            let (choice, mut budget) = match &self.options.replay {
                Some(recorded) => {
                    recorded.decision(seq.request.id, seq.step, self.fallback.is_some())?
                }
                None => {
                    seq.policy.observe_load(sequences);
                    seq.policy.next_budget()
                }
            };
            let decision = PolicyDecision::new(choice == DrafterChoice::Fallback, &budget);
            // Room left in the context for this step's tree depth (root included).
            let context_room = max_context.saturating_sub(seq.context.len());
            if budget.max_drafts() + 1 > context_room {
                budget = Budget::chain(context_room.saturating_sub(1));
            }
            // Room in the KV pool for this step's tree nodes: the request's reservation and
            // the pool's unreserved blocks.
            let held = seq.context.len() - 1;
            if let Some(room) = room {
                let may_hold = seq.kv_blocks.max(room.blocks_for(held)) + spare_blocks;
                let slots = (may_hold * room.block_size).saturating_sub(held);
                if budget.max_drafts() + 1 > slots {
                    let k = slots.min(context_room).saturating_sub(1);
                    budget = Budget::chain(k);
                }
                let beyond = room
                    .blocks_for(held + budget.max_drafts() + 1)
                    .saturating_sub(seq.kv_blocks.max(room.blocks_for(held)));
                spare_blocks = spare_blocks.saturating_sub(beyond);
            }
            budgets.push(budget);
            choices.push((choice, decision));
        }
        // 2: drafts, each drafter proposing for all of its requests at once (a model drafter
        // forwards the batch's sequences together); a request's draft time is its share of its
        // drafter's, in proportion to the drafts it got.
        let mut trees: Vec<Option<DraftTree<f32>>> = (0..sequences).map(|_| None).collect();
        let mut draft_s = vec![0.0; sequences];
        let mut drafters = vec![String::new(); sequences];
        for group in [DrafterChoice::Primary, DrafterChoice::Fallback] {
            let members: Vec<usize> = (0..sequences).filter(|&i| choices[i].0 == group).collect();
            if members.is_empty() {
                continue;
            }
            let drafter: &mut dyn Drafter<f32> = match (group, self.fallback.as_mut()) {
                (DrafterChoice::Fallback, Some((fallback, _))) => &mut **fallback,
                _ => &mut *self.drafter,
            };
            let requests: Vec<DraftRequest<'_>> = members
                .iter()
                .map(|&i| DraftRequest {
                    sequence: active[i].request.id,
                    step: active[i].step,
                    context: &active[i].context,
                    budget: &budgets[i],
                })
                .collect();
            let t0 = Instant::now();
            let proposed = drafter.propose_batch(&requests, decisions)?;
            let group_s = t0.elapsed().as_secs_f64();
            let name = drafter.name();
            if proposed.len() != members.len() {
                return Err(HarnessError::InvalidEngine(format!(
                    "drafter {name} proposed {} trees for {} requests",
                    proposed.len(),
                    members.len()
                )));
            }
            let drafted: usize = proposed.iter().map(|t| t.len() - 1).sum();
            for (&i, tree) in members.iter().zip(proposed) {
                let seq = &active[i];
                if seq.context.len() + tree.topology().max_depth() > max_context
                    || tree.len() > budgets[i].max_drafts() + 1
                {
                    return Err(HarnessError::InvalidEngine(format!(
                        "drafter {name} proposed a tree of {} nodes and depth {} beyond the \
                         budget {:?}",
                        tree.len(),
                        tree.topology().max_depth(),
                        budgets[i]
                    )));
                }
                draft_s[i] = match drafted {
                    0 => group_s / members.len() as f64,
                    _ => group_s * (tree.len() - 1) as f64 / drafted as f64,
                };
                drafters[i] = name.clone();
                trees[i] = Some(self.kept_drafts(&mut active[i], &mut choices[i], tree)?);
            }
        }
        let trees: Vec<DraftTree<f32>> = trees.into_iter().flatten().collect();
        // 3–4: one target pass over every tree, verified where its logits are.
        if self.options.op_split {
            // what the clock holds now is not this forward's (a prompt's prefill)
            self.target.take_op_times();
        }
        let pass = self.target_pass(active, &trees, &choices, decisions)?;
        let target_s = pass.forward_s;
        // a forward shared by a batch is recorded in full in each of its steps, as its time
        let ops: Vec<OpSeconds> = if self.options.op_split {
            self.target
                .take_op_times()
                .into_iter()
                .map(|t| OpSeconds {
                    op: t.op.to_string(),
                    seconds: t.total.as_secs_f64(),
                })
                .collect()
        } else {
            Vec::new()
        };
        let kv_blocks_used = self
            .target
            .kv_room()
            .map_or(0, |room| room.total_blocks - room.free_blocks);
        let batch_tokens: usize = trees.iter().map(|t| t.len()).sum();
        // 5–6 per request.
        let batch = active.len();
        let mut finished = Vec::new();
        for (position, ((seq, tree), (verdict, features))) in active
            .iter_mut()
            .zip(&trees)
            .zip(pass.verdicts.into_iter().zip(pass.features))
            .enumerate()
        {
            let verify_s = pass.verify_s[position];
            let t0 = Instant::now();
            // The KV keeps the root and the accepted drafts (the verdict lists drafts only).
            let kv_path: Vec<usize> = std::iter::once(0)
                .chain(verdict.accepted_path.iter().copied())
                .collect();
            self.target.commit(seq.seq, &kv_path)?;
            let emitted = verdict.emitted_tokens(tree);
            let mut kept = 0;
            let mut finish = None;
            for &token in &emitted {
                seq.context.push(token);
                kept += 1;
                finish = seq.request.stop.check(seq.output());
                if finish.is_none() && seq.context.len() >= max_context {
                    finish = Some(FinishReason::ContextFull);
                }
                if finish.is_some() {
                    break;
                }
            }
            // KV now holds the old context + accepted drafts; it must hold all but the last
            // kept token.
            seq.last_emitted = kept;
            let accepted = verdict.accepted_len;
            let surplus = (accepted + 1).saturating_sub(kept);
            if surplus > 0 {
                self.target.rewind(seq.seq, surplus)?;
            }
            if finish.is_none() {
                // the drafters hear the verdict (a retiring request is released instead)
                let features = match self.features_wanted {
                    true => Some(feature_rows(features.as_ref(), &kv_path, seq.request.id)?),
                    false => None,
                };
                self.observe_drafts(&DraftFeedback {
                    sequence: seq.request.id,
                    context: &seq.context,
                    prompt_len: seq.request.prompt.len(),
                    committed: seq.context.len() - 1,
                    accepted,
                    features: features.as_ref(),
                })?;
            }
            let commit_s = t0.elapsed().as_secs_f64();

            // The policy sees the outcome with this step's measured costs (its own cost model).
            let first = seq.step == 0;
            let timing = StepTiming {
                draft_passes: tree.topology().max_depth(),
                draft_s: draft_s[position],
                // this sequence's share of the shared forward, by tokens (all of it alone)
                target_s: target_s * (tree.len() as f64 / batch_tokens.max(1) as f64),
                other_s: verify_s + commit_s,
                prefill_tokens: if first { seq.prefill_tokens } else { 0 },
                prefill_s: if first { seq.prefill_s } else { 0.0 },
                prefill_forwards: if first { seq.prefill_forwards } else { 0 },
                forward_tokens: batch_tokens,
                forward_s: target_s,
                remaining_tokens: Some(
                    seq.request
                        .stop
                        .max_new_tokens
                        .saturating_sub(seq.output().len()),
                ),
            };
            let proposed = tree.len() - 1;
            seq.last_proposed = proposed;
            match &self.options.replay {
                Some(recorded) => recorded.check(
                    seq.request.id,
                    seq.step,
                    &drafters[position],
                    (proposed, accepted),
                    &seq.context[seq.context.len() - kept..],
                )?,
                None => seq.policy.observe_measured(
                    &StepOutcome::from_verdict(tree.topology(), &verdict.accepted_path)?,
                    &timing,
                ),
            }
            seq.steps.push(StepRecord {
                method: self.options.method.clone(),
                request: seq.index,
                step: seq.step as usize,
                repeat: 0,
                proposed,
                draft_depth: tree.topology().max_depth(),
                accepted,
                emitted: kept,
                draft_s: draft_s[position],
                target_s,
                verify_s,
                commit_s,
                overhead_s: 0.0,
                prefill_s: if first { seq.prefill_wall_s } else { 0.0 },
                prefill_work_s: Some(if first { seq.prefill_s } else { 0.0 }),
                kv_blocks: kv_blocks_used,
                batch,
                drafter: std::mem::take(&mut drafters[position]),
                decision: Some(choices[position].1.clone()),
                tokens: seq.context[seq.context.len() - kept..].to_vec(),
                ops: ops.clone(),
            });
            seq.step += 1;
            if let Some(reason) = finish {
                finished.push((position, reason));
            }
        }
        Ok(finished)
    }

    /// The part of a proposed `tree` that `seq`'s policy verifies: of a chain of deterministic
    /// drafts, the prefix [`FallbackPolicy::keep_drafts`] keeps (any prefix of such a chain is
    /// verified losslessly; a sampled chain, a tree or a replayed step is verified whole), its
    /// length recorded as the step's budget in `choice` (so that a replay asks the drafter for
    /// just that prefix).
    fn kept_drafts(
        &self,
        seq: &mut Active,
        choice: &mut (DrafterChoice, PolicyDecision),
        tree: DraftTree<f32>,
    ) -> Result<DraftTree<f32>> {
        let offered = tree.draft_count();
        if self.options.replay.is_some()
            || offered == 0
            || tree.kind() != DraftKind::Deterministic
            || !tree.topology().is_chain()
        {
            return Ok(tree);
        }
        let kept = seq.policy.keep_drafts(offered);
        if kept == offered {
            return Ok(tree);
        }
        if kept > offered {
            return Err(HarnessError::InvalidEngine(format!(
                "the policy kept {kept} of {offered} offered drafts (at most all of them)"
            )));
        }
        choice.1 = PolicyDecision::new(choice.0 == DrafterChoice::Fallback, &Budget::chain(kept));
        Ok(tree.chain_prefix(kept)?)
    }

    /// Stages 3 and 4: one target forward over every sequence's tree, and the verdicts. When
    /// every sequence's verifier is the same kernel method ([`PairedVerifier::method`]) and no
    /// penalties apply, the target verifies the batch where its logits are
    /// ([`LanguageModel::forward_verify`]: on a GPU one batched prepare and verify launch, only
    /// the verdicts come back). Otherwise the logits come to the host and each sequence is
    /// verified there: penalties depend on each node's path, and a custom verifier is host
    /// code. Both paths give the same verdicts (decisions keyed by request, step and node).
    fn target_pass(
        &mut self,
        active: &[Active],
        trees: &[DraftTree<f32>],
        choices: &[(DrafterChoice, PolicyDecision)],
        decisions: &mut Replay<SeededSequences>,
    ) -> Result<TargetPass> {
        let steps: Vec<SequenceStep<'_>> = active
            .iter()
            .zip(trees)
            .map(|(seq, tree)| SequenceStep::chain(seq.seq, tree.tokens(), tree.topology()))
            .collect();
        let verifiers: Vec<&PairedVerifier<f32>> = choices
            .iter()
            .map(|(choice, _)| match (choice, &self.fallback) {
                (DrafterChoice::Fallback, Some((_, verifier))) => verifier,
                _ => &self.verifier,
            })
            .collect();
        let first = verifiers.first().and_then(|v| v.method());
        let shared = first.filter(|&method| {
            self.options.penalties.is_off() && verifiers.iter().all(|v| v.method() == Some(method))
        });
        if let Some(method) = shared {
            for (verifier, tree) in verifiers.iter().zip(trees) {
                verifier.check_kind(tree.kind())?;
            }
            let sequences: Vec<VerifySequence<'_>> = active
                .iter()
                .zip(trees)
                .map(|(seq, tree)| VerifySequence {
                    sequence: seq.request.id,
                    step: seq.step,
                    tree,
                })
                .collect();
            let request = VerifyRequest {
                method,
                sequences: &sequences,
                sampling: &self.options.sampling,
                seeds: decisions.source(),
            };
            let verified = self.target.forward_verify(&steps, &request)?;
            let tokens: usize = trees.iter().map(|t| t.len()).sum();
            return Ok(TargetPass {
                verify_s: trees
                    .iter()
                    .map(|t| verified.verify_s * t.len() as f64 / tokens.max(1) as f64)
                    .collect(),
                verdicts: verified.verdicts,
                features: verified.features,
                forward_s: verified.forward_s,
            });
        }
        let t0 = Instant::now();
        let mut logits = self.target.forward(&steps)?;
        let forward_s = t0.elapsed().as_secs_f64();
        let mut pass = TargetPass {
            verdicts: Vec::with_capacity(active.len()),
            features: logits.iter_mut().map(Logits::take_features).collect(),
            forward_s,
            verify_s: Vec::with_capacity(active.len()),
        };
        for (((seq, tree), logits), verifier) in
            active.iter().zip(trees).zip(&logits).zip(verifiers)
        {
            let t0 = Instant::now();
            let history_start = seq.request.prompt.len().min(seq.context.len());
            let mut target_probs = Vec::with_capacity(tree.len());
            for node in 0..tree.len() {
                let mut row = logits.row(node).to_vec();
                if !self.options.penalties.is_off() {
                    let mut history = seq.context[history_start..].to_vec();
                    history.extend(
                        tree.topology().path_to(node)[1..]
                            .iter()
                            .map(|&n| tree.token(n)),
                    );
                    self.options.penalties.apply(&history, &mut row);
                }
                target_probs.push(prepare_logits(&row, &self.options.sampling).map_err(
                    |source| ModelError::TargetRow {
                        request: seq.request.id,
                        node,
                        source,
                    },
                )?);
            }
            let input = VerifyInput {
                sequence: seq.request.id,
                step: seq.step,
                tree,
                target_probs: &target_probs,
            };
            pass.verdicts.push(verifier.verify(&input, decisions)?);
            pass.verify_s.push(t0.elapsed().as_secs_f64());
        }
        Ok(pass)
    }
}

/// One step's target pass and verification ([`Engine::target_pass`]), per sequence in batch
/// order.
struct TargetPass {
    /// The verdicts.
    verdicts: Vec<Verdict>,
    /// The target's tapped features of each sequence's tree nodes (`None`: none tapped).
    features: Vec<Option<Features>>,
    /// Seconds of the batch's shared forward.
    forward_s: f64,
    /// Seconds of each sequence's verification (its share, by tokens, of a batched one).
    verify_s: Vec<f64>,
}

/// Checks that a request (id `id`) of workload `name` may join an engine that keeps `kept`
/// workloads apart, `known` telling whether `name` is one of them: it may unless it would be
/// one more than [`MAX_WORKLOADS`].
///
/// # Errors
/// [`HarnessError::InvalidRequest`] naming the workload and the limit.
pub fn check_workload_room(id: u64, name: &str, known: bool, kept: usize) -> Result<()> {
    if known || kept < MAX_WORKLOADS {
        return Ok(());
    }
    Err(HarnessError::InvalidRequest {
        id,
        reason: format!(
            "workload `{name}` would be one more than the {MAX_WORKLOADS} an engine keeps apart: \
             reuse a name"
        ),
    })
}

/// Checks that `request` can run to its end inside a context of `context` tokens: a non-empty
/// prompt, and room for the prompt and all `max_new_tokens` of its stop rule.
///
/// # Errors
/// [`HarnessError::InvalidRequest`] naming the request, the prompt length, `max_new_tokens` and
/// the context.
pub fn check_fits_context(request: &Request, context: usize) -> Result<()> {
    let prompt = request.prompt.len();
    let refuse = |reason: String| {
        Err(HarnessError::InvalidRequest {
            id: request.id,
            reason,
        })
    };
    if prompt == 0 {
        return refuse("the prompt is empty".into());
    }
    if prompt >= context {
        return refuse(format!(
            "the prompt has {prompt} tokens, but the model's context holds {context} (one more \
             is needed to generate)"
        ));
    }
    let max_tokens = request.stop.max_new_tokens;
    if prompt.saturating_add(max_tokens) > context {
        return refuse(format!(
            "the prompt has {prompt} tokens and max_tokens is {max_tokens}: {} tokens do not fit \
             the model's context of {context} (at most {} new tokens after this prompt)",
            prompt.saturating_add(max_tokens),
            context - prompt
        ));
    }
    Ok(())
}

/// Checks that `request` can run alone: [`check_fits_context`] against a context of `context`
/// tokens, and [`check_fits_pool`] against the target's KV pool `room` when it has one.
///
/// # Errors
/// As those two.
pub fn check_fits(request: &Request, context: usize, room: Option<&KvRoom>) -> Result<()> {
    check_fits_context(request, context)?;
    room.map_or(Ok(()), |room| check_fits_pool(request, room))
}

/// Blocks of a pool of `room` that `request` may need at most: its prompt, `max_new_tokens` and
/// [`KV_TREE_ROOM`].
fn kv_need(request: &Request, room: &KvRoom) -> usize {
    room.blocks_for(
        request
            .prompt
            .len()
            .saturating_add(request.stop.max_new_tokens)
            .saturating_add(KV_TREE_ROOM),
    )
}

/// Checks that `request` fits the target's KV pool `room` alone (its prompt, `max_new_tokens`
/// and [`KV_TREE_ROOM`]); one that fits only beside fewer others waits for room instead.
///
/// # Errors
/// [`HarnessError::InvalidRequest`] naming the tokens needed and the pool's.
pub fn check_fits_pool(request: &Request, room: &KvRoom) -> Result<()> {
    let need = kv_need(request, room);
    if need > room.total_blocks {
        return Err(HarnessError::InvalidRequest {
            id: request.id,
            reason: format!(
                "the prompt has {} tokens and max_tokens is {}: with {KV_TREE_ROOM} slots for \
                 draft trees it needs {} KV tokens, but the KV pool holds {} (raise kv_memory, \
                 or lower max_tokens)",
                request.prompt.len(),
                request.stop.max_new_tokens,
                need * room.block_size,
                room.total_tokens()
            ),
        });
    }
    Ok(())
}

/// Refuses a drafter that reads the target's features when the target taps none.
fn check_features(target: &dyn LanguageModel, drafter: &dyn Drafter<f32>) -> Result<()> {
    if drafter.wants_features() && target.tapped_features().is_empty() {
        return Err(HarnessError::InvalidEngine(format!(
            "drafter {} drafts from the target's features, but the target taps none \
             (LanguageModel::tap_features)",
            drafter.name()
        )));
    }
    Ok(())
}

/// The target's features at tree nodes `nodes` of one forward's features `all` (one row per
/// node), in that order.
fn feature_rows(all: Option<&Features>, nodes: &[usize], request: u64) -> Result<Features> {
    let all = all.ok_or_else(|| {
        HarnessError::InvalidEngine(format!(
            "request {request}: the target forward handed back no features"
        ))
    })?;
    let rows: Vec<f32> = nodes
        .iter()
        .flat_map(|&node| all.row(node).iter().copied())
        .collect();
    Ok(Features::new(all.dim(), rows)?)
}

#[cfg(test)]
mod tests;
