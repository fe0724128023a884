//! Tests of the 32-element types over 16-row tiles: bit-identical to the GGUF-layout product on
//! every level (so batch-invariant as well), at odd row and block counts, with extreme quants,
//! and clear errors for what the products cannot take.

use super::int8_packed::{Int8PackedMatrix, PackedProduct};
use super::int8_packed_q32::{
    quant_matmul_q32_packed, quant_matmul_q32_packed_many, quant_matmul_q32_packed_with,
};
use super::int8_q32::{quant_matmul_q32_with, Q8Blocks32};
use super::matmul::{QuantMatrix, SimdLevel};
use super::testutil::{
    assert_rows_bit_identical, available_levels, f16_bytes, random_row, TestRng,
};
use super::types::QuantType;
use crate::error::KernelError;

const TYPES: [QuantType; 4] = [
    QuantType::Q8_0,
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
];

/// Packed on every available level, batches of 1..=n, against each token alone through the
/// portable GGUF-layout kernel.
fn check_packed(ty: QuantType, data: &[u8], rows: usize, cols: usize, x: &[f32], n: usize) {
    let w = QuantMatrix::new(ty, rows, cols, data).unwrap();
    let packed = Int8PackedMatrix::pack(&w).unwrap();
    assert_eq!(packed.quant_type(), ty);
    let alone: Vec<Vec<f32>> = (0..n)
        .map(|t| {
            let a = Q8Blocks32::quantize(&x[t * cols..(t + 1) * cols], 1, cols).unwrap();
            let mut out = vec![0.0; rows];
            quant_matmul_q32_with(&w, &a, &mut out, SimdLevel::Portable).unwrap();
            out
        })
        .collect();
    for batch in 1..=n {
        let a = Q8Blocks32::quantize(&x[..batch * cols], batch, cols).unwrap();
        for &level in &available_levels() {
            let mut out = vec![f32::NAN; batch * rows];
            quant_matmul_q32_packed_with(&packed, &a, &mut out, level).unwrap();
            let what = format!("{ty} [{rows} x {cols}] packed {level:?}, batch {batch}");
            assert_rows_bit_identical(&out, &alone, rows, &what);
        }
    }
}

#[test]
fn packed_product_is_bit_identical_to_the_gguf_layout_product() {
    let mut rng = TestRng(61);
    for ty in TYPES {
        // one block, an odd count (half a tile-block left over), a multiple of eight, the
        // Qwen 0.5B width (28 blocks); 1, 16, 37 (padding) and 48 rows
        for (rows, cols) in [(16, 32), (1, 96), (37, 256), (48, 896), (5, 160)] {
            let data: Vec<u8> = (0..rows)
                .flat_map(|_| random_row(ty, cols, &mut rng))
                .collect();
            let n = 11; // every group size of up to 8 tokens, and 8 + 3
            let x: Vec<f32> = (0..n * cols).map(|_| rng.uniform(-3.0, 3.0)).collect();
            check_packed(ty, &data, rows, cols, &x, n);
        }
    }
}

#[test]
fn extreme_quants_and_scales_stay_exact() {
    // Every quant at an end of its range (Q8_0: −128 and 127 alternating, the others all bits
    // set), activations at ±127: the integer bounds of `int8_q32`, reached.
    let (rows, cols, n) = (17, 96, 4);
    for ty in TYPES {
        let mut row = vec![0xFFu8; ty.row_bytes(cols).unwrap()];
        for block in row.chunks_exact_mut(ty.block_bytes()) {
            block[0..2].copy_from_slice(&f16_bytes(0.01));
            if ty == QuantType::Q4_1 {
                block[2..4].copy_from_slice(&f16_bytes(-0.02));
            }
            if ty == QuantType::Q8_0 {
                for (k, q) in block[2..].iter_mut().enumerate() {
                    *q = if k % 2 == 0 { 0x80 } else { 0x7F };
                }
            }
        }
        let data: Vec<u8> = (0..rows).flat_map(|_| row.clone()).collect();
        let x: Vec<f32> = (0..n * cols)
            .map(|i| if (i / 3) % 2 == 0 { 5.0 } else { -5.0 })
            .collect();
        check_packed(ty, &data, rows, cols, &x, n);
        let w = QuantMatrix::new(ty, rows, cols, &data).unwrap();
        let packed = Int8PackedMatrix::pack(&w).unwrap();
        let a = Q8Blocks32::quantize(&x[..cols], 1, cols).unwrap();
        let mut out = vec![0.0; rows];
        quant_matmul_q32_packed(&packed, &a, &mut out).unwrap();
        assert!(out
            .iter()
            .all(|v| v.is_finite() && v.to_bits() == out[0].to_bits()));
    }
}

#[test]
fn products_refuse_the_other_family_and_wrong_shapes() {
    let data = vec![0u8; 144];
    let k = Int8PackedMatrix::pack(&QuantMatrix::new(QuantType::Q4_K, 1, 256, &data).unwrap());
    let acts = Q8Blocks32::quantize(&[0.0; 256], 1, 256).unwrap();
    let err = quant_matmul_q32_packed(&k.unwrap(), &acts, &mut [0.0; 1]).unwrap_err();
    assert!(
        matches!(err, KernelError::UnsupportedQuantType { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("Q4_K"), "{err}");

    let data = vec![0u8; 22 * 3];
    let w = QuantMatrix::new(QuantType::Q5_0, 1, 96, &data).unwrap();
    let packed = Int8PackedMatrix::pack(&w).unwrap();
    let narrow = Q8Blocks32::quantize(&[0.0; 64], 1, 64).unwrap();
    let err = quant_matmul_q32_packed(&packed, &narrow, &mut [0.0; 1]).unwrap_err();
    assert!(matches!(err, KernelError::ShapeMismatch { .. }), "{err}");
    let acts = Q8Blocks32::quantize(&[0.0; 96], 1, 96).unwrap();
    let err = quant_matmul_q32_packed(&packed, &acts, &mut [0.0; 2]).unwrap_err();
    assert!(matches!(err, KernelError::ShapeMismatch { .. }), "{err}");
}

/// A fused call ([`quant_matmul_q32_packed_many`]) of matrices of different types and row
/// counts (a partial last tile included) gives each output bit for bit as its own call; an
/// output of the wrong length anywhere in the list refuses the whole call.
#[test]
fn fused_products_equal_separate_products() {
    let mut rng = TestRng(67);
    let cols = 160;
    let shapes = [
        (QuantType::Q8_0, 37),
        (QuantType::Q4_1, 16),
        (QuantType::Q5_0, 5),
    ];
    let mats: Vec<Int8PackedMatrix> = shapes
        .iter()
        .map(|&(ty, rows)| {
            let data: Vec<u8> = (0..rows)
                .flat_map(|_| random_row(ty, cols, &mut rng))
                .collect();
            Int8PackedMatrix::pack(&QuantMatrix::new(ty, rows, cols, &data).unwrap()).unwrap()
        })
        .collect();
    for n in [1, 4, 7] {
        let x: Vec<f32> = (0..n * cols).map(|_| rng.uniform(-3.0, 3.0)).collect();
        let a = Q8Blocks32::quantize(&x, n, cols).unwrap();
        let mut fused: Vec<Vec<f32>> = mats.iter().map(|w| vec![f32::NAN; n * w.rows()]).collect();
        let mut products: Vec<PackedProduct<'_>> = mats
            .iter()
            .zip(fused.iter_mut())
            .map(|(w, out)| PackedProduct { w, out })
            .collect();
        quant_matmul_q32_packed_many(&mut products, &a).unwrap();
        for (w, got) in mats.iter().zip(&fused) {
            let mut want = vec![0.0; n * w.rows()];
            quant_matmul_q32_packed(w, &a, &mut want).unwrap();
            let same = got
                .iter()
                .zip(&want)
                .all(|(g, w)| g.to_bits() == w.to_bits());
            assert!(same, "{} [{} rows], {n} tokens", w.quant_type(), w.rows());
        }
    }
    let a = Q8Blocks32::quantize(&vec![1.0; cols], 1, cols).unwrap();
    let (mut good, mut short) = (vec![0.0; mats[0].rows()], vec![0.0; mats[1].rows() - 1]);
    let err = quant_matmul_q32_packed_many(
        &mut [
            PackedProduct {
                w: &mats[0],
                out: &mut good,
            },
            PackedProduct {
                w: &mats[1],
                out: &mut short,
            },
        ],
        &a,
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::ShapeMismatch { .. }), "{err}");
}
