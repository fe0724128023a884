//! Trained heads end to end, CI-sized, on a synthetic target (no download): `specdec_train`
//! trains an EAGLE head and Medusa heads on sequences the target continues greedily; the saved
//! files load for that target and are refused for another; and in the engine, drafting with
//! them reproduces plain greedy decoding token for token while accepting far more drafts than
//! chance — which only a head whose inference computes what its training computed can do.

use std::collections::BTreeMap;
use std::sync::Arc;

use specdec::algorithms::drafters::{
    ChainDrafter, ChainMode, Drafter, EagleFeatureHead, FeatureDraftModel, MedusaDraftModel,
    ShapeDrafter, TreeFill,
};
use specdec::algorithms::policy::FixedPolicy;
use specdec::algorithms::trees::TreeShape;
use specdec::algorithms::verify::{PairedVerifier, Verifier};
use specdec::harness::engine::{Engine, EngineOptions, NoDrafter, Penalties, Request, StopRule};
use specdec::kernels::sampling::SamplingParams;
use specdec::kernels::verification::VerifyMethod;
use specdec::models::heads::{EagleHead, HeadFile, HeadOptions, HeadPrecision, MedusaHeads};
use specdec::models::llama::{Architecture, LlamaModel, LlamaOptions, MatmulPath};
use specdec::models::LanguageModel;
use specdec::train::synthetic::{greedy_sequences, synthetic_cache, synthetic_target};
use specdec::train::{
    train, FrozenTarget, KindArg, TrainControl, TrainData, TrainHeadOptions, TrainPaths,
};

/// Draft vocabulary of the small heads (of the synthetic target's 64 ids).
const DRAFT_VOCAB: usize = 48;

/// Trains a small head of `kind` for `target` on its greedy sequences; returns the head file.
fn trained(target: &FrozenTarget, kind: KindArg, dir: &std::path::Path) -> HeadFile {
    let sequences = greedy_sequences(target, 40, 4, 20, 1).unwrap();
    let cache = synthetic_cache(target, &sequences, &dir.join("features")).unwrap();
    let mut options = TrainHeadOptions::new("synthetic", kind);
    options.steps = Some(200);
    options.batch = 4;
    options.lr = 3e-3;
    options.holdout = 6;
    options.draft_vocab = DRAFT_VOCAB;
    if kind == KindArg::Eagle {
        options.ffn = Some(64);
    }
    let config = options.train_config().unwrap();
    let data = TrainData {
        cache: &cache,
        data_sha256: cache.key().data_sha256.clone(),
        extra: BTreeMap::from([("data".to_string(), "greedy synthetic".to_string())]),
    };
    let name = format!("synthetic-{kind:?}.safetensors");
    let paths = TrainPaths::next_to(&dir.join(name));
    let report = train(target, &data, &config, &paths, &TrainControl::default()).unwrap();
    assert!(
        report.loss_last_tenth < report.loss_first_tenth,
        "{kind:?}: the loss did not fall\n{}",
        report.summary()
    );
    let head = HeadFile::load(&report.paths.head).unwrap();
    let identity = target.identity();
    assert!(head.check_target(&identity.name, &identity.sha256).is_ok());
    let other = "ab".repeat(32);
    let err = head
        .check_target("other.gguf", &other)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("other.gguf") && err.contains(&identity.name),
        "{err}"
    );
    head
}

/// Greedy prompts the heads never saw: other random starts than the training sequences'.
fn requests(target: &FrozenTarget) -> Vec<Request> {
    greedy_sequences(target, 6, 4, 0, 99)
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(i, prompt)| Request {
            id: i as u64,
            seed: None,
            workload: None,
            prompt,
            stop: StopRule::new(20, &[]),
        })
        .collect()
}

/// Tokens of every request, and accepted / proposed drafts.
fn run(
    model: &mut LlamaModel,
    drafter: &mut dyn Drafter<f32>,
    k: usize,
    requests: &[Request],
) -> (Vec<Vec<u32>>, usize, usize) {
    let verifier: Arc<dyn Verifier<f32>> = Arc::new(VerifyMethod::Greedy);
    let verifier = PairedVerifier::new(verifier, drafter.kind()).unwrap();
    let options = EngineOptions {
        method: "heads".into(),
        sampling: SamplingParams::greedy(),
        penalties: Penalties::default(),
        seed: 0,
        batch_size: 2,
        replay: None,
        op_split: false,
    };
    let policy = Box::new(FixedPolicy::chain(k));
    let mut engine = Engine::new(model, drafter, verifier, policy, options).unwrap();
    let generations = engine.run(requests, &mut |_| {}).unwrap();
    let steps = generations.iter().flat_map(|g| &g.steps);
    let accepted = steps.clone().map(|s| s.accepted).sum();
    let proposed = steps.map(|s| s.proposed).sum();
    (
        generations.into_iter().map(|g| g.tokens).collect(),
        accepted,
        proposed,
    )
}

#[test]
fn trained_heads_load_for_their_target_only_and_draft_losslessly_and_well() {
    let target = synthetic_target(Architecture::Llama, 11).unwrap();
    let dir = std::env::temp_dir().join(format!("specdec-trained-heads-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let eagle = trained(&target, KindArg::Eagle, &dir);
    let medusa = trained(&target, KindArg::Medusa, &dir);

    let mut model =
        LlamaModel::from_gguf(target.file(), LlamaOptions::with_matmul(MatmulPath::Int8)).unwrap();
    model.tap_features(&eagle.meta.feature_blocks).unwrap();
    let requests = requests(&target);
    let (plain, _, _) = run(&mut model, &mut NoDrafter, 0, &requests);

    let head = EagleHead::new(&eagle, &model, HeadOptions::default()).unwrap();
    let drafts =
        FeatureDraftModel::new(EagleFeatureHead::new(head, SamplingParams::greedy()).unwrap());
    let mut chain = ChainDrafter::new(drafts, ChainMode::Argmax);
    let (tokens, accepted, proposed) = run(&mut model, &mut chain, 3, &requests);
    assert_eq!(tokens, plain, "EAGLE chain: speculative ≠ plain");
    let eagle_rate = accepted as f64 / proposed as f64;

    let heads = MedusaHeads::new(&medusa, &model, HeadPrecision::Int8).unwrap();
    let ranked = SamplingParams::with_temperature(1.0);
    let mut tree = ShapeDrafter::new(
        MedusaDraftModel::new(heads, ranked),
        TreeFill::TopRanked,
        TreeShape::from_branching(&[2, 1]),
    );
    let (tokens, medusa_accepted, medusa_proposed) = run(&mut model, &mut tree, 4, &requests);
    assert_eq!(tokens, plain, "Medusa tree: speculative ≠ plain");
    // chance: one draft id in 48 is the target's greedy token
    let chance = 1.0 / DRAFT_VOCAB as f64;
    assert!(
        eagle_rate > 5.0 * chance,
        "EAGLE acceptance {eagle_rate:.3} ({accepted}/{proposed}) is near chance {chance:.3}"
    );
    assert!(
        medusa_accepted as f64 / medusa_proposed as f64 > 2.0 * chance,
        "Medusa acceptance {medusa_accepted}/{medusa_proposed} is near chance"
    );
    eprintln!(
        "EAGLE chain acceptance {eagle_rate:.3}, Medusa tree {medusa_accepted}/{medusa_proposed}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
