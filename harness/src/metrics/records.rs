//! Raw records: one per engine step per sequence, one per request, one per method run.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use specdec_algorithms::policy::Budget;
use specdec_algorithms::trees::TreeShape;

use crate::error::Result;

/// What happened to one sequence in one target pass. Times are seconds (wall time for real runs,
/// cost-model time for simulations); a time shared by a batch is attributed in full to every
/// sequence in it (tokens/s therefore comes from [`MethodRun::elapsed_s`], never from summing
/// steps).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Method configuration name.
    pub method: String,
    /// Index of the request (prompt) in the experiment's prompt list.
    pub request: usize,
    /// 0-based step (target pass) number within the request.
    pub step: usize,
    /// 0-based repeat of the schedule this step ran in (`repeat = N` in the config).
    #[serde(default)]
    pub repeat: usize,
    /// Draft tokens (chain) or draft tree nodes proposed this step; 0 for plain decoding.
    pub proposed: usize,
    /// Depth of the deepest proposed node (= `proposed` for a chain; 0 when nothing proposed).
    pub draft_depth: usize,
    /// Drafts accepted by verification (length of the accepted path, ≤ `draft_depth`).
    pub accepted: usize,
    /// Tokens committed to the output this step (accepted + the bonus/correction token, cut at
    /// `max_tokens` or end of sequence).
    pub emitted: usize,
    /// Seconds spent drafting.
    pub draft_s: f64,
    /// Seconds in the target forward pass.
    pub target_s: f64,
    /// Seconds verifying (accept/reject, sampling the next token).
    pub verify_s: f64,
    /// Seconds committing/rewinding the KV cache.
    pub commit_s: f64,
    /// Seconds of everything else (scheduling, metadata, host work).
    pub overhead_s: f64,
    /// Seconds of the request's prompt prefill (admission: all prompt tokens but the last into
    /// the target's KV cache, the drafters told) before this step: on step 0 only, else 0.
    #[serde(default)]
    pub prefill_s: f64,
    /// Of `prefill_s`, the seconds spent forwarding this request's own prompt chunks, without
    /// the other requests' steps a batched engine ran in between (so a run's decode time is its
    /// wall time minus the sum of these): on step 0 only. Absent in simulated records and in
    /// records written before it was recorded (then `prefill_s` stands for it, which it equals
    /// without batching).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_work_s: Option<f64>,
    /// Blocks of the target's paged KV cache in use after the step, over every sequence in
    /// flight (measured from the model's pool; the simulation, which runs one request at a
    /// time, counts this sequence's; 0 when the model has no paged cache, as the toy models).
    pub kv_blocks: usize,
    /// Sequences in the target pass that served this step (1 without batching).
    pub batch: usize,
    /// Name of the drafter that drafted this step (the method's own, or its fallback's); empty
    /// in records written before it was recorded.
    #[serde(default)]
    pub drafter: String,
    /// What the policy decided for this step, before the engine cut it to the room left in the
    /// context and the KV pool: what `--replay` feeds back. Absent in simulated records and in
    /// records written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<PolicyDecision>,
    /// The `emitted` token ids. Empty in simulated records and in records written before they
    /// were recorded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<u32>,
    /// The target forward split into its ops, in the order they first ran, when the run asked
    /// for it (`op_split = true`); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<OpSeconds>,
}

/// The wall time of one op of a target forward (all its calls: one per layer for a block's
/// ops), as the model's op clock measured it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpSeconds {
    /// The op's name ("qkv", "attention", "lm_head", ...).
    pub op: String,
    /// Seconds.
    pub seconds: f64,
}

/// One step's speculation decision as recorded: which drafter, with which budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyDecision {
    /// True when the method's fallback drafter drafted (its main policy chose plain decoding).
    pub fallback: bool,
    /// The budget the policy chose (the kept prefix where it trimmed a chain of deterministic
    /// drafts, [`specdec_algorithms::policy::SpeculationPolicy::keep_drafts`]).
    pub budget: BudgetRecord,
}

impl PolicyDecision {
    /// The record of `budget`, drafted by the fallback drafter when `fallback`.
    pub fn new(fallback: bool, budget: &Budget) -> Self {
        let budget = match budget {
            Budget::Plain => BudgetRecord::Plain,
            Budget::Chain(k) => BudgetRecord::Chain(*k),
            Budget::TreeNodes(n) => BudgetRecord::TreeNodes(*n),
            Budget::Tree(shape) => BudgetRecord::Tree {
                parents: shape.topology().parents().to_vec(),
                ranks: shape.ranks().to_vec(),
            },
        };
        Self { fallback, budget }
    }

    /// The budget this record stands for.
    ///
    /// # Errors
    /// [`HarnessError::Algorithm`] for a recorded tree that is not a valid shape.
    pub fn budget(&self) -> Result<Budget> {
        Ok(match &self.budget {
            BudgetRecord::Plain => Budget::Plain,
            BudgetRecord::Chain(k) => Budget::chain(*k),
            BudgetRecord::TreeNodes(n) => Budget::TreeNodes(*n),
            BudgetRecord::Tree { parents, ranks } => {
                Budget::Tree(Arc::new(TreeShape::new(parents, ranks)?))
            }
        })
    }
}

/// A [`Budget`] as it is written to `steps.jsonl`: `"plain"`, `{"chain": k}`,
/// `{"tree_nodes": n}` or `{"tree": {"parents": [null, 0, …], "ranks": [0, 0, …]}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum BudgetRecord {
    /// No drafts.
    Plain,
    /// A chain of `k` drafts.
    Chain(usize),
    /// A tree of at most this many draft nodes, shaped by the drafter.
    TreeNodes(usize),
    /// A tree of exactly this shape ([`TreeShape::new`]'s arguments).
    Tree {
        /// Parent of each node (`None` for the root).
        parents: Vec<Option<usize>>,
        /// Rank of each node among its siblings.
        ranks: Vec<usize>,
    },
}

impl StepRecord {
    /// Sum of the six time components (prefill included), in seconds.
    pub fn total_s(&self) -> f64 {
        self.draft_s
            + self.target_s
            + self.verify_s
            + self.commit_s
            + self.overhead_s
            + self.prefill_s
    }
}

/// One request (prompt) run by one method, summed over its steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Method configuration name.
    pub method: String,
    /// Index of the request in the prompt list.
    pub request: usize,
    /// 0-based repeat of the schedule (`repeat = N` in the config).
    #[serde(default)]
    pub repeat: usize,
    /// Prompt id (see `config::Prompt::id`).
    pub prompt_id: String,
    /// The prompt's category (MT-Bench, Spec-Bench questions), else `None`.
    #[serde(default)]
    pub category: Option<String>,
    /// 1-based turn of a multi-turn question (1 otherwise).
    #[serde(default = "first_turn")]
    pub turn: usize,
    /// Prompt length in tokens (nominal for synthetic prompts).
    pub prompt_tokens: usize,
    /// Tokens generated (Σ emitted).
    pub generated_tokens: usize,
    /// Target passes (= steps).
    pub target_passes: usize,
    /// Σ proposed drafts.
    pub proposed: usize,
    /// Σ accepted drafts.
    pub accepted: usize,
    /// Seconds from admission to retirement of this request (prefill included).
    pub elapsed_s: f64,
    /// Seconds of the prompt prefill (Σ of the steps' `prefill_s`).
    #[serde(default)]
    pub prefill_s: f64,
    /// Time to first token: the prefill plus the first step (whose target pass emits the first
    /// token), in seconds; 0 without steps.
    #[serde(default)]
    pub ttft_s: f64,
    /// Σ draft seconds.
    pub draft_s: f64,
    /// Σ target seconds.
    pub target_s: f64,
    /// Σ verify seconds.
    pub verify_s: f64,
    /// Σ commit seconds.
    pub commit_s: f64,
    /// Σ overhead seconds.
    pub overhead_s: f64,
    /// Largest KV block count over the steps.
    pub kv_blocks_peak: usize,
    /// The generated text when the backend produces text (not in simulation).
    #[serde(default)]
    pub text: Option<String>,
}

impl RequestRecord {
    /// Sums a request's steps (its `repeat` is theirs). `steps` must all belong to this method,
    /// request and repeat (not checked here; [`crate::metrics::summarize`] groups by the fields).
    pub fn from_steps(
        method: &str,
        request: usize,
        prompt_id: &str,
        prompt_tokens: usize,
        elapsed_s: f64,
        steps: &[StepRecord],
    ) -> RequestRecord {
        let sum = |f: fn(&StepRecord) -> f64| steps.iter().map(f).sum::<f64>();
        RequestRecord {
            method: method.to_string(),
            request,
            repeat: steps.first().map_or(0, |s| s.repeat),
            prompt_id: prompt_id.to_string(),
            category: None,
            turn: 1,
            prompt_tokens,
            generated_tokens: steps.iter().map(|s| s.emitted).sum(),
            target_passes: steps.len(),
            proposed: steps.iter().map(|s| s.proposed).sum(),
            accepted: steps.iter().map(|s| s.accepted).sum(),
            elapsed_s,
            prefill_s: sum(|s| s.prefill_s),
            ttft_s: steps.first().map_or(0.0, StepRecord::total_s),
            draft_s: sum(|s| s.draft_s),
            target_s: sum(|s| s.target_s),
            verify_s: sum(|s| s.verify_s),
            commit_s: sum(|s| s.commit_s),
            overhead_s: sum(|s| s.overhead_s),
            kv_blocks_peak: steps.iter().map(|s| s.kv_blocks).max().unwrap_or(0),
            text: None,
        }
    }

    /// τ of this request: (accepted + passes) / passes; `None` without passes.
    pub fn tau(&self) -> Option<f64> {
        (self.target_passes > 0)
            .then(|| (self.accepted + self.target_passes) as f64 / self.target_passes as f64)
    }

    /// Seconds of decoding: elapsed minus the prefill.
    pub fn decode_s(&self) -> f64 {
        (self.elapsed_s - self.prefill_s).max(0.0)
    }

    /// Generated tokens per decode second (prefill excluded); `None` when no time elapsed.
    pub fn tokens_per_s(&self) -> Option<f64> {
        let decode = self.decode_s();
        (decode > 0.0).then(|| self.generated_tokens as f64 / decode)
    }

    /// Time per output token after the first: (elapsed − TTFT) / (tokens − 1), in seconds
    /// (vLLM's TPOT); `None` for fewer than 2 tokens.
    pub fn tpot_s(&self) -> Option<f64> {
        (self.generated_tokens >= 2)
            .then(|| (self.elapsed_s - self.ttft_s).max(0.0) / (self.generated_tokens - 1) as f64)
    }
}

fn first_turn() -> usize {
    1
}

/// One method's whole run over the prompts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MethodRun {
    /// Method configuration name.
    pub method: String,
    /// Human description (`drafter / verifier / policy`).
    pub description: String,
    /// Whether this is the plain-decoding baseline.
    pub is_baseline: bool,
    /// Seconds the method took over all its requests (wall time, or simulated time), its
    /// one-time set-up excluded.
    pub elapsed_s: f64,
    /// Seconds of one-time set-up before the method's first request (loading and instantiating
    /// draft models, calibrating costs, tuning a layer-skip drafter); not part of `elapsed_s`.
    #[serde(default)]
    pub setup_s: f64,
    /// `elapsed_s` split by repeat (one entry per repeat of the schedule; empty in records
    /// written before repeats existed).
    #[serde(default)]
    pub repeat_elapsed_s: Vec<f64>,
}
