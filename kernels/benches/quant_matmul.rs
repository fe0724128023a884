//! Quantised matmul at the real shapes of Qwen2.5-Coder-1.5B (hidden 1536, FFN 8960):
//! `[8960 x 1536]` gate/up projections in Q4_K and Q6_K, for n_tokens 1, 2, 4, 8, 16, on the
//! detected SIMD level and (n_tokens 1 and 4 only) on the portable path for comparison, for the
//! exact f32-activation path (`f32-*`) and the 8-bit-activation path (`int8-*`).
//! Throughput is reported as bytes of weights swept per second.
//!
//! Weights are synthetic ([`synthetic_weights`]): speed does not depend on values.
//!
//! `cargo bench -p specdec-kernels --bench quant_matmul` (set `RAYON_NUM_THREADS` to pin threads).

use criterion::{criterion_main, BenchmarkId, Criterion, Throughput};
use specdec_kernels::quant::{
    quant_matmul_int8_with, quant_matmul_with, synthetic_weights, Q8Activations, QuantMatrix,
    QuantType, SimdLevel,
};

const ROWS: usize = 8960;
const COLS: usize = 1536;

fn bench(c: &mut Criterion) {
    let best = SimdLevel::detect();
    for ty in [QuantType::Q4_K, QuantType::Q6_K] {
        let data = synthetic_weights(ty, ROWS, COLS, 1).unwrap();
        let w = QuantMatrix::new(ty, ROWS, COLS, &data).unwrap();
        let mut group = c.benchmark_group(format!("matmul_{}x{}_{}", ROWS, COLS, ty.name()));
        group.throughput(Throughput::Bytes(data.len() as u64));
        group.sample_size(20);
        for n_tokens in [1usize, 2, 4, 8, 16] {
            let x: Vec<f32> = (0..n_tokens * COLS)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect();
            let mut out = vec![0.0; n_tokens * ROWS];
            let mut levels = vec![best];
            if n_tokens == 1 || n_tokens == 4 {
                levels.push(SimdLevel::Portable);
            }
            for &level in &levels {
                group.bench_with_input(
                    BenchmarkId::new(format!("f32-{level:?}"), n_tokens),
                    &n_tokens,
                    |b, &n| b.iter(|| quant_matmul_with(&w, &x, n, &mut out, level).unwrap()),
                );
            }
            // int8 activations, quantisation included in the timing
            for &level in &levels {
                group.bench_with_input(
                    BenchmarkId::new(format!("int8-{level:?}"), n_tokens),
                    &n_tokens,
                    |b, &n| {
                        b.iter(|| {
                            let acts = Q8Activations::quantize(&x, n, COLS).unwrap();
                            quant_matmul_int8_with(&w, &acts, &mut out, level).unwrap()
                        })
                    },
                );
            }
        }
        group.finish();
    }
}

/// The criterion group (its macro-generated function carries no docs).
#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(group::benches);
