//! Fast quantised matrix product with 8-bit activations (the approach llama.cpp takes), for the
//! k-quant weight types Q4_K and Q6_K.
//!
//! **Activations** ([`Q8Activations`]): each token's row is cut into blocks of 256; a block with
//! `amax = max |x|` gets the scale `d = amax / 127` and quants `q = round(x · (127 / amax))`
//! (f32 arithmetic, rounding half away from zero, clamped to ±127; an all-zero block has
//! `d = 0, q = 0`), plus the sums of its quants over each 16-element group. This loses precision
//! against the exact f32 path ([`super::quant_matmul`]): each activation moves by at most
//! `d / 2`, so a dot product moves by at most `Σ_blocks d_b / 2 · Σ_i |w_i|`. That is the
//! difference between llama.cpp's logits and an f32 reference.
//!
//! **Integer core**: per 256-element super-block the weight quants meet the activation quants
//! in exact 32-bit integer arithmetic (Q4_K: `isum = Σ_j sc_j Σ_{i∈j} q_i a_i` and
//! `msum = Σ_j m_j Σ_{i∈j} a_i`; Q6_K: `isum = Σ_k sc_k Σ_{i∈k} (q_i − 32) a_i`). Integer sums do
//! not depend on order, so the AVX-512, AVX2 and portable kernels produce the same integers.
//!
//! **Float accumulation order** (one token, one row): `acc = 0`, then for each super-block in
//! order `acc = acc + ((d·da)·isum − (dmin·da)·msum)` (Q4_K) or `acc = acc + (d·da)·isum`
//! (Q6_K), every product and difference rounded to f32 (no fused multiply-add), `d`/`dmin` the
//! block's f16 scales and `da` the activation block's scale. The result depends only on the
//! token's activations and the weight row: batch-invariant, thread-split-invariant and
//! bit-identical on every [`SimdLevel`].

#[cfg(test)]
use super::dequant::k_scale_min;
use super::dequant::le_f16;
use super::matmul::{check_len, for_token_groups, par_over_rows, QuantMatrix, SimdLevel};
use super::types::QuantType;
use crate::error::{KernelError, Result};

/// Elements per activation block.
pub const Q8_BLOCK: usize = 256;
/// Elements per activation group sum.
const GROUP: usize = 16;

/// Whether [`quant_matmul_int8`] accepts weights of this type (Q4_K and Q6_K).
pub fn int8_supported(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q4_K | QuantType::Q6_K)
}

/// A batch of activation rows quantised to 8 bits in blocks of [`Q8_BLOCK`] (see the module
/// docs). Quantise once and reuse for every matrix that reads the same input (Q/K/V, gate/up).
#[derive(Debug, Clone, PartialEq)]
pub struct Q8Activations {
    n_tokens: usize,
    cols: usize,
    scales: Vec<f32>,
    quants: Vec<i8>,
    group_sums: Vec<i32>,
}

impl Q8Activations {
    /// Quantises `x` (`[n_tokens × cols]`, row-major).
    ///
    /// # Errors
    /// [`KernelError::NotBlockAligned`] when `cols` is not a multiple of 256;
    /// [`KernelError::ShapeMismatch`] when `x.len() != n_tokens * cols`;
    /// [`KernelError::InvalidParameter`] naming the first non-finite activation.
    pub fn quantize(x: &[f32], n_tokens: usize, cols: usize) -> Result<Self> {
        if !cols.is_multiple_of(Q8_BLOCK) {
            return Err(KernelError::NotBlockAligned {
                quant: "Q8 activations",
                len: cols,
                block_len: Q8_BLOCK,
            });
        }
        check_len("activations [n_tokens x cols]", n_tokens * cols, x.len())?;
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            return Err(KernelError::InvalidParameter {
                what: "activation",
                reason: format!("element {i} (token {}) is {}", i / cols.max(1), x[i]),
            });
        }
        let mut scales = Vec::with_capacity(x.len() / Q8_BLOCK);
        let mut quants = vec![0i8; x.len()];
        let mut group_sums = Vec::with_capacity(x.len() / GROUP);
        for (xb, qb) in x
            .chunks_exact(Q8_BLOCK)
            .zip(quants.chunks_exact_mut(Q8_BLOCK))
        {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            if amax > 0.0 {
                let inv = 127.0 / amax;
                for (q, &v) in qb.iter_mut().zip(xb) {
                    *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
                }
            }
            scales.push(amax / 127.0);
            group_sums.extend(
                qb.chunks_exact(GROUP)
                    .map(|g| g.iter().map(|&q| i32::from(q)).sum::<i32>()),
            );
        }
        Ok(Self {
            n_tokens,
            cols,
            scales,
            quants,
            group_sums,
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
    /// The dequantised activations `d · q` (`[n_tokens × cols]`), for error analysis.
    pub fn dequantize(&self) -> Vec<f32> {
        self.quants
            .chunks_exact(Q8_BLOCK)
            .zip(&self.scales)
            .flat_map(|(qb, &d)| qb.iter().map(move |&q| d * f32::from(q)))
            .collect()
    }

    #[inline(always)]
    fn block_index(&self, token: usize, block: usize) -> usize {
        token * (self.cols / Q8_BLOCK) + block
    }
    #[inline(always)]
    fn block_quants(&self, token: usize, block: usize) -> &[i8] {
        let b = self.block_index(token, block);
        &self.quants[b * Q8_BLOCK..(b + 1) * Q8_BLOCK]
    }
    #[inline(always)]
    fn block_sums(&self, token: usize, block: usize) -> &[i32] {
        let b = self.block_index(token, block);
        let per = Q8_BLOCK / GROUP;
        &self.group_sums[b * per..(b + 1) * per]
    }
}

/// `out = x · Wᵀ` with 8-bit activations: `acts` holds `[n_tokens × w.cols()]`, `out` is
/// `[n_tokens × w.rows()]`, on the CPU's best [`SimdLevel`]. See the module docs for the exact
/// arithmetic.
///
/// # Errors
/// [`KernelError::UnsupportedQuantType`] when `!int8_supported(w.quant_type())`;
/// [`KernelError::ShapeMismatch`] when `acts.cols() != w.cols()` or `out` has the wrong length.
pub fn quant_matmul_int8(w: &QuantMatrix<'_>, acts: &Q8Activations, out: &mut [f32]) -> Result<()> {
    quant_matmul_int8_with(w, acts, out, SimdLevel::detect())
}

/// [`quant_matmul_int8`] with an explicit [`SimdLevel`].
///
/// # Errors
/// As [`quant_matmul_int8`], and [`KernelError::InvalidParameter`] when `level` is not
/// available on this CPU.
pub fn quant_matmul_int8_with(
    w: &QuantMatrix<'_>,
    acts: &Q8Activations,
    out: &mut [f32],
    level: SimdLevel,
) -> Result<()> {
    let ty = w.quant_type();
    if !int8_supported(ty) {
        return Err(KernelError::UnsupportedQuantType {
            id: ty.ggml_id(),
            name: ty.name(),
        });
    }
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
    par_over_rows(
        w.rows(),
        acts.n_tokens,
        out,
        |first_row, chunk| match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => {
                // SAFETY: `level.ensure_available()` succeeded: AVX-512 F/BW/VL/VNNI are present.
                unsafe { avx512::rows(w, acts, first_row, chunk) }
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => {
                // SAFETY: `level.ensure_available()` succeeded: AVX2 is present.
                unsafe { avx2::rows(w, acts, first_row, chunk) }
            }
            _ => rows_generic::<SCALAR>(w, acts, first_row, chunk),
        },
    );
    Ok(())
}

/// Integer-kernel selector for [`rows_generic`].
const SCALAR: u8 = 0;
/// AVX2 kernels (only inside [`avx2::rows`]).
#[cfg(target_arch = "x86_64")]
const AVX2: u8 = 1;
/// AVX-512 BW + VNNI kernels (only inside [`avx512::rows`]).
#[cfg(target_arch = "x86_64")]
const AVX512: u8 = 2;

/// Rows `first_row ..` into `out` (`[rows × n_tokens]`); `K` selects the integer kernels.
#[inline(always)]
fn rows_generic<const K: u8>(
    w: &QuantMatrix<'_>,
    acts: &Q8Activations,
    first_row: usize,
    out: &mut [f32],
) {
    let n = acts.n_tokens;
    for (i, out_row) in out.chunks_exact_mut(n).enumerate() {
        let row = w.row(first_row + i);
        for_token_groups!(n, [1, 2, 3, 4, 5, 6, 7, 8], t, G => {
            let sums = row_dot::<K, G>(w.quant_type(), row, acts, t);
            out_row[t..t + G].copy_from_slice(&sums);
        });
    }
}

/// Dot products of one weight row with tokens `t0 .. t0 + G` (float order: module docs).
#[inline(always)]
fn row_dot<const K: u8, const G: usize>(
    ty: QuantType,
    row: &[u8],
    acts: &Q8Activations,
    t0: usize,
) -> [f32; G] {
    let mut acc = [0.0f32; G];
    for (sb, block) in row.chunks_exact(ty.block_bytes()).enumerate() {
        let a: [&[i8]; G] = std::array::from_fn(|g| acts.block_quants(t0 + g, sb));
        let s: [&[i32]; G] = std::array::from_fn(|g| acts.block_sums(t0 + g, sb));
        let da: [f32; G] = std::array::from_fn(|g| acts.scales[acts.block_index(t0 + g, sb)]);
        if ty == QuantType::Q4_K {
            let (d, dmin) = (le_f16(block, 0), le_f16(block, 2));
            let (isums, msums) = match K {
                // SAFETY: K == AVX512 only inside `avx512::rows`, reached after the CPU check.
                #[cfg(target_arch = "x86_64")]
                AVX512 => unsafe { avx512::q4k::<G>(block, a, s) },
                // SAFETY: K == AVX2 only inside `avx2::rows`, reached after the CPU check.
                #[cfg(target_arch = "x86_64")]
                AVX2 => unsafe { avx2::q4k::<G>(block, a, s) },
                _ => q4k_scalar::<G>(block, a, s),
            };
            for g in 0..G {
                acc[g] += (d * da[g]) * isums[g] as f32 - (dmin * da[g]) * msums[g] as f32;
            }
        } else {
            let d = le_f16(block, 208);
            let isums = match K {
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                AVX512 => unsafe { avx512::q6k::<G>(block, a, s) },
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                AVX2 => unsafe { avx2::q6k::<G>(block, a, s) },
                _ => q6k_scalar::<G>(block, a, s),
            };
            for g in 0..G {
                acc[g] += (d * da[g]) * isums[g] as f32;
            }
        }
    }
    acc
}

/// The six-bit scales and mins of a Q4_K block, unpacked a 32-bit word at a time (the same
/// values as [`k_scale_min`], without per-element branches).
#[inline(always)]
fn q4k_scales_mins(block: &[u8]) -> ([u8; 8], [u8; 8]) {
    let word =
        |i: usize| u32::from_le_bytes([block[4 + i], block[5 + i], block[6 + i], block[7 + i]]);
    let (w0, w1, w2) = (word(0), word(4), word(8));
    let low6 = 0x3f3f_3f3f;
    let (nib, top2) = (0x0f0f_0f0f, 0x3030_3030);
    let sc_hi = (w2 & nib) | ((w0 >> 2) & top2);
    let m_hi = ((w2 >> 4) & nib) | ((w1 >> 2) & top2);
    let join = |lo: u32, hi: u32| (u64::from(lo) | (u64::from(hi) << 32)).to_le_bytes();
    (join(w0 & low6, sc_hi), join(w1 & low6, m_hi))
}

/// `msum = Σ_j m_j Σ_{i∈j} a_i` from the 16-element group sums `s`.
#[inline(always)]
fn q4k_msum(m: &[u8; 8], s: &[i32]) -> i32 {
    (0..8)
        .map(|j| i32::from(m[j]) * (s[2 * j] + s[2 * j + 1]))
        .sum()
}

/// The Q6_K offset term `32 · Σ_k sc_k Σ_{i∈k} a_i` from the group sums `s`.
#[inline(always)]
fn q6k_offset(block: &[u8], s: &[i32]) -> i32 {
    32 * (0..16)
        .map(|k| i32::from(block[192 + k] as i8) * s[k])
        .sum::<i32>()
}

/// Q4_K integer core per token: `(isum, msum)` with `isum = Σ_j sc_j Σ_{i∈j} q_i a_i`
/// (`block` = the 144-byte block, `a` the activation quants, `s` their group sums).
#[inline(always)]
fn q4k_scalar<const G: usize>(block: &[u8], a: [&[i8]; G], s: [&[i32]; G]) -> ([i32; G], [i32; G]) {
    let (sc, m) = q4k_scales_mins(block);
    let qs = &block[16..144];
    let isums = a.map(|a| {
        let mut total = 0i32;
        for c in 0..4 {
            let (mut lo, mut hi) = (0i32, 0i32);
            for l in 0..32 {
                lo += i32::from(qs[32 * c + l] & 15) * i32::from(a[64 * c + l]);
                hi += i32::from(qs[32 * c + l] >> 4) * i32::from(a[64 * c + 32 + l]);
            }
            total += i32::from(sc[2 * c]) * lo + i32::from(sc[2 * c + 1]) * hi;
        }
        total
    });
    (isums, s.map(|s| q4k_msum(&m, s)))
}

/// Q6_K integer core per token: `Σ_k sc_k Σ_{i∈k} (q_i − 32) a_i` (`block` = 210 bytes).
#[inline(always)]
fn q6k_scalar<const G: usize>(block: &[u8], a: [&[i8]; G], s: [&[i32]; G]) -> [i32; G] {
    let mut out = [0i32; G];
    for g in 0..G {
        let a = a[g];
        let mut total = 0i32;
        for h in 0..2 {
            let ql = &block[64 * h..64 * h + 64];
            let qh = &block[128 + 32 * h..128 + 32 * h + 32];
            let mut part = [0i32; 8];
            for l in 0..32 {
                let q = [
                    (ql[l] & 15) | ((qh[l] & 3) << 4),
                    (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                ];
                for (i, &qi) in q.iter().enumerate() {
                    part[2 * i + l / 16] += i32::from(qi) * i32::from(a[128 * h + 32 * i + l]);
                }
            }
            for (k, p) in part.iter().enumerate() {
                total += i32::from(block[192 + 8 * h + k] as i8) * p;
            }
        }
        out[g] = total - q6k_offset(block, s[g]);
    }
    out
}

#[cfg(test)]
#[test]
fn word_wise_k_scales_match_the_definition() {
    let mut rng = super::testutil::TestRng(41);
    for _ in 0..200 {
        let block: Vec<u8> = (0..16).map(|_| rng.next_u64() as u8).collect();
        let (sc, m) = q4k_scales_mins(&block);
        for j in 0..8 {
            assert_eq!(
                (sc[j], m[j]),
                k_scale_min(j, &block[4..16]),
                "sub-block {j}"
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2 integer kernels (`vpmaddubsw` u8×i8 pair sums, `vpmaddwd` by the sub-block
    //! scale), giving exactly the scalar kernels' integers.

    use super::{q4k_msum, q4k_scales_mins, q6k_offset, rows_generic, Q8Activations, QuantMatrix};
    use std::arch::x86_64::*;

    /// [`rows_generic`] compiled for AVX2.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn rows(
        w: &QuantMatrix<'_>,
        acts: &Q8Activations,
        first_row: usize,
        out: &mut [f32],
    ) {
        rows_generic::<{ super::AVX2 }>(w, acts, first_row, out)
    }

    /// Loads 32 bytes from `s[at..at + 32]` (bounds checked).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load<T>(s: &[T], at: usize) -> __m256i {
        let bytes = &s[at..at + 32 / size_of::<T>()];
        // SAFETY: `bytes` spans exactly 32 readable bytes; unaligned loads are allowed.
        unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn hsum(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }

    /// As `q4k_scalar`.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn q4k<const G: usize>(
        block: &[u8],
        a: [&[i8]; G],
        s: [&[i32]; G],
    ) -> ([i32; G], [i32; G]) {
        let (sc, m) = q4k_scales_mins(block);
        let qs = &block[16..144];
        let mask = _mm256_set1_epi8(15);
        let mut acc = [_mm256_setzero_si256(); G];
        for c in 0..4 {
            let q4 = load(qs, 32 * c);
            let lo = _mm256_and_si256(q4, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q4), mask);
            let s_lo = _mm256_set1_epi16(i16::from(sc[2 * c]));
            let s_hi = _mm256_set1_epi16(i16::from(sc[2 * c + 1]));
            for g in 0..G {
                let p_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load(a[g], 64 * c)), s_lo);
                let p_hi =
                    _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load(a[g], 64 * c + 32)), s_hi);
                acc[g] = _mm256_add_epi32(acc[g], _mm256_add_epi32(p_lo, p_hi));
            }
        }
        let mut isums = [0i32; G];
        for (t, &v) in isums.iter_mut().zip(&acc) {
            *t = hsum(v);
        }
        (isums, s.map(|s| q4k_msum(&m, s)))
    }

    /// As `q6k_scalar`.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn q6k<const G: usize>(b: &[u8], a: [&[i8]; G], s: [&[i32]; G]) -> [i32; G] {
        let m4 = _mm256_set1_epi8(15);
        let m30 = _mm256_set1_epi8(0x30);
        let mut acc = [_mm256_setzero_si256(); G];
        for h in 0..2 {
            let ql0 = load(b, 64 * h);
            let ql1 = load(b, 64 * h + 32);
            let qh = load(b, 128 + 32 * h);
            // the four 32-element runs of this half, as unsigned 6-bit values
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                    _mm256_and_si256(qh, m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
                ),
            ];
            for (i, &qi) in q.iter().enumerate() {
                let k = 192 + 8 * h + 2 * i;
                // low 128 bits hold elements 0..16 (scale k), high 128 bits 16..32 (scale k+1)
                let scale = _mm256_set_m128i(
                    _mm_set1_epi16(i16::from(b[k + 1] as i8)),
                    _mm_set1_epi16(i16::from(b[k] as i8)),
                );
                for g in 0..G {
                    let p = _mm256_maddubs_epi16(qi, load(a[g], 128 * h + 32 * i));
                    acc[g] = _mm256_add_epi32(acc[g], _mm256_madd_epi16(p, scale));
                }
            }
        }
        let mut isums = [0i32; G];
        for g in 0..G {
            isums[g] = hsum(acc[g]) - q6k_offset(b, s[g]);
        }
        isums
    }
}

// The AVX-512 intrinsics are stable since Rust 1.89, the workspace's `rust-version`.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! The AVX-512 integer kernels: 64 weight quants per register (`vpmaddubsw` u8×i8 pair
    //! sums, then `vpdpwssd` by the 16-bit sub-block scales), giving exactly the scalar
    //! kernels' integers.

    use super::{q4k_scales_mins, rows_generic, Q8Activations, QuantMatrix};
    use std::arch::x86_64::*;

    /// [`rows_generic`] compiled for AVX-512.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, BW, VL and VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
    pub(super) unsafe fn rows(
        w: &QuantMatrix<'_>,
        acts: &Q8Activations,
        first_row: usize,
        out: &mut [f32],
    ) {
        rows_generic::<{ super::AVX512 }>(w, acts, first_row, out)
    }

    /// Loads 64 bytes from `s[at..]` (bounds checked).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load512<T>(s: &[T], at: usize) -> __m512i {
        let bytes = &s[at..at + 64 / size_of::<T>()];
        // SAFETY: `bytes` spans exactly 64 readable bytes; unaligned loads are allowed.
        unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) }
    }

    /// Loads 32 bytes from `s[at..]` (bounds checked).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load256(s: &[u8], at: usize) -> __m256i {
        let bytes = &s[at..at + 32];
        // SAFETY: `bytes` spans exactly 32 readable bytes; unaligned loads are allowed.
        unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
    }

    /// `[lo | hi]` as one 512-bit register.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn join(lo: __m256i, hi: __m256i) -> __m512i {
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }

    /// Horizontal sums of `G` registers (integer sums: any order gives the same value).
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    fn hsums<const G: usize>(v: [__m512i; G]) -> [i32; G] {
        let mut out = [0i32; G];
        let fold = |x: __m512i| {
            let y = _mm256_add_epi32(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64::<1>(x));
            _mm_add_epi32(_mm256_castsi256_si128(y), _mm256_extracti128_si256::<1>(y))
        };
        let mut g = 0;
        // four registers at a time: three `phaddd` give the four totals
        while g + 4 <= G {
            let x = [fold(v[g]), fold(v[g + 1]), fold(v[g + 2]), fold(v[g + 3])];
            let h = _mm_hadd_epi32(_mm_hadd_epi32(x[0], x[1]), _mm_hadd_epi32(x[2], x[3]));
            let mut four = [0i32; 4];
            // SAFETY: `four` is 16 writable bytes; unaligned stores are allowed.
            unsafe { _mm_storeu_si128(four.as_mut_ptr().cast(), h) };
            out[g..g + 4].copy_from_slice(&four);
            g += 4;
        }
        while g < G {
            out[g] = _mm512_reduce_add_epi32(v[g]);
            g += 1;
        }
        out
    }

    /// As `q4k_scalar`.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, BW, VL and VNNI.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
    pub(super) unsafe fn q4k<const G: usize>(
        block: &[u8],
        a: [&[i8]; G],
        s: [&[i32]; G],
    ) -> ([i32; G], [i32; G]) {
        let (sc, m) = q4k_scales_mins(block);
        let mask = _mm256_set1_epi8(15);
        // two independent accumulator chains per token (even and odd c) hide the VNNI latency
        let mut acc = [[_mm512_setzero_si512(); G]; 2];
        for c in 0..4 {
            let q4 = load256(block, 16 + 32 * c);
            // elements 64c .. 64c+32 (low nibbles) then 64c+32 .. 64c+64 (high nibbles)
            let w = join(
                _mm256_and_si256(q4, mask),
                _mm256_and_si256(_mm256_srli_epi16::<4>(q4), mask),
            );
            let scale = join(
                _mm256_set1_epi16(i16::from(sc[2 * c])),
                _mm256_set1_epi16(i16::from(sc[2 * c + 1])),
            );
            for g in 0..G {
                let p = _mm512_maddubs_epi16(w, load512(a[g], 64 * c));
                acc[c % 2][g] = _mm512_dpwssd_epi32(acc[c % 2][g], p, scale);
            }
        }
        // msum: each min times its two 16-element group sums
        let m8 = _mm_set_epi64x(0, i64::from_le_bytes(m));
        let m16 = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(m8, m8));
        let mut mprod = [_mm512_setzero_si512(); G];
        for g in 0..G {
            mprod[g] = _mm512_mullo_epi32(load512(s[g], 0), m16);
        }
        let mut isum = [_mm512_setzero_si512(); G];
        for g in 0..G {
            isum[g] = _mm512_add_epi32(acc[0][g], acc[1][g]);
        }
        (hsums(isum), hsums(mprod))
    }

    /// As `q6k_scalar`.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, BW, VL and VNNI.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
    pub(super) unsafe fn q6k<const G: usize>(b: &[u8], a: [&[i8]; G], s: [&[i32]; G]) -> [i32; G] {
        let m4 = _mm512_set1_epi8(15);
        let m30 = _mm512_set1_epi8(0x30);
        // the 16 signed scales, each repeated over its 16 elements' pair-sum lanes (8 i16)
        let sc128 = {
            let bytes = &b[192..208];
            // SAFETY: 16 readable bytes; unaligned loads are allowed.
            unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
        };
        let sc_both = _mm256_broadcastsi128_si256(sc128);
        let scale = |k0: i8| {
            let idx = _mm256_setr_epi8(
                k0,
                k0,
                k0,
                k0,
                k0,
                k0,
                k0,
                k0,
                k0 + 1,
                k0 + 1,
                k0 + 1,
                k0 + 1,
                k0 + 1,
                k0 + 1,
                k0 + 1,
                k0 + 1,
                k0 + 2,
                k0 + 2,
                k0 + 2,
                k0 + 2,
                k0 + 2,
                k0 + 2,
                k0 + 2,
                k0 + 2,
                k0 + 3,
                k0 + 3,
                k0 + 3,
                k0 + 3,
                k0 + 3,
                k0 + 3,
                k0 + 3,
                k0 + 3,
            );
            _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(sc_both, idx))
        };
        let mut acc = [_mm512_setzero_si512(); G];
        let mut acc23 = [_mm512_setzero_si512(); G];
        for h in 0..2 {
            let ql = load512(b, 64 * h);
            let qh = load256(b, 128 + 32 * h);
            // [run 0 | run 1] and [run 2 | run 3] of this half, unsigned 6-bit values
            let hi01 = join(_mm256_slli_epi16::<4>(qh), _mm256_slli_epi16::<2>(qh));
            let hi23 = join(qh, _mm256_srli_epi16::<2>(qh));
            let q01 = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(hi01, m30));
            let q23 = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                _mm512_and_si512(hi23, m30),
            );
            let (s01, s23) = (scale(8 * h as i8), scale(8 * h as i8 + 4));
            for g in 0..G {
                let p01 = _mm512_maddubs_epi16(q01, load512(a[g], 128 * h));
                let p23 = _mm512_maddubs_epi16(q23, load512(a[g], 128 * h + 64));
                acc[g] = _mm512_dpwssd_epi32(acc[g], p01, s01);
                acc23[g] = _mm512_dpwssd_epi32(acc23[g], p23, s23);
            }
        }
        // the offset 32 · Σ_k sc_k · (group sum k), subtracted lane-wise before the reduction
        let sc32 = _mm512_cvtepi8_epi32(sc128);
        for g in 0..G {
            let off = _mm512_slli_epi32::<5>(_mm512_mullo_epi32(load512(s[g], 0), sc32));
            acc[g] = _mm512_sub_epi32(_mm512_add_epi32(acc[g], acc23[g]), off);
        }
        hsums(acc)
    }
}
