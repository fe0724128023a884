//! [`StagedDrafter`]: multi-level speculation with no unchecked token forwarded.

use specdec_kernels::sampling::{Decisions, DrawKey, Prob, Purpose};
use specdec_kernels::verification::{verify_one, DraftKind, DraftTree, VerifyInput, VerifyMethod};

use crate::drafters::{DraftFeedback, DraftModel, DraftRequest, Drafter, Namespaced, TreeBuilder};
use crate::error::Result;
use crate::policy::Budget;

/// Namespace of the level-0 drafter's decisions (see [`Namespaced`]).
pub const LEVEL0_NAMESPACE: u32 = 1;
/// Namespace of level 1's verification and extension decisions.
pub const LEVEL1_NAMESPACE: u32 = 2;

/// Two-level speculation. For a budget of `K` drafts:
///
/// 1. **level 0** (any [`Drafter`], e.g. n-gram) proposes a tree within `Budget::Chain(K)`;
/// 2. **level 1** (a [`DraftModel`] with distribution `q1`) computes `q1` at every level-0 node
///    and verifies the proposal **losslessly with respect to `q1`**, with the verifier that pairs
///    with level 0's kind (deterministic → target-only, i.i.d. chain → chain rejection, i.i.d. tree
///    → multi-round, without replacement → recursive rejection). The accepted tokens plus the
///    correction/bonus token are therefore an exact draw of `q1`'s autoregressive process;
/// 3. level 1 **extends** that prefix to `K` tokens by sampling from `q1` (keys
///    `(sequence, step, node, Draft)`), or cuts it to `K`.
///
/// The result is a chain whose tokens are distributed exactly as a chain sampled from `q1`, with
/// `q1` recorded at every node: [`DraftKind::Iid`], to be verified by the target with chain
/// rejection sampling. No level-0 token reaches the target unchecked. Level 0 decides in
/// namespace [`LEVEL0_NAMESPACE`], level 1 in [`LEVEL1_NAMESPACE`], so their randomness is
/// independent of each other and of the target's verifier (namespace 0).
pub struct StagedDrafter<D, M> {
    level0: D,
    level1: M,
}

impl<D, M> StagedDrafter<D, M> {
    /// Level 0 proposes, level 1 verifies and extends.
    pub fn new(level0: D, level1: M) -> Self {
        Self { level0, level1 }
    }
}

/// The verifier lossless for a level-0 tree of `kind` (the pairing rule, level 1 side).
fn level1_method(kind: DraftKind, is_chain: bool) -> VerifyMethod {
    match kind {
        DraftKind::Deterministic => VerifyMethod::TargetOnly,
        DraftKind::Iid if is_chain => VerifyMethod::ChainRejection,
        DraftKind::Iid => VerifyMethod::MultiRound,
        DraftKind::WithoutReplacement => VerifyMethod::RecursiveRejection,
    }
}

impl<N: Prob, D: Drafter<N>, M: DraftModel<N>> Drafter<N> for StagedDrafter<D, M> {
    fn name(&self) -> String {
        format!("staged({} → level-1 model)", self.level0.name())
    }

    fn kind(&self) -> DraftKind {
        DraftKind::Iid
    }

    /// Level 0 and level 1 both hear every verdict.
    fn wants_features(&self) -> bool {
        self.level0.wants_features() || self.level1.wants_features()
    }

    fn observe(&mut self, feedback: &DraftFeedback<'_>) -> Result<()> {
        self.level0.observe(feedback)?;
        self.level1.observe(feedback)
    }

    fn release(&mut self, sequence: u64) -> Result<()> {
        self.level0.release(sequence)?;
        self.level1.release(sequence)
    }

    fn propose(
        &mut self,
        request: &DraftRequest<'_>,
        decisions: &mut dyn Decisions<N>,
    ) -> Result<DraftTree<N>> {
        let root = request.root()?;
        let k = request.budget.max_drafts();
        let mut chain = TreeBuilder::new(root);
        if k == 0 {
            return chain.finish(self.kind());
        }
        // Level 0 proposes.
        let level0_budget = Budget::chain(k);
        let level0_request = DraftRequest {
            budget: &level0_budget,
            ..*request
        };
        let proposal = self.level0.propose(
            &level0_request,
            &mut Namespaced::new(decisions, LEVEL0_NAMESPACE),
        )?;
        // Level 1 verifies it against q1.
        // q1 at every proposal node. A chain (the usual level-0 proposal) is one path: its rows
        // come from one pass of the level-1 model over it; a tree asks node by node.
        let path_tokens = |node: usize| {
            let mut tokens = request.context.to_vec();
            tokens.extend(
                proposal
                    .topology()
                    .path_to(node)
                    .iter()
                    .skip(1)
                    .map(|&n| proposal.token(n)),
            );
            tokens
        };
        let rows = if proposal.topology().is_chain() {
            let last = proposal.len() - 1;
            self.level1
                .next_probs_along(request.sequence, &path_tokens(last), proposal.len())?
        } else {
            (0..proposal.len())
                .map(|node| self.level1.next_probs(request.sequence, &path_tokens(node)))
                .collect::<Result<Vec<_>>>()?
        };
        let input = VerifyInput {
            sequence: request.sequence,
            step: request.step,
            tree: &proposal,
            target_probs: &rows,
        };
        let mut level1 = Namespaced::new(decisions, LEVEL1_NAMESPACE);
        let method = level1_method(proposal.kind(), proposal.topology().is_chain());
        let verdict = verify_one(method, &input, &mut level1)?;
        // The checked prefix: accepted tokens, then level 1's own correction/bonus token.
        let mut node = 0;
        let mut prev = 0; // proposal node whose q1 row precedes the next chain token
        for &accepted in verdict.accepted_path.iter().take(k) {
            chain.set_draft_probs(node, rows[prev].clone());
            node = chain.push(node, proposal.token(accepted));
            prev = accepted;
        }
        if chain.drafts() < k {
            chain.set_draft_probs(node, rows[prev].clone());
            node = chain.push(node, verdict.next_token);
        }
        // Level 1 extends by sampling from q1.
        let mut tokens = request.context.to_vec();
        tokens.extend(chain.path_tokens(node));
        while chain.drafts() < k {
            let q1 = self.level1.next_probs(request.sequence, &tokens)?;
            let key = DrawKey::new(request.sequence, request.step, chain.len(), Purpose::Draft);
            let Some(token) = level1.categorical(key, &q1) else {
                break;
            };
            chain.set_draft_probs(node, q1);
            node = chain.push(node, token as u32);
            tokens.push(token as u32);
        }
        chain.finish(self.kind())
    }
}
