//! Engine tests on toy models: greedy equality, the sampled distribution at T = 1, stops inside
//! an accepted block, path-dependent penalties, and clear errors for bad requests.

use std::sync::Arc;

use specdec_algorithms::drafters::{
    ChainDrafter, ChainMode, DraftModel, HistoryDrafter, NgramConfig, NgramDrafter, PathsQuery,
    ShapeDrafter, StagedDrafter, TreeFill,
};
use specdec_algorithms::policy::{FixedPolicy, SpeculationPolicy};
use specdec_algorithms::proof::{g_test_samples, target_distribution};
use specdec_algorithms::trees::TreeShape;
use specdec_algorithms::verify::{PairedVerifier, Verifier};
use specdec_kernels::sampling::SamplingParams;
use specdec_kernels::verification::{DraftKind, VerifyMethod};
use specdec_models::toy::{ToyLanguageModel, ToyPair, ToyStyle};

use super::*;

const VOCAB: usize = 6;

fn pair(seed: u64) -> ToyPair {
    ToyPair::seeded(seed, VOCAB, 2, ToyStyle::default()).unwrap()
}

fn paired(method: VerifyMethod, kind: DraftKind) -> PairedVerifier<f32> {
    let verifier: Arc<dyn Verifier<f32>> = Arc::new(method);
    PairedVerifier::new(verifier, kind).unwrap()
}

fn options(sampling: SamplingParams, batch_size: usize) -> EngineOptions {
    EngineOptions {
        method: "test".into(),
        sampling,
        penalties: Penalties::default(),
        seed: 7,
        batch_size,
        replay: None,
        op_split: false,
    }
}

fn requests(n: usize, max_new_tokens: usize) -> Vec<Request> {
    (0..n)
        .map(|i| Request {
            id: i as u64,
            seed: None,
            workload: None,
            prompt: vec![(i % VOCAB) as u32, ((i * 7 + 1) % VOCAB) as u32, 2],
            stop: StopRule::new(max_new_tokens, &[]),
        })
        .collect()
}

/// Runs `requests` with the given drafter/verifier/policy on the toy pair's target.
fn run(
    pair: &ToyPair,
    drafter: &mut dyn Drafter<f32>,
    verifier: PairedVerifier<f32>,
    policy: Box<dyn SpeculationPolicy>,
    options: EngineOptions,
    requests: &[Request],
) -> Vec<Generation> {
    let mut target = ToyLanguageModel::new(pair.target.clone(), 256, vec![]);
    let mut engine = Engine::new(&mut target, drafter, verifier, policy, options).unwrap();
    engine.run(requests, &mut |_| {}).unwrap()
}

fn plain(pair: &ToyPair, options: EngineOptions, requests: &[Request]) -> Vec<Vec<u32>> {
    let kind = DraftKind::Deterministic;
    let verifier = if options.sampling.is_greedy() {
        paired(VerifyMethod::Greedy, kind)
    } else {
        paired(VerifyMethod::TargetOnly, kind)
    };
    run(
        pair,
        &mut NoDrafter,
        verifier,
        Box::new(FixedPolicy::chain(0)),
        options,
        requests,
    )
    .into_iter()
    .map(|g| g.tokens)
    .collect()
}

fn draft_lm(pair: &ToyPair, sampling: SamplingParams) -> LmDraftModel<ToyLanguageModel> {
    LmDraftModel::new(
        ToyLanguageModel::new(pair.draft.clone(), 256, vec![]),
        sampling,
        8,
    )
}

#[test]
fn greedy_speculation_equals_plain_decoding_for_every_drafter_and_batch() {
    let greedy = SamplingParams::greedy();
    for seed in 0..4 {
        let pair = pair(seed);
        let reqs = requests(5, 12);
        let expected = plain(&pair, options(greedy, 1), &reqs);
        for batch in [1, 3] {
            let mut chain = ChainDrafter::new(draft_lm(&pair, greedy), ChainMode::Argmax);
            let mut tree = ShapeDrafter::new(
                draft_lm(&pair, greedy),
                TreeFill::TopRanked,
                TreeShape::from_branching(&[2, 2]),
            );
            let mut ngram = NgramDrafter::new(NgramConfig::default(), 3).unwrap();
            let mut staged = StagedDrafter::new(
                NgramDrafter::new(NgramConfig::default(), 3).unwrap(),
                draft_lm(&pair, greedy),
            );
            let mut history = HistoryDrafter::new(NgramConfig::default(), 3, 64).unwrap();
            let drafters: [(&mut dyn Drafter<f32>, Box<dyn SpeculationPolicy>); 5] = [
                (&mut chain, Box::new(FixedPolicy::chain(3))),
                (&mut tree, Box::new(FixedPolicy::chain(6))),
                (&mut ngram, Box::new(FixedPolicy::chain(3))),
                (&mut staged, Box::new(FixedPolicy::chain(3))),
                (&mut history, Box::new(FixedPolicy::chain(3))),
            ];
            for (drafter, policy) in drafters {
                let name = drafter.name();
                let verifier = paired(VerifyMethod::Greedy, drafter.kind());
                let got = run(
                    &pair,
                    drafter,
                    verifier,
                    policy,
                    options(greedy, batch),
                    &reqs,
                );
                let got: Vec<Vec<u32>> = got.into_iter().map(|g| g.tokens).collect();
                assert_eq!(got, expected, "seed {seed}, batch {batch}, drafter {name}");
            }
        }
    }
}

/// The engine hands every finished request's text to its drafter ([`Drafter::finished`]): a
/// history drafter that served a batch of requests drafts their repeats from what they
/// generated, more and more accurately than prompt lookup alone, and the output stays plain
/// decoding's.
#[test]
fn finished_requests_feed_the_history_drafter() {
    let greedy = SamplingParams::greedy();
    let pair = pair(2);
    let reqs = requests(4, 16);
    let expected = plain(&pair, options(greedy, 1), &reqs);
    let mut history = HistoryDrafter::new(NgramConfig::default(), 3, 1024).unwrap();
    let mut accepted = Vec::new();
    for pass in 0..2 {
        let verifier = paired(VerifyMethod::Greedy, DraftKind::Deterministic);
        let policy = Box::new(FixedPolicy::chain(4));
        let got = run(
            &pair,
            &mut history,
            verifier,
            policy,
            options(greedy, 2),
            &reqs,
        );
        let tokens: Vec<Vec<u32>> = got.iter().map(|g| g.tokens.clone()).collect();
        assert_eq!(tokens, expected, "pass {pass}");
        let count = |g: &Generation| g.steps.iter().map(|s| s.accepted).sum::<usize>();
        accepted.push(got.iter().map(count).sum::<usize>());
    }
    assert_eq!(history.history().sequences(), 2 * reqs.len());
    let generated: usize = expected.iter().map(Vec::len).sum();
    eprintln!("accepted {accepted:?} of {generated} tokens");
    assert!(
        accepted[1] > accepted[0],
        "accepted {accepted:?} of {generated} tokens"
    );
}

/// Two limited draft vocabularies of half the ids: the first ids, and scattered ids in a ranked
/// (not ascending) order.
fn limited_vocabularies() -> [Vec<u32>; 2] {
    let first = (0..(VOCAB / 2) as u32).collect();
    let scattered = (0..VOCAB as u32).rev().filter(|id| id % 2 == 1).collect();
    [first, scattered]
}

#[test]
fn a_draft_limited_to_some_ids_keeps_greedy_output_and_proposes_only_them() {
    let greedy = SamplingParams::greedy();
    for ids in limited_vocabularies() {
        for seed in 0..4 {
            let pair = pair(seed);
            let reqs = requests(4, 12);
            let expected = plain(&pair, options(greedy, 1), &reqs);
            let mut lm = draft_lm(&pair, SamplingParams::default());
            lm.limit_logits(&ids).unwrap();
            // q: a distribution over those ids only
            let q = lm.next_probs(0, &[1, 2]).unwrap();
            assert_eq!(q.len(), VOCAB);
            for (id, &p) in q.iter().enumerate() {
                assert!(p == 0.0 || ids.contains(&(id as u32)), "{q:?}");
            }
            assert!((q.iter().sum::<f32>() - 1.0).abs() < 1e-6, "{q:?}");
            let mut limited = draft_lm(&pair, greedy);
            limited.limit_logits(&ids).unwrap();
            let mut chain = ChainDrafter::new(limited, ChainMode::Argmax);
            let verifier = paired(VerifyMethod::Greedy, DraftKind::Deterministic);
            let policy = Box::new(FixedPolicy::chain(3));
            let got = run(
                &pair,
                &mut chain,
                verifier,
                policy,
                options(greedy, 2),
                &reqs,
            );
            let got: Vec<Vec<u32>> = got.into_iter().map(|g| g.tokens).collect();
            assert_eq!(got, expected, "seed {seed}, ids {ids:?}");
        }
    }
}

#[test]
fn sampled_chain_speculation_matches_the_target_distribution() {
    // T = 1: the first three generated tokens over many request ids (each id keys its own
    // decisions) against the target's exact distribution, with a G-test.
    let pair = pair(11);
    let sampling = SamplingParams::with_temperature(1.0);
    let reqs: Vec<Request> = (0..3000)
        .map(|id| Request {
            id,
            seed: None,
            workload: None,
            prompt: vec![1, 2],
            stop: StopRule::new(3, &[]),
        })
        .collect();
    let expected = target_distribution::<f64>(&pair.target, &sampling, &[1, 2], 3).unwrap();
    // the whole draft vocabulary, and a draft limited to scattered ids (q = 0 elsewhere)
    let [_, scattered] = limited_vocabularies();
    for ids in [None, Some(scattered)] {
        let mut lm = draft_lm(&pair, sampling);
        if let Some(ids) = &ids {
            lm.limit_logits(ids).unwrap();
        }
        let mut drafter = ChainDrafter::new(lm, ChainMode::Sample);
        let verifier = paired(VerifyMethod::ChainRejection, DraftKind::Iid);
        let got = run(
            &pair,
            &mut drafter,
            verifier,
            Box::new(FixedPolicy::chain(2)),
            options(sampling, 4),
            &reqs,
        );
        let samples: Vec<Vec<u32>> = got.into_iter().map(|g| g.tokens).collect();
        let test = g_test_samples(&samples, &expected, 1e-3);
        assert!(test.passed(), "limited to {ids:?}: {test}");
    }
}

#[test]
fn a_seeded_request_samples_by_its_seed_alone_whatever_shares_its_batch() {
    // T = 1, sampled chains: a request with its own seed gives the text that request 0 of a
    // run with that seed gives alone, at another id, beside other requests (one seeded too),
    // under another run seed; without its seed the same request samples otherwise.
    let pair = pair(5);
    let sampling = SamplingParams::with_temperature(1.0);
    let request = |id: u64, seed: Option<u64>| Request {
        id,
        seed,
        workload: None,
        prompt: vec![1, 2, 3],
        stop: StopRule::new(24, &[]),
    };
    let sampled = |run_seed: u64, batch: usize, reqs: &[Request]| -> Vec<Vec<u32>> {
        let mut drafter = ChainDrafter::new(draft_lm(&pair, sampling), ChainMode::Sample);
        let options = EngineOptions {
            seed: run_seed,
            ..options(sampling, batch)
        };
        run(
            &pair,
            &mut drafter,
            paired(VerifyMethod::ChainRejection, DraftKind::Iid),
            Box::new(FixedPolicy::chain(3)),
            options,
            reqs,
        )
        .into_iter()
        .map(|g| g.tokens)
        .collect()
    };
    let alone = sampled(42, 1, &[request(0, None)]).remove(0);
    let batch = |own: Option<u64>| {
        let reqs = [
            request(0, None),
            request(1, Some(9)),
            request(2, None),
            request(3, own),
        ];
        sampled(7, 4, &reqs)
    };
    let seeded = batch(Some(42));
    assert_eq!(seeded[3], alone);
    assert_eq!(seeded[1], sampled(9, 1, &[request(0, None)]).remove(0));
    // the others keep the run seed's words by id, as before
    let unseeded = batch(None);
    assert_eq!(seeded[0], unseeded[0]);
    assert_eq!(seeded[2], unseeded[2]);
    assert_ne!(
        unseeded[3], alone,
        "the negative control: no own seed, other words"
    );
}

#[test]
fn a_stop_inside_an_accepted_block_cuts_the_output_and_rewinds() {
    let pair = pair(3);
    let greedy = SamplingParams::greedy();
    let reqs = requests(3, 30);
    let full = plain(&pair, options(greedy, 1), &reqs);
    // Stop on the 5th generated token of each plain run, as a one-token stop sequence.
    let stopped: Vec<Request> = reqs
        .iter()
        .zip(&full)
        .map(|(r, out)| {
            let mut r = r.clone();
            r.stop.stop_sequences = vec![out[4..5].to_vec()];
            r
        })
        .collect();
    let mut drafter = ChainDrafter::new(draft_lm(&pair, greedy), ChainMode::Argmax);
    let verifier = paired(VerifyMethod::Greedy, DraftKind::Deterministic);
    let got = run(
        &pair,
        &mut drafter,
        verifier,
        Box::new(FixedPolicy::chain(4)),
        options(greedy, 2),
        &stopped,
    );
    for (g, out) in got.iter().zip(&full) {
        let cut = out.iter().position(|&t| t == out[4]).unwrap() + 1;
        assert_eq!(g.tokens, out[..cut].to_vec());
        assert_eq!(g.finish, FinishReason::Stop);
        assert_eq!(g.steps.iter().map(|s| s.emitted).sum::<usize>(), cut);
    }
}

/// `options` with repetition, frequency and presence penalties on.
fn penalised(mut options: EngineOptions) -> EngineOptions {
    options.penalties = Penalties {
        repetition: 1.7,
        frequency: 0.4,
        presence: 0.3,
    };
    options
}

#[test]
fn penalties_are_applied_per_node_from_the_nodes_own_path() {
    let (pair, greedy, reqs) = (pair(5), SamplingParams::greedy(), requests(4, 15));
    let opts = penalised(options(greedy, 2));
    let expected = plain(&pair, opts.clone(), &reqs);
    let unpenalised = plain(&pair, options(greedy, 2), &reqs);
    assert_ne!(
        expected, unpenalised,
        "the penalties must change the output to test anything"
    );
    let mut tree = ShapeDrafter::new(
        draft_lm(&pair, greedy),
        TreeFill::TopRanked,
        TreeShape::from_branching(&[3, 2, 1]),
    );
    let verifier = paired(VerifyMethod::Greedy, DraftKind::Deterministic);
    let got = run(
        &pair,
        &mut tree,
        verifier,
        Box::new(FixedPolicy::chain(12)),
        opts,
        &reqs,
    );
    let got: Vec<Vec<u32>> = got.into_iter().map(|g| g.tokens).collect();
    assert_eq!(got, expected);
}

/// The draft model applies the target's penalties to its own logits with each row's generated
/// history: a draft that is the target itself then proposes exactly the target's tokens, and
/// every draft is accepted; without the penalties on `q` some are rejected.
#[test]
fn a_draft_model_applies_the_penalties_to_q_as_the_target_does() {
    let (pair, greedy, reqs) = (pair(5), SamplingParams::greedy(), requests(4, 15));
    let opts = penalised(options(greedy, 2));
    let expected = plain(&pair, opts.clone(), &reqs);
    let acceptance = |draft_penalties: Penalties| {
        let model = ToyLanguageModel::new(pair.target.clone(), 256, vec![]);
        let lm = LmDraftModel::new(model, greedy, 8).with_penalties(draft_penalties);
        let mut chain = ChainDrafter::new(lm, ChainMode::Argmax);
        let verifier = paired(VerifyMethod::Greedy, DraftKind::Deterministic);
        let generations = run(
            &pair,
            &mut chain,
            verifier,
            Box::new(FixedPolicy::chain(3)),
            opts.clone(),
            &reqs,
        );
        let tokens: Vec<Vec<u32>> = generations.iter().map(|g| g.tokens.clone()).collect();
        assert_eq!(tokens, expected, "lossless either way");
        let steps = generations.iter().flat_map(|g| &g.steps);
        let (accepted, proposed) = steps.fold((0, 0), |(a, p), s| (a + s.accepted, p + s.proposed));
        (accepted, proposed)
    };
    let (accepted, proposed) = acceptance(opts.penalties);
    assert!(proposed > 0);
    assert_eq!(
        accepted, proposed,
        "the target as its own draft, penalised alike"
    );
    let (accepted, proposed) = acceptance(Penalties::default());
    assert!(
        accepted < proposed,
        "without the penalties on q the draft must miss some ({accepted} of {proposed})"
    );
}

#[test]
fn bad_requests_and_mismatched_pairs_are_refused_with_a_reason() {
    let pair = pair(1);
    let mut target = ToyLanguageModel::new(pair.target.clone(), 8, vec![]);
    let mut ngram = NgramDrafter::new(NgramConfig::default(), 3).unwrap();
    let wrong = paired(VerifyMethod::ChainRejection, DraftKind::Iid);
    let err = Engine::new(
        &mut target,
        &mut ngram,
        wrong,
        Box::new(FixedPolicy::chain(2)),
        options(SamplingParams::greedy(), 1),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("paired with"), "{err}");

    let verifier = paired(VerifyMethod::Greedy, DraftKind::Deterministic);
    let mut engine = Engine::new(
        &mut target,
        &mut ngram,
        verifier,
        Box::new(FixedPolicy::chain(2)),
        options(SamplingParams::greedy(), 1),
    )
    .unwrap();
    let long = Request {
        id: 9,
        seed: None,
        workload: None,
        prompt: vec![1; 8],
        stop: StopRule::new(4, &[]),
    };
    let err = engine.run(&[long], &mut |_| {}).unwrap_err().to_string();
    assert!(
        err.contains("request 9") && err.contains("8 tokens"),
        "{err}"
    );
    let empty = Request {
        id: 3,
        seed: None,
        workload: None,
        prompt: vec![],
        stop: StopRule::new(4, &[]),
    };
    let err = engine.run(&[empty], &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("request 3") && err.contains("empty"), "{err}");
    // A prompt and max_tokens past the context are refused before any request is admitted
    // (the first request fits, the second does not: nothing runs), naming both numbers.
    let fits = Request {
        id: 5,
        seed: None,
        workload: None,
        prompt: vec![1; 6],
        stop: StopRule::new(2, &[]),
    };
    let near = Request {
        id: 4,
        seed: None,
        workload: None,
        prompt: vec![1; 6],
        stop: StopRule::new(10, &[]),
    };
    let mut done_calls = 0;
    let err = engine
        .run(&[fits.clone(), near], &mut |_| done_calls += 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("request 4")
            && err.contains("6 tokens")
            && err.contains("max_tokens is 10")
            && err.contains("context of 8"),
        "{err}"
    );
    assert_eq!(done_calls, 0, "nothing ran before the refusal");
    // A request that fills the context exactly runs to its max_tokens.
    let done = engine.run(&[fits], &mut |_| {}).unwrap();
    assert_eq!(done[0].finish, FinishReason::MaxTokens);
    assert_eq!(done[0].tokens.len(), 2);
}

/// Records what the engine reports to the policy, speculating with a chain of 2 every step.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<std::sync::Mutex<Vec<(usize, StepTiming)>>>,
    /// What each `observe_load` said, in order.
    loads: Arc<std::sync::Mutex<Vec<usize>>>,
}

impl SpeculationPolicy for Recorder {
    fn name(&self) -> String {
        "recorder".into()
    }
    fn next_budget(&mut self) -> Budget {
        Budget::Chain(2)
    }
    fn observe(&mut self, _outcome: &StepOutcome) {
        panic!("the engine reports timings: observe_measured, not observe");
    }
    fn observe_measured(&mut self, outcome: &StepOutcome, timing: &StepTiming) {
        self.seen.lock().unwrap().push((outcome.proposed, *timing));
    }
    fn observe_load(&mut self, sequences: usize) {
        self.loads.lock().unwrap().push(sequences);
    }
    fn fork(&self) -> Box<dyn SpeculationPolicy> {
        Box::new(self.clone())
    }
}

/// Runs `reqs` at `batch_size` with a greedy chain drafter under a [`Recorder`] policy; returns
/// the generations and what the policy was told.
fn run_recorded(
    seed: u64,
    reqs: &[Request],
    batch_size: usize,
) -> (Vec<Generation>, Vec<(usize, StepTiming)>) {
    let (generations, seen, _) = run_recorded_with_loads(seed, reqs, batch_size);
    (generations, seen)
}

/// [`run_recorded`], with what the policy was told of the load before each budget.
fn run_recorded_with_loads(
    seed: u64,
    reqs: &[Request],
    batch_size: usize,
) -> (Vec<Generation>, Vec<(usize, StepTiming)>, Vec<usize>) {
    let greedy = SamplingParams::greedy();
    let pair = pair(seed);
    let recorder = Recorder::default();
    let mut chain = ChainDrafter::new(draft_lm(&pair, greedy), ChainMode::Argmax);
    let verifier = paired(VerifyMethod::Greedy, DraftKind::Deterministic);
    let generations = run(
        &pair,
        &mut chain,
        verifier,
        Box::new(recorder.clone()),
        options(greedy, batch_size),
        reqs,
    );
    let seen = recorder.seen.lock().unwrap().clone();
    let loads = recorder.loads.lock().unwrap().clone();
    (generations, seen, loads)
}

#[test]
fn the_policy_is_fed_each_steps_measured_costs() {
    let reqs = requests(1, 10);
    let (generations, seen) = run_recorded(1, &reqs, 1);
    assert_eq!(seen.len(), generations[0].steps.len());
    // The first step carries the prompt prefill (prompt minus its last token).
    assert_eq!(seen[0].1.prefill_tokens, reqs[0].prompt.len() - 1);
    assert!(seen[1..].iter().all(|(_, t)| t.prefill_tokens == 0));
    let mut emitted = 0;
    for ((proposed, timing), step) in seen.iter().zip(&generations[0].steps) {
        emitted += step.emitted;
        assert_eq!(*proposed, step.proposed);
        assert_eq!(timing.draft_passes, step.draft_depth);
        assert_eq!(timing.draft_s, step.draft_s);
        assert_eq!(timing.target_s, step.target_s);
        assert_eq!(timing.remaining_tokens, Some(10 - emitted));
    }
}

#[test]
fn the_measured_cost_policy_keeps_greedy_output_equal_to_plain() {
    use specdec_algorithms::policy::{CostModelPolicy, TreeSearch};
    let greedy = SamplingParams::greedy();
    for seed in 0..3 {
        let pair = pair(seed);
        let reqs = requests(3, 24);
        let expected = plain(&pair, options(greedy, 1), &reqs);
        // Draft pass prior 0 (n-gram-like): the policy explores speculation after a plain step.
        let policy = CostModelPolicy::measured(TreeSearch::Chain { max_k: 4 }, Some(0.0)).unwrap();
        let mut ngram = NgramDrafter::new(NgramConfig::default(), 3).unwrap();
        let verifier = paired(VerifyMethod::Greedy, DraftKind::Deterministic);
        let got = run(
            &pair,
            &mut ngram,
            verifier,
            Box::new(policy),
            options(greedy, 2),
            &reqs,
        );
        let got: Vec<Vec<u32>> = got.into_iter().map(|g| g.tokens).collect();
        assert_eq!(got, expected, "seed {seed}");
    }
}

/// Chooses plain decoding on even steps and a chain of 2 on odd ones.
#[derive(Clone, Default)]
struct EveryOtherStep {
    step: usize,
}

impl SpeculationPolicy for EveryOtherStep {
    fn name(&self) -> String {
        "every-other-step".into()
    }
    fn next_budget(&mut self) -> Budget {
        self.step += 1;
        Budget::chain(if self.step.is_multiple_of(2) { 0 } else { 2 })
    }
    fn observe(&mut self, _outcome: &StepOutcome) {}
    fn fork(&self) -> Box<dyn SpeculationPolicy> {
        Box::new(Self::default())
    }
}

/// Counts the trees a drafter proposed that hold drafts.
struct Counting<D> {
    inner: D,
    drafted: usize,
}

impl<D: Drafter<f32>> Drafter<f32> for Counting<D> {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn kind(&self) -> DraftKind {
        self.inner.kind()
    }
    fn propose(
        &mut self,
        request: &DraftRequest<'_>,
        decisions: &mut dyn specdec_kernels::sampling::Decisions<f32>,
    ) -> specdec_algorithms::Result<DraftTree<f32>> {
        let tree = self.inner.propose(request, decisions)?;
        self.drafted += usize::from(tree.len() > 1);
        Ok(tree)
    }
}

/// Runs `reqs` with a chain drafter under [`EveryOtherStep`] and, where it steps aside, n-gram
/// lookup under a fixed chain of 2; returns the generations and how many steps each drafted.
fn run_with_fallback(
    pair: &ToyPair,
    sampling: SamplingParams,
    reqs: &[Request],
) -> (Vec<Generation>, usize, usize) {
    let policy = Box::new(EveryOtherStep::default());
    run_with_fallback_under(pair, policy, options(sampling, 3), reqs).unwrap()
}

/// [`run_with_fallback`] with the chain's policy `policy` and `options`.
fn run_with_fallback_under(
    pair: &ToyPair,
    policy: Box<dyn SpeculationPolicy>,
    options: EngineOptions,
    reqs: &[Request],
) -> Result<(Vec<Generation>, usize, usize)> {
    let sampling = options.sampling;
    let (mode, method, kind) = if sampling.is_greedy() {
        (
            ChainMode::Argmax,
            VerifyMethod::Greedy,
            DraftKind::Deterministic,
        )
    } else {
        (
            ChainMode::Sample,
            VerifyMethod::ChainRejection,
            DraftKind::Iid,
        )
    };
    let fallback_method = if sampling.is_greedy() {
        VerifyMethod::Greedy
    } else {
        VerifyMethod::TargetOnly
    };
    let mut chain = Counting {
        inner: ChainDrafter::new(draft_lm(pair, sampling), mode),
        drafted: 0,
    };
    let mut ngram = Counting {
        inner: NgramDrafter::new(NgramConfig::default(), 3).unwrap(),
        drafted: 0,
    };
    let mut target = ToyLanguageModel::new(pair.target.clone(), 256, vec![]);
    let mut engine = Engine::new(
        &mut target,
        &mut chain,
        paired(method, kind),
        policy,
        options,
    )?
    .with_fallback(
        &mut ngram,
        paired(fallback_method, DraftKind::Deterministic),
        Box::new(FixedPolicy::chain(2)),
    )?;
    let generations = engine.run(reqs, &mut |_| {})?;
    Ok((generations, chain.drafted, ngram.drafted))
}

#[test]
fn a_fallback_drafter_drafts_where_the_first_steps_aside_and_keeps_greedy_output() {
    let greedy = SamplingParams::greedy();
    for seed in 0..3 {
        let pair = pair(seed);
        // prompts that repeat, so that n-gram lookup finds matches
        let reqs: Vec<Request> = (0..4)
            .map(|i| Request {
                id: i,
                seed: None,
                workload: None,
                prompt: vec![1, 2, 3, 1, 2, 3, 1, 2, (i % 3) as u32],
                stop: StopRule::new(16, &[]),
            })
            .collect();
        let expected = plain(&pair, options(greedy, 1), &reqs);
        let (generations, chain_steps, ngram_steps) = run_with_fallback(&pair, greedy, &reqs);
        let steps: usize = generations.iter().map(|g| g.steps.len()).sum();
        let drafted = generations
            .iter()
            .flat_map(|g| &g.steps)
            .filter(|s| s.proposed > 0)
            .count();
        let got: Vec<Vec<u32>> = generations.into_iter().map(|g| g.tokens).collect();
        assert_eq!(got, expected, "seed {seed}");
        assert!(
            chain_steps > 0 && ngram_steps > 0,
            "{chain_steps} {ngram_steps}"
        );
        // the chain drafts on odd steps only, n-gram lookup on some even ones
        assert!(
            chain_steps <= steps.div_ceil(2) + reqs.len(),
            "{chain_steps} of {steps}"
        );
        assert_eq!(chain_steps + ngram_steps, drafted, "seed {seed}");
    }
}

#[test]
fn sampled_speculation_with_a_fallback_matches_the_target_distribution() {
    // T = 1, as `sampled_chain_speculation_matches_the_target_distribution`: the chain drafts on
    // odd steps (rejection sampling), n-gram lookup on even ones (target-only verification).
    let pair = pair(11);
    let sampling = SamplingParams::with_temperature(1.0);
    let prompt = vec![1, 2, 1, 2];
    let reqs: Vec<Request> = (0..3000)
        .map(|id| Request {
            id,
            seed: None,
            workload: None,
            prompt: prompt.clone(),
            stop: StopRule::new(3, &[]),
        })
        .collect();
    let (generations, chain_steps, ngram_steps) = run_with_fallback(&pair, sampling, &reqs);
    assert!(
        chain_steps > 0 && ngram_steps > 0,
        "{chain_steps} {ngram_steps}"
    );
    let samples: Vec<Vec<u32>> = generations.into_iter().map(|g| g.tokens).collect();
    let expected = target_distribution::<f64>(&pair.target, &sampling, &prompt, 3).unwrap();
    let test = g_test_samples(&samples, &expected, 1e-3);
    assert!(test.passed(), "{test}");
}

#[test]
fn sequences_sharing_a_forward_each_see_their_share_of_its_time() {
    let reqs = requests(3, 12);
    let (generations, seen, loads) = run_recorded_with_loads(2, &reqs, 3);
    let records: Vec<&StepRecord> = generations.iter().flat_map(|g| &g.steps).collect();
    assert!(
        records.iter().any(|r| r.batch > 1),
        "the forwards were shared"
    );
    // Each record carries the whole shared forward; its sequences' shares add up to it.
    let forwards_s: f64 = records.iter().map(|r| r.target_s / r.batch as f64).sum();
    assert_eq!(seen.len(), records.len());
    let shares_s: f64 = seen.iter().map(|(_, t)| t.target_s).sum();
    assert!(
        (shares_s - forwards_s).abs() <= 1e-9 * forwards_s.max(1e-12),
        "shares {shares_s} s vs forwards {forwards_s} s"
    );
    let whole_s: f64 = records.iter().map(|r| r.target_s).sum();
    assert!(
        shares_s < whole_s,
        "a shared forward must not be charged to every sequence"
    );
    // Before each budget the policy heard how many sequences share the step, and each timing
    // carries the whole forward (its seconds, and its tokens: at least the sequence's tree,
    // at least one per sequence).
    let sorted = |mut v: Vec<usize>| {
        v.sort_unstable();
        v
    };
    assert_eq!(
        sorted(loads),
        sorted(records.iter().map(|r| r.batch).collect())
    );
    let mut forwards: Vec<f64> = seen.iter().map(|(_, t)| t.forward_s).collect();
    let mut whole: Vec<f64> = records.iter().map(|r| r.target_s).collect();
    forwards.sort_by(f64::total_cmp);
    whole.sort_by(f64::total_cmp);
    assert_eq!(forwards, whole);
    assert!(seen
        .iter()
        .all(|(proposed, t)| t.forward_tokens > *proposed && t.forward_tokens >= 1));
    assert!(seen
        .iter()
        .any(|(proposed, t)| t.forward_tokens > proposed + 1));
}

/// Distributions as their bit patterns, for exact comparison.
fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|p| p.to_bits()).collect())
        .collect()
}

#[test]
fn rows_along_a_path_come_from_one_pass_and_equal_the_rows_one_by_one() {
    let pair = pair(5);
    let params = SamplingParams {
        temperature: 0.8,
        ..SamplingParams::greedy()
    };
    let path: Vec<u32> = vec![3, 1, 4, 0, 2, 1, 5];
    for count in 1..=path.len() {
        let mut one_by_one = draft_lm(&pair, params);
        let first = path.len() + 1 - count;
        let want: Vec<Vec<f32>> = (first..=path.len())
            .map(|end| one_by_one.next_probs(0, &path[..end]).unwrap())
            .collect();
        let mut along = draft_lm(&pair, params);
        // a cached prefix that diverges from the path is rewound first
        along.next_probs(0, &[3, 1, 5, 5]).unwrap();
        let before = along.forwarded_tokens();
        let got = along.next_probs_along(0, &path, count).unwrap();
        assert_eq!(bits(&got), bits(&want), "count {count}");
        // one pass over what the pool did not share: the path from its third token
        let forwarded = along.forwarded_tokens() - before;
        assert_eq!(
            forwarded as usize,
            path.len() - 2.min(path.len() - count),
            "count {count}"
        );
        // and a plain query after it reuses the pass
        let again = along.forwarded_tokens();
        assert_eq!(along.next_probs(0, &path).unwrap(), want[count - 1]);
        assert_eq!(along.forwarded_tokens(), again);
    }
    let mut model = draft_lm(&pair, params);
    assert!(model.next_probs_along(0, &path, 0).is_err());
    assert!(model.next_probs_along(0, &path, path.len() + 1).is_err());
}

#[test]
fn rows_after_several_paths_come_from_one_tree_pass_and_equal_the_rows_one_by_one() {
    let pair = pair(6);
    let params = SamplingParams {
        temperature: 0.8,
        ..SamplingParams::greedy()
    };
    let context: Vec<u32> = vec![3, 1, 4, 0];
    let paths: Vec<Vec<u32>> = vec![vec![2], vec![5, 1], vec![], vec![2, 2, 3], vec![5, 1, 0]];
    let mut one_by_one = draft_lm(&pair, params);
    let want: Vec<Vec<f32>> = paths
        .iter()
        .map(|path| {
            let mut tokens = context.clone();
            tokens.extend(path);
            one_by_one.next_probs(0, &tokens).unwrap()
        })
        .collect();
    let mut tree = draft_lm(&pair, params);
    // a cached prefix that diverges from the context is rewound first
    tree.next_probs(0, &[3, 1, 5]).unwrap();
    let before = tree.forwarded_tokens();
    let got = tree.next_probs_paths(0, &context, &paths).unwrap();
    assert_eq!(bits(&got), bits(&want));
    // the context's third token, then one tree: its last token and the six trie nodes
    // [2], [5], [5 1], [2 2], [2 2 3], [5 1 0]
    assert_eq!(tree.forwarded_tokens() - before, 1 + 1 + 6);
    // the context's own row is cached after it
    let again = tree.forwarded_tokens();
    assert_eq!(tree.next_probs(0, &context).unwrap(), want[2]);
    assert_eq!(tree.forwarded_tokens(), again);
    assert!(tree.next_probs_paths(0, &[], &paths).is_err());
}

/// A chain drafter that records every feedback and release it hears.
struct Recording {
    inner: ChainDrafter<LmDraftModel<ToyLanguageModel>>,
    /// (sequence, context, committed, accepted) per feedback, in order.
    feedback: Vec<(u64, Vec<u32>, usize, usize)>,
    released: Vec<u64>,
}

impl Drafter<f32> for Recording {
    fn name(&self) -> String {
        "recording".into()
    }
    fn kind(&self) -> DraftKind {
        Drafter::<f32>::kind(&self.inner)
    }
    fn propose(
        &mut self,
        request: &DraftRequest<'_>,
        decisions: &mut dyn specdec_kernels::sampling::Decisions<f32>,
    ) -> specdec_algorithms::Result<DraftTree<f32>> {
        self.inner.propose(request, decisions)
    }
    fn observe(&mut self, feedback: &DraftFeedback<'_>) -> specdec_algorithms::Result<()> {
        assert!(feedback.features.is_none(), "no drafter asked for features");
        self.feedback.push((
            feedback.sequence,
            feedback.context.to_vec(),
            feedback.committed,
            feedback.accepted,
        ));
        self.inner.observe(feedback)
    }
    fn release(&mut self, sequence: u64) -> specdec_algorithms::Result<()> {
        self.released.push(sequence);
        self.inner.release(sequence)
    }
}

#[test]
fn drafters_hear_every_verdict_and_every_retirement() {
    let greedy = SamplingParams::greedy();
    let pair = pair(3);
    let reqs = requests(3, 10);
    let expected = plain(&pair, options(greedy, 1), &reqs);
    let mut drafter = Recording {
        inner: ChainDrafter::new(draft_lm(&pair, greedy), ChainMode::Argmax),
        feedback: Vec::new(),
        released: Vec::new(),
    };
    let generations = run(
        &pair,
        &mut drafter,
        paired(VerifyMethod::Greedy, DraftKind::Deterministic),
        Box::new(FixedPolicy::chain(3)),
        options(greedy, 2),
        &reqs,
    );
    for (g, want) in generations.iter().zip(&expected) {
        assert_eq!(&g.tokens, want, "feedback must not change the output");
    }
    let mut released = drafter.released.clone();
    released.sort_unstable();
    assert_eq!(released, vec![0, 1, 2], "each request released once");
    for (request, g) in reqs.iter().zip(&generations) {
        let heard: Vec<_> = drafter
            .feedback
            .iter()
            .filter(|f| f.0 == request.id)
            .collect();
        // admission, then every step but the last (the retiring one is released instead)
        assert_eq!(heard.len(), g.steps.len(), "request {}", request.id);
        assert_eq!(heard[0].1, request.prompt);
        assert_eq!((heard[0].2, heard[0].3), (request.prompt.len() - 1, 0));
        let mut context = request.prompt.clone();
        for (feedback, step) in heard[1..].iter().zip(&g.steps) {
            context.extend_from_slice(
                &g.tokens[context.len() - request.prompt.len()..][..step.emitted],
            );
            assert_eq!(
                feedback.1, context,
                "request {}: context after a step",
                request.id
            );
            assert_eq!(feedback.2, context.len() - 1);
            assert_eq!(feedback.3, step.accepted);
        }
    }
}

#[test]
fn the_draft_model_keeps_exactly_what_the_target_committed() {
    let greedy = SamplingParams::greedy();
    let pair = pair(4);
    let mut lm = draft_lm(&pair, greedy);
    let context = [1u32, 2, 3];
    // a drafted chain of 3 after the context: the model holds context + 2 drafts
    let mut path = context.to_vec();
    for _ in 0..3 {
        let q = lm.next_probs(9, &path).unwrap();
        path.push(specdec_kernels::sampling::argmax(&q) as u32);
    }
    let forwarded = lm.forwarded_tokens();
    // the target accepted one draft and chose another next token
    let mut after = path[..4].to_vec();
    after.push((path[4] + 1) % VOCAB as u32);
    lm.observe(&DraftFeedback {
        sequence: 9,
        context: &after,
        prompt_len: context.len(),
        committed: after.len() - 1,
        accepted: 1,
        features: None,
    })
    .unwrap();
    // the next query forwards only the new root
    let fresh = lm.next_probs(9, &after).unwrap();
    assert_eq!(lm.forwarded_tokens(), forwarded + 1);
    let mut alone = draft_lm(&pair, greedy);
    assert_eq!(fresh, alone.next_probs(1, &after).unwrap());
    // tokens forwarded off the final draft (as a staged drafter's level 1 does) are dropped
    // where they stop agreeing with the context
    let forwarded = lm.forwarded_tokens();
    let other = [1u32, 2, (path[2] + 1) % VOCAB as u32, 0];
    lm.observe(&DraftFeedback {
        sequence: 9,
        context: &other,
        prompt_len: 3,
        committed: 3,
        accepted: 0,
        features: None,
    })
    .unwrap();
    assert_eq!(
        lm.next_probs(9, &other).unwrap(),
        alone.next_probs(2, &other).unwrap()
    );
    assert_eq!(
        lm.forwarded_tokens(),
        forwarded + 2,
        "kept [1, 2], forwarded the rest"
    );
    lm.release(9).unwrap();
}

#[test]
fn a_staged_drafter_whose_level_1_read_past_its_final_draft_stays_exact() {
    // Level 1 forwards level 0's whole proposal; when it replaces the last proposed token by
    // its own and the target accepts the result, the draft model holds a token the context
    // does not: the verdict must cut it, not trust the kept path.
    let greedy = SamplingParams::greedy();
    for seed in 0..12 {
        let pair = pair(seed);
        let reqs = requests(6, 40);
        let expected = plain(&pair, options(greedy, 1), &reqs);
        // level 1 is the target itself: whatever it puts in place of a proposed token is accepted
        let itself = ToyPair::new(pair.target.clone(), pair.target.clone()).unwrap();
        let mut staged = StagedDrafter::new(
            NgramDrafter::new(NgramConfig::default(), 3).unwrap(),
            draft_lm(&itself, greedy),
        );
        let got = run(
            &pair,
            &mut staged,
            paired(VerifyMethod::Greedy, DraftKind::Iid),
            Box::new(FixedPolicy::chain(2)),
            options(greedy, 2),
            &reqs,
        );
        let got: Vec<Vec<u32>> = got.into_iter().map(|g| g.tokens).collect();
        assert_eq!(got, expected, "seed {seed}");
    }
}

/// A policy whose budgets (plain, or chains of 1–4) follow a private random stream, as a
/// cost-model policy's follow the timings of the moment: two streams draft differently.
#[derive(Clone)]
struct Jittery {
    state: u64,
}

impl SpeculationPolicy for Jittery {
    fn name(&self) -> String {
        "jittery".into()
    }
    fn next_budget(&mut self) -> Budget {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        Budget::chain((self.state % 5) as usize)
    }
    fn observe(&mut self, _outcome: &StepOutcome) {}
    fn fork(&self) -> Box<dyn SpeculationPolicy> {
        Box::new(self.clone())
    }
}

fn decisions_of(generations: &[Generation]) -> Vec<Option<PolicyDecision>> {
    generations
        .iter()
        .flat_map(|g| g.steps.iter().map(|s| s.decision.clone()))
        .collect()
}

#[test]
fn a_replay_repeats_a_sampled_run_whatever_the_policy_would_decide_now() {
    let sampling = SamplingParams::with_temperature(1.0);
    let pair = pair(3);
    let reqs: Vec<Request> = (0..3)
        .map(|i| Request {
            id: i,
            seed: None,
            workload: None,
            prompt: vec![1, 2, 3, 1, 2, 3, 1, 2, (i % 3) as u32],
            stop: StopRule::new(24, &[]),
        })
        .collect();
    let run = |state: u64, replay: Option<RecordedDecisions>| {
        let mut options = options(sampling, 3);
        options.replay = replay.map(Arc::new);
        run_with_fallback_under(&pair, Box::new(Jittery { state }), options, &reqs)
    };
    let (recorded, _, fallback_steps) = run(1, None).unwrap();
    assert!(
        fallback_steps > 0,
        "the fallback drafter drafted some steps"
    );
    // the same seed with other budgets: other draws, another (equally distributed) text
    let (other, _, _) = run(99, None).unwrap();
    assert_ne!(decisions_of(&other), decisions_of(&recorded));
    let tokens = |g: &[Generation]| g.iter().map(|g| g.tokens.clone()).collect::<Vec<_>>();
    assert_ne!(tokens(&other), tokens(&recorded));
    // replayed through a JSONL file, under the other policy: the recorded run again
    let dir = std::env::temp_dir().join(format!("specdec-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("steps.jsonl");
    let steps: Vec<StepRecord> = recorded.iter().flat_map(|g| g.steps.clone()).collect();
    crate::report::write_jsonl(&file, &steps).unwrap();
    let (replayed, _, _) = run(99, Some(RecordedDecisions::read(&file).unwrap())).unwrap();
    assert_eq!(tokens(&replayed), tokens(&recorded));
    assert_eq!(decisions_of(&replayed), decisions_of(&recorded));
    assert!(decisions_of(&replayed).iter().all(Option::is_some));

    // a step that turns out otherwise than recorded stops the replay, named
    let mut tampered = steps.clone();
    let at = tampered
        .iter()
        .position(|s| s.proposed > s.accepted)
        .unwrap();
    tampered[at].accepted += 1;
    let err = run(
        99,
        Some(RecordedDecisions::from_records(&tampered).unwrap()),
    )
    .unwrap_err()
    .to_string();
    let (request, step) = (tampered[at].request, tampered[at].step);
    assert!(
        err.contains(&format!("replay diverged at request {request} step {step}"))
            && err.contains("drafts accepted"),
        "{err}"
    );
    // so does a step that emitted other tokens (another seed or prompt, same budgets)
    let mut tampered = steps.clone();
    tampered[0].tokens[0] += 1;
    let err = run(
        99,
        Some(RecordedDecisions::from_records(&tampered).unwrap()),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("step 0: tokens"), "{err}");
    // a record cut short: the run outlives it
    let last = steps.iter().filter(|s| s.request == 0).count() - 1;
    let short: Vec<StepRecord> = steps
        .iter()
        .filter(|s| !(s.request == 0 && s.step == last))
        .cloned()
        .collect();
    let err = run(99, Some(RecordedDecisions::from_records(&short).unwrap()))
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("request 0 step {last}")), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn recorded_decisions_refuse_records_they_cannot_replay() {
    let step = |request: usize, step: usize, decision: Option<PolicyDecision>| StepRecord {
        method: "m".into(),
        request,
        step,
        repeat: 0,
        proposed: 2,
        draft_depth: 2,
        accepted: 1,
        emitted: 2,
        draft_s: 0.0,
        target_s: 0.0,
        verify_s: 0.0,
        commit_s: 0.0,
        overhead_s: 0.0,
        prefill_s: 0.0,
        prefill_work_s: None,
        kv_blocks: 0,
        batch: 1,
        drafter: "d".into(),
        decision,
        tokens: vec![3, 4],
        ops: Vec::new(),
    };
    let chain = Some(PolicyDecision::new(false, &Budget::Chain(2)));
    let err = |records: &[StepRecord]| {
        RecordedDecisions::from_records(records)
            .unwrap_err()
            .to_string()
    };
    let e = err(&[step(0, 0, None)]);
    assert!(
        e.contains("request 0 step 0") && e.contains("no policy decision"),
        "{e}"
    );
    let e = err(&[step(0, 0, chain.clone()), step(0, 0, chain.clone())]);
    assert!(e.contains("step 0: is recorded twice"), "{e}");
    let e = err(&[step(4, 0, chain.clone()), step(4, 2, chain.clone())]);
    assert!(e.contains("request 4 step 1: is missing"), "{e}");
    // a fallback step replayed by a method without a fallback drafter
    let fallback = Some(PolicyDecision::new(true, &Budget::Chain(2)));
    let recorded = RecordedDecisions::from_records(&[step(0, 0, fallback)]).unwrap();
    let e = recorded.decision(0, 0, false).unwrap_err().to_string();
    assert!(e.contains("fallback drafter"), "{e}");
    assert_eq!(
        recorded.decision(0, 0, true).unwrap(),
        (DrafterChoice::Fallback, Budget::Chain(2))
    );
}

#[test]
fn every_budget_survives_its_record_in_json() {
    let shape = TreeShape::from_branching(&[3, 2]);
    for budget in [
        Budget::Plain,
        Budget::Chain(5),
        Budget::TreeNodes(12),
        Budget::Tree(Arc::new(shape)),
    ] {
        let decision = PolicyDecision::new(true, &budget);
        let json = serde_json::to_string(&decision).unwrap();
        let back: PolicyDecision = serde_json::from_str(&json).unwrap();
        assert_eq!(back.budget().unwrap(), budget, "{json}");
        assert!(back.fallback);
    }
    // a recorded tree that is no tree is refused when read back
    let bad: PolicyDecision = serde_json::from_str(
        r#"{"fallback":false,"budget":{"tree":{"parents":[null,5],"ranks":[0,0]}}}"#,
    )
    .unwrap();
    assert!(bad.budget().is_err());
}

#[test]
fn a_batched_query_comes_from_one_pass_and_equals_each_sequence_asked_alone() {
    let pair = pair(5);
    let params = SamplingParams {
        temperature: 0.8,
        ..SamplingParams::greedy()
    };
    // sequence 0: nothing kept; 1: its query exactly kept (served from the cache); 2: a kept
    // prefix that diverges; 3: a long uncached tail (a catch-up past what rides with the batch)
    let queries: Vec<(u64, Vec<u32>)> = vec![
        (0, vec![3, 1, 4]),
        (1, vec![2, 2, 5]),
        (2, vec![3, 1, 5, 0]),
        (3, vec![1, 2, 3, 4, 5, 0, 1, 2, 3, 4]),
    ];
    let prepare = |model: &mut LmDraftModel<ToyLanguageModel>| {
        model.next_probs(1, &[2, 2, 5]).unwrap();
        model.next_probs(2, &[3, 1, 4, 4, 4]).unwrap();
        model.next_probs(3, &[1, 2]).unwrap();
    };
    let mut alone = draft_lm(&pair, params);
    prepare(&mut alone);
    let want: Vec<Vec<f32>> = queries
        .iter()
        .map(|(sequence, tokens)| alone.next_probs(*sequence, tokens).unwrap())
        .collect();
    let mut batched = draft_lm(&pair, params);
    prepare(&mut batched);
    let calls = batched.model().forward_calls();
    let asked: Vec<(u64, &[u32])> = queries.iter().map(|(s, t)| (*s, t.as_slice())).collect();
    let got = batched.next_probs_batch(&asked).unwrap();
    assert_eq!(bits(&got), bits(&want));
    // the toy model prefills through forward: sequence 3's tail beyond the catch-up is one
    // call, the batch the other
    assert_eq!(
        batched.model().forward_calls(),
        calls + 2,
        "one pass for the batch"
    );
    // the kept state is the same as after asking one by one: the next depth agrees too
    let next: Vec<(u64, Vec<u32>)> = queries
        .iter()
        .map(|(s, t)| (*s, t.iter().copied().chain([1]).collect()))
        .collect();
    let asked: Vec<(u64, &[u32])> = next.iter().map(|(s, t)| (*s, t.as_slice())).collect();
    let forwarded = batched.forwarded_tokens();
    let got = batched.next_probs_batch(&asked).unwrap();
    let want: Vec<Vec<f32>> = next
        .iter()
        .map(|(sequence, tokens)| alone.next_probs(*sequence, tokens).unwrap())
        .collect();
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(
        batched.forwarded_tokens() - forwarded,
        4,
        "one token per sequence"
    );
    // bad batches are refused
    assert!(batched.next_probs_batch(&[(0, &[1]), (0, &[2])]).is_err());
    assert!(batched.next_probs_batch(&[(0, &[1]), (1, &[])]).is_err());
}

#[test]
fn a_batch_of_tree_queries_comes_from_one_pass_and_equals_each_asked_alone() {
    let pair = pair(8);
    let params = SamplingParams {
        temperature: 0.8,
        ..SamplingParams::greedy()
    };
    // sequence 0: nothing kept; 1: a kept prefix that diverges; 2: only the context's own row
    let contexts: Vec<(u64, Vec<u32>)> =
        vec![(0, vec![3, 1, 4]), (1, vec![2, 5, 0]), (2, vec![4, 4])];
    let paths: Vec<Vec<Vec<u32>>> = vec![
        vec![vec![2], vec![5, 1], vec![2, 2]],
        vec![vec![], vec![1, 1, 1]],
        vec![vec![]],
    ];
    let prepare = |model: &mut LmDraftModel<ToyLanguageModel>| {
        model.next_probs(1, &[2, 5, 3]).unwrap();
    };
    let mut alone = draft_lm(&pair, params);
    prepare(&mut alone);
    let want: Vec<Vec<Vec<f32>>> = contexts
        .iter()
        .zip(&paths)
        .map(|((sequence, context), paths)| {
            alone.next_probs_paths(*sequence, context, paths).unwrap()
        })
        .collect();
    let mut batched = draft_lm(&pair, params);
    prepare(&mut batched);
    let calls = batched.model().forward_calls();
    let queries: Vec<PathsQuery<'_>> = contexts
        .iter()
        .zip(&paths)
        .map(|((sequence, context), paths)| PathsQuery {
            sequence: *sequence,
            context,
            paths,
        })
        .collect();
    let got = batched.next_probs_paths_batch(&queries).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(bits(g), bits(w));
    }
    // sequences 0 and 2 prefill their contexts but the root (a call each: the toy model
    // prefills through forward), sequence 1 only rewinds its divergent token; then one pass
    // for the three trees
    assert_eq!(
        batched.model().forward_calls(),
        calls + 3,
        "one pass for the batch"
    );
    // afterwards each context's own row is cached, as after asking one by one
    for (sequence, context) in &contexts {
        let before = batched.forwarded_tokens();
        assert_eq!(
            bits(&[batched.next_probs(*sequence, context).unwrap()]),
            bits(&[alone.next_probs(*sequence, context).unwrap()])
        );
        assert_eq!(batched.forwarded_tokens(), before, "sequence {sequence}");
    }
    let twice = [queries[0], queries[0]];
    let err = batched.next_probs_paths_batch(&twice).unwrap_err();
    assert!(err.to_string().contains("appears twice"), "{err}");
}

/// A target whose forward leaves its logits in one batch buffer and verifies them there with
/// the batched CPU twin of the device verifier ([`specdec_models::model::verify_rows`] over
/// [`CpuVerifier`](specdec_kernels::verification::CpuVerifier)), as the CUDA runner does over
/// its device buffer; everything else is the toy model's.
struct BatchVerifying(ToyLanguageModel);

impl LanguageModel for BatchVerifying {
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
    fn bos_id(&self) -> Option<u32> {
        self.0.bos_id()
    }
    fn eos_ids(&self) -> &[u32] {
        self.0.eos_ids()
    }
    fn max_context(&self) -> usize {
        self.0.max_context()
    }
    fn new_sequence(&mut self) -> specdec_models::Result<SeqId> {
        self.0.new_sequence()
    }
    fn fork(&mut self, seq: SeqId) -> specdec_models::Result<SeqId> {
        self.0.fork(seq)
    }
    fn release(&mut self, seq: SeqId) -> specdec_models::Result<()> {
        self.0.release(seq)
    }
    fn seq_len(&self, seq: SeqId) -> specdec_models::Result<usize> {
        self.0.seq_len(seq)
    }
    fn forward(&mut self, steps: &[SequenceStep<'_>]) -> specdec_models::Result<Vec<Logits>> {
        self.0.forward(steps)
    }
    fn forward_verify(
        &mut self,
        steps: &[SequenceStep<'_>],
        request: &VerifyRequest<'_>,
    ) -> specdec_models::Result<specdec_models::VerifiedBatch> {
        specdec_models::model::check_request(steps, request)?;
        let logits = self.0.forward(steps)?;
        let mut rows: Vec<f32> = logits.iter().flat_map(|l| l.as_slice().to_vec()).collect();
        let verdicts = specdec_models::model::verify_rows(
            &specdec_kernels::verification::CpuVerifier,
            &mut rows,
            self.vocab_size(),
            request,
        )?;
        Ok(specdec_models::VerifiedBatch {
            verdicts,
            features: vec![None; steps.len()],
            forward_s: 0.0,
            verify_s: 0.0,
        })
    }
    fn commit(&mut self, seq: SeqId, path: &[usize]) -> specdec_models::Result<()> {
        self.0.commit(seq, path)
    }
    fn rewind(&mut self, seq: SeqId, n: usize) -> specdec_models::Result<()> {
        self.0.rewind(seq, n)
    }
}

/// A kernel method hidden behind a custom verifier: the engine verifies it on the host, one
/// sequence at a time (no [`Verifier::method`]).
struct HostOnly(VerifyMethod);

impl Verifier<f32> for HostOnly {
    fn name(&self) -> String {
        format!("host {}", self.0.name())
    }
    fn lossless(&self) -> bool {
        Verifier::<f32>::lossless(&self.0)
    }
    fn draft_kinds(&self) -> &[DraftKind] {
        Verifier::<f32>::draft_kinds(&self.0)
    }
    fn verify(
        &self,
        input: &VerifyInput<'_, f32>,
        decisions: &mut dyn specdec_kernels::sampling::Decisions<f32>,
    ) -> specdec_algorithms::Result<Verdict> {
        Verifier::<f32>::verify(&self.0, input, decisions)
    }
}

#[test]
fn verifying_the_batch_where_the_logits_are_equals_verifying_each_sequence_on_the_host() {
    // T = 1, batches of 4 with two requests seeded on their own: the engine's three verify
    // paths (a custom verifier on the host, the model's default host verification, the
    // batched verifier a device runs) sample the same tokens, for chains and sampled trees.
    let pair = pair(3);
    let sampling = SamplingParams::with_temperature(1.0);
    let reqs: Vec<Request> = (0..8u64)
        .map(|id| Request {
            id,
            seed: (id % 3 == 0).then_some(100 + id),
            workload: None,
            prompt: vec![(id % VOCAB as u64) as u32, 2],
            stop: StopRule::new(16, &[]),
        })
        .collect();
    let sample = |method: VerifyMethod, tree: bool, path: usize, run_seed: u64| {
        let mut chain = ChainDrafter::new(draft_lm(&pair, sampling), ChainMode::Sample);
        let mut shaped = ShapeDrafter::new(
            draft_lm(&pair, sampling),
            TreeFill::WithoutReplacement,
            TreeShape::from_branching(&[2, 2]),
        );
        let (drafter, budget): (&mut dyn Drafter<f32>, usize) = match tree {
            false => (&mut chain, 3),
            true => (&mut shaped, 6),
        };
        let verifier: Arc<dyn Verifier<f32>> = match path {
            0 => Arc::new(HostOnly(method)),
            _ => Arc::new(method),
        };
        let verifier = PairedVerifier::new(verifier, drafter.kind()).unwrap();
        let options = EngineOptions {
            seed: run_seed,
            ..options(sampling, 4)
        };
        let policy = Box::new(FixedPolicy::chain(budget));
        let table = ToyLanguageModel::new(pair.target.clone(), 256, vec![]);
        let generations = match path {
            2 => {
                let mut target = BatchVerifying(table);
                let mut engine =
                    Engine::new(&mut target, drafter, verifier, policy, options).unwrap();
                engine.run(&reqs, &mut |_| {}).unwrap()
            }
            _ => {
                let mut target = table;
                let mut engine =
                    Engine::new(&mut target, drafter, verifier, policy, options).unwrap();
                engine.run(&reqs, &mut |_| {}).unwrap()
            }
        };
        generations
            .into_iter()
            .map(|g| g.tokens)
            .collect::<Vec<_>>()
    };
    for (method, tree) in [
        (VerifyMethod::ChainRejection, false),
        (VerifyMethod::RecursiveRejection, true),
    ] {
        let host = sample(method, tree, 0, 7);
        assert_eq!(
            sample(method, tree, 1, 7),
            host,
            "{method:?}: model's host path"
        );
        assert_eq!(sample(method, tree, 2, 7), host, "{method:?}: batched path");
        // the negative control: another run seed samples otherwise
        assert_ne!(
            sample(method, tree, 2, 8),
            host,
            "{method:?}: run seed ignored"
        );
    }
}

/// Chains of 2; counts the workload prototypes the engine asks for.
#[derive(Clone, Default)]
struct WorkloadCounter {
    prototypes: Arc<std::sync::atomic::AtomicUsize>,
}

impl SpeculationPolicy for WorkloadCounter {
    fn name(&self) -> String {
        "workload-counter".into()
    }
    fn next_budget(&mut self) -> Budget {
        Budget::Chain(2)
    }
    fn observe(&mut self, _outcome: &StepOutcome) {}
    fn fork(&self) -> Box<dyn SpeculationPolicy> {
        Box::new(self.clone())
    }
    fn fork_for_new_workload(&self) -> Box<dyn SpeculationPolicy> {
        self.prototypes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::new(self.clone())
    }
}

#[test]
fn each_named_workload_gets_its_own_policy_prototype_and_the_same_tokens() {
    let greedy = SamplingParams::greedy();
    let pair = pair(4);
    let mut reqs = requests(6, 12);
    let expected = plain(&pair, options(greedy, 2), &reqs);
    for (request, workload) in reqs
        .iter_mut()
        .zip(["chat", "code", "chat", "", "code", ""])
    {
        request.workload = (!workload.is_empty()).then(|| workload.to_owned());
    }
    let counter = WorkloadCounter::default();
    let mut target = ToyLanguageModel::new(pair.target.clone(), 256, vec![]);
    let mut chain = ChainDrafter::new(draft_lm(&pair, greedy), ChainMode::Argmax);
    let verifier = paired(VerifyMethod::Greedy, DraftKind::Deterministic);
    let mut engine = Engine::new(
        &mut target,
        &mut chain,
        verifier,
        Box::new(counter.clone()),
        options(greedy, 2),
    )
    .unwrap();
    let got: Vec<Vec<u32>> = engine
        .run(&reqs, &mut |_| {})
        .unwrap()
        .into_iter()
        .map(|g| g.tokens)
        .collect();
    assert_eq!(got, expected);
    let prototypes = || counter.prototypes.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        prototypes(),
        2,
        "one per named workload, kept across requests"
    );
    // 62 more names fill the engine's 64; one more is refused before anything runs, naming it
    let named = |id: usize| Request {
        id: 100 + id as u64,
        workload: Some(format!("w{id}")),
        ..requests(1, 1)[0].clone()
    };
    let fill: Vec<Request> = (0..MAX_WORKLOADS - 2).map(named).collect();
    engine.run(&fill, &mut |_| {}).unwrap();
    assert_eq!(prototypes(), MAX_WORKLOADS);
    let mut done_calls = 0;
    let one_more = [requests(1, 1)[0].clone(), named(MAX_WORKLOADS)];
    let err = engine
        .run(&one_more, &mut |_| done_calls += 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("workload `w64`") && err.contains("64"),
        "{err}"
    );
    assert_eq!(done_calls, 0, "nothing ran before the refusal");
    // known names still run
    engine.run(&fill[..3], &mut |_| {}).unwrap();
    assert_eq!(prototypes(), MAX_WORKLOADS);
}

/// Asks for chains of 4 and keeps one draft fewer than each offer, counting the offers it was
/// asked to price and the drafts of each step it observed.
#[derive(Clone, Default)]
struct KeepsOneFewer {
    offers: Arc<std::sync::atomic::AtomicUsize>,
    observed: Arc<std::sync::Mutex<Vec<usize>>>,
}

impl SpeculationPolicy for KeepsOneFewer {
    fn name(&self) -> String {
        "keeps-one-fewer".into()
    }
    fn next_budget(&mut self) -> Budget {
        Budget::Chain(4)
    }
    fn keep_drafts(&mut self, offered: usize) -> usize {
        self.offers
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        offered - 1
    }
    fn observe(&mut self, outcome: &StepOutcome) {
        self.observed.lock().unwrap().push(outcome.proposed);
    }
    fn fork(&self) -> Box<dyn SpeculationPolicy> {
        Box::new(self.clone())
    }
}

/// `n` requests of a repetitive prompt (n-gram lookup finds matches), `tokens` tokens each.
fn repetitive(n: u64, tokens: usize) -> Vec<Request> {
    (0..n)
        .map(|id| Request {
            id,
            seed: None,
            workload: None,
            prompt: vec![1, 2, 3, 1, 2, 3, 1, 2],
            stop: StopRule::new(tokens, &[]),
        })
        .collect()
}

#[test]
fn a_policy_keeps_a_prefix_of_deterministic_drafts_only_and_stays_lossless() {
    let pair = pair(5);
    let ngram = || NgramDrafter::new(NgramConfig::default(), 4).unwrap();
    let target_only = || paired(VerifyMethod::TargetOnly, DraftKind::Deterministic);
    // T = 0: every offer verified one draft short, recorded as the step's budget; the text is
    // plain decoding's
    let greedy = SamplingParams::greedy();
    let reqs = repetitive(4, 16);
    let policy = KeepsOneFewer::default();
    let got = run(
        &pair,
        &mut ngram(),
        paired(VerifyMethod::Greedy, DraftKind::Deterministic),
        Box::new(policy.clone()),
        options(greedy, 2),
        &reqs,
    );
    let tokens = |g: &[Generation]| g.iter().map(|g| g.tokens.clone()).collect::<Vec<_>>();
    assert_eq!(tokens(&got), plain(&pair, options(greedy, 1), &reqs));
    let steps: Vec<&StepRecord> = got.iter().flat_map(|g| &g.steps).collect();
    let verified = steps.iter().filter(|s| s.proposed > 0).count();
    assert!(verified > 0, "some trimmed offers were verified");
    let offers = policy.offers.load(std::sync::atomic::Ordering::Relaxed);
    assert!(offers >= verified);
    for step in &steps {
        let budget = step.decision.as_ref().unwrap().budget().unwrap();
        assert!(step.proposed < 4, "{step:?}");
        assert!(step.proposed <= budget.max_drafts(), "{step:?}");
    }
    let observed = policy.observed.lock().unwrap().clone();
    assert_eq!(observed.iter().filter(|&&p| p > 0).count(), verified);

    // T = 1: the first three tokens over many request ids follow the target's distribution
    let sampling = SamplingParams::with_temperature(1.0);
    let reqs = repetitive(3000, 3);
    let expected = target_distribution::<f64>(&pair.target, &sampling, &reqs[0].prompt, 3).unwrap();
    let policy = KeepsOneFewer::default();
    let got = run(
        &pair,
        &mut ngram(),
        target_only(),
        Box::new(policy.clone()),
        options(sampling, 4),
        &reqs,
    );
    assert!(policy.offers.load(std::sync::atomic::Ordering::Relaxed) > 1000);
    let test = g_test_samples(&tokens(&got), &expected, 1e-3);
    assert!(test.passed(), "{test}");

    // and a replay of those steps under a policy that would keep them all repeats the text
    let reqs = repetitive(6, 12);
    let recorded = run(
        &pair,
        &mut ngram(),
        target_only(),
        Box::new(KeepsOneFewer::default()),
        options(sampling, 3),
        &reqs,
    );
    let steps: Vec<StepRecord> = recorded.iter().flat_map(|g| g.steps.clone()).collect();
    let mut replaying = options(sampling, 3);
    replaying.replay = Some(Arc::new(RecordedDecisions::from_records(&steps).unwrap()));
    let replayed = run(
        &pair,
        &mut ngram(),
        target_only(),
        Box::new(FixedPolicy::chain(4)),
        replaying,
        &reqs,
    );
    assert_eq!(tokens(&replayed), tokens(&recorded));

    // sampled drafts are verified whole: the policy is never asked to trim them
    let policy = KeepsOneFewer::default();
    let mut chain = ChainDrafter::new(draft_lm(&pair, sampling), ChainMode::Sample);
    let got = run(
        &pair,
        &mut chain,
        paired(VerifyMethod::ChainRejection, DraftKind::Iid),
        Box::new(policy.clone()),
        options(sampling, 2),
        &repetitive(2, 8),
    );
    assert_eq!(policy.offers.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert!(got.iter().flat_map(|g| &g.steps).any(|s| s.proposed == 4));
}
