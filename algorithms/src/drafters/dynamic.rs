//! [`DynamicTreeDrafter`]: EAGLE-2-style dynamic draft trees.

use specdec_kernels::sampling::{Decisions, Prob};
use specdec_kernels::verification::{DraftKind, DraftTree};

use crate::drafters::{
    check_distinct, propose_alone, ranked_tokens, DraftModel, DraftRequest, Drafter, PathsQuery,
    TreeBuilder,
};
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

/// One request's tree while it grows (see [`DynamicTreeDrafter`]): every candidate so far
/// (candidate 0 the root), `q` at the expanded ones, the last layer, and the nodes being
/// expanded now.
struct Growing<N> {
    root: u32,
    budget: usize,
    cands: Vec<Candidate<N>>,
    probs: Vec<Option<Vec<N>>>,
    layer: Vec<usize>,
    expanding: Vec<usize>,
    done: bool,
}

impl<N: Prob> Growing<N> {
    fn new(root: u32, budget: usize) -> Self {
        Self {
            root,
            budget,
            cands: vec![Candidate {
                parent: usize::MAX,
                token: root,
                score: N::one(),
            }],
            probs: vec![None],
            layer: vec![0],
            expanding: Vec::new(),
            done: budget == 0,
        }
    }

    /// The draft path (below the root) of candidate `c`.
    fn path_of(&self, mut c: usize) -> Vec<u32> {
        let mut path = Vec::new();
        while c != 0 {
            path.push(self.cands[c].token);
            c = self.cands[c].parent;
        }
        path.reverse();
        path
    }

    /// Picks the `expand_top` best nodes of the last layer and returns their paths: the
    /// layer's query (one model call).
    fn next_paths(&mut self, expand_top: usize) -> Vec<Vec<u32>> {
        self.expanding = by_score(&self.layer, |c| self.cands[c].score.clone())
            .into_iter()
            .take(expand_top)
            .collect();
        self.expanding.iter().map(|&c| self.path_of(c)).collect()
    }

    /// Scores the `branch` best children of each expanded node from its `q` (`layer_q`, in
    /// the order of [`Growing::next_paths`]); the tree is done when no child has mass.
    fn absorb(&mut self, layer_q: Vec<Vec<N>>, branch: usize) {
        let mut next = Vec::new();
        for (c, q) in std::mem::take(&mut self.expanding).into_iter().zip(layer_q) {
            for token in ranked_tokens(&q, branch) {
                let p = q[token as usize].clone();
                if !p.is_positive() {
                    break;
                }
                let score = self.cands[c].score.clone() * p;
                self.cands.push(Candidate {
                    parent: c,
                    token,
                    score,
                });
                self.probs.push(None);
                next.push(self.cands.len() - 1);
            }
            self.probs[c] = Some(q);
        }
        self.done = next.is_empty();
        self.layer = next;
    }

    /// The tree of the `budget` best candidates (each kept node's ancestors are kept: a child
    /// never outscores its parent and comes after it), `q` at its expanded nodes.
    fn finish(self, kind: DraftKind) -> Result<DraftTree<N>> {
        let all: Vec<usize> = (1..self.cands.len()).collect();
        let mut kept: Vec<usize> = by_score(&all, |c| self.cands[c].score.clone())
            .into_iter()
            .take(self.budget)
            .collect();
        kept.sort_unstable();
        let mut tree = TreeBuilder::new(self.root);
        let mut placed = vec![None; self.cands.len()];
        placed[0] = Some(0);
        for &c in &kept {
            let parent = placed[self.cands[c].parent].expect("kept nodes' ancestors are kept");
            placed[c] = Some(tree.push(parent, self.cands[c].token));
        }
        for (c, q) in self.probs.into_iter().enumerate() {
            if let (Some(node), Some(q)) = (placed[c], q) {
                tree.set_draft_probs(node, q);
            }
        }
        tree.finish(kind)
    }
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
        decisions: &mut dyn Decisions<N>,
    ) -> Result<DraftTree<N>> {
        propose_alone(self, request, decisions)
    }

    /// Layer by layer for the whole batch: one [`DraftModel::next_probs_paths_batch`] per depth
    /// over the trees still growing.
    fn propose_batch(
        &mut self,
        requests: &[DraftRequest<'_>],
        _decisions: &mut dyn Decisions<N>,
    ) -> Result<Vec<DraftTree<N>>> {
        check_distinct(requests.iter().map(|r| r.sequence))?;
        let mut trees = requests
            .iter()
            .map(|r| Ok(Growing::new(r.root()?, r.budget.max_drafts())))
            .collect::<Result<Vec<Growing<N>>>>()?;
        for _depth in 0..self.max_depth {
            let growing: Vec<usize> = (0..trees.len()).filter(|&i| !trees[i].done).collect();
            if growing.is_empty() {
                break;
            }
            let paths: Vec<Vec<Vec<u32>>> = growing
                .iter()
                .map(|&i| trees[i].next_paths(self.expand_top))
                .collect();
            let queries: Vec<PathsQuery<'_>> = growing
                .iter()
                .zip(&paths)
                .map(|(&i, paths)| PathsQuery {
                    sequence: requests[i].sequence,
                    context: requests[i].context,
                    paths,
                })
                .collect();
            let answers = self.model.next_probs_paths_batch(&queries)?;
            for (&i, layer_q) in growing.iter().zip(answers) {
                trees[i].absorb(layer_q, self.branch);
            }
        }
        let kind = Drafter::<N>::kind(self);
        trees.into_iter().map(|tree| tree.finish(kind)).collect()
    }
}
