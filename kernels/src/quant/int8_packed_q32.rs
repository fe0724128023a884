//! The 32-element weight types (Q8_0, Q4_0, Q4_1, Q5_0) repacked sixteen rows at a time for the
//! AVX-512 and AVX2 8-bit products with 32-block activations ([`Q8Blocks32`]): the same idea as the
//! k-quant tiles of [`super::int8_packed`] (read its docs first), for the types the small
//! models and the fallbacks of k-quant files use (in the Qwen2.5-Coder-0.5B Q4_K_M file, every
//! matrix of width 896 is Q5_0 or Q8_0, the LM head included: 80% of the bytes a token reads).
//!
//! **Exactly the same numbers.** A block's `isum` is exact whatever the grouping, and the float
//! step is the per-output `fma` sequence of [`super::int8_q32`], so
//! [`quant_matmul_q32_packed`] is bit-identical to [`super::quant_matmul_q32`] on every level
//! (tested).
//!
//! **Layout.** A tile is [`TILE_ROWS`] rows (the last tile padded with zero rows); its
//! *tile-blocks* follow one another, each 16 rows × [`Q32_TILE_BLOCKS`] consecutive blocks
//! (64 elements; when a row has an odd number of blocks, the last tile-block's second half is
//! zero and never read), so that every tile-block is a whole number of 64-byte lines. Inside a
//! tile-block, with `e` the block (0, 1), `r` the row and `H` the header size:
//! - header: `d(r)` of block `e` (f16) at `32e + 2r`; for Q4_1 also `m(r)` at `64 + 32e + 2r`
//!   (`H` = 128 for Q4_1, 64 otherwise);
//! - the quants of block `e` at `H + e·Q`, stored unsigned (`u = qw + 128` for Q8_0, `+ 8` for
//!   Q4_0, `+ 16` for Q5_0, the nibble itself for Q4_1), byte `4r + i` of a register holding
//!   row `r`'s quants for four consecutive elements:
//!   - Q8_0 (`Q` = 512): register `j` (`0..8`) at `+ 64j`, byte `4r + i` = `u(r, 4j + i)`;
//!   - Q4_0, Q4_1 (`Q` = 256) and Q5_0 (`Q` = 320): register `p` (`0..4`) at `+ 64p`, byte
//!     `4r + i` = `u(r, 8p + i) & 15 | (u(r, 8p + 4 + i) & 15) << 4`; Q5_0 then one register of
//!     fifth bits at `+ 256`, byte `4r + i` = `Σ_j (u(r, 4j + i) >> 4) << j`.
//!
//! Sizes equal the GGUF data's (16 × 34 bytes per Q8_0 block = 32 + 512, and so on), plus the
//! padding of a last odd block and of a last partial tile.
//!
//! **Kernel.** Per block and token, eight `vpdpbusd` (four weights of each of sixteen rows
//! against a broadcast word of the token's quants) start from `−offset · asum`, which turns the
//! unsigned weights back into the signed ones; one `fma` (two for Q4_1) folds the block into
//! sixteen accumulators. Q5_0's fifth bits join their nibbles with one shift and one ternary
//! logic operation per group. Up to eight tokens share each decoded block (as in
//! [`super::int8_packed`]).
//!
//! **Not AMX.** On a CPU with AMX-INT8, one `tdpbsud` gives a block's sums for up to sixteen
//! tokens, and the Q8_0 layout above is already the tile unit's weight layout. A bit-identical
//! AMX tile kernel was measured (on a 2-core Xeon with AMX; three passes per chunk of blocks:
//! weights decoded into a buffer, the tile sums, the float steps). A 16-row tile in L1 took
//! 17 / 20 / 23 ns per block at 2 / 5 / 8 tokens, this kernel 12 / 20 / 28: it pays only beyond
//! five tokens. End to end it made SmolLM2's forwards of 2, 4 and 8 tokens 27, 23 and 8 %
//! slower. Each round trip between vector registers and tiles through memory costs ~20 ns
//! there, and `ldtilecfg` ~50 ns.

use super::dequant::le_f16;
use super::int8_packed::{
    par_over_packed_tiles, write_tokens, Int8PackedMatrix, PackedProduct, TILE_ROWS,
};
use super::int8_q32::{
    accumulate_block, decode_block, Format, Q8Blocks32, Q32_BLOCK, Q4_0, Q4_1, Q5_0, Q8_0,
};
use super::matmul::{check_len, for_token_groups, SimdLevel, TileOut};
use crate::error::{KernelError, Result};

/// Blocks of 32 elements per tile-block.
pub const Q32_TILE_BLOCKS: usize = 2;

/// `(header bytes, quant bytes per block)` of a tile-block of format `t` (module docs).
pub(super) const fn layout(t: u8) -> (usize, usize) {
    match t {
        Q8_0 => (64, 512),
        Q4_0 => (64, 256),
        Q4_1 => (128, 256),
        _ => (64, 320),
    }
}

/// Bytes of one tile-block of format `t`.
pub(super) const fn tile_block_bytes(t: u8) -> usize {
    let (header, quants) = layout(t);
    header + Q32_TILE_BLOCKS * quants
}

/// What the stored unsigned quant adds to the signed one of format `t` (module docs).
const fn offset(t: u8) -> i32 {
    match t {
        Q8_0 => 128,
        Q4_0 => 8,
        Q5_0 => 16,
        _ => 0,
    }
}

/// The signed quants, scale and min of one GGUF block of format `fmt`.
fn decode(fmt: Format, block: &[u8]) -> ([i8; Q32_BLOCK], f32, f32) {
    match fmt {
        Format::Q8_0 => decode_block::<Q8_0>(block),
        Format::Q4_0 => decode_block::<Q4_0>(block),
        Format::Q4_1 => decode_block::<Q4_1>(block),
        Format::Q5_0 => decode_block::<Q5_0>(block),
    }
}

/// Writes row `r` of tile-block `pair` (blocks `2·pair`, `2·pair + 1` of `row`, the raw GGUF
/// row of format `fmt`, blocks of `bb` bytes) into `dst`.
pub(super) fn pack_q32_row(
    fmt: Format,
    bb: usize,
    row: &[u8],
    pair: usize,
    r: usize,
    dst: &mut [u8],
) {
    let t = fmt as u8;
    let (header, quant_bytes) = layout(t);
    let blocks = row.len() / bb;
    for e in 0..Q32_TILE_BLOCKS {
        let b = Q32_TILE_BLOCKS * pair + e;
        if b >= blocks {
            break;
        }
        let block = &row[b * bb..(b + 1) * bb];
        let (qw, _, _) = decode(fmt, block);
        let u: [u8; Q32_BLOCK] = std::array::from_fn(|k| (i32::from(qw[k]) + offset(t)) as u8);
        let q = &mut dst[header + e * quant_bytes..header + (e + 1) * quant_bytes];
        if fmt == Format::Q8_0 {
            for (k, &v) in u.iter().enumerate() {
                q[64 * (k / 4) + 4 * r + k % 4] = v;
            }
        } else {
            for p in 0..4 {
                for i in 0..4 {
                    q[64 * p + 4 * r + i] = (u[8 * p + i] & 15) | ((u[8 * p + 4 + i] & 15) << 4);
                }
            }
            if fmt == Format::Q5_0 {
                for i in 0..4 {
                    q[256 + 4 * r + i] =
                        (0..8).fold(0, |bits, j| bits | ((u[4 * j + i] >> 4) << j));
                }
            }
        }
        dst[32 * e + 2 * r..32 * e + 2 * r + 2].copy_from_slice(&block[0..2]);
        if fmt == Format::Q4_1 {
            dst[64 + 32 * e + 2 * r..64 + 32 * e + 2 * r + 2].copy_from_slice(&block[2..4]);
        }
    }
}

/// Row `r` of block `e` of a packed tile-block of format `T`: its signed quants, scale and min
/// (the inverse of [`pack_q32_row`]).
fn unpack_q32_row<const T: u8>(tb: &[u8], e: usize, r: usize) -> ([i8; Q32_BLOCK], f32, f32) {
    let (header, quant_bytes) = layout(T);
    let q = &tb[header + e * quant_bytes..header + (e + 1) * quant_bytes];
    let qw = std::array::from_fn(|k| {
        let u = if T == Q8_0 {
            q[64 * (k / 4) + 4 * r + k % 4]
        } else {
            let (p, half, i) = (k / 8, (k % 8) / 4, k % 4);
            let nibble = (q[64 * p + 4 * r + i] >> (4 * half)) & 15;
            if T == Q5_0 {
                nibble | (((q[256 + 4 * r + i] >> (k / 4)) & 1) << 4)
            } else {
                nibble
            }
        };
        (i32::from(u) - offset(T)) as i8
    });
    let m = if T == Q4_1 {
        le_f16(tb, 64 + 32 * e + 2 * r)
    } else {
        0.0
    };
    (qw, le_f16(tb, 32 * e + 2 * r), m)
}

/// `out = x · Wᵀ` over the packed layout of a 32-element type, on the CPU's best
/// [`SimdLevel`]: `acts` holds `[n_tokens × w.cols()]`, `out` is `[n_tokens × w.rows()]`.
/// Bit-identical to [`super::quant_matmul_q32`] on the matrix `w` was packed from.
///
/// # Errors
/// [`KernelError::UnsupportedQuantType`] when `w` holds a k-quant (use
/// [`super::quant_matmul_int8_packed`]); [`KernelError::ShapeMismatch`] when
/// `acts.cols() != w.cols()` or `out` has the wrong length.
pub fn quant_matmul_q32_packed(
    w: &Int8PackedMatrix,
    acts: &Q8Blocks32,
    out: &mut [f32],
) -> Result<()> {
    quant_matmul_q32_packed_with(w, acts, out, SimdLevel::detect())
}

/// [`quant_matmul_q32_packed`] with an explicit [`SimdLevel`]: AVX-512 (F, BW, VL, VNNI) and
/// AVX2 run their tile kernels; the portable level runs the reference over the packed bytes.
///
/// # Errors
/// As [`quant_matmul_q32_packed`], and [`KernelError::InvalidParameter`] when `level` is not
/// available on this CPU.
pub fn quant_matmul_q32_packed_with(
    w: &Int8PackedMatrix,
    acts: &Q8Blocks32,
    out: &mut [f32],
    level: SimdLevel,
) -> Result<()> {
    q32_packed_many_with(&mut [PackedProduct { w, out }], acts, level)
}

/// Several products of one input computed together, `p.out = x · p.wᵀ` for every `p` of
/// `products` (e.g. the Q, K and V projections): the tiles of all the matrices are shared out
/// among the threads as one pool, so one parallel region serves them all. Each output is
/// bit-identical to [`quant_matmul_q32_packed`] of its matrix alone.
///
/// # Errors
/// As [`quant_matmul_q32_packed`], for the first product that fails the checks (nothing is
/// computed then).
pub fn quant_matmul_q32_packed_many(
    products: &mut [PackedProduct<'_>],
    acts: &Q8Blocks32,
) -> Result<()> {
    q32_packed_many_with(products, acts, SimdLevel::detect())
}

/// [`quant_matmul_q32_packed_many`] on `level`.
fn q32_packed_many_with(
    products: &mut [PackedProduct<'_>],
    acts: &Q8Blocks32,
    level: SimdLevel,
) -> Result<()> {
    let n = acts.n_tokens();
    let mut formats = Vec::with_capacity(products.len());
    for p in products.iter() {
        let ty = p.w.quant_type();
        let Some(fmt) = Format::of(ty) else {
            return Err(KernelError::UnsupportedQuantType {
                id: ty.ggml_id(),
                name: ty.name(),
            });
        };
        check_len("activation columns", p.w.cols(), acts.cols())?;
        check_len("output [n_tokens x rows]", n * p.w.rows(), p.out.len())?;
        formats.push(fmt);
    }
    level.ensure_available()?;
    if n == 0 {
        return Ok(());
    }
    par_over_packed_tiles(products, n, |p, _, tile, tile_out| match formats[p] {
        Format::Q8_0 => tile_products::<Q8_0>(level, tile, acts, tile_out),
        Format::Q4_0 => tile_products::<Q4_0>(level, tile, acts, tile_out),
        Format::Q4_1 => tile_products::<Q4_1>(level, tile, acts, tile_out),
        Format::Q5_0 => tile_products::<Q5_0>(level, tile, acts, tile_out),
    });
    Ok(())
}

/// The tile's outputs for every token on `level`, tokens in groups of up to eight (four on
/// AVX2: its sixteen registers), written to `tile_out`.
#[inline(always)]
fn tile_products<const T: u8>(
    level: SimdLevel,
    tile: &[u8],
    acts: &Q8Blocks32,
    tile_out: &mut TileOut<'_>,
) {
    let n = acts.n_tokens();
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => for_token_groups!(n, [1, 2, 3, 4], t, G => {
            // SAFETY: the caller checked `level.ensure_available()`; the tile holds
            // `ceil(blocks / 2)` tile-blocks of format `T` and `t + G ≤ n_tokens`.
            write_tokens(tile_out, t, &unsafe { avx2::tile::<T, G>(tile, acts, t) });
        }),
        _ => for_token_groups!(n, [1, 2, 3, 4, 5, 6, 7, 8], t, G => {
            write_tokens(tile_out, t, &tile_sums::<T, G>(level, tile, acts, t));
        }),
    }
}

/// The sixteen outputs of one tile against tokens `t0 .. t0 + G` on `level`.
#[inline(always)]
fn tile_sums<const T: u8, const G: usize>(
    level: SimdLevel,
    tile: &[u8],
    acts: &Q8Blocks32,
    t0: usize,
) -> [[f32; TILE_ROWS]; G] {
    match level {
        // SAFETY: the caller checked `level.ensure_available()`; the tile holds
        // `ceil(blocks / 2)` tile-blocks of format `T` and `t0 + G ≤ n_tokens` (shapes checked).
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => unsafe { avx512::tile::<T, G>(tile, acts, t0) },
        _ => portable_tile::<T, G>(tile, acts, t0),
    }
}

/// The portable reference over the packed layout: each row of the tile, block by block, through
/// the definition of [`super::int8_q32`].
fn portable_tile<const T: u8, const G: usize>(
    tile: &[u8],
    acts: &Q8Blocks32,
    t0: usize,
) -> [[f32; TILE_ROWS]; G] {
    let tb_bytes = tile_block_bytes(T);
    let mut acc = [[0.0f32; TILE_ROWS]; G];
    for b in 0..acts.blocks {
        let pair = b / Q32_TILE_BLOCKS;
        let tb = &tile[pair * tb_bytes..(pair + 1) * tb_bytes];
        for r in 0..TILE_ROWS {
            let (qw, dw, m) = unpack_q32_row::<T>(tb, b % Q32_TILE_BLOCKS, r);
            for (g, acc) in acc.iter_mut().enumerate() {
                acc[r] = accumulate_block::<T>(acc[r], &qw, dw, m, acts, acts.index(t0 + g, b));
            }
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! The tile kernel. Launch-size reasoning (per block of 16 rows, `G` tokens): Q5_0 reads
    //! 352 bytes and issues `8·G` `vpdpbusd` + ~20 decode operations, Q8_0 544 bytes and
    //! `8·G` `vpdpbusd`; the float step is one `vmulps` + one `vfmadd` per token. At `G = 1`
    //! that is far less than the time to stream the bytes from DRAM on one core here, so the
    //! product is bound by memory.

    use super::super::int8_packed::avx512::{broadcast_word, load, load_f16x16, store};
    use super::super::int8_packed::prefetch_part;
    use super::super::int8_q32::slab_offset;
    use super::{layout, offset, tile_block_bytes, Q8Blocks32, Q32_TILE_BLOCKS, TILE_ROWS};
    use super::{Q4_1, Q5_0, Q8_0};
    use std::arch::x86_64::*;

    /// Tile-blocks the kernel hints ahead of the one it reads (`prefetch_part`): 5.5 to 8.8 KB
    /// (measured as for the k-quants: from 1.31× to 1.12× the one-token time at 4 tokens on
    /// Qwen2.5-Coder-0.5B's Q5_0 FFN, against the earlier burst four tile-blocks ahead).
    const Q32_AHEAD: usize = 8;

    /// The sixteen outputs of one tile of format `T` against tokens `t0 .. t0 + G`.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, BW, VL and VNNI; `tile` holds `ceil(blocks / 2)`
    /// tile-blocks of format `T` (`blocks = acts.blocks`) and `t0 + G ≤ acts.n_tokens()`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn tile<const T: u8, const G: usize>(
        tile: &[u8],
        acts: &Q8Blocks32,
        t0: usize,
    ) -> [[f32; TILE_ROWS]; G] {
        let (header, quant_bytes) = layout(T);
        let tb_bytes = tile_block_bytes(T);
        let m4 = _mm512_set1_epi8(15);
        let m10 = _mm512_set1_epi8(0x10);
        let shift = (offset(T) as u32).trailing_zeros();
        let mut acc = [_mm512_setzero_ps(); G];
        for b in 0..acts.blocks {
            let e = b % Q32_TILE_BLOCKS;
            // SAFETY: tile-block `b / 2` lies inside the tile (caller).
            let tb = unsafe { tile.as_ptr().add(b / Q32_TILE_BLOCKS * tb_bytes) };
            prefetch_part(
                t0 == 0,
                tb.wrapping_add(Q32_AHEAD * tb_bytes),
                tb_bytes,
                e,
                Q32_TILE_BLOCKS,
            );
            // SAFETY: block `e`'s quants span `header + e·Q .. header + (e + 1)·Q` of the
            // tile-block.
            let q = unsafe { tb.add(header + e * quant_bytes) };
            let w: [__m512i; 8] = if T == Q8_0 {
                // SAFETY: eight registers of 64 bytes in the block's 512 quant bytes.
                std::array::from_fn(|j| unsafe { load(q.add(64 * j)) })
            } else {
                // SAFETY: four registers of 64 bytes in the block's 256 nibble bytes.
                let nibbles: [__m512i; 4] = std::array::from_fn(|p| unsafe { load(q.add(64 * p)) });
                let mut w: [__m512i; 8] = std::array::from_fn(|j| {
                    let v = nibbles[j / 2];
                    if j % 2 == 0 {
                        _mm512_and_si512(v, m4)
                    } else {
                        _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4)
                    }
                });
                if T == Q5_0 {
                    // SAFETY: the fifth bits' register at `+ 256` of the block's 320 bytes.
                    let h = unsafe { load(q.add(256)) };
                    // bit j of each byte moved to bit 4 (no bit crosses a byte under the mask)
                    let fifth = [
                        _mm512_slli_epi16::<4>(h),
                        _mm512_slli_epi16::<3>(h),
                        _mm512_slli_epi16::<2>(h),
                        _mm512_slli_epi16::<1>(h),
                        h,
                        _mm512_srli_epi16::<1>(h),
                        _mm512_srli_epi16::<2>(h),
                        _mm512_srli_epi16::<3>(h),
                    ];
                    for (w, bit) in w.iter_mut().zip(fifth) {
                        // w | (bit & 0x10)
                        *w = _mm512_ternarylogic_epi32::<0xF8>(*w, bit, m10);
                    }
                }
                w
            };
            // SAFETY: 32 bytes of scales (and of mins) in the header.
            let d = unsafe { load_f16x16(tb.add(32 * e)) };
            let m = if T == Q4_1 {
                // SAFETY: as above.
                unsafe { load_f16x16(tb.add(64 + 32 * e)) }
            } else {
                _mm512_setzero_ps()
            };
            for (g, acc) in acc.iter_mut().enumerate() {
                let i = acts.index(t0 + g, b);
                let start = if T == Q4_1 {
                    0
                } else {
                    -(acts.sums[i] << shift)
                };
                // SAFETY: the token's stored block `i` spans the 8-byte words of four slabs
                // from `slab_offset(i, 0)` (the layout of `Q8Blocks32`).
                let a = unsafe { acts.quants.as_ptr().add(slab_offset(i, 0)) };
                let mut dots = [_mm512_set1_epi32(start), _mm512_setzero_si512()];
                for (j, &wj) in w.iter().enumerate() {
                    // one token: two chains (latency); more: the tokens interleave
                    let chain = if G == 1 { j % 2 } else { 0 };
                    // SAFETY: elements `4j .. 4j + 4` of the block, inside its slabs.
                    let word = unsafe { broadcast_word(a.add(64 * (j / 2) + 4 * (j % 2))) };
                    dots[chain] = _mm512_dpbusd_epi32(dots[chain], wj, word);
                }
                let isum = _mm512_add_epi32(dots[0], dots[1]);
                let da = _mm512_set1_ps(acts.scales[i]);
                *acc = _mm512_fmadd_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(isum), *acc);
                if T == Q4_1 {
                    *acc = _mm512_fmadd_ps(m, _mm512_set1_ps(acts.scaled_sums[i]), *acc);
                }
            }
        }
        store(acc)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The tile kernel for CPUs with AVX2 and no AVX-512 VNNI: each half of a tile (rows
    //! `0..8`, `8..16`) in one 256-bit register, the layout and the lane-wise arithmetic of
    //! [`super::avx512`], with `vpdpbusd` replaced by `vpmaddubsw` (u8 × i8 pair sums in 16
    //! bits) and `vpmaddwd` (pairs into each row's 32-bit lane). No 16-bit sum saturates, so
    //! the block integers are exact and the float steps are the module's (bit-identical to
    //! every other level, tested):
    //! - the 4-bit types add all eight pair sums of a block in 16 bits (at most
    //!   `16 · 15 · 127 = 30480`), Q5_0 two runs of four (at most `8 · 31 · 127 = 31496`);
    //! - Q8_0's unsigned quants (`qw + 128`) would overflow a pair sum, so the kernel turns them
    //!   back into `qw` and multiplies `|qw|` by the activations carrying `qw`'s sign
    //!   (`vpsignb`): a pair sum is at most `2 · 128 · 127 = 32512`, and no offset is needed.
    //!
    //! Tokens come at most four at a time (sixteen registers).

    use super::super::int8_packed::avx2::{load, load_f16x8, store};
    use super::super::int8_packed::prefetch_part;
    use super::super::int8_q32::slab_offset;
    use super::{layout, offset, tile_block_bytes, Q8Blocks32, Q32_TILE_BLOCKS, TILE_ROWS};
    use super::{Q4_1, Q5_0, Q8_0};
    use std::arch::x86_64::*;

    /// Tile-blocks the kernel hints ahead of the one it reads, as [`super::avx512`]'s.
    const Q32_AHEAD: usize = 8;

    /// Half `h`'s eight weight registers of block `e` of the tile-block at `tb`, element order
    /// (`w[j]`: elements `4j .. 4j + 4` of each row), as stored (unsigned).
    ///
    /// # Safety
    /// The tile-block of format `T` at `tb` must be readable; the CPU must support AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn weights<const T: u8>(tb: *const u8, e: usize, h: usize) -> [__m256i; 8] {
        let (header, quant_bytes) = layout(T);
        // SAFETY: block `e`'s quants span `header + e·Q .. header + (e + 1)·Q` (caller); half
        // `h` of each 64-byte register is its bytes `32h .. 32h + 32`.
        let q = unsafe { tb.add(header + e * quant_bytes + 32 * h) };
        if T == Q8_0 {
            // SAFETY: eight registers at `64j` of the block's 512 quant bytes.
            return std::array::from_fn(|j| unsafe { load(q.add(64 * j)) });
        }
        let m4 = _mm256_set1_epi8(15);
        // SAFETY: four registers at `64p` of the block's 256 nibble bytes.
        let nibbles: [__m256i; 4] = std::array::from_fn(|p| unsafe { load(q.add(64 * p)) });
        let mut w: [__m256i; 8] = std::array::from_fn(|j| {
            let v = nibbles[j / 2];
            match j % 2 {
                0 => _mm256_and_si256(v, m4),
                _ => _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
            }
        });
        if T == Q5_0 {
            let m10 = _mm256_set1_epi8(0x10);
            // SAFETY: the fifth bits' register at `+ 256` of the block's 320 bytes.
            let h = unsafe { load(q.add(256)) };
            // bit j of each byte moved to bit 4 (no bit crosses a byte under the mask)
            let fifth = [
                _mm256_slli_epi16::<4>(h),
                _mm256_slli_epi16::<3>(h),
                _mm256_slli_epi16::<2>(h),
                _mm256_slli_epi16::<1>(h),
                h,
                _mm256_srli_epi16::<1>(h),
                _mm256_srli_epi16::<2>(h),
                _mm256_srli_epi16::<3>(h),
            ];
            for (w, bit) in w.iter_mut().zip(fifth) {
                *w = _mm256_or_si256(*w, _mm256_and_si256(bit, m10));
            }
        }
        w
    }

    /// The sixteen outputs of one tile of format `T` against tokens `t0 .. t0 + G` (`G ≤ 4`).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `tile` holds `ceil(blocks / 2)` tile-blocks of
    /// format `T` (`blocks = acts.blocks`) and `t0 + G ≤ acts.n_tokens()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tile<const T: u8, const G: usize>(
        tile: &[u8],
        acts: &Q8Blocks32,
        t0: usize,
    ) -> [[f32; TILE_ROWS]; G] {
        let tb_bytes = tile_block_bytes(T);
        let ones = _mm256_set1_epi16(1);
        let sign_flip = _mm256_set1_epi8(i8::MIN);
        let shift = (offset(T) as u32).trailing_zeros();
        let mut acc = [[_mm256_setzero_ps(); G]; 2];
        for b in 0..acts.blocks {
            let e = b % Q32_TILE_BLOCKS;
            // SAFETY: tile-block `b / 2` lies inside the tile (caller).
            let tb = unsafe { tile.as_ptr().add(b / Q32_TILE_BLOCKS * tb_bytes) };
            for (h, acc) in acc.iter_mut().enumerate() {
                prefetch_part(
                    t0 == 0,
                    tb.wrapping_add(Q32_AHEAD * tb_bytes),
                    tb_bytes,
                    2 * e + h,
                    2 * Q32_TILE_BLOCKS,
                );
                // SAFETY: the tile-block is readable (above).
                let mut w = unsafe { weights::<T>(tb, e, h) };
                // Q8_0: `w` becomes the signed quants `qw = u − 128`, `magnitudes` their `|qw|`
                let mut magnitudes = w;
                if T == Q8_0 {
                    for (w, magnitude) in w.iter_mut().zip(&mut magnitudes) {
                        *w = _mm256_xor_si256(*w, sign_flip);
                        *magnitude = _mm256_abs_epi8(*w);
                    }
                }
                // SAFETY: 16 bytes of scales (and of mins) at `32e + 16h` of the header.
                let d = unsafe { load_f16x8(tb.add(32 * e + 16 * h)) };
                let m = if T == Q4_1 {
                    // SAFETY: as above.
                    unsafe { load_f16x8(tb.add(64 + 32 * e + 16 * h)) }
                } else {
                    _mm256_setzero_ps()
                };
                for (g, acc) in acc.iter_mut().enumerate() {
                    let i = acts.index(t0 + g, b);
                    let start = match T {
                        Q4_1 | Q8_0 => 0,
                        _ => -(acts.sums[i] << shift),
                    };
                    // SAFETY: the token's stored block `i` spans the 8-byte words of four slabs
                    // from `slab_offset(i, 0)` (the layout of `Q8Blocks32`).
                    let a = unsafe { acts.quants.as_ptr().add(slab_offset(i, 0)) };
                    // SAFETY: elements `4j .. 4j + 4` of the block, inside its slabs.
                    let word = |j: usize| unsafe {
                        _mm256_set1_epi32(
                            a.add(64 * (j / 2) + 4 * (j % 2))
                                .cast::<i32>()
                                .read_unaligned(),
                        )
                    };
                    let mut isum = _mm256_set1_epi32(start);
                    match T {
                        Q8_0 => {
                            for (j, (&wj, &magnitude)) in w.iter().zip(&magnitudes).enumerate() {
                                let signed_acts = _mm256_sign_epi8(word(j), wj);
                                let pairs = _mm256_maddubs_epi16(magnitude, signed_acts);
                                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(pairs, ones));
                            }
                        }
                        _ => {
                            // runs of pair sums added in 16 bits: eight (4-bit), four (Q5_0)
                            let run = if T == Q5_0 { 4 } else { 8 };
                            for r in 0..8 / run {
                                let mut pairs = _mm256_setzero_si256();
                                for (j, &wj) in w.iter().enumerate().skip(run * r).take(run) {
                                    pairs =
                                        _mm256_add_epi16(pairs, _mm256_maddubs_epi16(wj, word(j)));
                                }
                                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(pairs, ones));
                            }
                        }
                    }
                    let da = _mm256_set1_ps(acts.scales[i]);
                    *acc = _mm256_fmadd_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(isum), *acc);
                    if T == Q4_1 {
                        *acc = _mm256_fmadd_ps(m, _mm256_set1_ps(acts.scaled_sums[i]), *acc);
                    }
                }
            }
        }
        store(acc)
    }
}
