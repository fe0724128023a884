//! Tests of the row-interleaved 8-bit product: bit-identical to the GGUF-layout product on
//! every level (so batch-invariant as well), at odd row counts, with extreme quants, and clear
//! errors for what it cannot take.

use super::int8::{quant_matmul_int8_with, Q8Activations};
use super::int8_packed::{
    quant_matmul_int8_packed, quant_matmul_int8_packed_many, quant_matmul_int8_packed_with,
    Int8PackedMatrix, PackedProduct,
};
use super::matmul::{QuantMatrix, SimdLevel};
use super::testutil::{
    assert_rows_bit_identical, available_levels, f16_bytes, random_row, TestRng,
};
use super::types::QuantType;
use crate::error::KernelError;

const TYPES: [QuantType; 2] = [QuantType::Q4_K, QuantType::Q6_K];

/// Each token alone through the portable GGUF-layout kernel: the reference rows.
fn reference(w: &QuantMatrix<'_>, x: &[f32], n: usize) -> Vec<Vec<f32>> {
    let cols = w.cols();
    (0..n)
        .map(|t| {
            let a = Q8Activations::quantize(&x[t * cols..(t + 1) * cols], 1, cols).unwrap();
            let mut out = vec![0.0; w.rows()];
            quant_matmul_int8_with(w, &a, &mut out, SimdLevel::Portable).unwrap();
            out
        })
        .collect()
}

/// Packed on every available level, batches of 1..=n, against the reference.
fn check_packed(ty: QuantType, data: &[u8], rows: usize, cols: usize, x: &[f32], n: usize) {
    let w = QuantMatrix::new(ty, rows, cols, data).unwrap();
    let packed = Int8PackedMatrix::pack(&w).unwrap();
    let alone = reference(&w, x, n);
    for batch in 1..=n {
        let a = Q8Activations::quantize(&x[..batch * cols], batch, cols).unwrap();
        for &level in &available_levels() {
            let mut out = vec![f32::NAN; batch * rows];
            quant_matmul_int8_packed_with(&packed, &a, &mut out, level).unwrap();
            let what = format!("{ty} [{rows} x {cols}] packed {level:?}, batch {batch}");
            assert_rows_bit_identical(&out, &alone, rows, &what);
        }
    }
}

#[test]
fn packed_product_is_bit_identical_to_the_gguf_layout_product() {
    let mut rng = TestRng(51);
    for ty in TYPES {
        for (rows, cols) in [(16, 256), (1, 512), (37, 768), (48, 256)] {
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
    // Every quant, scale and min at its largest (all bits set), activations at ±127: the
    // integer bounds of the module docs, reached.
    let (rows, cols, n) = (17, 512, 3);
    for ty in TYPES {
        let mut row = vec![0xFFu8; ty.row_bytes(cols).unwrap()];
        for block in row.chunks_exact_mut(ty.block_bytes()) {
            let at = if ty == QuantType::Q4_K { 0 } else { 208 };
            block[at..at + 2].copy_from_slice(&f16_bytes(0.01));
            if ty == QuantType::Q4_K {
                block[2..4].copy_from_slice(&f16_bytes(0.02));
            }
        }
        let data: Vec<u8> = (0..rows).flat_map(|_| row.clone()).collect();
        let x: Vec<f32> = (0..n * cols)
            .map(|i| if (i / 7) % 2 == 0 { 5.0 } else { -5.0 })
            .collect();
        check_packed(ty, &data, rows, cols, &x, n);
        // and the value itself: every output equal (identical rows), finite
        let w = QuantMatrix::new(ty, rows, cols, &data).unwrap();
        let packed = Int8PackedMatrix::pack(&w).unwrap();
        let a = Q8Activations::quantize(&x[..cols], 1, cols).unwrap();
        let mut out = vec![0.0; rows];
        quant_matmul_int8_packed(&packed, &a, &mut out).unwrap();
        assert!(out
            .iter()
            .all(|v| v.is_finite() && v.to_bits() == out[0].to_bits()));
    }
}

#[test]
fn packing_refuses_other_types_and_products_check_shapes() {
    let data = vec![0u8; 176];
    let w = QuantMatrix::new(QuantType::Q5_K, 1, 256, &data).unwrap();
    let err = Int8PackedMatrix::pack(&w).unwrap_err();
    assert!(
        matches!(err, KernelError::UnsupportedQuantType { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("Q5_K"), "{err}");
    // a packed 32-element type is not a k-quant
    let q8 = vec![0u8; 34 * 8];
    let packed = Int8PackedMatrix::pack(&QuantMatrix::new(QuantType::Q8_0, 1, 256, &q8).unwrap());
    let acts = Q8Activations::quantize(&[0.0; 256], 1, 256).unwrap();
    let err = quant_matmul_int8_packed(&packed.unwrap(), &acts, &mut [0.0; 1]).unwrap_err();
    assert!(err.to_string().contains("Q8_0"), "{err}");

    let data = vec![0u8; 144 * 2];
    let w = QuantMatrix::new(QuantType::Q4_K, 1, 512, &data).unwrap();
    let packed = Int8PackedMatrix::pack(&w).unwrap();
    assert_eq!((packed.rows(), packed.cols()), (1, 512));
    let narrow = Q8Activations::quantize(&[0.0; 256], 1, 256).unwrap();
    let err = quant_matmul_int8_packed(&packed, &narrow, &mut [0.0; 1]).unwrap_err();
    assert!(matches!(err, KernelError::ShapeMismatch { .. }), "{err}");
    let wide = Q8Activations::quantize(&[0.0; 512], 1, 512).unwrap();
    let err = quant_matmul_int8_packed(&packed, &wide, &mut [0.0; 2]).unwrap_err();
    assert!(matches!(err, KernelError::ShapeMismatch { .. }), "{err}");
}

/// A fused call ([`quant_matmul_int8_packed_many`]) of both k-quant types at different row
/// counts gives each output bit for bit as its own call; a 32-element type in the list refuses
/// the whole call.
#[test]
fn fused_products_equal_separate_products() {
    let mut rng = TestRng(71);
    let cols = 512;
    let shapes = [
        (QuantType::Q4_K, 21),
        (QuantType::Q6_K, 32),
        (QuantType::Q4_K, 3),
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
    for n in [1, 4, 6] {
        let x: Vec<f32> = (0..n * cols).map(|_| rng.uniform(-3.0, 3.0)).collect();
        let a = Q8Activations::quantize(&x, n, cols).unwrap();
        let mut fused: Vec<Vec<f32>> = mats.iter().map(|w| vec![f32::NAN; n * w.rows()]).collect();
        let mut products: Vec<PackedProduct<'_>> = mats
            .iter()
            .zip(fused.iter_mut())
            .map(|(w, out)| PackedProduct { w, out })
            .collect();
        quant_matmul_int8_packed_many(&mut products, &a).unwrap();
        for (w, got) in mats.iter().zip(&fused) {
            let mut want = vec![0.0; n * w.rows()];
            quant_matmul_int8_packed(w, &a, &mut want).unwrap();
            let same = got
                .iter()
                .zip(&want)
                .all(|(g, w)| g.to_bits() == w.to_bits());
            assert!(same, "{} [{} rows], {n} tokens", w.quant_type(), w.rows());
        }
    }
    let data: Vec<u8> = random_row(QuantType::Q8_0, cols, &mut rng);
    let q8 = Int8PackedMatrix::pack(&QuantMatrix::new(QuantType::Q8_0, 1, cols, &data).unwrap())
        .unwrap();
    let a = Q8Activations::quantize(&vec![1.0; cols], 1, cols).unwrap();
    let (mut good, mut other) = (vec![0.0; mats[0].rows()], vec![0.0; 1]);
    let err = quant_matmul_int8_packed_many(
        &mut [
            PackedProduct {
                w: &mats[0],
                out: &mut good,
            },
            PackedProduct {
                w: &q8,
                out: &mut other,
            },
        ],
        &a,
    )
    .unwrap_err();
    assert!(
        matches!(err, KernelError::UnsupportedQuantType { .. }),
        "{err}"
    );
}
