//! The engine over a tensor-parallel target ([`ShardedModel`]: CPU ranks on threads joined by
//! the thread communicator), on the synthetic Llama: greedy speculation equals plain decoding
//! token for token at TP = 2 (batch invariance holds within a TP setting), at batch sizes 1 and
//! 3, and the KV pool is read from rank 0 as for one runner.

use std::sync::Arc;

use specdec_algorithms::drafters::{Drafter, NgramConfig, NgramDrafter};
use specdec_algorithms::policy::FixedPolicy;
use specdec_algorithms::verify::{PairedVerifier, Verifier};
use specdec_harness::engine::{
    Engine, EngineOptions, Generation, NoDrafter, Penalties, Request, StopRule,
};
use specdec_kernels::sampling::SamplingParams;
use specdec_kernels::verification::VerifyMethod;
use specdec_models::llama::synthetic::{synthetic_custom, SyntheticOptions};
use specdec_models::llama::{Architecture, LlamaOptions, MatmulPath};
use specdec_models::shard::ShardedModel;
use specdec_models::LanguageModel;

fn sharded(world: usize) -> ShardedModel {
    let file = synthetic_custom(Architecture::Qwen2, 17, &SyntheticOptions::default());
    let options = LlamaOptions {
        kv_capacity_tokens: 2048,
        kv_block_size: 16,
        matmul: MatmulPath::Int8,
        ..LlamaOptions::default()
    };
    ShardedModel::from_gguf(&file, options, world).unwrap()
}

fn requests() -> Vec<Request> {
    (0..3u64)
        .map(|id| Request {
            id,
            seed: None,
            workload: None,
            // a repeated motif, so that n-gram lookup finds drafts to verify
            prompt: (0..24u32)
                .map(|i| (i * 7 + id as u32 * 5) % 11 + 1)
                .collect(),
            stop: StopRule::new(20, &[]),
        })
        .collect()
}

fn run(
    model: &mut dyn LanguageModel,
    drafter: &mut dyn Drafter<f32>,
    k: usize,
    batch_size: usize,
) -> Vec<Generation> {
    let verifier: Arc<dyn Verifier<f32>> = Arc::new(VerifyMethod::Greedy);
    let verifier = PairedVerifier::new(verifier, drafter.kind()).unwrap();
    let options = EngineOptions {
        method: "tp".into(),
        sampling: SamplingParams::greedy(),
        penalties: Penalties::default(),
        seed: 1,
        batch_size,
        replay: None,
        op_split: false,
    };
    let mut engine = Engine::new(
        model,
        drafter,
        verifier,
        Box::new(FixedPolicy::chain(k)),
        options,
    )
    .unwrap();
    engine.run(&requests(), &mut |_| {}).unwrap()
}

#[test]
fn greedy_speculation_on_two_ranks_equals_plain_decoding_on_two_ranks() {
    let mut model = sharded(2);
    assert_eq!(model.ranks().len(), 2);
    let plain: Vec<Vec<u32>> = run(&mut model, &mut NoDrafter, 0, 1)
        .into_iter()
        .map(|g| g.tokens)
        .collect();
    for batch_size in [1, 3] {
        let mut ngram = NgramDrafter::new(NgramConfig::default(), 3).unwrap();
        let generations = run(&mut model, &mut ngram, 4, batch_size);
        let proposed: usize = generations
            .iter()
            .flat_map(|g| &g.steps)
            .map(|s| s.proposed)
            .sum();
        assert!(proposed > 0, "batch {batch_size}: nothing was drafted");
        let tokens: Vec<Vec<u32>> = generations.into_iter().map(|g| g.tokens).collect();
        assert_eq!(tokens, plain, "batch {batch_size}");
        let room = model.kv_room().expect("rank 0's pool");
        assert_eq!(room.free_blocks, room.total_blocks, "blocks leaked");
    }
}

#[test]
fn tensor_parallel_is_parsed_and_refused_where_it_cannot_run() {
    use specdec_harness::config::ExperimentConfig;
    let config = |target: &str, device: &str, ranks: usize| {
        format!(
            "name = \"tp\"\nmax_tokens = 8\n[models]\ntarget = \"{target}\"\ndevice = \
             \"{device}\"\ntensor_parallel = {ranks}\n[prompts]\nsource = \"inline\"\ntexts = \
             [\"a\"]\n[[methods]]\nname = \"plain\"\ndrafter = {{ kind = \"none\" }}\n"
        )
    };
    let loaded = ExperimentConfig::from_toml(&config("smollm2-135m", "cpu", 2), "<t>").unwrap();
    assert_eq!(loaded.config.models.tensor_parallel, Some(2));
    for gpu in ["cuda", "cuda:0"] {
        let loaded = ExperimentConfig::from_toml(&config("smollm2-135m", gpu, 2), "<t>").unwrap();
        assert_eq!(loaded.config.models.tensor_parallel, Some(2), "{gpu}");
    }
    for (target, device, ranks, want) in [
        ("smollm2-135m", "cpu", 0, "0 is not in 1..=64"),
        ("smollm2-135m", "cpu", 65, "65 is not in"),
        ("toy", "cpu", 2, "only real models"),
        ("smollm2-135m", "cuda:1", 2, "cannot start at cuda:1"),
    ] {
        let err = ExperimentConfig::from_toml(&config(target, device, ranks), "<t>")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("models.tensor_parallel") && err.contains(want),
            "{target} {device} {ranks}: {err}"
        );
    }
}
