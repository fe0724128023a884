//! Helpers shared by the runner's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use specdec_kernels::TreeTopology;
use specdec_models::gguf::GgufFile;
use specdec_models::llama::{LlamaModel, LlamaOptions, MatmulPath};
use specdec_models::{registry, LanguageModel, Logits, SequenceStep};

/// The cached file of registry model `name`; `None` (after saying so) when it is missing and
/// `SPECDEC_SKIP_MODEL_TESTS=1`; otherwise a panic naming the fetch command.
pub fn model_path(name: &str) -> Option<PathBuf> {
    let entry = registry::entry(name).unwrap_or_else(|| panic!("{name} is not registered"));
    match entry.locate() {
        Ok(path) => Some(path),
        Err(err) if std::env::var("SPECDEC_SKIP_MODEL_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping (SPECDEC_SKIP_MODEL_TESTS=1): {err}");
            None
        }
        Err(err) => panic!(
            "{err}\n(run `scripts/fetch-models.sh {}`, or set SPECDEC_SKIP_MODEL_TESTS=1 to skip)",
            entry.name
        ),
    }
}

/// The parsed GGUF file of registry model `name` (see [`model_path`]).
pub fn gguf(name: &str) -> Option<Arc<GgufFile>> {
    model_path(name).map(|p| Arc::new(GgufFile::open(p).expect("a readable GGUF file")))
}

/// A single-rank model with a small KV cache on the exact f32 matmul path (the one the
/// reference logits are compared against).
pub fn load(file: &Arc<GgufFile>) -> LlamaModel {
    load_with(file, MatmulPath::Exact)
}

/// Options with a small KV cache (1024 slots) and the given matmul path.
pub fn small_options(matmul: MatmulPath) -> LlamaOptions {
    LlamaOptions {
        kv_capacity_tokens: 1024,
        kv_block_size: 16,
        kv_dtype: specdec_kernels::kv::KvDtype::F32,
        matmul,
    }
}

/// A single-rank model with a small KV cache on matmul path `matmul`.
pub fn load_with(file: &Arc<GgufFile>, matmul: MatmulPath) -> LlamaModel {
    LlamaModel::from_gguf(file, small_options(matmul)).expect("the model loads")
}

/// Forwards `tokens` as one chain on a fresh sequence, commits it, and returns the logits.
pub fn prefill(model: &mut dyn LanguageModel, tokens: &[u32]) -> Logits {
    let seq = model.new_sequence().unwrap();
    let tree = TreeTopology::chain(tokens.len());
    let logits = model
        .forward(&[SequenceStep::chain(seq, tokens, &tree)])
        .unwrap()
        .remove(0);
    model
        .commit(seq, &(0..tokens.len()).collect::<Vec<_>>())
        .unwrap();
    logits
}

/// Greedy decoding of up to `max_new` tokens after `prompt` (stopping at an EOS id).
pub fn greedy(model: &mut dyn LanguageModel, prompt: &[u32], max_new: usize) -> Vec<u32> {
    let seq = model.new_sequence().unwrap();
    let mut out = Vec::new();
    let mut pending = prompt.to_vec();
    for _ in 0..max_new {
        let tree = TreeTopology::chain(pending.len());
        let logits = model
            .forward(&[SequenceStep::chain(seq, &pending, &tree)])
            .unwrap()
            .remove(0);
        model
            .commit(seq, &(0..pending.len()).collect::<Vec<_>>())
            .unwrap();
        let next = logits.argmax(logits.rows() - 1);
        out.push(next);
        if model.eos_ids().contains(&next) {
            break;
        }
        pending = vec![next];
    }
    model.release(seq).unwrap();
    out
}

/// Forwards `tokens` with topology `tree` as the only step of a forward of `seq`.
pub fn forward_one(
    model: &mut dyn LanguageModel,
    seq: specdec_models::SeqId,
    tokens: &[u32],
    tree: &TreeTopology,
) -> Logits {
    model
        .forward(&[SequenceStep { seq, tokens, tree }])
        .unwrap()
        .remove(0)
}

/// Asserts that the logits of `prompt`'s last token are bit-identical in a chain of the whole
/// prompt, alone after the committed prefix, as the root of a 4-node tree (children `below`),
/// and in a batch between sequences of `other` tokens. Uses fresh sequences of `model`.
pub fn assert_token_logits_invariant(
    model: &mut dyn LanguageModel,
    prompt: &[u32],
    below: [u32; 3],
    other: &[u32],
) {
    let last = prompt.len() - 1;
    // In a chain: the whole prompt in one forward.
    let a = model.new_sequence().unwrap();
    let chain = forward_one(model, a, prompt, &TreeTopology::chain(prompt.len()));
    let reference = bits(chain.row(last));
    // Alone: the prefix committed first, then the last token by itself.
    let b = model.new_sequence().unwrap();
    forward_one(model, b, &prompt[..last], &TreeTopology::chain(last));
    model.commit(b, &(0..last).collect::<Vec<_>>()).unwrap();
    let alone = forward_one(model, b, &prompt[last..], &TreeTopology::chain(1));
    assert_eq!(bits(alone.row(0)), reference, "alone vs chain");
    // In a tree: the last token as the root of a tree with siblings below it.
    let tree = TreeTopology::from_parents(&[None, Some(0), Some(0), Some(1)]).unwrap();
    let in_tree = forward_one(
        model,
        b,
        &[prompt[last], below[0], below[1], below[2]],
        &tree,
    );
    assert_eq!(bits(in_tree.row(0)), reference, "tree root vs chain");
    // In a batch: beside two other sequences, one before and one after it.
    let c = model.new_sequence().unwrap();
    let d = model.new_sequence().unwrap();
    let e = model.new_sequence().unwrap();
    let chain_tree = TreeTopology::chain(prompt.len());
    let other_tree = TreeTopology::chain(other.len());
    let out = model
        .forward(&[
            SequenceStep {
                seq: c,
                tokens: other,
                tree: &other_tree,
            },
            SequenceStep {
                seq: d,
                tokens: prompt,
                tree: &chain_tree,
            },
            SequenceStep {
                seq: e,
                tokens: &other[..2],
                tree: &TreeTopology::chain(2),
            },
        ])
        .unwrap();
    assert_eq!(out.len(), 3);
    assert_eq!(bits(out[1].row(last)), reference, "in a batch vs alone");
    // The batch neighbour's logits are its own, not a copy.
    assert_ne!(bits(out[0].row(0)), bits(out[1].row(0)));
}

/// Forwards `tokens` as `tree` on `seq`, then each root-to-node path as a chain, asserting that
/// every tree row is bit-identical to the last row of its chain.
pub fn assert_tree_rows_equal_chains(
    model: &mut dyn LanguageModel,
    seq: specdec_models::SeqId,
    tokens: &[u32],
    tree: &TreeTopology,
) {
    let in_tree = forward_one(model, seq, tokens, tree);
    for node in 0..tree.len() {
        let path: Vec<u32> = tree.path_to(node).iter().map(|&i| tokens[i]).collect();
        let chain = forward_one(model, seq, &path, &TreeTopology::chain(path.len()));
        assert_eq!(
            bits(in_tree.row(node)),
            bits(chain.row(path.len() - 1)),
            "node {node} (path {path:?}) differs between the tree and its chain"
        );
    }
}

/// The bit patterns of `row` (for exact comparisons that tell -0.0 and NaNs apart).
pub fn bits(row: &[f32]) -> Vec<u32> {
    row.iter().map(|v| v.to_bits()).collect()
}

/// Largest |a − b| over paired elements.
pub fn max_abs_gap(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// Largest |v|.
pub fn max_abs(a: &[f32]) -> f32 {
    a.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// The `k` largest logits of `row` as (id, logit), largest first (ties: lowest id).
pub fn top_k(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut ids: Vec<u32> = (0..row.len() as u32).collect();
    ids.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    ids.into_iter()
        .take(k)
        .map(|i| (i, row[i as usize]))
        .collect()
}

/// A deterministic xorshift generator for synthetic weights.
pub struct Rng(u64);

impl Rng {
    /// A generator from a non-zero seed.
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// Random but valid GGML blocks of `ty` for a `[rows, cols]` matrix: random quants, scales set
/// so that weights stay within about ±0.1.
pub fn random_matrix(
    ty: specdec_kernels::quant::QuantType,
    rows: usize,
    cols: usize,
    rng: &mut Rng,
) -> specdec_models::llama::WeightMatrix {
    use specdec_kernels::quant::{f32_to_f16, QuantType};
    let n_blocks = rows * cols / ty.block_len();
    let mut bytes = Vec::with_capacity(n_blocks * ty.block_bytes());
    for _ in 0..n_blocks {
        let start = bytes.len();
        for _ in 0..ty.block_bytes() {
            bytes.push(rng.next_u64() as u8);
        }
        let block = &mut bytes[start..];
        let f16 = |v: f32| f32_to_f16(v).to_le_bytes();
        match ty {
            QuantType::Q8_0 => block[..2].copy_from_slice(&f16(0.0008)),
            QuantType::Q4_K => {
                block[..2].copy_from_slice(&f16(0.0002));
                block[2..4].copy_from_slice(&f16(0.0001));
            }
            QuantType::Q6_K => block[208..210].copy_from_slice(&f16(0.0001)),
            QuantType::F32 => {
                block.copy_from_slice(&rng.uniform(-0.1, 0.1).to_le_bytes());
            }
            other => panic!("random_matrix: {other} not needed by the tests"),
        }
    }
    specdec_models::llama::WeightMatrix::from_bytes(ty, rows, cols, bytes).unwrap()
}

/// A small random qwen2-style decoder whose dimensions exercise uneven tensor-parallel splits
/// for 2 ranks: 2 KV heads (6 query heads of 48), K-quant (256-element super-block) matrices, an
/// FFN of 3 super-blocks (down projection split 2 + 1), and an attention output projection in
/// Q8_0 whose head boundary (144) is not on a 32-element block boundary (gathered path).
pub fn synthetic_qwen2(
    seed: u64,
) -> (
    specdec_models::llama::LlamaConfig,
    specdec_models::llama::ModelWeights,
) {
    use specdec_kernels::quant::QuantType::{Q4_K, Q6_K, Q8_0};
    use specdec_models::llama::{
        Architecture, LayerWeights, LlamaConfig, ModelWeights, RopeLayout, RopeScaling,
    };
    let config = LlamaConfig {
        arch: Architecture::Qwen2,
        n_layers: 2,
        hidden: 256,
        ffn: 768,
        n_heads: 6,
        n_kv_heads: 2,
        head_dim: 48,
        rms_eps: 1e-6,
        rope_base: 10_000.0,
        rope_layout: RopeLayout::HalfSplit,
        rope_scaling: RopeScaling::None,
        context_length: 256,
        vocab_size: 96,
        qkv_bias: true,
        tied_head: false,
    };
    let mut rng = Rng::new(seed);
    let (h, q, kv, f) = (config.hidden, config.q_dim(), config.kv_dim(), config.ffn);
    let mut vector =
        |n: usize, lo: f32, hi: f32| (0..n).map(|_| rng.uniform(lo, hi)).collect::<Vec<f32>>();
    let norms: Vec<Vec<f32>> = (0..5).map(|_| vector(h, 0.8, 1.2)).collect();
    let biases: Vec<Vec<f32>> = (0..6)
        .map(|i| vector(if i % 3 == 0 { q } else { kv }, -0.1, 0.1))
        .collect();
    let layers = (0..config.n_layers)
        .map(|l| LayerWeights {
            attn_norm: norms[l].clone(),
            wq: random_matrix(Q4_K, q, h, &mut rng),
            wk: random_matrix(Q4_K, kv, h, &mut rng),
            wv: random_matrix(Q4_K, kv, h, &mut rng),
            bq: Some(biases[3 * l].clone()),
            bk: Some(biases[3 * l + 1].clone()),
            bv: Some(biases[3 * l + 2].clone()),
            wo: random_matrix(Q8_0, h, q, &mut rng),
            ffn_norm: norms[2 + l].clone(),
            w_gate: random_matrix(Q4_K, f, h, &mut rng),
            w_up: random_matrix(Q4_K, f, h, &mut rng),
            w_down: random_matrix(Q6_K, h, f, &mut rng),
        })
        .collect();
    let weights = ModelWeights {
        token_embd: random_matrix(Q8_0, config.vocab_size, h, &mut rng),
        layers,
        output_norm: norms[4].clone(),
        output: random_matrix(Q8_0, config.vocab_size, h, &mut rng),
    };
    (config, weights)
}
