//! Cost per token of committing an accepted path and of rewinding, on a cache shaped like a
//! small model: 24 layers × 2 KV heads × head dim 128 (48 KiB of K+V per token), block size 16,
//! a committed prefix of 512 tokens and a 64-node step.
//!
//! - `commit/chain`: 8 accepted nodes already in place (bookkeeping and freeing only);
//! - `commit/binary_tree`: the deepest root-to-leaf path of a 64-node binary tree (6 nodes,
//!   5 of them copied slot by slot);
//! - `commit/remap`: 48 accepted nodes of which two aligned runs of 16 move by block remap;
//! - `rewind`: dropping 64 committed tokens.
//!
//! Throughput is in tokens (accepted or rewound) per second. Only the timed call is measured:
//! reserve before and the undo after are outside the clock.

// `criterion_group!` defines an undocumented public function.
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use specdec_kernels::kv::{KvLayout, PagedKvCache, SeqId};

const PREFIX: usize = 512;
const STEP: usize = 64;

fn cache_with_prefix() -> (PagedKvCache, SeqId) {
    let layout = KvLayout::new(24, 2, 128, 16).expect("valid layout");
    let blocks = layout.blocks_for(PREFIX + STEP) + 2;
    let mut cache = PagedKvCache::new(layout, blocks).expect("pool fits");
    let seq = cache.create_sequence();
    cache.reserve(seq, PREFIX).expect("room for the prefix");
    let all: Vec<usize> = (0..PREFIX).collect();
    cache.commit(seq, &all).expect("commit the prefix");
    (cache, seq)
}

fn bench_commit(c: &mut Criterion) {
    // Path to node 63 of the binary tree parent(i) = (i - 1) / 2.
    let mut deepest = vec![63usize];
    while let Some(&node) = deepest.last() {
        if node == 0 {
            break;
        }
        deepest.push((node - 1) / 2);
    }
    deepest.reverse();
    // Nodes 0..16 then 32..64: a run of 16 after a dead branch 16..32.
    let remap: Vec<usize> = (0..16).chain(32..64).collect();
    let chain: Vec<usize> = (0..8).collect();

    let mut group = c.benchmark_group("commit");
    for (name, path) in [("chain", chain), ("binary_tree", deepest), ("remap", remap)] {
        let (mut cache, seq) = cache_with_prefix();
        group.throughput(Throughput::Elements(path.len() as u64));
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    cache.reserve(seq, STEP).expect("room for the step");
                    let start = Instant::now();
                    let stats = cache.commit(seq, &path).expect("valid path");
                    total += start.elapsed();
                    criterion::black_box(stats);
                    cache.rewind(seq, path.len()).expect("undo the commit");
                }
                total
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("rewind");
    let (mut cache, seq) = cache_with_prefix();
    group.throughput(Throughput::Elements(STEP as u64));
    group.bench_function("64_tokens", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let all: Vec<usize> = (0..STEP).collect();
            for _ in 0..iters {
                cache.reserve(seq, STEP).expect("room for the step");
                cache.commit(seq, &all).expect("commit the step");
                let start = Instant::now();
                let freed = cache.rewind(seq, STEP).expect("rewind the step");
                total += start.elapsed();
                criterion::black_box(freed);
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, bench_commit);
criterion_main!(benches);
