//! Statistical layer: the production generator (seeded counter-based decisions, `f64`) sampled
//! through the whole speculative loop passes a G-test against the exactly enumerated
//! distribution, and a broken verifier sampled the same way is rejected. Sample size,
//! significance level and the smallest detectable total-variation distance are printed.

use specdec::algorithms::proof::{g_test_samples, BrokenChain, ChainFlaw, SpecLoop, ToyDrafter};
use specdec::algorithms::verify::{PairedVerifier, Verifier};
use specdec::kernels::sampling::{BigRational, Prob, Replay, SamplingParams};
use specdec::kernels::verification::{DraftKind, VerifyMethod};
use specdec::models::toy::{ToyPair, ToyStyle};
use std::sync::Arc;

const SAMPLES: u64 = 20_000;
const ALPHA: f64 = 1e-3;

fn spec_loop<N: Prob + 'static>(
    verifier: Arc<dyn Verifier<N>>,
    drafter: ToyDrafter,
) -> SpecLoop<N> {
    let pair = ToyPair::seeded(20, 3, 1, ToyStyle::DENSE).unwrap();
    let paired = PairedVerifier::new(verifier, drafter.kind()).unwrap();
    SpecLoop::new(
        pair,
        drafter,
        paired,
        SamplingParams::with_temperature(0.5),
        vec![0, 1],
        3,
    )
    .unwrap()
}

/// Samples `SAMPLES` outputs with production decisions (one sequence id per sample).
fn sample<N: Prob>(spec: &SpecLoop<N>, seed: u64) -> Vec<Vec<u32>>
where
    Replay<specdec::kernels::sampling::CounterRng>: specdec::kernels::sampling::Decisions<N>,
{
    let mut decisions = Replay::production(seed);
    (0..SAMPLES)
        .map(|sequence| spec.generate(sequence, &mut decisions).unwrap())
        .collect()
}

#[test]
fn production_sampling_matches_the_exact_distribution() {
    for (method, drafter) in [
        (VerifyMethod::ChainRejection, ToyDrafter::Chain { k: 3 }),
        (
            VerifyMethod::MultiRound,
            ToyDrafter::Tree {
                widths: vec![2, 2],
                kind: DraftKind::Iid,
            },
        ),
        (
            VerifyMethod::RecursiveRejection,
            ToyDrafter::Tree {
                widths: vec![2, 1],
                kind: DraftKind::WithoutReplacement,
            },
        ),
    ] {
        let exact = spec_loop::<BigRational>(Arc::new(method), drafter.clone())
            .exact_distribution()
            .unwrap();
        let samples = sample(&spec_loop::<f64>(Arc::new(method), drafter.clone()), 7);
        let test = g_test_samples(&samples, &exact, ALPHA);
        println!("{} / {}: {test}", method.name(), drafter.describe());
        assert!(
            test.passed(),
            "{} / {}: {test}",
            method.name(),
            drafter.describe()
        );
        assert!(test.detectable_tv < 0.05, "{test}");
    }
}

/// The kernels' own number type: the whole loop in `f32` (fixed-point sums, 24-bit accept
/// uniforms) against the exact distribution.
#[test]
fn production_sampling_in_f32_matches_the_exact_distribution() {
    let method = VerifyMethod::MultiRound;
    let drafter = ToyDrafter::Tree {
        widths: vec![2, 1],
        kind: DraftKind::Iid,
    };
    let exact = spec_loop::<BigRational>(Arc::new(method), drafter.clone())
        .exact_distribution()
        .unwrap();
    let samples = sample(&spec_loop::<f32>(Arc::new(method), drafter.clone()), 9);
    let test = g_test_samples(&samples, &exact, ALPHA);
    println!("f32 {} / {}: {test}", method.name(), drafter.describe());
    assert!(test.passed(), "{test}");
}

#[test]
fn a_broken_verifier_is_rejected_by_the_sampled_test() {
    let drafter = ToyDrafter::Chain { k: 2 };
    let broken = BrokenChain(ChainFlaw::NoResidual);
    let broken_spec = spec_loop::<BigRational>(Arc::new(broken), drafter.clone());
    let target = broken_spec.target_distribution().unwrap();
    let distance = broken_spec
        .exact_distribution()
        .unwrap()
        .total_variation(&target)
        .to_f64();
    let samples = sample(&spec_loop::<f64>(Arc::new(broken), drafter), 8);
    let test = g_test_samples(&samples, &target, ALPHA);
    println!("broken (TV {distance:.4}): {test}");
    assert!(
        distance > test.detectable_tv,
        "the control must be detectable at this n"
    );
    assert!(!test.passed(), "{test}");
}
