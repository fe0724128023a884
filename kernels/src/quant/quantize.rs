//! f32 values to GGUF storage blocks: the inverse of [`super::dequant`] for the float types and
//! Q8_0, so weights made in memory (trained heads, tests) can be stored as the products expect.
//!
//! - F32: the values' little-endian bytes (exact).
//! - F16 / BF16: each value rounded to nearest, ties to even ([`f32_to_f16`], [`half::bf16`]).
//! - Q8_0: per block of 32 with `amax = max |x|`, quants `q = round(x · 127 / amax)` (the
//!   activation quantiser of the 8-bit products: f32, half away from zero, clamped to ±127;
//!   all zero when `amax = 0`) and the scale `d = amax / 127` rounded to f16, as llama.cpp's
//!   `quantize_row_q8_0`. Each value moves by at most `d / 2` plus the f16 rounding of `d`
//!   (relative `2⁻¹¹`).
//! - Q4_0: per block of 32, `max` the value of largest magnitude (its sign kept), the scale
//!   `d = max / −8` rounded to f16 and quants `q = min(15, trunc(x / d + 8.5))`, which decode
//!   to `(q − 8) · d`, as llama.cpp's `quantize_row_q4_0_ref` (the quotient computed as
//!   `x · (1 / d)` with the unrounded `d`). `max` itself is exact up to the f16 rounding of `d`;
//!   every other value moves by at most `|d| / 2`, except that values of the opposite sign near
//!   `−max` are clamped to `7 · |d|` in magnitude (a move of up to `|d|`).

use super::float16::f32_to_f16;
use super::int8::quantize_to_i8;
use super::types::QuantType;
use crate::error::{KernelError, Result};

/// The GGUF bytes of `values` (consecutive rows, row-major) stored as `ty` (module docs).
///
/// # Errors
/// [`KernelError::UnsupportedQuantType`] for a type without a quantiser here (every type but
/// F32, F16, BF16, Q8_0 and Q4_0); [`KernelError::NotBlockAligned`] when `values.len()` is not
/// a multiple of `ty`'s block length; [`KernelError::InvalidParameter`] naming the first
/// non-finite value for Q8_0 and Q4_0.
pub fn quantize_values(ty: QuantType, values: &[f32]) -> Result<Vec<u8>> {
    ty.row_bytes(values.len())?;
    match ty {
        QuantType::F32 => Ok(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        QuantType::F16 => Ok(values
            .iter()
            .flat_map(|&v| f32_to_f16(v).to_le_bytes())
            .collect()),
        QuantType::BF16 => Ok(values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect()),
        QuantType::Q8_0 => {
            check_finite("Q8_0 quantisation", values)?;
            let block = ty.block_len();
            let mut out = Vec::with_capacity(values.len() / block * ty.block_bytes());
            let mut quants = [0i8; 32];
            for x in values.chunks_exact(block) {
                let amax = quantize_to_i8(x, &mut quants);
                out.extend_from_slice(&f32_to_f16(amax / 127.0).to_le_bytes());
                out.extend(quants.iter().map(|&q| q as u8));
            }
            Ok(out)
        }
        QuantType::Q4_0 => {
            check_finite("Q4_0 quantisation", values)?;
            let mut out = Vec::with_capacity(values.len() / 32 * ty.block_bytes());
            for x in values.chunks_exact(ty.block_len()) {
                let max = x
                    .iter()
                    .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                let d = max / -8.0;
                let inverse = if d == 0.0 { 0.0 } else { 1.0 / d };
                // 0..=15: x / d lies in -8..=8, and 8 (the opposite extreme) is clamped
                let quant = |v: f32| ((v * inverse + 8.5) as u8).min(15);
                out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
                let (low, high) = x.split_at(16);
                out.extend(
                    low.iter()
                        .zip(high)
                        .map(|(&l, &h)| quant(l) | quant(h) << 4),
                );
            }
            Ok(out)
        }
        other => Err(KernelError::UnsupportedQuantType {
            id: other.ggml_id(),
            name: other.name(),
        }),
    }
}

/// [`KernelError::InvalidParameter`] naming the first non-finite value of `values`.
fn check_finite(what: &'static str, values: &[f32]) -> Result<()> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(KernelError::InvalidParameter {
            what,
            reason: format!("value {i} is {}", values[i]),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_row_to_vec;

    #[test]
    fn round_trips_within_the_formats_step() {
        let values: Vec<f32> = (0..96)
            .map(|i| ((i * 37) % 91) as f32 / 45.0 - 1.0)
            .collect();
        let exact = dequantize_row_to_vec(
            QuantType::F32,
            &quantize_values(QuantType::F32, &values).unwrap(),
            96,
        )
        .unwrap();
        assert_eq!(exact, values);
        for (ty, tolerance) in [
            (QuantType::F16, 1.0 / 2048.0),
            (QuantType::BF16, 1.0 / 256.0),
            (QuantType::Q8_0, 1.0 / 254.0 + 1.0 / 2048.0),
            // one step of 1/8 at most (the clamped extreme), plus the f16 scale's rounding
            (QuantType::Q4_0, 1.0 / 8.0 + 1.0 / 2048.0),
        ] {
            let bytes = quantize_values(ty, &values).unwrap();
            assert_eq!(bytes.len(), ty.row_bytes(96).unwrap(), "{ty}");
            let back = dequantize_row_to_vec(ty, &bytes, 96).unwrap();
            for (&a, &b) in values.iter().zip(&back) {
                // every |x| <= 1, so the step bounds the absolute error
                assert!((a - b).abs() <= tolerance, "{ty}: {a} -> {b}");
            }
            assert_ne!(back, vec![0.0; 96], "{ty}: not degenerate");
        }
        // a zero block stays zero, with a zero scale
        let zeros = quantize_values(QuantType::Q8_0, &[0.0; 32]).unwrap();
        assert!(zeros.iter().all(|&b| b == 0));
    }

    #[test]
    fn q4_0_follows_llama_cpps_rounding_and_layout() {
        // Block 1: k / 16 for k = -16..16. The largest magnitude is -1, so d = 1/8: even k are
        // exact, odd k round up by half a step (trunc(k/2 + 8.5)), and 15/16 is clamped to 7/8.
        // Block 2: the same values negated and scaled by 4 (largest magnitude +4, d = -1/2).
        let first: Vec<f32> = (-16..16).map(|k| k as f32 / 16.0).collect();
        let second: Vec<f32> = first.iter().map(|v| -4.0 * v).collect();
        let values = [first.clone(), second.clone()].concat();
        let bytes = quantize_values(QuantType::Q4_0, &values).unwrap();
        assert_eq!(bytes.len(), QuantType::Q4_0.row_bytes(64).unwrap());
        // the low nibble of byte j holds value j, the high nibble value j + 16
        assert_eq!(bytes[2] & 15, 0, "-1 is quant 0");
        assert_eq!(bytes[2] >> 4, 8, "0 is quant 8");
        let back = dequantize_row_to_vec(QuantType::Q4_0, &bytes, 64).unwrap();
        let want = |k: i32| (k + k.rem_euclid(2)).min(14) as f32 / 16.0;
        for (i, k) in (-16..16).enumerate() {
            assert_eq!(back[i], want(k), "block 1, value {}", first[i]);
            assert_eq!(back[32 + i], -4.0 * want(k), "block 2, value {}", second[i]);
        }
        // a zero block stays zero, with a zero scale
        let zeros = quantize_values(QuantType::Q4_0, &[0.0; 32]).unwrap();
        let back = dequantize_row_to_vec(QuantType::Q4_0, &zeros, 32).unwrap();
        assert_eq!(back, vec![0.0; 32]);
    }

    #[test]
    fn refuses_what_it_cannot_store() {
        assert!(matches!(
            quantize_values(QuantType::Q4_K, &[0.0; 256]),
            Err(KernelError::UnsupportedQuantType { .. })
        ));
        assert!(matches!(
            quantize_values(QuantType::Q8_0, &[0.0; 33]),
            Err(KernelError::NotBlockAligned { .. })
        ));
        let mut values = [0.5f32; 32];
        values[3] = f32::NAN;
        for ty in [QuantType::Q8_0, QuantType::Q4_0] {
            let err = quantize_values(ty, &values).unwrap_err();
            assert!(err.to_string().contains("value 3"), "{ty}: {err}");
        }
    }
}
