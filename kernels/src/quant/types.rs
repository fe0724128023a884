//! The GGML tensor types this crate reads, with their block geometry.
//!
//! A GGML tensor row of `n` elements is stored as `n / block_len()` consecutive blocks of
//! `block_bytes()` bytes each, little-endian, without padding. The exact byte layout of every
//! block is documented on [`QuantType`]'s variants and implemented in [`super::dequant`].

use crate::error::{KernelError, Result};

/// A GGML tensor element type supported by the dequantisers and the quantised matrix product.
///
/// Layouts (all multi-byte fields little-endian; `f16` is IEEE binary16; a "sub-block" is a
/// run of consecutive elements sharing one scale):
///
/// | type | elems/block | bytes | layout |
/// |---|---|---|---|
/// | F32  | 1   | 4   | IEEE binary32 |
/// | F16  | 1   | 2   | IEEE binary16 |
/// | BF16 | 1   | 2   | upper 16 bits of a binary32 |
/// | Q8_0 | 32  | 34  | `d: f16, qs: [i8; 32]`; `x[i] = d * qs[i]` |
/// | Q4_0 | 32  | 18  | `d: f16, qs: [u8; 16]`; `x[i] = d * ((qs[i] & 15) - 8)`, `x[i+16] = d * ((qs[i] >> 4) - 8)`, i < 16 |
/// | Q4_1 | 32  | 20  | `d: f16, m: f16, qs: [u8; 16]`; `x[i] = d * (qs[i] & 15) + m`, `x[i+16] = d * (qs[i] >> 4) + m` |
/// | Q5_0 | 32  | 22  | `d: f16, qh: u32, qs: [u8; 16]`; 5-bit `q[i] = (qs[i] & 15) \| bit i of qh << 4`, `q[i+16] = (qs[i] >> 4) \| bit (i+16) of qh << 4`; `x = d * (q - 16)` |
/// | Q4_K | 256 | 144 | `d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]`: see below |
/// | Q5_K | 256 | 176 | `d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]`: see below |
/// | Q6_K | 256 | 210 | `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`: see below |
///
/// **Q4_K / Q5_K**: 8 sub-blocks of 32. Sub-block `j` has a 6-bit scale `sc[j]` and a 6-bit min
/// `m[j]` packed in `scales` (`s` below): for `j < 4`, `sc = s[j] & 63`, `m = s[j+4] & 63`; for
/// `j >= 4`, `sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4`, `m = (s[j+4] >> 4) | (s[j] >> 6) << 4`.
/// `x = d * sc[j] * q - dmin * m[j]` (the products `d * sc[j]` and `dmin * m[j]` are formed in
/// f32 first). The 4-bit quants: elements `64c .. 64c+32` (sub-block `2c`) are the low nibbles of
/// `qs[32c .. 32c+32]`, elements `64c+32 .. 64c+64` (sub-block `2c+1`) their high nibbles,
/// `c = 0..4`. Q5_K adds a fifth bit: element `64c + l` takes bit `2c` of `qh[l]`, element
/// `64c + 32 + l` bit `2c+1` of `qh[l]` (`l < 32`), as value 16.
///
/// **Q6_K**: 16 sub-blocks of 16 with signed 8-bit scales, `x = d * scales[k] * (q - 32)` with the
/// 6-bit `q`. Two halves `h = 0, 1` of 128 elements use `ql[64h ..]`, `qh[32h ..]`,
/// `scales[8h ..]`; within a half, for `l < 32`: element `l` = low nibble of `ql[l]` | bits 0-1 of
/// `qh[l]` << 4; element `l+32` = low nibble of `ql[l+32]` | bits 2-3 of `qh[l]` << 4; element
/// `l+64` = high nibble of `ql[l]` | bits 4-5 of `qh[l]` << 4; element `l+96` = high nibble of
/// `ql[l+32]` | bits 6-7 of `qh[l]` << 4; element `e` of the half uses scale `scales[8h + e/16]`.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    /// 32-bit IEEE float (GGML id 0).
    F32,
    /// 16-bit IEEE float (GGML id 1).
    F16,
    /// bfloat16 (GGML id 30).
    BF16,
    /// 8-bit symmetric, blocks of 32 (GGML id 8).
    Q8_0,
    /// 4-bit symmetric, blocks of 32 (GGML id 2).
    Q4_0,
    /// 4-bit with a min, blocks of 32 (GGML id 3).
    Q4_1,
    /// 5-bit symmetric, blocks of 32 (GGML id 6).
    Q5_0,
    /// 4-bit k-quant, super-blocks of 256 (GGML id 12).
    Q4_K,
    /// 5-bit k-quant, super-blocks of 256 (GGML id 13).
    Q5_K,
    /// 6-bit k-quant, super-blocks of 256 (GGML id 14).
    Q6_K,
}

/// GGML type ids this crate knows by name but does not read, for clear error messages.
const UNSUPPORTED_NAMES: &[(u32, &str)] = &[
    (7, "Q5_1"),
    (9, "Q8_1"),
    (10, "Q2_K"),
    (11, "Q3_K"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
];

impl QuantType {
    /// Every supported type, in GGML id order.
    pub const ALL: [QuantType; 10] = [
        QuantType::F32,
        QuantType::F16,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q8_0,
        QuantType::Q4_K,
        QuantType::Q5_K,
        QuantType::Q6_K,
        QuantType::BF16,
    ];

    /// The type of a GGUF tensor-table entry's GGML type id.
    ///
    /// # Errors
    /// [`KernelError::UnsupportedQuantType`] with the id (and its GGML name when it is a known
    /// type this crate does not read).
    pub fn from_ggml_id(id: u32) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.ggml_id() == id)
            .ok_or_else(|| KernelError::UnsupportedQuantType {
                id,
                name: UNSUPPORTED_NAMES
                    .iter()
                    .find(|(known, _)| *known == id)
                    .map_or("unknown", |(_, name)| name),
            })
    }

    /// The GGML type id (as stored in GGUF).
    pub fn ggml_id(self) -> u32 {
        match self {
            QuantType::F32 => 0,
            QuantType::F16 => 1,
            QuantType::Q4_0 => 2,
            QuantType::Q4_1 => 3,
            QuantType::Q5_0 => 6,
            QuantType::Q8_0 => 8,
            QuantType::Q4_K => 12,
            QuantType::Q5_K => 13,
            QuantType::Q6_K => 14,
            QuantType::BF16 => 30,
        }
    }

    /// The GGML name, e.g. `"Q4_K"`.
    pub fn name(self) -> &'static str {
        match self {
            QuantType::F32 => "F32",
            QuantType::F16 => "F16",
            QuantType::BF16 => "BF16",
            QuantType::Q8_0 => "Q8_0",
            QuantType::Q4_0 => "Q4_0",
            QuantType::Q4_1 => "Q4_1",
            QuantType::Q5_0 => "Q5_0",
            QuantType::Q4_K => "Q4_K",
            QuantType::Q5_K => "Q5_K",
            QuantType::Q6_K => "Q6_K",
        }
    }

    /// Elements per block (1 for the float types).
    pub fn block_len(self) -> usize {
        match self {
            QuantType::F32 | QuantType::F16 | QuantType::BF16 => 1,
            QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 => 32,
            QuantType::Q4_K | QuantType::Q5_K | QuantType::Q6_K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantType::F32 => 4,
            QuantType::F16 | QuantType::BF16 => 2,
            QuantType::Q8_0 => 34,
            QuantType::Q4_0 => 18,
            QuantType::Q4_1 => 20,
            QuantType::Q5_0 => 22,
            QuantType::Q4_K => 144,
            QuantType::Q5_K => 176,
            QuantType::Q6_K => 210,
        }
    }

    /// Bytes of a row of `n` elements.
    ///
    /// # Errors
    /// [`KernelError::NotBlockAligned`] when `n` is not a multiple of [`Self::block_len`].
    pub fn row_bytes(self, n: usize) -> Result<usize> {
        let block_len = self.block_len();
        if !n.is_multiple_of(block_len) {
            return Err(KernelError::NotBlockAligned {
                quant: self.name(),
                len: n,
                block_len,
            });
        }
        Ok(n / block_len * self.block_bytes())
    }
}

impl std::fmt::Display for QuantType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_names_are_distinct() {
        for t in QuantType::ALL {
            assert_eq!(QuantType::from_ggml_id(t.ggml_id()), Ok(t));
            assert_eq!(t.to_string(), t.name());
        }
        let mut names: Vec<_> = QuantType::ALL.iter().map(|t| t.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), QuantType::ALL.len());
    }

    #[test]
    fn unknown_ids_are_named_in_the_error() {
        let err = QuantType::from_ggml_id(10).unwrap_err();
        assert_eq!(
            err,
            KernelError::UnsupportedQuantType {
                id: 10,
                name: "Q2_K"
            }
        );
        assert!(err.to_string().contains("10") && err.to_string().contains("Q2_K"));
        let err = QuantType::from_ggml_id(999).unwrap_err();
        assert!(err.to_string().contains("999") && err.to_string().contains("unknown"));
    }

    #[test]
    fn row_bytes_follow_the_block_geometry() {
        assert_eq!(QuantType::Q4_K.row_bytes(1536), Ok(6 * 144));
        assert_eq!(QuantType::Q6_K.row_bytes(8960), Ok(35 * 210));
        assert_eq!(QuantType::Q8_0.row_bytes(64), Ok(68));
        assert_eq!(QuantType::F16.row_bytes(3), Ok(6));
        assert_eq!(QuantType::Q4_0.row_bytes(0), Ok(0));
        let err = QuantType::Q5_K.row_bytes(300).unwrap_err();
        assert_eq!(
            err,
            KernelError::NotBlockAligned {
                quant: "Q5_K",
                len: 300,
                block_len: 256
            }
        );
    }
}
