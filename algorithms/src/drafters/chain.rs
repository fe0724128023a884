//! [`ChainDrafter`]: K tokens from a draft model, one after another.

use specdec_kernels::sampling::{argmax, Decisions, DrawKey, Prob, Purpose};
use specdec_kernels::verification::{DraftKind, DraftTree};

use crate::drafters::{
    check_distinct, propose_alone, DraftModel, DraftRequest, Drafter, TreeBuilder,
};
use crate::error::Result;

/// How a chain drafter picks each token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainMode {
    /// Sample each token from `q` ([`DraftKind::Iid`]): pairs with lossless rejection sampling.
    Sample,
    /// Take each step's argmax of `q` (lowest id on ties; [`DraftKind::Deterministic`]).
    Argmax,
}

/// Drafts a chain of `budget.max_drafts()` tokens from a [`DraftModel`], recording `q` at every
/// node that has a child. Sampled tokens use the key `(sequence, step, new node, Draft)`. The
/// chain stops early if `q` has no mass.
pub struct ChainDrafter<M> {
    model: M,
    mode: ChainMode,
}

impl<M> ChainDrafter<M> {
    /// A chain drafter over `model`.
    pub fn new(model: M, mode: ChainMode) -> Self {
        Self { model, mode }
    }

    /// The draft model.
    pub fn model_mut(&mut self) -> &mut M {
        &mut self.model
    }
}

impl<N: Prob, M: DraftModel<N>> Drafter<N> for ChainDrafter<M> {
    fn name(&self) -> String {
        match self.mode {
            ChainMode::Sample => "chain(sample)".to_string(),
            ChainMode::Argmax => "chain(argmax)".to_string(),
        }
    }

    fn kind(&self) -> DraftKind {
        match self.mode {
            ChainMode::Sample => DraftKind::Iid,
            ChainMode::Argmax => DraftKind::Deterministic,
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

    /// Depth by depth for the whole batch: one [`DraftModel::next_probs_batch`] per depth over
    /// the chains still growing (a chain stops at its budget or where `q` has no mass).
    fn propose_batch(
        &mut self,
        requests: &[DraftRequest<'_>],
        decisions: &mut dyn Decisions<N>,
    ) -> Result<Vec<DraftTree<N>>> {
        check_distinct(requests.iter().map(|r| r.sequence))?;
        let mut chains = requests
            .iter()
            .map(|request| {
                Ok(Growing {
                    tree: TreeBuilder::new(request.root()?),
                    tokens: request.context.to_vec(),
                    node: 0,
                    open: true,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        for depth in 0.. {
            let growing: Vec<usize> = (0..chains.len())
                .filter(|&i| chains[i].open && depth < requests[i].budget.max_drafts())
                .collect();
            if growing.is_empty() {
                break;
            }
            let queries: Vec<(u64, &[u32])> = growing
                .iter()
                .map(|&i| (requests[i].sequence, chains[i].tokens.as_slice()))
                .collect();
            let rows = self.model.next_probs_batch(&queries)?;
            for (&i, q) in growing.iter().zip(rows) {
                let chain = &mut chains[i];
                let token = match self.mode {
                    ChainMode::Argmax => Some(argmax(&q)),
                    ChainMode::Sample => {
                        let request = &requests[i];
                        let key = DrawKey::new(
                            request.sequence,
                            request.step,
                            chain.tree.len(),
                            Purpose::Draft,
                        );
                        decisions.categorical(key, &q)
                    }
                };
                let Some(token) = token else {
                    chain.open = false;
                    continue;
                };
                let token = token as u32;
                chain.tree.set_draft_probs(chain.node, q);
                chain.node = chain.tree.push(chain.node, token);
                chain.tokens.push(token);
            }
        }
        let kind = Drafter::<N>::kind(self);
        chains
            .into_iter()
            .map(|chain| chain.tree.finish(kind))
            .collect()
    }
}

/// One request's chain while the batch drafts: the tree so far, its context and drafts, the
/// node the next draft hangs from, whether it still grows.
struct Growing<N> {
    tree: TreeBuilder<N>,
    tokens: Vec<u32>,
    node: usize,
    open: bool,
}
