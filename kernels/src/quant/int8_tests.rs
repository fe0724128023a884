//! Tests of the 8-bit-activation product: exact integer core (scalar ≡ AVX2), batch invariance
//! (bit-exact), and agreement with the exact f32 path within the stated quantisation bound.

use super::dequant::dequantize_row_to_vec;
use super::int8::{int8_supported, quant_matmul_int8, quant_matmul_int8_with, Q8Activations};
use super::matmul::{QuantMatrix, SimdLevel};
use super::testutil::{
    assert_rows_bit_identical, available_levels, random_row, reference_dot, TestRng,
};
use super::types::QuantType;
use crate::error::KernelError;

const TYPES: [QuantType; 2] = [QuantType::Q4_K, QuantType::Q6_K];

fn setup(ty: QuantType, rows: usize, cols: usize, n: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut rng = TestRng(seed);
    let data = (0..rows)
        .flat_map(|_| random_row(ty, cols, &mut rng))
        .collect();
    let x = (0..n * cols).map(|_| rng.uniform(-3.0, 3.0)).collect();
    (data, x)
}

#[test]
fn quantised_activations_follow_the_definition() {
    let mut x = vec![0.0f32; 512];
    x[0] = 2.54;
    x[1] = -1.27;
    x[2] = 0.005; // 0.005 * 50 = 0.25 → 0
    x[3] = 0.01; // 0.5 → rounds away from zero to 1
    let a = Q8Activations::quantize(&x, 2, 256).unwrap();
    let deq = a.dequantize();
    let d = 2.54f32 / 127.0;
    assert_eq!(deq[0], d * 127.0);
    assert_eq!(deq[1], d * -64.0); // -1.27 * 50 = -63.5 → -64
    assert_eq!(deq[2], 0.0);
    assert_eq!(deq[3], d);
    assert!(deq[256..].iter().all(|&v| v == 0.0)); // all-zero token
    assert!(matches!(
        Q8Activations::quantize(&[0.0; 100], 1, 100),
        Err(KernelError::NotBlockAligned { .. })
    ));
    assert!(Q8Activations::quantize(&[f32::NAN; 256], 1, 256).is_err());
    assert!(Q8Activations::quantize(&[0.0; 256], 2, 256).is_err());
}

#[test]
fn matches_exact_product_on_quantised_activations() {
    // Against the f64 product of the dequantised weights with the *dequantised activations*:
    // only f32 rounding separates them (the integer core is exact).
    for ty in TYPES {
        let (rows, cols, n) = (21, 512, 3);
        let (data, x) = setup(ty, rows, cols, n, 31);
        let w = QuantMatrix::new(ty, rows, cols, &data).unwrap();
        let acts = Q8Activations::quantize(&x, n, cols).unwrap();
        let xq = acts.dequantize();
        let mut out = vec![0.0; n * rows];
        quant_matmul_int8(&w, &acts, &mut out).unwrap();
        for r in 0..rows {
            let wr = dequantize_row_to_vec(ty, w.row(r), cols).unwrap();
            for t in 0..n {
                let xt = &xq[t * cols..(t + 1) * cols];
                let (exact, scale) = reference_dot(&wr, xt);
                let got = out[t * rows + r] as f64;
                // per super-block a few f32 roundings of values up to the block's Σ|w·x| (plus
                // the min term for Q4_K): 1e-5 relative to the total magnitude is ample.
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
        let (rows, cols, n) = (9, 768, 2);
        let (data, x) = setup(ty, rows, cols, n, 32);
        let w = QuantMatrix::new(ty, rows, cols, &data).unwrap();
        let acts = Q8Activations::quantize(&x, n, cols).unwrap();
        let mut fast = vec![0.0; n * rows];
        quant_matmul_int8(&w, &acts, &mut fast).unwrap();
        let mut exact = vec![0.0; n * rows];
        super::quant_matmul(&w, &x, n, &mut exact).unwrap();
        for r in 0..rows {
            let wr = dequantize_row_to_vec(ty, w.row(r), cols).unwrap();
            for t in 0..n {
                let xt = &x[t * cols..(t + 1) * cols];
                let mut bound = 0.0f64;
                for (wb, xb) in wr.chunks(256).zip(xt.chunks(256)) {
                    let d = xb.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
                    bound += d / 2.0 * wb.iter().map(|v| v.abs() as f64).sum::<f64>();
                }
                let scale: f64 = wr
                    .iter()
                    .zip(xt)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                let diff = (fast[t * rows + r] as f64 - exact[t * rows + r] as f64).abs();
                assert!(
                    diff <= bound * 1.01 + 1e-5 * scale,
                    "{ty}: {diff} > {bound}"
                );
            }
        }
    }
}

#[test]
fn scalar_and_simd_are_bit_identical_and_batch_invariant() {
    let levels = available_levels();
    for ty in TYPES {
        let (rows, cols) = (18, 512);
        let (data, x) = setup(ty, rows, cols, 16, 33);
        let w = QuantMatrix::new(ty, rows, cols, &data).unwrap();
        let alone: Vec<Vec<f32>> = (0..16)
            .map(|t| {
                let a = Q8Activations::quantize(&x[t * cols..(t + 1) * cols], 1, cols).unwrap();
                let mut o = vec![0.0; rows];
                quant_matmul_int8_with(&w, &a, &mut o, SimdLevel::Portable).unwrap();
                o
            })
            .collect();
        for n in 1..=16 {
            let a = Q8Activations::quantize(&x[..n * cols], n, cols).unwrap();
            for &level in &levels {
                let mut out = vec![0.0; n * rows];
                quant_matmul_int8_with(&w, &a, &mut out, level).unwrap();
                let what = format!("{ty} {level:?} in a batch of {n} vs alone/portable");
                assert_rows_bit_identical(&out, &alone, rows, &what);
            }
        }
    }
}

#[test]
fn unsupported_types_and_shapes_are_refused() {
    assert!(int8_supported(QuantType::Q4_K) && !int8_supported(QuantType::Q8_0));
    let data = vec![0u8; 34 * 8];
    let w = QuantMatrix::new(QuantType::Q8_0, 1, 256, &data).unwrap();
    let a = Q8Activations::quantize(&[0.0; 256], 1, 256).unwrap();
    let err = quant_matmul_int8(&w, &a, &mut [0.0; 1]).unwrap_err();
    assert!(err.to_string().contains("Q8_0"), "{err}");
    let data = vec![0u8; 144 * 2];
    let w = QuantMatrix::new(QuantType::Q4_K, 1, 512, &data).unwrap();
    assert!(quant_matmul_int8(&w, &a, &mut [0.0; 1]).is_err());
}
