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
//! **Integer core, one pair of integers per super-block.** The weight quants meet the
//! activation quants in exact 32-bit integer arithmetic:
//! - Q4_K (sub-block `j` = elements `32j .. 32j+32` with scale `sc_j`, min `m_j`, quants
//!   `0..16`): `I = Σ_j sc_j · Σ_{i∈j} q_i a_i` and `M = Σ_j m_j · (gs_{2j} + gs_{2j+1})`
//!   (|I| < 2^25, |M| < 2^21);
//! - Q6_K (group `k` = elements `16k .. 16k+16` with signed scale `sc_k`, quants `0..64` with
//!   offset 32): `I = Σ_k sc_k · (Σ_{i∈k} q_i a_i − 32 gs_k)` (|I| < 2^28).
//!
//! Integer sums do not depend on order, so every kernel (portable, AVX2, and the AVX-512
//! kernels over the row-interleaved layout of [`super::int8_packed`]) produces the same
//! integers however it groups the products.
//!
//! **Float accumulation** (one token, one row): `acc = 0`; for each super-block in order, with
//! `d`/`dmin` the block's f16 scales and `da` the activation block's scale, `dd = d·da` and
//! `ndm = −(dmin·da)` (rounded f32 products), and `f(x)` the integer converted to f32 (round to
//! nearest even): Q4_K `acc = fma(dd, f(I), acc)` then `acc = fma(ndm, f(M), acc)`; Q6_K
//! `acc = fma(dd, f(I), acc)`. The result is `acc`. It depends only on the token's activations
//! and the weight row: batch-invariant, thread-split-invariant and bit-identical on every
//! [`SimdLevel`] and layout. One accumulator per output keeps the float work per block to one or
//! two fused multiply-adds, which is what lets the AVX-512 kernels put sixteen rows in one
//! register (see [`super::int8_packed`]).

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
pub(crate) const GROUPS: usize = Q8_BLOCK / GROUP;
/// Q4_K sub-blocks (of 32 elements) per block.
pub(crate) const SUB_BLOCKS: usize = 8;

/// Whether [`quant_matmul_int8`] accepts weights of this type (Q4_K and Q6_K).
pub fn int8_supported(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q4_K | QuantType::Q6_K)
}

/// A batch of activation rows quantised to 8 bits in blocks of [`Q8_BLOCK`] (see the module
/// docs). Quantise once and reuse for every matrix that reads the same input (Q/K/V, gate/up).
///
/// Besides the quants and scales it keeps, per block, the sums the weight types' offsets need:
/// the sixteen 16-element group sums `gs_k`, the eight 32-element sub-block sums
/// `gs_{2j} + gs_{2j+1}` (Q4_K mins) and `−32 gs_k` as 32-bit integers (the Q6_K offset, the
/// starting value of a group's integer dot product).
#[derive(Debug, Clone, PartialEq)]
pub struct Q8Activations {
    n_tokens: usize,
    cols: usize,
    /// `[n_tokens × cols / 256]` block scales.
    scales: Vec<f32>,
    /// `[n_tokens × cols]` quants, in element order.
    quants: Vec<i8>,
    /// `[n_tokens × cols / 16]` sums of the quants of each 16-element group (|sum| ≤ 2032).
    group_sums: Vec<i16>,
    /// `[n_tokens × cols / 32]` sums of each 32-element sub-block (|sum| ≤ 4064).
    subblock_sums: Vec<i16>,
    /// `[n_tokens × cols / 16]` `−32 · gs_k`.
    offset_sums: Vec<i32>,
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
                scales.push(unsafe { avx512::quantize_groups::<GROUPS>(xb, qb, sb) });
                continue;
            }
            scales.push(quantize_block(xb, qb, sb));
        }
        let subblock_sums = group_sums.chunks_exact(2).map(|p| p[0] + p[1]).collect();
        let offset_sums = group_sums.iter().map(|&gs| -32 * i32::from(gs)).collect();
        Ok(Self {
            n_tokens,
            cols,
            scales,
            quants,
            group_sums,
            subblock_sums,
            offset_sums,
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
    pub(crate) fn token(&self, t: usize) -> TokenBlocks<'_> {
        let blocks = self.cols / Q8_BLOCK;
        let groups = blocks * GROUPS;
        let subs = blocks * SUB_BLOCKS;
        TokenBlocks {
            scales: &self.scales[t * blocks..(t + 1) * blocks],
            quants: &self.quants[t * self.cols..(t + 1) * self.cols],
            group_sums: &self.group_sums[t * groups..(t + 1) * groups],
            subblock_sums: &self.subblock_sums[t * subs..(t + 1) * subs],
            offset_sums: &self.offset_sums[t * groups..(t + 1) * groups],
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
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `detect()` found AVX-512 on this CPU.
    if SimdLevel::detect() == SimdLevel::Avx512 && unsafe { avx512::all_finite(x) } {
        return Ok(());
    }
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
        let d_simd = unsafe { avx512::quantize_groups::<GROUPS>(&x, &mut q_simd, &mut s_simd) };
        assert_eq!(
            (d_ref.to_bits(), &q_ref, &s_ref),
            (d_simd.to_bits(), &q_simd, &s_simd),
            "case {case}"
        );
        // the same quantiser over the 32-element blocks of `int8_q32`
        for (b, xb) in x.chunks_exact(32).enumerate() {
            let (mut q_ref, mut q_simd, mut s_simd) = ([0i8; 32], [1i8; 32], [1i16; 2]);
            let d_ref = quantize_to_i8(xb, &mut q_ref) / 127.0;
            // SAFETY: AVX-512 was detected above.
            let d_simd = unsafe { avx512::quantize_groups::<2>(xb, &mut q_simd, &mut s_simd) };
            let sums = q_ref
                .chunks_exact(16)
                .map(|g| g.iter().map(|&q| i16::from(q)).sum());
            assert_eq!(
                (d_ref.to_bits(), q_ref, sums.collect::<Vec<i16>>()),
                (d_simd.to_bits(), q_simd, s_simd.to_vec()),
                "case {case}, 32-block {b}"
            );
        }
    }
}

#[cfg(test)]
#[test]
fn every_non_finite_activation_is_found_wherever_it_sits() {
    // lengths with and without a tail past the last 16 values, the bad value in the SIMD
    // part, in the tail, first and last
    for len in [16, 37, 256, 263] {
        for at in [0, 5, len / 2, len - 1] {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut x: Vec<f32> = (0..len).map(|i| i as f32 - 3.5).collect();
                x[at] = bad;
                let err = check_activations(&x, 1, len, 1, "test").unwrap_err();
                assert!(
                    err.to_string().contains(&format!("element {at} ")),
                    "len {len}, at {at}: {err}"
                );
            }
        }
        let x: Vec<f32> = (0..len).map(|i| f32::MAX - i as f32).collect();
        check_activations(&x, 1, len, 1, "test").unwrap();
    }
}

/// One token's quantised activations (`blocks = cols / 256` blocks).
#[derive(Clone, Copy)]
pub(crate) struct TokenBlocks<'a> {
    pub(crate) scales: &'a [f32],
    pub(crate) quants: &'a [i8],
    pub(crate) group_sums: &'a [i16],
    pub(crate) subblock_sums: &'a [i16],
    pub(crate) offset_sums: &'a [i32],
}

impl TokenBlocks<'_> {
    #[inline(always)]
    pub(crate) fn quants(&self, block: usize) -> &[i8] {
        &self.quants[block * Q8_BLOCK..(block + 1) * Q8_BLOCK]
    }
    #[inline(always)]
    pub(crate) fn sums(&self, block: usize) -> &[i16] {
        &self.group_sums[block * GROUPS..(block + 1) * GROUPS]
    }
    #[inline(always)]
    pub(crate) fn subblock_sums(&self, block: usize) -> &[i16] {
        &self.subblock_sums[block * SUB_BLOCKS..(block + 1) * SUB_BLOCKS]
    }
}

/// One Q4_K super-block's contribution to a token's accumulator (module docs):
/// `fma(−(dmin·da), f(M), fma(d·da, f(I), acc))`.
#[inline(always)]
pub(crate) fn accumulate_q4k(acc: f32, d: f32, dmin: f32, da: f32, isum: i32, msum: i32) -> f32 {
    let acc = (d * da).mul_add(isum as f32, acc);
    (-(dmin * da)).mul_add(msum as f32, acc)
}

/// One Q6_K super-block's contribution to a token's accumulator: `fma(d·da, f(I), acc)`.
#[inline(always)]
pub(crate) fn accumulate_q6k(acc: f32, d: f32, da: f32, isum: i32) -> f32 {
    (d * da).mul_add(isum as f32, acc)
}

/// The integers of one Q4_K super-block against one token's block (module docs), for weight
/// quants given element by element: `(I, M)`.
#[inline(always)]
pub(crate) fn q4k_block_sums(
    quant: impl Fn(usize) -> u8,
    sc: [u8; SUB_BLOCKS],
    m: [u8; SUB_BLOCKS],
    a: &[i8],
    subblock_sums: &[i16],
) -> (i32, i32) {
    let isum = (0..SUB_BLOCKS)
        .map(|j| {
            let dot: i32 = (32 * j..32 * (j + 1))
                .map(|i| i32::from(quant(i)) * i32::from(a[i]))
                .sum();
            i32::from(sc[j]) * dot
        })
        .sum();
    let msum = (0..SUB_BLOCKS)
        .map(|j| i32::from(m[j]) * i32::from(subblock_sums[j]))
        .sum();
    (isum, msum)
}

/// The integer `I` of one Q6_K super-block against one token's block (module docs).
#[inline(always)]
pub(crate) fn q6k_block_sum(
    quant: impl Fn(usize) -> u8,
    sc: [i8; GROUPS],
    a: &[i8],
    group_sums: &[i16],
) -> i32 {
    (0..GROUPS)
        .map(|k| {
            let dot: i32 = (GROUP * k..GROUP * (k + 1))
                .map(|i| i32::from(quant(i)) * i32::from(a[i]))
                .sum();
            i32::from(sc[k]) * (dot - 32 * i32::from(group_sums[k]))
        })
        .sum()
}

/// Quant `i` (0..16) of a raw Q4_K block (144 bytes): element `i` of sub-block `j = i / 32` is
/// byte `32 (j / 2) + i mod 32` of `qs`, low nibble for even `j`.
#[inline(always)]
pub(crate) fn q4k_quant(block: &[u8], i: usize) -> u8 {
    (block[16 + 32 * (i / 64) + i % 32] >> (4 * ((i / 32) % 2))) & 15
}

/// Quant `i` (0..64) of a raw Q6_K block (210 bytes): half `h = i / 128`, run
/// `r = (i mod 128) / 32`, column `l = i mod 32`; low four bits from `ql`, high two from `qh`.
#[inline(always)]
pub(crate) fn q6k_quant(block: &[u8], i: usize) -> u8 {
    let (h, r, l) = (i / 128, (i % 128) / 32, i % 32);
    let low = (block[64 * h + 32 * (r % 2) + l] >> (4 * (r / 2))) & 15;
    let high = (block[128 + 32 * h + l] >> (2 * r)) & 3;
    low | (high << 4)
}

/// The sixteen signed group scales of a raw Q6_K block.
#[inline(always)]
pub(crate) fn q6k_scales(block: &[u8]) -> [i8; GROUPS] {
    std::array::from_fn(|k| block[192 + k] as i8)
}

/// `out = x · Wᵀ` with 8-bit activations: `acts` holds `[n_tokens × w.cols()]`, `out` is
/// `[n_tokens × w.rows()]`, on the CPU's best [`SimdLevel`], over the GGUF layout. See the
/// module docs for the exact arithmetic. The fastest kernels read the row-interleaved copy of
/// the weights instead ([`super::int8_packed`]); the results are bit-identical.
///
/// # Errors
/// [`KernelError::UnsupportedQuantType`] when `!int8_supported(w.quant_type())`;
/// [`KernelError::ShapeMismatch`] when `acts.cols() != w.cols()` or `out` has the wrong length.
pub fn quant_matmul_int8(w: &QuantMatrix<'_>, acts: &Q8Activations, out: &mut [f32]) -> Result<()> {
    quant_matmul_int8_with(w, acts, out, SimdLevel::detect())
}

/// [`quant_matmul_int8`] with an explicit [`SimdLevel`]. Over the GGUF layout, AVX-512 runs the
/// AVX2 kernels (its own kernels need the row-interleaved layout).
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
            SimdLevel::Avx512 | SimdLevel::Avx2 => {
                // SAFETY: `level.ensure_available()` succeeded, and AVX-512 implies AVX2/FMA.
                unsafe { avx2::rows(w, acts, first_row, chunk) }
            }
            _ => rows_generic::<SCALAR>(w, acts, first_row, chunk),
        },
    );
    Ok(())
}

/// Checks the activations against a product's shape: `acts.cols() == cols` and
/// `out.len() == acts.n_tokens() * rows`.
pub(crate) fn check_acts_shape(
    acts: &Q8Activations,
    cols: usize,
    rows: usize,
    out: &[f32],
) -> Result<()> {
    check_len("activation columns", cols, acts.cols)?;
    check_len("output [n_tokens x rows]", acts.n_tokens * rows, out.len())
}

/// Kernel selector for [`rows_generic`]: portable.
const SCALAR: u8 = 0;
/// AVX2 kernels (only inside [`avx2::rows`]).
#[cfg(target_arch = "x86_64")]
const AVX2: u8 = 1;

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
                // SAFETY: K == AVX2 only inside `avx2::rows`, reached after the CPU check;
                // the activations have the row's block count (checked by the caller).
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

/// The portable kernel: one row against `G` tokens, exactly as the module docs define.
fn scalar_row<const G: usize>(ty: QuantType, row: &[u8], tokens: [TokenBlocks<'_>; G]) -> [f32; G] {
    let mut acc = [0.0f32; G];
    for (sb, block) in row.chunks_exact(ty.block_bytes()).enumerate() {
        for (acc, tok) in acc.iter_mut().zip(&tokens) {
            let (a, da) = (tok.quants(sb), tok.scales[sb]);
            if ty == QuantType::Q4_K {
                let (sc, m) = q4k_scales_mins(block);
                let quant = |i| q4k_quant(block, i);
                let (isum, msum) = q4k_block_sums(
                    quant,
                    sc.to_le_bytes(),
                    m.to_le_bytes(),
                    a,
                    tok.subblock_sums(sb),
                );
                *acc = accumulate_q4k(*acc, le_f16(block, 0), le_f16(block, 2), da, isum, msum);
            } else {
                let isum =
                    q6k_block_sum(|i| q6k_quant(block, i), q6k_scales(block), a, tok.sums(sb));
                *acc = accumulate_q6k(*acc, le_f16(block, 208), da, isum);
            }
        }
    }
    acc
}

/// The six-bit scales and mins of a Q4_K block, unpacked a 32-bit word at a time (the same
/// values as [`k_scale_min`], without per-element branches), each as 8 bytes.
#[inline(always)]
pub(crate) fn q4k_scales_mins(block: &[u8]) -> (u64, u64) {
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
    //! The AVX2 kernels (also what AVX-512 runs over the GGUF layout): `vpmaddubsw` u8×i8 pair
    //! sums, `vpmaddwd` into 4-element sums and `vphaddd` rounds give the sixteen group dot
    //! products; the scales apply in 32-bit lanes and a horizontal sum gives the block's
    //! integers, which the scalar float step of the module docs accumulates.

    use super::{accumulate_q4k, accumulate_q6k, q4k_scales_mins, rows_generic};
    use super::{Q8Activations, QuantMatrix, TokenBlocks};
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

    /// The sum of the eight i32 lanes of `v` (exact: the block integers stay far below 2^31).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn hsum(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }

    /// Q4_K row against `G` tokens (module docs).
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
        let mut acc = [0.0f32; G];
        for (sb, block) in row.chunks_exact(144).enumerate() {
            let (d, dmin) = f16_pair(block, 0);
            let (sc, m) = q4k_scales_mins(block);
            // group PI[j] lies in sub-block PI[j] / 2 = j mod 4 (and 8 + PI[j] in 4 + j mod 4)
            let sc32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(sc as i64));
            let sc_lo = _mm256_permute2x128_si256::<0x00>(sc32, sc32);
            let sc_hi = _mm256_permute2x128_si256::<0x11>(sc32, sc32);
            // m_j twice, against the two group sums of sub-block j
            let m8 = _mm_cvtsi64_si128(m as i64);
            let m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
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
                let (g_lo, g_hi) = group_dots8(&w, tokens[g].quants(sb));
                let isum = _mm256_add_epi32(
                    _mm256_mullo_epi32(g_lo, sc_lo),
                    _mm256_mullo_epi32(g_hi, sc_hi),
                );
                let msum = _mm256_madd_epi16(load(tokens[g].sums(sb), 0), m16);
                let da = tokens[g].scales[sb];
                acc[g] = accumulate_q4k(acc[g], d, dmin, da, hsum(isum), hsum(msum));
            }
        }
        acc
    }

    /// Q6_K row against `G` tokens (module docs).
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
        let mut acc = [0.0f32; G];
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
                let gs = load(tokens[g].sums(sb), 0);
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
                acc[g] = accumulate_q6k(acc[g], d, tokens[g].scales[sb], hsum(isum));
            }
        }
        acc
    }
}

// The AVX-512 intrinsics are stable since Rust 1.89, the workspace's `rust-version`.
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    //! AVX-512 activation quantisation (the matrix kernels live in [`super::super::int8_packed`]),
    //! shared by both activation formats: a 256-element block is sixteen groups of sixteen, a
    //! 32-element block ([`super::super::int8_q32`]) two.

    use std::arch::x86_64::*;

    /// [`super::quantize_block`] over a block of `16 · GROUPS` values, sixteen at a time: the
    /// scale `amax / 127`, the quants (as [`super::quantize_to_i8`] makes them: round half away
    /// from zero as truncation plus a ±1 step where the exact remainder is at least one half)
    /// and the sum of each 16-element group.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, BW and VL; `x` and `quants` hold at least `16 · GROUPS`
    /// elements and `group_sums` at least `GROUPS`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(in crate::quant) unsafe fn quantize_groups<const GROUPS: usize>(
        x: &[f32],
        quants: &mut [i8],
        group_sums: &mut [i16],
    ) -> f32 {
        let xs: [__m512; GROUPS] = std::array::from_fn(|i| {
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
            quants[..16 * GROUPS].fill(0);
            group_sums[..GROUPS].fill(0);
        }
        amax / 127.0
    }

    /// Whether every element of `x` is finite, sixteen at a time (`x · 0` is NaN exactly for
    /// NaN and ±inf).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn all_finite(x: &[f32]) -> bool {
        let zero = _mm512_setzero_ps();
        let mut acc = zero;
        let chunks = x.chunks_exact(16);
        let tail_finite = chunks.remainder().iter().all(|v| v.is_finite());
        for c in chunks {
            // SAFETY: 16 readable f32; unaligned loads are allowed.
            let v = unsafe { _mm512_loadu_ps(c.as_ptr()) };
            acc = _mm512_add_ps(acc, _mm512_mul_ps(v, zero));
        }
        tail_finite && _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(acc, acc) == 0
    }
}
