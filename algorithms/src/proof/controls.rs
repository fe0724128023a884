//! Negative controls: deliberately broken chain verifiers that *claim* to be lossless.
//!
//! A checker that cannot fail proves nothing. Each [`ChainFlaw`] is one plausible mistake in
//! chain speculative sampling; [`BrokenChain`] is the chain verifier with that mistake, declared
//! lossless for i.i.d. chains so that the pairing rule lets it through. The proof machinery must
//! show each one changes the output distribution (see [`super::matrix::standard_cases`]).
//! (Dropping the bonus token is wasteful but not lossy, so it is not a control.)

use crate::error::Result;
use crate::verify::Verifier;
use specdec_kernels::sampling::{residual, sample_bonus, sample_or, Decisions, Prob, Purpose};
use specdec_kernels::verification::{walk_tree, DraftKind, Verdict, VerifyInput};
use specdec_kernels::KernelError;

/// One deliberate mistake in chain rejection sampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainFlaw {
    /// On rejection, resample from `p` instead of the residual `max(0, p − q)`.
    NoResidual,
    /// The residual with its arguments swapped: `max(0, q − p)`.
    SwappedResidual,
    /// Half-converted to deterministic drafts: accept with probability `p(x)` (as if `q` were
    /// one-hot at the draft) but take the residual from the true `q`, `max(0, p − q)`.
    OneHotAcceptance,
    /// Drafts treated as one-hot (as if deterministic) while they were sampled from `q`: accept
    /// with probability `p(x)`, residual `max(0, p − onehot(x))`. **Not a flaw after all**: this
    /// is target-only sampling in disguise (`P(y) = q(y)p(y) + Σ_{x≠y} q(x)(1 − p(x))
    /// p(y)/(1 − p(x)) = p(y)`), and the enumeration shows it lossless. Kept as a lossless row,
    /// not a control.
    OneHotDrafts,
    /// The bonus token drawn from the draft distribution `q` at the leaf instead of `p`.
    BonusFromDraft,
}

impl ChainFlaw {
    /// All flaws.
    pub const ALL: [ChainFlaw; 5] = [
        ChainFlaw::NoResidual,
        ChainFlaw::SwappedResidual,
        ChainFlaw::OneHotAcceptance,
        ChainFlaw::OneHotDrafts,
        ChainFlaw::BonusFromDraft,
    ];

    /// True for the variants that really change the distribution (all but
    /// [`ChainFlaw::OneHotDrafts`]).
    pub fn is_lossy(self) -> bool {
        self != ChainFlaw::OneHotDrafts
    }

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            ChainFlaw::NoResidual => "broken: no residual",
            ChainFlaw::SwappedResidual => "broken: residual q-p",
            ChainFlaw::OneHotAcceptance => "broken: one-hot accept",
            ChainFlaw::OneHotDrafts => "one-hot q on sampled drafts",
            ChainFlaw::BonusFromDraft => "broken: bonus from q",
        }
    }
}

/// Chain rejection sampling with a [`ChainFlaw`]; claims `lossless() == true` for i.i.d. chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokenChain(pub ChainFlaw);

fn missing_q(node: usize) -> KernelError {
    KernelError::InvalidDraftTree {
        reason: format!("the broken chain verifier needs q at node {node}"),
    }
}

impl<N: Prob> Verifier<N> for BrokenChain {
    fn name(&self) -> String {
        self.0.name().to_string()
    }

    fn lossless(&self) -> bool {
        true
    }

    fn draft_kinds(&self) -> &[DraftKind] {
        &[DraftKind::Iid]
    }

    fn verify(
        &self,
        input: &VerifyInput<'_, N>,
        decisions: &mut dyn Decisions<N>,
    ) -> Result<Verdict> {
        input.validate()?;
        let tree = input.tree;
        let flaw = self.0;
        let mut error = None;
        let verdict = walk_tree(|node| {
            let p = &input.target_probs[node];
            let q = tree.draft_probs(node);
            let Some(&child) = tree.topology().children(node).first() else {
                let key = input.key(node, Purpose::Bonus);
                let bonus = match (flaw, q) {
                    (ChainFlaw::BonusFromDraft, Some(q)) => sample_bonus(decisions, key, q),
                    (ChainFlaw::BonusFromDraft, None) => {
                        error = Some(missing_q(node));
                        0
                    }
                    _ => sample_bonus(decisions, key, p),
                };
                return Err(bonus as u32);
            };
            let Some(q) = q else {
                error = Some(missing_q(node));
                return Err(0);
            };
            let x = tree.token(child) as usize;
            let one_hot: Vec<N> = (0..p.len())
                .map(|t| if t == x { N::one() } else { N::zero() })
                .collect();
            let proposal = if flaw == ChainFlaw::OneHotDrafts {
                &one_hot[..]
            } else {
                q
            };
            let one_hot_accept =
                matches!(flaw, ChainFlaw::OneHotDrafts | ChainFlaw::OneHotAcceptance);
            let accept_q = if one_hot_accept { &one_hot[x] } else { &q[x] };
            if decisions.accept(input.key(child, Purpose::Accept), &p[x], accept_q) {
                return Ok(child);
            }
            let weights = match flaw {
                ChainFlaw::NoResidual => p.clone(),
                ChainFlaw::SwappedResidual => residual(q, p),
                _ => residual(p, proposal),
            };
            Err(sample_or(decisions, input.key(node, Purpose::Residual), &weights, p) as u32)
        });
        match error {
            Some(e) => Err(e.into()),
            None => Ok(verdict),
        }
    }
}
