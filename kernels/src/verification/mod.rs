//! Batched verification, CPU reference: the one source of truth for every verifier.
//!
//! Input per sequence: a [`DraftTree`] (node 0 = root = the last sampled token; nodes `1..` are
//! drafts; `q` at each expanded node; the [`DraftKind`]) and the target distribution `p` at every
//! node ([`VerifyInput`]). Output per sequence: a [`Verdict`] — the accepted node path, its length
//! and the next (correction or bonus) token. A batch is a slice of inputs; each sequence's
//! decisions are keyed by `(sequence, step, node, purpose)` ([`crate::sampling::DrawKey`]), so the
//! verdicts do not depend on the batch's order or composition.
//!
//! Methods ([`VerifyMethod`]):
//! - [`VerifyMethod::Greedy`]: argmax match ([`greedy`]);
//! - [`VerifyMethod::ChainRejection`]: Leviathan/Chen speculative sampling on a chain;
//! - [`VerifyMethod::MultiRound`]: SpecInfer-style multi-round sampling for i.i.d. children;
//! - [`VerifyMethod::RecursiveRejection`]: recursive rejection sampling for children drawn
//!   without replacement ([`multi_round`] covers these three);
//! - [`VerifyMethod::TargetOnly`]: target-only tree sampling for deterministic trees;
//! - [`VerifyMethod::Typical`]: Medusa's typical acceptance — lossy.
//!
//! The batch entry point taking the device, with the rows where they live and per-sequence
//! seeds, is [`VerifyBackend`] ([`backend`]: [`CpuVerifier`] here, `Gpu` in [`cuda`]).
//!
//! Replay semantics (what a CUDA twin must reproduce): the decisions are exactly those of
//! [`crate::sampling::Replay`] (accept iff `u * q < p` with a 24-bit `u`; categorical by 32-bit
//! fixed-point prefix sums over a 64-bit word), drawn with the keys listed in each method's docs,
//! and normalisations divide by the fixed-point total ([`crate::sampling::Prob::total`]).

pub mod backend;
pub mod cuda;
pub mod draft_tree;
pub mod greedy;
pub mod input;
pub mod multi_round;
pub mod target_only;
#[cfg(test)]
mod test_inputs;
pub mod typical;

pub use backend::{CpuVerifier, VerifyBackend, VerifySequence};
pub use draft_tree::{DraftKind, DraftTree};
pub use input::{walk_tree, Verdict, VerifyInput};
pub use multi_round::SiblingDraws;

use crate::error::{KernelError, Result};
use crate::sampling::{Decisions, Prob};

/// A verification algorithm (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum VerifyMethod {
    /// Argmax match; bonus = argmax at the last accepted node.
    Greedy,
    /// Chain rejection sampling with residual and bonus; the tree must be a chain.
    ChainRejection,
    /// Multi-round rejection sampling, children drawn i.i.d. from `q` (SpecInfer).
    MultiRound,
    /// Recursive rejection sampling, children drawn from `q` without replacement.
    RecursiveRejection,
    /// Sample from the target and follow a matching child.
    TargetOnly,
    /// Typical acceptance with threshold `min(epsilon, delta * exp(−H(p)))` — lossy.
    Typical {
        /// Hard threshold ε.
        epsilon: f64,
        /// Entropy-scaled threshold δ.
        delta: f64,
    },
}

impl VerifyMethod {
    /// The method's name, as configs and tables spell it: `greedy`, `chain_rejection`,
    /// `multi_round`, `recursive_rejection`, `target_only`, `typical`.
    pub fn name(&self) -> &'static str {
        match self {
            VerifyMethod::Greedy => "greedy",
            VerifyMethod::ChainRejection => "chain_rejection",
            VerifyMethod::MultiRound => "multi_round",
            VerifyMethod::RecursiveRejection => "recursive_rejection",
            VerifyMethod::TargetOnly => "target_only",
            VerifyMethod::Typical { .. } => "typical",
        }
    }
}

/// Verifies one sequence.
///
/// # Errors
/// The input's validation errors ([`VerifyInput::validate`]); [`KernelError::InvalidDraftTree`]
/// for a non-chain tree under [`VerifyMethod::ChainRejection`] or a missing `q` under a method
/// that needs it.
pub fn verify_one<N: Prob, D: Decisions<N> + ?Sized>(
    method: VerifyMethod,
    input: &VerifyInput<'_, N>,
    decisions: &mut D,
) -> Result<Verdict> {
    input.validate()?;
    match method {
        VerifyMethod::Greedy => Ok(greedy::verify_greedy(input)),
        VerifyMethod::ChainRejection => {
            if !input.tree.topology().is_chain() {
                return Err(KernelError::InvalidDraftTree {
                    reason: format!(
                        "chain rejection sampling needs a chain, sequence {} has a branching tree",
                        input.sequence
                    ),
                });
            }
            multi_round::verify_multi_round(input, decisions, SiblingDraws::Independent)
        }
        VerifyMethod::MultiRound => {
            multi_round::verify_multi_round(input, decisions, SiblingDraws::Independent)
        }
        VerifyMethod::RecursiveRejection => {
            multi_round::verify_multi_round(input, decisions, SiblingDraws::WithoutReplacement)
        }
        VerifyMethod::TargetOnly => Ok(target_only::verify_target_only(input, decisions)),
        VerifyMethod::Typical { epsilon, delta } => {
            Ok(typical::verify_typical(input, decisions, epsilon, delta))
        }
    }
}

/// Verifies a batch: one verdict per input, in input order.
///
/// # Errors
/// The first failing input's error (see [`verify_one`]).
pub fn verify_batch<N: Prob, D: Decisions<N> + ?Sized>(
    method: VerifyMethod,
    inputs: &[VerifyInput<'_, N>],
    decisions: &mut D,
) -> Result<Vec<Verdict>> {
    inputs
        .iter()
        .map(|input| verify_one(method, input, decisions))
        .collect()
}

/// Verifies a batch in parallel (rayon), each sequence with its own clone of `decisions`.
/// Because decisions are keyed by `(sequence, step, node, purpose)`, the verdicts equal
/// [`verify_batch`]'s for counter-based decisions such as [`crate::sampling::Production`].
///
/// # Errors
/// The first failing input's error (in input order).
pub fn verify_batch_parallel<N, D>(
    method: VerifyMethod,
    inputs: &[VerifyInput<'_, N>],
    decisions: &D,
) -> Result<Vec<Verdict>>
where
    N: Prob,
    D: Decisions<N> + Clone + Send + Sync,
{
    use rayon::prelude::*;
    inputs
        .par_iter()
        .map(|input| verify_one(method, input, &mut decisions.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{DrawKey, GivenUniforms, Purpose, Replay};
    use crate::tree::TreeTopology;
    use std::collections::BTreeMap;

    fn chain_tree(tokens: Vec<u32>, q: Vec<f32>) -> DraftTree<f32> {
        let len = tokens.len();
        let probs = (0..len).map(|i| (i + 1 < len).then(|| q.clone())).collect();
        DraftTree::new(TreeTopology::chain(len), tokens, probs, DraftKind::Iid).unwrap()
    }

    fn words(entries: &[(usize, Purpose, u64)]) -> Replay<GivenUniforms> {
        let map: BTreeMap<DrawKey, u64> = entries
            .iter()
            .map(|&(node, purpose, w)| (DrawKey::new(5, 2, node, purpose), w))
            .collect();
        Replay::new(GivenUniforms::new(map))
    }

    #[test]
    fn chain_accepts_then_rejects_then_samples_the_residual() {
        // p = (0.5, 0.5, 0), q = (0.25, 0.25, 0.5) at every node; drafts 0 then 2.
        let tree = chain_tree(vec![1, 0, 2], vec![0.25, 0.25, 0.5]);
        let p = vec![vec![0.5f32, 0.5, 0.0]; 3];
        let input = VerifyInput {
            sequence: 5,
            step: 2,
            tree: &tree,
            target_probs: &p,
        };
        // Node 1 (token 0): p >= q accepts for any u. Node 2 (token 2): p = 0 rejects.
        // Residual max(0, p − q) = (0.25, 0.25, 0): word 2^63 picks token 1.
        let mut dec = words(&[
            (1, Purpose::Accept, 0),
            (2, Purpose::Accept, 0),
            (1, Purpose::Residual, 1 << 63),
        ]);
        let verdict = verify_one(VerifyMethod::ChainRejection, &input, &mut dec).unwrap();
        assert_eq!(verdict, Verdict::new(vec![1], 1));
        assert_eq!(verdict.emitted_tokens(&tree), vec![0, 1]);
        assert!(dec.source().missing().is_empty());
    }

    #[test]
    fn fully_accepted_chain_draws_the_bonus_from_p_at_the_leaf() {
        let tree = chain_tree(vec![0, 1], vec![0.5, 0.5, 0.0]);
        let p = vec![vec![0.0f32, 1.0, 0.0], vec![0.0, 0.0, 1.0]];
        let input = VerifyInput {
            sequence: 5,
            step: 2,
            tree: &tree,
            target_probs: &p,
        };
        let mut dec = words(&[(1, Purpose::Accept, u64::MAX), (1, Purpose::Bonus, 0)]);
        let verdict = verify_one(VerifyMethod::ChainRejection, &input, &mut dec).unwrap();
        assert_eq!(verdict, Verdict::new(vec![1], 2));
    }

    #[test]
    fn greedy_follows_argmax_and_ties_go_low() {
        let fork = TreeTopology::from_parents(&[None, Some(0), Some(0), Some(2)]).unwrap();
        let tree = DraftTree::<f32>::new(
            fork,
            vec![9, 0, 1, 1],
            vec![None; 4],
            DraftKind::Deterministic,
        )
        .unwrap();
        let p = vec![
            vec![0.2f32, 0.4, 0.4],
            vec![1.0, 0.0, 0.0],
            vec![0.0, 1.0, 0.0],
            vec![0.5, 0.0, 0.5],
        ];
        let input = VerifyInput {
            sequence: 0,
            step: 0,
            tree: &tree,
            target_probs: &p,
        };
        let verdict = verify_one(VerifyMethod::Greedy, &input, &mut Replay::production(0)).unwrap();
        assert_eq!(verdict, Verdict::new(vec![2, 3], 0));
    }

    #[test]
    fn recursive_rejection_removes_rejected_tokens_from_the_proposal() {
        // Root children: tokens 0 then 1, drawn without replacement from q = (0.5, 0.5, 0);
        // p = (0, 0.5, 0.5). Token 0 is rejected (p = 0); r = norm(max(0, p − q)) = (0, 0, 1)
        // and the proposal becomes (0, 1, 0). Token 1 has r = 0: rejected; the final residual
        // norm(max(0, r − s)) = (0, 0, 1) gives token 2.
        let fork = TreeTopology::from_parents(&[None, Some(0), Some(0)]).unwrap();
        let q = vec![0.5f32, 0.5, 0.0];
        let tree = DraftTree::new(
            fork,
            vec![7, 0, 1],
            vec![Some(q), None, None],
            DraftKind::WithoutReplacement,
        )
        .unwrap();
        let p = vec![
            vec![0.0f32, 0.5, 0.5],
            vec![1.0, 0.0, 0.0],
            vec![1.0, 0.0, 0.0],
        ];
        let input = VerifyInput {
            sequence: 5,
            step: 2,
            tree: &tree,
            target_probs: &p,
        };
        let mut dec = words(&[
            (1, Purpose::Accept, 0),
            (2, Purpose::Accept, 0),
            (0, Purpose::Residual, 0),
        ]);
        let verdict = verify_one(VerifyMethod::RecursiveRejection, &input, &mut dec).unwrap();
        assert_eq!(verdict, Verdict::new(vec![], 2));
    }

    #[test]
    fn method_names_are_the_documented_config_spellings() {
        let methods = [
            (VerifyMethod::Greedy, "greedy"),
            (VerifyMethod::ChainRejection, "chain_rejection"),
            (VerifyMethod::MultiRound, "multi_round"),
            (VerifyMethod::RecursiveRejection, "recursive_rejection"),
            (VerifyMethod::TargetOnly, "target_only"),
            (
                VerifyMethod::Typical {
                    epsilon: 0.3,
                    delta: 0.09,
                },
                "typical",
            ),
        ];
        for (method, name) in methods {
            assert_eq!(method.name(), name, "{method:?}");
        }
    }

    #[test]
    fn only_recursive_rejection_updates_the_proposal_after_a_rejection() {
        // Root children: tokens 0 then 1, q = (1/2, 1/2, 0), p = (1/4, 5/8, 1/8); every value
        // is dyadic, so the f32 decisions are the exact comparisons. u = 3/4 rejects token 0
        // (3/4 · 1/2 >= 1/4), leaving r = norm(max(0, p − q)) = (0, 1/2, 1/2). For token 1
        // the proposal is s = (0, 1, 0) without replacement (3/4 · 1 >= 1/2 rejects; the
        // final residual norm(max(0, r − s)) is token 2) but stays q for i.i.d. children
        // (3/4 · 1/2 < 1/2 accepts; the bonus at node 2 is token 0).
        let fork = TreeTopology::from_parents(&[None, Some(0), Some(0)]).unwrap();
        let tree = DraftTree::new(
            fork,
            vec![7, 0, 1],
            vec![Some(vec![0.5f32, 0.5, 0.0]), None, None],
            DraftKind::WithoutReplacement,
        )
        .unwrap();
        let p = vec![
            vec![0.25f32, 0.625, 0.125],
            vec![1.0, 0.0, 0.0],
            vec![1.0, 0.0, 0.0],
        ];
        let input = VerifyInput {
            sequence: 5,
            step: 2,
            tree: &tree,
            target_probs: &p,
        };
        let three_quarters = GivenUniforms::word_for_u24(3 << 22);
        let entries = [
            (1, Purpose::Accept, three_quarters),
            (2, Purpose::Accept, three_quarters),
            (0, Purpose::Residual, 0),
            (2, Purpose::Bonus, 0),
        ];
        let recursive = verify_one(
            VerifyMethod::RecursiveRejection,
            &input,
            &mut words(&entries),
        )
        .unwrap();
        assert_eq!(recursive, Verdict::new(vec![], 2));
        let iid = verify_one(VerifyMethod::MultiRound, &input, &mut words(&entries)).unwrap();
        assert_eq!(iid, Verdict::new(vec![2], 0));
    }

    #[test]
    fn chain_method_refuses_a_branching_tree_and_missing_rows() {
        let fork = TreeTopology::from_parents(&[None, Some(0), Some(0)]).unwrap();
        let tree = DraftTree::new(
            fork,
            vec![0, 0, 1],
            vec![Some(vec![0.5f32, 0.5]), None, None],
            DraftKind::Iid,
        )
        .unwrap();
        let p = vec![vec![0.5f32, 0.5]; 3];
        let input = VerifyInput {
            sequence: 0,
            step: 0,
            tree: &tree,
            target_probs: &p,
        };
        let err = verify_one(
            VerifyMethod::ChainRejection,
            &input,
            &mut Replay::production(0),
        );
        assert!(err.unwrap_err().to_string().contains("needs a chain"));
        let short = VerifyInput {
            target_probs: &p[..2],
            ..input
        };
        assert!(matches!(
            verify_one(VerifyMethod::MultiRound, &short, &mut Replay::production(0)),
            Err(KernelError::ShapeMismatch { .. })
        ));
    }

    #[test]
    fn batch_verdicts_do_not_depend_on_batch_order() {
        let trees: Vec<DraftTree<f32>> = (0..6)
            .map(|i| chain_tree(vec![0, i % 3, (i + 1) % 3, i % 2], vec![0.3, 0.3, 0.4]))
            .collect();
        let p = vec![vec![0.2f32, 0.5, 0.3]; 4];
        let inputs: Vec<VerifyInput<'_, f32>> = trees
            .iter()
            .enumerate()
            .map(|(i, tree)| VerifyInput {
                sequence: 100 + i as u64,
                step: 3,
                tree,
                target_probs: &p,
            })
            .collect();
        let forward = verify_batch(
            VerifyMethod::ChainRejection,
            &inputs,
            &mut Replay::production(9),
        )
        .unwrap();
        let reversed_inputs: Vec<_> = inputs.iter().rev().copied().collect();
        let mut backward = verify_batch(
            VerifyMethod::ChainRejection,
            &reversed_inputs,
            &mut Replay::production(9),
        )
        .unwrap();
        backward.reverse();
        assert_eq!(forward, backward);
        let parallel = verify_batch_parallel(
            VerifyMethod::ChainRejection,
            &inputs,
            &Replay::production(9),
        )
        .unwrap();
        assert_eq!(parallel, forward);
        let alone = verify_one(
            VerifyMethod::ChainRejection,
            &inputs[4],
            &mut Replay::production(9),
        )
        .unwrap();
        assert_eq!(alone, forward[4]);
    }
}
