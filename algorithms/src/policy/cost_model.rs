//! [`CostModelPolicy`]: pick the budget that maximises expected tokens per unit of cost.

use std::sync::Arc;

use crate::error::{ensure_param, Result};
use crate::policy::{
    expected_tokens, AcceptanceStats, Budget, CostModel, Prober, SpeculationPolicy, StepOutcome,
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
        })
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
        match self.search {
            TreeSearch::Chain { max_k } => {
                let alphas = self.stats.position_alphas(max_k);
                let mut best = (0, 1.0);
                for k in 1..=max_k {
                    let rate = expected_tokens(&alphas[..k]) / self.costs.chain_cost(k);
                    if rate > best.1 {
                        best = (k, rate);
                    }
                }
                (Budget::chain(best.0), best.1)
            }
            TreeSearch::Tree {
                max_nodes,
                max_depth,
                max_ranks,
            } => {
                let alphas = self.stats.rank_alphas(max_ranks);
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

    fn observe(&mut self, outcome: &StepOutcome) {
        // Invalid outcomes are ignored, per the trait contract.
        if self.stats.observe(outcome).is_ok() && outcome.proposed > 0 {
            self.since_plan += 1;
        }
    }

    fn fork(&self) -> Box<dyn SpeculationPolicy> {
        let mut fresh = self.clone();
        fresh.stats = self.fresh_stats.clone();
        fresh.prober.restart();
        fresh.predicted_rate = 1.0;
        fresh.plan = None;
        fresh.since_plan = 0;
        Box::new(fresh)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_rng::SplitMix;
    use crate::policy::{expected_tokens_constant, CostCurve};

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
}
