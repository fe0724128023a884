//! Dequantisation of GGML blocks to `f32`, one function per block format.
//!
//! The formulas follow the layouts documented on [`QuantType`]; the order of the f32 operations
//! is part of the contract (the CUDA port must match it to be bit-identical):
//! - Q8_0, Q4_0, Q5_0: `d * q` (one rounding);
//! - Q4_1: `d * q + m`;
//! - Q4_K, Q5_K: `(d * sc) * q - (dmin * m)`, the two products in parentheses rounded first;
//! - Q6_K: `(d * sc) * q`.

use super::float16::{bf16_to_f32, f16_to_f32};
use super::types::QuantType;
use crate::error::{KernelError, Result};

/// Reads a little-endian `u16` at `at`.
#[inline(always)]
fn le_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

/// Reads the f16 at `at` as `f32`.
#[inline(always)]
pub(crate) fn le_f16(bytes: &[u8], at: usize) -> f32 {
    f16_to_f32(le_u16(bytes, at))
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K super-block, from its
/// 12 packed `scales` bytes (see [`QuantType`]).
#[inline(always)]
pub(crate) fn k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q8_0: 34 bytes → 32 values.
#[inline(always)]
pub(crate) fn block_q8_0(b: &[u8], out: &mut [f32]) {
    let d = le_f16(b, 0);
    for (o, &q) in out[..32].iter_mut().zip(&b[2..34]) {
        *o = d * f32::from(q as i8);
    }
}

/// Q4_0: 18 bytes → 32 values.
#[inline(always)]
pub(crate) fn block_q4_0(b: &[u8], out: &mut [f32]) {
    let d = le_f16(b, 0);
    let qs = &b[2..18];
    let (lo, hi) = out[..32].split_at_mut(16);
    for i in 0..16 {
        lo[i] = d * f32::from((qs[i] & 15) as i8 - 8);
        hi[i] = d * f32::from((qs[i] >> 4) as i8 - 8);
    }
}

/// Q4_1: 20 bytes → 32 values.
#[inline(always)]
pub(crate) fn block_q4_1(b: &[u8], out: &mut [f32]) {
    let d = le_f16(b, 0);
    let m = le_f16(b, 2);
    let qs = &b[4..20];
    let (lo, hi) = out[..32].split_at_mut(16);
    for i in 0..16 {
        lo[i] = d * f32::from(qs[i] & 15) + m;
        hi[i] = d * f32::from(qs[i] >> 4) + m;
    }
}

/// Q5_0: 22 bytes → 32 values.
#[inline(always)]
pub(crate) fn block_q5_0(b: &[u8], out: &mut [f32]) {
    let d = le_f16(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    let (lo, hi) = out[..32].split_at_mut(16);
    for i in 0..16 {
        let h0 = (((qh >> i) & 1) << 4) as u8;
        let h1 = (((qh >> (i + 16)) & 1) << 4) as u8;
        lo[i] = d * f32::from(((qs[i] & 15) | h0) as i8 - 16);
        hi[i] = d * f32::from(((qs[i] >> 4) | h1) as i8 - 16);
    }
}

/// Q4_K: 144 bytes → 256 values.
#[inline(always)]
pub(crate) fn block_q4_k(b: &[u8], out: &mut [f32]) {
    block_k_4or5(&b[..16], None, &b[16..144], out);
}

/// Q5_K: 176 bytes → 256 values.
#[inline(always)]
pub(crate) fn block_q5_k(b: &[u8], out: &mut [f32]) {
    block_k_4or5(&b[..16], Some(&b[16..48]), &b[48..176], out);
}

/// The shared body of Q4_K and Q5_K: `head` = `d, dmin, scales[12]`, `qh` the fifth bits (Q5_K).
#[inline(always)]
fn block_k_4or5(head: &[u8], qh: Option<&[u8]>, qs: &[u8], out: &mut [f32]) {
    let d = le_f16(head, 0);
    let dmin = le_f16(head, 2);
    let scales = &head[4..16];
    for c in 0..4 {
        let (sc0, m0) = k_scale_min(2 * c, scales);
        let (sc1, m1) = k_scale_min(2 * c + 1, scales);
        let (d0, min0) = (d * f32::from(sc0), dmin * f32::from(m0));
        let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let q = &qs[32 * c..32 * c + 32];
        let (lo, hi) = out[64 * c..64 * c + 64].split_at_mut(32);
        for l in 0..32 {
            let (h0, h1) = match qh {
                Some(qh) => (
                    ((qh[l] >> (2 * c)) & 1) << 4,
                    ((qh[l] >> (2 * c + 1)) & 1) << 4,
                ),
                None => (0, 0),
            };
            lo[l] = d0 * f32::from((q[l] & 15) | h0) - min0;
            hi[l] = d1 * f32::from((q[l] >> 4) | h1) - min1;
        }
    }
}

/// Q6_K: 210 bytes → 256 values.
#[inline(always)]
pub(crate) fn block_q6_k(b: &[u8], out: &mut [f32]) {
    let d = le_f16(b, 208);
    for h in 0..2 {
        let ql = &b[64 * h..64 * h + 64];
        let qh = &b[128 + 32 * h..128 + 32 * h + 32];
        let sc = &b[192 + 8 * h..192 + 8 * h + 8];
        let o = &mut out[128 * h..128 * h + 128];
        for l in 0..32 {
            let s = l / 16;
            let q0 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q1 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            o[l] = d * f32::from(sc[s] as i8) * f32::from(q0);
            o[l + 32] = d * f32::from(sc[s + 2] as i8) * f32::from(q1);
            o[l + 64] = d * f32::from(sc[s + 4] as i8) * f32::from(q2);
            o[l + 96] = d * f32::from(sc[s + 6] as i8) * f32::from(q3);
        }
    }
}

/// One block format at compile time, so kernels can be monomorphised per type (the block
/// dequantiser inlines into each SIMD variant of the caller).
pub(crate) trait BlockFormat {
    /// Elements per block.
    const LEN: usize;
    /// Bytes per block.
    const BYTES: usize;
    /// Dequantises one block: `b.len() == BYTES`, `out.len() == LEN`.
    fn dequant(b: &[u8], out: &mut [f32]);
}

macro_rules! block_format {
    ($name:ident, $len:expr, $bytes:expr, $f:expr) => {
        #[doc = concat!("The ", stringify!($name), " block format.")]
        pub(crate) struct $name;
        impl BlockFormat for $name {
            const LEN: usize = $len;
            const BYTES: usize = $bytes;
            #[inline(always)]
            fn dequant(b: &[u8], out: &mut [f32]) {
                ($f)(b, out)
            }
        }
    };
}

block_format!(FmtF32, 1, 4, |b: &[u8], o: &mut [f32]| o[0] =
    f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
block_format!(FmtF16, 1, 2, |b: &[u8], o: &mut [f32]| o[0] =
    f16_to_f32(le_u16(b, 0)));
block_format!(FmtBF16, 1, 2, |b: &[u8], o: &mut [f32]| o[0] =
    bf16_to_f32(le_u16(b, 0)));
block_format!(FmtQ8_0, 32, 34, block_q8_0);
block_format!(FmtQ4_0, 32, 18, block_q4_0);
block_format!(FmtQ4_1, 32, 20, block_q4_1);
block_format!(FmtQ5_0, 32, 22, block_q5_0);
block_format!(FmtQ4K, 256, 144, block_q4_k);
block_format!(FmtQ5K, 256, 176, block_q5_k);
block_format!(FmtQ6K, 256, 210, block_q6_k);

/// Evaluates `$body` with `$F` bound to the [`BlockFormat`] type of the [`QuantType`] `$ty`.
macro_rules! with_block_format {
    ($ty:expr, $F:ident => $body:expr) => {
        $crate::quant::dequant::with_block_format!(@arms $ty, $F, $body;
            F32 FmtF32, F16 FmtF16, BF16 FmtBF16, Q8_0 FmtQ8_0, Q4_0 FmtQ4_0, Q4_1 FmtQ4_1,
            Q5_0 FmtQ5_0, Q4_K FmtQ4K, Q5_K FmtQ5K, Q6_K FmtQ6K)
    };
    (@arms $ty:expr, $F:ident, $body:expr; $($variant:ident $format:ident),*) => {{
        use $crate::quant::dequant::*;
        match $ty {
            $(QuantType::$variant => {
                type $F = $format;
                $body
            })*
        }
    }};
}
pub(crate) use with_block_format;

/// Dequantises whole blocks of format `F` without checking sizes: `bytes` holds exactly
/// `out.len() / F::LEN` blocks.
#[inline(always)]
pub(crate) fn dequantize_blocks<F: BlockFormat>(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out
        .chunks_exact_mut(F::LEN)
        .zip(bytes.chunks_exact(F::BYTES))
    {
        F::dequant(b, o);
    }
}

/// Dequantises one row: `bytes` holds a row of `out.len()` elements of type `ty`
/// (`ty.row_bytes(out.len())` bytes, whole blocks) and `out` receives the f32 values in order.
///
/// # Errors
/// [`KernelError::NotBlockAligned`] when `out.len()` is not a multiple of the block length;
/// [`KernelError::ShapeMismatch`] when `bytes` is not exactly one row long.
pub fn dequantize_row(ty: QuantType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let expected = ty.row_bytes(out.len())?;
    if bytes.len() != expected {
        return Err(KernelError::ShapeMismatch {
            what: format!("{ty} row bytes for {} elements", out.len()),
            expected,
            actual: bytes.len(),
        });
    }
    with_block_format!(ty, F => dequantize_blocks::<F>(bytes, out));
    Ok(())
}

/// Dequantises a row into a new vector of `n` elements (see [`dequantize_row`]).
///
/// # Errors
/// As [`dequantize_row`].
pub fn dequantize_row_to_vec(ty: QuantType, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
    let mut out = vec![0.0; n];
    dequantize_row(ty, bytes, &mut out)?;
    Ok(out)
}
