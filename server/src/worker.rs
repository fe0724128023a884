//! The engine thread: it owns the models, takes jobs from a bounded queue and runs them through
//! the speculative engine in batches, streaming text back to each job's channel.
//!
//! Batching: the thread waits for a job, then takes every queued job with the same sampling
//! settings (temperature, top-k, top-p, seed), up to the batch size, and runs them together
//! (continuous batching inside the run: the engine admits and retires them step by step). Jobs
//! arriving meanwhile wait for the next run. A job whose client went away keeps its slot until
//! its run ends (its tokens are dropped); stop strings cut the text sent, not the computation.
//! A job whose prompt and `max_tokens` do not fit the model's context (or the KV pool) is
//! refused alone, naming the numbers, before its batch runs.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};

use specdec_harness::config::MethodConfig;
use specdec_harness::engine::{check_fits_context, check_fits_pool, FinishReason, Request};
use specdec_harness::runner::EngineBackend;
use specdec_harness::HarnessError;
use specdec_kernels::sampling::SamplingParams;
use tokio::sync::mpsc::UnboundedSender;

use crate::api::Input;
use crate::error::ApiError;
use crate::metrics::Metrics;

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
    /// The method.
    pub method: MethodConfig,
    /// Most jobs per run.
    pub batch_size: usize,
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
    let backend = EngineBackend::open(
        &settings.target,
        settings.draft.as_deref(),
        SamplingParams::greedy(),
        settings.seed,
        crate::api::DEFAULT_MAX_TOKENS,
        settings.batch_size,
    )
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
    let mut pending: VecDeque<Job> = VecDeque::new();
    loop {
        let first = match pending.pop_front() {
            Some(job) => job,
            None => match jobs.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        let key = (first.sampling, first.seed);
        let mut batch = vec![first];
        while batch.len() < settings.batch_size {
            let next = match pending.iter().position(|j| (j.sampling, j.seed) == key) {
                Some(i) => pending.remove(i),
                None => match jobs.try_recv() {
                    Ok(job) if (job.sampling, job.seed) == key => Some(job),
                    Ok(job) => {
                        pending.push_back(job);
                        continue;
                    }
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => None,
                },
            };
            match next {
                Some(job) => batch.push(job),
                None => break,
            }
        }
        metrics
            .queue_depth
            .fetch_sub(batch.len(), Ordering::Relaxed);
        metrics.running.fetch_add(batch.len(), Ordering::Relaxed);
        run_batch(&mut backend, &settings, batch, &metrics);
        metrics.running.store(0, Ordering::Relaxed);
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
fn fits(backend: &mut EngineBackend, request: &Request) -> Result<(), String> {
    let target = backend.target_mut();
    let checked = check_fits_context(request, target.max_context()).and_then(|()| {
        target
            .kv_room()
            .map_or(Ok(()), |room| check_fits_pool(request, &room))
    });
    checked.map_err(|e| match e {
        HarnessError::InvalidRequest { reason, .. } => reason,
        other => other.to_string(),
    })
}

fn run_batch(
    backend: &mut EngineBackend,
    settings: &EngineSettings,
    batch: Vec<Job>,
    metrics: &Metrics,
) {
    backend.set_sampling(batch[0].sampling);
    backend.set_seed(batch[0].seed.unwrap_or(settings.seed));
    let mut progress = Vec::new();
    let mut requests = Vec::new();
    for job in batch {
        let prompt = match &job.input {
            Input::Text(text) => backend.encode(text, false),
            Input::Chat(messages) => backend.encode_messages(messages),
        };
        match prompt {
            Ok(prompt) if !prompt.is_empty() => {
                let request = Request {
                    id: progress.len() as u64,
                    prompt,
                    stop: backend.stop_rule(job.max_tokens),
                };
                // refused alone, naming the limit, so that the rest of the batch runs
                if let Err(reason) = fits(backend, &request) {
                    let _ = job.events.send(Event::Failed(ApiError::BadRequest(reason)));
                    continue;
                }
                let _ = job.events.send(Event::Started {
                    prompt_tokens: request.prompt.len(),
                });
                metrics
                    .prompt_tokens
                    .fetch_add(request.prompt.len() as u64, Ordering::Relaxed);
                requests.push(request);
                progress.push(Progress {
                    job,
                    tokens: Vec::new(),
                    sent: 0,
                    stopped_at: None,
                });
            }
            Ok(_) => {
                let _ = job.events.send(Event::Failed(ApiError::BadRequest(
                    "the prompt is empty (no tokens)".into(),
                )));
            }
            Err(e) => {
                let _ = job.events.send(Event::Failed(ApiError::BadRequest(format!(
                    "the prompt: {e}"
                ))));
            }
        }
    }
    if requests.is_empty() {
        return;
    }
    let tokenizer = backend.tokenizer().clone();
    let result = backend.run_requests(
        &settings.method,
        &requests,
        &mut |id, tokens| {
            let Some(p) = progress.get_mut(id as usize) else {
                return;
            };
            p.tokens.extend_from_slice(tokens);
            if let Ok(text) = tokenizer.decode_skip_special(&p.tokens) {
                p.advance(&text, false);
            }
        },
        &mut |_| {},
    );
    match result {
        Ok(generations) => {
            for (p, g) in progress.iter_mut().zip(&generations) {
                if let Ok(text) = tokenizer.decode_skip_special(&p.tokens) {
                    p.advance(&text, true);
                }
                let proposed = g.steps.iter().map(|s| s.proposed).sum();
                let accepted = g.steps.iter().map(|s| s.accepted).sum();
                let speculative = g.steps.iter().filter(|s| s.proposed > 0).count();
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
                    (Some(_), _) | (None, FinishReason::Eos | FinishReason::Stop) => "stop",
                    (None, FinishReason::MaxTokens | FinishReason::ContextFull) => "length",
                };
                let _ = p.job.events.send(Event::Done(Finished {
                    completion_tokens: p.stopped_at.unwrap_or(g.tokens.len()),
                    finish_reason,
                    proposed,
                    accepted,
                    target_passes: g.steps.len(),
                }));
            }
        }
        Err(e) => {
            for p in &progress {
                let _ = p.job.events.send(Event::Failed(ApiError::Internal(format!(
                    "the engine failed: {e}"
                ))));
            }
        }
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
