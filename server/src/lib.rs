//! `specdec serve`: an OpenAI-compatible HTTP server over the speculative engine.
//!
//! - [`api`]: the request bodies, checked field by field (a value specdec cannot honour is a 400
//!   naming the field);
//! - [`worker`]: the engine thread, which owns the models and runs queued requests in batches;
//! - [`http`]: the routes (`POST /v1/completions`, `POST /v1/chat/completions`, `GET
//!   /v1/models`, `/health`, `/metrics`) and the response bodies, streamed as server-sent events
//!   or not;
//! - [`metrics`]: the Prometheus counters;
//! - [`bench`]: `specdec bench serve`, a load generator against two servers it starts (plain
//!   and speculative), open-loop and closed-loop.
//!
//! The async stack (tokio, axum) lives in this crate only. Requests wait in a bounded queue (a
//! full queue is a 503 with `Retry-After`); `/health` answers 200 once the models are loaded;
//! SIGINT / SIGTERM stop admitting, let running requests finish, and exit. Replicas scale out
//! behind any HTTP load balancer, which can route on `/health` and scrape `/metrics`.

pub mod api;
pub mod bench;
pub mod config;
pub mod error;
pub mod http;
pub mod metrics;
pub mod worker;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc::sync_channel;
use std::sync::Arc;

use specdec_harness::generate::method_for;
use specdec_harness::runner::{KvMemory, MinAcceptance};
use specdec_models::llama::parse_device;

pub use config::ServeConfig;
pub use error::{ApiError, Result, ServerError};

/// How `specdec serve` runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Target model: a registry name or a GGUF path.
    pub target: String,
    /// Draft model for the methods that use one.
    pub draft: Option<String>,
    /// A `specdec generate` method name (`plain`, `ngram`, `chain`, `auto`, …).
    pub method: String,
    /// Drafts per step of the fixed-budget methods.
    pub k: usize,
    /// A method of a config file ([`ServeConfig::method`]), served instead of `method` / `k`.
    pub method_config: Option<specdec_harness::config::MethodConfig>,
    /// The KV budget of the target's and a drafter's pools, e.g. `"4GiB"` (`models.kv_memory`;
    /// `None`: a quarter of the machine's memory).
    pub kv_memory: Option<String>,
    /// The KV element type, `"f32"`, `"bf16"` or `"f16"` (`models.kv_dtype`; `None`: f32).
    pub kv_dtype: Option<String>,
    /// `cpu`, `cuda` or `cuda:N` (`models.device`).
    pub device: String,
    /// Tensor-parallel ranks of the target (`models.tensor_parallel`; 1: one runner): CPU
    /// ranks, or one per GPU on a GPU device.
    pub tensor_parallel: usize,
    /// Address to listen on.
    pub host: String,
    /// Port (0: any free one).
    pub port: u16,
    /// Required bearer key of the `/v1` routes.
    pub api_key: Option<String>,
    /// Requests that may wait for the engine (beyond them: 503).
    pub queue: usize,
    /// Requests in the running batch at most.
    pub batch_size: usize,
    /// Acceptance below which a request stops speculating and probes again later (the
    /// algorithms crate's `DisableGate` around its policy), in [0, 1]; 0: never; `None`: the
    /// default ([`MinAcceptance::Default`]: 0.3, none for a lookup drafter whose offers the
    /// cost-model policy prices).
    pub min_acceptance: Option<f64>,
    /// Seed of requests that give none.
    pub seed: u64,
}

impl ServeOptions {
    /// The options of a config file: its models, and its method `method` (or its only one).
    ///
    /// # Errors
    /// As [`ServeConfig::method`].
    pub fn from_config(config: &ServeConfig, method: Option<&str>) -> Result<Self> {
        let chosen = config.method(method)?;
        let models = &config.models;
        Ok(Self {
            draft: models.draft.clone(),
            method: chosen.name.clone(),
            method_config: Some(chosen),
            kv_memory: models.kv_memory.clone(),
            kv_dtype: models.kv_dtype.clone(),
            device: models.device.clone(),
            tensor_parallel: models.tensor_parallel.unwrap_or(1),
            ..Self::new(&models.target)
        })
    }

    /// The defaults for `target`: plain decoding, 127.0.0.1:8000, a queue of 64, batches of 8.
    pub fn new(target: &str) -> Self {
        Self {
            target: target.to_string(),
            draft: None,
            method: "plain".into(),
            k: 4,
            method_config: None,
            kv_memory: None,
            kv_dtype: None,
            device: "cpu".into(),
            tensor_parallel: 1,
            host: "127.0.0.1".into(),
            port: 8000,
            api_key: None,
            queue: 64,
            batch_size: 8,
            min_acceptance: None,
            seed: 0,
        }
    }
}

/// The model id the server answers to: the registry name, or a file's stem.
pub fn model_id(target: &str) -> String {
    let path = Path::new(target);
    match path.extension() {
        Some(ext) if ext == "gguf" => path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| target.to_string()),
        _ => target.to_string(),
    }
}

/// A server running on its own threads.
pub struct RunningServer {
    /// Where it listens.
    pub addr: SocketAddr,
    engine: Arc<worker::EngineState>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl RunningServer {
    /// Whether the models are loaded (`/health` answers 200).
    pub fn is_ready(&self) -> bool {
        self.engine.phase.load(Ordering::SeqCst) == worker::READY
    }

    /// Why the models failed to load, once they have.
    pub fn load_error(&self) -> Option<String> {
        match self.engine.phase.load(Ordering::SeqCst) {
            worker::FAILED => Some(
                self.engine
                    .error
                    .lock()
                    .map(|e| e.clone().unwrap_or_default())
                    .unwrap_or_default(),
            ),
            _ => None,
        }
    }

    /// Stops admitting, lets running requests finish, and waits for the threads.
    ///
    /// # Errors
    /// What the server thread failed with.
    pub fn stop(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| ServerError::Engine("the server thread panicked".into()))?,
            None => Ok(()),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Binds the address, starts the engine thread (which loads the models: `/health` is 503 until
/// then) and the HTTP server, and returns at once.
///
/// # Errors
/// Options out of range, an unknown method, an address that cannot be bound.
pub fn start(options: &ServeOptions) -> Result<RunningServer> {
    if options.queue == 0 || options.batch_size == 0 || options.batch_size > 256 {
        return Err(ServerError::InvalidOption(format!(
            "queue ({}) must be ≥ 1 and batch size ({}) in 1..=256",
            options.queue, options.batch_size
        )));
    }
    if let Some(threshold) = options.min_acceptance.filter(|t| !(0.0..=1.0).contains(t)) {
        return Err(ServerError::InvalidOption(format!(
            "min acceptance {threshold} is not in [0, 1]"
        )));
    }
    let method = match &options.method_config {
        Some(method) => method.clone(),
        None => method_for(&options.method, options.k, options.draft.as_deref())?,
    };
    // the KV budget and the device are checked before anything loads
    KvMemory::configured(
        options.kv_memory.as_deref(),
        options.kv_dtype.as_deref(),
        &options.device,
    )?;
    parse_device(&options.device).map_err(specdec_harness::HarnessError::from)?;
    specdec_harness::runner::check_tensor_parallel(options.tensor_parallel)?;
    let listener =
        std::net::TcpListener::bind((options.host.as_str(), options.port)).map_err(|source| {
            ServerError::Io {
                what: format!("listening on {}:{}", options.host, options.port),
                source,
            }
        })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| ServerError::Io {
            what: "listener".into(),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServerError::Io {
        what: "listener address".into(),
        source,
    })?;
    let (jobs, queue) = sync_channel(options.queue);
    let engine = Arc::new(worker::EngineState::default());
    let metrics = Arc::new(metrics::Metrics::default());
    let settings = worker::EngineSettings {
        target: options.target.clone(),
        draft: options.draft.clone(),
        kv_memory: options.kv_memory.clone(),
        kv_dtype: options.kv_dtype.clone(),
        device: options.device.clone(),
        tensor_parallel: options.tensor_parallel,
        method: method.clone(),
        batch_size: options.batch_size,
        min_acceptance: match options.min_acceptance {
            Some(threshold) => MinAcceptance::Every(threshold),
            None => MinAcceptance::Default,
        },
        seed: options.seed,
    };
    let (engine_state, engine_metrics) = (engine.clone(), metrics.clone());
    let engine_thread = std::thread::Builder::new()
        .name("specdec-engine".into())
        .spawn(move || worker::run(settings, queue, engine_state, engine_metrics))
        .map_err(|source| ServerError::Io {
            what: "starting the engine thread".into(),
            source,
        })?;
    let state = http::AppState {
        model_id: model_id(&options.target),
        method: method.name.clone(),
        jobs,
        engine: engine.clone(),
        metrics,
        api_key: options.api_key.clone(),
    };
    let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("specdec-http".into())
        .spawn(move || -> Result<()> {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|source| ServerError::Io {
                    what: "the async runtime".into(),
                    source,
                })?;
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).map_err(|source| {
                    ServerError::Io {
                        what: "listener".into(),
                        source,
                    }
                })?;
                axum::serve(listener, http::router(state))
                    .with_graceful_shutdown(async move {
                        let _ = stopped.await;
                    })
                    .await
                    .map_err(|source| ServerError::Io {
                        what: "serving".into(),
                        source,
                    })
            })?;
            // every queue sender is gone with the router: the engine ends after its batch
            engine_thread
                .join()
                .map_err(|_| ServerError::Engine("the engine thread panicked".into()))
        })
        .map_err(|source| ServerError::Io {
            what: "starting the server thread".into(),
            source,
        })?;
    Ok(RunningServer {
        addr,
        engine,
        shutdown: Some(shutdown),
        thread: Some(thread),
    })
}

/// Runs the server until SIGINT or SIGTERM (then drains and returns), or until the models fail
/// to load (then returns that error). Prints the address once listening, and a line when ready.
///
/// # Errors
/// As [`start`]; the models' loading error.
pub fn serve(options: &ServeOptions) -> Result<()> {
    let server = start(options)?;
    eprintln!(
        "specdec serve: listening on http://{} (model `{}`, method `{}`); loading the models…",
        server.addr,
        model_id(&options.target),
        options.method
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| ServerError::Io {
            what: "the signal runtime".into(),
            source,
        })?;
    let load_error = runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|source| ServerError::Io {
                what: "SIGTERM handler".into(),
                source,
            })?;
        let mut announced = false;
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return Ok::<_, ServerError>(None),
                _ = term.recv() => return Ok(None),
                _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {
                    if let Some(error) = server.load_error() {
                        return Ok(Some(error));
                    }
                    if server.is_ready() && !announced {
                        eprintln!("specdec serve: ready (http://{}/health)", server.addr);
                        announced = true;
                    }
                }
            }
        }
    })?;
    if load_error.is_none() {
        eprintln!("specdec serve: stopping (running requests finish first)");
    }
    server.stop()?;
    match load_error {
        Some(e) => Err(ServerError::Engine(format!(
            "the models failed to load: {e}"
        ))),
        None => Ok(()),
    }
}
