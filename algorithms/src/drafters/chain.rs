//! [`ChainDrafter`]: K tokens from a draft model, one after another.

use specdec_kernels::sampling::{argmax, Decisions, DrawKey, Prob, Purpose};
use specdec_kernels::verification::{DraftKind, DraftTree};

use crate::drafters::{
    check_distinct, propose_alone, DraftModel, DraftRequest, Drafter, TreeBuilder,
};
use crate::error::{ensure_param, Result};

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
/// chain stops early if `q` has no mass, or, with a minimum confidence
/// ([`ChainDrafter::with_min_confidence`]), once the chain has become too unlikely.
///
/// # Stopping by confidence (dynamic K within a step)
/// The chain's *confidence* is the draft's own probability of the whole chain so far,
/// `q(x₁)·q(x₂ | x₁)···q(x_j | x_<j)`: an estimate of the chance that every draft is accepted
/// (EAGLE-2 ranks its tree's nodes by the same product). With a minimum `h`, the drafter draws
/// `x_{j+1}` only while some token could keep the chain at `h`, that is while
/// `confidence · max q(· | x_≤j) ≥ h`. So a step drafts deeply where the draft is sure, stops
/// after one or two tokens where it is not, and drafts nothing (a plain step, one target token
/// for the price of one) where the draft doubts even its first token, within the budget's K.
///
/// The rule decides whether to draw `x_{j+1}` from the tokens already drawn and the shape of
/// `q`, never from the token it would draw: a sampled token that takes the confidence below `h`
/// stays in the chain (and ends it, as no later token could lift it back). So every drafted
/// token is distributed exactly as `q` given its prefix, and chain rejection stays lossless (a
/// stopping time of the drafting process; proven by enumeration in
/// `algorithms/tests/compositions.rs`). At T = 0 the argmax is the best token, so the chain is
/// the longest greedy prefix whose confidence is at least `h`. Dropping a *sampled* crossing
/// token instead would keep `x_j` only when `q(x_j)` was large, drafting from a `q` biased
/// towards its top tokens while verifying with the true `q`: a distribution change the same
/// tests catch as a negative control.
pub struct ChainDrafter<M> {
    model: M,
    mode: ChainMode,
    min_confidence: Option<f64>,
}

impl<M> ChainDrafter<M> {
    /// A chain drafter over `model`, drafting the whole budget.
    pub fn new(model: M, mode: ChainMode) -> Self {
        Self {
            model,
            mode,
            min_confidence: None,
        }
    }

    /// The same drafter drawing a token only while the chain's confidence (the product of `q`
    /// at its drafts) can stay at `min_confidence` (see the type docs).
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] (named `min_confidence`) unless
    /// `0 < min_confidence ≤ 1`.
    pub fn with_min_confidence(mut self, min_confidence: f64) -> Result<Self> {
        ensure_param(
            min_confidence > 0.0 && min_confidence <= 1.0,
            "min_confidence",
            format!("must be in (0, 1], got {min_confidence}"),
        )?;
        self.min_confidence = Some(min_confidence);
        Ok(self)
    }

    /// The draft model.
    pub fn model_mut(&mut self) -> &mut M {
        &mut self.model
    }
}

impl<N: Prob, M: DraftModel<N>> Drafter<N> for ChainDrafter<M> {
    fn name(&self) -> String {
        let mode = match self.mode {
            ChainMode::Sample => "sample",
            ChainMode::Argmax => "argmax",
        };
        match self.min_confidence {
            None => format!("chain({mode})"),
            Some(h) => format!("chain({mode}, min_confidence {h})"),
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
    /// the chains still growing (a chain stops at its budget, where `q` has no mass, or below
    /// the minimum confidence).
    fn propose_batch(
        &mut self,
        requests: &[DraftRequest<'_>],
        decisions: &mut dyn Decisions<N>,
    ) -> Result<Vec<DraftTree<N>>> {
        check_distinct(requests.iter().map(|r| r.sequence))?;
        let min_confidence = self.min_confidence.map(N::from_f64);
        let mut chains = requests
            .iter()
            .map(|request| {
                Ok(Growing {
                    tree: TreeBuilder::new(request.root()?),
                    tokens: request.context.to_vec(),
                    node: 0,
                    open: true,
                    confidence: N::one(),
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
                // `q`'s best token, where the argmax draw or the confidence check needs it
                let best = (self.mode == ChainMode::Argmax || min_confidence.is_some())
                    .then(|| argmax(&q));
                if let (Some(h), Some(best)) = (&min_confidence, best) {
                    // before the draw, from `q` alone: not even its best token (if any) keeps
                    // the chain at `h`
                    if q.is_empty() || chain.confidence.clone() * q[best].clone() < *h {
                        chain.open = false;
                        continue;
                    }
                }
                let token = match self.mode {
                    ChainMode::Argmax => best,
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
                // the chain's probability under the draft, x_j included: decides whether x_{j+1}
                // is drawn, never whether x_j stays (see the type docs); below `h` no later
                // token can pass the check above, so the chain ends without asking the model
                chain.confidence = chain.confidence.clone() * q[token].clone();
                if let Some(h) = &min_confidence {
                    chain.open = chain.confidence >= *h;
                }
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
/// node the next draft hangs from, whether it still grows, and its confidence (the product of
/// `q` at its drafts).
struct Growing<N> {
    tree: TreeBuilder<N>,
    tokens: Vec<u32>,
    node: usize,
    open: bool,
    confidence: N,
}
