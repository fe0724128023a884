//! The engine thread: it owns the models, takes jobs from a bounded queue and serves them
//! through the speculative engine, streaming text back to each job's channel.
//!
//! Batching is continuous: a serving run ([`specdec_harness::engine::Engine::serve`]) admits a
//! queued job into the running batch between two steps, as soon as a slot and its KV blocks are
//! free, and retires each job when it ends. A job whose client went away (its event channel
//! closed: a cancelled stream, a dropped connection) is dropped before the next step and its KV
//! blocks freed. Stop strings are the engine's own stop rule, so a stop inside an accepted
//! draft ends the computation there and the KV past it is rewound. Jobs of one run share the
//! sampling settings (temperature, top-k, top-p); a job with other settings ends the
//! admission of the current run (which then drains) and starts the next: arrival order is kept
//! across settings. Seeds do not split runs: a job's `seed` is its engine request's own
//! ([`Request::seed`]), so its text depends on the seed, not on the jobs beside it. A job whose
//! prompt and `max_tokens` do not fit the model's context (or the KV pool) is refused alone,
//! naming the numbers, before it is admitted.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};

use specdec_harness::config::MethodConfig;
use specdec_harness::engine::{
    check_fits, check_workload_room, BatchStatus, FinishReason, Generation, Request, RequestQueue,
    StopRule,
};
use specdec_harness::runner::{EngineBackend, KvMemory, MinAcceptance};
use specdec_harness::HarnessError;
use specdec_kernels::sampling::SamplingParams;
use specdec_models::llama::parse_device;
use specdec_models::tokenizer::Tokenizer;
use specdec_models::KvRoom;
use tokio::sync::mpsc::UnboundedSender;

use crate::api::Input;
use crate::error::ApiError;
use crate::metrics::{Metrics, Outcome};

/// What the engine thread tells a job's handler.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Admitted: the prompt's length in tokens.
    Started {
        /// Prompt tokens.
        prompt_tokens: usize,
    },
    /// More text (never a partial character, never a possible start of a stop string).
    Text(String),
    /// The end, with the counts.
    Done(Finished),
    /// The job failed (bad prompt, engine error).
    Failed(ApiError),
}

/// The counts of a finished job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Finished {
    /// Tokens generated (up to the stop, when a stop string cut the text).
    pub completion_tokens: usize,
    /// `stop` (end of sequence or a stop string) or `length` (max_tokens or the context).
    pub finish_reason: &'static str,
    /// Draft tokens proposed to the target.
    pub proposed: usize,
    /// Draft tokens the target accepted.
    pub accepted: usize,
    /// Target passes.
    pub target_passes: usize,
}

/// One prompt to continue.
#[derive(Debug)]
pub struct Job {
    /// The prompt.
    pub input: Input,
    /// Most new tokens.
    pub max_tokens: usize,
    /// Sampling of the target (and the drafters).
    pub sampling: SamplingParams,
    /// Seed of the run (`None`: the server's).
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// The workload it joins ([`Request::workload`]).
    pub workload: String,
    /// Where the events go.
    pub events: UnboundedSender<Event>,
}

/// The engine thread's state, for `/health`.
pub const LOADING: u8 = 0;
/// The models are loaded: requests are served.
pub const READY: u8 = 1;
/// Loading failed: see the error kept beside.
pub const FAILED: u8 = 2;

/// Shared between the engine thread and the HTTP side.
#[derive(Debug, Default)]
pub struct EngineState {
    /// [`LOADING`], [`READY`] or [`FAILED`].
    pub phase: AtomicU8,
    /// Why loading failed.
    pub error: Mutex<Option<String>>,
}

/// Where the models come from and how to decode.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Target model (registry name or GGUF path).
    pub target: String,
    /// Draft model, if the method uses one.
    pub draft: Option<String>,
    /// The KV budget (`models.kv_memory`; `None`: the machine's default).
    pub kv_memory: Option<String>,
    /// The KV element type (`models.kv_dtype`; `None`: f32).
    pub kv_dtype: Option<String>,
    /// Where the models run (`models.device`).
    pub device: String,
    /// Tensor-parallel CPU ranks of the target (`models.tensor_parallel`).
    pub tensor_parallel: usize,
    /// The method.
    pub method: MethodConfig,
    /// Most jobs per run.
    pub batch_size: usize,
    /// Which requests stop speculating when their acceptance falls low (and probe again later).
    pub min_acceptance: MinAcceptance,
    /// Seed when a request gives none.
    pub seed: u64,
}

/// The engine thread's body: loads the models (publishing the outcome in `state`), then serves
/// `jobs` until every sender is gone.
pub fn run(
    settings: EngineSettings,
    jobs: Receiver<Job>,
    state: Arc<EngineState>,
    metrics: Arc<Metrics>,
) {
    let backend = KvMemory::configured(
        settings.kv_memory.as_deref(),
        settings.kv_dtype.as_deref(),
        &settings.device,
    )
    .and_then(|kv_memory| {
        EngineBackend::open_with(
            kv_memory,
            &settings.target,
            settings.draft.as_deref(),
            SamplingParams::greedy(),
            settings.seed,
            crate::api::DEFAULT_MAX_TOKENS,
            settings.batch_size,
        )
    })
    .and_then(|backend| backend.place(parse_device(&settings.device)?, settings.tensor_parallel))
    .and_then(|mut backend| backend.build(&settings.method).map(|_| backend));
    let mut backend = match backend {
        Ok(b) => b,
        Err(e) => {
            *state.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
            state.phase.store(FAILED, Ordering::SeqCst);
            return;
        }
    };
    state.phase.store(READY, Ordering::SeqCst);
    let limits = Limits {
        context: backend.target_mut().max_context(),
        pool: backend.target_mut().kv_room(),
        stop: backend.stop_rule(0),
        tokenizer: backend.tokenizer().clone(),
    };
    if let Some(pool) = limits.pool {
        metrics
            .kv_blocks_free
            .store(pool.free_blocks, Ordering::Relaxed);
    }
    let mut pending: Option<Job> = None;
    loop {
        let first = match pending.take() {
            Some(job) => job,
            None => match jobs.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        let settings_key = first.settings_key();
        backend.set_sampling(first.sampling);
        backend.set_seed(settings.seed);
        let mut queue = JobQueue {
            jobs: &jobs,
            pending: Some(first),
            settings_key,
            running: HashMap::new(),
            workloads: HashSet::new(),
            next_id: 0,
            limits: &limits,
            metrics: &metrics,
        };
        let served = backend.serve_queue(&settings.method, settings.min_acceptance, &mut queue);
        if let Err(e) = served {
            for (_, p) in queue.running.drain() {
                let _ = p.job.events.send(Event::Failed(ApiError::Internal(format!(
                    "the engine failed: {e}"
                ))));
            }
        }
        pending = queue.pending.take();
        metrics.running.store(0, Ordering::Relaxed);
    }
}

/// What every job of the server is checked and encoded against: fixed once the models load.
struct Limits {
    /// The target's context, tokens.
    context: usize,
    /// The target's KV pool (its size; `None`: unbounded).
    pool: Option<KvRoom>,
    /// The model's end-of-sequence rule (`max_new_tokens` set per job).
    stop: StopRule,
    tokenizer: Arc<Tokenizer>,
}

impl Job {
    /// The settings a run's jobs share.
    fn settings_key(&self) -> SamplingParams {
        self.sampling
    }
}

/// The queue one serving run reads: the server's jobs with one run's sampling settings.
struct JobQueue<'q> {
    jobs: &'q Receiver<Job>,
    /// A job taken from the channel but not admitted: the first of the next run when its
    /// settings differ from this one's.
    pending: Option<Job>,
    settings_key: SamplingParams,
    /// Jobs admitted and not yet finished, by request id.
    running: HashMap<u64, Progress>,
    /// The workloads of the jobs admitted so far (the engine keeps
    /// [`specdec_harness::engine::MAX_WORKLOADS`] apart).
    workloads: HashSet<String>,
    next_id: u64,
    limits: &'q Limits,
    metrics: &'q Metrics,
}

impl JobQueue<'_> {
    /// The engine request of `job`, or `None` (the job told why) when it cannot run.
    fn admit(&mut self, job: Job) -> Option<Request> {
        let tokenizer = &self.limits.tokenizer;
        let prompt = match &job.input {
            Input::Text(text) => tokenizer.encode_prompt(text),
            Input::Chat(messages) => tokenizer
                .apply_chat_template(messages, true)
                .and_then(|rendered| tokenizer.encode(&rendered)),
        };
        let refusal = match prompt {
            Ok(prompt) if !prompt.is_empty() => {
                let decoder = Arc::clone(tokenizer);
                let request = Request {
                    id: self.next_id,
                    seed: job.seed,
                    workload: Some(job.workload.clone()),
                    prompt,
                    stop: StopRule {
                        max_new_tokens: job.max_tokens,
                        stop_strings: job.stop.clone(),
                        detokenizer: (!job.stop.is_empty()).then(|| {
                            Arc::new(move |tokens: &[u32]| {
                                decoder.decode_skip_special(tokens).unwrap_or_default()
                            }) as specdec_harness::engine::Detokenizer
                        }),
                        ..self.limits.stop.clone()
                    },
                };
                // refused alone, naming the limit, so that the rest of the batch runs
                match fits(self.limits, &request).and_then(|()| self.workload_fits(&job.workload)) {
                    Ok(()) => {
                        self.workloads.insert(job.workload.clone());
                        let _ = job.events.send(Event::Started {
                            prompt_tokens: request.prompt.len(),
                        });
                        self.metrics
                            .prompt_tokens
                            .fetch_add(request.prompt.len() as u64, Ordering::Relaxed);
                        self.next_id += 1;
                        self.running.insert(
                            request.id,
                            Progress {
                                job,
                                tokens: Vec::new(),
                                sent: 0,
                                stopped_at: None,
                            },
                        );
                        return Some(request);
                    }
                    Err(reason) => reason,
                }
            }
            Ok(_) => "the prompt is empty (no tokens)".to_string(),
            Err(e) => format!("the prompt: {e}"),
        };
        let _ = job
            .events
            .send(Event::Failed(ApiError::BadRequest(refusal)));
        None
    }

    /// Whether a job of `workload` may join this run ([`check_workload_room`] over the
    /// workloads admitted so far, which the run's engine keeps apart): `Err` with the reason.
    fn workload_fits(&self, workload: &str) -> Result<(), String> {
        let known = self.workloads.contains(workload);
        check_workload_room(self.next_id, workload, known, self.workloads.len())
            .map_err(refusal_reason)
    }
}

impl RequestQueue for JobQueue<'_> {
    fn next(&mut self, wait: bool) -> Option<Request> {
        loop {
            let job = match self.pending.take() {
                Some(job) => job,
                None if wait => self.jobs.recv().ok()?,
                None => match self.jobs.try_recv() {
                    Ok(job) => job,
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => return None,
                },
            };
            if job.settings_key() != self.settings_key {
                // other settings: this run admits no more (it drains), the next one starts here
                self.pending = Some(job);
                return None;
            }
            self.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
            if job.events.is_closed() {
                self.metrics.request(Outcome::Cancelled);
                continue;
            }
            if let Some(request) = self.admit(job) {
                return Some(request);
            }
        }
    }

    fn cancelled(&mut self, id: u64) -> bool {
        self.running
            .get(&id)
            .is_some_and(|p| p.job.events.is_closed())
    }

    fn tokens(&mut self, id: u64, tokens: &[u32]) {
        let Some(p) = self.running.get_mut(&id) else {
            return;
        };
        p.tokens.extend_from_slice(tokens);
        if let Ok(text) = self.limits.tokenizer.decode_skip_special(&p.tokens) {
            p.advance(&text, false);
        }
    }

    fn finished(&mut self, _index: usize, g: Generation) {
        let Some(mut p) = self.running.remove(&g.id) else {
            return;
        };
        let proposed = g.steps.iter().map(|s| s.proposed).sum();
        let accepted = g.steps.iter().map(|s| s.accepted).sum();
        let speculative = g.steps.iter().filter(|s| s.proposed > 0).count();
        let metrics = self.metrics;
        metrics
            .drafts_proposed
            .fetch_add(proposed as u64, Ordering::Relaxed);
        metrics
            .drafts_accepted
            .fetch_add(accepted as u64, Ordering::Relaxed);
        metrics
            .steps_speculative
            .fetch_add(speculative as u64, Ordering::Relaxed);
        metrics
            .steps_plain
            .fetch_add((g.steps.len() - speculative) as u64, Ordering::Relaxed);
        let finish_reason = match (p.stopped_at, &g.finish) {
            (_, FinishReason::Cancelled) => {
                metrics.request(Outcome::Cancelled);
                return;
            }
            (Some(_), _) | (None, FinishReason::Eos | FinishReason::Stop) => "stop",
            (None, FinishReason::MaxTokens | FinishReason::ContextFull) => "length",
        };
        if let Ok(text) = self.limits.tokenizer.decode_skip_special(&p.tokens) {
            p.advance(&text, true);
        }
        let _ = p.job.events.send(Event::Done(Finished {
            completion_tokens: p.stopped_at.unwrap_or(g.tokens.len()),
            finish_reason,
            proposed,
            accepted,
            target_passes: g.steps.len(),
        }));
    }

    fn refused(&mut self, request: Request, error: HarnessError) {
        if let Some(p) = self.running.remove(&request.id) {
            let reason = refusal_reason(error);
            let _ = p
                .job
                .events
                .send(Event::Failed(ApiError::BadRequest(reason)));
        }
    }

    fn stepped(&mut self, status: &BatchStatus) {
        let metrics = self.metrics;
        if status.cancelled == 0 {
            metrics.engine_steps.fetch_add(1, Ordering::Relaxed);
        }
        metrics
            .running
            .store(status.decoding + status.prefilling, Ordering::Relaxed);
        if let Some(kv) = status.kv {
            metrics
                .kv_blocks_used
                .store(kv.total_blocks - kv.free_blocks, Ordering::Relaxed);
            metrics
                .kv_blocks_free
                .store(kv.free_blocks, Ordering::Relaxed);
        }
    }
}

/// A job's text as it is produced.
struct Progress {
    job: Job,
    tokens: Vec<u32>,
    /// Bytes of text sent.
    sent: usize,
    /// Tokens generated when a stop string cut the text (then nothing more is sent).
    stopped_at: Option<usize>,
}

impl Progress {
    /// Sends what of `text` is final: up to a stop string (then stops), else all but a tail
    /// that may still become one.
    fn advance(&mut self, text: &str, last: bool) {
        if self.stopped_at.is_some() {
            return;
        }
        let stable = text.trim_end_matches('\u{FFFD}');
        let cut = self
            .job
            .stop
            .iter()
            .filter_map(|s| stable.find(s.as_str()))
            .min();
        let end = match cut {
            Some(at) => {
                self.stopped_at = Some(self.tokens.len());
                at
            }
            None if last => stable.len(),
            None => stable.len() - held_back(stable, &self.job.stop),
        };
        if end > self.sent && stable.is_char_boundary(end) && stable.is_char_boundary(self.sent) {
            let _ = self
                .job
                .events
                .send(Event::Text(stable[self.sent..end].to_string()));
            self.sent = end;
        }
    }
}

/// Bytes at the end of `text` that begin some stop string (so may still become one).
fn held_back(text: &str, stops: &[String]) -> usize {
    stops
        .iter()
        .flat_map(|s| {
            (1..s.len())
                .filter(|&n| s.is_char_boundary(n))
                .map(move |n| &s[..n])
        })
        .filter(|prefix| text.ends_with(prefix))
        .map(str::len)
        .max()
        .unwrap_or(0)
}

/// Whether `request` fits the target's context and its KV pool alone: `Err` with the reason
/// (prompt tokens, `max_tokens` and the limit) when it does not.
fn fits(limits: &Limits, request: &Request) -> Result<(), String> {
    check_fits(request, limits.context, limits.pool.as_ref()).map_err(refusal_reason)
}

/// What a client is told of a refusal: an invalid request's reason, or the error itself.
fn refusal_reason(error: HarnessError) -> String {
    match error {
        HarnessError::InvalidRequest { reason, .. } => reason,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_possible_stop_string_is_held_back_until_it_resolves() {
        let stops = vec!["END".to_string(), "\n\n".to_string()];
        assert_eq!(held_back("abc E", &stops), 1);
        assert_eq!(held_back("abc EN", &stops), 2);
        assert_eq!(held_back("abc\n", &stops), 1);
        assert_eq!(held_back("abc", &stops), 0);
        assert_eq!(held_back("abc", &[]), 0);
    }

    #[test]
    fn text_is_cut_at_the_first_stop_string_and_nothing_follows() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut p = Progress {
            job: Job {
                input: Input::Text(String::new()),
                max_tokens: 10,
                sampling: SamplingParams::greedy(),
                seed: None,
                stop: vec!["STOP".into()],
                workload: "completion".into(),
                events: tx,
            },
            tokens: vec![1, 2],
            sent: 0,
            stopped_at: None,
        };
        p.advance("hello ST", false);
        p.tokens.push(3);
        p.advance("hello STOP and more", false);
        p.advance("hello STOP and more text", true);
        let mut got = String::new();
        while let Ok(Event::Text(t)) = rx.try_recv() {
            got.push_str(&t);
        }
        assert_eq!(got, "hello ");
        assert_eq!(p.stopped_at, Some(3));
    }
}
