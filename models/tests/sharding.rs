//! Tensor-parallel sharding on 2 thread ranks: the same greedy tokens as the unsharded model,
//! logits within f32 reduction-order noise.

mod common;

use common::{gguf, greedy, load, prefill, synthetic_qwen2};
use specdec_kernels::TreeTopology;
use specdec_models::llama::{LlamaModel, LlamaOptions, SpecialTokens};
use specdec_models::shard::ShardedModel;
use specdec_models::{LanguageModel, Logits, SequenceStep};

/// Largest |a − b| over all logits, relative to the largest |a|.
fn relative_gap(a: &Logits, b: &Logits) -> f32 {
    assert_eq!(a.as_slice().len(), b.as_slice().len());
    let scale = a.as_slice().iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let gap = a
        .as_slice()
        .iter()
        .zip(b.as_slice())
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    gap / scale
}

const OPTIONS: LlamaOptions = LlamaOptions {
    kv_capacity_tokens: 512,
    kv_block_size: 16,
};

/// Bound on the relative logit gap between 1 and 2 ranks. Splitting a row-parallel product
/// into two partial sums changes the f32 summation order only. Measured (max |Δ| / max |logit|
/// over all positions of the prompt): 4.6e-7 synthetic, 4.7e-7 Qwen2.5-Coder-0.5B, 1.3e-6
/// Qwen2.5-Coder-1.5B (FFN 8960 = 35 super-blocks, split 18 + 17); bound 1e-4.
const SHARD_TOL: f32 = 1e-4;

#[test]
fn synthetic_two_rank_split_is_uneven_and_agrees() {
    let (config, weights) = synthetic_qwen2(7);
    let special = SpecialTokens {
        bos: None,
        eos: vec![],
    };
    let mut single =
        LlamaModel::from_weights(config.clone(), weights.clone(), special.clone(), OPTIONS)
            .unwrap();
    let mut sharded = ShardedModel::new(&config, &weights, &special, OPTIONS, 2).unwrap();
    let plans: Vec<_> = sharded.ranks().iter().map(|r| r.plan().clone()).collect();
    assert_eq!(
        (plans[0].ffn.clone(), plans[1].ffn.clone()),
        (0..512, 512..768),
        "FFN split by super-block, 2 + 1"
    );
    assert!(
        plans[0].gather_attention,
        "head boundary 144 is not on a 32-element block"
    );
    assert_eq!(
        (plans[0].o_cols.clone(), plans[1].o_cols.clone()),
        (0..160, 160..288)
    );
    assert_eq!(
        (plans[0].kv_heads.clone(), plans[1].kv_heads.clone()),
        (0..1, 1..2)
    );

    let prompt = [3u32, 17, 42, 8, 91, 5, 60];
    let a = prefill(&mut single, &prompt);
    let b = prefill(&mut sharded, &prompt);
    let gap = relative_gap(&a, &b);
    eprintln!("synthetic: relative logit gap 1 vs 2 ranks {gap:.2e}");
    assert!(gap <= SHARD_TOL, "relative gap {gap:e}");
    assert_eq!(
        greedy(&mut single, &prompt, 12),
        greedy(&mut sharded, &prompt, 12)
    );

    // A tree forward through the sharded model matches the unsharded one too.
    let tree = TreeTopology::from_parents(&[None, Some(0), Some(0), Some(2)]).unwrap();
    let tokens = [1u32, 2, 3, 4];
    let run = |m: &mut dyn LanguageModel| {
        let seq = m.new_sequence().unwrap();
        m.forward(&[SequenceStep {
            seq,
            tokens: &tokens,
            tree: &tree,
        }])
        .unwrap()
        .remove(0)
    };
    let gap = relative_gap(&run(&mut single), &run(&mut sharded));
    assert!(gap <= SHARD_TOL, "tree: relative gap {gap:e}");
}

#[test]
fn too_many_ranks_are_refused() {
    let (config, weights) = synthetic_qwen2(1);
    let err = ShardedModel::new(&config, &weights, &SpecialTokens::default(), OPTIONS, 3)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("2 KV heads cannot be split among 3 ranks"),
        "{err}"
    );
}

/// Greedy tokens and logit gap of 1 vs 2 ranks on registry model `name`.
fn two_ranks_match_one(name: &str, prompt: &[u32], n_new: usize) {
    let Some(file) = gguf(name) else { return };
    let mut single = load(&file);
    let mut sharded = ShardedModel::from_gguf(&file, OPTIONS, 2).unwrap();
    let plans: Vec<_> = sharded.ranks().iter().map(|r| r.plan().clone()).collect();
    eprintln!("{name} plans: {plans:?}");
    let gap = relative_gap(
        &prefill(&mut single, prompt),
        &prefill(&mut sharded, prompt),
    );
    eprintln!("{name}: relative logit gap 1 vs 2 ranks {gap:.2e}");
    assert!(gap <= SHARD_TOL, "relative gap {gap:e}");
    let a = greedy(&mut single, prompt, n_new);
    let b = greedy(&mut sharded, prompt, n_new);
    assert_eq!(a, b, "{name}: greedy tokens differ between 1 and 2 ranks");
}

#[test]
fn qwen_05b_two_ranks_match_one() {
    two_ranks_match_one("qwen2.5-coder-0.5b", &[750, 75698, 1445, 1648], 16);
}

#[test]
#[ignore = "Qwen2.5-Coder-1.5B is slow on CPU and not fetched by default; run with --ignored"]
fn qwen_15b_two_ranks_match_one() {
    two_ranks_match_one("qwen2.5-coder-1.5b", &[750, 75698, 1445, 1648], 8);
}
