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
//! `|isum| < 2^20`, so its conversion to f32 is exact. The SIMD kernels compute it with
//! `vpdpbusd` on unsigned weights (offset by 128 / 8 / 16 and corrected by `offset · asum`) or
//! `vpmaddubsw` (Q8_0 by the sign trick), the portable kernel element by element: all give the
//! same integers.
//!
//! **Float accumulation order** (one token, one row; the contract the CUDA port follows, and the
//! same form as the 256-block product of [`super::int8`]): one f32 accumulator `acc = +0.0`; for
//! each block `b` in increasing order, with `dw` (and Q4_1's `m`) the block's f16 fields read
//! exactly as f32,
//! - `acc = fma(dw · da_b, f32(isum_b), acc)`, and for Q4_1 then
//! - `acc = fma(m, sa_b, acc)`,
//!
//! where `dw · da_b` is one f32 product rounded to nearest and `fma` rounds once. The result
//! depends only on the weight row and the token's activations: bit-identical whatever the number
//! of tokens in the call, the token's position, the thread split, the [`SimdLevel`] and the
//! weight layout (the GGUF blocks here, or the 16-row tiles of [`super::int8_packed`] that the
//! AVX-512 kernels read). One accumulator per output is what lets a tile kernel update sixteen
//! rows with one fused multiply-add per block.

use super::dequant::le_f16;
#[cfg(target_arch = "x86_64")]
use super::int8::avx512::quantize_groups;
use super::int8::{check_activations, quantize_to_i8};
use super::matmul::{check_int8_product, for_token_groups, par_over_rows, QuantMatrix, SimdLevel};
use super::types::QuantType;
#[cfg(doc)]
use crate::error::KernelError;
use crate::error::Result;

/// Elements per activation block (the block length of every supported weight type).
pub const Q32_BLOCK: usize = 32;
/// Blocks per group: the activation layout stores eight blocks per four 64-byte slabs, and the
/// SIMD kernels over the GGUF layout compute eight blocks' integer sums at a time.
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
/// Storage: each token's blocks are padded with zero blocks to a multiple of [`LANES`]; the
/// quants of each group of eight blocks (256 bytes) are stored as four 64-byte *slabs*, slab
/// `s` holding elements `8s .. 8s + 8` of block `k` at bytes `8k .. 8k + 8`, so that one
/// 64-byte multiply-add covers eight blocks (the SIMD kernels' layout).
#[derive(Debug, Clone, PartialEq)]
pub struct Q8Blocks32 {
    n_tokens: usize,
    cols: usize,
    /// Real blocks per token (`cols / 32`).
    pub(super) blocks: usize,
    /// Stored blocks per token (`blocks` rounded up to a multiple of [`LANES`]).
    stride: usize,
    pub(super) scales: Vec<f32>,
    pub(super) quants: Vec<i8>,
    pub(super) sums: Vec<i32>,
    pub(super) scaled_sums: Vec<f32>,
}

impl Q8Blocks32 {
    /// Quantises `x` (`[n_tokens × cols]`, row-major).
    ///
    /// # Errors
    /// [`KernelError::NotBlockAligned`] when `cols` is not a multiple of 32;
    /// [`KernelError::ShapeMismatch`] when `x.len() != n_tokens * cols`;
    /// [`KernelError::InvalidParameter`] naming the first non-finite activation.
    pub fn quantize(x: &[f32], n_tokens: usize, cols: usize) -> Result<Self> {
        check_activations(x, n_tokens, cols, Q32_BLOCK, "Q8 activations (32-blocks)")?;
        let blocks = cols / Q32_BLOCK;
        let stride = blocks.div_ceil(LANES) * LANES;
        let total = n_tokens * stride;
        let mut scales = vec![0.0f32; total];
        let mut quants = vec![0i8; total * Q32_BLOCK];
        let mut sums = vec![0i32; total];
        let mut scaled_sums = vec![0.0f32; total];
        let simd = SimdLevel::detect() == SimdLevel::Avx512;
        if cols > 0 {
            for (t, xt) in x.chunks_exact(cols).enumerate() {
                for (b, xb) in xt.chunks_exact(Q32_BLOCK).enumerate() {
                    let i = t * stride + b;
                    let mut qb = [0i8; Q32_BLOCK];
                    let (d, sum) = quantize_block(xb, &mut qb, simd);
                    for (s, part) in qb.chunks_exact(8).enumerate() {
                        let at = slab_offset(i, s);
                        quants[at..at + 8].copy_from_slice(part);
                    }
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
    pub(super) fn index(&self, t: usize, b: usize) -> usize {
        t * self.stride + b
    }
    /// The 32 quants of stored block `i`, gathered from its slabs.
    #[inline(always)]
    fn block(&self, i: usize) -> [i8; Q32_BLOCK] {
        let mut q = [0i8; Q32_BLOCK];
        for (s, part) in q.chunks_exact_mut(8).enumerate() {
            let at = slab_offset(i, s);
            part.copy_from_slice(&self.quants[at..at + 8]);
        }
        q
    }
}

/// Byte offset in the slab layout (see [`Q8Blocks32`]) of elements `8s .. 8s + 8` of stored
/// block `i`.
#[inline(always)]
pub(super) fn slab_offset(i: usize, s: usize) -> usize {
    (i / LANES) * LANES * Q32_BLOCK + s * 64 + (i % LANES) * 8
}

/// One 32-element block of finite values quantised into `quants` (module docs): returns its
/// scale `da` and quant sum `asum`. With `simd` (the caller found AVX-512) the AVX-512
/// quantiser computes the same values sixteen at a time.
fn quantize_block(x: &[f32], quants: &mut [i8; Q32_BLOCK], simd: bool) -> (f32, i32) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        let mut group_sums = [0i16; 2];
        // SAFETY: the caller found AVX-512 F/BW/VL on this CPU; `x` and `quants` hold
        // 32 = 16 · 2 elements.
        let d = unsafe { quantize_groups::<2>(x, quants, &mut group_sums) };
        return (d, i32::from(group_sums[0]) + i32::from(group_sums[1]));
    }
    let _ = simd;
    let d = quantize_to_i8(x, quants) / 127.0;
    (d, quants.iter().map(|&q| i32::from(q)).sum())
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
    let fmt = Format::of(w.quant_type());
    if !check_int8_product(w, fmt.is_some(), acts.n_tokens, acts.cols, out, level)? {
        return Ok(());
    }
    let Some(fmt) = fmt else {
        return Ok(()); // unreachable: an unsupported type was refused above
    };
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
pub(super) enum Format {
    Q8_0 = 0,
    Q4_0 = 1,
    Q4_1 = 2,
    Q5_0 = 3,
}

impl Format {
    pub(super) fn of(ty: QuantType) -> Option<Self> {
        Some(match ty {
            QuantType::Q8_0 => Format::Q8_0,
            QuantType::Q4_0 => Format::Q4_0,
            QuantType::Q4_1 => Format::Q4_1,
            QuantType::Q5_0 => Format::Q5_0,
            _ => return None,
        })
    }
}

pub(super) const Q8_0: u8 = Format::Q8_0 as u8;
pub(super) const Q4_0: u8 = Format::Q4_0 as u8;
pub(super) const Q4_1: u8 = Format::Q4_1 as u8;
pub(super) const Q5_0: u8 = Format::Q5_0 as u8;

/// Bytes per block of format `T`.
#[inline(always)]
pub(super) const fn block_bytes<const T: u8>() -> usize {
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
        // AVX-512 machines read the 16-row tiles of `int8_packed`; over the GGUF layout they
        // run the AVX2 kernel (the same bits)
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::Avx512 => {
            // SAFETY: the caller checked `level.ensure_available()`, and both levels include
            // AVX2, FMA and F16C.
            unsafe { avx2::rows::<T>(w, acts, first_row, out) }
        }
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
pub(super) fn decode_block<const T: u8>(b: &[u8]) -> ([i8; 32], f32, f32) {
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
    let mut acc = 0.0f32;
    for (b, block) in row.chunks_exact(block_bytes::<T>()).enumerate() {
        let (qw, dw, m) = decode_block::<T>(block);
        acc = accumulate_block::<T>(acc, &qw, dw, m, acts, acts.index(t, b));
    }
    acc
}

/// One block of the module's definition: the exact `isum` of the signed weight quants `qw`
/// against stored activation block `i`, then the float step into `acc`.
#[inline(always)]
pub(crate) fn accumulate_block<const T: u8>(
    acc: f32,
    qw: &[i8; Q32_BLOCK],
    dw: f32,
    m: f32,
    acts: &Q8Blocks32,
    i: usize,
) -> f32 {
    let isum: i32 = qw
        .iter()
        .zip(&acts.block(i))
        .map(|(&w, &a)| i32::from(w) * i32::from(a))
        .sum();
    float_step::<T>(acc, dw, m, acts, i, isum)
}

/// The float step of one block (module docs): `fma(dw · da, isum, acc)` (+ `fma(m, sa, ·)`).
#[inline(always)]
fn float_step<const T: u8>(
    acc: f32,
    dw: f32,
    m: f32,
    acts: &Q8Blocks32,
    i: usize,
    isum: i32,
) -> f32 {
    let acc = (dw * acts.scales[i]).mul_add(isum as f32, acc);
    if T == Q4_1 {
        m.mul_add(acts.scaled_sums[i], acc)
    } else {
        acc
    }
}

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
    fn load_ps(s: &[f32], at: usize) -> __m256 {
        let v = &s[at..at + 8];
        // SAFETY: `v` spans exactly 8 readable f32; unaligned loads are allowed.
        unsafe { _mm256_loadu_ps(v.as_ptr()) }
    }

    /// The little-endian u32 at byte `at` of each of the first `n` blocks of format `T` in
    /// `blocks` (`n` whole blocks), zero past `n`.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn block_words<const T: u8>(blocks: &[u8], n: usize, at: usize) -> __m256i {
        let bb = block_bytes::<T>();
        assert!(n <= LANES && (n == 0 || blocks.len() >= (n - 1) * bb + at + 4));
        let word = |k: usize| {
            if k < n {
                // SAFETY: bytes `k·bb + at .. k·bb + at + 4` lie inside `blocks` (asserted for
                // the last block read, `n − 1`); unaligned reads are allowed.
                unsafe {
                    blocks
                        .as_ptr()
                        .add(k * bb + at)
                        .cast::<i32>()
                        .read_unaligned()
                }
            } else {
                0
            }
        };
        _mm256_setr_epi32(
            word(0),
            word(1),
            word(2),
            word(3),
            word(4),
            word(5),
            word(6),
            word(7),
        )
    }

    /// The f16 scale `d` (and, for Q4_1, the min `m`; zero otherwise) of each of the first `n`
    /// blocks as eight f32 (zero past `n`), converted exactly by `vcvtph2ps`.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn scales<const T: u8>(blocks: &[u8], n: usize) -> (__m256, __m256) {
        let words = block_words::<T>(blocks, n, 0);
        let low16 = |v: __m256i| {
            let v = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
            _mm256_cvtph_ps(_mm_packus_epi32(
                _mm256_castsi256_si128(v),
                _mm256_extracti128_si256::<1>(v),
            ))
        };
        let m = if T == Q4_1 {
            low16(_mm256_srli_epi32::<16>(words))
        } else {
            _mm256_setzero_ps()
        };
        (low16(words), m)
    }

    /// Q5_0: the fifth bits of the first `n` blocks (zero past `n`) rearranged as the slabs
    /// need them: 32-bit lane `2s + h` holds byte `s` of `qh` of blocks `4h .. 4h + 4`, so
    /// 64-bit lane `s` holds bit `8k + e` = fifth bit of element `8s + e` of block `k`.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn q5_high_bits<const T: u8>(blocks: &[u8], n: usize) -> __m256i {
        let qh = block_words::<T>(blocks, n, 2);
        let by_byte = _mm256_shuffle_epi8(
            qh,
            _mm256_setr_epi8(
                0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2,
                6, 10, 14, 3, 7, 11, 15,
            ),
        );
        _mm256_permutevar8x32_epi32(by_byte, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// The float steps of the first `n` of eight blocks of one token (stored blocks
    /// `i .. i + n`), in block order into the one accumulator `acc` (module docs). The
    /// products `dw · da` and the conversions run lane-wise (each rounds as its scalar twin);
    /// the chain of fused multiply-adds is serial, as the contract orders it.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn float_steps<const T: u8>(
        mut acc: f32,
        isum: __m256i,
        dw: __m256,
        m: __m256,
        acts: &Q8Blocks32,
        i: usize,
        n: usize,
    ) -> f32 {
        let lanes = |v: __m256| {
            // SAFETY: `__m256` and `[f32; 8]` have the same size; every bit pattern is valid.
            unsafe { std::mem::transmute::<__m256, [f32; LANES]>(v) }
        };
        let scale = lanes(_mm256_mul_ps(dw, load_ps(&acts.scales, i)));
        let isum = lanes(_mm256_cvtepi32_ps(isum));
        let m = lanes(m);
        for k in 0..n {
            acc = scale[k].mul_add(isum[k], acc);
            if T == Q4_1 {
                acc = m[k].mul_add(acts.scaled_sums[i + k], acc);
            }
        }
        acc
    }

    /// `isum − (asum << SHIFT)` for the eight blocks starting at stored block `i`.
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
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2 kernel: per group of eight blocks, each 64-byte activation slab is two 256-bit
    //! halves (blocks 0..4, 4..8) met by `vpmaddubsw` + `vpmaddwd`; the four slabs' sums give
    //! two partial sums per block, joined by one `vphaddd`.

    use super::simd::{float_steps, load128, load256, minus_offset, q5_high_bits, scales};
    use super::{
        block_bytes, for_rows_and_groups, nibbles_at, Q8Blocks32, QuantMatrix, LANES, Q32_BLOCK,
        Q4_0, Q5_0, Q8_0,
    };
    use std::arch::x86_64::*;

    /// Rows `first_row ..` into `out` (`[rows × n_tokens]`).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
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

    /// The weights of the first `n` of eight blocks (zero past `n`) in slab order:
    /// `[slab][half]`, Q8_0 signed, the others unsigned (before their offset).
    #[inline]
    #[target_feature(enable = "avx2")]
    #[allow(clippy::needless_range_loop)] // `h` indexes the inner dimension of `out`
    fn slabs<const T: u8>(blocks: &[u8], n: usize) -> [[__m256i; 2]; 4] {
        let bb = block_bytes::<T>();
        let mut out = [[_mm256_setzero_si256(); 2]; 4];
        if T == Q8_0 {
            let y = |k: usize| {
                if k < n {
                    load256(blocks, k * bb + 2)
                } else {
                    _mm256_setzero_si256()
                }
            };
            for h in 0..2 {
                let (y0, y1, y2, y3) = (y(4 * h), y(4 * h + 1), y(4 * h + 2), y(4 * h + 3));
                let (t0, t1) = (_mm256_unpacklo_epi64(y0, y1), _mm256_unpackhi_epi64(y0, y1));
                let (t2, t3) = (_mm256_unpacklo_epi64(y2, y3), _mm256_unpackhi_epi64(y2, y3));
                out[0][h] = _mm256_permute2x128_si256::<0x20>(t0, t2);
                out[1][h] = _mm256_permute2x128_si256::<0x20>(t1, t3);
                out[2][h] = _mm256_permute2x128_si256::<0x31>(t0, t2);
                out[3][h] = _mm256_permute2x128_si256::<0x31>(t1, t3);
            }
            return out;
        }
        let x = |k: usize| {
            if k < n {
                load128(blocks, k * bb + nibbles_at::<T>())
            } else {
                _mm_setzero_si128()
            }
        };
        let low = _mm256_set1_epi8(15);
        let high = if T == Q5_0 {
            q5_high_bits::<T>(blocks, n)
        } else {
            _mm256_setzero_si256()
        };
        for h in 0..2 {
            let x02 = _mm256_set_m128i(x(4 * h + 2), x(4 * h));
            let x13 = _mm256_set_m128i(x(4 * h + 3), x(4 * h + 1));
            // the first and second 8 bytes of qs of blocks 4h .. 4h + 4
            let q0 = _mm256_unpacklo_epi64(x02, x13);
            let q1 = _mm256_unpackhi_epi64(x02, x13);
            out[0][h] = _mm256_and_si256(q0, low);
            out[1][h] = _mm256_and_si256(q1, low);
            out[2][h] = _mm256_and_si256(_mm256_srli_epi16::<4>(q0), low);
            out[3][h] = _mm256_and_si256(_mm256_srli_epi16::<4>(q1), low);
            if T == Q5_0 {
                for (s, slab) in out.iter_mut().enumerate() {
                    // 32 bits for these 32 bytes, one per byte
                    let word =
                        _mm256_permutevar8x32_epi32(high, _mm256_set1_epi32((2 * s + h) as i32));
                    let spread = _mm256_shuffle_epi8(
                        word,
                        _mm256_setr_epi64x(
                            0,
                            0x0101_0101_0101_0101,
                            0x0202_0202_0202_0202,
                            0x0303_0303_0303_0303,
                        ),
                    );
                    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
                    slab[h] = _mm256_or_si256(slab[h], _mm256_and_si256(set, _mm256_set1_epi8(16)));
                }
            }
        }
        out
    }

    /// Dot products of one weight row with tokens `t0 .. t0 + G`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn row_dot<const T: u8, const G: usize>(row: &[u8], acts: &Q8Blocks32, t0: usize) -> [f32; G] {
        let bb = block_bytes::<T>();
        let nb = acts.blocks;
        let ones = _mm256_set1_epi16(1);
        let mut acc = [0.0f32; G];
        let mut b0 = 0;
        while b0 < nb {
            let n = LANES.min(nb - b0);
            let blocks = &row[b0 * bb..(b0 + n) * bb];
            let w = slabs::<T>(blocks, n);
            // Q8_0: |w| against a · sign(w) (|w| ≤ 128 keeps the pair sums below 2^15)
            let wu = if T == Q8_0 {
                w.map(|s| s.map(|v| _mm256_sign_epi8(v, v)))
            } else {
                w
            };
            let (dw, m) = scales::<T>(blocks, n);
            for (g, acc) in acc.iter_mut().enumerate() {
                let i = acts.index(t0 + g, b0);
                let base = i * Q32_BLOCK;
                let half = |h: usize| {
                    let mut sum = _mm256_setzero_si256();
                    for s in 0..4 {
                        let mut a = load256(&acts.quants, base + 64 * s + 32 * h);
                        if T == Q8_0 {
                            a = _mm256_sign_epi8(a, w[s][h]);
                        }
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wu[s][h], a), ones);
                        sum = _mm256_add_epi32(sum, p);
                    }
                    sum
                };
                // lanes 2k, 2k+1 of each half belong to block 4h + k
                let pairs = _mm256_hadd_epi32(half(0), half(1));
                let mut isum = _mm256_permute4x64_epi64::<0b11_01_10_00>(pairs);
                isum = match T {
                    Q4_0 => minus_offset::<3>(isum, acts, i),
                    Q5_0 => minus_offset::<4>(isum, acts, i),
                    _ => isum,
                };
                *acc = float_steps::<T>(*acc, isum, dw, m, acts, i, n);
            }
            b0 += LANES;
        }
        acc
    }
}
