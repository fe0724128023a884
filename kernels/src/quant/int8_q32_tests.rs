//! Tests of the 32-block 8-bit-activation product: exact integer core on every SIMD level,
//! bit-identical levels and batch invariance, agreement with the exact f32 path within the
//! activation-quantisation bound, and refused inputs.

use super::dequant::dequantize_row_to_vec;
use super::float16::f32_to_f16;
use super::int8_q32::{q32_supported, quant_matmul_q32, quant_matmul_q32_with, Q8Blocks32};
use super::matmul::{quant_matmul, QuantMatrix, SimdLevel};
use super::testutil::{
    assert_rows_bit_identical, available_levels, random_row, reference_dot, TestRng,
};
use super::types::QuantType;
use crate::error::KernelError;

const TYPES: [QuantType; 4] = [
    QuantType::Q8_0,
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
];

fn setup(ty: QuantType, rows: usize, cols: usize, n: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut rng = TestRng(seed);
    let data = (0..rows)
        .flat_map(|_| random_row(ty, cols, &mut rng))
        .collect();
    let x = (0..n * cols).map(|_| rng.uniform(-3.0, 3.0)).collect();
    (data, x)
}

/// The signed weight quants of a block as the module docs define them (from the dequantised
/// values with `d = 1`: `x = q`, plus `m` for Q4_1 which is set to 0 here).
fn weight_quants(ty: QuantType, block: &[u8]) -> Vec<i64> {
    let mut unit = block.to_vec();
    unit[0..2].copy_from_slice(&f32_to_f16(1.0).to_le_bytes());
    if ty == QuantType::Q4_1 {
        unit[2..4].copy_from_slice(&0u16.to_le_bytes());
    }
    let x = dequantize_row_to_vec(ty, &unit, 32).unwrap();
    x.iter().map(|&v| v as i64).collect()
}

#[test]
fn quantised_activations_follow_the_definition() {
    let mut x = vec![0.0f32; 128];
    x[0] = 2.54;
    x[1] = -1.27; // -1.27 * 50 = -63.5 → -64 (half away from zero)
    x[2] = 0.005; // 0.25 → 0
    x[3] = 0.01; // 0.5 → 1
    let a = Q8Blocks32::quantize(&x, 2, 64).unwrap();
    let deq = a.dequantize();
    let d = 2.54f32 / 127.0;
    assert_eq!(deq.len(), 128);
    assert_eq!(deq[0], d * 127.0);
    assert_eq!(deq[1], d * -64.0);
    assert_eq!(deq[2], 0.0);
    assert_eq!(deq[3], d);
    assert!(deq[32..].iter().all(|&v| v == 0.0));
    assert_eq!((a.n_tokens(), a.cols()), (2, 64));
}

/// With `dw = 1` (and Q4_1 `m = 1`) and integer activations whose block maximum is 127
/// (`da = 1`, `qa = x`), every float operation is exact and the output is the integer
/// `Σ_b isum_b` (+ `Σ_b asum_b` for Q4_1): compared with an i64 reference on every level, for
/// rows of 1 to 19 blocks (full groups of eight and ragged tails).
#[test]
fn integer_core_is_exact_on_every_level() {
    let mut rng = TestRng(71);
    for ty in TYPES {
        for blocks in [1usize, 2, 7, 8, 9, 16, 19] {
            let (rows, cols, n) = (5, 32 * blocks, 3);
            let mut data = Vec::new();
            for _ in 0..rows {
                let mut row = random_row(ty, cols, &mut rng);
                for block in row.chunks_exact_mut(ty.block_bytes()) {
                    block[0..2].copy_from_slice(&f32_to_f16(1.0).to_le_bytes());
                    if ty == QuantType::Q4_1 {
                        block[2..4].copy_from_slice(&f32_to_f16(1.0).to_le_bytes());
                    }
                }
                data.extend(row);
            }
            let x: Vec<f32> = (0..n * cols)
                .map(|i| {
                    if i % 32 == 5 {
                        if rng.below(2) == 0 {
                            127.0
                        } else {
                            -127.0
                        }
                    } else {
                        rng.below(255) as f32 - 127.0
                    }
                })
                .collect();
            let w = QuantMatrix::new(ty, rows, cols, &data).unwrap();
            let acts = Q8Blocks32::quantize(&x, n, cols).unwrap();
            for level in available_levels() {
                let mut out = vec![0.0; n * rows];
                quant_matmul_q32_with(&w, &acts, &mut out, level).unwrap();
                for r in 0..rows {
                    for t in 0..n {
                        let mut want = 0i64;
                        for (b, block) in w.row(r).chunks_exact(ty.block_bytes()).enumerate() {
                            let qw = weight_quants(ty, block);
                            let xa = &x[t * cols + 32 * b..t * cols + 32 * b + 32];
                            want += qw.iter().zip(xa).map(|(&q, &a)| q * a as i64).sum::<i64>();
                            if ty == QuantType::Q4_1 {
                                want += xa.iter().map(|&a| a as i64).sum::<i64>();
                            }
                        }
                        assert_eq!(
                            out[t * rows + r] as i64,
                            want,
                            "{ty} {level:?} {blocks} blocks, row {r} token {t}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn matches_the_exact_product_of_the_quantised_activations() {
    // against the f64 product of the dequantised weights with the dequantised activations:
    // only f32 rounding separates them
    for ty in TYPES {
        let (rows, cols, n) = (13, 576, 3);
        let (data, x) = setup(ty, rows, cols, n, 81);
        let w = QuantMatrix::new(ty, rows, cols, &data).unwrap();
        let acts = Q8Blocks32::quantize(&x, n, cols).unwrap();
        let xq = acts.dequantize();
        let mut out = vec![0.0; n * rows];
        quant_matmul_q32(&w, &acts, &mut out).unwrap();
        for r in 0..rows {
            let wr = dequantize_row_to_vec(ty, w.row(r), cols).unwrap();
            for t in 0..n {
                let (exact, scale) = reference_dot(&wr, &xq[t * cols..(t + 1) * cols]);
                let got = out[t * rows + r] as f64;
                assert!(
                    (got - exact).abs() <= 1e-5 * scale + 1e-6,
                    "{ty} row {r} token {t}: {got} vs {exact}"
                );
            }
        }
    }
}

#[test]
fn stays_within_the_activation_quantisation_bound_of_the_f32_path() {
    for ty in TYPES {
        let (rows, cols, n) = (11, 896, 2);
        let (data, x) = setup(ty, rows, cols, n, 82);
        let w = QuantMatrix::new(ty, rows, cols, &data).unwrap();
        let acts = Q8Blocks32::quantize(&x, n, cols).unwrap();
        let mut fast = vec![0.0; n * rows];
        quant_matmul_q32(&w, &acts, &mut fast).unwrap();
        let mut exact = vec![0.0; n * rows];
        quant_matmul(&w, &x, n, &mut exact).unwrap();
        for r in 0..rows {
            let wr = dequantize_row_to_vec(ty, w.row(r), cols).unwrap();
            for t in 0..n {
                let xt = &x[t * cols..(t + 1) * cols];
                let mut bound = 0.0f64;
                for (wb, xb) in wr.chunks(32).zip(xt.chunks(32)) {
                    let d = xb.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
                    bound += d / 2.0 * wb.iter().map(|v| v.abs() as f64).sum::<f64>();
                }
                let (_, scale) = reference_dot(&wr, xt);
                let diff = (fast[t * rows + r] as f64 - exact[t * rows + r] as f64).abs();
                assert!(
                    diff <= bound * 1.01 + 1e-5 * scale,
                    "{ty} row {r} token {t}: {diff} > {bound}"
                );
            }
        }
    }
}

/// Every level, every group size 1..=9 and ragged batch sizes: each token's outputs are
/// bit-identical to the token alone on the portable kernel.
#[test]
fn levels_are_bit_identical_and_batch_invariant() {
    let levels = available_levels();
    for ty in TYPES {
        for cols in [96usize, 576] {
            let rows = 21;
            let total = 13;
            let (data, x) = setup(ty, rows, cols, total, 83);
            let w = QuantMatrix::new(ty, rows, cols, &data).unwrap();
            let alone: Vec<Vec<f32>> = (0..total)
                .map(|t| {
                    let a = Q8Blocks32::quantize(&x[t * cols..(t + 1) * cols], 1, cols).unwrap();
                    let mut o = vec![0.0; rows];
                    quant_matmul_q32_with(&w, &a, &mut o, SimdLevel::Portable).unwrap();
                    o
                })
                .collect();
            for n in (1..=9).chain([11, 13]) {
                for start in [0, total - n] {
                    let xs = &x[start * cols..(start + n) * cols];
                    let a = Q8Blocks32::quantize(xs, n, cols).unwrap();
                    for &level in &levels {
                        let mut out = vec![0.0; n * rows];
                        quant_matmul_q32_with(&w, &a, &mut out, level).unwrap();
                        let what = format!(
                            "{ty} cols {cols} {level:?}: tokens {start}.. in a batch of {n}"
                        );
                        assert_rows_bit_identical(&out, &alone[start..], rows, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn bad_inputs_are_refused_with_clear_errors() {
    assert!(TYPES.iter().all(|&t| q32_supported(t)));
    assert!(!q32_supported(QuantType::Q4_K) && !q32_supported(QuantType::F32));
    let err = Q8Blocks32::quantize(&[0.0; 48], 1, 48).unwrap_err();
    assert!(
        matches!(err, KernelError::NotBlockAligned { len: 48, .. }),
        "{err}"
    );
    let err = Q8Blocks32::quantize(&[0.0; 64], 3, 32).unwrap_err();
    assert!(matches!(err, KernelError::ShapeMismatch { .. }), "{err}");
    let mut x = vec![0.5f32; 64];
    x[37] = f32::NAN;
    let err = Q8Blocks32::quantize(&x, 2, 32).unwrap_err();
    assert!(err.to_string().contains("element 37 (token 1)"), "{err}");

    let a = Q8Blocks32::quantize(&[0.25; 64], 1, 64).unwrap();
    let data = vec![0u8; 144];
    let w = QuantMatrix::new(QuantType::Q4_K, 1, 256, &data).unwrap();
    let err = quant_matmul_q32(&w, &a, &mut [0.0; 1]).unwrap_err();
    assert!(err.to_string().contains("Q4_K"), "{err}");
    let data = vec![0u8; 2 * 34 * 3];
    let w = QuantMatrix::new(QuantType::Q8_0, 2, 96, &data).unwrap();
    let err = quant_matmul_q32(&w, &a, &mut [0.0; 2]).unwrap_err();
    assert!(err.to_string().contains("activation columns"), "{err}");
    let data = vec![0u8; 2 * 34 * 2];
    let w = QuantMatrix::new(QuantType::Q8_0, 2, 64, &data).unwrap();
    let err = quant_matmul_q32(&w, &a, &mut [0.0; 3]).unwrap_err();
    assert!(err.to_string().contains("output"), "{err}");
    assert!(quant_matmul_q32(&w, &a, &mut [0.0; 2]).is_ok());
}
