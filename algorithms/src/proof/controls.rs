//! Negative controls: deliberately broken chain verifiers that *claim* to be lossless.
//!
//! A checker that cannot fail proves nothing. Each [`ChainFlaw`] is one plausible mistake in
//! chain speculative sampling; [`BrokenChain`] is the chain verifier with that mistake, declared
//! lossless for i.i.d. chains so that the pairing rule lets it through. The proof machinery must
//! show each one changes the output distribution (see `standard_controls` in [`super::matrix`]).
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
    /// Drafts treated as one-hot (as if deterministic) while they were sampled from `q`:
    /// accept with probability `p(x)`, residual `max(0, p − onehot(x))`.
    OneHotDrafts,
    /// The bonus token drawn from the draft distribution `q` at the leaf instead of `p`.
    BonusFromDraft,
}

impl ChainFlaw {
    /// All flaws.
    pub const ALL: [ChainFlaw; 4] = [
        ChainFlaw::NoResidual,
        ChainFlaw::SwappedResidual,
        ChainFlaw::OneHotDrafts,
        ChainFlaw::BonusFromDraft,
    ];

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            ChainFlaw::NoResidual => "broken: no residual",
            ChainFlaw::SwappedResidual => "broken: residual q-p",
            ChainFlaw::OneHotDrafts => "broken: one-hot drafts",
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
            let proposal = if flaw == ChainFlaw::OneHotDrafts { &one_hot[..] } else { q };
            if decisions.accept(input.key(child, Purpose::Accept), &p[x], &proposal[x]) {
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
