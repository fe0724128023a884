//! Quantised matmul at the real shapes of Qwen2.5-Coder-1.5B (hidden 1536, FFN 8960):
//! `[8960 x 1536]` gate/up projections in Q4_K and Q6_K, for n_tokens 1, 2, 4, 8, 16, on the
//! detected SIMD level and (n_tokens 1 and 4 only) on the portable path for comparison, for the
//! exact f32-activation path (`f32-*`), the 8-bit-activation path over the GGUF layout
//! (`int8-*`) and over the 16-row repacked layout (`int8-packed-*`, the model's path on AVX-512).
//! Throughput is reported as bytes of weights swept per second.
//!
//! Then the 32-element types at the shapes of the small models, exact path (`f32-*`) against the
//! 32-block 8-bit path over the GGUF layout (`q32-*`) and over the 16-row tiles
//! (`q32-packed-*`, the model's path on AVX-512), quantisation included, for n_tokens 1, 4, 8:
//! SmolLM2-135M's
//! `[1536 x 576]` Q4_1 FFN and `[49152 x 576]` Q8_0 tied head, Qwen2.5-Coder-0.5B's
//! `[4864 x 896]` Q5_0 FFN and `[151936 x 896]` Q8_0 head.
//!
//! Those matrices fit in the last-level cache (32 MB here), so repeated calls measure the
//! arithmetic. The `dram_*` groups sweep 16 distinct packed matrices per iteration (124 MB of
//! Q4_K, 166 MB of Q6_K) so that every byte comes from DRAM, as in a real forward: their
//! 4-token time against their 1-token time is the verify-cost curve of one layer's product,
//! and is what the kernels' prefetch hints are tuned on.
//!
//! Weights are synthetic ([`synthetic_weights`]): speed does not depend on values.
//!
//! `cargo bench -p specdec-kernels --bench quant_matmul` (set `RAYON_NUM_THREADS` to pin threads).

use criterion::{criterion_main, BenchmarkId, Criterion, Throughput};
use specdec_kernels::quant::{
    quant_matmul_int8_packed, quant_matmul_int8_packed_with, quant_matmul_int8_with,
    quant_matmul_q32_packed_with, quant_matmul_q32_with, quant_matmul_with, synthetic_weights,
    Int8PackedMatrix, Q8Activations, Q8Blocks32, QuantMatrix, QuantType, SimdLevel,
};

const ROWS: usize = 8960;
const COLS: usize = 1536;

fn bench(c: &mut Criterion) {
    let best = SimdLevel::detect();
    for ty in [QuantType::Q4_K, QuantType::Q6_K] {
        let data = synthetic_weights(ty, ROWS, COLS, 1).unwrap();
        let w = QuantMatrix::new(ty, ROWS, COLS, &data).unwrap();
        let packed = Int8PackedMatrix::pack(&w).unwrap();
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
            // the same product over the 16-row repacked weights (the model's path on AVX-512)
            group.bench_with_input(
                BenchmarkId::new(format!("int8-packed-{best:?}"), n_tokens),
                &n_tokens,
                |b, &n| {
                    b.iter(|| {
                        let acts = Q8Activations::quantize(&x, n, COLS).unwrap();
                        quant_matmul_int8_packed_with(&packed, &acts, &mut out, best).unwrap()
                    })
                },
            );
        }
        group.finish();
    }
    bench_q32(c, best);
    bench_dram(c);
}

/// The packed k-quant products of `[8960 × 1536]` from DRAM: 16 distinct matrices per
/// iteration, n_tokens 1, 2, 4.
fn bench_dram(c: &mut Criterion) {
    const MATRICES: usize = 16;
    for ty in [QuantType::Q4_K, QuantType::Q6_K] {
        let packed: Vec<Int8PackedMatrix> = (0..MATRICES as u64)
            .map(|seed| {
                let data = synthetic_weights(ty, ROWS, COLS, seed + 1).unwrap();
                Int8PackedMatrix::pack(&QuantMatrix::new(ty, ROWS, COLS, &data).unwrap()).unwrap()
            })
            .collect();
        let bytes: usize = packed.iter().map(Int8PackedMatrix::len_bytes).sum();
        let mut group = c.benchmark_group(format!("dram_16x{ROWS}x{COLS}_{}", ty.name()));
        group.throughput(Throughput::Bytes(bytes as u64));
        group.sample_size(20);
        for n_tokens in [1usize, 2, 4] {
            let acts =
                Q8Activations::quantize(&activations(n_tokens, COLS), n_tokens, COLS).unwrap();
            let mut out = vec![0.0; n_tokens * ROWS];
            group.bench_with_input(
                BenchmarkId::new("int8-packed", n_tokens),
                &n_tokens,
                |b, _| {
                    b.iter(|| {
                        for w in &packed {
                            quant_matmul_int8_packed(w, &acts, &mut out).unwrap();
                        }
                    })
                },
            );
        }
        group.finish();
    }
}

/// Activations of `n_tokens × cols` in [-1, 1].
fn activations(n_tokens: usize, cols: usize) -> Vec<f32> {
    (0..n_tokens * cols)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect()
}

/// The 32-element types at the small models' real shapes: exact vs 32-block 8-bit path, over
/// the GGUF layout and the 16-row tiles.
fn bench_q32(c: &mut Criterion, best: SimdLevel) {
    let shapes = [
        (QuantType::Q4_1, 1536, 576, "smollm2_ffn"),
        (QuantType::Q8_0, 49152, 576, "smollm2_head"),
        (QuantType::Q5_0, 4864, 896, "qwen05_ffn"),
        (QuantType::Q8_0, 151936, 896, "qwen05_head"),
    ];
    for (ty, rows, cols, name) in shapes {
        let data = synthetic_weights(ty, rows, cols, 1).unwrap();
        let w = QuantMatrix::new(ty, rows, cols, &data).unwrap();
        let packed = Int8PackedMatrix::pack(&w).unwrap();
        let mut group = c.benchmark_group(format!("{name}_{rows}x{cols}_{}", ty.name()));
        group.throughput(Throughput::Bytes(data.len() as u64));
        group.sample_size(10);
        for n_tokens in [1usize, 4, 8] {
            let x = activations(n_tokens, cols);
            let mut out = vec![0.0; n_tokens * rows];
            group.bench_with_input(
                BenchmarkId::new(format!("f32-{best:?}"), n_tokens),
                &n_tokens,
                |b, &n| b.iter(|| quant_matmul_with(&w, &x, n, &mut out, best).unwrap()),
            );
            group.bench_with_input(
                BenchmarkId::new(format!("q32-{best:?}"), n_tokens),
                &n_tokens,
                |b, &n| {
                    b.iter(|| {
                        let acts = Q8Blocks32::quantize(&x, n, cols).unwrap();
                        quant_matmul_q32_with(&w, &acts, &mut out, best).unwrap()
                    })
                },
            );
            group.bench_with_input(
                BenchmarkId::new(format!("q32-packed-{best:?}"), n_tokens),
                &n_tokens,
                |b, &n| {
                    b.iter(|| {
                        let acts = Q8Blocks32::quantize(&x, n, cols).unwrap();
                        quant_matmul_q32_packed_with(&packed, &acts, &mut out, best).unwrap()
                    })
                },
            );
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
