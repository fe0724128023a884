//! The HTTP side: the OpenAI routes, `/health`, `/metrics`, and the response bodies (one JSON
//! object, or server-sent events ending in `data: [DONE]`).

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::api::{Endpoint, Generate};
use crate::error::ApiError;
use crate::metrics::{Metrics, Outcome};
use crate::worker::{EngineState, Event, Finished, Job, FAILED, READY};

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The model id served (the registry name or the file stem).
    pub model_id: String,
    /// The method's name (labels the speculation metrics).
    pub method: String,
    /// The bounded queue to the engine thread.
    pub jobs: SyncSender<Job>,
    /// Loading / ready / failed.
    pub engine: Arc<EngineState>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Required `Authorization: Bearer` key of the `/v1` routes, if any.
    pub api_key: Option<String>,
}

/// The routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn health(State(state): State<AppState>) -> Response {
    match state.engine.phase.load(Ordering::SeqCst) {
        READY => (StatusCode::OK, "ok\n").into_response(),
        FAILED => {
            let error = state
                .engine
                .error
                .lock()
                .map(|e| e.clone())
                .unwrap_or_default();
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the models failed to load: {}\n", error.unwrap_or_default()),
            )
                .into_response()
        }
        _ => ApiError::Unavailable("the models are loading".into()).into_response(),
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(&state.method),
    )
        .into_response()
}

async fn models(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&state, &headers) {
        return e.into_response();
    }
    Json(json!({
        "object": "list",
        "data": [{"id": state.model_id, "object": "model", "created": 0, "owned_by": "specdec"}],
    }))
    .into_response()
}

async fn completions(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    respond(state, Endpoint::Completions, &headers, &body).await
}

async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    respond(state, Endpoint::Chat, &headers, &body).await
}

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.api_key else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(k) if k == key => Ok(()),
        Some(_) => Err(ApiError::Unauthorized("wrong API key".into())),
        None => Err(ApiError::Unauthorized(
            "an API key is required (Authorization: Bearer KEY)".into(),
        )),
    }
}

/// Checks, queues and answers one request; every refusal is counted.
async fn respond(
    state: AppState,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let arrived = Instant::now();
    let refuse = |e: ApiError, state: &AppState| {
        state.metrics.request(match e {
            ApiError::Unavailable(_) => Outcome::Unavailable,
            ApiError::Internal(_) => Outcome::Failed,
            _ => Outcome::Refused,
        });
        e.into_response()
    };
    if let Err(e) = authorize(&state, headers) {
        return refuse(e, &state);
    }
    if state.engine.phase.load(Ordering::SeqCst) != READY {
        return refuse(
            ApiError::Unavailable("the models are not loaded".into()),
            &state,
        );
    }
    let request = match Generate::parse(body, endpoint, &state.model_id) {
        Ok(r) => r,
        Err(e) => return refuse(e, &state),
    };
    if request.stream && request.inputs.len() > 1 {
        return refuse(
            ApiError::BadRequest("`stream` with several prompts is not supported".into()),
            &state,
        );
    }
    let mut receivers = Vec::new();
    for input in &request.inputs {
        let (events, rx) = unbounded_channel();
        let job = Job {
            input: input.clone(),
            max_tokens: request.max_tokens,
            sampling: request.sampling,
            seed: request.seed,
            stop: request.stop.clone(),
            workload: request
                .workload
                .clone()
                .unwrap_or_else(|| input.default_workload().to_owned()),
            events,
        };
        state.metrics.queue_depth.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = state.jobs.try_send(job) {
            state.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
            let why = match e {
                TrySendError::Full(_) => "the queue is full: retry later",
                TrySendError::Disconnected(_) => "the engine has stopped",
            };
            return refuse(ApiError::Unavailable(why.into()), &state);
        }
        receivers.push(rx);
    }
    let meta = Meta::new(endpoint, &state.model_id);
    if request.stream {
        let rx = receivers.pop().expect("one input when streaming");
        return Sse::new(event_stream(
            rx,
            meta,
            request.include_usage,
            state,
            arrived,
        ))
        .into_response();
    }
    let mut choices = Vec::new();
    let mut usage = Usage::default();
    for (index, mut rx) in receivers.into_iter().enumerate() {
        let mut text = String::new();
        let mut first_token: Option<Instant> = None;
        let finished = loop {
            match rx.recv().await {
                Some(Event::Started { prompt_tokens }) => usage.prompt_tokens += prompt_tokens,
                Some(Event::Text(t)) => {
                    first_token.get_or_insert_with(Instant::now);
                    text.push_str(&t);
                }
                Some(Event::Done(f)) => break f,
                Some(Event::Failed(e)) => return refuse(e, &state),
                None => return refuse(ApiError::Internal("the engine stopped".into()), &state),
            }
        };
        record_latency(&state.metrics, arrived, first_token, &finished);
        usage.add(&finished);
        choices.push(meta.choice(index, &text, Some(finished.finish_reason), false));
    }
    state.metrics.request(Outcome::Ok);
    Json(meta.body(choices, Some(&usage), false)).into_response()
}

fn record_latency(metrics: &Metrics, arrived: Instant, first: Option<Instant>, f: &Finished) {
    let end = Instant::now();
    metrics.end_to_end.observe((end - arrived).as_secs_f64());
    if let Some(first) = first {
        metrics
            .time_to_first_token
            .observe((first - arrived).as_secs_f64());
        if f.completion_tokens > 1 {
            metrics
                .time_per_output_token
                .observe((end - first).as_secs_f64() / (f.completion_tokens - 1) as f64);
        }
    }
    metrics
        .completion_tokens
        .fetch_add(f.completion_tokens as u64, Ordering::Relaxed);
}

/// The server-sent events of one streamed request: a chunk per text delta, a last chunk with
/// the finish reason, the usage chunk when asked, then `[DONE]`. A client that goes away drops
/// the stream (and with it the receiver): the engine's sends then fail quietly.
fn event_stream(
    rx: UnboundedReceiver<Event>,
    meta: Meta,
    include_usage: bool,
    state: AppState,
    arrived: Instant,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    struct Run {
        rx: UnboundedReceiver<Event>,
        meta: Meta,
        usage: Usage,
        first: Option<Instant>,
        done: bool,
    }
    let run = Run {
        rx,
        meta,
        usage: Usage::default(),
        first: None,
        done: false,
    };
    stream::unfold(run, move |mut run| {
        let state = state.clone();
        async move {
            if run.done {
                return None;
            }
            let events: Vec<SseEvent> = match run.rx.recv().await {
                Some(Event::Started { prompt_tokens }) => {
                    run.usage.prompt_tokens += prompt_tokens;
                    let mut role = run.meta.choice(0, "", None, true);
                    if run.meta.endpoint == Endpoint::Chat {
                        role["delta"] = json!({"role": "assistant", "content": ""});
                    }
                    vec![data(&run.meta.body(vec![role], None, true))]
                }
                Some(Event::Text(t)) => {
                    run.first.get_or_insert_with(Instant::now);
                    vec![data(&run.meta.body(
                        vec![run.meta.choice(0, &t, None, true)],
                        None,
                        true,
                    ))]
                }
                Some(Event::Done(f)) => {
                    run.done = true;
                    record_latency(&state.metrics, arrived, run.first, &f);
                    run.usage.add(&f);
                    state.metrics.request(Outcome::Ok);
                    let mut out = vec![data(&run.meta.body(
                        vec![run.meta.choice(0, "", Some(f.finish_reason), true)],
                        None,
                        true,
                    ))];
                    if include_usage {
                        out.push(data(&run.meta.body(Vec::new(), Some(&run.usage), true)));
                    }
                    out.push(SseEvent::default().data("[DONE]"));
                    out
                }
                Some(Event::Failed(e)) => {
                    run.done = true;
                    state.metrics.request(Outcome::Failed);
                    vec![data(&e.body()), SseEvent::default().data("[DONE]")]
                }
                None => {
                    run.done = true;
                    state.metrics.request(Outcome::Failed);
                    vec![data(
                        &ApiError::Internal("the engine stopped".into()).body(),
                    )]
                }
            };
            Some((stream::iter(events.into_iter().map(Ok)), run))
        }
    })
    .flatten()
}

fn data(value: &Value) -> SseEvent {
    SseEvent::default().data(value.to_string())
}

/// Token counts of a response (`usage`).
#[derive(Debug, Default)]
struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    proposed: usize,
    accepted: usize,
    target_passes: usize,
}

impl Usage {
    fn add(&mut self, f: &Finished) {
        self.completion_tokens += f.completion_tokens;
        self.proposed += f.proposed;
        self.accepted += f.accepted;
        self.target_passes += f.target_passes;
    }

    fn json(&self) -> Value {
        let tau = match self.target_passes {
            0 => 0.0,
            passes => (self.accepted + passes) as f64 / passes as f64,
        };
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens_details": {
                "accepted_prediction_tokens": self.accepted,
                "rejected_prediction_tokens": self.proposed - self.accepted,
            },
            "speculative": {
                "drafts_proposed": self.proposed,
                "drafts_accepted": self.accepted,
                "target_passes": self.target_passes,
                "tau": tau,
            },
        })
    }
}

/// What every body of one response repeats.
#[derive(Debug, Clone)]
struct Meta {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
}

impl Meta {
    fn new(endpoint: Endpoint, model: &str) -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let prefix = match endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        };
        Self {
            endpoint,
            id: format!("{prefix}-{:x}", now.as_nanos()),
            created: now.as_secs(),
            model: model.to_string(),
        }
    }

    fn choice(&self, index: usize, text: &str, finish: Option<&str>, chunk: bool) -> Value {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => {
                json!({"index": index, "text": text, "logprobs": null, "finish_reason": finish})
            }
            (Endpoint::Chat, false) => json!({
                "index": index,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish,
            }),
            (Endpoint::Chat, true) => {
                let delta = if text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
        }
    }

    fn body(&self, choices: Vec<Value>, usage: Option<&Usage>, chunk: bool) -> Value {
        let object = match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        };
        let mut body = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(usage) = usage {
            body["usage"] = usage.json();
        } else if chunk {
            body["usage"] = Value::Null;
        }
        body
    }
}
