//! Long contexts over one shared paged KV pool, on the synthetic Llama of
//! `specdec_models::llama::synthetic` with an 8k context (CI-sized: a 2-block model):
//!
//! - prompts past 2,048 tokens run, two at once, and greedy speculation (a layer-skip draft)
//!   equals plain greedy decoding token for token;
//! - the pool admits requests by their whole need: one that cannot fit is refused before any
//!   work, naming the tokens; one that fits only alone waits for room (never two in a step),
//!   and its output is the one it has alone;
//! - a prompt prefilled in chunks gives bit-identical logits to one forward of the whole chain,
//!   and a long prompt's chunks are interleaved with the other requests' decode steps (one chunk
//!   per step), each request's output the one it has alone;
//! - a bf16 or f16 KV cache keeps greedy speculation equal to plain decoding (batch invariance
//!   holds for every element type) and stays close to the f32 cache's output;
//! - `models.kv_memory` and `models.kv_dtype` are parsed, refused where they would be ignored.

use std::sync::Arc;

use specdec_algorithms::drafters::{ChainDrafter, ChainMode, Drafter};
use specdec_algorithms::policy::FixedPolicy;
use specdec_algorithms::verify::{PairedVerifier, Verifier};
use specdec_harness::config::ExperimentConfig;
use specdec_harness::engine::{
    Engine, EngineOptions, Generation, LmDraftModel, NoDrafter, Penalties, Request, StopRule,
};
use specdec_harness::Result;
use specdec_kernels::kv::KvDtype;
use specdec_kernels::sampling::SamplingParams;
use specdec_kernels::verification::VerifyMethod;
use specdec_kernels::TreeTopology;
use specdec_models::llama::synthetic::{synthetic_custom, SyntheticOptions};
use specdec_models::llama::{Architecture, LlamaModel, LlamaOptions, MatmulPath};
use specdec_models::{LanguageModel, SequenceStep, PREFILL_CHUNK};

const CONTEXT: u32 = 8192;

/// The synthetic Llama with an 8k context and a KV pool of `kv_tokens` f32 slots.
fn target(kv_tokens: usize) -> LlamaModel {
    target_with(kv_tokens, KvDtype::F32)
}

/// [`target`] with a KV pool of `dtype` elements.
fn target_with(kv_tokens: usize, dtype: KvDtype) -> LlamaModel {
    let file = synthetic_custom(
        Architecture::Llama,
        31,
        &SyntheticOptions {
            context_length: CONTEXT,
            ..SyntheticOptions::default()
        },
    );
    LlamaModel::from_gguf(&file, options(kv_tokens, dtype)).unwrap()
}

fn options(kv_tokens: usize, kv_dtype: KvDtype) -> LlamaOptions {
    LlamaOptions {
        kv_capacity_tokens: kv_tokens,
        kv_block_size: 16,
        kv_dtype,
        matmul: MatmulPath::Int8,
    }
}

/// A prompt of `n` pseudo-random tokens (vocabulary 64, EOS 63 left out).
fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ salt).rotate_left(7) % 63)
        .collect()
}

fn request(id: u64, prompt_tokens: usize, max_tokens: usize) -> Request {
    Request {
        id,
        seed: None,
        workload: None,
        prompt: prompt(prompt_tokens, id as u32 * 77),
        stop: StopRule::new(max_tokens, &[]),
    }
}

fn engine_options(batch_size: usize) -> EngineOptions {
    EngineOptions {
        method: "long".into(),
        sampling: SamplingParams::greedy(),
        penalties: Penalties::default(),
        seed: 5,
        batch_size,
        replay: None,
        op_split: false,
    }
}

/// Runs `requests` on `target` with `drafter` drafting chains of `k` (0: plain decoding).
fn run(
    target: &mut LlamaModel,
    drafter: &mut dyn Drafter<f32>,
    k: usize,
    batch_size: usize,
    requests: &[Request],
) -> Result<Vec<Generation>> {
    let verifier = greedy_verifier(drafter.kind());
    let policy = Box::new(FixedPolicy::chain(k));
    let mut engine = Engine::new(
        target,
        drafter,
        verifier,
        policy,
        engine_options(batch_size),
    )?;
    engine.run(requests, &mut |_| {})
}

/// Greedy verification, paired with drafts of `kind`.
fn greedy_verifier(kind: specdec_kernels::verification::DraftKind) -> PairedVerifier<f32> {
    let verifier: Arc<dyn Verifier<f32>> = Arc::new(VerifyMethod::Greedy);
    PairedVerifier::new(verifier, kind).unwrap()
}

fn plain(target: &mut LlamaModel, batch_size: usize, requests: &[Request]) -> Vec<Generation> {
    run(target, &mut NoDrafter, 0, batch_size, requests).unwrap()
}

fn tokens(generations: &[Generation]) -> Vec<Vec<u32>> {
    generations.iter().map(|g| g.tokens.clone()).collect()
}

#[test]
fn prompts_past_2048_tokens_run_and_greedy_speculation_equals_plain() {
    let requests = [request(0, 2600, 20), request(1, 2100, 20)];
    let mut model = target(6000);
    let expected = plain(&mut model, 2, &requests);
    assert!(expected.iter().all(|g| g.tokens.len() == 20));
    assert!(
        expected
            .iter()
            .any(|g| g.steps.iter().any(|s| s.batch == 2)),
        "both requests fit the pool at once"
    );
    let blocks = expected
        .iter()
        .flat_map(|g| &g.steps)
        .map(|s| s.kv_blocks)
        .max()
        .unwrap();
    assert!(
        blocks * 16 >= 2600 + 2100,
        "the step records count the blocks in use ({blocks})"
    );
    let draft = model
        .layer_skip(&[0], options(6000 + 256, KvDtype::F32))
        .unwrap();
    let mut drafter = ChainDrafter::new(
        LmDraftModel::new(draft, SamplingParams::greedy(), 4),
        ChainMode::Argmax,
    );
    let got = run(&mut model, &mut drafter, 3, 2, &requests).unwrap();
    assert_eq!(
        tokens(&got),
        tokens(&expected),
        "speculation changed the output"
    );
    let proposed: usize = got.iter().flat_map(|g| &g.steps).map(|s| s.proposed).sum();
    assert!(proposed > 0, "the drafter drafted");
    assert_eq!(
        model.cache().allocator().free_blocks(),
        model.cache().allocator().num_blocks(),
        "every block is back in the pool"
    );
}

#[test]
fn the_pool_refuses_what_cannot_fit_and_queues_what_fits_alone() {
    // 1024 slots: 700 + 24 + 64 and 500 + 24 + 64 do not fit together
    let first = request(0, 700, 24);
    let second = request(1, 500, 24);
    let mut model = target(1024);
    let together = plain(&mut model, 2, &[first.clone(), second.clone()]);
    assert!(
        together.iter().flat_map(|g| &g.steps).all(|s| s.batch == 1),
        "the second request waited for the first to retire"
    );
    let alone = plain(&mut model, 1, std::slice::from_ref(&second));
    assert_eq!(together[1].tokens, alone[0].tokens);
    // the same pool at a larger budget runs both at once, with the same output
    let mut roomy = target(2048);
    let batched = plain(&mut roomy, 2, &[first.clone(), second.clone()]);
    assert!(batched.iter().flat_map(|g| &g.steps).any(|s| s.batch == 2));
    assert_eq!(tokens(&batched), tokens(&together));
    // a request that cannot fit even alone is refused before any request runs
    let huge = request(2, 1000, 24);
    let mut done = 0;
    let verifier = greedy_verifier(specdec_kernels::verification::DraftKind::Deterministic);
    let mut no_drafter = NoDrafter;
    let mut engine = Engine::new(
        &mut model,
        &mut no_drafter,
        verifier,
        Box::new(FixedPolicy::chain(0)),
        engine_options(2),
    )
    .unwrap();
    let err = engine
        .run(&[first, huge], &mut |_| done += 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("request 2")
            && err.contains("1000 tokens")
            && err.contains("1088 KV tokens")
            && err.contains("holds 1024")
            && err.contains("kv_memory"),
        "{err}"
    );
    assert_eq!(done, 0, "nothing ran");
}

#[test]
fn a_prompt_prefilled_in_chunks_gives_the_logits_of_one_forward() {
    let n = 2 * PREFILL_CHUNK + 300;
    let tokens = prompt(n + 1, 9);
    let mut model = target(2 * n + 64);
    let chunked = model.new_sequence().unwrap();
    model.prefill(chunked, &tokens[..n]).unwrap();
    assert_eq!(model.seq_len(chunked).unwrap(), n);
    let last = TreeTopology::chain(1);
    let after = model
        .forward(&[SequenceStep::chain(chunked, &tokens[n..], &last)])
        .unwrap();
    let whole = model.new_sequence().unwrap();
    let chain = TreeTopology::chain(n + 1);
    let one = model
        .forward(&[SequenceStep::chain(whole, &tokens, &chain)])
        .unwrap();
    let bits = |row: &[f32]| row.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(after[0].row(0)), bits(one[0].row(n)));
}

#[test]
fn kv_memory_is_parsed_and_refused_where_nothing_would_use_it() {
    let config = |target: &str, kv: &str| {
        format!(
            "name = \"kv\"\nmax_tokens = 8\n[models]\ntarget = \"{target}\"\nkv_memory = \
             \"{kv}\"\n[prompts]\nsource = \"inline\"\ntexts = [\"a\"]\n[[methods]]\nname = \
             \"plain\"\ndrafter = {{ kind = \"none\" }}\n"
        )
    };
    let loaded = ExperimentConfig::from_toml(&config("smollm2-135m", "2GiB"), "<t>").unwrap();
    assert_eq!(loaded.config.models.kv_memory.as_deref(), Some("2GiB"));
    let err = ExperimentConfig::from_toml(&config("smollm2-135m", "lots"), "<t>")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("models.kv_memory") && err.contains("lots"),
        "{err}"
    );
    let err = ExperimentConfig::from_toml(&config("toy", "2GiB"), "<t>")
        .unwrap_err()
        .to_string();
    assert!(err.contains("models.kv_memory"), "{err}");
}

#[test]
fn a_16_bit_kv_cache_keeps_greedy_speculation_equal_to_plain() {
    let requests = [request(0, 2200, 16), request(1, 300, 16)];
    let reference = plain(&mut target(3000), 2, &requests);
    for dtype in [KvDtype::Bf16, KvDtype::F16] {
        let mut model = target_with(3000, dtype);
        assert_eq!(model.cache().dtype(), dtype);
        let expected = plain(&mut model, 2, &requests);
        let draft = model.layer_skip(&[0], options(3000 + 256, dtype)).unwrap();
        let mut drafter = ChainDrafter::new(
            LmDraftModel::new(draft, SamplingParams::greedy(), 4),
            ChainMode::Argmax,
        );
        let got = run(&mut model, &mut drafter, 3, 2, &requests).unwrap();
        assert_eq!(tokens(&got), tokens(&expected), "{dtype}");
        // rounding K and V moves logits a little: the first greedy tokens survive it
        let same = expected
            .iter()
            .zip(&reference)
            .filter(|(a, b)| a.tokens[0] == b.tokens[0])
            .count();
        assert!(
            same >= 1,
            "{dtype}: {same} of 2 first tokens agree with f32"
        );
    }
}

#[test]
fn kv_dtype_is_parsed_and_refused_where_it_cannot_hold() {
    let config = |target: &str, device: &str, dtype: &str| {
        format!(
            "name = \"kv\"\nmax_tokens = 8\n[models]\ntarget = \"{target}\"\ndevice = \
             \"{device}\"\nkv_dtype = \"{dtype}\"\n[prompts]\nsource = \"inline\"\ntexts = \
             [\"a\"]\n[[methods]]\nname = \"plain\"\ndrafter = {{ kind = \"none\" }}\n"
        )
    };
    let loaded =
        ExperimentConfig::from_toml(&config("smollm2-135m", "cpu", "bf16"), "<t>").unwrap();
    assert_eq!(loaded.config.models.kv_dtype.as_deref(), Some("bf16"));
    for (target, device, dtype, named) in [
        ("smollm2-135m", "cpu", "fp8", "fp8"),
        ("smollm2-135m", "cuda", "f16", "CPU only"),
        ("toy", "cpu", "bf16", "only real models"),
    ] {
        let err = ExperimentConfig::from_toml(&config(target, device, dtype), "<t>")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("models.kv_dtype") && err.contains(named),
            "{target} {device} {dtype}: {err}"
        );
    }
}

#[test]
fn a_long_prompt_is_prefilled_a_chunk_per_step_while_the_others_decode() {
    let chunks = 5;
    let short = request(0, 12, 24);
    let long = request(1, chunks * PREFILL_CHUNK + 40, 8);
    let mut model = target(4096);
    let alone: Vec<Vec<u32>> = [&short, &long]
        .iter()
        .map(|r| {
            plain(&mut model, 1, std::slice::from_ref(*r))[0]
                .tokens
                .clone()
        })
        .collect();
    // both admitted at once: the short one decodes while the long one's chunks go in
    let verifier = greedy_verifier(specdec_kernels::verification::DraftKind::Deterministic);
    let mut order: Vec<u64> = Vec::new();
    let mut on_tokens = |id: u64, _: &[u32]| order.push(id);
    let mut no_drafter = NoDrafter;
    let mut engine = Engine::new(
        &mut model,
        &mut no_drafter,
        verifier,
        Box::new(FixedPolicy::chain(0)),
        engine_options(2),
    )
    .unwrap()
    .on_tokens(&mut on_tokens);
    let got = engine
        .run(&[short.clone(), long.clone()], &mut |_| {})
        .unwrap();
    drop(engine);
    assert_eq!(tokens(&got), alone, "interleaving changed an output");
    // the long prompt needs chunks + 1 chunk forwards: the short request stepped between them
    let before = order.iter().take_while(|&&id| id == 0).count();
    assert!(
        before >= chunks,
        "the short request stepped {before} times before the long one's first token: {order:?}"
    );
    // its time to the first step counts the steps it waited through
    let first = &got[1].steps[0];
    assert!(first.prefill_s > 0.0 && got[1].steps[1..].iter().all(|s| s.prefill_s == 0.0));
}
