//! [`ShapeDrafter`]: fills a tree shape (static choices, k-ary, Sequoia) from a draft model.

use std::sync::Arc;

use specdec_kernels::sampling::{Decisions, DrawKey, Prob, Purpose};
use specdec_kernels::verification::{DraftKind, DraftTree};

use crate::drafters::{ranked_tokens, DraftModel, DraftRequest, Drafter, TreeBuilder};
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
        let shape = self.shape_for(request.budget)?;
        let topology = shape.topology();
        let mut tree = TreeBuilder::new(request.root()?);
        // Builder node of each shape node (None: dropped).
        let mut placed: Vec<Option<usize>> = vec![None; shape.len()];
        placed[0] = Some(0);
        // One depth at a time: the placed nodes of this depth that have children, whose
        // distributions the model gives in one call.
        let mut depth_nodes = vec![0usize];
        while !depth_nodes.is_empty() {
            let expand: Vec<(usize, usize)> = depth_nodes
                .iter()
                .filter(|&&node| !topology.children(node).is_empty())
                .filter_map(|&node| placed[node].map(|at| (node, at)))
                .collect();
            if expand.is_empty() {
                break;
            }
            let paths: Vec<Vec<u32>> = expand.iter().map(|&(_, at)| tree.path_tokens(at)).collect();
            let level_q = self
                .model
                .next_probs_paths(request.sequence, request.context, &paths)?;
            depth_nodes.clear();
            for ((node, at), q) in expand.into_iter().zip(level_q) {
                let children = topology.children(node);
                depth_nodes.extend_from_slice(children);
                match self.fill {
                    TreeFill::TopRanked => {
                        let mut ordered: Vec<usize> = children.to_vec();
                        ordered.sort_by_key(|&c| shape.rank(c));
                        let ranks = ordered.last().map_or(0, |&c| shape.rank(c) + 1);
                        let ranked = ranked_tokens(&q, ranks);
                        for child in ordered {
                            if let Some(&token) = ranked.get(shape.rank(child)) {
                                if q[token as usize].is_positive() {
                                    placed[child] = Some(tree.push(at, token));
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
                            if self.fill == TreeFill::WithoutReplacement {
                                weights[token] = N::zero();
                            }
                            placed[child] = Some(tree.push(at, token as u32));
                        }
                    }
                }
                tree.set_draft_probs(at, q);
            }
        }
        tree.finish(self.kind())
    }
}
