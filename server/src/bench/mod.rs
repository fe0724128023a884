//! `specdec bench serve`: a load generator against two servers it starts on 127.0.0.1, one
//! decoding plainly and one speculating with the chosen method.
//!
//! It measures plain decoding's capacity (closed loop at the batch size: completed requests
//! per second), then offers open-loop Poisson arrivals at multiples of that capacity and a
//! closed-loop saturation test (N concurrent clients), each load to both servers in turn, and
//! writes the results folder ([`report`]). An open-loop point is sent in blocks of `--block`
//! requests, each block to both servers in turn; a closed-loop point is one block. The order
//! alternates from block to block (plain first in the even ones, speculative first in the odd
//! ones, counting on through the repeats), so a drift of the host's speed within a point falls
//! on both modes alike.
//!
//! - [`client`]: the HTTP/1.1 client that streams one completion and times its chunks;
//! - [`load`]: Poisson arrivals and closed-loop clients;
//! - [`report`]: the records, the summary and the files.
//!
//! Each server's queue holds every request a phase can have waiting, so a request is measured,
//! not turned away; one that fails anyway (a 503, a timeout, an error event) is counted as
//! failed and left out of the latencies and throughput.

pub mod client;
pub mod load;
pub mod report;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use specdec_harness::config::{
    ExperimentConfig, MethodConfig, ModelsConfig, Prompt, PromptSet, SamplingConfig,
    MAX_BATCH_SIZE, MAX_TOKENS_LIMIT,
};
use specdec_harness::generate::method_for;
use specdec_harness::methods::kinds::Plain;
use specdec_harness::methods::validate_method;
use specdec_harness::report::{write_provenance, Provenance};
use specdec_harness::runner::DEFAULT_MIN_ACCEPTANCE;

use crate::error::{Result, ServerError};
use crate::{model_id, start, RunningServer, ServeOptions};
use client::Streamed;
use load::{closed_loop, open_loop, poisson_arrivals, Request};
use report::{Load, Mode, PhaseRecord, RequestRecord, RunInfo, SummaryRow};

/// The most requests per load point (`--requests`).
pub const MAX_REQUESTS: usize = 10_000;

/// The most repeats (`--repeats`).
pub const MAX_REPEATS: usize = 100;

/// Requests per block of an open-loop point (`--block`), by default.
pub const DEFAULT_BLOCK: usize = 10;

/// The largest rate multiplier (`--rates`).
pub const MAX_RATE_MULTIPLIER: f64 = 100.0;

/// `specdec bench serve`: its command-line options.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeBenchArgs {
    /// Target model: a registry name (smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b) or
    /// a .gguf path, as for `specdec serve --target`.
    #[arg(long)]
    pub target: String,
    /// Draft model of the speculative server, as for `specdec serve --draft`.
    #[arg(long)]
    pub draft: Option<String>,
    /// The speculative server's method (any `specdec serve --method` but plain).
    #[arg(long, default_value = "ngram")]
    pub method: String,
    /// Drafts per step of the fixed-budget methods.
    #[arg(long, default_value_t = 4)]
    pub k: usize,
    /// The speculative server's draft model computes only this many ids' logits (a method's
    /// `draft_vocab`: the lowest ids, or the first of --draft-vocab-ranking).
    #[arg(long)]
    pub draft_vocab: Option<usize>,
    /// With --draft-vocab: a vocabulary ranking (`specdec rank-vocab`) whose most frequent ids
    /// the draft keeps (a method's `draft_vocab_ranking`).
    #[arg(long)]
    pub draft_vocab_ranking: Option<PathBuf>,
    /// Requests per engine run of both servers; plain decoding's capacity is measured with
    /// this many closed-loop clients.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// The speculative server's `--min-acceptance` (a request below it stops speculating and
    /// probes again later; 0: never) [default: the server's: 0.3, none for a lookup drafter
    /// under the cost-model policy].
    #[arg(long)]
    pub min_acceptance: Option<f64>,
    /// Prompt set: MT-Bench's first turns (chat completions), HumanEval (completions), or both
    /// alternating.
    #[arg(long, default_value = "both", value_parser = ["mtbench", "humaneval", "both"])]
    pub prompts: String,
    /// Most tokens per request.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Sampling temperature of every request (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Requests per load point and mode (and for the capacity measure); a closed-loop point
    /// sends at least one per client.
    #[arg(long, default_value_t = 50)]
    pub requests: usize,
    /// Open-loop arrival rates as multiples of plain decoding's measured capacity,
    /// comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,1,1.5")]
    pub rates: Vec<f64>,
    /// Closed-loop client counts of the saturation test, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32")]
    pub clients: Vec<usize>,
    /// How many times every load point runs in both modes.
    #[arg(long, default_value_t = 1)]
    pub repeats: usize,
    /// Open-loop points send each repeat's requests in blocks of this many (the last may be
    /// shorter), each block to both servers in turn, the order alternating from block to
    /// block: a drift of the host's speed then falls on both modes alike. Each block's
    /// arrivals keep their Poisson gaps and start on idle servers. Closed-loop points run
    /// whole.
    #[arg(long, default_value_t = DEFAULT_BLOCK)]
    pub block: usize,
    /// Seed of the arrival times and of the requests' sampling seeds.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Seconds one request may take before it counts as failed.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// Results folder [default: results/bench-serve-TARGET-METHOD]. One holding another run's
    /// results is kept: the run writes to NAME-2 (NAME-3, ...) and says so.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace the results in the --out folder instead.
    #[arg(long)]
    pub force: bool,
    /// Give every load point and repeat its own prompts: the next `--requests` (or clients)
    /// of the pool, wrapping around it, and the warm-up request its last prompt. A method that
    /// keeps what finished requests generated (`history`) then never drafts a prompt's answer
    /// from the same prompt sent earlier, until the run has sent the whole pool (the summary
    /// counts the requests whose prompt was sent before). Without it every point sends the
    /// same prompts.
    #[arg(long)]
    pub fresh_prompts: bool,
}

/// What a finished benchmark gives back.
#[derive(Debug)]
pub struct BenchOutcome {
    /// The results folder written.
    pub dir: PathBuf,
    /// Plain decoding's measured capacity, completed requests per second.
    pub capacity_rps: f64,
    /// The summary rows (as in `summary.csv`).
    pub rows: Vec<SummaryRow>,
    /// Every request's record (as in `requests.jsonl`).
    pub requests: Vec<RequestRecord>,
}

fn invalid(message: impl Into<String>) -> ServerError {
    ServerError::InvalidOption(message.into())
}

/// The first value of `values` that an earlier one equals, if any.
fn first_repeated<T: PartialEq>(values: &[T]) -> Option<&T> {
    values
        .iter()
        .enumerate()
        .find_map(|(i, v)| values[..i].contains(v).then_some(v))
}

impl ServeBenchArgs {
    /// The defaults for `target` (as the command line gives them).
    pub fn new(target: &str) -> Self {
        Self {
            target: target.into(),
            draft: None,
            method: "ngram".into(),
            k: 4,
            draft_vocab: None,
            draft_vocab_ranking: None,
            batch_size: 8,
            min_acceptance: None,
            prompts: "both".into(),
            max_tokens: 64,
            temperature: 0.0,
            requests: 50,
            rates: vec![0.25, 0.5, 1.0, 1.5],
            clients: vec![1, 2, 4, 8, 16, 32],
            repeats: 1,
            block: DEFAULT_BLOCK,
            seed: 0,
            timeout: 300,
            out: None,
            force: false,
            fresh_prompts: false,
        }
    }

    /// Checks every option, before any model loads.
    ///
    /// # Errors
    /// [`ServerError::InvalidOption`] naming the option: no requests or too many, an empty or
    /// out-of-range rate or client list, no repeats, a bad temperature or token count, an
    /// unknown prompt set, plain as the method, a batch size the server refuses; the method's
    /// or the models' error for an unknown method or a model that is not there.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_REQUESTS).contains(&self.requests) {
            return Err(invalid(format!(
                "--requests must be in 1..={MAX_REQUESTS}, not {}",
                self.requests
            )));
        }
        if self.rates.is_empty() {
            return Err(invalid("--rates is empty: give at least one multiplier"));
        }
        if let Some(r) = self
            .rates
            .iter()
            .find(|r| !(r.is_finite() && **r > 0.0 && **r <= MAX_RATE_MULTIPLIER))
        {
            return Err(invalid(format!(
                "--rates: {r} is not a multiplier in (0, {MAX_RATE_MULTIPLIER}]"
            )));
        }
        if let Some(r) = first_repeated(&self.rates) {
            return Err(invalid(format!("--rates: {r} is given twice")));
        }
        if self.clients.is_empty() {
            return Err(invalid(
                "--clients is empty: give at least one client count",
            ));
        }
        if let Some(n) = self
            .clients
            .iter()
            .find(|n| !(1..=MAX_BATCH_SIZE).contains(n))
        {
            return Err(invalid(format!(
                "--clients: {n} is not a client count in 1..={MAX_BATCH_SIZE}"
            )));
        }
        if let Some(n) = first_repeated(&self.clients) {
            return Err(invalid(format!("--clients: {n} is given twice")));
        }
        if !(1..=MAX_REPEATS).contains(&self.repeats) {
            return Err(invalid(format!(
                "--repeats must be in 1..={MAX_REPEATS}, not {}",
                self.repeats
            )));
        }
        if !(1..=MAX_REQUESTS).contains(&self.block) {
            return Err(invalid(format!(
                "--block must be in 1..={MAX_REQUESTS}, not {}",
                self.block
            )));
        }
        if !(1..=MAX_TOKENS_LIMIT).contains(&self.max_tokens) {
            return Err(invalid(format!(
                "--max-tokens must be in 1..={MAX_TOKENS_LIMIT}, not {}",
                self.max_tokens
            )));
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(invalid(format!(
                "--temperature must be finite and ≥ 0, not {}",
                self.temperature
            )));
        }
        if !(1..=MAX_BATCH_SIZE).contains(&self.batch_size) {
            return Err(invalid(format!(
                "--batch-size must be in 1..={MAX_BATCH_SIZE}, not {}",
                self.batch_size
            )));
        }
        if let Some(threshold) = self.min_acceptance.filter(|t| !(0.0..=1.0).contains(t)) {
            return Err(invalid(format!(
                "--min-acceptance must be in [0, 1], not {threshold}"
            )));
        }
        if self.timeout == 0 {
            return Err(invalid("--timeout must be at least 1 second"));
        }
        prompt_sets(&self.prompts)?;
        let method = self.speculative_method()?;
        if method.drafter.is::<Plain>() {
            return Err(invalid(format!(
                "--method {}: the benchmark compares a speculative method with plain decoding; \
                 choose one that drafts",
                self.method
            )));
        }
        for model in std::iter::once(&self.target).chain(self.draft.iter()) {
            specdec_models::registry::resolve(model).map_err(|e| ServerError::Harness(e.into()))?;
        }
        Ok(())
    }

    /// The speculative server's method: `--method` with `--k`, its draft vocabulary as
    /// --draft-vocab and --draft-vocab-ranking say (checked as a config's method is).
    ///
    /// # Errors
    /// An unknown method; a draft vocabulary the method refuses (no model, no such file).
    fn speculative_method(&self) -> Result<MethodConfig> {
        let mut method = MethodConfig {
            draft_vocab: self.draft_vocab,
            draft_vocab_ranking: self.draft_vocab_ranking.clone(),
            ..method_for(&self.method, self.k, self.draft.as_deref())?
        };
        validate_method(&mut method).map_err(|p| {
            invalid(format!(
                "--method {}{}: {}",
                self.method, p.field, p.problem
            ))
        })?;
        Ok(method)
    }

    fn serve_options(&self, method: Option<MethodConfig>, queue: usize) -> ServeOptions {
        ServeOptions {
            draft: self.draft.clone(),
            method: method
                .as_ref()
                .map_or_else(|| "plain".into(), |m| m.name.clone()),
            method_config: method,
            k: self.k,
            host: "127.0.0.1".into(),
            port: 0,
            queue,
            batch_size: self.batch_size,
            min_acceptance: self.min_acceptance,
            seed: self.seed,
            ..ServeOptions::new(&self.target)
        }
    }

    /// The record of the run's settings: an experiment config with both methods.
    fn experiment(&self, sets: &[PromptSet]) -> Result<ExperimentConfig> {
        Ok(ExperimentConfig {
            name: default_name(self),
            description: format!(
                "specdec bench serve: plain vs {} on {}, {} prompts",
                self.method, self.target, self.prompts
            ),
            models: ModelsConfig {
                target: self.target.clone(),
                draft: self.draft.clone(),
                ..ModelsConfig::default()
            },
            prompts: sets[0].clone(),
            sampling: SamplingConfig {
                temperature: self.temperature,
                seed: self.seed,
                ..SamplingConfig::default()
            },
            max_tokens: self.max_tokens,
            batch_size: self.batch_size,
            repeat: self.repeats,
            baseline: Default::default(),
            schedule: Default::default(),
            simulation: None,
            toy: None,
            op_split: false,
            methods: vec![
                method_for("plain", self.k, None)?,
                self.speculative_method()?,
            ],
        })
    }
}

fn default_name(args: &ServeBenchArgs) -> String {
    let target = crate::model_id(&args.target);
    format!("bench-serve-{target}-{}", args.method)
}

/// The prompt sets of `--prompts`.
fn prompt_sets(name: &str) -> Result<Vec<PromptSet>> {
    let mtbench = PromptSet::Mtbench {
        categories: None,
        per_category: None,
        turns: None,
        chat: None,
    };
    let humaneval = PromptSet::Humaneval {
        count: None,
        chat: None,
    };
    match name {
        "mtbench" => Ok(vec![mtbench]),
        "humaneval" => Ok(vec![humaneval]),
        "both" => Ok(vec![mtbench, humaneval]),
        other => Err(invalid(format!(
            "--prompts {other}: use mtbench, humaneval or both"
        ))),
    }
}

/// The prompts of the sets, alternating between them while each lasts.
fn load_prompts(sets: &[PromptSet]) -> Result<Vec<Prompt>> {
    let mut lists = Vec::new();
    for set in sets {
        let prompts = set.load(Path::new("."))?;
        if prompts.is_empty() {
            return Err(invalid(format!("the prompt set {set:?} is empty")));
        }
        lists.push(prompts.into_iter());
    }
    let mut out = Vec::new();
    loop {
        let before = out.len();
        for list in &mut lists {
            out.extend(list.next());
        }
        if out.len() == before {
            return Ok(out);
        }
    }
}

/// The request for `prompt`: chat prompts go to `/v1/chat/completions` as messages, the others
/// to `/v1/completions` as raw text; streamed with usage.
fn request_for(prompt: &Prompt, model: &str, args: &ServeBenchArgs, seed: u64) -> Request {
    let mut body = json!({
        "model": model,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": seed,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let path = if prompt.chat {
        let messages: Vec<Value> = prompt
            .messages()
            .iter()
            .map(|m| json!({"role": m.role, "content": m.content}))
            .collect();
        body["messages"] = Value::Array(messages);
        "/v1/chat/completions"
    } else {
        body["prompt"] = Value::String(prompt.raw_text());
        "/v1/completions"
    };
    Request {
        path,
        body: body.to_string(),
    }
}

/// The two servers, each with the address it listens on.
struct Servers {
    plain: RunningServer,
    speculative: RunningServer,
}

impl Servers {
    fn addr(&self, mode: Mode) -> SocketAddr {
        match mode {
            Mode::Plain => self.plain.addr,
            Mode::Speculative => self.speculative.addr,
        }
    }
}

/// Waits until `/health` answers 200 (or the models fail to load, or `limit` passes).
async fn wait_healthy(server: &RunningServer, what: &str, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(e) = server.load_error() {
            return Err(ServerError::Engine(format!(
                "the {what} server's models failed to load: {e}"
            )));
        }
        if let Ok((200, _)) = client::get(server.addr, "/health", Duration::from_secs(5)).await {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(ServerError::Engine(format!(
                "the {what} server was not healthy within {} s",
                limit.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The (speculative, plain) target-pass counters of a server's `/metrics`.
async fn step_counters(addr: SocketAddr) -> Result<(f64, f64)> {
    let (status, text) = client::get(addr, "/metrics", Duration::from_secs(30))
        .await
        .map_err(|e| ServerError::Engine(format!("reading /metrics: {e}")))?;
    if status != 200 {
        return Err(ServerError::Engine(format!("/metrics answered {status}")));
    }
    Ok((
        counter(&text, "specdec_steps_speculative_total")?,
        counter(&text, "specdec_steps_plain_total")?,
    ))
}

/// The value of the sample `name` (with any labels) in Prometheus text.
fn counter(text: &str, name: &str) -> Result<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| ServerError::Engine(format!("/metrics has no `{name}` sample")))
}

/// A request's record from what the client saw.
fn record(
    mode: Mode,
    load: Load,
    repeat: usize,
    index: usize,
    prompt: &Prompt,
    (sent_s, got): (f64, Streamed),
) -> RequestRecord {
    let usage = got.usage.unwrap_or_default();
    let tpot_s = match (got.first_chunk_s, got.last_chunk_s) {
        (Some(first), Some(last)) if usage.completion_tokens > 1 => {
            Some((last - first) / (usage.completion_tokens - 1) as f64)
        }
        _ => None,
    };
    RequestRecord {
        mode,
        load,
        repeat,
        index,
        prompt_id: prompt.id.clone(),
        sent_s,
        ttft_s: got.first_chunk_s,
        tpot_s,
        e2e_s: got.end_s,
        prompt_tokens: usage.prompt_tokens,
        completion_tokens: usage.completion_tokens,
        accepted: usage.accepted,
        rejected: usage.rejected,
        finish_reason: got.finish_reason,
        text: got.text,
        error: got.error,
    }
}

/// Runs the benchmark (see the module docs) and writes its results folder.
///
/// # Errors
/// Bad options (before any model loads, see [`ServeBenchArgs::validate`]); prompts that
/// cannot be read; a server that cannot start or load its models; a capacity measure in which
/// no request completed; a results folder that cannot be written.
pub fn run(args: &ServeBenchArgs) -> Result<BenchOutcome> {
    args.validate()?;
    let sets = prompt_sets(&args.prompts)?;
    let prompts = load_prompts(&sets)?;
    let requested = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(default_name(args)));
    let dir = specdec_harness::cli::results_dir(&requested, args.force)?;
    if dir != requested {
        eprintln!(
            "note: {} holds another run's results; writing to {} (--force replaces them)",
            requested.display(),
            dir.display()
        );
    }
    std::fs::create_dir_all(&dir).map_err(|source| ServerError::Io {
        what: format!("creating {}", dir.display()),
        source,
    })?;
    let config = args.experiment(&sets)?;
    let mut notes = vec![format!(
        "specdec bench serve: prompts {} ({} prompts, alternating between sets)",
        args.prompts,
        prompts.len()
    )];
    notes.push(format!(
        "rates {:?} × capacity, clients {:?}, {} requests per point, {} repeats",
        args.rates, args.clients, args.requests, args.repeats
    ));
    let mut provenance = Provenance::collect(&config, None, "cpu", notes)?;
    provenance.complete = false;
    write_provenance(&dir, &provenance)?;

    // every request a phase can have waiting fits in the queue: requests are measured, not
    // turned away
    let most_clients = args.clients.iter().copied().max().unwrap_or(1);
    let queue = args.requests.max(most_clients) + args.batch_size;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| ServerError::Io {
            what: "the benchmark's async runtime".into(),
            source,
        })?;
    let servers = Servers {
        plain: start(&args.serve_options(None, queue))?,
        speculative: start(&args.serve_options(Some(args.speculative_method()?), queue))?,
    };
    eprintln!(
        "bench serve: plain on http://{}, {} on http://{}; loading the models…",
        servers.plain.addr, args.method, servers.speculative.addr
    );
    let outcome = runtime.block_on(drive(args, &servers, &prompts));
    let stopped = servers.plain.stop().and(servers.speculative.stop());
    let (capacity_rps, requests, phases) = outcome?;
    stopped?;

    let rows = report::summarize(&requests, &phases);
    let info = RunInfo {
        settings: vec![
            ("target".into(), args.target.clone()),
            (
                "draft".into(),
                args.draft.clone().unwrap_or_else(|| "none".into()),
            ),
            ("method".into(), format!("{} (k = {})", args.method, args.k)),
            (
                "draft vocabulary".into(),
                match (args.draft_vocab, &args.draft_vocab_ranking) {
                    (None, _) => "whole".into(),
                    (Some(n), None) => format!("the lowest {n} ids"),
                    (Some(n), Some(file)) => format!("{n} ids of {}", file.display()),
                },
            ),
            ("batch size".into(), args.batch_size.to_string()),
            (
                "min acceptance".into(),
                match args.min_acceptance {
                    Some(threshold) => threshold.to_string(),
                    None => format!(
                        "the server's default ({DEFAULT_MIN_ACCEPTANCE}; none for a lookup \
                         drafter under the cost-model policy)"
                    ),
                },
            ),
            (
                "prompts".into(),
                format!(
                    "{} ({} prompts; {})",
                    args.prompts,
                    prompts.len(),
                    match args.fresh_prompts {
                        true => "each load point its own, wrapping around the pool",
                        false => "the same ones at every load point",
                    }
                ),
            ),
            ("max tokens".into(), args.max_tokens.to_string()),
            ("temperature".into(), args.temperature.to_string()),
            ("requests per point".into(), args.requests.to_string()),
            ("repeats".into(), args.repeats.to_string()),
            (
                "open-loop blocks".into(),
                format!(
                    "{} requests, each to both servers in turn, the order alternating",
                    args.block
                ),
            ),
            ("seed".into(), args.seed.to_string()),
            ("threads".into(), provenance.threads.to_string()),
            ("cpu".into(), provenance.cpu_model.clone()),
        ],
        capacity_rps,
    };
    report::write_all(&dir, &requests, &phases, &rows, &info)?;
    provenance.complete = true;
    write_provenance(&dir, &provenance)?;
    print!("{}", report::summary_markdown(&rows, &info));
    eprintln!("bench serve: results in {}", dir.display());
    Ok(BenchOutcome {
        dir,
        capacity_rps,
        rows,
        requests,
    })
}

type Measured = (f64, Vec<RequestRecord>, Vec<PhaseRecord>);

/// The pool index of the first prompt of every load point's repeats (`[point][repeat]`), for
/// points of `counts` requests: all 0 (every point and repeat sends the same prompts), or with
/// `fresh` each point's repeats, in order, after the ones before (indices wrap around the pool
/// where they are used).
fn first_prompts(counts: &[usize], repeats: usize, fresh: bool) -> Vec<Vec<usize>> {
    let mut next = 0;
    counts
        .iter()
        .map(|&n| {
            (0..repeats)
                .map(|_| {
                    let first = next;
                    next += if fresh { n } else { 0 };
                    first
                })
                .collect()
        })
        .collect()
}

/// Prints one line on how the phase `what` went: requests completed, wall time, tokens/s.
fn log_phase(what: &str, phase: &load::PhaseResult) {
    let sent = phase.results.len();
    let failed = phase
        .results
        .iter()
        .filter(|(_, r)| r.error.is_some())
        .count();
    let tokens: usize = phase
        .results
        .iter()
        .filter_map(|(_, r)| r.usage.map(|u| u.completion_tokens))
        .sum();
    eprintln!(
        "bench serve: {what}: {}/{sent} ok in {:.1} s, {:.1} tok/s",
        sent - failed,
        phase.wall_s,
        tokens as f64 / phase.wall_s
    );
}

/// The blocks of a point of `n` requests: consecutive index ranges of `block` requests (the
/// last may be shorter), or the whole point as one when `block` is `None`.
fn blocks_of(n: usize, block: Option<usize>) -> Vec<std::ops::Range<usize>> {
    match block {
        Some(size) if size < n => (0..n)
            .step_by(size)
            .map(|start| start..(start + size).min(n))
            .collect(),
        _ => std::iter::once(0..n).collect(),
    }
}

/// How many of the `n` requests whose prompts start at pool index `first` (wrapping around a
/// pool of `pool` prompts) send a prompt in `sent` or one sent earlier in the same block; adds
/// the block's prompts to `sent`.
fn reused_prompts(sent: &mut HashSet<usize>, first: usize, n: usize, pool: usize) -> usize {
    (0..n).filter(|i| !sent.insert((first + i) % pool)).count()
}

/// Waits for both servers, warms each with one request, measures the capacity, then runs every
/// load point in both modes.
async fn drive(args: &ServeBenchArgs, servers: &Servers, prompts: &[Prompt]) -> Result<Measured> {
    let load_limit = Duration::from_secs(600);
    wait_healthy(&servers.plain, "plain", load_limit).await?;
    wait_healthy(&servers.speculative, &args.method, load_limit).await?;
    let timeout = Duration::from_secs(args.timeout);
    let model = model_id(&args.target);
    // request `i` of a phase whose prompts start at `first`
    let prompt_of = |first: usize, i: usize| &prompts[(first + i) % prompts.len()];
    let requests_for = |first: usize, n: usize| -> Vec<Request> {
        (0..n)
            .map(|i| {
                let seed = args.seed.wrapping_add(i as u64);
                request_for(prompt_of(first, i), &model, args, seed)
            })
            .collect()
    };
    let warm_up = match args.fresh_prompts {
        true => prompts.len() - 1,
        false => 0,
    };
    for mode in [Mode::Plain, Mode::Speculative] {
        let warm = closed_loop(servers.addr(mode), &requests_for(warm_up, 1), 1, timeout).await;
        if let Some(e) = &warm.results[0].1.error {
            return Err(ServerError::Engine(format!(
                "the {} server's warm-up request failed: {e}",
                mode.name()
            )));
        }
    }

    let capacity = closed_loop(
        servers.plain.addr,
        &requests_for(0, args.requests),
        args.batch_size,
        timeout,
    )
    .await;
    let completed = capacity
        .results
        .iter()
        .filter(|(_, r)| r.error.is_none())
        .count();
    if completed == 0 {
        let why = capacity.results[0].1.error.clone().unwrap_or_default();
        return Err(ServerError::Engine(format!(
            "no request of the capacity measure completed (the first: {why})"
        )));
    }
    let capacity_rps = completed as f64 / capacity.wall_s;
    eprintln!(
        "bench serve: plain capacity {capacity_rps:.3} requests/s ({completed}/{} requests in \
         {:.1} s, {} clients)",
        args.requests, capacity.wall_s, args.batch_size
    );

    let mut loads: Vec<Load> = args
        .rates
        .iter()
        .map(|&multiplier| Load::Rate {
            multiplier,
            rate_rps: multiplier * capacity_rps,
        })
        .collect();
    loads.extend(
        args.clients
            .iter()
            .map(|&clients| Load::Clients { clients }),
    );
    let counts: Vec<usize> = loads
        .iter()
        .map(|load| match *load {
            Load::Rate { .. } => args.requests,
            Load::Clients { clients } => args.requests.max(clients),
        })
        .collect();
    let firsts = first_prompts(&counts, args.repeats, args.fresh_prompts);
    // the prompts the speculative server was sent (the warm-up's), to count the reused ones
    let mut sent = HashSet::from([warm_up]);
    let (mut records, mut phases) = (Vec::new(), Vec::new());
    for (point, load) in loads.iter().enumerate() {
        let n = counts[point];
        let blocks = blocks_of(n, matches!(load, Load::Rate { .. }).then_some(args.block));
        // counts the point's blocks through its repeats: plain goes first in the even ones
        let mut turn = 0;
        for (repeat, &first) in firsts[point].iter().enumerate() {
            let requests = requests_for(first, n);
            let reused = reused_prompts(&mut sent, first, n, prompts.len());
            let arrivals = match *load {
                Load::Rate { rate_rps, .. } => {
                    let stream = (point * MAX_REPEATS + repeat) as u64;
                    poisson_arrivals(rate_rps, n, args.seed, stream)
                }
                Load::Clients { .. } => Vec::new(),
            };
            for (block, range) in blocks.iter().enumerate() {
                let order = if turn % 2 == 0 {
                    [Mode::Plain, Mode::Speculative]
                } else {
                    [Mode::Speculative, Mode::Plain]
                };
                turn += 1;
                let sent_now = &requests[range.clone()];
                // the block's own arrivals, its first at 0: the gaps are kept
                let at: Vec<f64> = arrivals.get(range.clone()).map_or_else(Vec::new, |times| {
                    times.iter().map(|t| t - times[0]).collect()
                });
                let of_blocks = match blocks.len() {
                    1 => String::new(),
                    count => format!(" block {}/{count}", block + 1),
                };
                for mode in order {
                    let addr = servers.addr(mode);
                    let before = step_counters(addr).await?;
                    let phase = match *load {
                        Load::Rate { .. } => open_loop(addr, sent_now, &at, timeout).await,
                        Load::Clients { clients } => {
                            closed_loop(addr, sent_now, clients, timeout).await
                        }
                    };
                    let after = step_counters(addr).await?;
                    let what = format!(
                        "{} {:>8} repeat {repeat}{of_blocks}",
                        load.label(),
                        mode.name()
                    );
                    log_phase(&what, &phase);
                    phases.push(PhaseRecord {
                        mode,
                        load: *load,
                        repeat,
                        block,
                        wall_s: phase.wall_s,
                        requests: sent_now.len(),
                        steps_speculative: after.0 - before.0,
                        steps_plain: after.1 - before.1,
                        // counted once per repeat, on its first block
                        reused_prompts: if block == 0 { reused } else { 0 },
                    });
                    records.extend(
                        phase
                            .results
                            .into_iter()
                            .zip(range.clone())
                            .map(|(got, i)| {
                                record(mode, *load, repeat, i, prompt_of(first, i), got)
                            }),
                    );
                }
            }
        }
    }
    Ok((capacity_rps, records, phases))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_counters_are_read_by_name_with_or_without_labels() {
        let text = "# HELP specdec_steps_plain_total x\n# TYPE specdec_steps_plain_total counter\n\
                    specdec_steps_plain_total{method=\"ngram\"} 12\n\
                    specdec_steps_speculative_total_extra 99\n\
                    specdec_steps_speculative_total 7\n";
        assert_eq!(counter(text, "specdec_steps_plain_total").unwrap(), 12.0);
        assert_eq!(
            counter(text, "specdec_steps_speculative_total").unwrap(),
            7.0
        );
        assert!(counter(text, "specdec_missing").is_err());
    }

    #[test]
    fn bad_options_are_refused_naming_the_option() {
        type Change = fn(&mut ServeBenchArgs);
        let cases: [(Change, &str); 21] = [
            (|a| a.requests = 0, "--requests"),
            (|a| a.requests = MAX_REQUESTS + 1, "--requests"),
            (|a| a.rates = vec![], "--rates is empty"),
            (|a| a.rates = vec![0.5, -1.0], "--rates: -1"),
            (|a| a.rates = vec![f64::NAN], "--rates: NaN"),
            (
                |a| a.rates = vec![1.0, 0.5, 1.0],
                "--rates: 1 is given twice",
            ),
            (|a| a.clients = vec![], "--clients is empty"),
            (|a| a.clients = vec![0], "--clients: 0"),
            (|a| a.clients = vec![2, 2], "--clients: 2 is given twice"),
            (|a| a.repeats = 0, "--repeats"),
            (|a| a.block = 0, "--block"),
            (|a| a.max_tokens = 0, "--max-tokens"),
            (|a| a.temperature = -0.5, "--temperature"),
            (|a| a.batch_size = 0, "--batch-size"),
            (|a| a.timeout = 0, "--timeout"),
            (|a| a.prompts = "sharegpt".into(), "--prompts sharegpt"),
            (|a| a.method = "plain".into(), "--method plain"),
            (|a| a.method = "nonesuch".into(), "unknown method"),
            (
                |a| a.draft_vocab = Some(1024),
                "--method ngram.draft_vocab: method `ngram`: draft_vocab applies to drafters with a model",
            ),
            (
                |a| {
                    (a.method, a.draft) = ("chain".into(), Some("qwen2.5-coder-0.5b".into()));
                    (a.draft_vocab, a.draft_vocab_ranking) = (Some(8), Some("/no/such.json".into()));
                },
                "/no/such.json",
            ),
            // every option valid but the model: the model is checked last, without loading
            (|_| {}, "no-such-model"),
        ];
        for (i, (change, expected)) in cases.into_iter().enumerate() {
            let out = std::env::temp_dir()
                .join(format!("specdec-bench-refused-{}-{i}", std::process::id()));
            let mut args = ServeBenchArgs {
                out: Some(out.clone()),
                ..ServeBenchArgs::new("no-such-model")
            };
            change(&mut args);
            let error = args.validate().expect_err(expected).to_string();
            assert!(error.contains(expected), "{expected}: {error}");
            // `run` refuses the same way, before writing anything
            assert!(run(&args).is_err());
            assert!(!out.exists(), "{expected}: {} was created", out.display());
        }
    }

    #[test]
    fn fresh_prompts_give_each_load_point_the_next_block() {
        assert_eq!(first_prompts(&[50, 50, 64], 1, false), [[0], [0], [0]]);
        assert_eq!(first_prompts(&[50, 50, 64], 1, true), [[0], [50], [100]]);
        // each repeat its own block too
        assert_eq!(first_prompts(&[50, 64], 2, true), [[0, 50], [100, 164]]);
        assert_eq!(first_prompts(&[50, 64], 2, false), [[0, 0], [0, 0]]);
        assert!(first_prompts(&[], 2, true).is_empty());
        // reused: prompts sent before, or twice in one block once it wraps around the pool
        let mut sent = HashSet::from([9]);
        assert_eq!(reused_prompts(&mut sent, 0, 5, 10), 0);
        assert_eq!(reused_prompts(&mut sent, 5, 5, 10), 1);
        assert_eq!(reused_prompts(&mut sent, 0, 3, 10), 3);
        assert_eq!(reused_prompts(&mut HashSet::new(), 8, 12, 10), 2);
    }

    #[test]
    fn open_loop_points_are_cut_into_blocks_and_closed_loop_points_are_not() {
        let ends = |n, block| -> Vec<(usize, usize)> {
            blocks_of(n, block)
                .iter()
                .map(|r| (r.start, r.end))
                .collect()
        };
        assert_eq!(ends(25, Some(10)), [(0, 10), (10, 20), (20, 25)]);
        assert_eq!(ends(20, Some(10)), [(0, 10), (10, 20)]);
        assert_eq!(ends(5, Some(10)), [(0, 5)]);
        assert_eq!(ends(7, Some(1)).len(), 7);
        assert_eq!(ends(64, None), [(0, 64)]);
    }

    #[test]
    fn chat_prompts_go_to_chat_completions_and_raw_ones_to_completions() {
        let args = ServeBenchArgs::new("m");
        let chat = Prompt::single("mtbench/1".into(), "Hi?".into(), true);
        let raw = Prompt::single("humaneval/0".into(), "def f():".into(), false);
        let c = request_for(&chat, "m", &args, 3);
        assert_eq!(c.path, "/v1/chat/completions");
        let body: Value = serde_json::from_str(&c.body).unwrap();
        assert_eq!(body["messages"][0]["content"], "Hi?");
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(
            (body["seed"].as_u64(), body["max_tokens"].as_u64()),
            (Some(3), Some(64))
        );
        let r = request_for(&raw, "m", &args, 0);
        assert_eq!(r.path, "/v1/completions");
        let body: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(body["prompt"], "def f():");
        assert!(body.get("messages").is_none());
    }
}
