//! [`ChainDrafter`]: K tokens from a draft model, one after another.

use specdec_kernels::sampling::{argmax, Decisions, DrawKey, Prob, Purpose};
use specdec_kernels::verification::{DraftKind, DraftTree};

use crate::drafters::{DraftModel, DraftRequest, Drafter, TreeBuilder};
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
        let mut tree = TreeBuilder::new(request.root()?);
        let mut tokens = request.context.to_vec();
        let mut node = 0;
        for _ in 0..request.budget.max_drafts() {
            let q = self.model.next_probs(request.sequence, &tokens)?;
            let token = match self.mode {
                ChainMode::Argmax => argmax(&q),
                ChainMode::Sample => {
                    let key =
                        DrawKey::new(request.sequence, request.step, tree.len(), Purpose::Draft);
                    match decisions.categorical(key, &q) {
                        Some(t) => t,
                        None => break,
                    }
                }
            } as u32;
            tree.set_draft_probs(node, q);
            node = tree.push(node, token);
            tokens.push(token);
        }
        tree.finish(self.kind())
    }
}
