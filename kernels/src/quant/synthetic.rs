//! Synthetic weight matrices at real shapes, for benchmarks (CPU and GPU) where real weights
//! are unavailable or too large to ship. Speed does not depend on the values.

use super::float16::f32_to_f16;
use super::types::QuantType;
use crate::error::Result;

/// A `[rows × cols]` matrix of type `ty`: pseudo-random quant bytes (xorshift64 from `seed`),
/// with every block's f16 scale fields set to 0.001 so every value is finite (|x| < 8). For the
/// float types the elements are finite values below 2 in magnitude.
///
/// # Errors
/// [`crate::KernelError::NotBlockAligned`] when `cols` is not a multiple of the block length.
pub fn synthetic_weights(ty: QuantType, rows: usize, cols: usize, seed: u64) -> Result<Vec<u8>> {
    let len = rows * ty.row_bytes(cols)?;
    let mut state = seed | 1;
    let mut data: Vec<u8> = (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let scale = f32_to_f16(0.001).to_le_bytes();
    let scale_offsets: &[usize] = match ty {
        QuantType::Q6_K => &[208],
        QuantType::Q4_1 | QuantType::Q4_K | QuantType::Q5_K => &[0, 2],
        QuantType::F32 | QuantType::F16 | QuantType::BF16 => &[],
        QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q5_0 => &[0],
    };
    for block in data.chunks_exact_mut(ty.block_bytes()) {
        for &at in scale_offsets {
            block[at..at + 2].copy_from_slice(&scale);
        }
        match ty {
            // keep float elements finite: clear the exponent's top bits
            QuantType::F32 => block[3] &= 0xbf,
            QuantType::F16 => block[1] &= 0xbb,
            QuantType::BF16 => block[1] &= 0xbf,
            _ => {}
        }
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_row_to_vec;

    #[test]
    fn synthetic_rows_are_finite_for_every_type() {
        for ty in QuantType::ALL {
            let data = synthetic_weights(ty, 3, 512, 7).unwrap();
            assert_eq!(data.len(), 3 * ty.row_bytes(512).unwrap());
            let values =
                dequantize_row_to_vec(ty, &data[..ty.row_bytes(512).unwrap()], 512).unwrap();
            assert!(
                values.iter().all(|v| v.is_finite() && v.abs() < 8.0),
                "{ty}"
            );
        }
        assert!(synthetic_weights(QuantType::Q4_K, 1, 100, 0).is_err());
    }
}
