//! The exact suite: every lossless verifier with every tree kind it accepts preserves the
//! target's distribution of the next N = 3 tokens **exactly** (rational enumeration through the
//! whole loop), on random toy models (proptest), at temperatures 0, 1, 1/2 and 1/3; the
//! accepted-length law for chains; the negative controls are caught; the pairing rule refuses
//! mismatched pairs.
//!
//! Sizes (largest case per verifier): vocabulary 3–4, Markov order 0–2, chains K ≤ 3, trees of
//! width ≤ 2 and depth ≤ 2, N = 3.

use proptest::prelude::*;
use specdec::algorithms::proof::{
    reference_probs, run_case, standard_cases, Expectation, SpecLoop, ToyDrafter,
};
use specdec::algorithms::verify::{PairedVerifier, Verifier};
use specdec::kernels::sampling::{BigRational, Prob, SamplingParams};
use specdec::kernels::verification::{DraftKind, VerifyMethod};
use specdec::models::toy::strategies::toy_pair;
use specdec::models::toy::ToyPair;
use std::sync::Arc;

/// Temperatures the exact tests use: greedy, 1, and 1/k (p^k stays rational).
fn temperature() -> impl Strategy<Value = SamplingParams> {
    prop_oneof![Just(0.0), Just(1.0), Just(0.5), Just(1.0 / 3.0)]
        .prop_map(SamplingParams::with_temperature)
}

/// Tree shapes: children per node at each depth, width ≤ 2, depth ≤ 2.
fn tree_widths() -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![
        Just(vec![1]),
        Just(vec![2]),
        Just(vec![2, 1]),
        Just(vec![1, 2]),
        Just(vec![2, 2]),
    ]
}

/// Asserts the loop's exact output distribution equals the target's own, printing the worst
/// outcome otherwise.
fn assert_lossless(
    pair: ToyPair,
    method: VerifyMethod,
    drafter: ToyDrafter,
    params: SamplingParams,
) -> Result<(), TestCaseError> {
    let verifier: Arc<dyn Verifier<BigRational>> = Arc::new(method);
    let paired = PairedVerifier::new(verifier, drafter.kind()).expect("declared pair");
    let spec = SpecLoop::new(pair, drafter.clone(), paired, params, vec![0, 1], 3).unwrap();
    let exact = spec.exact_distribution().unwrap();
    let target = spec.target_distribution().unwrap();
    prop_assert_eq!(exact.total(), one());
    let worst = exact
        .worst_outcome(&target)
        .map(|(s, a, b)| (s.clone(), a, b));
    prop_assert!(
        worst.is_none(),
        "{} with {} at T={} is not lossless: worst outcome {:?}",
        method.name(),
        drafter.describe(),
        params.temperature,
        worst
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn chain_rejection_sampling_is_exact(
        (order, pair) in (0usize..=2).prop_flat_map(|o| (Just(o), toy_pair(3, o))),
        k in 1usize..=3,
        params in temperature(),
    ) {
        let _ = order;
        assert_lossless(pair, VerifyMethod::ChainRejection, ToyDrafter::Chain { k }, params)?;
    }

    #[test]
    fn chain_rejection_sampling_is_exact_on_four_tokens_with_top_k_and_top_p(
        pair in toy_pair(4, 1),
        k in 1usize..=3,
        top_k in prop::option::of(1usize..=3),
        top_p in prop::option::of(prop_oneof![Just(0.5), Just(0.75), Just(0.875)]),
    ) {
        let params = SamplingParams { top_k, top_p, ..SamplingParams::default() };
        assert_lossless(pair, VerifyMethod::ChainRejection, ToyDrafter::Chain { k }, params)?;
    }

    #[test]
    fn specinfer_multi_round_is_exact_for_iid_trees(
        pair in (0usize..=2).prop_flat_map(|o| toy_pair(3, o)),
        widths in tree_widths(),
        params in temperature(),
    ) {
        let drafter = ToyDrafter::Tree { widths, kind: DraftKind::Iid };
        assert_lossless(pair, VerifyMethod::MultiRound, drafter, params)?;
    }

    #[test]
    fn recursive_rejection_is_exact_for_trees_without_replacement(
        pair in (0usize..=2).prop_flat_map(|o| toy_pair(3, o)),
        widths in tree_widths(),
        params in temperature(),
    ) {
        let drafter = ToyDrafter::Tree { widths, kind: DraftKind::WithoutReplacement };
        assert_lossless(pair, VerifyMethod::RecursiveRejection, drafter, params)?;
    }

    #[test]
    fn target_only_is_exact_for_every_tree_kind(
        pair in (0usize..=2).prop_flat_map(|o| toy_pair(3, o)),
        widths in tree_widths(),
        kind in prop::sample::select(DraftKind::ALL.to_vec()),
        params in temperature(),
    ) {
        let drafter = ToyDrafter::Tree { widths, kind };
        assert_lossless(pair, VerifyMethod::TargetOnly, drafter, params)?;
    }

    #[test]
    fn greedy_equals_greedy_decoding_for_every_tree_kind(
        pair in (0usize..=2).prop_flat_map(|o| toy_pair(4, o)),
        widths in tree_widths(),
        kind in prop::sample::select(DraftKind::ALL.to_vec()),
    ) {
        let drafter = ToyDrafter::Tree { widths, kind };
        assert_lossless(pair, VerifyMethod::Greedy, drafter, SamplingParams::greedy())?;
    }

    /// Accepted-length law for chains: P(n accepted) = A_n − A_{n+1} (n < K), A_K, where
    /// A_i = Σ_{x_1..x_i} Π_j min(p, q)(x_j | prefix) is computed from the conditionals
    /// independently of the verifier. On order-0 tables A_i = a^i with a = Σ min(p, q), so the law
    /// is a^n (1 − a) and a^K; that closed form is checked too.
    #[test]
    fn chain_accepted_length_follows_the_law(
        (order, pair) in (0usize..=2).prop_flat_map(|o| (Just(o), toy_pair(3, o))),
        k in 1usize..=3,
        params in prop_oneof![Just(1.0), Just(0.5)].prop_map(SamplingParams::with_temperature),
    ) {
        let verifier: Arc<dyn Verifier<BigRational>> = Arc::new(VerifyMethod::ChainRejection);
        let paired = PairedVerifier::new(verifier, DraftKind::Iid).unwrap();
        let prompt = vec![0, 1];
        let spec = SpecLoop::new(pair.clone(), ToyDrafter::Chain { k }, paired, params, prompt.clone(), 3).unwrap();
        let lengths = spec.accepted_len_distribution().unwrap();
        let acceptance: Vec<BigRational> = (0..=k + 1)
            .map(|i| all_accepted(&pair, &params, &prompt, i))
            .collect();
        for n in 0..=k {
            let expected = if n < k {
                acceptance[n].clone() - acceptance[n + 1].clone()
            } else {
                acceptance[k].clone()
            };
            prop_assert_eq!(lengths.prob(&n), expected, "n = {}", n);
        }
        if order == 0 {
            let p = reference_probs(&pair.target.next_probs_as::<BigRational>(&prompt), &params).unwrap();
            let q = reference_probs(&pair.draft.next_probs_as::<BigRational>(&prompt), &params).unwrap();
            let a = p.iter().zip(&q).fold(zero(), |s, (x, y)| s + if x < y { x.clone() } else { y.clone() });
            for n in 0..=k {
                let law = if n < k { a.pow_u32(n as u32) * (one() - a.clone()) } else { a.pow_u32(k as u32) };
                prop_assert_eq!(lengths.prob(&n), law, "order 0, n = {}", n);
            }
        }
    }
}

/// `A_i`: probability that the first `i` chain drafts after `context` are all accepted.
fn all_accepted(pair: &ToyPair, params: &SamplingParams, context: &[u32], i: usize) -> BigRational {
    if i == 0 {
        return one();
    }
    let p = reference_probs(&pair.target.next_probs_as::<BigRational>(context), params).unwrap();
    let q = reference_probs(&pair.draft.next_probs_as::<BigRational>(context), params).unwrap();
    let mut total = zero();
    for x in 0..p.len() {
        let both = if p[x] < q[x] {
            p[x].clone()
        } else {
            q[x].clone()
        };
        if both.is_positive() {
            let mut longer = context.to_vec();
            longer.push(x as u32);
            total += both * all_accepted(pair, params, &longer, i - 1);
        }
    }
    total
}

#[test]
fn the_proof_matrix_passes_and_every_control_is_caught() {
    let cases = standard_cases().unwrap();
    let mut controls = 0;
    for case in &cases {
        let row = run_case(case).unwrap();
        assert!(
            row.passed(),
            "{} / {} / {}: {} (TV {})",
            row.verifier,
            row.tree,
            row.size,
            row.verdict(),
            row.total_variation
        );
        if case.expectation != Expectation::Lossless {
            controls += 1;
            let (outcome, spec, target) =
                row.worst.expect("a caught control names its worst outcome");
            println!(
                "{}: worst outcome {outcome:?}: speculative {spec} vs target {target}",
                row.verifier
            );
        }
    }
    // typical, the forced pair, and the four lossy broken chains.
    assert_eq!(controls, 6);
}

#[test]
fn mismatched_pairs_are_refused() {
    for (method, kind) in [
        (VerifyMethod::MultiRound, DraftKind::Deterministic),
        (VerifyMethod::MultiRound, DraftKind::WithoutReplacement),
        (VerifyMethod::ChainRejection, DraftKind::Deterministic),
        (VerifyMethod::RecursiveRejection, DraftKind::Iid),
        (VerifyMethod::RecursiveRejection, DraftKind::Deterministic),
    ] {
        let verifier: Arc<dyn Verifier<BigRational>> = Arc::new(method);
        let err = PairedVerifier::new(verifier, kind).unwrap_err();
        assert!(err.to_string().contains(kind.name()), "{err}");
    }
}

fn one() -> BigRational {
    <BigRational as Prob>::one()
}

fn zero() -> BigRational {
    <BigRational as Prob>::zero()
}

/// A batch's sequences do not influence each other: enumerating the batch verification of two
/// sequences gives exactly the product of their separate verdict distributions.
#[test]
fn batch_verification_is_the_product_of_its_sequences() {
    use specdec::algorithms::proof::enumerate;
    use specdec::kernels::verification::{verify_batch, DraftTree, VerifyInput};
    use specdec::kernels::TreeTopology;
    let r = |a: i64, b: i64| specdec::kernels::sampling::ratio(a, b);
    let q = vec![r(1, 2), r(1, 3), r(1, 6)];
    let chain = |tokens: Vec<u32>| {
        let n = tokens.len();
        DraftTree::new(
            TreeTopology::chain(n),
            tokens,
            vec![Some(q.clone()); n],
            DraftKind::Iid,
        )
        .unwrap()
    };
    let (a, b) = (chain(vec![0, 1, 0]), chain(vec![2, 2]));
    let pa = vec![
        vec![r(1, 4), r(1, 4), r(1, 2)],
        vec![r(1, 3), r(1, 3), r(1, 3)],
        vec![r(0, 1), r(1, 2), r(1, 2)],
    ];
    let pb = vec![
        vec![r(1, 8), r(5, 8), r(1, 4)],
        vec![r(1, 2), r(0, 1), r(1, 2)],
    ];
    let inputs = [
        VerifyInput {
            sequence: 1,
            step: 0,
            tree: &a,
            target_probs: &pa,
        },
        VerifyInput {
            sequence: 2,
            step: 0,
            tree: &b,
            target_probs: &pb,
        },
    ];
    let joint = enumerate(|e| Ok(verify_batch(VerifyMethod::ChainRejection, &inputs, e)?)).unwrap();
    let alone: Vec<_> = inputs
        .iter()
        .map(|input| {
            enumerate(|e| {
                Ok(
                    verify_batch(VerifyMethod::ChainRejection, std::slice::from_ref(input), e)?[0]
                        .clone(),
                )
            })
            .unwrap()
        })
        .collect();
    assert_eq!(joint.total(), one());
    for (x, px) in alone[0].iter() {
        for (y, py) in alone[1].iter() {
            assert_eq!(
                joint.prob(&vec![x.clone(), y.clone()]),
                px.clone() * py.clone()
            );
        }
    }
    assert_eq!(joint.len(), alone[0].len() * alone[1].len());
}
