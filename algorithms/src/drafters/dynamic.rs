//! [`DynamicTreeDrafter`]: EAGLE-2-style dynamic draft trees.

use specdec_kernels::sampling::{Decisions, Prob};
use specdec_kernels::verification::{DraftKind, DraftTree};

use crate::drafters::{ranked_tokens, DraftModel, DraftRequest, Drafter, TreeBuilder};
use crate::error::{ensure_param, Result};

/// Grows a tree by **cumulative draft probability** (the product of `q` along a node's path, an
/// estimate of the chance the path is accepted) and keeps the best `N` nodes (EAGLE-2):
///
/// 1. layer 0 is the root; for depth `1..=max_depth`, the `expand_top` highest-scoring nodes of
///    the previous layer are expanded, each with its `branch` most probable tokens of `q` (zero-
///    probability tokens excluded) as candidates of score `score(parent) · q(token)`;
/// 2. of all candidates, the `N = budget.max_drafts()` highest-scoring are kept (ties to the
///    earlier candidate). A child never outscores its parent and comes after it, so the kept set
///    contains every kept node's ancestors.
///
/// Deterministic ([`DraftKind::Deterministic`]); `q` is recorded at every kept expanded node.
pub struct DynamicTreeDrafter<M> {
    model: M,
    max_depth: usize,
    expand_top: usize,
    branch: usize,
}

impl<M> DynamicTreeDrafter<M> {
    /// The draft model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// A dynamic-tree drafter.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] if a parameter is 0.
    pub fn new(model: M, max_depth: usize, expand_top: usize, branch: usize) -> Result<Self> {
        ensure_param(max_depth >= 1, "max_depth", "must be at least 1")?;
        ensure_param(expand_top >= 1, "expand_top", "must be at least 1")?;
        ensure_param(branch >= 1, "branch", "must be at least 1")?;
        Ok(Self {
            model,
            max_depth,
            expand_top,
            branch,
        })
    }
}

struct Candidate<N> {
    parent: usize,
    token: u32,
    score: N,
}

/// Indices of `items` ordered by decreasing score, ties to the lower index.
fn by_score<N: Prob>(indices: &[usize], score: impl Fn(usize) -> N) -> Vec<usize> {
    let mut sorted = indices.to_vec();
    sorted.sort_by(|&a, &b| {
        score(b)
            .partial_cmp(&score(a))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    sorted
}

impl<N: Prob, M: DraftModel<N>> Drafter<N> for DynamicTreeDrafter<M> {
    fn name(&self) -> String {
        format!(
            "dynamic-tree(depth {}, expand {}, branch {})",
            self.max_depth, self.expand_top, self.branch
        )
    }

    fn kind(&self) -> DraftKind {
        DraftKind::Deterministic
    }

    feedback_to_model!(model);

    fn propose(
        &mut self,
        request: &DraftRequest<'_>,
        _decisions: &mut dyn Decisions<N>,
    ) -> Result<DraftTree<N>> {
        let root = request.root()?;
        let budget = request.budget.max_drafts();
        // Candidate 0 is the root.
        let mut cands = vec![Candidate {
            parent: usize::MAX,
            token: root,
            score: N::one(),
        }];
        let mut probs: Vec<Option<Vec<N>>> = vec![None];
        let mut layer = vec![0usize];
        let path_of = |cands: &[Candidate<N>], mut c: usize| {
            let mut path = Vec::new();
            while c != 0 {
                path.push(cands[c].token);
                c = cands[c].parent;
            }
            path.reverse();
            path
        };
        for _depth in 0..self.max_depth {
            if budget == 0 {
                break;
            }
            let expand: Vec<usize> = by_score(&layer, |c| cands[c].score.clone())
                .into_iter()
                .take(self.expand_top)
                .collect();
            // the layer's distributions in one call (one pass of a tree-forwarding model)
            let paths: Vec<Vec<u32>> = expand.iter().map(|&c| path_of(&cands, c)).collect();
            let layer_q = self
                .model
                .next_probs_paths(request.sequence, request.context, &paths)?;
            let mut next = Vec::new();
            for (c, q) in expand.into_iter().zip(layer_q) {
                for token in ranked_tokens(&q, self.branch) {
                    let p = q[token as usize].clone();
                    if !p.is_positive() {
                        break;
                    }
                    let score = cands[c].score.clone() * p;
                    cands.push(Candidate {
                        parent: c,
                        token,
                        score,
                    });
                    probs.push(None);
                    next.push(cands.len() - 1);
                }
                probs[c] = Some(q);
            }
            if next.is_empty() {
                break;
            }
            layer = next;
        }
        let all: Vec<usize> = (1..cands.len()).collect();
        let mut kept: Vec<usize> = by_score(&all, |c| cands[c].score.clone())
            .into_iter()
            .take(budget)
            .collect();
        kept.sort_unstable();
        let mut tree = TreeBuilder::new(root);
        let mut placed = vec![None; cands.len()];
        placed[0] = Some(0);
        for &c in &kept {
            let parent = placed[cands[c].parent].expect("kept nodes' ancestors are kept");
            placed[c] = Some(tree.push(parent, cands[c].token));
        }
        for (c, q) in probs.into_iter().enumerate() {
            if let (Some(node), Some(q)) = (placed[c], q) {
                tree.set_draft_probs(node, q);
            }
        }
        tree.finish(self.kind())
    }
}
