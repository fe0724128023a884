//! Fast quantised matrix product with 8-bit activations (the approach llama.cpp takes), for the
//! k-quant weight types Q4_K and Q6_K.
//!
//! **Activations** ([`Q8Activations`]): each token's row is cut into blocks of 256; a block with
//! `amax = max |x|` gets the scale `d = amax / 127` and quants `q = round(x · (127 / amax))`
//! (f32 arithmetic, rounding half away from zero, clamped to ±127; an all-zero block has
//! `d = 0, q = 0`), plus the sums of its quants over each 16-element group (`gs_0 .. gs_15`).
//! This loses precision against the exact f32 path ([`super::quant_matmul`]): each activation
//! moves by at most `d / 2`, so a dot product moves by at most `Σ_blocks d_b / 2 · Σ_i |w_i|`.
//! That is the difference between llama.cpp's logits and an f32 reference.
//!
//! **Integer core, in eight lanes.** A super-block's 256 elements form sixteen groups of 16
//! (group `k` = elements `16k .. 16k+16`; in Q4_K group `k` lies in sub-block `k / 2`). Per
//! group the weight quants meet the activation quants in exact 32-bit integer arithmetic,
//! `g_k = Σ_{i∈k} q_i a_i`, scaled into `s_k`:
//! - Q4_K (sub-block `j` = elements `32j .. 32j+32`, scale `sc_j`, min `m_j`, quants `0..16`):
//!   `s_k = sc_{k/2} · g_k`;
//! - Q6_K (group `k` with signed scale `sc_k`, quants `q ∈ 0..64` with offset 32):
//!   `s_k = sc_k · (g_k − 32 gs_k)`.
//!
//! Lane `l < 8` takes two groups, `isum_l = s_l + s_{l+8}`; Q4_K's min term is
//! `msum_l = m_l · (gs_{2l} + gs_{2l+1})`. Integer sums do not depend on order, so the AVX-512,
//! AVX2 and portable kernels produce the same integers. The grouping is what `vpdpbusd` gives
//! when the weights and the activations of a block are both laid out group by group (register
//! `c` holds bytes `4c .. 4c+4` of every group, see [`Q8Activations`]): one accumulator per
//! token collects all four registers, one multiply applies the sixteen group scales, and a
//! fold of the two 256-bit halves gives the eight lanes.
//!
//! **Float accumulation order** (one token, one row): eight f32 lanes `acc_l = 0`; for each
//! super-block in order, with `d`/`dmin` the block's f16 scales and `da` the activation block's
//! scale, `dd = d·da` and `ndm = −(dmin·da)` (rounded f32 products):
//! Q4_K `acc_l = fma(dd, isum_l, acc_l)` then `acc_l = fma(ndm, msum_l, acc_l)`;
//! Q6_K `acc_l = fma(dd, isum_l, acc_l)` (fused multiply-adds, integers converted exactly to
//! f32 — they stay far below 2^24). At the end of the row the lanes are folded
//! `h_k = acc_k + acc_{k+4}` (k < 4), `p_k = h_k + h_{k+2}` (k < 2), `result = p_0 + p_1`.
//! The result depends only on the token's activations and the weight row: batch-invariant,
//! thread-split-invariant and bit-identical on every [`SimdLevel`]. The CUDA port follows it.

#[cfg(test)]
use super::dequant::k_scale_min;
use super::dequant::le_f16;
use super::matmul::{
    check_int8_product, check_len, for_token_groups, par_over_rows, QuantMatrix, SimdLevel,
};
use super::types::QuantType;
use crate::error::{KernelError, Result};

/// Elements per activation block.
pub const Q8_BLOCK: usize = 256;
/// Elements per activation group sum.
const GROUP: usize = 16;
/// Group sums per activation block.
const GROUPS: usize = Q8_BLOCK / GROUP;
/// Float accumulator lanes per output element (see the module docs).
pub const ACC_LANES: usize = 8;

/// Whether [`quant_matmul_int8`] accepts weights of this type (Q4_K and Q6_K).
pub fn int8_supported(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q4_K | QuantType::Q6_K)
}

/// A batch of activation rows quantised to 8 bits in blocks of [`Q8_BLOCK`] (see the module
/// docs). Quantise once and reuse for every matrix that reads the same input (Q/K/V, gate/up).
///
/// The quants are kept twice: in element order (the AVX2 and portable kernels) and **by group
/// lanes** for the AVX-512 kernels: within each block, byte `64c + 4k + j` holds element
/// `16k + 4c + j` (group `k`, its bytes `4c .. 4c+4`), so that 32-bit lane `k` of register `c`
/// belongs to group `k`.
#[derive(Debug, Clone, PartialEq)]
pub struct Q8Activations {
    n_tokens: usize,
    cols: usize,
    /// `[n_tokens × cols / 256]` block scales.
    scales: Vec<f32>,
    /// `[n_tokens × cols]` quants, in element order.
    quants: Vec<i8>,
    /// `[n_tokens × cols]` the same quants, by group lanes within each block.
    lane_quants: Vec<i8>,
    /// `[n_tokens × cols / 16]` sums of the quants of each 16-element group (|sum| ≤ 2032).
    group_sums: Vec<i16>,
}

/// The position of element `i` of a block in the group-lane order (see [`Q8Activations`]).
#[inline(always)]
const fn lane_position(i: usize) -> usize {
    let (group, within) = (i / GROUP, i % GROUP);
    64 * (within / 4) + 4 * group + within % 4
}

impl Q8Activations {
    /// Quantises `x` (`[n_tokens × cols]`, row-major).
    ///
    /// # Errors
    /// [`KernelError::NotBlockAligned`] when `cols` is not a multiple of 256;
    /// [`KernelError::ShapeMismatch`] when `x.len() != n_tokens * cols`;
    /// [`KernelError::InvalidParameter`] naming the first non-finite activation.
    pub fn quantize(x: &[f32], n_tokens: usize, cols: usize) -> Result<Self> {
        check_activations(x, n_tokens, cols, Q8_BLOCK, "Q8 activations")?;
        let mut scales = Vec::with_capacity(x.len() / Q8_BLOCK);
        let mut quants = vec![0i8; x.len()];
        let mut group_sums = vec![0i16; x.len() / GROUP];
        #[cfg(target_arch = "x86_64")]
        let simd = SimdLevel::detect() == SimdLevel::Avx512;
        for ((xb, qb), sb) in x
            .chunks_exact(Q8_BLOCK)
            .zip(quants.chunks_exact_mut(Q8_BLOCK))
            .zip(group_sums.chunks_exact_mut(GROUPS))
        {
            #[cfg(target_arch = "x86_64")]
            if simd {
                // SAFETY: `detect()` found AVX-512 F/BW/VL on this CPU.
                scales.push(unsafe { avx512::quantize_block(xb, qb, sb) });
                continue;
            }
            scales.push(quantize_block(xb, qb, sb));
        }
        let mut lane_quants = vec![0i8; x.len()];
        for (qb, lb) in quants
            .chunks_exact(Q8_BLOCK)
            .zip(lane_quants.chunks_exact_mut(Q8_BLOCK))
        {
            for (i, &q) in qb.iter().enumerate() {
                lb[lane_position(i)] = q;
            }
        }
        Ok(Self {
            n_tokens,
            cols,
            scales,
            quants,
            lane_quants,
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

    /// Token `t`'s activation blocks, in order.
    fn token(&self, t: usize) -> TokenBlocks<'_> {
        let blocks = self.cols / Q8_BLOCK;
        TokenBlocks {
            scales: &self.scales[t * blocks..(t + 1) * blocks],
            quants: &self.quants[t * self.cols..(t + 1) * self.cols],
            lane_quants: &self.lane_quants[t * self.cols..(t + 1) * self.cols],
            group_sums: &self.group_sums[t * blocks * GROUPS..(t + 1) * blocks * GROUPS],
        }
    }
}

/// Checks a batch of activation rows before quantisation: `cols` a multiple of `block`,
/// `x.len() == n_tokens * cols`, every value finite (the first bad one is named).
///
/// # Errors
/// [`KernelError::NotBlockAligned`], [`KernelError::ShapeMismatch`],
/// [`KernelError::InvalidParameter`] as above; `what` names the format in the first.
pub(crate) fn check_activations(
    x: &[f32],
    n_tokens: usize,
    cols: usize,
    block: usize,
    what: &'static str,
) -> Result<()> {
    if !cols.is_multiple_of(block) {
        return Err(KernelError::NotBlockAligned {
            quant: what,
            len: cols,
            block_len: block,
        });
    }
    check_len("activations [n_tokens x cols]", n_tokens * cols, x.len())?;
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(KernelError::InvalidParameter {
            what: "activation",
            reason: format!("element {i} (token {}) is {}", i / cols.max(1), x[i]),
        });
    }
    Ok(())
}

/// Symmetric 8-bit quantisation of one block of finite values: `q = round(x · 127 / amax)`
/// (f32, half away from zero, clamped to ±127; all zeros when `amax = 0`). Returns `amax`.
pub(crate) fn quantize_to_i8(x: &[f32], quants: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if amax > 0.0 {
        let inv = 127.0 / amax;
        for (q, &v) in quants.iter_mut().zip(x) {
            *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
        }
    } else {
        quants.fill(0);
    }
    amax
}

/// Quantises one block of [`Q8_BLOCK`] finite values into `quants` and the 16-element
/// `group_sums` (module docs), returning its scale. The reference for the SIMD version.
fn quantize_block(x: &[f32], quants: &mut [i8], group_sums: &mut [i16]) -> f32 {
    let amax = quantize_to_i8(x, quants);
    for (sum, g) in group_sums.iter_mut().zip(quants.chunks_exact(GROUP)) {
        *sum = g.iter().map(|&q| i16::from(q)).sum();
    }
    amax / 127.0
}

#[cfg(all(test, target_arch = "x86_64"))]
#[test]
fn simd_quantisation_equals_the_reference_including_ties() {
    if SimdLevel::detect() != SimdLevel::Avx512 {
        return;
    }
    let mut rng = super::testutil::TestRng(7);
    for case in 0..64 {
        let x: Vec<f32> = match case % 4 {
            // amax = 127 makes inv = 1: exact halves, the rounding ties
            0 => (0..256)
                .map(|i| {
                    if i == 0 {
                        127.0
                    } else {
                        (i % 255) as f32 - 127.5
                    }
                })
                .collect(),
            1 => vec![0.0; 256],
            _ => (0..256).map(|_| rng.uniform(-4.0, 4.0)).collect(),
        };
        let (mut q_ref, mut s_ref) = (vec![0i8; 256], vec![0i16; 16]);
        let (mut q_simd, mut s_simd) = (vec![1i8; 256], vec![1i16; 16]);
        let d_ref = quantize_block(&x, &mut q_ref, &mut s_ref);
        // SAFETY: AVX-512 was detected above.
        let d_simd = unsafe { avx512::quantize_block(&x, &mut q_simd, &mut s_simd) };
        assert_eq!(
            (d_ref.to_bits(), &q_ref, &s_ref),
            (d_simd.to_bits(), &q_simd, &s_simd),
            "case {case}"
        );
    }
}

/// One token's quantised activations (`blocks = cols / 256` blocks).
#[derive(Clone, Copy)]
struct TokenBlocks<'a> {
    scales: &'a [f32],
    quants: &'a [i8],
    lane_quants: &'a [i8],
    group_sums: &'a [i16],
}

impl TokenBlocks<'_> {
    #[inline(always)]
    fn quants(&self, block: usize) -> &[i8] {
        &self.quants[block * Q8_BLOCK..(block + 1) * Q8_BLOCK]
    }
    #[inline(always)]
    fn sums(&self, block: usize) -> &[i16] {
        &self.group_sums[block * GROUPS..(block + 1) * GROUPS]
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
    let supported = int8_supported(w.quant_type());
    if !check_int8_product(w, supported, acts.n_tokens, acts.cols, out, level)? {
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
                // SAFETY: `level.ensure_available()` succeeded: AVX2 and FMA are present.
                unsafe { avx2::rows(w, acts, first_row, chunk) }
            }
            _ => rows_generic::<SCALAR>(w, acts, first_row, chunk),
        },
    );
    Ok(())
}

/// Kernel selector for [`rows_generic`]: portable.
const SCALAR: u8 = 0;
/// AVX2 kernels (only inside [`avx2::rows`]).
#[cfg(target_arch = "x86_64")]
const AVX2: u8 = 1;
/// AVX-512 BW + VNNI kernels (only inside [`avx512::rows`]).
#[cfg(target_arch = "x86_64")]
const AVX512: u8 = 2;

/// Rows `first_row ..` into `out` (`[rows × n_tokens]`); `K` selects the kernels.
#[inline(always)]
fn rows_generic<const K: u8>(
    w: &QuantMatrix<'_>,
    acts: &Q8Activations,
    first_row: usize,
    out: &mut [f32],
) {
    let n = acts.n_tokens;
    let ty = w.quant_type();
    for (i, out_row) in out.chunks_exact_mut(n).enumerate() {
        let row = w.row(first_row + i);
        for_token_groups!(n, [1, 2, 3, 4], t, G => {
            let tokens: [TokenBlocks<'_>; G] = std::array::from_fn(|g| acts.token(t + g));
            let sums = match (K, ty) {
                // SAFETY: K == AVX512 only inside `avx512::rows`, reached after the CPU check;
                // the activations have the row's block count (checked by the caller).
                #[cfg(target_arch = "x86_64")]
                (AVX512, QuantType::Q4_K) => unsafe { avx512::q4k_row::<G>(row, tokens) },
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                (AVX512, _) => unsafe { avx512::q6k_row::<G>(row, tokens) },
                // SAFETY: K == AVX2 only inside `avx2::rows`, reached after the CPU check.
                #[cfg(target_arch = "x86_64")]
                (AVX2, QuantType::Q4_K) => unsafe { avx2::q4k_row::<G>(row, tokens) },
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                (AVX2, _) => unsafe { avx2::q6k_row::<G>(row, tokens) },
                _ => scalar_row::<G>(ty, row, tokens),
            };
            out_row[t..t + G].copy_from_slice(&sums);
        });
    }
}

/// The lane fold at the end of a row (module docs).
#[inline(always)]
fn fold_lanes(acc: [f32; ACC_LANES]) -> f32 {
    let h = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    (h[0] + h[2]) + (h[1] + h[3])
}

/// The portable kernel: one row against `G` tokens, lane by lane as the module docs define.
fn scalar_row<const G: usize>(ty: QuantType, row: &[u8], tokens: [TokenBlocks<'_>; G]) -> [f32; G] {
    let mut acc = [[0.0f32; ACC_LANES]; G];
    for (sb, block) in row.chunks_exact(ty.block_bytes()).enumerate() {
        for (lanes, tok) in acc.iter_mut().zip(&tokens) {
            let (a, gs, da) = (tok.quants(sb), tok.sums(sb), tok.scales[sb]);
            if ty == QuantType::Q4_K {
                let (isum, msum) = q4k_lanes(block, a, gs);
                let dd = le_f16(block, 0) * da;
                let ndm = -(le_f16(block, 2) * da);
                for l in 0..ACC_LANES {
                    lanes[l] = dd.mul_add(isum[l] as f32, lanes[l]);
                    lanes[l] = ndm.mul_add(msum[l] as f32, lanes[l]);
                }
            } else {
                let isum = q6k_lanes(block, a, gs);
                let dd = le_f16(block, 208) * da;
                for l in 0..ACC_LANES {
                    lanes[l] = dd.mul_add(isum[l] as f32, lanes[l]);
                }
            }
        }
    }
    acc.map(fold_lanes)
}

/// The six-bit scales and mins of a Q4_K block, unpacked a 32-bit word at a time (the same
/// values as [`k_scale_min`], without per-element branches), each as 8 bytes.
#[inline(always)]
fn q4k_scales_mins(block: &[u8]) -> (u64, u64) {
    let word =
        |i: usize| u32::from_le_bytes([block[4 + i], block[5 + i], block[6 + i], block[7 + i]]);
    let (w0, w1, w2) = (word(0), word(4), word(8));
    let low6 = 0x3f3f_3f3f;
    let (nib, top2) = (0x0f0f_0f0f, 0x3030_3030);
    let sc_hi = (w2 & nib) | ((w0 >> 2) & top2);
    let m_hi = ((w2 >> 4) & nib) | ((w1 >> 2) & top2);
    let join = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    (join(w0 & low6, sc_hi), join(w1 & low6, m_hi))
}

/// The sixteen group dot products `g_k = Σ_{i∈k} q_i a_i` of one super-block (module docs), for
/// weight quants given element by element.
#[inline(always)]
fn group_dots(quant: impl Fn(usize) -> u8, a: &[i8]) -> [i32; GROUPS] {
    std::array::from_fn(|k| {
        (GROUP * k..GROUP * (k + 1))
            .map(|i| i32::from(quant(i)) * i32::from(a[i]))
            .sum()
    })
}

/// Lane `l` of the module docs: `s_l + s_{l+8}`.
#[inline(always)]
fn pair_groups(s: [i32; GROUPS]) -> [i32; ACC_LANES] {
    std::array::from_fn(|l| s[l] + s[l + ACC_LANES])
}

/// Q4_K integer lanes of one super-block (`block` = 144 bytes, `a` = 256 activation quants,
/// `gs` = their 16 group sums): `(isum, msum)` as the module docs define.
#[inline(always)]
fn q4k_lanes(block: &[u8], a: &[i8], gs: &[i16]) -> ([i32; ACC_LANES], [i32; ACC_LANES]) {
    let (sc, m) = q4k_scales_mins(block);
    let (sc, m) = (sc.to_le_bytes(), m.to_le_bytes());
    let qs = &block[16..144];
    // element i of sub-block j = i / 32: byte 32 (j / 2) + i mod 32, low nibble for even j
    let quant = |i: usize| (qs[32 * (i / 64) + i % 32] >> (4 * ((i / 32) % 2))) & 15;
    let g = group_dots(quant, a);
    let s = std::array::from_fn(|k| i32::from(sc[k / 2]) * g[k]);
    let msum = std::array::from_fn(|l| {
        i32::from(m[l]) * (i32::from(gs[2 * l]) + i32::from(gs[2 * l + 1]))
    });
    (pair_groups(s), msum)
}

/// Q6_K integer lanes of one super-block (`block` = 210 bytes), as the module docs define.
#[inline(always)]
fn q6k_lanes(block: &[u8], a: &[i8], gs: &[i16]) -> [i32; ACC_LANES] {
    let sc = |k: usize| i32::from(block[192 + k] as i8);
    // element i: half h = i / 128, run r = (i mod 128) / 32, column l = i mod 32
    let quant = |i: usize| {
        let (h, r, l) = (i / 128, (i % 128) / 32, i % 32);
        let low = (block[64 * h + 32 * (r % 2) + l] >> (4 * (r / 2))) & 15;
        let high = (block[128 + 32 * h + l] >> (2 * r)) & 3;
        low | (high << 4)
    };
    let g = group_dots(quant, a);
    pair_groups(std::array::from_fn(|k| {
        sc(k) * (g[k] - 32 * i32::from(gs[k]))
    }))
}

#[cfg(test)]
#[test]
fn word_wise_k_scales_match_the_definition() {
    let mut rng = super::testutil::TestRng(41);
    for _ in 0..200 {
        let block: Vec<u8> = (0..16).map(|_| rng.next_u64() as u8).collect();
        let (sc, m) = q4k_scales_mins(&block);
        let (sc, m) = (sc.to_le_bytes(), m.to_le_bytes());
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
    //! The AVX2 kernels: `vpmaddubsw` u8×i8 pair sums and `vpmaddwd` by the scale give each
    //! 32-run's eight lanes directly; lanes accumulate in registers across the super-block.

    use super::{fold_lanes, q4k_scales_mins, rows_generic, Q8Activations, QuantMatrix};
    use super::{TokenBlocks, ACC_LANES};
    use std::arch::x86_64::*;

    /// [`rows_generic`] compiled for AVX2.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows(
        w: &QuantMatrix<'_>,
        acts: &Q8Activations,
        first_row: usize,
        out: &mut [f32],
    ) {
        rows_generic::<{ super::AVX2 }>(w, acts, first_row, out)
    }

    /// Loads 32 bytes from `s[at..at + 32 / size_of::<T>()]` (bounds checked).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load<T>(s: &[T], at: usize) -> __m256i {
        let bytes = &s[at..at + 32 / size_of::<T>()];
        // SAFETY: `bytes` spans exactly 32 readable bytes; unaligned loads are allowed.
        unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
    }

    /// The two f16 values at `block[at..at + 4]` as f32 (exact conversion); a missing second
    /// value (the block ends after the first) reads as zero.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn f16_pair(block: &[u8], at: usize) -> (f32, f32) {
        let byte = |i: usize| block.get(at + i).copied().unwrap_or(0);
        let bits = u32::from_le_bytes([byte(0), byte(1), byte(2), byte(3)]);
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }

    /// Folds eight lanes in the module's order.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn fold(v: __m256) -> f32 {
        let mut lanes = [0.0f32; ACC_LANES];
        // SAFETY: `lanes` is 32 writable bytes; unaligned stores are allowed.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
        fold_lanes(lanes)
    }

    /// Dword order of the group sums [`group_dots8`] returns: lane `j` holds group `PI[j]`
    /// of the first eight (and `8 + PI[j]` of the second register).
    const PI: [i32; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

    /// `v`'s eight i32 lanes permuted by [`PI`] (lane `j` takes lane `PI[j]`).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn by_pi(v: __m256i) -> __m256i {
        // SAFETY: `PI` is 32 readable bytes; unaligned loads are allowed.
        let idx = unsafe { _mm256_loadu_si256(PI.as_ptr().cast()) };
        _mm256_permutevar8x32_epi32(v, idx)
    }

    /// The sixteen group dot products of one super-block from its eight 32-element weight
    /// registers (element order) and activation quants `a`: `(g_lo, g_hi)` with lane `j`
    /// holding `g_{PI[j]}` and `g_{8 + PI[j]}`. `vpmaddubsw` pair sums (at most 2·63·127, no
    /// saturation for 4- and 6-bit quants), `vpmaddwd` by one into 4-element sums, then two
    /// rounds of `vphaddd`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn group_dots8(w: &[__m256i; 8], a: &[i8]) -> (__m256i, __m256i) {
        let ones = _mm256_set1_epi16(1);
        let u: [__m256i; 8] = std::array::from_fn(|s| {
            _mm256_madd_epi16(_mm256_maddubs_epi16(w[s], load(a, 32 * s)), ones)
        });
        let pairs: [__m256i; 4] =
            std::array::from_fn(|p| _mm256_hadd_epi32(u[2 * p], u[2 * p + 1]));
        (
            _mm256_hadd_epi32(pairs[0], pairs[1]),
            _mm256_hadd_epi32(pairs[2], pairs[3]),
        )
    }

    /// Folds eight lanes held in [`PI`] order in the module's order.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn fold_pi(v: __m256) -> f32 {
        let mut held = [0.0f32; ACC_LANES];
        // SAFETY: `held` is 32 writable bytes; unaligned stores are allowed.
        unsafe { _mm256_storeu_ps(held.as_mut_ptr(), v) };
        let mut lanes = [0.0f32; ACC_LANES];
        for (j, &p) in PI.iter().enumerate() {
            lanes[p as usize] = held[j];
        }
        fold_lanes(lanes)
    }

    /// Q4_K row against `G` tokens (module docs); the float lanes are held in [`PI`] order.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4k_row<const G: usize>(
        row: &[u8],
        tokens: [TokenBlocks<'_>; G],
    ) -> [f32; G] {
        let mask = _mm256_set1_epi8(15);
        let mut acc = [_mm256_setzero_ps(); G];
        for (sb, block) in row.chunks_exact(144).enumerate() {
            let (d, dmin) = f16_pair(block, 0);
            let (sc, m) = q4k_scales_mins(block);
            // group PI[j] lies in sub-block PI[j] / 2 = j mod 4 (and 8 + PI[j] in 4 + j mod 4)
            let sc32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(sc as i64));
            let sc_lo = _mm256_permute2x128_si256::<0x00>(sc32, sc32);
            let sc_hi = _mm256_permute2x128_si256::<0x11>(sc32, sc32);
            let m8 = _mm_cvtsi64_si128(m as i64);
            let m16 = by_pi(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)));
            let w: [__m256i; 8] = std::array::from_fn(|s| {
                let q4 = load(block, 16 + 32 * (s / 2));
                let q4 = if s % 2 == 0 {
                    q4
                } else {
                    _mm256_srli_epi16::<4>(q4)
                };
                _mm256_and_si256(q4, mask)
            });
            for g in 0..G {
                let da = tokens[g].scales[sb];
                let (g_lo, g_hi) = group_dots8(&w, tokens[g].quants(sb));
                let isum = _mm256_add_epi32(
                    _mm256_mullo_epi32(g_lo, sc_lo),
                    _mm256_mullo_epi32(g_hi, sc_hi),
                );
                let msum = _mm256_madd_epi16(by_pi(load(tokens[g].sums(sb), 0)), m16);
                acc[g] = _mm256_fmadd_ps(_mm256_set1_ps(d * da), _mm256_cvtepi32_ps(isum), acc[g]);
                acc[g] = _mm256_fmadd_ps(
                    _mm256_set1_ps(-(dmin * da)),
                    _mm256_cvtepi32_ps(msum),
                    acc[g],
                );
            }
        }
        acc.map(|v| fold_pi(v))
    }

    /// Q6_K row against `G` tokens (module docs); the float lanes are held in [`PI`] order.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q6k_row<const G: usize>(
        row: &[u8],
        tokens: [TokenBlocks<'_>; G],
    ) -> [f32; G] {
        let m4 = _mm256_set1_epi8(15);
        let m30 = _mm256_set1_epi8(0x30);
        let mut acc = [_mm256_setzero_ps(); G];
        for (sb, b) in row.chunks_exact(210).enumerate() {
            let (d, _) = f16_pair(b, 208);
            let sc_bytes = &b[192..208];
            // SAFETY: 16 readable bytes; unaligned loads are allowed.
            let sc128 = unsafe { _mm_loadu_si128(sc_bytes.as_ptr().cast()) };
            let sc_lo = by_pi(_mm256_cvtepi8_epi32(sc128));
            let sc_hi = by_pi(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(sc128, sc128)));
            let mut w = [_mm256_setzero_si256(); 8];
            for h in 0..2 {
                let ql0 = load(b, 64 * h);
                let ql1 = load(b, 64 * h + 32);
                let qh = load(b, 128 + 32 * h);
                let low = [
                    _mm256_and_si256(ql0, m4),
                    _mm256_and_si256(ql1, m4),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                ];
                let high = [
                    _mm256_slli_epi16::<4>(qh),
                    _mm256_slli_epi16::<2>(qh),
                    qh,
                    _mm256_srli_epi16::<2>(qh),
                ];
                for run in 0..4 {
                    w[4 * h + run] = _mm256_or_si256(low[run], _mm256_and_si256(high[run], m30));
                }
            }
            for g in 0..G {
                let (g_lo, g_hi) = group_dots8(&w, tokens[g].quants(sb));
                // SAFETY: the block's 16 group sums are 32 readable bytes.
                let gs = unsafe { _mm256_loadu_si256(tokens[g].sums(sb).as_ptr().cast()) };
                let gs_lo = by_pi(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(gs)));
                let gs_hi = by_pi(_mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(gs)));
                let isum = _mm256_add_epi32(
                    _mm256_mullo_epi32(
                        _mm256_sub_epi32(g_lo, _mm256_slli_epi32::<5>(gs_lo)),
                        sc_lo,
                    ),
                    _mm256_mullo_epi32(
                        _mm256_sub_epi32(g_hi, _mm256_slli_epi32::<5>(gs_hi)),
                        sc_hi,
                    ),
                );
                let dd = _mm256_set1_ps(d * tokens[g].scales[sb]);
                acc[g] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum), acc[g]);
            }
        }
        acc.map(|v| fold_pi(v))
    }
}

// The AVX-512 intrinsics are stable since Rust 1.89, the workspace's `rust-version`.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! The AVX-512 kernels: each block's weight quants are decoded into four registers laid out
    //! by group lanes (register `c`, 32-bit lane `k` = bytes `4c .. 4c+4` of group `k`, the
    //! layout of [`Q8Activations`]'s lane quants), once per block for every token of the group.
    //! Per token, four `vpdpbusd` (u8 × i8, four products per lane) into one accumulator give
    //! the sixteen group dot products, one multiply applies the group scales, and a fold of the
    //! two halves gives the module's eight lanes. Activations are read by raw pointer (the
    //! caller's slices were length-checked).

    use super::avx2::{f16_pair, fold};
    use super::{q4k_scales_mins, rows_generic, Q8Activations, QuantMatrix, TokenBlocks};
    use std::arch::x86_64::*;

    /// [`rows_generic`] compiled for AVX-512.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn rows(
        w: &QuantMatrix<'_>,
        acts: &Q8Activations,
        first_row: usize,
        out: &mut [f32],
    ) {
        rows_generic::<{ super::AVX512 }>(w, acts, first_row, out)
    }

    /// [`super::quantize_block`], sixteen values at a time: the same scale, quants and sums
    /// (round half away from zero as truncation plus a ±1 step where the exact remainder is
    /// at least one half).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, BW and VL.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn quantize_block(
        x: &[f32],
        quants: &mut [i8],
        group_sums: &mut [i16],
    ) -> f32 {
        let xs: [__m512; 16] = std::array::from_fn(|i| {
            let v = &x[16 * i..16 * i + 16];
            // SAFETY: 16 readable f32; unaligned loads are allowed.
            unsafe { _mm512_loadu_ps(v.as_ptr()) }
        });
        let amax = _mm512_reduce_max_ps(xs.iter().fold(_mm512_setzero_ps(), |m, &v| {
            _mm512_max_ps(m, _mm512_abs_ps(v))
        }));
        if amax > 0.0 {
            let inv = _mm512_set1_ps(127.0 / amax);
            let (half, one, minus_one, zero) = (
                _mm512_set1_ps(0.5),
                _mm512_set1_ps(1.0),
                _mm512_set1_ps(-1.0),
                _mm512_setzero_ps(),
            );
            let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
            for (i, &v) in xs.iter().enumerate() {
                let v = _mm512_mul_ps(v, inv);
                let whole = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
                let rest = _mm512_abs_ps(_mm512_sub_ps(v, whole));
                let negative = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, zero);
                let step = _mm512_mask_blend_ps(negative, one, minus_one);
                let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(rest, half);
                let r = _mm512_min_ps(
                    _mm512_max_ps(_mm512_mask_add_ps(whole, up, whole, step), lo),
                    hi,
                );
                let qi = _mm512_cvtps_epi32(r);
                let out = &mut quants[16 * i..16 * i + 16];
                // SAFETY: `out` is 16 writable bytes; unaligned stores are allowed.
                unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(qi)) };
                group_sums[i] = _mm512_reduce_add_epi32(qi) as i16;
            }
        } else {
            quants.fill(0);
            group_sums.fill(0);
        }
        amax / 127.0
    }

    /// Bytes ahead of the current weight block to prefetch: the weights stream from DRAM
    /// once per product, and a software prefetch this far ahead keeps more requests in flight
    /// than the hardware prefetchers alone.
    const PREFETCH_DISTANCE: usize = 2048;

    /// Hints the cache lines `PREFETCH_DISTANCE` bytes after `block`'s start (a hint: an
    /// address past the matrix is harmless, it is never dereferenced).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn prefetch_ahead(block: &[u8]) {
        let ahead = block.as_ptr().wrapping_add(PREFETCH_DISTANCE);
        // Prefetching is a hint that never faults, whatever the address (a safe intrinsic).
        for line in 0..4 {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line).cast());
        }
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
    fn load256<T>(s: &[T], at: usize) -> __m256i {
        let bytes = &s[at..at + 32 / size_of::<T>()];
        // SAFETY: `bytes` spans exactly 32 readable bytes; unaligned loads are allowed.
        unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
    }

    /// The eight lanes of a 16-lane integer accumulator (two 32-runs) as f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    fn fold16(v: __m512i) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_add_epi32(
            _mm512_castsi512_si256(v),
            _mm512_extracti64x4_epi64::<1>(v),
        ))
    }

    /// Raw pointers to token `g`'s activation block `sb`: lane quants, group sums, scale.
    ///
    /// # Safety
    /// `sb` must be below the tokens' block count (the row and the activations were checked to
    /// have the same number of columns).
    #[inline(always)]
    unsafe fn block_ptrs(tok: &TokenBlocks<'_>, sb: usize) -> (*const i8, *const i16, *const f32) {
        debug_assert!(sb < tok.scales.len());
        // SAFETY: `sb < blocks`, so all three offsets stay inside the token's slices.
        unsafe {
            (
                tok.lane_quants.as_ptr().add(sb * super::Q8_BLOCK),
                tok.group_sums.as_ptr().add(sb * super::GROUPS),
                tok.scales.as_ptr().add(sb),
            )
        }
    }

    /// `vpermt2d` indices that gather registers `c` and `c + 1` (`first = c`) of the group-lane
    /// layout, lanes `0 .. 8`, from two source registers: output dword `o` is lane `k = o mod 8`
    /// of register `first + o / 8`, found at dword [`q6k_at`] of the pair (bit 4 selects
    /// the second source). Evaluated at compile time.
    const fn pair_index(first: usize) -> [i32; 16] {
        let mut idx = [0i32; 16];
        let mut o = 0;
        while o < 16 {
            let (k, c) = (o % 8, first + o / 8);
            idx[o] = q6k_at(k, c) as i32;
            o += 1;
        }
        idx
    }

    /// Q4_K: byte `b` of qs[0..64] holds element `b mod 32` of sub-blocks `2 (b / 32)` (low
    /// nibble) and `2 (b / 32) + 1` (high nibble); qs[64..128] likewise for sub-blocks 4..8.
    /// Group k (< 8) of register c is sub-block k / 2, bytes 16 (k mod 2) + 4c: raw dword
    /// 4 (k mod 2) + c + 8 (k / 4) of qs[0..64], high nibble when k / 2 is odd; group k + 8
    /// the same dword of qs[64..128] (bit 4 of the index).
    const fn q4k_raw_index(c: usize) -> [i32; 16] {
        let mut idx = [0i32; 16];
        let mut k = 0;
        while k < 16 {
            let kk = k % 8;
            idx[k] = (4 * (kk % 2) + c + 8 * (kk / 4) + 16 * (k / 8)) as i32;
            k += 1;
        }
        idx
    }
    const Q4K_INDEX: [[i32; 16]; 4] = [
        q4k_raw_index(0),
        q4k_raw_index(1),
        q4k_raw_index(2),
        q4k_raw_index(3),
    ];
    /// Lanes `k` whose group takes the high nibble (`(k mod 8) / 2` odd).
    const Q4K_HIGH_NIBBLE: __mmask16 = 0xCCCC;

    /// Q6_K: element-order registers n_q hold elements 64q .. 64q+64; group k of register c is
    /// dword 4 (k mod 4) + c of n_{k/4}: groups 0..8 from (n_0, n_1), 8.. from (n_2, n_3).
    const fn q6k_at(k: usize, c: usize) -> usize {
        4 * (k % 4) + c + 16 * ((k / 4) % 2)
    }
    const Q6K_INDEX: [[i32; 16]; 2] = [pair_index(0), pair_index(2)];

    /// The two index registers of a `*_INDEX` table.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn index_registers<const N: usize>(table: &[[i32; 16]; N]) -> [__m512i; N] {
        // SAFETY: each row is 64 readable bytes; unaligned loads are allowed.
        table.map(|row| unsafe { _mm512_loadu_si512(row.as_ptr().cast()) })
    }

    /// Assembles the four group-lane registers from `vpermt2d` results: `low[p]` holds lanes
    /// `0 .. 8` of registers `2p` and `2p + 1`, `high[p]` their lanes `8 .. 16`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn join_pairs(low: [__m512i; 2], high: [__m512i; 2]) -> [__m512i; 4] {
        [
            _mm512_shuffle_i64x2::<0x44>(low[0], high[0]),
            _mm512_shuffle_i64x2::<0xEE>(low[0], high[0]),
            _mm512_shuffle_i64x2::<0x44>(low[1], high[1]),
            _mm512_shuffle_i64x2::<0xEE>(low[1], high[1]),
        ]
    }

    /// The sixteen group dot products of one block: `Σ_c vpdpbusd(w_c, a_c)` with the token's
    /// lane quants at `a`. One token uses two accumulator chains (latency); more tokens
    /// interleave instead.
    ///
    /// # Safety
    /// `a` must point to 256 readable bytes; the CPU must support AVX-512 F and VNNI.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn group_dots<const G: usize>(w: &[__m512i; 4], a: *const i8) -> __m512i {
        // SAFETY: `a .. a + 256` is readable (caller); unaligned loads are allowed.
        let load = |c: usize| unsafe { _mm512_loadu_si512(a.add(64 * c).cast()) };
        if G == 1 {
            let even = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], load(0));
            let odd = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], load(1));
            let even = _mm512_dpbusd_epi32(even, w[2], load(2));
            let odd = _mm512_dpbusd_epi32(odd, w[3], load(3));
            _mm512_add_epi32(even, odd)
        } else {
            let mut sum = _mm512_setzero_si512();
            for (c, &wc) in w.iter().enumerate() {
                sum = _mm512_dpbusd_epi32(sum, wc, load(c));
            }
            sum
        }
    }

    /// Q4_K row against `G` tokens (module docs).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C; every token must
    /// have `row.len() / 144` activation blocks.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn q4k_row<const G: usize>(
        row: &[u8],
        tokens: [TokenBlocks<'_>; G],
    ) -> [f32; G] {
        let mask = _mm512_set1_epi8(15);
        let idx = index_registers(&Q4K_INDEX);
        let mut acc = [_mm256_setzero_ps(); G];
        for (sb, block) in row.chunks_exact(144).enumerate() {
            prefetch_ahead(block);
            let (d, dmin) = f16_pair(block, 0);
            let (dv, ndminv) = (_mm256_set1_ps(d), _mm256_set1_ps(-dmin));
            let (sc, m) = q4k_scales_mins(block);
            // group k's scale sc_{k/2} as the low i16 of lane k (the high i16 zero)
            let sc8 = _mm_cvtsi64_si128(sc as i64);
            let sc32 = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(sc8, sc8));
            let m8 = _mm_cvtsi64_si128(m as i64);
            let m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
            let (low, high) = (load512(block, 16), load512(block, 80));
            let w: [__m512i; 4] = std::array::from_fn(|c| {
                let raw = _mm512_permutex2var_epi32(low, idx[c], high);
                let shifted = _mm512_mask_srli_epi32::<4>(raw, Q4K_HIGH_NIBBLE, raw);
                _mm512_and_si512(shifted, mask)
            });
            for g in 0..G {
                // SAFETY: `sb` is below the block count (caller), so the block's 256 quants,
                // 16 sums and its scale are readable; unaligned loads are allowed.
                unsafe {
                    let (a, sums, da) = block_ptrs(&tokens[g], sb);
                    // |g_k| ≤ 16·15·127 < 2^15: the low i16 of each lane is the whole value,
                    // so `vpmaddwd` by (sc, 0) is the 32-bit product
                    let scaled = _mm512_madd_epi16(group_dots::<G>(&w, a), sc32);
                    let isum = fold16(scaled);
                    let msum = _mm256_madd_epi16(_mm256_loadu_si256(sums.cast()), m16);
                    let da = _mm256_broadcast_ss(&*da);
                    acc[g] = _mm256_fmadd_ps(_mm256_mul_ps(dv, da), isum, acc[g]);
                    acc[g] = _mm256_fmadd_ps(
                        _mm256_mul_ps(ndminv, da),
                        _mm256_cvtepi32_ps(msum),
                        acc[g],
                    );
                }
            }
        }
        acc.map(|v| fold(v))
    }

    /// Q6_K row against `G` tokens (module docs).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C; every token must
    /// have `row.len() / 210` activation blocks.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn q6k_row<const G: usize>(
        row: &[u8],
        tokens: [TokenBlocks<'_>; G],
    ) -> [f32; G] {
        let m4 = _mm512_set1_epi8(15);
        let m30 = _mm512_set1_epi8(0x30);
        let idx = index_registers(&Q6K_INDEX);
        let mut acc = [_mm256_setzero_ps(); G];
        for (sb, b) in row.chunks_exact(210).enumerate() {
            prefetch_ahead(b);
            let (d, _) = f16_pair(b, 208);
            let dv = _mm256_set1_ps(d);
            let sc_bytes = &b[192..208];
            // SAFETY: 16 readable bytes; unaligned loads are allowed.
            let sc32 = _mm512_cvtepi8_epi32(unsafe { _mm_loadu_si128(sc_bytes.as_ptr().cast()) });
            let mut n = [_mm512_setzero_si512(); 4];
            for h in 0..2 {
                let ql = load512(b, 64 * h);
                let qh = load256(b, 128 + 32 * h);
                let join = |lo: __m256i, hi: __m256i| {
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
                };
                let hi01 = join(_mm256_slli_epi16::<4>(qh), _mm256_slli_epi16::<2>(qh));
                let hi23 = join(qh, _mm256_srli_epi16::<2>(qh));
                n[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(hi01, m30));
                n[2 * h + 1] = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                    _mm512_and_si512(hi23, m30),
                );
            }
            let gather = |lo: __m512i, hi: __m512i| {
                [
                    _mm512_permutex2var_epi32(lo, idx[0], hi),
                    _mm512_permutex2var_epi32(lo, idx[1], hi),
                ]
            };
            let w = join_pairs(gather(n[0], n[1]), gather(n[2], n[3]));
            for g in 0..G {
                // SAFETY: as in `q4k_row`.
                unsafe {
                    let (a, sums, da) = block_ptrs(&tokens[g], sb);
                    let gs = _mm512_cvtepi16_epi32(_mm256_loadu_si256(sums.cast()));
                    let centred =
                        _mm512_sub_epi32(group_dots::<G>(&w, a), _mm512_slli_epi32::<5>(gs));
                    let isum = fold16(_mm512_mullo_epi32(centred, sc32));
                    let dd = _mm256_mul_ps(dv, _mm256_broadcast_ss(&*da));
                    acc[g] = _mm256_fmadd_ps(dd, isum, acc[g]);
                }
            }
        }
        acc.map(|v| fold(v))
    }
}
