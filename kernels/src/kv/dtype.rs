//! The element type of a KV pool: f32, bf16 or f16.
//!
//! A 16-bit pool stores each K/V value rounded to nearest (ties to even) when it is written and
//! widens it back to f32, exactly, when attention reads it. Attention's arithmetic is therefore
//! the f32 arithmetic over the rounded values, whatever the element type: a bf16 pool gives the
//! same results as an f32 pool holding the bf16-rounded values, bit for bit, and inherits its
//! batch invariance. It halves the bytes per token, so a memory budget holds twice the tokens.

use std::fmt;
use std::str::FromStr;

use crate::error::{KernelError, Result};
use crate::quant::float16::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// The element type of a KV pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// 32-bit IEEE floats: the values as computed.
    #[default]
    F32,
    /// bfloat16: f32's range, 8 bits of mantissa.
    Bf16,
    /// IEEE binary16: 11 bits of mantissa, values beyond ±65504 become infinities.
    F16,
}

impl KvDtype {
    /// Every element type, in the order of their names.
    pub const ALL: [KvDtype; 3] = [KvDtype::F32, KvDtype::Bf16, KvDtype::F16];

    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }

    /// The name configs and flags use: `f32`, `bf16` or `f16`.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
        }
    }

    /// `value` as this type stores it, widened back to f32 (the identity for f32).
    pub fn round(self, value: f32) -> f32 {
        match self {
            Self::F32 => value,
            Self::Bf16 => bf16_to_f32(f32_to_bf16(value)),
            Self::F16 => f16_to_f32(f32_to_f16(value)),
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvDtype {
    type Err = KernelError;

    /// Parses `f32`, `bf16` or `f16` (case-insensitive).
    fn from_str(text: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(text.trim()))
            .ok_or_else(|| KernelError::InvalidConfig {
                reason: format!("kv_dtype `{text}`: expected f32, bf16 or f16"),
            })
    }
}

/// The elements of a KV pool, in the layout of [`crate::kv::layout`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum KvStore {
    /// An f32 pool.
    F32(Vec<f32>),
    /// A 16-bit pool: the element type (bf16 or f16) and its bits.
    Half(KvDtype, Vec<u16>),
}

impl KvStore {
    /// `elems` zeroed elements of `dtype`.
    pub(crate) fn zeroed(dtype: KvDtype, elems: usize) -> Self {
        match dtype {
            KvDtype::F32 => Self::F32(vec![0.0; elems]),
            half => Self::Half(half, vec![0; elems]),
        }
    }

    /// A read-only view.
    pub(crate) fn view(&self) -> KvData<'_> {
        match self {
            Self::F32(data) => KvData::F32(data),
            Self::Half(dtype, bits) => KvData::Half(*dtype, bits),
        }
    }

    /// Stores `values` (rounded to the element type) at elements `start..start + values.len()`.
    pub(crate) fn write(&mut self, start: usize, values: &[f32]) {
        match self {
            Self::F32(data) => data[start..start + values.len()].copy_from_slice(values),
            Self::Half(dtype, bits) => {
                let round = match dtype {
                    KvDtype::Bf16 => f32_to_bf16,
                    _ => f32_to_f16,
                };
                for (b, &v) in bits[start..start + values.len()].iter_mut().zip(values) {
                    *b = round(v);
                }
            }
        }
    }

    /// Copies the runs of `len` elements starting at `src[i]` to start at `dst[i]`, all reads
    /// before all writes (`src` and `dst` of equal length, every run inside the store).
    pub(crate) fn move_runs(&mut self, src: &[usize], dst: &[usize], len: usize) {
        fn move_in<T: Copy>(data: &mut [T], src: &[usize], dst: &[usize], len: usize) {
            let staged: Vec<T> = src
                .iter()
                .flat_map(|&s| data[s..s + len].iter().copied())
                .collect();
            for (run, &d) in staged.chunks_exact(len.max(1)).zip(dst) {
                data[d..d + run.len()].copy_from_slice(run);
            }
        }
        match self {
            Self::F32(data) => move_in(data, src, dst, len),
            Self::Half(_, bits) => move_in(bits, src, dst, len),
        }
    }
}

/// A read-only view of a pool's elements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvData<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// 16-bit elements of the given type (bf16 or f16).
    Half(KvDtype, &'a [u16]),
}

impl<'a> KvData<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Self::F32(data) => data.len(),
            Self::Half(_, bits) => bits.len(),
        }
    }

    /// True if there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> KvDtype {
        match self {
            Self::F32(_) => KvDtype::F32,
            Self::Half(dtype, _) => *dtype,
        }
    }

    /// The f32 elements, for an f32 pool.
    pub fn as_f32(&self) -> Option<&'a [f32]> {
        match self {
            Self::F32(data) => Some(data),
            Self::Half(..) => None,
        }
    }

    /// Elements `start..start + out.len()` widened to f32 (exactly) into `out`.
    #[inline(always)]
    pub fn widen_into(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match self {
            Self::F32(data) => out.copy_from_slice(&data[start..end]),
            Self::Half(KvDtype::Bf16, bits) => {
                for (o, &b) in out.iter_mut().zip(&bits[start..end]) {
                    *o = bf16_to_f32(b);
                }
            }
            Self::Half(_, bits) => {
                for (o, &b) in out.iter_mut().zip(&bits[start..end]) {
                    *o = f16_to_f32(b);
                }
            }
        }
    }
}

/// Checks that `dtype` is f32, for code that reads f32 pools only (the CUDA kernels).
///
/// # Errors
/// [`KernelError::InvalidConfig`] naming `what` and the type.
pub fn require_f32(dtype: KvDtype, what: &str) -> Result<()> {
    if dtype != KvDtype::F32 {
        return Err(KernelError::InvalidConfig {
            reason: format!("{what} reads f32 KV pools only, not {dtype} (use kv_dtype = f32)"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_unknown_names_are_refused() {
        for dtype in KvDtype::ALL {
            assert_eq!(dtype.name().parse::<KvDtype>().unwrap(), dtype);
            assert_eq!(
                dtype.name().to_uppercase().parse::<KvDtype>().unwrap(),
                dtype
            );
        }
        let err = "fp8".parse::<KvDtype>().unwrap_err().to_string();
        assert!(err.contains("fp8") && err.contains("bf16"), "{err}");
        assert_eq!(KvDtype::F32.bytes(), 4);
        assert_eq!(KvDtype::Bf16.bytes(), 2);
        assert_eq!(KvDtype::F16.bytes(), 2);
    }

    #[test]
    fn a_pool_stores_rounded_values_and_widens_them_exactly() {
        let values = [1.0f32, 1.0 + 1.0 / 512.0, -3.140_625, 1e-8, 70_000.0, 0.1];
        for dtype in KvDtype::ALL {
            let mut store = KvStore::zeroed(dtype, 8);
            store.write(1, &values);
            let mut back = [0.0f32; 6];
            store.view().widen_into(1, &mut back);
            for (v, b) in values.iter().zip(back) {
                assert_eq!(b.to_bits(), dtype.round(*v).to_bits(), "{dtype} {v}");
            }
            // a swap of overlapping runs: every read happens before every write
            store.move_runs(&[1, 3], &[3, 1], 2);
            let mut moved = [0.0f32; 4];
            store.view().widen_into(1, &mut moved);
            assert_eq!(moved, [back[2], back[3], back[0], back[1]]);
        }
        // what each type keeps: f32 everything, bf16 8 bits of mantissa, f16 11 and its range
        assert_eq!(KvDtype::F32.round(0.1), 0.1);
        assert_eq!(KvDtype::Bf16.round(1.0 + 1.0 / 512.0), 1.0);
        assert_eq!(KvDtype::F16.round(1.0 + 1.0 / 512.0), 1.0 + 1.0 / 512.0);
        assert_eq!(KvDtype::F16.round(70_000.0), f32::INFINITY);
        assert_eq!(KvDtype::Bf16.round(70_000.0), 70_144.0);
    }
}
