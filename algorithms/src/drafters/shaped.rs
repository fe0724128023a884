//! [`ShapeDrafter`]: fills a tree shape (static choices, k-ary, Sequoia) from a draft model.

use std::sync::Arc;

use specdec_kernels::sampling::{Decisions, DrawKey, Prob, Purpose};
use specdec_kernels::verification::{DraftKind, DraftTree};

use crate::drafters::{
    check_distinct, propose_alone, ranked_tokens, DraftModel, DraftRequest, Drafter, PathsQuery,
    TreeBuilder,
};
use crate::error::Result;
use crate::policy::Budget;
use crate::trees::TreeShape;

/// How the children of an expanded node get their tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeFill {
    /// The rank-`r` child is the `r`-th most probable token of `q` (ties to the lower id; zero-
    /// probability tokens are never drafted, so nodes beyond `q`'s support are dropped with their
    /// subtrees). [`DraftKind::Deterministic`]: top-k expansion.
    TopRanked,
    /// Children drawn independently from `q`, in index order ([`DraftKind::Iid`]).
    Iid,
    /// Children drawn from `q` without replacement, in index order
    /// ([`DraftKind::WithoutReplacement`]); children beyond `q`'s support are dropped.
    WithoutReplacement,
}

/// Fills a [`TreeShape`] with tokens from a [`DraftModel`], recording `q` at every expanded
/// node: one model call per depth ([`DraftModel::next_probs_paths`] for all the nodes of that
/// depth that have children, so a model forwarding token trees drafts a depth in one pass).
///
/// Budget: [`Budget::Tree`] gives the shape; [`Budget::TreeNodes`]`(n)` and
/// [`Budget::Chain`]`(n)` use the drafter's default shape cut to its first `n` draft nodes (a
/// breadth-first prefix, so the cut stays a tree); [`Budget::Plain`] gives the root only.
/// Sampled fills key each draw by `(sequence, step, shape node, Draft)`.
pub struct ShapeDrafter<M> {
    model: M,
    fill: TreeFill,
    default_shape: Arc<TreeShape>,
}

impl<M> ShapeDrafter<M> {
    /// The draft model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// A drafter filling shapes with `fill`, using `default_shape` for node-count budgets
    /// (e.g. [`TreeShape::k_ary`] for top-k expansion, a Sequoia tree, or static choices).
    pub fn new(model: M, fill: TreeFill, default_shape: TreeShape) -> Self {
        Self {
            model,
            fill,
            default_shape: Arc::new(default_shape),
        }
    }

    fn shape_for(&self, budget: &Budget) -> Result<Arc<TreeShape>> {
        match budget {
            Budget::Tree(shape) => Ok(shape.clone()),
            other => {
                let n = other.max_drafts();
                if n >= self.default_shape.drafts() {
                    return Ok(self.default_shape.clone());
                }
                let keep = n + 1;
                let parents = &self.default_shape.topology().parents()[..keep];
                let ranks = &self.default_shape.ranks()[..keep];
                Ok(Arc::new(TreeShape::new(parents, ranks)?))
            }
        }
    }
}

impl<N: Prob, M: DraftModel<N>> Drafter<N> for ShapeDrafter<M> {
    fn name(&self) -> String {
        format!(
            "tree({:?}, default {} nodes)",
            self.fill,
            self.default_shape.drafts()
        )
    }

    fn kind(&self) -> DraftKind {
        match self.fill {
            TreeFill::TopRanked => DraftKind::Deterministic,
            TreeFill::Iid => DraftKind::Iid,
            TreeFill::WithoutReplacement => DraftKind::WithoutReplacement,
        }
    }

    feedback_to_model!(model);

    fn propose(
        &mut self,
        request: &DraftRequest<'_>,
        decisions: &mut dyn Decisions<N>,
    ) -> Result<DraftTree<N>> {
        propose_alone(self, request, decisions)
    }

    /// Depth by depth for the whole batch: one [`DraftModel::next_probs_paths_batch`] per depth
    /// over the trees with nodes left to expand.
    fn propose_batch(
        &mut self,
        requests: &[DraftRequest<'_>],
        decisions: &mut dyn Decisions<N>,
    ) -> Result<Vec<DraftTree<N>>> {
        check_distinct(requests.iter().map(|r| r.sequence))?;
        let mut trees = requests
            .iter()
            .map(|r| Ok(Filling::new(self.shape_for(r.budget)?, r.root()?)))
            .collect::<Result<Vec<Filling<N>>>>()?;
        loop {
            let paths: Vec<(usize, Vec<Vec<u32>>)> = trees
                .iter_mut()
                .enumerate()
                .filter_map(|(i, tree)| tree.next_paths().map(|paths| (i, paths)))
                .collect();
            if paths.is_empty() {
                break;
            }
            let queries: Vec<PathsQuery<'_>> = paths
                .iter()
                .map(|(i, paths)| PathsQuery {
                    sequence: requests[*i].sequence,
                    context: requests[*i].context,
                    paths,
                })
                .collect();
            let answers = self.model.next_probs_paths_batch(&queries)?;
            for ((i, _), level_q) in paths.iter().zip(answers) {
                trees[*i].absorb(level_q, self.fill, &requests[*i], decisions);
            }
        }
        let kind = Drafter::<N>::kind(self);
        trees
            .into_iter()
            .map(|tree| tree.tree.finish(kind))
            .collect()
    }
}

/// One request's tree while it is filled (see [`ShapeDrafter`]): the shape, the builder, the
/// builder node of each shape node (None: dropped), the shape nodes of the current depth, and
/// those being expanded now with their builder nodes.
struct Filling<N> {
    shape: Arc<TreeShape>,
    tree: TreeBuilder<N>,
    placed: Vec<Option<usize>>,
    depth_nodes: Vec<usize>,
    expanding: Vec<(usize, usize)>,
}

impl<N: Prob> Filling<N> {
    fn new(shape: Arc<TreeShape>, root: u32) -> Self {
        let mut placed = vec![None; shape.len()];
        placed[0] = Some(0);
        Self {
            shape,
            tree: TreeBuilder::new(root),
            placed,
            depth_nodes: vec![0],
            expanding: Vec::new(),
        }
    }

    /// The paths of this depth's placed nodes that have children (the depth's query, one
    /// model call), or None when none is left.
    fn next_paths(&mut self) -> Option<Vec<Vec<u32>>> {
        let topology = self.shape.topology();
        self.expanding = self
            .depth_nodes
            .iter()
            .filter(|&&node| !topology.children(node).is_empty())
            .filter_map(|&node| self.placed[node].map(|at| (node, at)))
            .collect();
        if self.expanding.is_empty() {
            return None;
        }
        Some(
            self.expanding
                .iter()
                .map(|&(_, at)| self.tree.path_tokens(at))
                .collect(),
        )
    }

    /// Places the children of each expanded node from its `q` (`level_q`, in the order of
    /// [`Filling::next_paths`]) as `fill` says, and records `q` there.
    fn absorb(
        &mut self,
        level_q: Vec<Vec<N>>,
        fill: TreeFill,
        request: &DraftRequest<'_>,
        decisions: &mut dyn Decisions<N>,
    ) {
        let shape = Arc::clone(&self.shape);
        let topology = shape.topology();
        self.depth_nodes.clear();
        for ((node, at), q) in std::mem::take(&mut self.expanding).into_iter().zip(level_q) {
            let children = topology.children(node);
            self.depth_nodes.extend_from_slice(children);
            match fill {
                TreeFill::TopRanked => {
                    let mut ordered: Vec<usize> = children.to_vec();
                    ordered.sort_by_key(|&c| shape.rank(c));
                    let ranks = ordered.last().map_or(0, |&c| shape.rank(c) + 1);
                    let ranked = ranked_tokens(&q, ranks);
                    for child in ordered {
                        if let Some(&token) = ranked.get(shape.rank(child)) {
                            if q[token as usize].is_positive() {
                                self.placed[child] = Some(self.tree.push(at, token));
                            }
                        }
                    }
                }
                TreeFill::Iid | TreeFill::WithoutReplacement => {
                    let mut weights = q.clone();
                    for &child in children {
                        let key =
                            DrawKey::new(request.sequence, request.step, child, Purpose::Draft);
                        let Some(token) = decisions.categorical(key, &weights) else {
                            break;
                        };
                        if fill == TreeFill::WithoutReplacement {
                            weights[token] = N::zero();
                        }
                        self.placed[child] = Some(self.tree.push(at, token as u32));
                    }
                }
            }
            self.tree.set_draft_probs(at, q);
        }
    }
}
