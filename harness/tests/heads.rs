//! Trained-head drafters in the engine, end to end over a real decoder (the synthetic Llama and
//! Qwen2 of `specdec_models::llama::synthetic`, with random heads of
//! `specdec_models::heads::synthetic`): the target hands its features to the drafters after
//! every verdict, the EAGLE head catches up, drafts chains, dynamic and static trees, Medusa
//! heads draft static trees, the staged drafter checks n-gram proposals with the EAGLE head, and greedy speculative output equals plain greedy output token for
//! token at batch sizes 1 and 3.

use std::sync::Arc;

use specdec_algorithms::drafters::{
    ChainDrafter, ChainMode, Drafter, DynamicTreeDrafter, EagleFeatureHead, FeatureDraftModel,
    MedusaDraftModel, NgramConfig, NgramDrafter, ShapeDrafter, StagedDrafter, TreeFill,
};
use specdec_algorithms::policy::FixedPolicy;
use specdec_algorithms::trees::TreeShape;
use specdec_algorithms::verify::{PairedVerifier, Verifier};
use specdec_harness::engine::{Engine, EngineOptions, NoDrafter, Penalties, Request, StopRule};
use specdec_kernels::sampling::SamplingParams;
use specdec_kernels::verification::{DraftKind, VerifyMethod};
use specdec_models::heads::synthetic::random_head;
use specdec_models::heads::{EagleHead, HeadKind, HeadOptions, HeadPrecision, MedusaHeads};
use specdec_models::llama::synthetic::synthetic;
use specdec_models::llama::{Architecture, LlamaModel, LlamaOptions, MatmulPath};
use specdec_models::LanguageModel;

fn target(arch: Architecture) -> LlamaModel {
    let mut model = LlamaModel::from_gguf(
        &synthetic(arch, 31),
        LlamaOptions {
            kv_capacity_tokens: 2048,
            kv_block_size: 16,
            kv_dtype: specdec_kernels::kv::KvDtype::F32,
            matmul: MatmulPath::Int8,
        },
    )
    .unwrap();
    let last = model.config().n_layers - 1;
    model.tap_features(&[last]).unwrap();
    model
}

fn requests() -> Vec<Request> {
    (0..4u32)
        .map(|i| Request {
            id: u64::from(i),
            seed: None,
            workload: None,
            prompt: (0..4 + 3 * i).map(|t| (t * 5 + i * 13) % 60).collect(),
            stop: StopRule::new(18, &[]),
        })
        .collect()
}

/// Tokens of every request and the drafts proposed over all steps.
fn run(
    target: &mut dyn LanguageModel,
    drafter: &mut dyn Drafter<f32>,
    k: usize,
    batch_size: usize,
) -> (Vec<Vec<u32>>, usize) {
    let verifier: Arc<dyn Verifier<f32>> = Arc::new(VerifyMethod::Greedy);
    let verifier = PairedVerifier::new(verifier, drafter.kind()).expect("greedy pairs with all");
    let options = EngineOptions {
        method: format!("k{k}"),
        sampling: SamplingParams::greedy(),
        penalties: Penalties::default(),
        seed: 3,
        batch_size,
        replay: None,
        op_split: false,
    };
    let policy = Box::new(FixedPolicy::chain(k));
    let mut engine =
        Engine::new(target, drafter, verifier, policy, options).expect("the engine starts");
    let generations = engine.run(&requests(), &mut |_| {}).expect("the run ends");
    let proposed = generations
        .iter()
        .flat_map(|g| &g.steps)
        .map(|s| s.proposed)
        .sum();
    (
        generations.into_iter().map(|g| g.tokens).collect(),
        proposed,
    )
}

/// Siblings are ranked by the plain softmax at T = 0 (greedy verification reads no q).
fn ranked() -> SamplingParams {
    SamplingParams::with_temperature(1.0)
}

#[test]
fn greedy_speculation_with_trained_heads_equals_plain_decoding() {
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let mut target = target(arch);
        let config = target.config().clone();
        let eagle = random_head(HeadKind::Eagle, &config, "synthetic.gguf", "00", 40, 5).unwrap();
        let medusa = random_head(HeadKind::Medusa, &config, "synthetic.gguf", "00", 40, 6).unwrap();
        let eagle_head = |sampling| {
            let head = EagleHead::new(&eagle, &target, HeadOptions::default()).unwrap();
            FeatureDraftModel::new(EagleFeatureHead::new(head, sampling).unwrap())
        };
        let mut chain = ChainDrafter::new(eagle_head(SamplingParams::greedy()), ChainMode::Argmax);
        let mut dynamic = DynamicTreeDrafter::new(eagle_head(ranked()), 6, 2, 2).unwrap();
        let mut static_tree = ShapeDrafter::new(
            eagle_head(ranked()),
            TreeFill::TopRanked,
            TreeShape::from_branching(&[2, 2]),
        );
        let heads = MedusaHeads::new(&medusa, &target, HeadPrecision::Int8).unwrap();
        let mut medusa_tree = ShapeDrafter::new(
            MedusaDraftModel::new(heads, ranked()),
            TreeFill::TopRanked,
            TreeShape::from_branching(&[2, 2]),
        );
        let mut staged = StagedDrafter::new(
            NgramDrafter::new(NgramConfig::default(), 16).unwrap(),
            eagle_head(SamplingParams::greedy()),
        );
        let (plain, _) = run(&mut target, &mut NoDrafter, 0, 1);
        assert!(plain.iter().all(|t| t.len() == 18));
        let drafters: [(&str, &mut dyn Drafter<f32>, usize); 5] = [
            ("eagle chain", &mut chain, 3),
            ("staged: n-gram → eagle", &mut staged, 3),
            ("eagle dynamic tree", &mut dynamic, 6),
            ("eagle static tree", &mut static_tree, 6),
            ("medusa tree", &mut medusa_tree, 6),
        ];
        for (name, drafter, k) in drafters {
            assert!(drafter.wants_features(), "{name}");
            for batch_size in [1, 3] {
                let (spec, proposed) = run(&mut target, drafter, k, batch_size);
                assert!(
                    proposed > 0,
                    "{arch:?} {name} batch {batch_size}: nothing drafted"
                );
                assert_eq!(
                    spec, plain,
                    "{arch:?} {name} batch {batch_size}: speculative ≠ plain"
                );
            }
        }
    }
}

#[test]
fn a_feature_drafter_needs_a_target_that_taps_features() {
    let mut plain = LlamaModel::from_gguf(
        &synthetic(Architecture::Llama, 31),
        LlamaOptions::with_matmul(MatmulPath::Int8),
    )
    .unwrap();
    let config = plain.config().clone();
    let eagle = random_head(HeadKind::Eagle, &config, "synthetic.gguf", "00", 40, 5).unwrap();
    let head = EagleHead::new(&eagle, &plain, HeadOptions::default()).unwrap();
    let model =
        FeatureDraftModel::new(EagleFeatureHead::new(head, SamplingParams::greedy()).unwrap());
    let mut drafter = ChainDrafter::new(model, ChainMode::Argmax);
    let verifier: Arc<dyn Verifier<f32>> = Arc::new(VerifyMethod::Greedy);
    let verifier = PairedVerifier::new(verifier, DraftKind::Deterministic).unwrap();
    let options = EngineOptions {
        method: "eagle".into(),
        sampling: SamplingParams::greedy(),
        penalties: Penalties::default(),
        seed: 0,
        batch_size: 1,
        replay: None,
        op_split: false,
    };
    let err = Engine::new(
        &mut plain,
        &mut drafter,
        verifier,
        Box::new(FixedPolicy::chain(2)),
        options,
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(
        err.contains("features") && err.contains("taps none"),
        "{err}"
    );
}

/// A drafter checking that every verdict carries the target's own features of the tokens it
/// committed (recomputed by a second instance of the target, bit for bit).
struct CheckingFeatures<D> {
    inner: D,
    reference: LlamaModel,
    checked_rows: usize,
}

impl<D: Drafter<f32>> Drafter<f32> for CheckingFeatures<D> {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn kind(&self) -> DraftKind {
        self.inner.kind()
    }
    fn propose(
        &mut self,
        request: &specdec_algorithms::drafters::DraftRequest<'_>,
        decisions: &mut dyn specdec_kernels::sampling::Decisions<f32>,
    ) -> specdec_algorithms::Result<specdec_kernels::verification::DraftTree<f32>> {
        self.inner.propose(request, decisions)
    }
    fn wants_features(&self) -> bool {
        true
    }
    fn observe(
        &mut self,
        feedback: &specdec_algorithms::drafters::DraftFeedback<'_>,
    ) -> specdec_algorithms::Result<()> {
        let features = feedback.features.expect("features handed over");
        let seq = self.reference.new_sequence().unwrap();
        let all = self
            .reference
            .prefill(seq, &feedback.context[..feedback.committed])
            .unwrap()
            .unwrap();
        self.reference.release(seq).unwrap();
        let rows = features.rows();
        let first = feedback.committed - rows;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(features.as_slice()),
            bits(&all.as_slice()[first * all.dim()..]),
            "sequence {}: the verdict's features are not the target's",
            feedback.sequence
        );
        self.checked_rows += rows;
        self.inner.observe(feedback)
    }
    fn release(&mut self, sequence: u64) -> specdec_algorithms::Result<()> {
        self.inner.release(sequence)
    }
}

#[test]
fn every_verdict_carries_the_targets_features_of_what_it_committed() {
    let mut target = target(Architecture::Qwen2);
    let config = target.config().clone();
    let eagle = random_head(HeadKind::Eagle, &config, "synthetic.gguf", "00", 40, 5).unwrap();
    let head = EagleHead::new(&eagle, &target, HeadOptions::default()).unwrap();
    let model =
        FeatureDraftModel::new(EagleFeatureHead::new(head, SamplingParams::greedy()).unwrap());
    let mut drafter = CheckingFeatures {
        inner: ChainDrafter::new(model, ChainMode::Argmax),
        reference: self::target(Architecture::Qwen2),
        checked_rows: 0,
    };
    let (_, proposed) = run(&mut target, &mut drafter, 3, 2);
    assert!(proposed > 0);
    assert!(
        drafter.checked_rows > 20,
        "{} rows checked",
        drafter.checked_rows
    );
}

/// The head drafters apply the target's penalties to `q` with each row's own generated history:
/// with a presence penalty `a` at T = 1, `q_pen[i] / q_pen[j] = q[i] / q[j] · e^{−a (seen(i) −
/// seen(j))}` for the draft ids `i`, `j`, where a token is seen iff it was generated (after the
/// prompt, which does not count) or drafted on the path — for the EAGLE head and the Medusa heads.
#[test]
fn head_drafters_penalise_q_with_each_rows_generated_history() {
    use specdec_algorithms::drafters::{DraftFeedback, DraftModel};
    let presence = 0.7f32;
    let penalties = Penalties {
        presence,
        ..Penalties::default()
    };
    let mut target = target(Architecture::Llama);
    let config = target.config().clone();
    let eagle = random_head(HeadKind::Eagle, &config, "synthetic.gguf", "00", 40, 5).unwrap();
    let medusa = random_head(HeadKind::Medusa, &config, "synthetic.gguf", "00", 40, 6).unwrap();
    let d2t = eagle.d2t.clone();
    // prompt: 5 draft ids; generated: 2 more; the context's features from one prefill
    let context: Vec<u32> = d2t[..7].to_vec();
    let (prompt_len, committed) = (5, context.len() - 1);
    let seq = target.new_sequence().unwrap();
    let features = target.prefill(seq, &context[..committed]).unwrap().unwrap();
    target.release(seq).unwrap();
    let feedback = DraftFeedback {
        sequence: 1,
        context: &context,
        prompt_len,
        committed,
        accepted: 0,
        features: Some(&features),
    };
    let check = |name: &str, plain: &[f32], penalised: &[f32], seen: &[u32], ids: &[u32]| {
        let (j, pj, qj) = ids
            .iter()
            .map(|&j| (j, plain[j as usize], penalised[j as usize]))
            .find(|&(j, p, _)| p > 1e-6 && !seen.contains(&j))
            .expect("an unseen draft id with mass");
        let mut checked = 0;
        for &i in ids {
            let (pi, qi) = (plain[i as usize], penalised[i as usize]);
            if pi < 1e-6 {
                continue;
            }
            let factor = if seen.contains(&i) {
                (-presence).exp()
            } else {
                1.0
            };
            let want = pi / pj * factor;
            let got = qi / qj;
            assert!(
                (got - want).abs() <= 1e-3 * want,
                "{name}: id {i} against {j}: q ratio {got}, expected {want} (seen {})",
                seen.contains(&i)
            );
            checked += 1;
        }
        assert!(checked > 10, "{name}: {checked} ids checked");
    };
    let ranked = SamplingParams::with_temperature(1.0);
    let eagle_model = |penalties: Penalties| {
        let head = EagleHead::new(&eagle, &target, HeadOptions::default()).unwrap();
        FeatureDraftModel::new(
            EagleFeatureHead::new(head, ranked)
                .unwrap()
                .with_penalties(penalties),
        )
    };
    let (mut plain, mut penalised) = (eagle_model(Penalties::default()), eagle_model(penalties));
    plain.observe(&feedback).unwrap();
    penalised.observe(&feedback).unwrap();
    let generated = &context[prompt_len..];
    check(
        "eagle, after the context",
        &plain.next_probs(1, &context).unwrap(),
        &penalised.next_probs(1, &context).unwrap(),
        generated,
        &d2t,
    );
    // one drafted token past the context, then a depth of two paths at once
    let drafted = d2t[9];
    let path: Vec<u32> = context.iter().copied().chain([drafted]).collect();
    let seen: Vec<u32> = generated.iter().copied().chain([drafted]).collect();
    check(
        "eagle, one draft deep",
        &plain.next_probs(1, &path).unwrap(),
        &penalised.next_probs(1, &path).unwrap(),
        &seen,
        &d2t,
    );
    let paths = vec![vec![d2t[0]], vec![d2t[11]]];
    let (rows_plain, rows_penalised) = (
        plain.next_probs_paths(1, &context, &paths).unwrap(),
        penalised.next_probs_paths(1, &context, &paths).unwrap(),
    );
    for ((path, a), b) in paths.iter().zip(&rows_plain).zip(&rows_penalised) {
        let seen: Vec<u32> = generated.iter().chain(path).copied().collect();
        check("eagle, a tree depth", a, b, &seen, &d2t);
    }
    let medusa_model = |penalties: Penalties| {
        let heads = MedusaHeads::new(&medusa, &target, HeadPrecision::Bf16).unwrap();
        MedusaDraftModel::new(heads, ranked).with_penalties(penalties)
    };
    let (mut plain, mut penalised) = (medusa_model(Penalties::default()), medusa_model(penalties));
    plain.observe(&feedback).unwrap();
    penalised.observe(&feedback).unwrap();
    check(
        "medusa, one draft deep",
        &plain.next_probs(1, &path).unwrap(),
        &penalised.next_probs(1, &path).unwrap(),
        &seen,
        &medusa.d2t,
    );
}
