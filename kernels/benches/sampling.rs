//! Cost of the sampling kernels on the CPU for one row of the real targets' vocabularies:
//! SmolLM2's 49,152 ids and Qwen2.5's 151,936. Speculation prepares one row per verified node
//! (and per draft query), so at T > 0 this is paid K + 1 times per step against once per token
//! in plain decoding; each step then draws at least one token from a full row.
//!
//! - `prepare_logits/t1`: logits to probabilities at temperature 1, no cut (the common sampled
//!   setting); `t07_top_p`: temperature 0.7 with top-p 0.9 (the sorted path); `greedy`:
//!   temperature 0 (argmax, one-hot);
//! - `categorical`: one draw (`categorical_from_word`) from the prepared T = 1 row, over eight
//!   fixed words (so the walk stops at different depths); the time is per draw.
//!
//! Throughput is in row entries per second. The logits are a fixed pseudo-random row shaped like
//! a language model's (a few large values over a long tail).

// `criterion_group!` defines an undocumented public function.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use specdec_kernels::sampling::replay::categorical_from_word;
use specdec_kernels::sampling::{mix64, prepare_logits, SamplingParams};

/// A logit row of `vocab` entries: a heavy-tailed spread from a fixed hash, plus a few
/// standout tokens, as trained language models produce.
fn logits(vocab: usize) -> Vec<f32> {
    (0..vocab)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2_654_435_761) >> 8;
            let u = h as f32 / (1u32 << 24) as f32;
            let standout = if i % 9973 == 17 { 12.0 } else { 0.0 };
            -8.0 * u * u + 4.0 + standout
        })
        .collect()
}

fn bench_prepare(c: &mut Criterion) {
    let mut group = c.benchmark_group("prepare_logits");
    let settings = [
        ("t1", SamplingParams::with_temperature(1.0)),
        (
            "t07_top_p",
            SamplingParams {
                top_p: Some(0.9),
                ..SamplingParams::with_temperature(0.7)
            },
        ),
        ("greedy", SamplingParams::greedy()),
    ];
    for vocab in [49_152usize, 151_936] {
        let row = logits(vocab);
        group.throughput(Throughput::Elements(vocab as u64));
        for (name, params) in &settings {
            group.bench_with_input(BenchmarkId::new(*name, vocab), &row, |b, row| {
                b.iter(|| prepare_logits(row, params).expect("valid row"))
            });
        }
    }
    group.finish();
}

fn bench_categorical(c: &mut Criterion) {
    let mut group = c.benchmark_group("categorical");
    for vocab in [49_152usize, 151_936] {
        let probs = prepare_logits(&logits(vocab), &SamplingParams::with_temperature(1.0))
            .expect("valid row");
        let words: Vec<u64> = (0..8).map(mix64).collect();
        group.throughput(Throughput::Elements(vocab as u64));
        group.bench_with_input(BenchmarkId::from_parameter(vocab), &probs, |b, probs| {
            let mut next = words.iter().cycle();
            b.iter(|| categorical_from_word(*next.next().expect("cycled"), probs))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_prepare, bench_categorical);
criterion_main!(benches);
