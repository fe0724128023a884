//! Tree drafts in simulation: an injected acceptance process for draft trees (α by depth and by
//! sibling rank), exact expected accepted lengths, per-step random "worlds" shared by every tree
//! shape (common random numbers), and an EAGLE-2-style dynamic tree built from a world's node
//! probabilities.
//!
//! **Model.** A node at depth `d` (the root's children are depth 1) that is its parent's rank-`r`
//! candidate is accepted, given its parent was accepted and every present lower-rank sibling was
//! rejected, with probability `p(node)`. Over steps `p(node)` has mean `α(d, r)`; with a
//! concentration κ it varies from step to step as Beta(κα, κ(1 − α)) (some contexts are easy,
//! some hard), independently across nodes; without one it is always `α(d, r)`. Verification walks
//! from the root: the children present are tried in rank order and the first accepted one is
//! descended into. The accepted length is the depth reached; τ = accepted length + 1.
//!
//! The dynamic tree sees the world's `p` (a perfectly calibrated draft confidence, the premise of
//! EAGLE-2's expansion by cumulative draft probability) and keeps the `nodes` candidates of
//! highest path probability; static trees (chain, k-ary, Sequoia) do not see it. With κ = None
//! every step's world is the mean, so the dynamic tree is the best-first static tree.

use serde::{Deserialize, Serialize};
use specdec_algorithms::trees::TreeShape;

use super::{CostCurve, CostModel, SplitMix64};
use crate::error::{HarnessError, Result};

/// Acceptance of draft-tree nodes by depth and sibling rank (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TreeAcceptance {
    /// `by_depth[d - 1][r]`: mean acceptance α(d, r) of a rank-`r` candidate at depth `d`, given
    /// its parent accepted and its present lower-rank siblings rejected. Depths beyond the list
    /// use its last row; ranks beyond a row are never accepted (α = 0). At least one row, each
    /// entry in [0, 1].
    pub by_depth: Vec<Vec<f64>>,
    /// Beta concentration κ > 0 of the per-step node probabilities; `None`: no per-step
    /// variation.
    #[serde(default)]
    pub concentration: Option<f64>,
}

impl TreeAcceptance {
    /// Builds and validates an acceptance table.
    ///
    /// # Errors
    /// [`HarnessError::Simulation`] for no rows, an entry outside [0, 1], or κ ≤ 0.
    pub fn new(by_depth: Vec<Vec<f64>>, concentration: Option<f64>) -> Result<Self> {
        let t = TreeAcceptance {
            by_depth,
            concentration,
        };
        t.validate()?;
        Ok(t)
    }

    /// Checks the table (see [`TreeAcceptance::new`]).
    ///
    /// # Errors
    /// As [`TreeAcceptance::new`].
    pub fn validate(&self) -> Result<()> {
        if self.by_depth.is_empty() {
            return Err(HarnessError::Simulation(
                "tree acceptance needs at least one depth row".into(),
            ));
        }
        for (d, row) in self.by_depth.iter().enumerate() {
            if let Some(a) = row.iter().find(|a| !(0.0..=1.0).contains(*a)) {
                return Err(HarnessError::Simulation(format!(
                    "tree acceptance at depth {} holds {a}, not in [0, 1]",
                    d + 1
                )));
            }
        }
        if let Some(k) = self.concentration {
            if !(k.is_finite() && k > 0.0) {
                return Err(HarnessError::Simulation(format!(
                    "tree acceptance concentration {k} must be > 0"
                )));
            }
        }
        Ok(())
    }

    /// The chain process `alphas` (α by depth, rank 0 only) as a tree table: only rank-0
    /// candidates are ever accepted, so a chain behaves exactly as in the chain simulator.
    pub fn chain(alphas: &[f64]) -> Result<Self> {
        Self::new(alphas.iter().map(|&a| vec![a]).collect(), None)
    }

    /// Mean acceptance α(d, r) (`depth` 0 is treated as 1).
    pub fn alpha(&self, depth: usize, rank: usize) -> f64 {
        let d = (depth.max(1) - 1).min(self.by_depth.len().saturating_sub(1));
        self.by_depth
            .get(d)
            .and_then(|row| row.get(rank))
            .copied()
            .unwrap_or(0.0)
    }

    /// The pooled rank vector of depth 1 (for depth-agnostic planners such as Sequoia's DP).
    pub fn rank_vector(&self) -> Vec<f64> {
        self.by_depth[0].clone()
    }

    /// Exact expected τ = 1 + Σ over draft nodes of P(node on the accepted path) under the mean
    /// probabilities (node probabilities are independent, so per-step variation does not change
    /// it): `reach(v) = reach(parent) · Π_{present siblings s, rank(s) < rank(v)} (1 − α(s)) ·
    /// α(v)`.
    pub fn expected_tau(&self, shape: &TreeShape) -> f64 {
        let topology = shape.topology();
        let mut reach = vec![0.0f64; shape.len()];
        reach[0] = 1.0;
        let mut total = 1.0;
        for node in 1..shape.len() {
            let parent = topology.parent(node).expect("draft nodes have parents");
            let depth = topology.depth(node);
            let rank = shape.rank(node);
            let before: f64 = topology
                .children(parent)
                .iter()
                .filter(|&&s| shape.rank(s) < rank)
                .map(|&s| 1.0 - self.alpha(depth, shape.rank(s)))
                .product();
            reach[node] = reach[parent] * before * self.alpha(depth, rank);
            total += reach[node];
        }
        total
    }

    /// The world of step `step` of random stream `seed`: every node's probability and accept
    /// decision, a deterministic function of (seed, step, rank path).
    pub fn world(&self, seed: u64, step: u64) -> StepWorld<'_> {
        StepWorld {
            acceptance: self,
            key: SplitMix64::stream(seed, step).next_u64(),
        }
    }
}

const PROBABILITY_SALT: u64 = 0x005E_ED0F_9B0B_AB17;
const DECISION_SALT: u64 = 0xDEC1_510B_A5E5_0001;

/// One step's node probabilities and accept decisions (see [`TreeAcceptance::world`]). Shapes
/// evaluated on the same world see the same decision at the same rank path.
#[derive(Debug, Clone, Copy)]
pub struct StepWorld<'a> {
    acceptance: &'a TreeAcceptance,
    key: u64,
}

impl StepWorld<'_> {
    fn node_key(&self, path: &[usize]) -> u64 {
        let mut h = self.key;
        for &r in path {
            h = SplitMix64::new(h ^ (r as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64();
        }
        h
    }

    /// This step's probability that the node at rank path `path` (non-empty, from the root) is
    /// accepted given its parent was and its present lower-rank siblings were not.
    pub fn probability(&self, path: &[usize]) -> f64 {
        let Some(&rank) = path.last() else {
            return 1.0;
        };
        let a = self.acceptance.alpha(path.len(), rank);
        match self.acceptance.concentration {
            Some(k) if a > 0.0 && a < 1.0 => {
                let mut rng = SplitMix64::new(self.node_key(path) ^ PROBABILITY_SALT);
                beta(k * a, k * (1.0 - a), &mut rng)
            }
            _ => a,
        }
    }

    /// Whether the node at `path` is accepted (when tried): `u(path) < probability(path)`.
    pub fn accepts(&self, path: &[usize]) -> bool {
        SplitMix64::new(self.node_key(path) ^ DECISION_SALT).uniform() < self.probability(path)
    }
}

/// Accepted length of `shape` when `accepts(rank path)` decides each tried node: from the root,
/// the present children are tried in rank order and the first accepted one is descended into.
pub fn walk_accepted(shape: &TreeShape, mut accepts: impl FnMut(&[usize]) -> bool) -> usize {
    let topology = shape.topology();
    let mut node = 0;
    let mut path = Vec::new();
    loop {
        let mut children: Vec<usize> = topology.children(node).to_vec();
        children.sort_by_key(|&c| shape.rank(c));
        let mut next = None;
        for c in children {
            path.push(shape.rank(c));
            if accepts(&path) {
                next = Some(c);
                break;
            }
            path.pop();
        }
        match next {
            Some(c) => node = c,
            None => return path.len(),
        }
    }
}

/// Accepted length of `shape` in `world`.
pub fn accepted_length(shape: &TreeShape, world: &StepWorld<'_>) -> usize {
    walk_accepted(shape, |p| world.accepts(p))
}

/// The EAGLE-2-style dynamic tree of `world`: best-first expansion by path probability (the
/// probability a node is on the accepted path, from the world's `p`), at most `nodes` draft
/// nodes, `top_k` candidates per node (ranks contiguous from 0), depth ≤ `max_depth`.
pub fn dynamic_tree(
    world: &StepWorld<'_>,
    nodes: usize,
    top_k: usize,
    max_depth: usize,
) -> TreeShape {
    struct Candidate {
        reach: f64,
        path: Vec<usize>,
        parent_reach: f64,
        /// Π (1 − p) over the lower-rank siblings already in the tree.
        miss_before: f64,
    }
    let mut chosen: Vec<Vec<usize>> = Vec::new();
    let mut frontier = Vec::new();
    if top_k > 0 && max_depth > 0 {
        frontier.push(Candidate {
            reach: world.probability(&[0]),
            path: vec![0],
            parent_reach: 1.0,
            miss_before: 1.0,
        });
    }
    while chosen.len() < nodes && !frontier.is_empty() {
        let best = (0..frontier.len())
            .max_by(|&a, &b| {
                frontier[a]
                    .reach
                    .total_cmp(&frontier[b].reach)
                    .then(b.cmp(&a))
            })
            .expect("non-empty");
        let c = frontier.swap_remove(best);
        let p = world.probability(&c.path);
        let rank = *c.path.last().expect("draft paths are non-empty");
        if rank + 1 < top_k {
            let mut sibling = c.path.clone();
            *sibling.last_mut().expect("non-empty") = rank + 1;
            let miss = c.miss_before * (1.0 - p);
            frontier.push(Candidate {
                reach: c.parent_reach * miss * world.probability(&sibling),
                path: sibling,
                parent_reach: c.parent_reach,
                miss_before: miss,
            });
        }
        if c.path.len() < max_depth {
            let mut child = c.path.clone();
            child.push(0);
            frontier.push(Candidate {
                reach: c.reach * world.probability(&child),
                path: child,
                parent_reach: c.reach,
                miss_before: 1.0,
            });
        }
        chosen.push(c.path);
    }
    TreeShape::from_choices(&chosen).expect("best-first paths are prefix-closed")
}

/// Nodes at each depth of `shape`: entry `d` counts nodes at depth `d` (entry 0 is the root).
pub fn level_widths(shape: &TreeShape) -> Vec<usize> {
    let topology = shape.topology();
    let mut widths = vec![0usize; shape.max_depth() + 1];
    for node in 0..shape.len() {
        widths[topology.depth(node)] += 1;
    }
    widths
}

impl CostModel {
    /// One draft forward pass over `width` tokens, ms: `draft` at `width` when given, otherwise
    /// `draft_ms_per_token` scaled by the target curve's shape (`target(width) / target(1)`).
    pub fn draft_pass_ms(&self, width: usize, draft: Option<&CostCurve>) -> f64 {
        if width == 0 {
            return 0.0;
        }
        match draft {
            Some(curve) => curve.ms(width),
            None => self.draft_ms_per_token * self.target.ms(width) / self.target.ms(1),
        }
    }

    /// The cost of a step drafting `shape` level by level (one draft pass per level, over the
    /// nodes of the level above) and verifying its `len()` tokens in one target pass. A root-only
    /// shape is a plain step. For a chain of K this is [`CostModel::step`]`(K)`.
    pub fn tree_step(&self, shape: &TreeShape, draft: Option<&CostCurve>) -> super::StepCost {
        if shape.drafts() == 0 {
            return self.step(0);
        }
        let widths = level_widths(shape);
        let draft_ms: f64 = widths[..widths.len() - 1]
            .iter()
            .map(|&w| self.draft_pass_ms(w, draft))
            .sum();
        let link = self.link.as_ref().map_or(0.0, |l| l.ms(shape.drafts()));
        super::StepCost {
            draft_s: (draft_ms + link) / 1e3,
            target_s: self.target.ms(shape.len()) / 1e3,
            verify_s: self.verify_ms / 1e3,
            commit_s: self.commit_ms / 1e3,
            overhead_s: self.overhead_ms / 1e3,
        }
    }
}

/// A Gamma(shape, 1) variate (Marsaglia and Tsang 2000; shape < 1 by the boost
/// Gamma(a) = Gamma(a + 1) · U^(1/a)).
fn gamma(shape: f64, rng: &mut SplitMix64) -> f64 {
    if shape < 1.0 {
        let u = rng.uniform().max(f64::MIN_POSITIVE);
        return gamma(shape + 1.0, rng) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u = rng.uniform().max(f64::MIN_POSITIVE);
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

/// A standard normal variate (Box–Muller).
fn normal(rng: &mut SplitMix64) -> f64 {
    let u1 = 1.0 - rng.uniform();
    let u2 = rng.uniform();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// A Beta(a, b) variate, a, b > 0.
fn beta(a: f64, b: f64, rng: &mut SplitMix64) -> f64 {
    let x = gamma(a, rng);
    let y = gamma(b, rng);
    if x + y > 0.0 {
        x / (x + y)
    } else {
        a / (a + b)
    }
}

#[cfg(test)]
mod tests {
    use specdec_algorithms::trees::{expected_accepted_length, SequoiaPlanner};

    use super::super::{expected_tokens, AcceptanceProcess};
    use super::*;

    fn binary_plus() -> TreeShape {
        // root → {rank 0, rank 1}; the rank-0 child → {rank 0}.
        TreeShape::from_choices(&[vec![0], vec![1], vec![0, 0]]).unwrap()
    }

    #[test]
    fn chain_equals_the_chain_simulator_expectation() {
        let alphas = [0.9, 0.7, 0.5];
        let tree = TreeAcceptance::chain(&alphas).unwrap();
        let chain = AcceptanceProcess::ByDepth {
            alphas: alphas.to_vec(),
        };
        for k in 0..8 {
            let e = tree.expected_tau(&TreeShape::chain(k));
            assert!((e - expected_tokens(&chain, k)).abs() < 1e-12, "k {k}: {e}");
        }
        // Extra ranks never accepted under a chain table: a k-ary tree is worth its chain.
        let kary = TreeShape::k_ary(3, 3);
        assert!((tree.expected_tau(&kary) - expected_tokens(&chain, 3)).abs() < 1e-12);
    }

    #[test]
    fn tiny_tree_by_hand_and_by_enumeration() {
        let acc = TreeAcceptance::new(vec![vec![0.6, 0.5], vec![0.4]], None).unwrap();
        let shape = binary_plus();
        // 1 + 0.6 (rank 0) + 0.4 · 0.5 (rank 1 after rank 0 missed) + 0.6 · 0.4 (depth 2).
        let by_hand = 1.0 + 0.6 + 0.4 * 0.5 + 0.6 * 0.4;
        assert!((acc.expected_tau(&shape) - by_hand).abs() < 1e-12);
        // Enumerate the 2³ accept decisions of the three nodes with their probabilities.
        let paths: [&[usize]; 3] = [&[0], &[1], &[0, 0]];
        let mut e = 0.0;
        for bits in 0..8u32 {
            let on = |p: &[usize]| bits >> paths.iter().position(|q| *q == p).unwrap() & 1 == 1;
            let prob: f64 = paths
                .iter()
                .map(|p| {
                    let a = acc.alpha(p.len(), *p.last().unwrap());
                    if on(p) {
                        a
                    } else {
                        1.0 - a
                    }
                })
                .product();
            e += prob * (1 + walk_accepted(&shape, on)) as f64;
        }
        assert!((e - by_hand).abs() < 1e-12, "{e}");
    }

    #[test]
    fn one_row_agrees_with_sequoia_expected_length() {
        let ranks = [0.7, 0.3, 0.2, 0.1];
        let acc = TreeAcceptance::new(vec![ranks.to_vec()], None).unwrap();
        let planner = SequoiaPlanner::new(&ranks, 20, 8).unwrap();
        for shape in [
            TreeShape::k_ary(2, 3),
            TreeShape::from_branching(&[4, 2, 1]),
            planner.tree(20, 8).shape,
            TreeShape::from_choices(&[vec![0], vec![2]]).unwrap(),
        ] {
            let a = acc.expected_tau(&shape);
            let b = expected_accepted_length(&shape, &ranks);
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
    }

    #[test]
    fn sampled_worlds_match_the_expectation() {
        // κ = 2: strong per-step variation, the same means. 20 000 steps; τ's sd per step ≤ 1.5,
        // so the mean's sd ≤ 0.011 and 0.06 is over 5 sd.
        let acc =
            TreeAcceptance::new(vec![vec![0.7, 0.4, 0.2], vec![0.6, 0.3]], Some(2.0)).unwrap();
        let shape = TreeShape::from_branching(&[3, 2, 1]);
        let n = 20_000;
        let sum: usize = (0..n)
            .map(|s| accepted_length(&shape, &acc.world(5, s)) + 1)
            .sum();
        let tau = sum as f64 / n as f64;
        assert!((tau - acc.expected_tau(&shape)).abs() < 0.06, "{tau}");
        // Worlds repeat for a (seed, step) and differ across steps.
        let w = acc.world(5, 1);
        assert_eq!(w.probability(&[0, 1]), acc.world(5, 1).probability(&[0, 1]));
        assert_ne!(w.probability(&[0]), acc.world(5, 2).probability(&[0]));
    }

    #[test]
    fn beta_has_the_right_mean() {
        let mut rng = SplitMix64::new(9);
        for (a, b) in [(0.3, 0.7), (1.4, 0.6), (8.0, 2.0)] {
            let n = 20_000;
            let m: f64 = (0..n).map(|_| beta(a, b, &mut rng)).sum::<f64>() / n as f64;
            // sd of one draw ≤ 0.5, of the mean ≤ 0.0036; allow 5 sd.
            assert!((m - a / (a + b)).abs() < 0.018, "{a} {b}: {m}");
        }
    }

    #[test]
    fn dynamic_tree_without_variation_is_the_optimal_tree() {
        // Decreasing rank weights: best-first by path probability is optimal, so it matches the
        // Sequoia DP's value at every budget.
        let ranks = [0.75, 0.35, 0.2, 0.1];
        let acc = TreeAcceptance::new(vec![ranks.to_vec()], None).unwrap();
        let planner = SequoiaPlanner::new(&ranks, 24, 24).unwrap();
        for n in [1, 2, 4, 8, 16, 24] {
            let shape = dynamic_tree(&acc.world(0, 0), n, 4, 24);
            assert_eq!(shape.drafts(), n);
            let e = acc.expected_tau(&shape);
            let dp = planner.expected_length(n, 24);
            assert!((e - dp).abs() < 1e-9, "n {n}: {e} vs {dp}");
        }
        // A depth limit and top-k are honoured.
        let shape = dynamic_tree(&acc.world(0, 0), 30, 2, 3);
        assert!(shape.max_depth() <= 3);
        assert!((0..shape.len()).all(|v| shape.topology().children(v).len() <= 2));
    }

    #[test]
    fn tree_step_of_a_chain_is_the_chain_step() {
        let m = CostModel {
            draft_ms_per_token: 2.0,
            target: CostCurve::Points {
                tokens: vec![1, 4, 16],
                ms: vec![10.0, 16.0, 40.0],
            },
            verify_ms: 0.5,
            commit_ms: 0.25,
            overhead_ms: 1.0,
            link: None,
        };
        for k in 0..6 {
            let a = m.tree_step(&TreeShape::chain(k), None);
            assert!((a.total_s() - m.step(k).total_s()).abs() < 1e-15, "k {k}");
        }
        // 2-ary of depth 2: draft passes over 1 and 2 nodes, target over 7 tokens.
        let t = m.tree_step(&TreeShape::k_ary(2, 2), None);
        let draft = 2.0 + 2.0 * m.target.ms(2) / 10.0;
        assert!((t.draft_s - draft / 1e3).abs() < 1e-15);
        assert!((t.target_s - m.target.ms(7) / 1e3).abs() < 1e-15);
    }
}
