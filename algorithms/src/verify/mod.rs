//! Verifiers: the [`Verifier`] trait, the standard verifiers, and the pairing rule.
//!
//! A verifier turns a draft tree and the target distributions on it into an accepted path and
//! the next token ([`Verdict`]). The standard ones are the kernel methods of
//! [`specdec_kernels::verification`] (one source of truth: the CPU reference); [`VerifyMethod`]
//! implements [`Verifier`] directly, so `Box::new(VerifyMethod::MultiRound)` is a verifier.
//!
//! **Pairing rule.** Every verifier declares the [`DraftKind`]s it is built for
//! ([`Verifier::draft_kinds`]); a lossless verifier is lossless exactly for those. A
//! [`PairedVerifier`] binds a verifier to one kind; [`PairedVerifier::new`] refuses a kind the
//! verifier does not declare ([`AlgorithmError::MismatchedPair`]), and verifying a tree of another
//! kind than the bound one is refused too ([`AlgorithmError::DraftKindMismatch`]).

use crate::error::{AlgorithmError, Result};
use specdec_kernels::sampling::{Decisions, Prob};
use specdec_kernels::verification::{verify_one, DraftKind, Verdict, VerifyInput, VerifyMethod};
use std::sync::Arc;

/// A verification algorithm over number type `N`.
pub trait Verifier<N: Prob>: Send + Sync {
    /// A short name for tables and errors.
    fn name(&self) -> String;

    /// True iff the emitted tokens are distributed exactly as the target's own (for the draft
    /// kinds in [`Verifier::draft_kinds`]); false for lossy verifiers (typical acceptance).
    fn lossless(&self) -> bool;

    /// The draft kinds this verifier is built for (and lossless for, when [`Verifier::lossless`]).
    fn draft_kinds(&self) -> &[DraftKind];

    /// The kernel method this verifier is, when it is one: a caller may then verify a whole
    /// batch where the target's logits live, in one batched launch (the verdicts equal
    /// [`Verifier::verify`]'s). `None` (the default): verify through [`Verifier::verify`].
    fn method(&self) -> Option<VerifyMethod> {
        None
    }

    /// Verifies one sequence, drawing every random decision from `decisions`.
    ///
    /// # Errors
    /// Invalid inputs (shapes, distributions, missing draft distributions).
    fn verify(
        &self,
        input: &VerifyInput<'_, N>,
        decisions: &mut dyn Decisions<N>,
    ) -> Result<Verdict>;
}

const ALL_KINDS: &[DraftKind] = &DraftKind::ALL;

impl<N: Prob> Verifier<N> for VerifyMethod {
    fn name(&self) -> String {
        VerifyMethod::name(self).to_string()
    }

    /// All methods but typical acceptance are lossless. Greedy is lossless with respect to greedy
    /// decoding: its output is the target's argmax path (temperature 0), whatever the tree.
    fn lossless(&self) -> bool {
        !matches!(self, VerifyMethod::Typical { .. })
    }

    fn draft_kinds(&self) -> &[DraftKind] {
        match self {
            VerifyMethod::ChainRejection | VerifyMethod::MultiRound => &[DraftKind::Iid],
            VerifyMethod::RecursiveRejection => &[DraftKind::WithoutReplacement],
            VerifyMethod::Greedy | VerifyMethod::TargetOnly | VerifyMethod::Typical { .. } => {
                ALL_KINDS
            }
        }
    }

    fn method(&self) -> Option<VerifyMethod> {
        Some(*self)
    }

    fn verify(
        &self,
        input: &VerifyInput<'_, N>,
        decisions: &mut dyn Decisions<N>,
    ) -> Result<Verdict> {
        Ok(verify_one(*self, input, decisions)?)
    }
}

/// A verifier bound to the draft kind of its drafter (see the module docs).
#[derive(Clone)]
pub struct PairedVerifier<N: Prob> {
    verifier: Arc<dyn Verifier<N>>,
    kind: DraftKind,
    forced: bool,
}

impl<N: Prob> std::fmt::Debug for PairedVerifier<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PairedVerifier")
            .field("verifier", &self.verifier.name())
            .field("kind", &self.kind)
            .field("forced", &self.forced)
            .finish()
    }
}

impl<N: Prob> PairedVerifier<N> {
    /// Binds `verifier` to trees of `kind`.
    ///
    /// # Errors
    /// [`AlgorithmError::MismatchedPair`] if `verifier` does not declare `kind`.
    pub fn new(verifier: Arc<dyn Verifier<N>>, kind: DraftKind) -> Result<Self> {
        if !verifier.draft_kinds().contains(&kind) {
            return Err(AlgorithmError::MismatchedPair {
                verifier: verifier.name(),
                kind,
                declared: verifier
                    .draft_kinds()
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok(Self {
            verifier,
            kind,
            forced: false,
        })
    }

    /// Binds `verifier` to `kind` **without** the pairing check. Only for negative controls that
    /// show what a mismatched pair does; [`PairedVerifier::is_forced`] reports it.
    pub fn forced(verifier: Arc<dyn Verifier<N>>, kind: DraftKind) -> Self {
        Self {
            verifier,
            kind,
            forced: true,
        }
    }

    /// The verifier.
    pub fn verifier(&self) -> &dyn Verifier<N> {
        self.verifier.as_ref()
    }

    /// The verifier's kernel method, when it is one ([`Verifier::method`]).
    pub fn method(&self) -> Option<VerifyMethod> {
        self.verifier.method()
    }

    /// The draft kind it is bound to.
    pub fn kind(&self) -> DraftKind {
        self.kind
    }

    /// True if built by [`PairedVerifier::forced`] for a kind the verifier does not declare.
    pub fn is_forced(&self) -> bool {
        self.forced && !self.verifier.draft_kinds().contains(&self.kind)
    }

    /// True iff the pair is lossless: a lossless verifier on a kind it declares.
    pub fn lossless(&self) -> bool {
        self.verifier.lossless() && self.verifier.draft_kinds().contains(&self.kind)
    }

    /// Checks that trees of kind `found` (a drafter's) may be verified by this pair.
    ///
    /// # Errors
    /// [`AlgorithmError::DraftKindMismatch`] naming both kinds.
    pub fn check_kind(&self, found: DraftKind) -> Result<()> {
        if found == self.kind {
            return Ok(());
        }
        Err(AlgorithmError::DraftKindMismatch {
            verifier: self.verifier.name(),
            expected: self.kind,
            found,
        })
    }

    /// Verifies one sequence.
    ///
    /// # Errors
    /// [`AlgorithmError::DraftKindMismatch`] if the tree is not of the bound kind; the
    /// verifier's own errors.
    pub fn verify(
        &self,
        input: &VerifyInput<'_, N>,
        decisions: &mut dyn Decisions<N>,
    ) -> Result<Verdict> {
        self.check_kind(input.tree.kind())?;
        self.verifier.verify(input, decisions)
    }

    /// Verifies a batch, one verdict per input in order.
    ///
    /// # Errors
    /// The first failing input's error.
    pub fn verify_batch(
        &self,
        inputs: &[VerifyInput<'_, N>],
        decisions: &mut dyn Decisions<N>,
    ) -> Result<Vec<Verdict>> {
        inputs.iter().map(|i| self.verify(i, decisions)).collect()
    }
}

/// The standard lossless verifiers with the kinds they are paired with, for tables and tests:
/// greedy (every kind), chain (iid), SpecInfer (iid), recursive (without replacement),
/// target-only (every kind).
pub fn standard_pairs<N: Prob + 'static>() -> Vec<PairedVerifier<N>> {
    let methods = [
        VerifyMethod::Greedy,
        VerifyMethod::ChainRejection,
        VerifyMethod::MultiRound,
        VerifyMethod::RecursiveRejection,
        VerifyMethod::TargetOnly,
    ];
    let mut pairs = Vec::new();
    for method in methods {
        let verifier: Arc<dyn Verifier<N>> = Arc::new(method);
        for &kind in Verifier::<N>::draft_kinds(&method) {
            pairs.push(PairedVerifier::new(verifier.clone(), kind).expect("declared kind"));
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;
    use specdec_kernels::sampling::Replay;
    use specdec_kernels::verification::DraftTree;
    use specdec_kernels::TreeTopology;

    fn method(m: VerifyMethod) -> Arc<dyn Verifier<f64>> {
        Arc::new(m)
    }

    #[test]
    fn mismatched_pairs_are_refused_with_a_clear_error() {
        let err = PairedVerifier::new(method(VerifyMethod::MultiRound), DraftKind::Deterministic)
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("multi_round") && text.contains("deterministic"),
            "{text}"
        );
        assert!(
            PairedVerifier::new(method(VerifyMethod::RecursiveRejection), DraftKind::Iid).is_err()
        );
        assert!(
            PairedVerifier::new(method(VerifyMethod::TargetOnly), DraftKind::Deterministic).is_ok()
        );
        let forced =
            PairedVerifier::forced(method(VerifyMethod::MultiRound), DraftKind::Deterministic);
        assert!(forced.is_forced() && !forced.lossless());
        let typical = PairedVerifier::new(
            method(VerifyMethod::Typical {
                epsilon: 0.3,
                delta: 0.09,
            }),
            DraftKind::Iid,
        )
        .unwrap();
        assert!(!typical.lossless());
    }

    #[test]
    fn a_tree_of_another_kind_is_refused() {
        let pair =
            PairedVerifier::new(method(VerifyMethod::ChainRejection), DraftKind::Iid).unwrap();
        let tree = DraftTree::new(
            TreeTopology::chain(2),
            vec![0, 1],
            vec![None, None],
            DraftKind::Deterministic,
        )
        .unwrap();
        let p = vec![vec![0.5, 0.5]; 2];
        let input = VerifyInput {
            sequence: 0,
            step: 0,
            tree: &tree,
            target_probs: &p,
        };
        let err = pair.verify(&input, &mut Replay::production(1)).unwrap_err();
        assert!(
            matches!(err, AlgorithmError::DraftKindMismatch { .. }),
            "{err}"
        );
    }

    #[test]
    fn standard_pairs_cover_every_declared_kind() {
        let pairs = standard_pairs::<f64>();
        assert_eq!(pairs.len(), 3 + 1 + 1 + 1 + 3);
        assert!(pairs.iter().all(|p| p.lossless() && !p.is_forced()));
    }
}
