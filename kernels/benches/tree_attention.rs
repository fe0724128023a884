//! Tree attention over the paged KV cache (CPU): prefixes 512 / 4k / 32k × trees of 1 / 8 / 64
//! nodes (binary trees), GQA 12 query heads : 2 KV heads, head dim 128, block size 16; and the
//! same over bf16 and f16 pools (`tree_attention_kv_dtype`: prefixes 4k / 32k, 1 and 8 nodes,
//! the f32 pool measured in the same group as the baseline).
//!
//! `tree_attention_simd`: the two real targets' shapes (SmolLM2-135M: 9 query heads : 3 KV heads,
//! head dim 64; Qwen2.5-Coder-1.5B: 12 : 2, 128) at a verify's sizes (chains of 1 / 5 / 8 new
//! tokens after 256 / 1024 cached ones, f32 pool), portable and AVX2 (where the CPU has it) one
//! after the other at each size (both give the same bits); timed on a pool thread.
//!
//! Throughput is reported in bytes of K/V read per call: `(prefix + nodes) × 2 KV heads × 128 ×
//! 4 bytes × 2 (K and V)`, each distinct row counted once. Tokens/s is `nodes / time`.

// `criterion_group!` defines an undocumented public function.
#![allow(missing_docs)]

use std::time::Instant;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use specdec_kernels::attention::{
    tree_attention, tree_attention_into_with, AttentionParams, AttentionSeq,
};
use specdec_kernels::kv::{KvData, KvDtype, KvLayout, KvPages};
use specdec_kernels::quant::float16::{f32_to_bf16, f32_to_f16};
use specdec_kernels::quant::SimdLevel;
use specdec_kernels::TreeTopology;

const KV_HEADS: usize = 2;
const Q_HEADS: usize = 12;
const HEAD_DIM: usize = 128;
const BLOCK: usize = 16;

/// Deterministic values in [-1, 1).
fn fill(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// A pool of whole blocks for `tokens` tokens of `layout`, deterministic values, and its block
/// table, reversed: logically adjacent blocks are not physically adjacent.
fn pool_and_table(layout: &KvLayout, tokens: usize) -> (Vec<f32>, Vec<u32>) {
    let blocks = layout.blocks_for(tokens);
    let pool = fill(blocks * layout.block_elems(), 1);
    (pool, (0..blocks as u32).rev().collect())
}

/// A binary tree of `n` nodes in breadth-first order (a chain for n = 1).
fn binary_tree(n: usize) -> TreeTopology {
    let parents: Vec<Option<usize>> = (0..n).map(|i| i.checked_sub(1).map(|p| p / 2)).collect();
    TreeTopology::from_parents(&parents).expect("a valid binary tree")
}

/// One benchmark group: every prefix × node count, over a pool of each of `dtypes` holding the
/// same values (rounded for 16-bit pools). With one dtype the ids are `prefixP/Nnodes`, else
/// `DTYPE/prefixP/Nnodes`.
fn bench_group(
    c: &mut Criterion,
    name: &str,
    prefixes: &[usize],
    node_counts: &[usize],
    dtypes: &[KvDtype],
) {
    let layout = KvLayout::new(1, KV_HEADS, HEAD_DIM, BLOCK).expect("valid layout");
    let mut group = c.benchmark_group(name);
    group.sample_size(10);
    let params = AttentionParams {
        layer: 0,
        num_q_heads: Q_HEADS,
        scale: 1.0 / (HEAD_DIM as f32).sqrt(),
    };
    for &prefix in prefixes {
        for &nodes in node_counts {
            let tokens = prefix + nodes;
            let (pool, table) = pool_and_table(&layout, tokens);
            let tree = binary_tree(nodes);
            let queries = fill(nodes * Q_HEADS * HEAD_DIM, 2);
            let batch = [AttentionSeq {
                queries: &queries,
                block_table: &table,
                prefix_len: prefix,
                tree: &tree,
            }];
            for &dtype in dtypes {
                let bits: Vec<u16> = match dtype {
                    KvDtype::F32 => Vec::new(),
                    KvDtype::Bf16 => pool.iter().map(|&v| f32_to_bf16(v)).collect(),
                    KvDtype::F16 => pool.iter().map(|&v| f32_to_f16(v)).collect(),
                };
                let data = match dtype {
                    KvDtype::F32 => KvData::F32(&pool),
                    half => KvData::Half(half, &bits),
                };
                let pages = KvPages::of(layout, data).expect("whole blocks");
                let kv_bytes = tokens * KV_HEADS * HEAD_DIM * dtype.bytes() * 2;
                group.throughput(Throughput::Bytes(kv_bytes as u64));
                let id = match dtypes.len() {
                    1 => format!("prefix{prefix}"),
                    _ => format!("{dtype}/prefix{prefix}"),
                };
                group.bench_with_input(
                    BenchmarkId::new(id, format!("{nodes}nodes")),
                    &batch,
                    |b, batch| {
                        b.iter(|| tree_attention(&pages, &params, batch).expect("valid batch"))
                    },
                );
            }
        }
    }
    group.finish();
}

fn bench_tree_attention(c: &mut Criterion) {
    let (prefixes, nodes) = ([512, 4096, 32768], [1, 8, 64]);
    bench_group(c, "tree_attention", &prefixes, &nodes, &[KvDtype::F32]);
}

fn bench_kv_dtypes(c: &mut Criterion) {
    bench_group(
        c,
        "tree_attention_kv_dtype",
        &[4096, 32768],
        &[1, 8],
        &KvDtype::ALL,
    );
}

/// The real targets' attention shapes: `(name, KV heads, query heads, head dim)`.
const TARGET_SHAPES: [(&str, usize, usize, usize); 2] =
    [("smollm2", 3, 9, 64), ("qwen2.5-1.5b", 2, 12, 128)];

fn bench_simd_levels(c: &mut Criterion) {
    // the attention loops have a portable and an AVX2 build
    let levels: Vec<SimdLevel> = [SimdLevel::Portable, SimdLevel::Avx2]
        .into_iter()
        .filter(|l| l.is_available())
        .collect();
    let mut group = c.benchmark_group("tree_attention_simd");
    group.sample_size(20);
    for (name, kv_heads, q_heads, head_dim) in TARGET_SHAPES {
        let layout = KvLayout::new(1, kv_heads, head_dim, BLOCK).expect("valid layout");
        let params = AttentionParams {
            layer: 0,
            num_q_heads: q_heads,
            scale: 1.0 / (head_dim as f32).sqrt(),
        };
        for prefix in [256, 1024] {
            for nodes in [1, 5, 8] {
                let (pool, table) = pool_and_table(&layout, prefix + nodes);
                let pages = KvPages::of(layout, KvData::F32(&pool)).expect("whole blocks");
                let tree = TreeTopology::chain(nodes);
                let queries = fill(nodes * q_heads * head_dim, 2);
                let batch = [AttentionSeq {
                    queries: &queries,
                    block_table: &table,
                    prefix_len: prefix,
                    tree: &tree,
                }];
                let mut out = vec![0.0; queries.len()];
                group.throughput(Throughput::Elements(nodes as u64));
                for &level in &levels {
                    group.bench_function(
                        BenchmarkId::new(format!("{name}/{level:?}/prefix{prefix}"), nodes),
                        |b| {
                            // Timed on a pool thread, as the forward calls it: a call from
                            // outside the pool would also time the hand-over to its threads.
                            b.iter_custom(|iters| {
                                let (elapsed, ()) = rayon::join(
                                    || {
                                        let start = Instant::now();
                                        for _ in 0..iters {
                                            tree_attention_into_with(
                                                &pages, &params, &batch, &mut out, level,
                                            )
                                            .expect("valid batch");
                                        }
                                        start.elapsed()
                                    },
                                    || (),
                                );
                                elapsed
                            })
                        },
                    );
                }
            }
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_tree_attention,
    bench_kv_dtypes,
    bench_simd_levels
);
criterion_main!(benches);
