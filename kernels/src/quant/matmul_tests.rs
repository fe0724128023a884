//! Tests of the quantised matrix product: against a dequantise-then-f64 reference, batch
//! invariance (bit-exact), SIMD-level invariance (bit-exact) and shape errors.

use super::dequant::dequantize_row_to_vec;
use super::matmul::{quant_matmul, quant_matmul_with, QuantMatrix};
use super::testutil::{
    assert_rows_bit_identical, available_levels, random_row, reference_dot, TestRng,
};
use super::types::QuantType;
use crate::error::KernelError;

/// A column count valid for `ty` that exercises a partial 256-chunk where possible.
fn cols_for(ty: QuantType) -> usize {
    match ty.block_len() {
        1 => 300,  // not a multiple of 16 either: lane tail
        32 => 576, // SmolLM2 hidden size: 2.25 chunks
        _ => 512,
    }
}

fn random_matrix(ty: QuantType, rows: usize, cols: usize, rng: &mut TestRng) -> Vec<u8> {
    (0..rows).flat_map(|_| random_row(ty, cols, rng)).collect()
}

fn random_acts(n: usize, rng: &mut TestRng) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(-2.0, 2.0)).collect()
}

#[test]
fn matches_dequantised_f64_reference() {
    let mut rng = TestRng(10);
    for ty in QuantType::ALL {
        let (rows, cols, n_tokens) = (37, cols_for(ty), 5);
        let data = random_matrix(ty, rows, cols, &mut rng);
        let w = QuantMatrix::new(ty, rows, cols, &data).unwrap();
        let x = random_acts(n_tokens * cols, &mut rng);
        let mut out = vec![0.0; n_tokens * rows];
        quant_matmul(&w, &x, n_tokens, &mut out).unwrap();
        for r in 0..rows {
            let wr = dequantize_row_to_vec(ty, w.row(r), cols).unwrap();
            for t in 0..n_tokens {
                let xt = &x[t * cols..(t + 1) * cols];
                let (exact, scale) = reference_dot(&wr, xt);
                let got = out[t * rows + r] as f64;
                // f32 accumulation of `cols` products: error ≤ ~cols/16 · ε · Σ|w·x| (lanes);
                // we allow 4·cols·ε relative to Σ|w·x|, far below any layout error.
                let tol = 4.0 * cols as f64 * f32::EPSILON as f64 * scale + 1e-30;
                assert!(
                    (got - exact).abs() <= tol,
                    "{ty} row {r} token {t}: got {got}, want {exact} (tol {tol})"
                );
            }
        }
    }
}

#[test]
fn a_token_is_bit_identical_alone_and_in_any_batch() {
    let mut rng = TestRng(11);
    for ty in [
        QuantType::Q4_K,
        QuantType::Q6_K,
        QuantType::Q8_0,
        QuantType::F16,
    ] {
        let (rows, cols) = (19, cols_for(ty));
        let data = random_matrix(ty, rows, cols, &mut rng);
        let w = QuantMatrix::new(ty, rows, cols, &data).unwrap();
        let batch = random_acts(16 * cols, &mut rng);
        // every token alone
        let alone: Vec<Vec<f32>> = (0..16)
            .map(|t| {
                let mut o = vec![0.0; rows];
                quant_matmul(&w, &batch[t * cols..(t + 1) * cols], 1, &mut o).unwrap();
                o
            })
            .collect();
        for n in 2..=16 {
            let mut out = vec![0.0; n * rows];
            quant_matmul(&w, &batch[..n * cols], n, &mut out).unwrap();
            assert_rows_bit_identical(&out, &alone, rows, &format!("{ty} in a batch of {n}"));
        }
    }
}

#[test]
fn every_simd_level_is_bit_identical() {
    let mut rng = TestRng(12);
    let levels = available_levels();
    for ty in QuantType::ALL {
        let (rows, cols, n) = (17, cols_for(ty), 6);
        let data = random_matrix(ty, rows, cols, &mut rng);
        let w = QuantMatrix::new(ty, rows, cols, &data).unwrap();
        let x = random_acts(n * cols, &mut rng);
        let mut first: Option<Vec<f32>> = None;
        for &level in &levels {
            let mut out = vec![0.0; n * rows];
            quant_matmul_with(&w, &x, n, &mut out, level).unwrap();
            match &first {
                None => first = Some(out),
                Some(f) => assert!(
                    f.iter().zip(&out).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty}: {level:?} differs from {:?}",
                    levels[0]
                ),
            }
        }
    }
}

#[test]
fn row_range_is_the_same_rows() {
    let mut rng = TestRng(13);
    let (ty, rows, cols) = (QuantType::Q5_K, 40, 256);
    let data = random_matrix(ty, rows, cols, &mut rng);
    let w = QuantMatrix::new(ty, rows, cols, &data).unwrap();
    let x = random_acts(3 * cols, &mut rng);
    let mut full = vec![0.0; 3 * rows];
    quant_matmul(&w, &x, 3, &mut full).unwrap();
    let part = w.row_range(10, 33).unwrap();
    let mut out = vec![0.0; 3 * 23];
    quant_matmul(&part, &x, 3, &mut out).unwrap();
    for t in 0..3 {
        assert_eq!(
            out[t * 23..(t + 1) * 23],
            full[t * rows + 10..t * rows + 33]
        );
    }
    assert!(w.row_range(5, 41).is_err());
}

#[test]
fn shape_errors_are_clear() {
    let data = vec![0u8; 2 * 144];
    assert!(matches!(
        QuantMatrix::new(QuantType::Q4_K, 3, 256, &data),
        Err(KernelError::ShapeMismatch {
            expected: 432,
            actual: 288,
            ..
        })
    ));
    assert!(matches!(
        QuantMatrix::new(QuantType::Q4_K, 2, 100, &data),
        Err(KernelError::NotBlockAligned { .. })
    ));
    let w = QuantMatrix::new(QuantType::Q4_K, 2, 256, &data).unwrap();
    let mut out = vec![0.0; 2];
    let err = quant_matmul(&w, &[0.0; 255], 1, &mut out).unwrap_err();
    assert!(err.to_string().contains("activations"), "{err}");
    let err = quant_matmul(&w, &[0.0; 256], 1, &mut [0.0; 3]).unwrap_err();
    assert!(err.to_string().contains("output"), "{err}");
}
