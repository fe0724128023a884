//! In-process timings of the kernel families at a real model's shapes: the quantised matmuls of
//! one forward over all layers (on the model's default product path, as the forward runs them),
//! grouped by projection, for K new tokens, and tree attention over all layers for a chain of K
//! new tokens after the verify prefix. Compared with the whole forward's time (from
//! [`super::model`]) this splits a forward into matmuls, attention and the rest (norms, RoPE,
//! KV writes, copies, hand-offs between threads) — a profile without a profiler. The criterion
//! benches in `kernels/benches` measure single kernels on synthetic shapes; this measures the
//! model's own matrices.

use serde::{Deserialize, Serialize};
use specdec_kernels::attention::{tree_attention_into, AttentionParams, AttentionSeq};
use specdec_kernels::kv::{KvLayout, PagedKvCache};
use specdec_kernels::TreeTopology;
use specdec_models::llama::{products_on, LlamaModel, MatmulPath, ModelWeights, WeightMatrix};
use specdec_models::{LanguageModel, SequenceStep};

use super::model::{commit_prefix, ModelBenchConfig};
use super::stats::{median, timed, token_stream};
use crate::error::{HarnessError, Result};

/// The projections of a forward, timed as groups.
pub const GROUPS: [&str; 5] = ["qkv", "attn_out", "gate_up", "down", "lm_head"];

/// The matmul time of one projection group for one K.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatmulTiming {
    /// One of [`GROUPS`].
    pub group: String,
    /// Tokens (input rows) per matmul.
    pub k: usize,
    /// Median seconds for the group over all layers (one forward's worth).
    pub median_s: f64,
    /// Weight bytes the group reads per forward.
    pub weight_bytes: u64,
}

impl MatmulTiming {
    /// Weight bytes streamed per second, GB/s (1e9 bytes).
    pub fn gb_per_s(&self) -> f64 {
        self.weight_bytes as f64 / self.median_s / 1e9
    }
}

/// The product calls of one forward in each group, in [`GROUPS`] order: each call is the
/// matrices that read one input, fused as the forward fuses them (Q, K and V; gate and up).
fn grouped(weights: &ModelWeights) -> Vec<Vec<Vec<&WeightMatrix>>> {
    let mut groups: Vec<Vec<Vec<&WeightMatrix>>> = vec![Vec::new(); GROUPS.len()];
    for layer in &weights.layers {
        groups[0].push(vec![&layer.wq, &layer.wk, &layer.wv]);
        groups[1].push(vec![&layer.wo]);
        groups[2].push(vec![&layer.w_gate, &layer.w_up]);
        groups[3].push(vec![&layer.w_down]);
    }
    groups[4].push(vec![&weights.output]);
    groups
}

/// `n` deterministic values in [-1, 1] from `seed`: the timed kernels' inputs.
fn inputs(seed: u64, n: usize) -> Vec<f32> {
    token_stream(seed, n, 2001)
        .into_iter()
        .map(|t| t as f32 / 1000.0 - 1.0)
        .collect()
}

/// [`HarnessError::Bench`] naming `what` unless `repeats >= 1` and `ks` holds K values >= 1.
fn check_repeats_and_ks(what: &str, repeats: usize, ks: &[usize]) -> Result<()> {
    if repeats == 0 || ks.is_empty() || ks.contains(&0) {
        return Err(HarnessError::Bench(format!(
            "{what} timings need repeats >= 1 and K values >= 1"
        )));
    }
    Ok(())
}

/// Times every group's matmuls for each K in `ks` (medians of `repeats` after one warm-up; K
/// values and groups interleaved within a repetition). The calls are made as the forward makes
/// them: fused where it fuses, and from a thread of the compute pool (a call from outside it
/// would add a hand-off and a wake-up to every product). Rows are in `ks` × [`GROUPS`] order.
///
/// # Errors
/// [`HarnessError::Bench`] for zero repeats or a K of zero; kernel errors.
pub fn bench_matmuls(
    weights: &ModelWeights,
    ks: &[usize],
    repeats: usize,
) -> Result<Vec<MatmulTiming>> {
    check_repeats_and_ks("matmul", repeats, ks)?;
    let groups = grouped(weights);
    let widest = groups
        .iter()
        .flatten()
        .flatten()
        .map(|m| m.cols().max(m.rows()))
        .max()
        .unwrap_or(1);
    let fused = groups.iter().flatten().map(Vec::len).max().unwrap_or(1);
    let max_k = ks.iter().copied().max().unwrap_or(1);
    let x = inputs(1, widest * max_k);
    let mut outs = vec![vec![0.0f32; widest * max_k]; fused];
    let mut times = vec![vec![Vec::with_capacity(repeats); groups.len()]; ks.len()];
    let mut timed_calls = || -> Result<()> {
        for rep in 0..=repeats {
            for (ki, &k) in ks.iter().enumerate() {
                for (gi, group) in groups.iter().enumerate() {
                    let (res, secs) = timed(|| -> Result<()> {
                        for call in group {
                            let cols = call[0].cols();
                            let mut pairs: Vec<(&WeightMatrix, &mut [f32])> = call
                                .iter()
                                .zip(outs.iter_mut())
                                .map(|(&m, out)| (m, &mut out[..k * m.rows()]))
                                .collect();
                            products_on(MatmulPath::default(), &x[..k * cols], k, &mut pairs)?;
                        }
                        Ok(())
                    });
                    res?;
                    if rep > 0 {
                        times[ki][gi].push(secs);
                    }
                }
            }
        }
        Ok(())
    };
    // `scope` runs its body on a pool thread, as the model's forward runs
    rayon::scope(|_| timed_calls())?;
    let mut rows = Vec::new();
    for (ki, &k) in ks.iter().enumerate() {
        for (gi, group) in groups.iter().enumerate() {
            let median_s = median(&times[ki][gi])
                .filter(|&m| m > 0.0)
                .ok_or_else(|| HarnessError::Bench("no positive matmul time measured".into()))?;
            rows.push(MatmulTiming {
                group: GROUPS[gi].to_string(),
                k,
                median_s,
                weight_bytes: group.iter().flatten().map(|m| m.bytes().len() as u64).sum(),
            });
        }
    }
    Ok(rows)
}

/// The attention time of one forward (all layers) for K new tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttentionTiming {
    /// New tokens (a chain) attending to the prefix and to each other.
    pub k: usize,
    /// Median seconds for all layers.
    pub median_s: f64,
}

/// Times tree attention as a forward calls it, one call per layer of `layout`, for a chain of
/// K new tokens after `prefix` cached ones, for each K in `ks` (medians of `repeats` after one
/// warm-up, K values interleaved, from a pool thread), with `q_heads` query heads over an f32
/// pool of deterministic values. The keys' values do not change the arithmetic's cost.
///
/// # Errors
/// [`HarnessError::Bench`] for zero repeats, a K of zero or no K; kernel errors (a query head
/// count that is not a multiple of the KV heads).
pub fn bench_attention(
    layout: KvLayout,
    q_heads: usize,
    prefix: usize,
    ks: &[usize],
    repeats: usize,
) -> Result<Vec<AttentionTiming>> {
    check_repeats_and_ks("attention", repeats, ks)?;
    let max_k = ks.iter().copied().max().unwrap_or(1);
    let row = layout.num_kv_heads() * layout.head_dim();
    let mut cache = PagedKvCache::new(layout, layout.blocks_for(prefix + max_k))?;
    let seq = cache.create_sequence();
    for (rows, committed) in [(prefix, true), (max_k, false)] {
        if rows == 0 {
            continue;
        }
        let first = cache.reserve(seq, rows)?;
        for layer in 0..layout.num_layers() {
            let seed = 2 * (layer as u64 + 1) + u64::from(committed);
            let (keys, vals) = (inputs(seed, rows * row), inputs(seed + 7919, rows * row));
            cache.write_kv(seq, layer, first, &keys, &vals)?;
        }
        if committed {
            cache.commit(seq, &(0..rows).collect::<Vec<_>>())?;
        }
    }
    let trees: Vec<TreeTopology> = ks.iter().map(|&k| TreeTopology::chain(k)).collect();
    let queries = inputs(1, max_k * q_heads * layout.head_dim());
    let mut out = vec![0.0f32; max_k * q_heads * layout.head_dim()];
    let scale = 1.0 / (layout.head_dim() as f32).sqrt();
    let mut times = vec![Vec::with_capacity(repeats); ks.len()];
    let mut timed_calls = || -> Result<()> {
        for rep in 0..=repeats {
            for (ki, &k) in ks.iter().enumerate() {
                let width = k * q_heads * layout.head_dim();
                let (res, secs) = timed(|| -> Result<()> {
                    let pages = cache.pages();
                    let batch = [AttentionSeq {
                        queries: &queries[..width],
                        block_table: cache.block_table(seq)?,
                        prefix_len: prefix,
                        tree: &trees[ki],
                    }];
                    for layer in 0..layout.num_layers() {
                        let params = AttentionParams {
                            layer,
                            num_q_heads: q_heads,
                            scale,
                        };
                        tree_attention_into(&pages, &params, &batch, &mut out[..width])?;
                    }
                    Ok(())
                });
                res?;
                if rep > 0 {
                    times[ki].push(secs);
                }
            }
        }
        Ok(())
    };
    // `scope` runs its body on a pool thread, as the model's forward runs
    rayon::scope(|_| timed_calls())?;
    ks.iter()
        .zip(&times)
        .map(|(&k, samples)| {
            let median_s = median(samples)
                .filter(|&m| m > 0.0)
                .ok_or_else(|| HarnessError::Bench("no positive attention time measured".into()))?;
            Ok(AttentionTiming { k, median_s })
        })
        .collect()
}

/// The time of one op of a forward, measured inside the forward.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpShare {
    /// The op ("qkv", "attention", ...; see `specdec_models::llama::OpTime`).
    pub op: String,
    /// Mean milliseconds per forward.
    pub ms_per_forward: f64,
}

/// A forward of K new tokens split into its ops.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpSplit {
    /// New tokens (a chain) after the verify prefix.
    pub k: usize,
    /// Every op, in the order they run.
    pub ops: Vec<OpShare>,
}

/// Untimed forwards before each K's timed ones: the first few forwards after the other
/// benchmarks were measured up to half slower here.
const OP_WARM_UP: usize = 3;

/// Splits the forward of a chain of K new tokens after `config.verify_prefix` committed ones
/// into its ops, timed inside the forward ([`LlamaModel::time_ops`]), for each K of
/// `config.ks()`: means over `config.repeats` forwards after [`OP_WARM_UP`], one K after
/// another.
/// The model's timing is off again and its cache as found on return.
///
/// # Errors
/// [`HarnessError::Bench`] for zero repeats; model errors (e.g. a cache too small).
pub fn bench_ops(model: &mut LlamaModel, config: &ModelBenchConfig) -> Result<Vec<OpSplit>> {
    let ks = config.ks();
    check_repeats_and_ks("op", config.repeats, &ks)?;
    let max_k = ks.iter().copied().max().unwrap_or(1);
    let vocab = u32::try_from(model.vocab_size()).unwrap_or(u32::MAX);
    let tokens = token_stream(config.seed, config.verify_prefix + max_k, vocab);
    let (prefix, drafts) = tokens.split_at(config.verify_prefix);
    let seq = model.new_sequence()?;
    model.time_ops(true);
    let splits = (|| -> Result<Vec<OpSplit>> {
        commit_prefix(model, seq, prefix)?;
        let mut splits = Vec::with_capacity(ks.len());
        for &k in &ks {
            let tree = TreeTopology::chain(k);
            for rep in 0..OP_WARM_UP + config.repeats {
                if rep == OP_WARM_UP {
                    model.reset_op_times();
                }
                model.forward(&[SequenceStep::chain(seq, &drafts[..k], &tree)])?;
                model.rewind(seq, 0)?;
            }
            let ops = model
                .op_times()
                .into_iter()
                .map(|t| OpShare {
                    op: t.op.to_string(),
                    ms_per_forward: t.total.as_secs_f64() * 1e3 / config.repeats as f64,
                })
                .collect();
            splits.push(OpSplit { k, ops });
        }
        Ok(splits)
    })();
    model.time_ops(false);
    model.release(seq)?;
    splits
}

#[cfg(test)]
mod tests {
    use super::*;
    use specdec_models::llama::LayerWeights;

    fn matrix(rows: usize, cols: usize) -> WeightMatrix {
        let values: Vec<f32> = (0..rows * cols).map(|i| (i % 7) as f32 - 3.0).collect();
        WeightMatrix::from_f32(rows, cols, &values).unwrap()
    }

    fn tiny_weights(layers: usize) -> ModelWeights {
        let (hidden, ffn, vocab) = (8, 16, 12);
        let layer = LayerWeights {
            attn_norm: vec![1.0; hidden],
            wq: matrix(hidden, hidden),
            wk: matrix(4, hidden),
            wv: matrix(4, hidden),
            bq: None,
            bk: None,
            bv: None,
            wo: matrix(hidden, hidden),
            ffn_norm: vec![1.0; hidden],
            w_gate: matrix(ffn, hidden),
            w_up: matrix(ffn, hidden),
            w_down: matrix(hidden, ffn),
        };
        ModelWeights {
            token_embd: matrix(vocab, hidden),
            layers: vec![layer; layers],
            output_norm: vec![1.0; hidden],
            output: matrix(vocab, hidden),
        }
    }

    #[test]
    fn one_row_per_k_and_group_with_the_weight_bytes() {
        let weights = tiny_weights(3);
        let rows = bench_matmuls(&weights, &[1, 4], 2).unwrap();
        assert_eq!(rows.len(), 2 * GROUPS.len());
        assert_eq!(rows[0].group, "qkv");
        assert_eq!(rows[GROUPS.len()].k, 4);
        // qkv: 3 layers × (8 + 4 + 4) rows × 8 cols × 4 bytes.
        assert_eq!(rows[0].weight_bytes, 3 * 16 * 8 * 4);
        // gate_up: 3 layers × 2 × 16 × 8 × 4; lm_head: 12 × 8 × 4.
        assert_eq!(rows[2].weight_bytes, 3 * 2 * 16 * 8 * 4);
        assert_eq!(rows[4].weight_bytes, 12 * 8 * 4);
        assert!(rows.iter().all(|r| r.median_s > 0.0 && r.gb_per_s() > 0.0));
    }

    #[test]
    fn refuses_zero_repeats_or_k() {
        let weights = tiny_weights(1);
        assert!(bench_matmuls(&weights, &[1], 0).is_err());
        assert!(bench_matmuls(&weights, &[0, 1], 1).is_err());
        assert!(bench_matmuls(&weights, &[], 1).is_err());
        let layout = KvLayout::new(2, 2, 8, 4).unwrap();
        assert!(bench_attention(layout, 4, 8, &[1], 0).is_err());
        assert!(bench_attention(layout, 4, 8, &[0, 1], 1).is_err());
        assert!(bench_attention(layout, 4, 8, &[], 1).is_err());
        // 3 query heads on 2 KV heads: the kernel's own error
        assert!(bench_attention(layout, 3, 8, &[1], 1).is_err());
    }

    #[test]
    fn ops_are_timed_inside_the_forward_per_k_and_timing_ends_with_the_run() {
        use specdec_models::llama::synthetic::synthetic;
        use specdec_models::llama::{Architecture, LlamaOptions};
        let file = synthetic(Architecture::Qwen2, 3);
        let mut model = LlamaModel::from_gguf(&file, LlamaOptions::default()).unwrap();
        let config = ModelBenchConfig {
            verify_prefix: 12,
            verify_ks: vec![3],
            repeats: 2,
            ..ModelBenchConfig::default()
        };
        let splits = bench_ops(&mut model, &config).unwrap();
        assert_eq!(splits.iter().map(|s| s.k).collect::<Vec<_>>(), [1, 3]);
        for split in &splits {
            let ops: Vec<&str> = split.ops.iter().map(|o| o.op.as_str()).collect();
            assert_eq!(
                ops,
                [
                    "embed",
                    "norms",
                    "qkv",
                    "rope",
                    "write_kv",
                    "attention",
                    "attn_out",
                    "residual",
                    "gate_up",
                    "swiglu",
                    "down",
                    "taps",
                    "lm_head",
                    "outputs"
                ],
                "K = {}",
                split.k
            );
            assert!(split.ops.iter().all(|o| o.ms_per_forward >= 0.0));
            assert!(split.ops.iter().any(|o| o.ms_per_forward > 0.0));
        }
        // timing is off again, and the cache as found: a fresh sequence starts empty
        assert!(model.op_times().is_empty());
        let seq = model.new_sequence().unwrap();
        assert_eq!(model.seq_len(seq).unwrap(), 0);
        let zero = ModelBenchConfig {
            repeats: 0,
            ..config
        };
        assert!(bench_ops(&mut model, &zero).is_err());
    }

    #[test]
    fn attention_is_timed_per_k_after_a_prefix() {
        // 2 layers, 2 KV heads of 8, blocks of 4; a prefix that ends inside a block
        let layout = KvLayout::new(2, 2, 8, 4).unwrap();
        let rows = bench_attention(layout, 4, 10, &[1, 3], 3).unwrap();
        assert_eq!(rows.iter().map(|r| r.k).collect::<Vec<_>>(), [1, 3]);
        assert!(rows.iter().all(|r| r.median_s > 0.0));
        // no prefix at all is a valid measurement too
        assert_eq!(bench_attention(layout, 2, 0, &[2], 1).unwrap().len(), 1);
    }
}
