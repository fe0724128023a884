//! Fast quantised matrix product with 8-bit activations in 32-element blocks, for the
//! 32-element weight types Q8_0, Q4_0, Q4_1 and Q5_0 (any `cols` multiple of 32).
//!
//! **Activations** ([`Q8Blocks32`]): each token's row is cut into blocks of 32; a block with
//! `amax = max |x|` gets the scale `da = amax / 127` and quants `qa = round(x · (127 / amax))`
//! (f32 arithmetic, rounding half away from zero, clamped to ±127; an all-zero block has
//! `da = 0, qa = 0`), its quant sum `asum = Σ qa` and the f32 product `sa = da · asum` (used by
//! Q4_1's min). Each activation moves by at most `da / 2`, so an output moves by at most
//! `Σ_blocks da_b / 2 · Σ_{i∈b} |w_i|` from the exact f32 product ([`super::quant_matmul`]).
//!
//! **Integer core** (exact, per 32-element block `b`): `isum_b = Σ_i qw_i · qa_i` in 32-bit
//! integers, `qw` the block's signed weight quants as documented on [`QuantType`]: Q8_0 `qs[i]`,
//! Q4_0 `nibble − 8`, Q5_0 `5-bit − 16`, Q4_1 the unsigned nibble (its min is a separate term).
//! `|isum| < 2^20`, so its conversion to f32 is exact. The AVX-512 kernel computes it with
//! `vpdpbusd` on unsigned weights (offset by 128 / 8 / 16 and corrected by `offset · asum`), the
//! AVX2 kernel with `vpmaddubsw` (Q8_0 by the sign trick), the portable kernel element by
//! element: all give the same integers.
//!
//! **Float accumulation order** (one token, one row; the contract the CUDA port follows):
//! eight f32 partial sums `acc[0..8] = +0.0`; for each block `b` in increasing order, with
//! `dw` (and Q4_1's `m`) the block's f16 fields read exactly as f32,
//! - `term = (dw · da_b) · f32(isum_b)` (Q8_0, Q4_0, Q5_0), or
//! - `term = (dw · da_b) · f32(isum_b) + m · sa_b` (Q4_1),
//!
//! then `acc[b % 8] = acc[b % 8] + term`. Every product and sum is one IEEE f32 operation
//! rounded to nearest (no fused multiply-add). Finally the lanes are folded pairwise:
//! `acc[k] += acc[k + 4]` (k < 4), then `acc[k] += acc[k + 2]` (k < 2), then `acc[0] + acc[1]`.
//! The SIMD kernels process eight blocks at a time, one block per float lane, and add a term of
//! `+0.0` to the lanes past the row's last block, which leaves them unchanged (a lane starts at
//! `+0.0` and a sum is never `−0.0` then). The result depends only on the weight row and the
//! token's activations: bit-identical whatever the number of tokens in the call, the token's
//! position, the thread split and the [`SimdLevel`].

use super::dequant::le_f16;
use super::matmul::{check_len, for_token_groups, par_over_rows, QuantMatrix, SimdLevel};
use super::types::QuantType;
use crate::error::{KernelError, Result};

/// Elements per activation block (the block length of every supported weight type).
pub const Q32_BLOCK: usize = 32;
/// Float partial sums per output element (blocks go to lane `b % LANES`).
pub const LANES: usize = 8;

/// Whether [`quant_matmul_q32`] accepts weights of this type (Q8_0, Q4_0, Q4_1, Q5_0).
pub fn q32_supported(ty: QuantType) -> bool {
    matches!(
        ty,
        QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0
    )
}

/// A batch of activation rows quantised to 8 bits in blocks of [`Q32_BLOCK`] (see the module
/// docs). Quantise once and reuse for every matrix that reads the same input.
///
/// Each token's blocks are stored padded with zero blocks to a multiple of [`LANES`], so the
/// SIMD kernels read whole groups of eight blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct Q8Blocks32 {
    n_tokens: usize,
    cols: usize,
    /// Real blocks per token (`cols / 32`).
    blocks: usize,
    /// Stored blocks per token (`blocks` rounded up to a multiple of [`LANES`]).
    stride: usize,
    scales: Vec<f32>,
    quants: Vec<i8>,
    sums: Vec<i32>,
    scaled_sums: Vec<f32>,
}

impl Q8Blocks32 {
    /// Quantises `x` (`[n_tokens × cols]`, row-major).
    ///
    /// # Errors
    /// [`KernelError::NotBlockAligned`] when `cols` is not a multiple of 32;
    /// [`KernelError::ShapeMismatch`] when `x.len() != n_tokens * cols`;
    /// [`KernelError::InvalidParameter`] naming the first non-finite activation.
    pub fn quantize(x: &[f32], n_tokens: usize, cols: usize) -> Result<Self> {
        if !cols.is_multiple_of(Q32_BLOCK) {
            return Err(KernelError::NotBlockAligned {
                quant: "Q8 activations (32-blocks)",
                len: cols,
                block_len: Q32_BLOCK,
            });
        }
        check_len("activations [n_tokens x cols]", n_tokens * cols, x.len())?;
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            return Err(KernelError::InvalidParameter {
                what: "activation",
                reason: format!("element {i} (token {}) is {}", i / cols.max(1), x[i]),
            });
        }
        let blocks = cols / Q32_BLOCK;
        let stride = blocks.div_ceil(LANES) * LANES;
        let total = n_tokens * stride;
        let mut scales = vec![0.0f32; total];
        let mut quants = vec![0i8; total * Q32_BLOCK];
        let mut sums = vec![0i32; total];
        let mut scaled_sums = vec![0.0f32; total];
        if cols > 0 {
            for (t, xt) in x.chunks_exact(cols).enumerate() {
                for (b, xb) in xt.chunks_exact(Q32_BLOCK).enumerate() {
                    let i = t * stride + b;
                    let qb = &mut quants[i * Q32_BLOCK..(i + 1) * Q32_BLOCK];
                    let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    if amax > 0.0 {
                        let inv = 127.0 / amax;
                        for (q, &v) in qb.iter_mut().zip(xb) {
                            *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
                        }
                    }
                    let d = amax / 127.0;
                    let sum: i32 = qb.iter().map(|&q| i32::from(q)).sum();
                    scales[i] = d;
                    sums[i] = sum;
                    scaled_sums[i] = d * sum as f32;
                }
            }
        }
        Ok(Self {
            n_tokens,
            cols,
            blocks,
            stride,
            scales,
            quants,
            sums,
            scaled_sums,
        })
    }

    /// Number of tokens (rows).
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }
    /// Elements per token.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// The dequantised activations `da · qa` (`[n_tokens × cols]`), for error analysis.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.n_tokens * self.cols);
        for t in 0..self.n_tokens {
            for b in 0..self.blocks {
                let i = t * self.stride + b;
                let d = self.scales[i];
                out.extend(self.block(i).iter().map(|&q| d * f32::from(q)));
            }
        }
        out
    }

    /// Index of block `b` of token `t` in the per-block arrays.
    #[inline(always)]
    fn index(&self, t: usize, b: usize) -> usize {
        t * self.stride + b
    }
    /// The 32 quants of stored block `i`.
    #[inline(always)]
    fn block(&self, i: usize) -> &[i8] {
        &self.quants[i * Q32_BLOCK..(i + 1) * Q32_BLOCK]
    }
}

/// `out = x · Wᵀ` with 8-bit activations: `acts` holds `[n_tokens × w.cols()]`, `out` is
/// `[n_tokens × w.rows()]`, on the CPU's best [`SimdLevel`]. See the module docs for the exact
/// arithmetic.
///
/// # Errors
/// [`KernelError::UnsupportedQuantType`] when `!q32_supported(w.quant_type())`;
/// [`KernelError::ShapeMismatch`] when `acts.cols() != w.cols()` or `out` has the wrong length.
pub fn quant_matmul_q32(w: &QuantMatrix<'_>, acts: &Q8Blocks32, out: &mut [f32]) -> Result<()> {
    quant_matmul_q32_with(w, acts, out, SimdLevel::detect())
}

/// [`quant_matmul_q32`] with an explicit [`SimdLevel`].
///
/// # Errors
/// As [`quant_matmul_q32`], and [`KernelError::InvalidParameter`] when `level` is not
/// available on this CPU.
pub fn quant_matmul_q32_with(
    w: &QuantMatrix<'_>,
    acts: &Q8Blocks32,
    out: &mut [f32],
    level: SimdLevel,
) -> Result<()> {
    let ty = w.quant_type();
    let Some(fmt) = Format::of(ty) else {
        return Err(KernelError::UnsupportedQuantType {
            id: ty.ggml_id(),
            name: ty.name(),
        });
    };
    check_len("activation columns", w.cols(), acts.cols)?;
    check_len(
        "output [n_tokens x rows]",
        acts.n_tokens * w.rows(),
        out.len(),
    )?;
    level.ensure_available()?;
    if acts.n_tokens == 0 || w.rows() == 0 {
        return Ok(());
    }
    par_over_rows(w.rows(), acts.n_tokens, out, |first_row, chunk| match fmt {
        Format::Q8_0 => rows::<{ Format::Q8_0 as u8 }>(level, w, acts, first_row, chunk),
        Format::Q4_0 => rows::<{ Format::Q4_0 as u8 }>(level, w, acts, first_row, chunk),
        Format::Q4_1 => rows::<{ Format::Q4_1 as u8 }>(level, w, acts, first_row, chunk),
        Format::Q5_0 => rows::<{ Format::Q5_0 as u8 }>(level, w, acts, first_row, chunk),
    });
    Ok(())
}

/// The supported weight formats, as `u8` const-generic selectors of the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
enum Format {
    Q8_0 = 0,
    Q4_0 = 1,
    Q4_1 = 2,
    Q5_0 = 3,
}

impl Format {
    fn of(ty: QuantType) -> Option<Self> {
        Some(match ty {
            QuantType::Q8_0 => Format::Q8_0,
            QuantType::Q4_0 => Format::Q4_0,
            QuantType::Q4_1 => Format::Q4_1,
            QuantType::Q5_0 => Format::Q5_0,
            _ => return None,
        })
    }
}

const Q8_0: u8 = Format::Q8_0 as u8;
const Q4_0: u8 = Format::Q4_0 as u8;
const Q4_1: u8 = Format::Q4_1 as u8;
const Q5_0: u8 = Format::Q5_0 as u8;

/// Bytes per block of format `T`.
#[inline(always)]
const fn block_bytes<const T: u8>() -> usize {
    match T {
        Q8_0 => 34,
        Q4_0 => 18,
        Q4_1 => 20,
        _ => 22,
    }
}

/// Byte offset of the 4-bit quants (`qs`) in a Q4_0 / Q4_1 / Q5_0 block.
#[inline(always)]
const fn nibbles_at<const T: u8>() -> usize {
    match T {
        Q4_0 => 2,
        Q4_1 => 4,
        _ => 6,
    }
}

/// Rows `first_row ..` into `out` (`[rows × n_tokens]`) on `level`.
fn rows<const T: u8>(
    level: SimdLevel,
    w: &QuantMatrix<'_>,
    acts: &Q8Blocks32,
    first_row: usize,
    out: &mut [f32],
) {
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 if std::arch::is_x86_feature_detected!("f16c") => {
            // SAFETY: the caller checked `level.ensure_available()` (AVX-512 F/BW/VL/VNNI, AVX2,
            // FMA) and F16C was just detected.
            unsafe { avx512::rows::<T>(w, acts, first_row, out) }
        }
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::Avx512 if std::arch::is_x86_feature_detected!("f16c") => {
            // SAFETY: as above (AVX2 is implied by both levels), F16C just detected.
            unsafe { avx2::rows::<T>(w, acts, first_row, out) }
        }
        // every level gives the same bits: the portable kernel serves CPUs without F16C
        _ => rows_portable::<T>(w, acts, first_row, out),
    }
}

/// Calls `dot(row, t0, G)` for every row of the chunk and token group, storing `[rows × n]`.
#[inline(always)]
fn for_rows_and_groups(
    w: &QuantMatrix<'_>,
    acts: &Q8Blocks32,
    first_row: usize,
    out: &mut [f32],
    mut dot: impl FnMut(&[u8], usize, usize, &mut [f32]),
) {
    let n = acts.n_tokens;
    for (i, out_row) in out.chunks_exact_mut(n).enumerate() {
        let row = w.row(first_row + i);
        for_token_groups!(n, [1, 2, 3, 4, 5, 6, 7, 8], t, G => {
            dot(row, t, G, &mut out_row[t..t + G]);
        });
    }
}

/// The portable kernel (the definition the SIMD kernels reproduce bit for bit).
fn rows_portable<const T: u8>(
    w: &QuantMatrix<'_>,
    acts: &Q8Blocks32,
    first_row: usize,
    out: &mut [f32],
) {
    for_rows_and_groups(w, acts, first_row, out, |row, t0, g, o| {
        for (k, o) in o.iter_mut().enumerate().take(g) {
            *o = row_dot_portable::<T>(row, acts, t0 + k);
        }
    });
}

/// The signed weight quants `qw`, the scale `dw` and (Q4_1) the min `m` of one block.
#[inline(always)]
fn decode_block<const T: u8>(b: &[u8]) -> ([i8; 32], f32, f32) {
    let mut q = [0i8; 32];
    let d = le_f16(b, 0);
    match T {
        Q8_0 => {
            for (q, &v) in q.iter_mut().zip(&b[2..34]) {
                *q = v as i8;
            }
            (q, d, 0.0)
        }
        Q4_0 | Q4_1 => {
            let (qs, offset) = if T == Q4_0 {
                (&b[2..18], 8)
            } else {
                (&b[4..20], 0)
            };
            for i in 0..16 {
                q[i] = (qs[i] & 15) as i8 - offset;
                q[i + 16] = (qs[i] >> 4) as i8 - offset;
            }
            (q, d, if T == Q4_1 { le_f16(b, 2) } else { 0.0 })
        }
        _ => {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let qs = &b[6..22];
            for i in 0..16 {
                let h0 = (((qh >> i) & 1) << 4) as u8;
                let h1 = (((qh >> (i + 16)) & 1) << 4) as u8;
                q[i] = ((qs[i] & 15) | h0) as i8 - 16;
                q[i + 16] = ((qs[i] >> 4) | h1) as i8 - 16;
            }
            (q, d, 0.0)
        }
    }
}

/// One output element, block by block (float order: module docs).
fn row_dot_portable<const T: u8>(row: &[u8], acts: &Q8Blocks32, t: usize) -> f32 {
    let mut acc = [0.0f32; LANES];
    for (b, block) in row.chunks_exact(block_bytes::<T>()).enumerate() {
        let (qw, dw, m) = decode_block::<T>(block);
        let i = acts.index(t, b);
        let isum: i32 = qw
            .iter()
            .zip(acts.block(i))
            .map(|(&w, &a)| i32::from(w) * i32::from(a))
            .sum();
        let mut term = (dw * acts.scales[i]) * isum as f32;
        if T == Q4_1 {
            term += m * acts.scaled_sums[i];
        }
        acc[b % LANES] += term;
    }
    fold_lanes(acc)
}

/// Folds the eight lanes pairwise in the fixed order of the module docs.
#[inline(always)]
fn fold_lanes(mut l: [f32; LANES]) -> f32 {
    for k in 0..4 {
        l[k] += l[k + 4];
    }
    for k in 0..2 {
        l[k] += l[k + 2];
    }
    l[0] + l[1]
}

/// Defines `rows`, running the enclosing module's `row_dot::<T, G>` over every row of a chunk
/// and every token group (G = 1..=8), compiled with `$features`.
#[cfg(target_arch = "x86_64")]
macro_rules! group_rows {
    ($features:literal, $safety:literal) => {
        /// Rows `first_row ..` into `out` (`[rows × n_tokens]`).
        ///
        /// # Safety
        #[doc = $safety]
        #[target_feature(enable = $features)]
        pub(super) unsafe fn rows<const T: u8>(
            w: &QuantMatrix<'_>,
            acts: &Q8Blocks32,
            first_row: usize,
            out: &mut [f32],
        ) {
            for_rows_and_groups(w, acts, first_row, out, |row, t0, g, o| match g {
                1 => o.copy_from_slice(&row_dot::<T, 1>(row, acts, t0)),
                2 => o.copy_from_slice(&row_dot::<T, 2>(row, acts, t0)),
                3 => o.copy_from_slice(&row_dot::<T, 3>(row, acts, t0)),
                4 => o.copy_from_slice(&row_dot::<T, 4>(row, acts, t0)),
                5 => o.copy_from_slice(&row_dot::<T, 5>(row, acts, t0)),
                6 => o.copy_from_slice(&row_dot::<T, 6>(row, acts, t0)),
                7 => o.copy_from_slice(&row_dot::<T, 7>(row, acts, t0)),
                _ => o.copy_from_slice(&row_dot::<T, 8>(row, acts, t0)),
            });
        }
    };
}
#[cfg(target_arch = "x86_64")]
use group_rows;

#[cfg(target_arch = "x86_64")]
mod simd {
    //! Pieces shared by the AVX2 and AVX-512 kernels.

    use super::{block_bytes, Q8Blocks32, LANES, Q4_1};
    use std::arch::x86_64::*;

    /// Loads 32 bytes from `s[at..at + 32 / size_of::<T>()]` (bounds checked).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn load256<T>(s: &[T], at: usize) -> __m256i {
        let bytes = &s[at..at + 32 / size_of::<T>()];
        // SAFETY: `bytes` spans exactly 32 readable bytes; unaligned loads are allowed.
        unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
    }

    /// Loads 16 bytes from `s[at..at + 16]` (bounds checked).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn load128(s: &[u8], at: usize) -> __m128i {
        let bytes = &s[at..at + 16];
        // SAFETY: `bytes` spans exactly 16 readable bytes; unaligned loads are allowed.
        unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
    }

    /// Loads 8 f32 from `s[at..at + 8]` (bounds checked).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn load_ps(s: &[f32], at: usize) -> __m256 {
        let v = &s[at..at + 8];
        // SAFETY: `v` spans exactly 8 readable f32; unaligned loads are allowed.
        unsafe { _mm256_loadu_ps(v.as_ptr()) }
    }

    /// The f16 at byte `at` of each of the first `n` blocks of `blocks` as eight f32 (zero past
    /// `n`), converted exactly by `vcvtph2ps`.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn block_f16s<const T: u8>(blocks: &[u8], n: usize, at: usize) -> __m256 {
        let bb = block_bytes::<T>();
        let mut h = [0u16; LANES];
        for (k, h) in h.iter_mut().enumerate().take(n) {
            let o = k * bb + at;
            *h = u16::from_le_bytes([blocks[o], blocks[o + 1]]);
        }
        // SAFETY: `h` is 16 readable bytes; unaligned loads are allowed.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(h.as_ptr().cast()) })
    }

    /// The float step of eight blocks of one token starting at block `b0`:
    /// `acc + ((dw · da) · f32(isum) [+ m · sa])`, lane by lane (module docs).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn accumulate<const T: u8>(
        acc: __m256,
        isum: __m256i,
        dw: __m256,
        m: __m256,
        acts: &Q8Blocks32,
        i: usize,
    ) -> __m256 {
        let da = load_ps(&acts.scales, i);
        let mut term = _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum));
        if T == Q4_1 {
            term = _mm256_add_ps(term, _mm256_mul_ps(m, load_ps(&acts.scaled_sums, i)));
        }
        _mm256_add_ps(acc, term)
    }

    /// `isum − (asum << shift)` for the eight blocks starting at stored block `i`.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn minus_offset<const SHIFT: i32>(
        isum: __m256i,
        acts: &Q8Blocks32,
        i: usize,
    ) -> __m256i {
        let asum = load256(&acts.sums, i);
        _mm256_sub_epi32(isum, _mm256_slli_epi32::<SHIFT>(asum))
    }

    /// Folds the eight lanes in the order of the module docs.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn fold(acc: __m256) -> f32 {
        let s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<0b01>(s2, s2)))
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2 kernel: one block per 256-bit register (`vpmaddubsw` u8×i8 pair sums, then
    //! `vpmaddwd` by ones), eight blocks' partial sums reduced to one lane each by `vphaddd`.

    use super::simd::{accumulate, block_f16s, fold, load128, load256, minus_offset};
    use super::{
        block_bytes, for_rows_and_groups, nibbles_at, Q8Blocks32, QuantMatrix, LANES, Q32_BLOCK,
        Q4_0, Q4_1, Q5_0, Q8_0,
    };
    use std::arch::x86_64::*;

    super::group_rows!("avx2,fma,f16c", "The CPU must support AVX2, FMA and F16C.");

    /// Block `k`'s 32 weight quants as bytes: Q8_0 signed, the others unsigned (before the
    /// offset); zero when `k >= n`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn weights<const T: u8>(blocks: &[u8], k: usize, n: usize) -> __m256i {
        if k >= n {
            return _mm256_setzero_si256();
        }
        let at = k * block_bytes::<T>();
        if T == Q8_0 {
            return load256(blocks, at + 2);
        }
        let qs = load128(blocks, at + nibbles_at::<T>());
        // low nibbles are elements 0..16, high nibbles 16..32
        let both = _mm256_set_m128i(qs, qs);
        let shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
        let mut q = _mm256_and_si256(shifted, _mm256_set1_epi8(15));
        if T == Q5_0 {
            let qh = u32::from_le_bytes([
                blocks[at + 2],
                blocks[at + 3],
                blocks[at + 4],
                blocks[at + 5],
            ]);
            // byte j takes bit j of qh
            let spread = _mm256_shuffle_epi8(
                _mm256_set1_epi32(qh as i32),
                _mm256_setr_epi64x(
                    0,
                    0x0101_0101_0101_0101,
                    0x0202_0202_0202_0202,
                    0x0303_0303_0303_0303,
                ),
            );
            let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
            q = _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(16)));
        }
        q
    }

    /// The eight per-lane i32 partial sums of 8 × 4 products each.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn dot<const T: u8>(w: __m256i, a: __m256i) -> __m256i {
        let ones = _mm256_set1_epi16(1);
        let pairs = if T == Q8_0 {
            // |w| · (a · sign w): |w| ≤ 128, so pair sums stay below 2^15
            _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w))
        } else {
            _mm256_maddubs_epi16(w, a)
        };
        _mm256_madd_epi16(pairs, ones)
    }

    /// Eight registers of eight partial sums → one register of the eight totals, in order.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn reduce8(d: [__m256i; 8]) -> __m256i {
        let h01 = _mm256_hadd_epi32(d[0], d[1]);
        let h23 = _mm256_hadd_epi32(d[2], d[3]);
        let h45 = _mm256_hadd_epi32(d[4], d[5]);
        let h67 = _mm256_hadd_epi32(d[6], d[7]);
        let q0 = _mm256_hadd_epi32(h01, h23);
        let q1 = _mm256_hadd_epi32(h45, h67);
        // q0: [blocks 0..4 low halves | blocks 0..4 high halves], q1 likewise for 4..8
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(q0, q1),
            _mm256_permute2x128_si256::<0x31>(q0, q1),
        )
    }

    /// Dot products of one weight row with tokens `t0 .. t0 + G`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn row_dot<const T: u8, const G: usize>(row: &[u8], acts: &Q8Blocks32, t0: usize) -> [f32; G] {
        let bb = block_bytes::<T>();
        let nb = acts.blocks;
        let mut acc = [_mm256_setzero_ps(); G];
        let mut b0 = 0;
        while b0 < nb {
            let n = LANES.min(nb - b0);
            let blocks = &row[b0 * bb..(b0 + n) * bb];
            let wq: [__m256i; 8] = std::array::from_fn(|k| weights::<T>(blocks, k, n));
            let dw = block_f16s::<T>(blocks, n, 0);
            let m = if T == Q4_1 {
                block_f16s::<T>(blocks, n, 2)
            } else {
                _mm256_setzero_ps()
            };
            for (g, acc) in acc.iter_mut().enumerate() {
                let i = acts.index(t0 + g, b0);
                let aq = &acts.quants[i * Q32_BLOCK..(i + LANES) * Q32_BLOCK];
                let d: [__m256i; 8] =
                    std::array::from_fn(|k| dot::<T>(wq[k], load256(aq, k * Q32_BLOCK)));
                let mut isum = reduce8(d);
                isum = match T {
                    Q4_0 => minus_offset::<3>(isum, acts, i),
                    Q5_0 => minus_offset::<4>(isum, acts, i),
                    _ => isum,
                };
                *acc = accumulate::<T>(*acc, isum, dw, m, acts, i);
            }
            b0 += LANES;
        }
        acc.map(|a| fold(a))
    }
}

// The AVX-512 intrinsics are stable since Rust 1.89, the workspace's `rust-version`.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! The AVX-512 kernel: two blocks per 512-bit register (`vpdpbusd` on unsigned weights),
    //! four registers' partial sums reduced to one lane per block by `vpermt2d`.

    use super::simd::{accumulate, block_f16s, fold, load128, load256, minus_offset};
    use super::{
        block_bytes, for_rows_and_groups, nibbles_at, Q8Blocks32, QuantMatrix, LANES, Q32_BLOCK,
        Q4_0, Q4_1, Q5_0, Q8_0,
    };
    use std::arch::x86_64::*;

    super::group_rows!(
        "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
        "The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C."
    );

    /// Loads 64 bytes from `s[at..at + 64]` (bounds checked).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load512(s: &[i8], at: usize) -> __m512i {
        let bytes = &s[at..at + 64];
        // SAFETY: `bytes` spans exactly 64 readable bytes; unaligned loads are allowed.
        unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) }
    }

    /// Blocks `k` and `k + 1` (zero past `n`) as 64 unsigned bytes: Q8_0 `qs + 128`, the
    /// others their unsigned 4- or 5-bit quants.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
    fn weights<const T: u8>(blocks: &[u8], k: usize, n: usize) -> __m512i {
        let bb = block_bytes::<T>();
        if k >= n {
            return _mm512_setzero_si512();
        }
        let second = k + 1 < n;
        if T == Q8_0 {
            let lo = load256(blocks, k * bb + 2);
            let hi = if second {
                load256(blocks, (k + 1) * bb + 2)
            } else {
                // 0x80 ^ 0x80 = 0 below: the missing block's bytes are zero
                _mm256_set1_epi8(-128)
            };
            let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            return _mm512_xor_si512(v, _mm512_set1_epi8(-128));
        }
        let nib = |j: usize| {
            if j < n {
                _mm256_broadcastsi128_si256(load128(blocks, j * bb + nibbles_at::<T>()))
            } else {
                _mm256_setzero_si256()
            }
        };
        let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(nib(k)), nib(k + 1));
        // 128-bit lanes [qs_k, qs_k, qs_k+1, qs_k+1] → [low, high, low, high] nibbles
        let shifts = _mm512_set_epi64(
            0x0004_0004_0004_0004,
            0x0004_0004_0004_0004,
            0,
            0,
            0x0004_0004_0004_0004,
            0x0004_0004_0004_0004,
            0,
            0,
        );
        let q = _mm512_and_si512(_mm512_srlv_epi16(v, shifts), _mm512_set1_epi8(15));
        if T == Q5_0 {
            let qh = |j: usize| {
                if j < n {
                    let at = j * bb + 2;
                    u64::from(u32::from_le_bytes([
                        blocks[at],
                        blocks[at + 1],
                        blocks[at + 2],
                        blocks[at + 3],
                    ]))
                } else {
                    0
                }
            };
            let mask: __mmask64 = qh(k) | (qh(k + 1) << 32);
            return _mm512_or_si512(q, _mm512_maskz_set1_epi8(mask, 16));
        }
        q
    }

    /// Four registers of two blocks' eight partial sums each → the eight block totals, in order.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
    fn reduce4(d: [__m512i; 4]) -> __m256i {
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        let pair = |a: __m512i, b: __m512i| {
            _mm512_add_epi32(
                _mm512_permutex2var_epi32(a, even, b),
                _mm512_permutex2var_epi32(a, odd, b),
            )
        };
        // 4 lanes per block (blocks 0..4 and 4..8), then 2 lanes per block (0..8)
        let y = pair(pair(d[0], d[1]), pair(d[2], d[3]));
        // each 64-bit lane holds one block's two halves: add them, keep the low 32 bits
        let z = _mm512_add_epi32(y, _mm512_srli_epi64::<32>(y));
        _mm512_cvtepi64_epi32(z)
    }

    /// Dot products of one weight row with tokens `t0 .. t0 + G`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn row_dot<const T: u8, const G: usize>(row: &[u8], acts: &Q8Blocks32, t0: usize) -> [f32; G] {
        let bb = block_bytes::<T>();
        let nb = acts.blocks;
        let mut acc = [_mm256_setzero_ps(); G];
        let mut b0 = 0;
        while b0 < nb {
            let n = LANES.min(nb - b0);
            let blocks = &row[b0 * bb..(b0 + n) * bb];
            let wq: [__m512i; 4] = std::array::from_fn(|p| weights::<T>(blocks, 2 * p, n));
            let dw = block_f16s::<T>(blocks, n, 0);
            let m = if T == Q4_1 {
                block_f16s::<T>(blocks, n, 2)
            } else {
                _mm256_setzero_ps()
            };
            for (g, acc) in acc.iter_mut().enumerate() {
                let i = acts.index(t0 + g, b0);
                let aq = &acts.quants[i * Q32_BLOCK..(i + LANES) * Q32_BLOCK];
                let d: [__m512i; 4] = std::array::from_fn(|p| {
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[p], load512(aq, 64 * p))
                });
                let mut isum = reduce4(d);
                isum = match T {
                    Q8_0 => minus_offset::<7>(isum, acts, i),
                    Q4_0 => minus_offset::<3>(isum, acts, i),
                    Q5_0 => minus_offset::<4>(isum, acts, i),
                    _ => isum,
                };
                *acc = accumulate::<T>(*acc, isum, dw, m, acts, i);
            }
            b0 += LANES;
        }
        acc.map(|a| fold(a))
    }
}
