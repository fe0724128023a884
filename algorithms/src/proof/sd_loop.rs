//! The whole speculative-decoding loop on toy models: draft → verify → bonus → next round.
//!
//! [`SpecLoop`] generates `n_tokens` tokens after a prompt. Each round the drafter proposes a tree
//! after the current context, the target's prepared distribution is computed at every node, the
//! paired verifier accepts a path and a next token, and those tokens are appended (the output is
//! cut at `n_tokens`). [`SpecLoop::exact_distribution`] enumerates every random branch of every
//! round, merging equal partial outputs between rounds, and returns the exact distribution of the
//! output; [`target_distribution`] is the target's own distribution of its next `n_tokens`
//! tokens. A lossless pair makes the two equal.

use super::distribution::Distribution;
use super::drafters::ToyDrafter;
use super::enumerate::enumerate;
use super::oracle::reference_probs;
use crate::error::{AlgorithmError, Result};
use crate::verify::PairedVerifier;
use specdec_kernels::sampling::{prepare_probs, Decisions, Mass, Prob, SamplingParams};
use specdec_kernels::verification::{Verdict, VerifyInput};
use specdec_models::toy::{ToyModel, ToyPair};

/// One toy speculative-decoding setup (see the module docs).
#[derive(Debug, Clone)]
pub struct SpecLoop<N: Prob> {
    /// Target and draft models.
    pub pair: ToyPair,
    /// The drafter.
    pub drafter: ToyDrafter,
    /// The verifier, paired with the drafter's kind.
    pub verifier: PairedVerifier<N>,
    /// Temperature / top-k / top-p, applied to target and draft alike.
    pub params: SamplingParams,
    /// The context before generation (non-empty: its last token is the first root).
    pub prompt: Vec<u32>,
    /// How many tokens to generate.
    pub n_tokens: usize,
}

/// What one round produced.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Round {
    /// The verifier's verdict.
    pub verdict: Verdict,
    /// The tokens the round emitted (accepted drafts, then the next token).
    pub emitted: Vec<u32>,
}

impl<N: Prob> SpecLoop<N> {
    /// A loop.
    ///
    /// # Errors
    /// [`AlgorithmError::DraftKindMismatch`] if the drafter's kind is not the verifier's paired
    /// kind; [`AlgorithmError::Enumeration`] for an empty prompt.
    pub fn new(
        pair: ToyPair,
        drafter: ToyDrafter,
        verifier: PairedVerifier<N>,
        params: SamplingParams,
        prompt: Vec<u32>,
        n_tokens: usize,
    ) -> Result<Self> {
        verifier.check_kind(drafter.kind())?;
        if prompt.is_empty() {
            return Err(AlgorithmError::Enumeration {
                reason: "the prompt must hold at least one token (the first root)".into(),
            });
        }
        Ok(Self {
            pair,
            drafter,
            verifier,
            params,
            prompt,
            n_tokens,
        })
    }

    /// One round after `generated` (the output so far), decisions keyed by `sequence` and `step`.
    ///
    /// # Errors
    /// Drafting, preparation or verification errors.
    pub fn round(
        &self,
        generated: &[u32],
        sequence: u64,
        step: u64,
        decisions: &mut dyn Decisions<N>,
    ) -> Result<Round> {
        let mut context = self.prompt.clone();
        context.extend_from_slice(generated);
        let tree = self.drafter.draft(
            &self.pair.draft,
            &self.params,
            &context,
            sequence,
            step,
            decisions,
        )?;
        let target_probs = (0..tree.len())
            .map(|node| {
                let mut node_context = context.clone();
                let path = tree.topology().path_to(node);
                node_context.extend(path[1..].iter().map(|&n| tree.token(n)));
                prepare_probs(
                    &self.pair.target.next_probs_as::<N>(&node_context),
                    &self.params,
                )
            })
            .collect::<specdec_kernels::Result<Vec<Vec<N>>>>()?;
        let input = VerifyInput {
            sequence,
            step,
            tree: &tree,
            target_probs: &target_probs,
        };
        let verdict = self.verifier.verify(&input, decisions)?;
        let emitted = verdict.emitted_tokens(&tree);
        Ok(Round { verdict, emitted })
    }

    /// Runs rounds until `n_tokens` are generated (with production or replay decisions).
    ///
    /// # Errors
    /// As [`SpecLoop::round`].
    pub fn generate(&self, sequence: u64, decisions: &mut dyn Decisions<N>) -> Result<Vec<u32>> {
        let mut generated = Vec::new();
        let mut step = 0;
        while generated.len() < self.n_tokens {
            let round = self.round(&generated, sequence, step, decisions)?;
            generated.extend(round.emitted);
            step += 1;
        }
        generated.truncate(self.n_tokens);
        Ok(generated)
    }

    /// The target's own distribution of the next `n_tokens` tokens with this loop's parameters.
    ///
    /// # Errors
    /// Preparation errors.
    pub fn target_distribution(&self) -> Result<Distribution<Vec<u32>, N>> {
        target_distribution(&self.pair.target, &self.params, &self.prompt, self.n_tokens)
    }
}

/// The exact enumeration, for number types the enumerator integrates exactly (rationals).
impl<N: Prob<Mass = N> + Mass> SpecLoop<N> {
    /// The exact distribution of the first `n_tokens` generated tokens (see the module docs).
    ///
    /// # Errors
    /// As [`SpecLoop::round`], or [`AlgorithmError::Enumeration`] for a case too large.
    pub fn exact_distribution(&self) -> Result<Distribution<Vec<u32>, N>> {
        let mut finished = Distribution::new();
        let mut frontier: Distribution<Vec<u32>, N> = Distribution::point(Vec::new());
        let mut step = 0;
        while !frontier.is_empty() {
            let mut next = Distribution::new();
            for (generated, prob) in frontier.iter() {
                let branches = enumerate(|e| {
                    let round = self.round(generated, 0, step, e)?;
                    let mut out = generated.clone();
                    out.extend(round.emitted);
                    out.truncate(self.n_tokens);
                    Ok(out)
                })?;
                for (out, p) in branches.iter() {
                    let mass = prob.clone() * p.clone();
                    if out.len() >= self.n_tokens {
                        finished.add(out.clone(), mass);
                    } else {
                        next.add(out.clone(), mass);
                    }
                }
            }
            frontier = next;
            step += 1;
        }
        Ok(finished)
    }

    /// The exact distribution of one round's accepted length after the prompt.
    ///
    /// # Errors
    /// As [`SpecLoop::round`].
    pub fn accepted_len_distribution(&self) -> Result<Distribution<usize, N>> {
        enumerate(|e| Ok(self.round(&[], 0, 0, e)?.verdict.accepted_len))
    }
}

/// The exact distribution of `n_tokens` tokens sampled from `model` after `prompt`, each drawn
/// from the model's row prepared with `params` by the independent oracle
/// ([`super::oracle::reference_probs`]), not by the preparation code under test.
///
/// # Errors
/// Preparation errors (e.g. an inexact temperature for rationals).
pub fn target_distribution<N: Prob>(
    model: &ToyModel,
    params: &SamplingParams,
    prompt: &[u32],
    n_tokens: usize,
) -> Result<Distribution<Vec<u32>, N>> {
    let mut dist: Distribution<Vec<u32>, N> = Distribution::point(Vec::new());
    for _ in 0..n_tokens {
        let mut next = Distribution::new();
        for (seq, prob) in dist.iter() {
            let mut context = prompt.to_vec();
            context.extend_from_slice(seq);
            let probs = reference_probs(&model.next_probs_as::<N>(&context), params)?;
            for (token, p) in probs.into_iter().enumerate() {
                let mut longer = seq.clone();
                longer.push(token as u32);
                next.add(longer, prob.clone() * p);
            }
        }
        dist = next;
    }
    Ok(dist)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::Verifier;
    use specdec_kernels::sampling::BigRational;
    use specdec_kernels::verification::VerifyMethod;
    use specdec_models::toy::ToyStyle;
    use std::sync::Arc;

    fn spec_loop(
        method: VerifyMethod,
        drafter: ToyDrafter,
        params: SamplingParams,
        order: usize,
    ) -> SpecLoop<BigRational> {
        let pair = ToyPair::seeded(3, 3, order, ToyStyle::default()).unwrap();
        let verifier: Arc<dyn Verifier<BigRational>> = Arc::new(method);
        let paired = PairedVerifier::new(verifier, drafter.kind()).unwrap();
        SpecLoop::new(pair, drafter, paired, params, vec![0, 1], 3).unwrap()
    }

    #[test]
    fn chain_rejection_sampling_preserves_the_target_exactly() {
        let l = spec_loop(
            VerifyMethod::ChainRejection,
            ToyDrafter::Chain { k: 2 },
            SamplingParams::with_temperature(0.5),
            1,
        );
        let exact = l.exact_distribution().unwrap();
        let target = l.target_distribution().unwrap();
        assert_eq!(exact.total(), BigRational::from_integer(1.into()));
        assert_eq!(
            exact.total_variation(&target),
            BigRational::from_integer(0.into())
        );
        assert_eq!(exact, target);
    }
}
