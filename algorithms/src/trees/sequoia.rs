//! Sequoia-style optimal static trees from a measured acceptance vector, and the hardware-aware
//! variant that weighs the measured verify-cost curve.
//!
//! **Model** (Sequoia's positional acceptance): the candidates of a node are tried in rank order;
//! the rank-`r` candidate is accepted with probability `a_r` given it is tried (all lower ranks
//! rejected), independently of everything else. A node of rank `r` is therefore the accepted
//! child of its (accepted) parent with probability `w_r = a_r · Π_{j<r} (1 − a_j)` when its
//! siblings are exactly ranks `0..`, and the expected accepted length of a tree is
//! `E = 1 + Σ_{draft nodes v} Π_{u on the path root→v, u ≠ root} w_{rank(u)}`.
//! (For shapes whose sibling ranks have gaps, [`expected_accepted_length`] lets only the siblings
//! present be tried before a node.)
//!
//! The dynamic program maximises `E` over all trees with at most `n` draft nodes (and optionally
//! at most depth `D`), where each node's children are ranks `0..m` — an optimal tree never needs
//! gaps, since a gap's candidate is drafted anyway. `G(d, m)`, the best sum below a root of a
//! subtree of `m` nodes with depth allowance `d`, splits the `m − 1` nodes among children of
//! ranks 0, 1, … in turn: `G(d, m) = H_d(0, m − 1)`, `H_d(r, b) = max(0, max_{1≤s≤b}
//! w_r (1 + G(d − 1, s)) + H_d(r + 1, b − s))`. Cost `O(D · R · n²)` for `R` ranks.

use crate::error::{ensure_param, Result};
use crate::policy::CostModel;
use crate::trees::TreeShape;

/// Expected accepted length `E = 1 + Σ_nodes P(path to node accepted)` of `shape` under the
/// positional model with acceptance vector `alphas` (rank `r` accepted given tried with
/// probability `alphas[r]`, 0 beyond the vector). The bonus token is the `1`.
pub fn expected_accepted_length(shape: &TreeShape, alphas: &[f64]) -> f64 {
    let topology = shape.topology();
    let a = |r: usize| alphas.get(r).copied().unwrap_or(0.0);
    let mut reach = vec![0.0f64; shape.len()];
    reach[0] = 1.0;
    let mut total = 1.0;
    for node in 1..shape.len() {
        let parent = topology.parent(node).expect("draft nodes have parents");
        let rank = shape.rank(node);
        let before: f64 = topology
            .children(parent)
            .iter()
            .filter(|&&s| shape.rank(s) < rank)
            .map(|&s| 1.0 - a(shape.rank(s)))
            .product();
        reach[node] = reach[parent] * before * a(rank);
        total += reach[node];
    }
    total
}

/// An optimal tree and its expected accepted length under the model.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTree {
    /// The tree (breadth-first numbering, siblings by rank).
    pub shape: TreeShape,
    /// Its expected accepted length `E` (accepted drafts + 1 per target pass).
    pub expected_length: f64,
}

/// The solved dynamic program for one acceptance vector: optimal trees for every node budget up
/// to `max_nodes` and every depth limit up to `max_depth`.
#[derive(Debug, Clone)]
pub struct SequoiaPlanner {
    /// `w[r]`: probability that the rank-r child is the accepted one.
    weights: Vec<f64>,
    max_nodes: usize,
    max_depth: usize,
    /// `g[d][m]` for subtrees of `m` nodes (root included), `m ∈ 0..=max_nodes + 1`.
    g: Vec<Vec<f64>>,
    /// `choice[d][r][b]`: nodes given to the rank-r child's subtree (0 = no rank-r child).
    choice: Vec<Vec<Vec<usize>>>,
}

impl SequoiaPlanner {
    /// Solves the DP for draft-node budgets `0..=max_nodes` and depth limits `0..=max_depth`.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] if an acceptance is outside `[0, 1]`.
    pub fn new(alphas: &[f64], max_nodes: usize, max_depth: usize) -> Result<Self> {
        for &a in alphas {
            ensure_param(
                (0.0..=1.0).contains(&a),
                "acceptance vector",
                format!("{a} is not a probability"),
            )?;
        }
        let max_depth = max_depth.min(max_nodes);
        let mut weights = Vec::with_capacity(alphas.len().min(max_nodes));
        let mut none_before = 1.0;
        for &a in alphas.iter().take(max_nodes) {
            weights.push(none_before * a);
            none_before *= 1.0 - a;
        }
        let ranks = weights.len();
        let size = max_nodes + 2;
        let mut g = vec![vec![0.0; size]];
        let mut choice = vec![vec![vec![0usize; size]; ranks]];
        for _d in 1..=max_depth {
            let below = g.last().expect("depth 0 exists");
            // h[r][b] for r = ranks (empty) down to 0.
            let mut h = vec![vec![0.0f64; size]; ranks + 1];
            let mut ch = vec![vec![0usize; size]; ranks];
            for r in (0..ranks).rev() {
                for b in 1..size {
                    let mut best = 0.0;
                    let mut best_s = 0;
                    for s in 1..=b {
                        let v = weights[r] * (1.0 + below[s]) + h[r + 1][b - s];
                        if v > best {
                            best = v;
                            best_s = s;
                        }
                    }
                    h[r][b] = best;
                    ch[r][b] = best_s;
                }
            }
            let mut gd = vec![0.0; size];
            for m in 1..size {
                gd[m] = if ranks == 0 { 0.0 } else { h[0][m - 1] };
            }
            g.push(gd);
            choice.push(ch);
        }
        Ok(Self {
            weights,
            max_nodes,
            max_depth,
            g,
            choice,
        })
    }

    /// The largest node budget solved.
    pub fn max_nodes(&self) -> usize {
        self.max_nodes
    }

    /// The largest depth limit solved (`min(max_depth, max_nodes)`).
    pub fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// Optimal expected accepted length with at most `nodes` draft nodes and depth ≤ `depth`
    /// (both clamped to the solved ranges).
    pub fn expected_length(&self, nodes: usize, depth: usize) -> f64 {
        1.0 + self.g[depth.min(self.max_depth)][nodes.min(self.max_nodes) + 1]
    }

    /// An optimal tree with at most `nodes` draft nodes and depth ≤ `depth` (clamped to the solved
    /// ranges). It may use fewer nodes when more cannot help (e.g. all acceptances 0).
    pub fn tree(&self, nodes: usize, depth: usize) -> PlannedTree {
        let nodes = nodes.min(self.max_nodes);
        let depth = depth.min(self.max_depth);
        let mut paths: Vec<Vec<usize>> = Vec::new();
        self.walk(nodes, depth, Vec::new(), |path: &Vec<usize>, rank| {
            let mut child = path.clone();
            child.push(rank);
            paths.push(child.clone());
            child
        });
        let shape =
            TreeShape::from_choices(&paths).expect("DP paths are prefix-closed and distinct");
        PlannedTree {
            shape,
            expected_length: self.expected_length(nodes, depth),
        }
    }

    /// The hardware-aware choice: over every node budget `0..=max_nodes` and depth limit, the
    /// optimal tree maximising `E / cost`, where `cost = costs.step_cost(drafts, depth)` (a plain
    /// step, `E = 1` at cost 1, is among the candidates). Returns the tree and its `E / cost`.
    pub fn best_for_cost(&self, costs: &CostModel) -> (PlannedTree, f64) {
        let mut best = ((0, 0), 1.0);
        for depth in 1..=self.max_depth {
            for nodes in 1..=self.max_nodes {
                // Skip budgets that cannot improve on a smaller one at this depth.
                if self.g[depth][nodes + 1] <= self.g[depth][nodes] {
                    continue;
                }
                let (drafts, used_depth) = self.size_and_depth(nodes, depth);
                let rate = self.expected_length(nodes, depth) / costs.step_cost(drafts, used_depth);
                if rate > best.1 {
                    best = ((nodes, depth), rate);
                }
            }
        }
        let ((nodes, depth), rate) = best;
        (self.tree(nodes, depth), rate)
    }

    /// Draft nodes and depth of [`SequoiaPlanner::tree`]`(nodes, depth)`, without building it.
    pub fn size_and_depth(&self, nodes: usize, depth: usize) -> (usize, usize) {
        let (mut drafts, mut deepest) = (0, 0);
        self.walk(nodes, depth, 0usize, |&at, _rank| {
            drafts += 1;
            deepest = deepest.max(at + 1);
            at + 1
        });
        (drafts, deepest)
    }

    /// Walks the optimal tree for `(nodes, depth)` parents first, calling `child(parent, rank)`
    /// for every draft node; `child` returns the node's own value, passed on to its children.
    fn walk<T>(&self, nodes: usize, depth: usize, root: T, mut child: impl FnMut(&T, usize) -> T) {
        let mut stack = vec![(
            depth.min(self.max_depth),
            nodes.min(self.max_nodes) + 1,
            root,
        )];
        while let Some((d, m, at)) = stack.pop() {
            if d == 0 {
                continue;
            }
            let mut budget = m - 1;
            for r in 0..self.weights.len() {
                let s = self.choice[d][r][budget];
                if s == 0 {
                    break;
                }
                stack.push((d - 1, s, child(&at, r)));
                budget -= s;
            }
        }
    }
}

/// The Sequoia-optimal tree for at most `nodes` draft nodes and depth ≤ `max_depth` under the
/// acceptance vector `alphas` (see the module docs).
///
/// # Errors
/// [`crate::AlgorithmError::InvalidParameter`] if an acceptance is outside `[0, 1]`.
pub fn sequoia_tree(alphas: &[f64], nodes: usize, max_depth: usize) -> Result<PlannedTree> {
    Ok(SequoiaPlanner::new(alphas, nodes, max_depth)?.tree(nodes, max_depth))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::CostCurve;

    /// An ordered tree: children in rank order.
    #[derive(Clone, Debug)]
    struct Plane(Vec<Plane>);

    /// All ordered trees of exactly `m` nodes.
    fn all_trees(m: usize) -> Vec<Plane> {
        if m == 1 {
            return vec![Plane(Vec::new())];
        }
        forests(m - 1).into_iter().map(Plane).collect()
    }

    /// All ordered forests of exactly `m` nodes.
    fn forests(m: usize) -> Vec<Vec<Plane>> {
        if m == 0 {
            return vec![Vec::new()];
        }
        let mut out = Vec::new();
        for first in 1..=m {
            for t in all_trees(first) {
                for rest in forests(m - first) {
                    let mut f = vec![t.clone()];
                    f.extend(rest);
                    out.push(f);
                }
            }
        }
        out
    }

    fn depth(t: &Plane) -> usize {
        t.0.iter().map(|c| 1 + depth(c)).max().unwrap_or(0)
    }

    fn to_paths(t: &Plane, prefix: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        for (r, c) in t.0.iter().enumerate() {
            prefix.push(r);
            out.push(prefix.clone());
            to_paths(c, prefix, out);
            prefix.pop();
        }
    }

    #[test]
    #[allow(clippy::needless_range_loop)] // indices are (depth, nodes) pairs
    fn dp_equals_exhaustive_search() {
        let vectors: [&[f64]; 5] = [
            &[0.7, 0.4, 0.2],
            &[0.3, 0.9, 0.5, 0.5],
            &[1.0, 0.5],
            &[0.9],
            &[0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2],
        ];
        for alphas in vectors {
            let planner = SequoiaPlanner::new(alphas, 7, 7).unwrap();
            let mut best = vec![vec![f64::NEG_INFINITY; 8]; 8]; // [depth limit][nodes]
            for m in 1..=8 {
                for t in all_trees(m) {
                    let mut paths = Vec::new();
                    to_paths(&t, &mut Vec::new(), &mut paths);
                    let shape = TreeShape::from_choices(&paths).unwrap();
                    let e = expected_accepted_length(&shape, alphas);
                    for d in depth(&t)..8 {
                        for n in (m - 1)..8 {
                            best[d][n] = best[d][n].max(e);
                        }
                    }
                }
            }
            for d in 0..8 {
                for n in 0..8 {
                    let dp = planner.expected_length(n, d);
                    assert!(
                        (dp - best[d][n]).abs() < 1e-12,
                        "{alphas:?} n={n} d={d}: {dp} vs {}",
                        best[d][n]
                    );
                    let planned = planner.tree(n, d);
                    assert!(planned.shape.drafts() <= n && planned.shape.max_depth() <= d);
                    let e = expected_accepted_length(&planned.shape, alphas);
                    assert!(
                        (e - dp).abs() < 1e-12,
                        "reconstructed tree value {e} vs {dp}"
                    );
                    assert_eq!(
                        planner.size_and_depth(n, d),
                        (planned.shape.drafts(), planned.shape.max_depth())
                    );
                }
            }
        }
    }

    #[test]
    fn known_shapes() {
        // All acceptance on rank 0: the best tree is a chain.
        let p = sequoia_tree(&[1.0, 0.0], 4, 10).unwrap();
        assert_eq!(p.shape, TreeShape::chain(4));
        assert_eq!(p.expected_length, 5.0);
        // Nothing is ever accepted: no node helps.
        let p = sequoia_tree(&[0.0], 4, 10).unwrap();
        assert_eq!(p.shape.drafts(), 0);
        assert!(sequoia_tree(&[1.5], 4, 4).is_err());
        // Gapped siblings: the rank-2 node is tried right after rank 0.
        let gapped = TreeShape::from_choices(&[vec![0], vec![2]]).unwrap();
        let e = expected_accepted_length(&gapped, &[0.5, 0.9, 0.4]);
        assert!((e - (1.0 + 0.5 + 0.5 * 0.4)).abs() < 1e-12);
    }

    #[test]
    fn hardware_aware_trades_size_for_cost() {
        let alphas = [0.8, 0.4, 0.2, 0.1];
        let planner = SequoiaPlanner::new(&alphas, 32, 8).unwrap();
        // Free verification: the biggest tree wins.
        let free = CostModel::new(CostCurve::linear(0.0).unwrap(), 0.0, 0.0).unwrap();
        let (tree, rate) = planner.best_for_cost(&free);
        assert!((rate - planner.expected_length(32, 8)).abs() < 1e-12);
        assert!(tree.shape.drafts() > 16);
        // Linear verification cost (CPU-like, slope 1) plus a costly draft: nothing pays.
        let cpu = CostModel::new(CostCurve::linear(1.0).unwrap(), 0.6, 0.0).unwrap();
        let (tree, rate) = planner.best_for_cost(&cpu);
        assert_eq!(tree.shape.drafts(), 0);
        assert_eq!(rate, 1.0);
        // Moderate slope: a small tree, better than plain and than the largest one.
        let mid = CostModel::new(CostCurve::linear(0.05).unwrap(), 0.0, 0.0).unwrap();
        let (tree, rate) = planner.best_for_cost(&mid);
        let big = planner.tree(32, 8);
        let big_rate =
            big.expected_length / mid.step_cost(big.shape.drafts(), big.shape.max_depth());
        assert!(rate > 1.0 && rate >= big_rate, "{rate} vs {big_rate}");
        assert!(tree.shape.drafts() < 32);
        // Exhaustive check of the chosen optimum over every (nodes, depth) candidate.
        for d in 0..=8 {
            for n in 0..=32 {
                let t = planner.tree(n, d);
                let r = t.expected_length / mid.step_cost(t.shape.drafts(), t.shape.max_depth());
                assert!(r <= rate + 1e-12);
            }
        }
    }
}
