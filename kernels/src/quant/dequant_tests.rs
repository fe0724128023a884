//! Dequantisation tests against blocks built by hand from the format definitions.

use super::dequant::{dequantize_row, dequantize_row_to_vec};
use super::testutil::{f16_bytes, pack_q4_k, pack_q5_k, pack_q6_k, TestRng};
use super::types::QuantType;
use crate::error::KernelError;

#[test]
fn float_rows() {
    let mut b = Vec::new();
    for v in [1.5f32, -0.25, 3.0e-5] {
        b.extend(v.to_le_bytes());
    }
    assert_eq!(
        dequantize_row_to_vec(QuantType::F32, &b, 3).unwrap(),
        vec![1.5, -0.25, 3.0e-5]
    );
    let f16 = [0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00]; // 1, -2, 2^-24
    assert_eq!(
        dequantize_row_to_vec(QuantType::F16, &f16, 3).unwrap(),
        vec![1.0, -2.0, 2f32.powi(-24)]
    );
    let bf16 = [0x80, 0x3f, 0x40, 0xc0]; // 1, -3
    assert_eq!(
        dequantize_row_to_vec(QuantType::BF16, &bf16, 2).unwrap(),
        vec![1.0, -3.0]
    );
}

#[test]
fn q8_0_block() {
    let mut b = f16_bytes(0.5).to_vec();
    let qs: Vec<i8> = (0..32).map(|i| (i as i8 - 16) * 8).collect();
    b.extend(qs.iter().map(|&q| q as u8));
    b[2] = 0x80; // -128
    b[3] = 0x7f; // 127
    let out = dequantize_row_to_vec(QuantType::Q8_0, &b, 32).unwrap();
    assert_eq!(out[0], -64.0);
    assert_eq!(out[1], 63.5);
    assert_eq!(out[16], 0.0);
    assert_eq!(out[31], 60.0); // q = 15 * 8 = 120
}

#[test]
fn q4_0_block() {
    let mut b = f16_bytes(2.0).to_vec();
    // byte i: low nibble i (element i), high nibble 15 - i (element i + 16)
    b.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
    let out = dequantize_row_to_vec(QuantType::Q4_0, &b, 32).unwrap();
    for i in 0..16 {
        assert_eq!(out[i], 2.0 * (i as f32 - 8.0));
        assert_eq!(out[i + 16], 2.0 * (7.0 - i as f32));
    }
}

#[test]
fn q4_1_block() {
    let mut b = f16_bytes(0.25).to_vec();
    b.extend(f16_bytes(-1.0));
    b.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
    let out = dequantize_row_to_vec(QuantType::Q4_1, &b, 32).unwrap();
    assert_eq!(out[0], -1.0);
    assert_eq!(out[15], 2.75);
    assert_eq!(out[16], 2.75);
    assert_eq!(out[31], -1.0);
    assert_eq!(out[5], 0.25);
}

#[test]
fn q5_0_block() {
    let mut b = f16_bytes(1.0).to_vec();
    // high bits set for elements 0, 3 and 16 + 1 = 17, 31
    let qh: u32 = 1 | (1 << 3) | (1 << 17) | (1 << 31);
    b.extend(qh.to_le_bytes());
    b.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
    let out = dequantize_row_to_vec(QuantType::Q5_0, &b, 32).unwrap();
    assert_eq!(out[0], 0.0); // (0 | 16) - 16
    assert_eq!(out[1], -15.0); // 1 - 16
    assert_eq!(out[3], 3.0); // (3 | 16) - 16
    assert_eq!(out[16], -1.0); // 15 - 16
    assert_eq!(out[17], 14.0); // (14 | 16) - 16
    assert_eq!(out[31], 0.0); // (0 | 16) - 16
    assert_eq!(out[30], -15.0); // 1 - 16
}

fn k_params(rng: &mut TestRng) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        sc[j] = rng.below(64) as u8;
        m[j] = rng.below(64) as u8;
    }
    // make sure both 6-bit halves of the packing are exercised
    sc[7] = 63;
    m[6] = 62;
    (sc, m)
}

#[test]
fn q4_k_block_hand_values() {
    // d = 1, dmin = 0.5; sub-block 0: sc = 2, m = 3; sub-block 5: sc = 37, m = 50
    let mut sc = [1u8; 8];
    let mut m = [0u8; 8];
    sc[0] = 2;
    m[0] = 3;
    sc[5] = 37;
    m[5] = 50;
    let q: Vec<u8> = (0..256).map(|e| (e % 16) as u8).collect();
    let b = pack_q4_k(1.0, 0.5, &sc, &m, &q);
    assert_eq!(b.len(), 144);
    let out = dequantize_row_to_vec(QuantType::Q4_K, &b, 256).unwrap();
    assert_eq!(out[0], -1.5); // 2 * 0 - 0.5 * 3
    assert_eq!(out[7], 12.5); // 2 * 7 - 1.5
                              // element 160 + 9 is in sub-block 5 (elements 160..192), q = 169 % 16 = 9
    assert_eq!(out[169], 37.0 * 9.0 - 25.0);
}

#[test]
fn q4_k_block_matches_definition() {
    let mut rng = TestRng(1);
    let (sc, m) = k_params(&mut rng);
    let q: Vec<u8> = (0..256).map(|_| rng.below(16) as u8).collect();
    let (d, dmin) = (0.0123f32, 0.00456f32);
    let b = pack_q4_k(d, dmin, &sc, &m, &q);
    let (d, dmin) = (
        super::float16::f16_to_f32(super::float16::f32_to_f16(d)),
        super::float16::f16_to_f32(super::float16::f32_to_f16(dmin)),
    );
    let out = dequantize_row_to_vec(QuantType::Q4_K, &b, 256).unwrap();
    for e in 0..256 {
        let j = e / 32;
        let want = d * f32::from(sc[j]) * f32::from(q[e]) - dmin * f32::from(m[j]);
        assert_eq!(out[e], want, "element {e}");
    }
}

#[test]
fn q5_k_block_matches_definition() {
    let mut rng = TestRng(2);
    let (sc, m) = k_params(&mut rng);
    let q: Vec<u8> = (0..256).map(|_| rng.below(32) as u8).collect();
    let b = pack_q5_k(0.5, 0.25, &sc, &m, &q);
    assert_eq!(b.len(), 176);
    let out = dequantize_row_to_vec(QuantType::Q5_K, &b, 256).unwrap();
    for e in 0..256 {
        let j = e / 32;
        let want = 0.5 * f32::from(sc[j]) * f32::from(q[e]) - 0.25 * f32::from(m[j]);
        assert_eq!(out[e], want, "element {e}");
    }
    // hand check: qh bit for element 64 * 2 + 32 + 3 = 163 is bit 5 of qh[3]
    let mut b2 = pack_q5_k(1.0, 0.0, &[1; 8], &[0; 8], &[0; 256]);
    b2[16 + 3] |= 1 << 5;
    let out2 = dequantize_row_to_vec(QuantType::Q5_K, &b2, 256).unwrap();
    let nonzero: Vec<usize> = (0..256).filter(|&e| out2[e] != 0.0).collect();
    assert_eq!(nonzero, vec![163]);
    assert_eq!(out2[163], 16.0);
}

#[test]
fn q6_k_block_matches_definition() {
    let mut rng = TestRng(3);
    let q: Vec<u8> = (0..256).map(|_| rng.below(64) as u8).collect();
    let mut scales = [0i8; 16];
    for s in scales.iter_mut() {
        *s = (rng.below(256) as u8) as i8;
    }
    scales[3] = -128;
    let b = pack_q6_k(0.125, &scales, &q);
    assert_eq!(b.len(), 210);
    let out = dequantize_row_to_vec(QuantType::Q6_K, &b, 256).unwrap();
    for e in 0..256 {
        let want = 0.125 * f32::from(scales[e / 16]) * (f32::from(q[e]) - 32.0);
        assert_eq!(out[e], want, "element {e}");
    }
    // hand check: element 128 + 64 + 1 = 193 is the high nibble of ql[64 + 1] with bits 4-5
    // of qh[32 + 1], scale 8 + 4 + 0 = scales[12]
    let mut b2 = vec![0u8; 210];
    b2[65] = 0x70; // high nibble 7
    b2[128 + 33] = 0b0010_0000; // bits 4-5 = 2
    b2[192 + 12] = 3;
    b2[208..210].copy_from_slice(&f16_bytes(1.0));
    let out2 = dequantize_row_to_vec(QuantType::Q6_K, &b2, 256).unwrap();
    assert_eq!(out2[193], 3.0 * f32::from((7u8 | (2 << 4)) as i8 - 32));
    assert_eq!(out2[192], -96.0); // same scale, q = 0 - 32
    assert_eq!(out2[176], 0.0); // scales[11] = 0
    assert_eq!(out2[0], 0.0);
}

#[test]
fn multi_block_rows_decode_block_by_block() {
    let mut rng = TestRng(4);
    for ty in QuantType::ALL {
        let n = 2 * 256;
        let row = super::testutil::random_row(ty, n, &mut rng);
        let whole = dequantize_row_to_vec(ty, &row, n).unwrap();
        let half_bytes = ty.row_bytes(256).unwrap();
        let first = dequantize_row_to_vec(ty, &row[..half_bytes], 256).unwrap();
        let second = dequantize_row_to_vec(ty, &row[half_bytes..], 256).unwrap();
        assert_eq!(whole[..256], first[..], "{ty}");
        assert_eq!(whole[256..], second[..], "{ty}");
        assert!(whole.iter().all(|v| v.is_finite()), "{ty}");
    }
}

#[test]
fn bad_lengths_are_refused() {
    let mut out = vec![0.0; 40];
    assert!(matches!(
        dequantize_row(QuantType::Q8_0, &[0; 34], &mut out),
        Err(KernelError::NotBlockAligned { .. })
    ));
    let mut out = vec![0.0; 32];
    let err = dequantize_row(QuantType::Q8_0, &[0; 33], &mut out).unwrap_err();
    assert!(matches!(
        err,
        KernelError::ShapeMismatch {
            expected: 34,
            actual: 33,
            ..
        }
    ));
}

#[test]
fn block_format_constants_match_quant_type() {
    for ty in QuantType::ALL {
        let (len, bytes) = super::dequant::with_block_format!(ty, F => (<F as super::dequant::BlockFormat>::LEN, <F as super::dequant::BlockFormat>::BYTES));
        assert_eq!((len, bytes), (ty.block_len(), ty.block_bytes()), "{ty}");
    }
}
