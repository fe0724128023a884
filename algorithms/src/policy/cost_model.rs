//! [`CostModelPolicy`]: pick the budget that maximises expected tokens per unit of cost.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::error::{ensure_param, Result};
use crate::policy::{
    expected_tokens, AcceptanceStats, Budget, CostCurve, CostModel, ForwardCurve, LiveCosts,
    Prober, SpeculationPolicy, StepOutcome, StepTiming,
};
use crate::trees::SequoiaPlanner;

/// Which budgets the cost-model policy searches over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeSearch {
    /// Chains of `0..=max_k` drafts; α̂ per draft position.
    Chain {
        /// Longest chain considered.
        max_k: usize,
    },
    /// Sequoia-optimal trees of up to `max_nodes` draft nodes and depth `max_depth`, from the
    /// per-rank acceptance vector of the first `max_ranks` ranks (hardware-aware: maximises
    /// `E / cost` over the node budget and depth).
    Tree {
        /// Largest tree considered (draft nodes).
        max_nodes: usize,
        /// Deepest tree considered.
        max_depth: usize,
        /// Ranks whose acceptance is estimated (candidates per node at most).
        max_ranks: usize,
    },
}

/// Chooses the budget maximising `E[tokens] / (draft_cost + verify_cost)` with α̂ tracked online:
///
/// - chains: `E(K) = 1 + Σ_{i<K} Π_{j≤i} α̂_j` with per-position conditional α̂ from
///   [`AcceptanceStats`] (censored positions handled there), cost [`CostModel::chain_cost`];
/// - trees: the hardware-aware Sequoia optimum ([`SequoiaPlanner::best_for_cost`]) under the
///   per-rank acceptance vector.
///
/// Plain decoding (`E = 1`, cost 1) is always a candidate, and speculation is chosen only when
/// its predicted rate beats plain decoding by `min_gain` (default 2%). While plain decoding is
/// chosen, one chain of 1 draft is taken every `probe_every` plain steps (default 16) so the
/// estimates can recover. α̂ → 1 is handled exactly (products, no `1/(1 − α)`).
///
/// # Measured mode ([`CostModelPolicy::measured`])
///
/// The costs come from the engine's timings of this very sequence ([`LiveCosts`], fed through
/// [`SpeculationPolicy::observe_measured`]), not from a model given up front:
///
/// - **start plain**: until a plain step has been timed there is no cost model, so the first
///   step is plain decoding (it measures the plain step; the prompt prefill gives the chord that
///   bounds the verify cost of unmeasured sizes from below);
/// - **explore only when it can pay**: before any draft of this sequence was verified, α̂ is
///   taken as the acceptance the method's recent sequences measured, pooled over the latest
///   `LEARNED_FORKS` (32) forks once they made `LEARNED_MIN_TRIES` (16) tries together (shared by
///   every fork of one policy: a workload whose drafts are rarely accepted stops paying a first
///   exploration per request, and one unlucky request does not switch a drafter off), or
///   `explore_alpha` (default 0.8, the acceptance of a
///   well-matched drafter) for the first sequence and one in `EXPLORE_EVERY_FORKS` (8) after
///   it (so that a change of workload is noticed; sequences are counted when they first ask for
///   a budget, so a fork made only to be forked again, as an engine's prototype, does not take
///   an explorer's turn); otherwise the smoothed per-position α̂
///   (censored positions handled by [`AcceptanceStats`]), whose pooled prior is the acceptance
///   the other recent forks measured, counted as [`LEARNED_PRIOR_TRIES`] tries (uniform for an
///   explorer, or before they measured one);
/// - **start from what earlier sequences measured**: a fork's draft-pass (per-node for trees)
///   time starts at the latest steady figure any earlier fork measured, not at the one-pass
///   time timed at set-up;
/// - **price the switch**: a model drafter that sat out plain steps must catch up on the tokens
///   it missed (the whole prompt before its first draft). Speculation is started only when the
///   predicted saving over the tokens left (`(1 − 1/rate)` plain steps per token, over the
///   engine's remaining token count, else `horizon` minus the tokens generated) exceeds that
///   catch-up cost;
/// - **step aside, probe rarely**: when plain decoding wins, a probe (the cheapest speculative
///   budget: a chain of 1, or a 1-node tree) is taken after `probe_every` plain steps, the
///   interval doubling after each probe up to `probe_max` (default 256), and only if the probe
///   could pay, catch-up included, under the optimistic acceptance `max(α̂, explore_alpha)` —
///   or, when earlier sequences measured an acceptance, `max(α̂, learned)` (just `learned`
///   before this sequence drafted at all): a probe makes a model drafter catch up on every
///   token since its last draft, which a workload with low acceptance never earns back. Such a
///   sequence then decodes plainly throughout; the exploring forks re-measure.
///
/// # A drafter that costs nothing (measured mode, chains)
///
/// When `max_k` drafts cost at most [`FREE_DRAFTS_COST`] of a plain step (lookup drafters:
/// n-gram, history), asking for them is free, and how many such a drafter offers is its own
/// confidence: a history match of `m` tokens drafts at most `m`, and a long offer is accepted
/// far more often than a short one (0.63 against 0.21 at the first position, SmolLM2 on
/// MT-Bench). So the policy asks for `max_k` every step and decides when the drafts are
/// offered ([`SpeculationPolicy::keep_drafts`]): it verifies the prefix of `k ≤ L` of the `L`
/// offered drafts maximising `E[tokens] / cost` under the acceptance measured for offers of
/// length `L`, or none where nothing beats plain decoding by `min_gain` (a 1-draft probe after
/// `probe_every` such refusals). Those per-offer-length estimates are shared by the
/// workload's sequences (decayed by [`OFFER_DECAY`] per verified offer): what an offer of `L`
/// drafts is worth is a property of the drafter, the target and the workload, and one short
/// request measures too few offers of each length to tell. Under load the cost is the batch's
/// shared forward, so short offers stop being verified first, and long ones last.
///
/// The policy is per drafter: it chooses K (or the tree) for the drafter it is built with. To let
/// a second drafter draft where this one steps aside, pair two policies in a
/// [`crate::policy::FallbackPolicy`]: tokens the other drafter adds reach this policy through
/// [`SpeculationPolicy::observe_skipped`] and count in its drafter's catch-up.
#[derive(Debug, Clone)]
pub struct CostModelPolicy {
    costs: CostModel,
    search: TreeSearch,
    stats: AcceptanceStats,
    fresh_stats: AcceptanceStats,
    min_gain: f64,
    prober: Prober,
    predicted_rate: f64,
    replan_every: usize,
    plan: Option<(Budget, f64)>,
    since_plan: usize,
    live: Option<Live>,
    /// What the forks of this policy measured of the costs, shared by all of them.
    learned: Arc<Mutex<Learned>>,
    /// What the forks of this sequence's workload measured of the acceptance, shared by them
    /// ([`SpeculationPolicy::fork_for_new_workload`] starts another pool).
    pool: Arc<Mutex<AcceptancePool>>,
    /// This sequence ignores [`Learned::alpha`] and explores as the first one did (decided when
    /// it first asks for a budget, see `counted`).
    explorer: bool,
    /// This sequence has taken its number among the sequences that asked for a budget.
    counted: bool,
    /// This sequence's number among the forks (0 for the template itself).
    fork_id: u64,
    /// Sequences sharing the next step's forward ([`SpeculationPolicy::observe_load`]).
    load: usize,
    /// Where this step stands with a free drafter's offer (see the type docs).
    offer: OfferStep,
}

/// A step's offer from a free drafter: asked for, then priced by
/// [`SpeculationPolicy::keep_drafts`], then recorded against its length with the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OfferStep {
    /// This step's budget was not an ask for all a free drafter has.
    None,
    /// The budget asked a free drafter for all it would offer; the offer is to be priced.
    Asked,
    /// The offer was priced: `offered` drafts, the first `kept` of them verified.
    Priced { offered: usize, kept: usize },
}

/// Draft-position tries the recent forks must have made together before their pooled α̂
/// becomes the starting point of later sequences (a few rejected tries of one request say
/// little: an n-gram drafter's drafts are either a long match or nothing).
pub const LEARNED_MIN_TRIES: f64 = 16.0;

/// How many tries the learned α̂ counts as once a sequence drafted: its pooled α̂ is
/// `(S + n · learned) / (T + n)` with `n` this ([`AcceptanceStats::set_pooled_prior`]), so a
/// rejected first draft does not switch a drafter earlier sequences found good off for the rest
/// of the request (a uniform prior of 2 tries did: one rejected chain of 4 put a Qwen2.5-Coder
/// 0.5B draft at α̂ = 0.22 against the 0.8 it had, and its request decoded without it), while a
/// few more rejections still do.
pub const LEARNED_PRIOR_TRIES: f64 = 8.0;

/// How many of the latest forks' acceptance counts are pooled into the learned α̂.
pub const LEARNED_FORKS: usize = 32;

/// Drafts whose `max_k` draft passes together cost at most this share of a plain step are free
/// (see [`CostModelPolicy`]): the policy asks for all of them and prices each offer.
pub const FREE_DRAFTS_COST: f64 = 0.02;

/// The per-step decay of the acceptance measured for each offer length of a free drafter
/// (roughly the last 100 verified offers of that length count).
pub const OFFER_DECAY: f64 = 0.99;

/// The learned α̂ as a prior is kept this far inside (0, 1), where a smoothed estimate lives.
const PRIOR_ALPHA_MIN: f64 = 0.01;

/// One sequence in this many (the first, the `1 + n`-th, ... to ask a fork of one policy for a
/// budget) ignores the learned acceptance and explores optimistically, so that a workload whose
/// drafts became easier is noticed.
pub const EXPLORE_EVERY_FORKS: u64 = 8;

/// The state the forks of one [`CostModelPolicy`] share.
#[derive(Debug, Clone, Default)]
struct Learned {
    /// Forks made so far (every workload's: a fork's id is unique among them).
    forks: u64,
    /// The latest steady draft-pass (or per-node) time any fork measured, in seconds: a new
    /// fork's prior instead of the one-pass time timed at set-up, which for a tree drafter
    /// misses what a node really costs.
    draft_pass_s: Option<f64>,
    /// The relative target-forward costs `t(n) / t(1)` forks measured (index `n - 1`, the
    /// latest measurement of each size): a new fork's verify-cost prior, so that it does not
    /// judge small budgets by the prefill chord alone.
    verify_ratios: Vec<Option<f64>>,
    /// What the target's shared forwards cost by their tokens, as every fork timed them: the
    /// price of a step under load ([`LiveCosts::cost_model_under_load`]).
    forward: ForwardCurve,
}

/// The acceptance the forks of one workload measured (see [`CostModelPolicy`]): requests of
/// one workload (a server's chat and code traffic are two) start from what that workload's
/// recent requests measured, not from a mix in which one workload's drafts look worse or
/// better than they are for the other.
#[derive(Debug, Clone, Default)]
struct AcceptancePool {
    /// `(fork, successes, tries)`: the pooled draft-position counts of each of the latest
    /// [`LEARNED_FORKS`] forks of the workload that drafted, oldest first; see
    /// [`AcceptancePool::alpha`].
    acceptance: VecDeque<(u64, f64, f64)>,
    /// Sequences of the workload (forks or the template itself) that asked for a budget so far.
    sequences: u64,
    /// A free drafter's acceptance by offer length (index `L - 1`): the positions of the
    /// verified prefixes of its offers of `L` drafts (see [`CostModelPolicy`]).
    by_offer: Vec<AcceptanceStats>,
}

impl AcceptancePool {
    /// The acceptance α̂ pooled over the recent forks (successes / tries of all of them), once
    /// they made [`LEARNED_MIN_TRIES`] tries together.
    fn alpha(&self) -> Option<f64> {
        self.alpha_without(None)
    }

    /// [`Self::alpha`] over the forks other than `fork`: what a sequence's own tries are
    /// weighed against (its own counts would count twice).
    fn alpha_of_others(&self, fork: u64) -> Option<f64> {
        self.alpha_without(Some(fork))
    }

    fn alpha_without(&self, fork: Option<u64>) -> Option<f64> {
        let (successes, tries) = self
            .acceptance
            .iter()
            .filter(|(f, _, _)| Some(*f) != fork)
            .fold((0.0, 0.0), |(s, t), &(_, fs, ft)| (s + fs, t + ft));
        (tries >= LEARNED_MIN_TRIES).then(|| successes / tries)
    }

    /// The per-position acceptance estimates of offers of `offered` (≥ 1) drafts; before any
    /// was verified, the optimistic `explore_alpha` (so that an offer length is tried, and its
    /// verification cost timed, before it is judged).
    fn offer_alphas(&self, offered: usize, explore_alpha: f64) -> Vec<f64> {
        match self.by_offer.get(offered - 1) {
            Some(stats) => stats.position_alphas(offered),
            None => offer_stats(explore_alpha).position_alphas(offered),
        }
    }

    /// Records the verified prefix of an offer of `offered` (≥ 1) drafts.
    fn record_offer(&mut self, offered: usize, outcome: &StepOutcome, explore_alpha: f64) {
        if self.by_offer.len() < offered {
            self.by_offer.resize(offered, offer_stats(explore_alpha));
        }
        // validated by the caller
        let _ = self.by_offer[offered - 1].observe(outcome);
    }

    /// Records fork `fork`'s current pooled counts (replacing its earlier entry).
    fn record(&mut self, fork: u64, successes: f64, tries: f64) {
        if let Some(entry) = self.acceptance.iter_mut().find(|(f, _, _)| *f == fork) {
            *entry = (fork, successes, tries);
            return;
        }
        self.acceptance.push_back((fork, successes, tries));
        while self.acceptance.len() > LEARNED_FORKS {
            self.acceptance.pop_front();
        }
    }
}

/// Fresh statistics of one offer length: decayed by [`OFFER_DECAY`], starting from
/// `explore_alpha` counted as two tries (kept inside (0, 1)).
fn offer_stats(explore_alpha: f64) -> AcceptanceStats {
    let mut stats = AcceptanceStats::new()
        .with_decay(OFFER_DECAY)
        .expect("a decay in (0, 1]");
    let prior = explore_alpha.clamp(PRIOR_ALPHA_MIN, 1.0 - PRIOR_ALPHA_MIN);
    stats
        .set_pooled_prior(prior, 2.0)
        .expect("a clamped acceptance and a positive count");
    stats
}

/// The chain length `k ≤ alphas.len()` with the highest predicted rate
/// `E[tokens] / chain_cost(k)` under the per-position acceptances `alphas`, and that rate; `(0,
/// 1.0)` (plain decoding) when no chain beats it.
fn best_chain(alphas: &[f64], costs: &CostModel) -> (usize, f64) {
    (1..=alphas.len())
        .map(|k| (k, expected_tokens(&alphas[..k]) / costs.chain_cost(k)))
        .fold((0, 1.0), |best, candidate| match candidate.1 > best.1 {
            true => candidate,
            false => best,
        })
}

/// The acceptances a plan is made under.
#[derive(Debug, Clone, Copy)]
enum Alphas {
    /// The sequence's smoothed estimates.
    Measured,
    /// The estimates, each raised to at least this value (optimism).
    AtLeast(f64),
    /// This value at every position (what earlier sequences measured).
    Assumed(f64),
}

/// The measured mode's state (see [`CostModelPolicy`]).
#[derive(Debug, Clone)]
struct Live {
    costs: LiveCosts,
    fresh: LiveCosts,
    explore_alpha: f64,
    horizon: usize,
    generated: usize,
}

impl CostModelPolicy {
    /// A policy with measured `costs` searching `search`, fresh statistics, min gain 2%, a probe
    /// every 16 plain steps.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] if a search bound is 0.
    pub fn new(costs: CostModel, search: TreeSearch) -> Result<Self> {
        match search {
            TreeSearch::Chain { max_k } => ensure_param(max_k >= 1, "max_k", "must be at least 1")?,
            TreeSearch::Tree { max_nodes, max_depth, max_ranks } => ensure_param(
                max_nodes >= 1 && max_depth >= 1 && max_ranks >= 1,
                "tree search",
                format!("bounds must be ≥ 1, got nodes {max_nodes}, depth {max_depth}, ranks {max_ranks}"),
            )?,
        }
        Ok(Self {
            costs,
            search,
            stats: AcceptanceStats::new(),
            fresh_stats: AcceptanceStats::new(),
            min_gain: 0.02,
            prober: Prober::new(16),
            predicted_rate: 1.0,
            replan_every: match search {
                TreeSearch::Chain { .. } => 1,
                TreeSearch::Tree { .. } => 4,
            },
            plan: None,
            since_plan: 0,
            live: None,
            learned: Arc::new(Mutex::new(Learned::default())),
            pool: Arc::new(Mutex::new(AcceptancePool::default())),
            explorer: true,
            counted: false,
            fork_id: 0,
            load: 1,
            offer: OfferStep::None,
        })
    }

    /// A policy in **measured mode** (see the type docs): costs from this sequence's timings,
    /// `draft_pass_prior_s` the drafter's one-pass time in seconds if the caller timed it (0 for
    /// drafters without a model, e.g. n-gram; `None` if unknown: then a speculative step is
    /// taken only once a probe has measured it). Starts with plain decoding; probes after 16
    /// plain steps, backing off to 256; explore α 0.8; horizon 128 tokens.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] if a search bound is 0.
    pub fn measured(search: TreeSearch, draft_pass_prior_s: Option<f64>) -> Result<Self> {
        // The placeholder model is never used: measured mode decides nothing before a plain
        // step was timed, and then replaces it.
        let placeholder = CostModel::new(CostCurve::linear(1.0)?, 1.0, 0.0)?;
        let mut policy = Self::new(placeholder, search)?;
        policy.prober = Prober::with_back_off(16, 256);
        let costs =
            LiveCosts::new(draft_pass_prior_s).per_node(matches!(search, TreeSearch::Tree { .. }));
        policy.live = Some(Live {
            fresh: costs.clone(),
            costs,
            explore_alpha: 0.8,
            horizon: 128,
            generated: 0,
        });
        Ok(policy)
    }

    /// Measured mode: the target's relative forward costs `points` = `(n, t(n) / t(1))` taken up
    /// front (e.g. by timing forwards of `n` tokens at set-up; sizes ascending from 1, up to the
    /// largest batch's largest tree). Every sequence starts from them for the sizes it has not
    /// timed itself, instead of the chord between one token and the prompt's prefill: on a CPU
    /// the first few extra tokens cost little and the chord prices them several times too high,
    /// so small budgets would never be tried and never measured. What the sequences time
    /// replaces the curve size by size. Under load they are the shape of the batch's forward
    /// curve ([`crate::policy::ForwardCurve::with_shape`]).
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] unless the sizes ascend from 1 and every
    /// ratio is finite and positive, or if the policy is not in measured mode.
    pub fn with_verify_curve(mut self, points: &[(usize, f64)]) -> Result<Self> {
        // the shape checks the points (before anything changes)
        let shaped = self.learned().forward.clone().with_shape(points)?;
        let largest = points.last().map_or(0, |&(n, _)| n);
        let mut prior: Vec<Option<f64>> = vec![None; largest];
        for &(n, ratio) in points {
            prior[n - 1] = Some(ratio);
        }
        let Some(live) = self.live.as_mut() else {
            return Err(crate::AlgorithmError::InvalidParameter {
                name: "verify_curve",
                reason: "only a policy in measured mode takes a verify-cost curve".into(),
            });
        };
        // forks take it from the shared state (`forked`); the template itself from its costs
        live.costs = live.costs.clone().with_verify_prior(prior.clone());
        let mut learned = self.learned();
        learned.verify_ratios = prior;
        learned.forward = shaped;
        drop(learned);
        Ok(self)
    }

    /// Measured mode: the acceptance assumed before any draft was verified (and as the
    /// optimistic bound when deciding whether a probe could pay), and the token horizon used
    /// when the engine does not report the tokens left.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] unless `0 ≤ explore_alpha ≤ 1` and
    /// `horizon ≥ 1`, or if the policy is not in measured mode.
    pub fn with_exploration(mut self, explore_alpha: f64, horizon: usize) -> Result<Self> {
        ensure_param(
            (0.0..=1.0).contains(&explore_alpha),
            "explore_alpha",
            format!("must be in [0, 1], got {explore_alpha}"),
        )?;
        ensure_param(horizon >= 1, "horizon", "must be at least 1")?;
        let live = self.live.as_mut();
        ensure_param(
            live.is_some(),
            "explore_alpha",
            "applies to a measured-mode policy (CostModelPolicy::measured)",
        )?;
        let live = live.expect("checked above");
        live.explore_alpha = explore_alpha;
        live.horizon = horizon;
        Ok(self)
    }

    /// Measured mode: the probe interval after stepping aside, and its back-off cap.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] if `every` is 0.
    pub fn with_probe_back_off(mut self, every: usize, max_every: usize) -> Result<Self> {
        ensure_param(every >= 1, "probe_every", "must be at least 1")?;
        self.prober = Prober::with_back_off(every, max_every);
        Ok(self)
    }

    /// The run-time cost estimates (measured mode only).
    pub fn live_costs(&self) -> Option<&LiveCosts> {
        self.live.as_ref().map(|l| &l.costs)
    }

    /// Recomputes the optimum only every `steps` speculative observations (default 1 for chains,
    /// 4 for trees, whose dynamic program costs `O(depth · ranks · nodes²)`), reusing it between.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] if `steps` is 0.
    pub fn with_replan_every(mut self, steps: usize) -> Result<Self> {
        ensure_param(steps >= 1, "replan_every", "must be at least 1")?;
        self.replan_every = steps;
        Ok(self)
    }

    /// Uses `stats` (e.g. with decay, or warm-started from a calibration run) instead of fresh
    /// statistics; [`SpeculationPolicy::fork`] copies them as the starting point too.
    pub fn with_stats(mut self, stats: AcceptanceStats) -> Self {
        self.fresh_stats = stats.clone();
        self.stats = stats;
        self.plan = None;
        self
    }

    /// Sets the margin over plain decoding required to speculate and the probe interval.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] unless `min_gain ≥ 0` and finite.
    pub fn with_min_gain(mut self, min_gain: f64, probe_every: usize) -> Result<Self> {
        ensure_param(
            min_gain >= 0.0 && min_gain.is_finite(),
            "min_gain",
            format!("must be ≥ 0, got {min_gain}"),
        )?;
        self.min_gain = min_gain;
        self.prober = Prober::new(probe_every);
        Ok(self)
    }

    /// The statistics gathered so far.
    pub fn stats(&self) -> &AcceptanceStats {
        &self.stats
    }

    /// Predicted tokens per unit cost of the budget last chosen (1 for plain decoding).
    pub fn predicted_rate(&self) -> f64 {
        self.predicted_rate
    }

    /// The optimum under the current estimates, with its predicted rate (tokens per plain-step
    /// cost), before the min-gain rule and probing.
    pub fn optimum(&self) -> (Budget, f64) {
        self.optimum_at(Alphas::Measured)
    }

    /// [`CostModelPolicy::optimum`] under the acceptances `alphas` says.
    fn optimum_at(&self, alphas: Alphas) -> (Budget, f64) {
        let raise = |measured: Vec<f64>| -> Vec<f64> {
            match alphas {
                Alphas::Measured => measured,
                Alphas::AtLeast(f) => measured.into_iter().map(|a| a.max(f)).collect(),
                Alphas::Assumed(f) => vec![f; measured.len()],
            }
        };
        match self.search {
            TreeSearch::Chain { max_k } => {
                let alphas = raise(self.stats.position_alphas(max_k));
                let (k, rate) = best_chain(&alphas, &self.costs);
                (Budget::chain(k), rate)
            }
            TreeSearch::Tree {
                max_nodes,
                max_depth,
                max_ranks,
            } => {
                let alphas = raise(self.stats.rank_alphas(max_ranks));
                let planner = SequoiaPlanner::new(&alphas, max_nodes, max_depth)
                    .expect("smoothed acceptances are probabilities");
                let (planned, rate) = planner.best_for_cost(&self.costs);
                if planned.shape.drafts() == 0 {
                    (Budget::Plain, 1.0)
                } else {
                    (Budget::Tree(Arc::new(planned.shape)), rate)
                }
            }
        }
    }
}

impl CostModelPolicy {
    /// Tokens of the largest tree the search considers (root included).
    fn max_tree_tokens(&self) -> usize {
        match self.search {
            TreeSearch::Chain { max_k } => max_k + 1,
            TreeSearch::Tree { max_nodes, .. } => max_nodes + 1,
        }
    }

    /// The costs shared by the forks (a poisoned lock still holds valid numbers).
    fn learned(&self) -> std::sync::MutexGuard<'_, Learned> {
        self.learned
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The acceptance shared by the forks of this sequence's workload (a poisoned lock still
    /// holds valid numbers).
    fn pool(&self) -> std::sync::MutexGuard<'_, AcceptancePool> {
        self.pool
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The acceptance assumed before anything was measured (measured mode; 0 otherwise).
    fn explore_alpha(&self) -> f64 {
        self.live.as_ref().map_or(0.0, |live| live.explore_alpha)
    }

    /// The measured mode's decision (see the type docs).
    fn next_measured(&mut self) -> Budget {
        if !self.counted {
            self.counted = true;
            let sequence = {
                let mut pool = self.pool();
                pool.sequences += 1;
                pool.sequences
            };
            self.explorer = (sequence - 1).is_multiple_of(EXPLORE_EVERY_FORKS);
        }
        let live = self.live.as_ref().expect("measured mode");
        // under load, a step is priced by the batch's shared forward; alone (or before the
        // forward curve can say), by this sequence's own timings
        let under_load = match self.load {
            1 => None,
            sequences => {
                let learned = self.learned();
                live.costs.cost_model_under_load(
                    sequences,
                    &learned.forward,
                    self.max_tree_tokens(),
                )
            }
        };
        let Some(model) = under_load.or_else(|| live.costs.cost_model()) else {
            // Nothing timed yet (or the draft cost is unknown): decode plainly, which measures.
            self.predicted_rate = 1.0;
            return Budget::Plain;
        };
        if let TreeSearch::Chain { max_k } = self.search {
            if model.draft_cost(max_k, max_k) <= FREE_DRAFTS_COST {
                // free drafts: ask for all of them, price the offer (`keep_drafts`)
                self.costs = model;
                self.offer = OfferStep::Asked;
                self.predicted_rate = 1.0;
                return Budget::Chain(max_k);
            }
        }
        let explore = live.explore_alpha;
        // what the earlier sequences measured: all of them (an untried sequence's assumption),
        // and all but this one (what its own tries are weighed against once it drafted)
        let (learned, others) = match self.explorer {
            true => (None, None),
            false => {
                let pool = self.pool();
                (pool.alpha(), pool.alpha_of_others(self.fork_id))
            }
        };
        let switch = live.costs.switch_cost();
        let left = live
            .costs
            .remaining_tokens()
            .unwrap_or_else(|| live.horizon.saturating_sub(live.generated))
            .max(1) as f64;
        let untried = self.stats.speculative_passes() == 0;
        match others.map(|alpha| alpha.clamp(PRIOR_ALPHA_MIN, 1.0 - PRIOR_ALPHA_MIN)) {
            Some(alpha) => {
                let set = self.stats.set_pooled_prior(alpha, LEARNED_PRIOR_TRIES);
                debug_assert!(set.is_ok(), "a clamped acceptance and a positive count");
            }
            None => self.stats.clear_pooled_prior(),
        }
        self.costs = model;
        if self.plan.is_none() || self.since_plan >= self.replan_every || untried {
            // untried: what earlier sequences measured, else the optimistic exploration value
            self.plan = Some(self.optimum_at(match (untried, learned) {
                (false, _) => Alphas::Measured,
                (true, Some(alpha)) => Alphas::Assumed(alpha),
                (true, None) => Alphas::AtLeast(explore),
            }));
            self.since_plan = 0;
        }
        let (budget, rate) = self.plan.clone().expect("planned above");
        // Worth it: beats plain by the margin, and the saving over the tokens left repays the
        // drafter's catch-up.
        let pays = |rate: f64| rate >= 1.0 + self.min_gain && left * (1.0 - 1.0 / rate) > switch;
        if !budget.is_plain() && pays(rate) {
            self.prober.restart();
            self.prober.reset_interval();
            self.predicted_rate = rate;
            return budget;
        }
        self.predicted_rate = 1.0;
        if !self.prober.probe_due() {
            return Budget::Plain;
        }
        self.prober.back_off();
        // optimism bounded by what earlier sequences measured, when they did
        let (_, optimistic) = self.optimum_at(match (learned, untried) {
            (Some(alpha), true) => Alphas::Assumed(alpha),
            (Some(alpha), false) => Alphas::AtLeast(alpha),
            (None, _) => Alphas::AtLeast(explore),
        });
        if !pays(optimistic) {
            return Budget::Plain;
        }
        match self.search {
            TreeSearch::Chain { .. } => Budget::Chain(1),
            TreeSearch::Tree { .. } => Budget::TreeNodes(1),
        }
    }
}

impl SpeculationPolicy for CostModelPolicy {
    fn name(&self) -> String {
        match self.search {
            TreeSearch::Chain { max_k } => format!("cost-model(chain K≤{max_k})"),
            TreeSearch::Tree {
                max_nodes,
                max_depth,
                ..
            } => {
                format!("cost-model(tree ≤{max_nodes} nodes, depth ≤{max_depth})")
            }
        }
    }

    fn next_budget(&mut self) -> Budget {
        self.offer = OfferStep::None;
        if self.live.is_some() {
            return self.next_measured();
        }
        if self.plan.is_none() || self.since_plan >= self.replan_every {
            self.plan = Some(self.optimum());
            self.since_plan = 0;
        }
        let (budget, rate) = self.plan.clone().expect("planned above");
        if !budget.is_plain() && rate >= 1.0 + self.min_gain {
            self.prober.restart();
            self.predicted_rate = rate;
            return budget;
        }
        self.predicted_rate = 1.0;
        if self.prober.probe_due() {
            Budget::Chain(1)
        } else {
            Budget::Plain
        }
    }

    /// A free drafter's offer of `offered` drafts: the prefix with the best predicted rate
    /// under the acceptance measured for offers of that length (see the type docs); all of
    /// them for any other drafter.
    fn keep_drafts(&mut self, offered: usize) -> usize {
        if self.offer != OfferStep::Asked || offered == 0 {
            return offered;
        }
        let explore = self.explore_alpha();
        let alphas = self.pool().offer_alphas(offered, explore);
        let best = best_chain(&alphas, &self.costs);
        let pays = |rate: f64| rate >= 1.0 + self.min_gain;
        let kept = if best.0 > 0 && pays(best.1) {
            self.prober.restart();
            self.prober.reset_interval();
            self.predicted_rate = best.1;
            best.0
        } else {
            self.predicted_rate = 1.0;
            // A refused offer is verified now and then (backing off), so that its estimate can
            // recover, where one draft could pay at the optimistic acceptance: what the
            // workload's drafts measured, when they did (no probe widens a batch's forward that
            // even that acceptance cannot repay), else the exploration value.
            let optimistic = self.pool().alpha().unwrap_or(explore);
            let could_pay = pays((1.0 + alphas[0].max(optimistic)) / self.costs.chain_cost(1));
            match could_pay && self.prober.probe_due() {
                true => {
                    self.prober.back_off();
                    1
                }
                false => 0,
            }
        };
        self.offer = OfferStep::Priced { offered, kept };
        kept
    }

    fn observe(&mut self, outcome: &StepOutcome) {
        // Invalid outcomes are ignored, per the trait contract.
        if self.stats.observe(outcome).is_ok() && outcome.proposed > 0 {
            self.since_plan += 1;
            if let OfferStep::Priced { offered, kept } = self.offer {
                if kept == outcome.proposed {
                    let explore = self.explore_alpha();
                    self.pool().record_offer(offered, outcome, explore);
                }
            }
            self.offer = OfferStep::None;
        }
    }

    fn observe_measured(&mut self, outcome: &StepOutcome, timing: &StepTiming) {
        if outcome.validate().is_err() {
            return;
        }
        self.observe(outcome);
        if outcome.proposed > 0 {
            let (successes, tries) = self.stats.pooled();
            let fork = self.fork_id;
            self.pool().record(fork, successes, tries);
        }
        let Some(live) = self.live.as_mut() else {
            return;
        };
        live.costs.record(outcome, timing);
        self.learned
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .forward
            .record_step(timing);
        live.generated += outcome.accepted + 1;
        let measured = live.costs.measured_draft_pass_s();
        let ratios = live.costs.relative_target_costs();
        let mut learned = self.learned();
        if let Some(seconds) = measured {
            learned.draft_pass_s = Some(seconds);
        }
        if learned.verify_ratios.len() < ratios.len() {
            learned.verify_ratios.resize(ratios.len(), None);
        }
        for (shared, ratio) in learned.verify_ratios.iter_mut().zip(ratios) {
            if ratio.is_some() {
                *shared = ratio;
            }
        }
    }

    fn observe_load(&mut self, sequences: usize) {
        let sequences = sequences.max(1);
        if sequences != self.load {
            self.load = sequences;
            self.plan = None;
        }
    }

    fn observe_skipped(&mut self, emitted: usize, remaining_tokens: Option<usize>) {
        if let Some(live) = self.live.as_mut() {
            live.costs.skip(emitted, remaining_tokens);
            live.generated += emitted;
        }
    }

    fn fork(&self) -> Box<dyn SpeculationPolicy> {
        Box::new(self.forked())
    }

    fn fork_for_new_workload(&self) -> Box<dyn SpeculationPolicy> {
        Box::new(self.forked_for_new_workload())
    }
}

impl CostModelPolicy {
    /// [`SpeculationPolicy::fork`], typed: a fresh sequence's policy sharing what this one's
    /// forks learned.
    pub fn forked(&self) -> CostModelPolicy {
        let mut fresh = self.clone();
        let (forks, draft_pass_s, verify_ratios) = {
            let mut learned = self.learned();
            learned.forks += 1;
            (
                learned.forks,
                learned.draft_pass_s,
                learned.verify_ratios.clone(),
            )
        };
        fresh.counted = false;
        fresh.fork_id = forks;
        fresh.stats = self.fresh_stats.clone();
        fresh.prober.restart();
        fresh.predicted_rate = 1.0;
        fresh.plan = None;
        fresh.since_plan = 0;
        fresh.prober.reset_interval();
        if let Some(live) = fresh.live.as_mut() {
            let costs = live.fresh.clone().with_verify_prior(verify_ratios);
            live.costs = match draft_pass_s {
                Some(seconds) => costs.with_draft_pass_prior(seconds),
                None => costs,
            };
            live.generated = 0;
        }
        fresh
    }

    /// [`SpeculationPolicy::fork_for_new_workload`], typed: a fork that shares what the forks
    /// measured of the costs, with an acceptance pool of its own (its first sequence explores,
    /// as the first of all did).
    pub fn forked_for_new_workload(&self) -> CostModelPolicy {
        let mut fresh = self.forked();
        fresh.pool = Arc::new(Mutex::new(AcceptancePool::default()));
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_rng::SplitMix;
    use crate::policy::{expected_tokens_constant, CostCurve};

    /// One step's decision as the engine makes it: the budget, then for a chain the drafts
    /// kept of all it allowed (the simulated drafter offers the whole budget).
    fn decide(policy: &mut dyn SpeculationPolicy) -> Budget {
        match policy.next_budget() {
            Budget::Chain(k) => Budget::chain(policy.keep_drafts(k)),
            other => other,
        }
    }

    /// The mean drafts per step a measured chain policy (free drafts, α = 0.7) takes over the
    /// last 150 of 300 steps when `sequences(step)` share each forward of a CPU-like target:
    /// flat up to 4 tokens, then 2.5 ms a token (the engine's timings: the shared forward, each
    /// sequence's share, one prefill).
    fn mean_k_under_load(sequences: impl Fn(usize) -> usize) -> f64 {
        let forward = |tokens: usize| 0.010 + 0.0025 * tokens.saturating_sub(4) as f64;
        let mut policy =
            CostModelPolicy::measured(TreeSearch::Chain { max_k: 6 }, Some(0.0)).unwrap();
        let mut rng = SplitMix::new(5);
        let mut drafts = Vec::new();
        for step in 0..300 {
            let batch = sequences(step);
            policy.observe_load(batch);
            let k = decide(&mut policy).max_drafts();
            let tokens = batch * (k + 1);
            let outcome = match k {
                0 => StepOutcome::plain(),
                k => StepOutcome::chain(k, rng.chain_accepted(k, 0.7)).unwrap(),
            };
            let mut timing = StepTiming {
                draft_passes: k,
                target_s: forward(tokens) / batch as f64,
                forward_tokens: tokens,
                forward_s: forward(tokens),
                remaining_tokens: Some(10_000),
                ..StepTiming::default()
            };
            if step == 0 {
                timing.prefill_tokens = 99;
                timing.prefill_s = forward(99);
                timing.prefill_forwards = 1;
            }
            policy.observe_measured(&outcome, &timing);
            drafts.push(k);
        }
        drafts[150..].iter().sum::<usize>() as f64 / 150.0
    }

    #[test]
    fn under_load_the_budget_shrinks_and_switches_off_where_the_forward_stops_being_flat() {
        let alone = mean_k_under_load(|_| 1);
        let pair = mean_k_under_load(|_| 2);
        // alone K = 3 is free (4 tokens); two sequences pay for a fifth token on
        assert!(alone >= 2.5, "alone: K = {alone}");
        assert!(
            pair < alone - 0.5 && pair >= 0.5,
            "two: K = {pair}, alone {alone}"
        );
        // a sequence that started alone and is joined by 15 others: sixteen pay ≈ 2× a plain
        // step for a single draft, which α = 0.7 does not repay. Its own timings still say
        // K = 3 is free (its plain step was timed alone); the batch's forward curve says not.
        let joined = mean_k_under_load(|step| if step < 150 { 1 } else { 16 });
        assert!(joined <= 0.1, "joined by 15: K = {joined}");
        // and back alone, it speculates again
        let left = mean_k_under_load(|step| if step < 100 { 16 } else { 1 });
        assert!(left >= 2.5, "left alone: K = {left}");
    }

    #[test]
    fn under_load_a_cheap_prompt_prefill_does_not_make_drafts_look_cheap() {
        // A CPU-like batch: every decoded token costs 1.4 ms more (compute-bound at 8
        // sequences), while one sequence's 99-token prompt is prefilled at 0.5 ms a token.
        let decode = |tokens: usize| 0.002 + 0.0014 * tokens as f64;
        let mut policy =
            CostModelPolicy::measured(TreeSearch::Chain { max_k: 4 }, Some(0.0)).unwrap();
        policy.observe_load(8);
        let step = |tokens: usize| StepTiming {
            target_s: decode(tokens) / 8.0,
            forward_tokens: tokens,
            forward_s: decode(tokens),
            remaining_tokens: Some(10_000),
            ..StepTiming::default()
        };
        let first = StepTiming {
            prefill_tokens: 99,
            prefill_s: 99.0 * 0.0005,
            prefill_forwards: 1,
            ..step(8)
        };
        policy.observe_measured(&StepOutcome::plain(), &first);
        // one draft, accepted, in a forward of 9 tokens; then plain steps
        policy.observe_measured(&StepOutcome::chain(1, 1).unwrap(), &step(9));
        for _ in 0..4 {
            policy.observe_measured(&StepOutcome::plain(), &step(8));
        }
        // a draft of k costs c(8 (k + 1)) / c(8) ≈ 1.85 k + 1: no acceptance below ≈ 0.85
        // repays it; priced along the prefill's 0.5 ms a token it looked 1.3× for k = 1
        let curve = policy.learned().forward.clone();
        let c16 = curve.seconds(16).unwrap() / curve.seconds(8).unwrap();
        assert!(
            (c16 - decode(16) / decode(8)).abs() < 1e-9,
            "c(16) / c(8) = {c16}"
        );
        for _ in 0..20 {
            assert_eq!(decide(&mut policy), Budget::Plain);
            policy.observe_measured(&StepOutcome::plain(), &step(8));
        }
    }

    #[test]
    fn under_load_the_shape_timed_at_set_up_prices_drafts_where_stale_live_sizes_would_not() {
        // A CPU-like target: flat to 4 tokens, then 1.3 ms a token (SmolLM2 on this host).
        let cpu = |n: usize| 0.004 + 0.0013 * n.saturating_sub(4) as f64;
        let shape: Vec<(usize, f64)> = [1, 2, 3, 4, 5, 8, 12, 18, 27, 40]
            .iter()
            .map(|&n| (n, cpu(n) / cpu(1)))
            .collect();
        // What a served batch of 8 measured (bench serve, SmolLM2): its contexts grew while
        // the other sizes went stale, so 8 tokens now look dearer than 9.
        let step = |tokens: usize, seconds: f64| StepTiming {
            target_s: seconds / 8.0,
            forward_tokens: tokens,
            forward_s: seconds,
            remaining_tokens: Some(10_000),
            ..StepTiming::default()
        };
        let serve = |mut policy: CostModelPolicy| {
            policy.observe_load(8);
            policy.observe_measured(&StepOutcome::plain(), &step(1, 0.00418));
            for _ in 0..6 {
                policy.observe_measured(&StepOutcome::chain(1, 1).unwrap(), &step(9, 0.01114));
            }
            policy.observe_measured(&StepOutcome::chain(1, 1).unwrap(), &step(14, 0.01753));
            for _ in 0..9 {
                policy.observe_measured(&StepOutcome::plain(), &step(8, 0.01567));
            }
            (0..20)
                .map(|_| {
                    let budget = decide(&mut policy);
                    policy.observe_measured(&StepOutcome::plain(), &step(8, 0.01567));
                    budget
                })
                .collect::<Vec<_>>()
        };
        // With the shape, one draft costs c(16) / c(8) ≈ 2.1 plain steps: nothing pays.
        let shaped = chain_policy(4, 0.0).with_verify_curve(&shape).unwrap();
        let budgets = serve(shaped);
        assert!(budgets.iter().all(Budget::is_plain), "{budgets:?}");
        // From the live medians alone (9 tokens cheaper than 8), c(16) / c(8) ≈ 1.3 and the
        // well-accepted chain looks worth it.
        let budgets = serve(chain_policy(4, 0.0));
        assert!(!budgets[0].is_plain(), "{budgets:?}");
    }

    fn warm(alpha: f64, k: usize, steps: usize) -> AcceptanceStats {
        let mut rng = SplitMix::new(9);
        let mut stats = AcceptanceStats::new();
        for _ in 0..steps {
            stats
                .observe(&StepOutcome::chain(k, rng.chain_accepted(k, alpha)).unwrap())
                .unwrap();
        }
        stats
    }

    #[test]
    fn chain_optimum_matches_brute_force_on_the_closed_form() {
        // With exact constant α the policy's choice must equal argmax over the closed form.
        let costs = CostModel::new(CostCurve::linear(0.1).unwrap(), 0.05, 0.0).unwrap();
        for &alpha in &[0.5, 0.8, 0.95] {
            let policy = CostModelPolicy::new(costs.clone(), TreeSearch::Chain { max_k: 12 })
                .unwrap()
                .with_stats(warm(alpha, 12, 20_000));
            let (budget, _) = policy.optimum();
            let brute = (0..=12)
                .map(|k| (k, expected_tokens_constant(alpha, k) / costs.chain_cost(k)))
                .fold((0, 0.0), |b, c| if c.1 > b.1 { c } else { b });
            let chosen = budget.max_drafts() as i64;
            assert!(
                (chosen - brute.0 as i64).abs() <= 1,
                "α={alpha}: {chosen} vs {}",
                brute.0
            );
            let chosen_rate = expected_tokens_constant(alpha, chosen as usize)
                / costs.chain_cost(chosen as usize);
            assert!(chosen_rate >= 0.98 * brute.1, "α={alpha}");
        }
    }

    #[test]
    fn alpha_one_gives_longest_chain_when_verification_is_free() {
        let costs = CostModel::new(CostCurve::linear(0.0).unwrap(), 0.0, 0.0).unwrap();
        let mut policy = CostModelPolicy::new(costs, TreeSearch::Chain { max_k: 8 })
            .unwrap()
            .with_stats(warm(1.0, 8, 500));
        assert_eq!(policy.next_budget(), Budget::Chain(8));
        assert!((policy.predicted_rate() - 9.0).abs() < 0.1);
    }

    #[test]
    fn falls_back_to_plain_and_probes_when_nothing_pays() {
        // CPU-like: verifying K+1 tokens costs K+1, the draft 0.6 per token: nothing pays.
        let costs = CostModel::new(CostCurve::linear(1.0).unwrap(), 0.6, 0.0).unwrap();
        let mut policy = CostModelPolicy::new(costs, TreeSearch::Chain { max_k: 8 })
            .unwrap()
            .with_min_gain(0.02, 3)
            .unwrap();
        let budgets: Vec<Budget> = (0..8)
            .map(|_| {
                let b = policy.next_budget();
                policy.observe(&StepOutcome::plain());
                b
            })
            .collect();
        assert_eq!(
            budgets.iter().filter(|b| **b == Budget::Chain(1)).count(),
            2
        );
        assert!(budgets
            .iter()
            .all(|b| matches!(b, Budget::Plain | Budget::Chain(1))));
    }

    #[test]
    fn cheap_drafts_with_costly_verification_pick_short_chains() {
        // Verify curve measured on a CPU: nearly linear; n-gram drafts are free.
        let verify =
            CostCurve::from_measurements(&[(1, 10.0), (2, 13.0), (4, 19.0), (8, 31.0)]).unwrap();
        let costs = CostModel::new(verify, 0.0, 0.0).unwrap();
        let policy = CostModelPolicy::new(costs.clone(), TreeSearch::Chain { max_k: 8 })
            .unwrap()
            .with_stats(warm(0.6, 8, 5000));
        let (budget, rate) = policy.optimum();
        let k = budget.max_drafts();
        assert!((1..=3).contains(&k), "{k}");
        assert!(rate > 1.02);
        // Low acceptance under the same costs: plain decoding.
        let low = CostModelPolicy::new(costs, TreeSearch::Chain { max_k: 8 })
            .unwrap()
            .with_stats(warm(0.2, 8, 5000));
        assert_eq!(low.optimum().0, Budget::Plain);
    }

    #[test]
    fn replans_on_schedule() {
        let costs = CostModel::new(CostCurve::linear(0.0).unwrap(), 0.1, 0.0).unwrap();
        let mut policy = CostModelPolicy::new(costs, TreeSearch::Chain { max_k: 6 })
            .unwrap()
            .with_replan_every(3)
            .unwrap();
        assert!(CostModelPolicy::new(
            CostModel::new(CostCurve::linear(0.0).unwrap(), 0.0, 0.0).unwrap(),
            TreeSearch::Chain { max_k: 6 }
        )
        .unwrap()
        .with_replan_every(0)
        .is_err());
        let first = policy.next_budget();
        assert_eq!(
            first,
            Budget::Chain(2),
            "prior α̂ = 0.5 everywhere, draft cost 0.1 per pass"
        );
        // Two rejections: the plan is kept until the third observation.
        for _ in 0..2 {
            policy.observe(&StepOutcome::chain(2, 0).unwrap());
            assert_eq!(policy.next_budget(), first);
        }
        policy.observe(&StepOutcome::chain(2, 0).unwrap());
        assert_ne!(policy.next_budget(), first);
    }

    #[test]
    fn tree_search_picks_a_tree_when_verification_is_cheap() {
        let costs = CostModel::new(CostCurve::linear(0.02).unwrap(), 0.1, 0.0).unwrap();
        let mut policy = CostModelPolicy::new(
            costs,
            TreeSearch::Tree {
                max_nodes: 24,
                max_depth: 6,
                max_ranks: 4,
            },
        )
        .unwrap();
        // Observe trees where rank 0 is accepted 60%, rank 1 40% of its tries.
        let shape = crate::trees::TreeShape::k_ary(2, 1);
        let mut rng = SplitMix::new(1);
        for _ in 0..2000 {
            let path = if rng.uniform() < 0.6 {
                vec![0, 1]
            } else if rng.uniform() < 0.4 {
                vec![0, 2]
            } else {
                vec![0]
            };
            policy.observe(&StepOutcome::tree(&shape, &path).unwrap());
        }
        let r0 = policy.stats().rank_alpha_raw(0).unwrap();
        let r1 = policy.stats().rank_alpha_raw(1).unwrap();
        assert!(
            (r0 - 0.6).abs() < 0.03 && (r1 - 0.4).abs() < 0.04,
            "{r0} {r1}"
        );
        match policy.next_budget() {
            Budget::Tree(shape) => {
                assert!(
                    shape.drafts() >= 3 && shape.topology().children(0).len() >= 2,
                    "{shape:?}"
                )
            }
            other => panic!("expected a tree, got {other:?}"),
        }
        assert!(policy.predicted_rate() > 1.5);
    }

    /// A simulated sequence for measured mode: plain step `t1` seconds, a forward over `n`
    /// tokens `t1 · verify(n)`, a draft pass `d · t1`, catch-up `c · t1` per missed token,
    /// conditional acceptance `alpha`; prompt of 100 tokens whose prefill follows `verify`.
    struct Sim {
        t1: f64,
        d: f64,
        c: f64,
        alpha: f64,
        verify: fn(usize) -> f64,
        unsynced: usize,
        rng: SplitMix,
        time: f64,
        tokens: usize,
    }

    impl Sim {
        fn new(d: f64, c: f64, alpha: f64, verify: fn(usize) -> f64) -> Self {
            Self {
                t1: 0.01,
                d,
                c,
                alpha,
                verify,
                unsynced: 100,
                rng: SplitMix::new(3),
                time: 0.0,
                tokens: 0,
            }
        }

        /// Runs `steps` steps; returns the budgets chosen.
        fn run(
            &mut self,
            policy: &mut dyn SpeculationPolicy,
            steps: usize,
            max_tokens: usize,
        ) -> Vec<Budget> {
            let mut budgets = Vec::new();
            for step in 0..steps {
                let budget = decide(policy);
                let k = budget.max_drafts();
                let (outcome, mut timing) = if k == 0 {
                    self.unsynced += 1;
                    (
                        StepOutcome::plain(),
                        StepTiming {
                            target_s: self.t1,
                            ..StepTiming::default()
                        },
                    )
                } else {
                    let accepted = self.rng.chain_accepted(k, self.alpha);
                    let catch_up = if self.unsynced > 2 {
                        self.unsynced as f64 * self.c
                    } else {
                        0.0
                    };
                    self.unsynced = 1;
                    (
                        StepOutcome::chain(k, accepted).unwrap(),
                        StepTiming {
                            draft_passes: k,
                            draft_s: self.t1 * (k as f64 * self.d + catch_up),
                            target_s: self.t1 * (self.verify)(k + 1),
                            ..StepTiming::default()
                        },
                    )
                };
                if step == 0 {
                    timing.prefill_tokens = 99;
                    timing.prefill_s = self.t1 * (self.verify)(99);
                }
                self.tokens += outcome.accepted + 1;
                timing.remaining_tokens = Some(max_tokens.saturating_sub(self.tokens));
                self.time += timing.draft_s + timing.target_s;
                policy.observe_measured(&outcome, &timing);
                budgets.push(budget);
            }
            budgets
        }
    }

    fn cpu_verify(n: usize) -> f64 {
        1.0 + 0.3 * (n as f64 - 1.0)
    }

    /// A CPU-like curve with a knee: nearly flat up to 4 tokens, then steep (the prefill chord
    /// overstates the small sizes several times over).
    fn knee_verify(n: usize) -> f64 {
        let n = n as f64;
        if n <= 4.0 {
            1.0 + 0.05 * (n - 1.0)
        } else {
            1.15 + 0.5 * (n - 4.0)
        }
    }

    #[test]
    fn later_sequences_start_from_the_verify_costs_earlier_ones_measured() {
        let sim = || Sim::new(0.1, 0.0, 0.6, knee_verify);
        let template = chain_policy(3, 0.1);
        let mut first = template.fork();
        sim().run(first.as_mut(), 300, 10_000);
        // What the first sequence measured is shared as t(n) / t(1) (the simulation's curve).
        let ratios = template.learned().verify_ratios.clone();
        assert!(ratios.len() >= 2 && ratios[0] == Some(1.0), "{ratios:?}");
        for (i, ratio) in ratios.iter().enumerate() {
            if let Some(r) = ratio {
                assert!((r - knee_verify(i + 1)).abs() < 1e-12, "n = {}: {r}", i + 1);
            }
        }
        assert!(ratios[1..].iter().any(Option::is_some), "{ratios:?}");
        // A later sequence speculates right after its first plain step ...
        let mut later = template.fork();
        let budgets = sim().run(later.as_mut(), 2, 10_000);
        assert!(!budgets[1].is_plain(), "{budgets:?}");
        // ... which, with the same acceptance learned but only the prefill chord to judge the
        // verify cost by (cost(2) ≈ 1.49 instead of 1.05), it would not.
        template.learned().verify_ratios.clear();
        let mut chord_only = template.fork();
        let budgets = sim().run(chord_only.as_mut(), 2, 10_000);
        assert!(budgets.iter().all(Budget::is_plain), "{budgets:?}");
    }

    #[test]
    fn a_verify_curve_taken_up_front_is_the_first_sequences_prior() {
        let curve: Vec<(usize, f64)> = (1..=9).map(|n| (n, knee_verify(n))).collect();
        // Well-matched drafter, cheap drafts: the first sequence explores at once with the curve
        // (a chain of up to 3, cost(4) ≈ 1.15) ...
        let template = chain_policy(3, 0.1).with_verify_curve(&curve).unwrap();
        let mut first = template.fork();
        let budgets = Sim::new(0.1, 0.0, 0.9, knee_verify).run(first.as_mut(), 2, 10_000);
        assert_eq!(budgets[1], Budget::chain(3), "{budgets:?}");
        // ... and, judging the sizes by the prefill chord alone, would stop at a shorter chain.
        let mut chord_only = chain_policy(3, 0.1).fork();
        let budgets = Sim::new(0.1, 0.0, 0.9, knee_verify).run(chord_only.as_mut(), 2, 10_000);
        assert!(budgets[1].max_drafts() < 3, "{budgets:?}");
        // Bad curves and a policy that is not measured are refused.
        let refused = |points: &[(usize, f64)]| chain_policy(3, 0.1).with_verify_curve(points);
        assert!(refused(&[(1, 1.0), (2, f64::NAN)]).is_err());
        assert!(refused(&[(1, 1.0), (2, 0.0)]).is_err());
        assert!(
            refused(&[(2, 1.0), (3, 1.1)]).is_err(),
            "must start at one token"
        );
        assert!(
            refused(&[(1, 1.0), (3, 1.1), (3, 1.2)]).is_err(),
            "sizes must ascend"
        );
        let modelled = CostModelPolicy::new(
            CostModel::new(CostCurve::linear(1.0).unwrap(), 1.0, 0.0).unwrap(),
            TreeSearch::Chain { max_k: 3 },
        )
        .unwrap();
        assert!(modelled.with_verify_curve(&curve).is_err());
    }

    fn flat_verify(n: usize) -> f64 {
        1.0 + 0.01 * (n as f64 - 1.0)
    }

    fn chain_policy(max_k: usize, prior: f64) -> CostModelPolicy {
        CostModelPolicy::measured(TreeSearch::Chain { max_k }, Some(prior * 0.01)).unwrap()
    }

    #[test]
    fn measured_mode_starts_plain() {
        let mut policy = chain_policy(8, 0.0);
        assert_eq!(policy.next_budget(), Budget::Plain);
        assert!(policy.live_costs().unwrap().cost_model().is_none());
        // An unknown draft cost keeps it plain even after timing plain steps.
        let mut unknown = CostModelPolicy::measured(TreeSearch::Chain { max_k: 8 }, None).unwrap();
        let budgets = Sim::new(0.5, 0.0, 0.9, flat_verify).run(&mut unknown, 50, 1000);
        assert!(budgets.iter().all(Budget::is_plain));
    }

    #[test]
    fn draft_as_costly_as_the_target_never_speculates() {
        // Draft pass = one target step: no K can pay, whatever α; not even probes are taken.
        for alpha in [0.5, 0.95] {
            let mut policy = chain_policy(8, 1.0);
            let budgets = Sim::new(1.0, 0.3, alpha, cpu_verify).run(&mut policy, 200, 1000);
            assert!(budgets.iter().all(Budget::is_plain), "α = {alpha}");
        }
    }

    #[test]
    fn high_acceptance_and_flat_verification_pick_long_chains() {
        // Free drafts (n-gram-like), verify(K) ≈ verify(1), α = 0.97: the longest chain.
        let mut policy = chain_policy(8, 0.0);
        let mut sim = Sim::new(0.0, 0.0, 0.97, flat_verify);
        let budgets = sim.run(&mut policy, 60, 10_000);
        assert_eq!(budgets[0], Budget::Plain, "starts plain");
        assert!(
            budgets[40..].iter().all(|b| *b == Budget::Chain(8)),
            "{:?}",
            &budgets[40..]
        );
        // And it beats plain decoding in simulated time.
        assert!(sim.tokens as f64 / sim.time > 3.0 / sim.t1);
    }

    #[test]
    fn a_free_drafters_offer_is_priced_by_its_length() {
        // A lookup drafter offers 1 draft (a short match, α = 0.15) or 3 (a long one, α = 0.8),
        // alternately; a CPU-like target charges 0.3 of a plain step per extra token. One
        // draft of a short match returns 1.15 tokens for 1.3 steps, a long match's three
        // 2.95 for 1.9: the short offers are refused, the long ones verified whole.
        let mut policy = chain_policy(4, 0.0);
        let mut rng = SplitMix::new(3);
        let t1 = 0.01;
        let mut kept_of = [Vec::new(), Vec::new()];
        for step in 0..400 {
            let budget = policy.next_budget();
            let mut timing = StepTiming {
                target_s: t1,
                remaining_tokens: Some(100_000),
                ..StepTiming::default()
            };
            if step == 0 {
                timing.prefill_tokens = 99;
                timing.prefill_s = t1 * cpu_verify(99);
                policy.observe_measured(&StepOutcome::plain(), &timing);
                continue;
            }
            assert_eq!(
                budget,
                Budget::Chain(4),
                "a free drafter is asked for all it has"
            );
            let (offered, alpha) = if step % 2 == 0 { (1, 0.15) } else { (3, 0.8) };
            let kept = policy.keep_drafts(offered);
            assert!(kept <= offered);
            let outcome = match kept {
                0 => StepOutcome::plain(),
                k => StepOutcome::chain(k, rng.chain_accepted(k, alpha)).unwrap(),
            };
            timing.target_s = t1 * cpu_verify(kept + 1);
            timing.draft_passes = kept;
            policy.observe_measured(&outcome, &timing);
            if step >= 200 {
                kept_of[offered / 2].push(kept);
            }
        }
        let short_verified = kept_of[0].iter().filter(|&&k| k > 0).count();
        assert!(
            short_verified <= 3,
            "short offers verified: {:?}",
            kept_of[0]
        );
        assert!(
            kept_of[1].iter().all(|&k| k == 3),
            "long offers: {:?}",
            kept_of[1]
        );
    }

    #[test]
    fn low_acceptance_steps_aside_and_probes_rarely() {
        // Free drafts but CPU-like verification and α = 0.1: plain, with backed-off probes.
        let mut policy = chain_policy(8, 0.0);
        let mut sim = Sim::new(0.0, 0.0, 0.1, cpu_verify);
        let budgets = sim.run(&mut policy, 600, 100_000);
        let speculative: Vec<usize> = (0..budgets.len())
            .filter(|&i| !budgets[i].is_plain())
            .collect();
        let late = speculative.iter().filter(|&&i| i >= 100).count();
        assert!(late <= 3, "probes after step 100: {speculative:?}");
        assert!(speculative
            .iter()
            .filter(|&&i| i >= 100)
            .all(|&i| budgets[i] == Budget::Chain(1)));
        // Costs at most a few percent over plain decoding.
        let plain_time = sim.tokens as f64 * sim.t1;
        assert!(sim.time < 1.05 * plain_time, "{} vs {plain_time}", sim.time);
    }

    #[test]
    fn catch_up_cost_is_weighed_against_the_tokens_left() {
        // A modest gain (draft 0.3, α 0.9, CPU-like verify: rate ≈ 1.23) but a catch-up of
        // 100 prompt tokens at the target's prefill cost per token × 0.3 (≈ 9 plain steps):
        // not worth it for 40 tokens, worth it for 4000.
        let c = cpu_verify(99) / 99.0 * 0.3;
        let mut short = chain_policy(4, 0.3);
        let budgets = Sim::new(0.3, c, 0.9, cpu_verify).run(&mut short, 40, 40);
        assert!(budgets.iter().all(Budget::is_plain), "{budgets:?}");
        let mut long = chain_policy(4, 0.3);
        let budgets = Sim::new(0.3, c, 0.9, cpu_verify).run(&mut long, 40, 4000);
        assert!(budgets[1..].iter().all(|b| !b.is_plain()), "{budgets:?}");
        // Forks start over (plain first), with the same configuration.
        let mut forked = long.fork();
        assert_eq!(forked.next_budget(), Budget::Plain);
    }

    #[test]
    fn tokens_another_drafter_added_count_as_catch_up_and_tokens_left() {
        let mut policy = chain_policy(4, 0.003);
        let _ = policy.next_budget();
        let plain = StepTiming {
            target_s: 0.01,
            prefill_tokens: 9,
            prefill_s: 0.03,
            remaining_tokens: Some(50),
            ..StepTiming::default()
        };
        policy.observe_measured(&StepOutcome::chain(0, 0).unwrap(), &plain);
        let before = policy.live_costs().unwrap().unsynced_tokens();
        let switch = policy.live_costs().unwrap().switch_cost();
        policy.observe_skipped(4, Some(45));
        let live = policy.live_costs().unwrap();
        assert_eq!(live.unsynced_tokens(), before + 4);
        assert_eq!(live.remaining_tokens(), Some(45));
        assert!(
            live.switch_cost() > switch,
            "{} vs {switch}",
            live.switch_cost()
        );
        // a policy without measured costs ignores it
        let mut fixed = CostModelPolicy::new(
            CostModel::new(CostCurve::linear(0.1).unwrap(), 0.1, 0.0).unwrap(),
            TreeSearch::Chain { max_k: 2 },
        )
        .unwrap();
        fixed.observe_skipped(4, None);
        assert!(fixed.live_costs().is_none());
    }

    /// The draft-pass time the forks of `policy` have shared so far.
    fn first_costs_draft_pass(policy: &CostModelPolicy) -> f64 {
        policy
            .learned()
            .draft_pass_s
            .expect("a fork measured a draft pass")
    }

    #[test]
    fn learned_acceptance_pools_the_latest_forks() {
        let mut learned = AcceptancePool::default();
        // Fork 1: 4 tries, all rejected: too few to learn from.
        learned.record(1, 0.0, 4.0);
        assert_eq!(learned.alpha(), None);
        // Fork 2's counts grow as it drafts; its entry is replaced, not added again.
        learned.record(2, 5.0, 8.0);
        learned.record(2, 9.0, 12.0);
        assert_eq!(learned.alpha(), Some(9.0 / 16.0));
        // Only the latest LEARNED_FORKS forks count.
        for fork in 3..3 + LEARNED_FORKS as u64 {
            learned.record(fork, 1.0, 1.0);
        }
        assert_eq!(learned.acceptance.len(), LEARNED_FORKS);
        assert_eq!(learned.alpha(), Some(1.0));
    }

    #[test]
    fn one_sequence_in_eight_explores_however_many_prototypes_were_forked_between() {
        // As an engine does: the template forked into a prototype per run, the prototype forked
        // per request; only the requests ask for budgets, and every eighth of them explores.
        let template = chain_policy(4, 0.1);
        let mut explorers = Vec::new();
        for request in 0..24 {
            let prototype = template.forked();
            let mut sequence = prototype.forked();
            sequence.next_budget();
            if sequence.explorer {
                explorers.push(request);
            }
        }
        assert_eq!(explorers, vec![0, 8, 16]);
    }

    #[test]
    fn a_rejected_first_draft_does_not_switch_off_a_drafter_earlier_sequences_found_good() {
        // Draft 0.1 of a target step, CPU-like verify: at α = 0.85 chains of 2-3 pay ≈ 1.4×;
        // at the α̂ = 0.22 a uniform prior makes of one rejection, nothing pays.
        let template = chain_policy(4, 0.1);
        let (learned, forks) = learn_pool(&template, 0.85);
        assert!(forks <= 4, "the first {forks} forks learned α̂");
        assert!(learned > 0.7, "{learned}");
        // A request (not an explorer) whose drafts are all rejected: its first chain (α̂ taken
        // as learned) is rejected, yet it drafts again, as one rejection says little ...
        let mut unlucky = template.forked();
        let budgets = Sim::new(0.1, 0.0, 0.0, cpu_verify).run(&mut unlucky, 8, 10_000);
        assert!(budgets[0].is_plain(), "starts plain: {budgets:?}");
        assert!(
            !budgets[1].is_plain(),
            "drafts from the learned α̂: {budgets:?}"
        );
        assert!(
            !budgets[2].is_plain(),
            "one rejection switched it off: {budgets:?}"
        );
        // ... and steps aside after a few more.
        assert!(budgets[3..6].iter().any(Budget::is_plain), "{budgets:?}");
        assert!(budgets[6..].iter().all(Budget::is_plain), "{budgets:?}");
        // Its own tries do not count twice: the prior is the other forks' α̂, which its
        // rejections did not lower (they lowered the α̂ of all forks).
        let learned_now = template.pool();
        assert_eq!(learned_now.alpha_of_others(unlucky.fork_id), Some(learned));
        assert!(learned_now.alpha().unwrap() < learned);
    }

    /// Runs sequences forked from `prototype`, whose drafts are accepted at `alpha` (40 steps
    /// each), until its pool learned an acceptance; returns it and the sequences it took.
    fn learn_pool(prototype: &CostModelPolicy, alpha: f64) -> (f64, u64) {
        for fork in 0.. {
            if let Some(learned) = prototype.pool().alpha() {
                return (learned, fork);
            }
            assert!(fork < EXPLORE_EVERY_FORKS, "{fork} forks learned no α̂");
            let mut early = prototype.fork();
            Sim::new(0.1, 0.0, alpha, cpu_verify).run(early.as_mut(), 40, 10_000);
        }
        unreachable!("the loop returns")
    }

    /// Runs the next sequence of `prototype`'s pool that is not an explorer (one in
    /// EXPLORE_EVERY_FORKS is) at acceptance `alpha`, returning its budgets.
    fn run_next_non_explorer(prototype: &CostModelPolicy, alpha: f64, steps: usize) -> Vec<Budget> {
        for _ in 0..2 {
            let mut next = prototype.forked();
            let budgets = Sim::new(0.1, 0.0, alpha, cpu_verify).run(&mut next, steps, 10_000);
            if !next.explorer {
                return budgets;
            }
        }
        panic!("two explorers in a row")
    }

    #[test]
    fn each_workload_starts_from_the_acceptance_its_own_sequences_measured() {
        // One drafter, two workloads: chat, whose drafts are rarely accepted (α = 0.1), then
        // code, whose are (α = 0.85). Draft 0.1 of a target step, CPU-like verify.
        let template = chain_policy(4, 0.1);
        let chat = template.forked_for_new_workload();
        let code = template.forked_for_new_workload();
        assert!(
            Arc::ptr_eq(&chat.learned, &code.learned),
            "costs are shared"
        );
        assert!(!Arc::ptr_eq(&chat.pool, &code.pool), "acceptance is not");
        assert!(learn_pool(&chat, 0.1).0 < 0.5);
        // code's first sequence explores, as the first of all did, and its pool learns α̂ ...
        assert!(learn_pool(&code, 0.85).0 > 0.7);
        // ... from which its next sequences draft at once, while chat's stay plain.
        let budgets = run_next_non_explorer(&code, 0.85, 8);
        assert!(
            !budgets[1].is_plain(),
            "code drafts from code's α̂: {budgets:?}"
        );
        let budgets = run_next_non_explorer(&chat, 0.1, 200);
        assert!(budgets.iter().all(Budget::is_plain), "{budgets:?}");
        // The contrast: the same code sequence in one pool with chat starts from chat's α̂ and
        // does not draft.
        let shared = template.forked();
        learn_pool(&shared, 0.1);
        let budgets = run_next_non_explorer(&shared, 0.85, 8);
        assert!(budgets.iter().all(Budget::is_plain), "{budgets:?}");
    }

    #[test]
    fn later_sequences_start_from_the_acceptance_earlier_ones_measured() {
        // Draft 0.1, CPU-like verify, no catch-up: exploring pays at the optimistic α = 0.8,
        // not at the α = 0.1 this workload has.
        let sim = || Sim::new(0.1, 0.0, 0.1, cpu_verify);
        let template = chain_policy(4, 0.1);
        // The first sequences explore, each stepping aside after a few rejections, until
        // together they made LEARNED_MIN_TRIES tries (one request's few tries say little) ...
        let mut explored = 0;
        while template.pool().alpha().is_none() {
            let mut early = template.fork();
            let budgets = sim().run(early.as_mut(), 200, 10_000);
            assert!(!budgets[1].is_plain(), "fork {explored} explores");
            explored += 1;
            assert!(
                explored < EXPLORE_EVERY_FORKS,
                "{explored} forks did not learn α̂"
            );
        }
        assert!(explored > 1, "one sequence's tries are not enough");
        let learned = template.pool().alpha().unwrap();
        assert!(learned < 0.5, "{learned}");
        // ... then the next forks stay plain, probes included (they could not pay at α = 0.1) ...
        for _ in explored..EXPLORE_EVERY_FORKS {
            let mut later = template.fork();
            let budgets = sim().run(later.as_mut(), 200, 10_000);
            assert!(budgets.iter().all(Budget::is_plain), "{budgets:?}");
        }
        // ... until one in EXPLORE_EVERY_FORKS explores again.
        let mut explorer = template.fork();
        let budgets = sim().run(explorer.as_mut(), 3, 10_000);
        assert!(!budgets[1].is_plain(), "{budgets:?}");
        // Where earlier sequences found a high acceptance, a new one speculates at once.
        let template = chain_policy(4, 0.1);
        let mut first = template.fork();
        Sim::new(0.1, 0.0, 0.95, cpu_verify).run(first.as_mut(), 40, 10_000);
        // A new fork starts from the draft-pass time the earlier ones measured (0.1 · t1).
        let measured = first_costs_draft_pass(&template);
        assert!((measured - 0.001).abs() < 1e-12, "{measured}");
        let prior = template.forked().live_costs().unwrap().draft_pass_s();
        assert_eq!(prior, Some(measured));
        let mut second = template.fork();
        let budgets = Sim::new(0.1, 0.0, 0.95, cpu_verify).run(second.as_mut(), 3, 10_000);
        assert!(!budgets[1].is_plain(), "{budgets:?}");
    }
}
