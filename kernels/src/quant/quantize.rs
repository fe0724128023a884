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

use super::float16::f32_to_f16;
use super::int8::quantize_to_i8;
use super::types::QuantType;
use crate::error::{KernelError, Result};

/// The GGUF bytes of `values` (consecutive rows, row-major) stored as `ty` (module docs).
///
/// # Errors
/// [`KernelError::UnsupportedQuantType`] for a type without a quantiser here (every type but
/// F32, F16, BF16 and Q8_0); [`KernelError::NotBlockAligned`] when `values.len()` is not a
/// multiple of `ty`'s block length; [`KernelError::InvalidParameter`] naming the first
/// non-finite value for Q8_0.
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
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                return Err(KernelError::InvalidParameter {
                    what: "Q8_0 quantisation",
                    reason: format!("value {i} is {}", values[i]),
                });
            }
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
        other => Err(KernelError::UnsupportedQuantType {
            id: other.ggml_id(),
            name: other.name(),
        }),
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
        let err = quantize_values(QuantType::Q8_0, &values).unwrap_err();
        assert!(err.to_string().contains("value 3"), "{err}");
    }
}
