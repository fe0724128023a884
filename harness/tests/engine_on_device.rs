//! The engine loop end to end on each device: draft → one target forward → verify → KV
//! commit/rewind, over a real decoder (the tiny synthetic Qwen2 of
//! `specdec_models::llama::synthetic`, no model file needed, so the test travels in the GPU
//! bundle). One test body, run on the CPU (exact f32 path) and on the GPU
//! (`CudaLlamaModel` in its batch-invariant mode; `#[ignore = "needs a GPU"]`).
//!
//! Claims checked on each device:
//! - greedy speculative output (linear K = 4 from a different model) equals plain greedy
//!   output token for token, at batch sizes 1 and 3;
//! - a model drafting for itself has every draft accepted: its draft logits and the target's
//!   verify logits are bit-identical, which only a batch-invariant forward guarantees (a token
//!   forwarded alone by the drafter, inside a chain of five by the target).

use std::sync::Arc;

use specdec_algorithms::drafters::{ChainDrafter, ChainMode, Drafter};
use specdec_algorithms::policy::FixedPolicy;
use specdec_algorithms::verify::{PairedVerifier, Verifier};
use specdec_harness::engine::{
    Engine, EngineOptions, LmDraftModel, NoDrafter, Penalties, Request, StopRule,
};
use specdec_kernels::cuda::testing::gpu_for_test;
use specdec_kernels::sampling::SamplingParams;
use specdec_kernels::verification::{DraftKind, VerifyMethod};
use specdec_models::gguf::GgufFile;
use specdec_models::llama::cuda::{CudaLlamaModel, CudaLlamaOptions, GpuMatmul};
use specdec_models::llama::synthetic::synthetic;
use specdec_models::llama::{Architecture, LlamaModel, LlamaOptions, MatmulPath};
use specdec_models::LanguageModel;

/// Where the models of one run live.
#[derive(Clone, Copy, Debug)]
enum Device {
    Cpu,
    Cuda,
}

fn load(device: Device, file: &Arc<GgufFile>) -> Box<dyn LanguageModel> {
    match device {
        Device::Cpu => Box::new(
            LlamaModel::from_gguf(
                file,
                LlamaOptions {
                    kv_capacity_tokens: 1024,
                    kv_block_size: 16,
                    kv_dtype: specdec_kernels::kv::KvDtype::F32,
                    matmul: MatmulPath::Exact,
                },
            )
            .expect("the CPU model loads"),
        ),
        Device::Cuda => Box::new(
            CudaLlamaModel::from_gguf(
                file,
                CudaLlamaOptions {
                    kv_capacity_tokens: 1024,
                    kv_block_size: 16,
                    matmul: GpuMatmul::BatchInvariant,
                    device: 0,
                },
            )
            .expect("the CUDA model loads"),
        ),
    }
}

fn requests() -> Vec<Request> {
    (0..3u32)
        .map(|i| Request {
            id: u64::from(i),
            seed: None,
            workload: None,
            prompt: (0..5 + 3 * i).map(|t| (t * 7 + i * 11) % 60).collect(),
            stop: StopRule::new(20, &[]),
        })
        .collect()
}

/// Tokens of every request, and `(accepted, proposed)` drafts over all steps.
fn run(
    target: &mut dyn LanguageModel,
    drafter: &mut dyn Drafter<f32>,
    k: usize,
    batch_size: usize,
) -> (Vec<Vec<u32>>, usize, usize) {
    let verifier: Arc<dyn Verifier<f32>> = Arc::new(VerifyMethod::Greedy);
    let verifier = PairedVerifier::new(verifier, DraftKind::Deterministic).expect("greedy pairs");
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
    let steps = generations.iter().flat_map(|g| &g.steps);
    let accepted = steps.clone().map(|s| s.accepted).sum();
    let proposed = steps.map(|s| s.proposed).sum();
    (
        generations.into_iter().map(|g| g.tokens).collect(),
        accepted,
        proposed,
    )
}

fn greedy_speculation_is_lossless_end_to_end(device: Device) {
    let target_file = synthetic(Architecture::Qwen2, 21);
    let other_file = synthetic(Architecture::Qwen2, 22);
    let mut target = load(device, &target_file);
    let (plain, _, _) = run(target.as_mut(), &mut NoDrafter, 0, 1);
    assert!(
        plain.iter().all(|t| t.len() == 20),
        "every request runs to its 20 tokens"
    );
    for batch_size in [1, 3] {
        let draft = LmDraftModel::new(load(device, &other_file), SamplingParams::greedy(), 4);
        let mut drafter = ChainDrafter::new(draft, ChainMode::Argmax);
        let (spec, _, proposed) = run(target.as_mut(), &mut drafter, 4, batch_size);
        assert!(
            proposed > 0,
            "{device:?} batch {batch_size}: nothing was drafted"
        );
        assert_eq!(
            spec, plain,
            "{device:?} batch {batch_size}: speculative ≠ plain"
        );

        let itself = LmDraftModel::new(load(device, &target_file), SamplingParams::greedy(), 4);
        let mut drafter = ChainDrafter::new(itself, ChainMode::Argmax);
        let (spec, accepted, proposed) = run(target.as_mut(), &mut drafter, 4, batch_size);
        assert_eq!(
            spec, plain,
            "{device:?} batch {batch_size}: self-drafting ≠ plain"
        );
        assert!(proposed > 0);
        assert_eq!(
            accepted, proposed,
            "{device:?} batch {batch_size}: a model drafting for itself must have every draft \
             accepted (its forward is not batch-invariant otherwise)"
        );
    }
}

#[test]
fn greedy_speculation_is_lossless_end_to_end_on_the_cpu() {
    greedy_speculation_is_lossless_end_to_end(Device::Cpu);
}

#[test]
#[ignore = "needs a GPU"]
fn greedy_speculation_is_lossless_end_to_end_on_the_gpu() {
    if gpu_for_test("engine_on_device::gpu").is_some() {
        greedy_speculation_is_lossless_end_to_end(Device::Cuda);
    }
}
