//! The k-quant weights repacked sixteen rows at a time for the AVX-512 and AVX2 8-bit products
//! (the 32-element types get the same treatment in [`super::int8_packed_q32`], on this module's
//! [`Int8PackedMatrix`]).
//!
//! **Why.** Over the GGUF layout one output is one row against one token: the sixteen lanes of
//! an integer register hold sixteen groups of *one* row, and every block ends in horizontal
//! work (scales, folds, float conversion) for that single output. With the rows interleaved,
//! lane `r` of a register belongs to row `r` of a 16-row tile: a `vpdpbusd` multiplies four
//! weights of each of sixteen rows by the same four activations (one broadcast 32-bit load), the
//! scales apply lane-wise, and one fused multiply-add per block updates sixteen outputs. The
//! arithmetic per weight then no longer grows with the per-output bookkeeping, which is what
//! keeps verifying a few tokens close to the cost of one (the weights, not the arithmetic, set
//! the time).
//!
//! **Exactly the same numbers.** The integers of a block (`I`, `M`, see [`super::int8`]) are
//! exact whatever the grouping, and the float step is the module's per-output `fma` sequence,
//! so [`quant_matmul_int8_packed`] is bit-identical to [`super::quant_matmul_int8`] on every
//! level (tested).
//!
//! **Layout.** A tile is [`TILE_ROWS`] rows (the last tile of a matrix padded with zero rows);
//! its super-blocks follow one another, each a *tile-block* of 16 rows × 256 elements: a header
//! of scales first, then the quants in exactly the order the kernels read them, so that each
//! tile-block streams from memory front to back (measured here, 2 threads, on a [151936 × 1536]
//! Q6_K head: 21 GB/s with the high bits in a region of their own, 27 GB/s with the scales after
//! the quants, 36 GB/s in this order). Byte `4r + i` of a 64-byte register holds row `r`'s quants for four consecutive
//! elements. In a Q4_K tile-block ([`Q4K_TILE_BLOCK`] bytes):
//! - `[0, 128)`: `sc_j(r)` at `16j + r`; `[128, 256)`: the mins in pairs, `m_{2p+e}(r)` at
//!   `128 + 32p + 2r + e`; `[256, 288)`: `d(r)` (f16) at `256 + 2r`; `[288, 320)`: `dmin(r)`;
//! - `[320, 2368)`: for sub-block `j` (`0..8`) and register `p` (`0..4`), the 64 bytes at
//!   `320 + 256j + 64p`: byte `4r + i` = `q(r, 32j + 8p + i) | q(r, 32j + 8p + 4 + i) << 4`.
//!
//! In a Q6_K tile-block ([`Q6K_TILE_BLOCK`] bytes):
//! - `[0, 256)`: `sc_k(r)` (i8) at `16k + r`; `[256, 288)`: `d(r)` (f16); 32 bytes of padding
//!   (every tile-block starts on a 64-byte boundary);
//! - `[320, 3392)`: for group `k` (`0..16`) 192 bytes at `320 + 192k`: two registers of low four
//!   bits, at `+ 64h` (`h = 0, 1`) byte `4r + i` = `lo(r, 16k + 8h + i) | lo(r, 16k + 8h + 4 + i)
//!   << 4`, then one of high two bits, at `+ 128` byte `4r + i` = `Σ_t hi(r, 16k + 4t + i) << 2t`.
//!
//! The packed copy is as large as the GGUF data (+2.8% for Q4_K, +1% for Q6_K).

use super::dequant::le_f16;
use super::int8::{
    accumulate_q4k, accumulate_q6k, check_acts_shape, int8_supported, q4k_block_sums, q4k_quant,
    q4k_scales_mins, q6k_block_sum, q6k_quant, Q8Activations, TokenBlocks, GROUPS, SUB_BLOCKS,
};
use super::int8_packed_q32 as q32;
use super::int8_q32::Format;
use super::matmul::{
    for_token_groups, par_over_tiles, QuantMatrix, SimdLevel, TileOut, ROWS_PER_TASK,
};
use super::types::QuantType;
use crate::error::{KernelError, Result};

/// Rows per tile (the lanes of a 512-bit register of 32-bit integers).
pub const TILE_ROWS: usize = 16;
/// Bytes of a Q4_K tile-block (16 rows × one super-block).
pub const Q4K_TILE_BLOCK: usize = 2368;
/// Bytes of a Q6_K tile-block, padded to a multiple of 64.
pub const Q6K_TILE_BLOCK: usize = 3392;
/// Where a Q4_K tile-block's quants start (after its 320-byte header).
const Q4K_QUANTS: usize = 320;
/// Where a Q6_K tile-block's quants start (after its header and padding).
const Q6K_QUANTS: usize = 320;

// A task of `par_over_tiles` must be exactly one tile.
const _: () = assert!(ROWS_PER_TASK == TILE_ROWS);

/// One 64-byte-aligned line of packed bytes.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A Q4_K or Q6_K matrix repacked into 16-row tiles (module docs), owning its bytes.
#[derive(Clone)]
pub struct Int8PackedMatrix {
    ty: QuantType,
    rows: usize,
    cols: usize,
    lines: Vec<Line>,
}

impl std::fmt::Debug for Int8PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Int8PackedMatrix({} [{} x {}], {} bytes)",
            self.ty,
            self.rows,
            self.cols,
            self.len_bytes()
        )
    }
}

/// Bytes of one tile-block of `ty` (a packable type).
fn tile_block_bytes(ty: QuantType) -> usize {
    match (ty, Format::of(ty)) {
        (QuantType::Q4_K, _) => Q4K_TILE_BLOCK,
        (_, Some(fmt)) => q32::tile_block_bytes(fmt as u8),
        _ => Q6K_TILE_BLOCK,
    }
}

/// Tile-blocks per tile of a `ty` matrix `cols` wide: one per super-block of 256 elements
/// (k-quants), one per pair of 32-element blocks (the others).
fn tile_blocks(ty: QuantType, cols: usize) -> usize {
    if int8_supported(ty) {
        cols / 256
    } else {
        cols.div_ceil(32 * q32::Q32_TILE_BLOCKS)
    }
}

impl Int8PackedMatrix {
    /// Whether [`Int8PackedMatrix::pack`] accepts `ty`: the k-quants of [`int8_supported`] and
    /// the 32-element types of [`q32_supported`](super::q32_supported).
    pub fn packable(ty: QuantType) -> bool {
        int8_supported(ty) || Format::of(ty).is_some()
    }

    /// Whether the products over the packed layout of `ty` run SIMD kernels on `level` (faster
    /// than the GGUF layout's): on AVX-512 and AVX2 every [`Int8PackedMatrix::packable`] type,
    /// never on the portable level.
    pub fn has_kernels(ty: QuantType, level: SimdLevel) -> bool {
        match level {
            SimdLevel::Avx512 | SimdLevel::Avx2 => Self::packable(ty),
            SimdLevel::Portable => false,
        }
    }

    /// Repacks `w` (any CPU; portable code): Q4_K and Q6_K into the tiles of this module, Q8_0,
    /// Q4_0, Q4_1 and Q5_0 into those of [`super::int8_packed_q32`].
    ///
    /// # Errors
    /// [`KernelError::UnsupportedQuantType`] unless [`Int8PackedMatrix::packable`].
    pub fn pack(w: &QuantMatrix<'_>) -> Result<Self> {
        let ty = w.quant_type();
        if !Self::packable(ty) {
            return Err(KernelError::UnsupportedQuantType {
                id: ty.ggml_id(),
                name: ty.name(),
            });
        }
        let (rows, cols) = (w.rows(), w.cols());
        let blocks = tile_blocks(ty, cols);
        let tiles = rows.div_ceil(TILE_ROWS);
        let tb = tile_block_bytes(ty);
        let mut lines = vec![Line([0; 64]); tiles * blocks * tb / 64];
        let bb = ty.block_bytes();
        for tile in 0..tiles {
            for b in 0..blocks {
                let at = (tile * blocks + b) * tb / 64;
                let dst = line_bytes_mut(&mut lines[at..at + tb / 64]);
                for r in 0..TILE_ROWS.min(rows - tile * TILE_ROWS) {
                    let row = w.row(tile * TILE_ROWS + r);
                    match (ty, Format::of(ty)) {
                        (_, Some(fmt)) => q32::pack_q32_row(fmt, bb, row, b, r, dst),
                        (QuantType::Q4_K, _) => pack_q4k_row(&row[b * bb..(b + 1) * bb], r, dst),
                        _ => pack_q6k_row(&row[b * bb..(b + 1) * bb], r, dst),
                    }
                }
            }
        }
        Ok(Self {
            ty,
            rows,
            cols,
            lines,
        })
    }

    /// The weight type.
    pub fn quant_type(&self) -> QuantType {
        self.ty
    }
    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Input columns (a multiple of the type's block length).
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Bytes held.
    pub fn len_bytes(&self) -> usize {
        self.lines.len() * 64
    }

    /// Tile `tile`'s bytes (all its tile-blocks, in order).
    pub(super) fn tile(&self, tile: usize) -> &[u8] {
        let per_tile = tile_blocks(self.ty, self.cols) * tile_block_bytes(self.ty) / 64;
        line_bytes(&self.lines[tile * per_tile..(tile + 1) * per_tile])
    }
}

/// The bytes of `lines`.
fn line_bytes(lines: &[Line]) -> &[u8] {
    // SAFETY: `Line` is `repr(C)` around `[u8; 64]` without padding (size 64, align 64), so
    // `len` lines are `64 · len` initialised bytes.
    unsafe { std::slice::from_raw_parts(lines.as_ptr().cast(), lines.len() * 64) }
}

/// The bytes of `lines`, writable.
fn line_bytes_mut(lines: &mut [Line]) -> &mut [u8] {
    // SAFETY: as in `line_bytes`, and the borrow is exclusive.
    unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast(), lines.len() * 64) }
}

/// Writes row `r` of a Q4_K tile-block from the raw 144-byte `block`.
fn pack_q4k_row(block: &[u8], r: usize, dst: &mut [u8]) {
    for j in 0..SUB_BLOCKS {
        for p in 0..4 {
            for i in 0..4 {
                let low = q4k_quant(block, 32 * j + 8 * p + i);
                let high = q4k_quant(block, 32 * j + 8 * p + 4 + i);
                dst[Q4K_QUANTS + 256 * j + 64 * p + 4 * r + i] = low | (high << 4);
            }
        }
    }
    let (sc, m) = q4k_scales_mins(block);
    let (sc, m) = (sc.to_le_bytes(), m.to_le_bytes());
    for j in 0..SUB_BLOCKS {
        dst[16 * j + r] = sc[j];
        dst[128 + 32 * (j / 2) + 2 * r + j % 2] = m[j];
    }
    dst[256 + 2 * r..256 + 2 * r + 2].copy_from_slice(&block[0..2]);
    dst[288 + 2 * r..288 + 2 * r + 2].copy_from_slice(&block[2..4]);
}

/// Writes row `r` of a Q6_K tile-block from the raw 210-byte `block`.
fn pack_q6k_row(block: &[u8], r: usize, dst: &mut [u8]) {
    let q: [u8; 256] = std::array::from_fn(|i| q6k_quant(block, i));
    for k in 0..GROUPS {
        for h in 0..2 {
            for i in 0..4 {
                let (low, high) = (q[16 * k + 8 * h + i] & 15, q[16 * k + 8 * h + 4 + i] & 15);
                dst[Q6K_QUANTS + 192 * k + 64 * h + 4 * r + i] = low | (high << 4);
            }
        }
        for i in 0..4 {
            dst[Q6K_QUANTS + 192 * k + 128 + 4 * r + i] = (0..4)
                .map(|t| (q[16 * k + 4 * t + i] >> 4) << (2 * t))
                .fold(0, |bits, v| bits | v);
        }
        dst[16 * k + r] = block[192 + k];
    }
    dst[256 + 2 * r..256 + 2 * r + 2].copy_from_slice(&block[208..210]);
}

/// Q4_K quant `i` of row `r` in a packed tile-block (the inverse of [`pack_q4k_row`]).
fn packed_q4k_quant(tb: &[u8], r: usize, i: usize) -> u8 {
    let (j, p, half, e) = (i / 32, (i % 32) / 8, (i % 8) / 4, i % 4);
    (tb[Q4K_QUANTS + 256 * j + 64 * p + 4 * r + e] >> (4 * half)) & 15
}

/// Q6_K quant `i` of row `r` in a packed tile-block (the inverse of [`pack_q6k_row`]).
fn packed_q6k_quant(tb: &[u8], r: usize, i: usize) -> u8 {
    let (k, t, e) = (i / 16, (i % 16) / 4, i % 4);
    let low = (tb[Q6K_QUANTS + 192 * k + 64 * (t / 2) + 4 * r + e] >> (4 * (t % 2))) & 15;
    let high = (tb[Q6K_QUANTS + 192 * k + 128 + 4 * r + e] >> (2 * t)) & 3;
    low | (high << 4)
}

/// `out = x · Wᵀ` over the packed layout, on the CPU's best [`SimdLevel`]: `acts` holds
/// `[n_tokens × w.cols()]`, `out` is `[n_tokens × w.rows()]`. Bit-identical to
/// [`super::quant_matmul_int8`] on the matrix `w` was packed from.
///
/// # Errors
/// [`KernelError::UnsupportedQuantType`] when `w` holds a 32-element type (use
/// [`super::quant_matmul_q32_packed`]); [`KernelError::ShapeMismatch`] when
/// `acts.cols() != w.cols()` or `out` has the wrong length.
pub fn quant_matmul_int8_packed(
    w: &Int8PackedMatrix,
    acts: &Q8Activations,
    out: &mut [f32],
) -> Result<()> {
    quant_matmul_int8_packed_with(w, acts, out, SimdLevel::detect())
}

/// [`quant_matmul_int8_packed`] with an explicit [`SimdLevel`]: AVX-512 (F, BW, VL, VNNI) and
/// AVX2 run their tile kernels; the portable level runs the reference, which reads the packed
/// bytes one row at a time.
///
/// # Errors
/// As [`quant_matmul_int8_packed`], and [`KernelError::InvalidParameter`] when `level` is not
/// available on this CPU.
pub fn quant_matmul_int8_packed_with(
    w: &Int8PackedMatrix,
    acts: &Q8Activations,
    out: &mut [f32],
    level: SimdLevel,
) -> Result<()> {
    int8_packed_many_with(&mut [PackedProduct { w, out }], acts, level)
}

/// One product of a fused call ([`quant_matmul_int8_packed_many`],
/// [`super::quant_matmul_q32_packed_many`]): `out = x · wᵀ`, `out` being `[n_tokens × w.rows()]`
/// row-major.
pub struct PackedProduct<'a> {
    /// The packed weights.
    pub w: &'a Int8PackedMatrix,
    /// The product's output.
    pub out: &'a mut [f32],
}

/// Several products of one input computed together, `p.out = x · p.wᵀ` for every `p` of
/// `products` (e.g. the Q, K and V projections): the tiles of all the matrices are shared out
/// among the threads as one pool, so one parallel region serves them all. Each output is
/// bit-identical to [`quant_matmul_int8_packed`] of its matrix alone.
///
/// # Errors
/// As [`quant_matmul_int8_packed`], for the first product that fails the checks (nothing is
/// computed then).
pub fn quant_matmul_int8_packed_many(
    products: &mut [PackedProduct<'_>],
    acts: &Q8Activations,
) -> Result<()> {
    int8_packed_many_with(products, acts, SimdLevel::detect())
}

/// [`quant_matmul_int8_packed_many`] on `level`.
fn int8_packed_many_with(
    products: &mut [PackedProduct<'_>],
    acts: &Q8Activations,
    level: SimdLevel,
) -> Result<()> {
    for p in products.iter() {
        if !int8_supported(p.w.ty) {
            return Err(KernelError::UnsupportedQuantType {
                id: p.w.ty.ggml_id(),
                name: p.w.ty.name(),
            });
        }
        check_acts_shape(acts, p.w.cols, p.w.rows, p.out)?;
    }
    level.ensure_available()?;
    let n = acts.n_tokens();
    if n == 0 {
        return Ok(());
    }
    par_over_packed_tiles(products, n, |_, w, tile, tile_out| match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => for_token_groups!(n, [1, 2, 3, 4, 5, 6, 7, 8], t, G => {
            let tokens: [TokenBlocks<'_>; G] = std::array::from_fn(|g| acts.token(t + g));
            // SAFETY: `level.ensure_available()` succeeded; the tile holds `cols / 256`
            // tile-blocks and every token as many activation blocks (shapes checked).
            let sums = unsafe {
                match w.ty {
                    QuantType::Q4_K => avx512::q4k_tile::<G>(tile, tokens, t == 0),
                    _ => avx512::q6k_tile::<G>(tile, tokens, t == 0),
                }
            };
            write_tokens(tile_out, t, &sums);
        }),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => for_token_groups!(n, [1, 2, 3, 4], t, G => {
            let tokens: [TokenBlocks<'_>; G] = std::array::from_fn(|g| acts.token(t + g));
            // SAFETY: as above (the AVX2 level includes FMA and F16C).
            let sums = unsafe {
                match w.ty {
                    QuantType::Q4_K => avx2::q4k_tile::<G>(tile, tokens, t == 0),
                    _ => avx2::q6k_tile::<G>(tile, tokens, t == 0),
                }
            };
            write_tokens(tile_out, t, &sums);
        }),
        _ => for_token_groups!(n, [1, 2, 3, 4, 5, 6, 7, 8], t, G => {
            let tokens: [TokenBlocks<'_>; G] = std::array::from_fn(|g| acts.token(t + g));
            write_tokens(tile_out, t, &portable_tile::<G>(w.ty, tile, tokens));
        }),
    });
    Ok(())
}

/// Writes the tile's outputs of tokens `first..first + G`.
pub(super) fn write_tokens<const G: usize>(
    tile_out: &mut TileOut<'_>,
    first: usize,
    sums: &[[f32; TILE_ROWS]; G],
) {
    for (g, sums) in sums.iter().enumerate() {
        tile_out.write(first + g, sums);
    }
}

/// Runs `task(p, w, tile, tile_out)` in parallel over every tile of every product's matrix
/// (`w = products[p].w`, `tile` its packed bytes, `tile_out` its outputs), one pool of tasks
/// for all of them ([`par_over_tiles`], whose 16-row tasks are exactly one tile).
pub(super) fn par_over_packed_tiles(
    products: &mut [PackedProduct<'_>],
    n_tokens: usize,
    task: impl Fn(usize, &Int8PackedMatrix, &[u8], &mut TileOut<'_>) + Sync,
) {
    let mats: Vec<&Int8PackedMatrix> = products.iter().map(|p| p.w).collect();
    let mut outs: Vec<(usize, &mut [f32])> = products
        .iter_mut()
        .map(|p| (p.w.rows, &mut *p.out))
        .collect();
    par_over_tiles(&mut outs, n_tokens, |p, tile_out| {
        let w = mats[p];
        task(p, w, w.tile(tile_out.first_row() / TILE_ROWS), tile_out);
    });
}

/// The portable reference over the packed layout: each row of the tile, block by block, through
/// the module's integer and float definitions.
fn portable_tile<const G: usize>(
    ty: QuantType,
    tile: &[u8],
    tokens: [TokenBlocks<'_>; G],
) -> [[f32; TILE_ROWS]; G] {
    let mut acc = [[0.0f32; TILE_ROWS]; G];
    for (b, tb) in tile.chunks_exact(tile_block_bytes(ty)).enumerate() {
        for r in 0..TILE_ROWS {
            // row r of the tile-block, unpacked once for all the tokens
            if ty == QuantType::Q4_K {
                let q: [u8; 256] = std::array::from_fn(|i| packed_q4k_quant(tb, r, i));
                let sc = std::array::from_fn(|j| tb[16 * j + r]);
                let m = std::array::from_fn(|j| tb[128 + 32 * (j / 2) + 2 * r + j % 2]);
                let (d, dmin) = (le_f16(tb, 256 + 2 * r), le_f16(tb, 288 + 2 * r));
                for (acc, tok) in acc.iter_mut().zip(&tokens) {
                    let (isum, msum) =
                        q4k_block_sums(|i| q[i], sc, m, tok.quants(b), tok.subblock_sums(b));
                    acc[r] = accumulate_q4k(acc[r], d, dmin, tok.scales[b], isum, msum);
                }
            } else {
                let q: [u8; 256] = std::array::from_fn(|i| packed_q6k_quant(tb, r, i));
                let sc = std::array::from_fn(|k| tb[16 * k + r] as i8);
                let d = le_f16(tb, 256 + 2 * r);
                for (acc, tok) in acc.iter_mut().zip(&tokens) {
                    let isum = q6k_block_sum(|i| q[i], sc, tok.quants(b), tok.sums(b));
                    acc[r] = accumulate_q6k(acc[r], d, tok.scales[b], isum);
                }
            }
        }
    }
    acc
}

/// Tile-blocks of a k-quant tile that the kernels hint ahead of the one they read
/// ([`prefetch_part`]): 9.3 KB of Q4_K, 13.3 KB of Q6_K.
#[cfg(target_arch = "x86_64")]
const KQ_AHEAD: usize = 4;

/// Part `part` of `parts` of the tile-block of `bytes` at `ahead`, hinted into L2, when the
/// kernel sweeps its tile for the first time (`first_sweep`: the first group of tokens; the
/// later groups find the tile in cache), whatever the number of tokens `G`: a kernel calls
/// it once per step of its inner loop, so the hints for a tile-block further on are spread
/// over the arithmetic of this one instead of issued in a burst. A prefetch never faults,
/// whatever the address (a safe intrinsic), and never changes a result.
///
/// Measured on an earlier development machine (2 threads, 16 distinct [8960 × 1536]
/// matrices so that every sweep comes from DRAM, variants interleaved, medians of 15
/// rounds): from three tokens on, spreading the hints four tile-blocks ahead took 4 tokens
/// from 2.16× to 1.18× the one-token time on Q6_K and from 1.49× to 1.28× on Q4_K (hints into
/// L1, `T0`, did worse); there up to two tokens ran as fast without hints. On the current
/// machine (`specdec bench model`, the three models, hints for every `G` against `G ≥ 3`
/// interleaved, 4 rounds of medians of 9) hints for one and two tokens pay as well: decode
/// 290 → 353 tokens/s on SmolLM2-135M (Q4_1, the 32-block kernels), 47 → 67 on
/// Qwen2.5-Coder-0.5B, 19.1 → 23.2 on the 1.5B; two tokens 25.1 → 17.6 ms on the 0.5B; three
/// and four unchanged. So the hints are on for every `G`.
#[inline]
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse")]
pub(super) fn prefetch_part(
    first_sweep: bool,
    ahead: *const u8,
    bytes: usize,
    part: usize,
    parts: usize,
) {
    if first_sweep {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let lines = bytes / 64;
        for line in part * lines / parts..(part + 1) * lines / parts {
            _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64 * line).cast());
        }
    }
}

// The AVX-512 intrinsics are stable since Rust 1.89, the workspace's `rust-version`.
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    //! The tile kernels. Per tile-block and token: the integer dot products of each scale group
    //! accumulate sixteen rows at once with `vpdpbusd` against a broadcast 32-bit word of the
    //! token's quants, the group scales apply lane-wise (`vpmulld`), and one or two fused
    //! multiply-adds fold the block into the sixteen accumulators. Up to eight tokens share each
    //! decoded weight register (a verify step of K = 4 drafts is 5 tokens: one sweep of the
    //! tile, not 4 + 1; measured on Qwen2.5-Coder-1.5B here, 5 / 8 tokens took 6 / 12% less
    //! than with groups of at most four). Each token's sums are computed in the same order
    //! whatever its group, so the results do not depend on the grouping.
    //!
    //! Launch-size reasoning (per tile-block, `G` tokens): Q4_K reads 2368 bytes and issues
    //! `64·G` `vpdpbusd` + `8·G` `vpmulld` + 96 decode operations; Q6_K reads 3392 bytes and
    //! issues `64·G` + `16·G` + ~210. At `G = 1` the decode and the products together stay under
    //! the time to stream the bytes from DRAM on one core of the development machine, so decode
    //! is bound by memory; as `G` grows the `vpdpbusd` count is what grows.

    use super::{TokenBlocks, TILE_ROWS};
    use std::arch::x86_64::*;

    /// A 64-byte load at `p` (unaligned allowed).
    ///
    /// # Safety
    /// `p .. p + 64` must be readable; the CPU must support AVX-512 F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(in crate::quant) unsafe fn load(p: *const u8) -> __m512i {
        // SAFETY: the caller guarantees 64 readable bytes.
        unsafe { _mm512_loadu_si512(p.cast()) }
    }

    /// The 32-bit word at `p`, broadcast to all sixteen lanes.
    ///
    /// # Safety
    /// `p .. p + 4` must be readable; the CPU must support AVX-512 F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(in crate::quant) unsafe fn broadcast_word(p: *const i8) -> __m512i {
        // SAFETY: the caller guarantees 4 readable bytes; unaligned reads are allowed.
        _mm512_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
    }

    /// Sixteen f16 at `p` as f32.
    ///
    /// # Safety
    /// `p .. p + 32` must be readable; the CPU must support AVX-512 F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(in crate::quant) unsafe fn load_f16x16(p: *const u8) -> __m512 {
        // SAFETY: 32 readable bytes (caller).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }

    /// The sixteen outputs of one Q4_K tile against `G` tokens (`first_sweep`: these are the
    /// first tokens the tile meets in this product, see [`prefetch_part`]).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, BW, VL and VNNI; `tile` holds `blocks` tile-blocks and
    /// every token `blocks` activation blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn q4k_tile<const G: usize>(
        tile: &[u8],
        tokens: [TokenBlocks<'_>; G],
        first_sweep: bool,
    ) -> [[f32; TILE_ROWS]; G] {
        let mask = _mm512_set1_epi8(15);
        let mut acc = [_mm512_setzero_ps(); G];
        for (b, tb) in tile.chunks_exact(super::Q4K_TILE_BLOCK).enumerate() {
            let tb = tb.as_ptr();
            let ahead = tb.wrapping_add(super::KQ_AHEAD * super::Q4K_TILE_BLOCK);
            let mut isum = [_mm512_setzero_si512(); G];
            for j in 0..8 {
                super::prefetch_part(first_sweep, ahead, super::Q4K_TILE_BLOCK, j, 8);
                let mut dots = [[_mm512_setzero_si512(); 2]; G];
                for p in 0..4 {
                    // SAFETY: `320 + 256j + 64p + 64 ≤ 2368` bytes of the tile-block.
                    let packed = unsafe { load(tb.add(super::Q4K_QUANTS + 256 * j + 64 * p)) };
                    let low = _mm512_and_si512(packed, mask);
                    let high = _mm512_and_si512(_mm512_srli_epi16::<4>(packed), mask);
                    for g in 0..G {
                        // SAFETY: element `256b + 32j + 8p + 8 ≤ cols` of the token's quants.
                        unsafe {
                            let a = tokens[g].quants.as_ptr().add(256 * b + 32 * j + 8 * p);
                            dots[g][0] = _mm512_dpbusd_epi32(dots[g][0], low, broadcast_word(a));
                            // two chains per token, low and high nibbles (latency)
                            dots[g][1] =
                                _mm512_dpbusd_epi32(dots[g][1], high, broadcast_word(a.add(4)));
                        }
                    }
                }
                // SAFETY: 16 bytes of scales at `16j`.
                let sc = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(tb.add(16 * j).cast()) });
                for g in 0..G {
                    let dot = _mm512_add_epi32(dots[g][0], dots[g][1]);
                    isum[g] = _mm512_add_epi32(isum[g], _mm512_mullo_epi32(dot, sc));
                }
            }
            let mut msum = [_mm512_setzero_si512(); G];
            for p in 0..4 {
                // SAFETY: 32 bytes of min pairs at `128 + 32p`.
                let mins = _mm512_cvtepu8_epi16(unsafe {
                    _mm256_loadu_si256(tb.add(128 + 32 * p).cast())
                });
                for g in 0..G {
                    // SAFETY: sub-block sums `8b + 2p`, `8b + 2p + 1` of the token.
                    let pair = unsafe {
                        broadcast_word(tokens[g].subblock_sums.as_ptr().add(8 * b + 2 * p).cast())
                    };
                    msum[g] = _mm512_add_epi32(msum[g], _mm512_madd_epi16(mins, pair));
                }
            }
            // SAFETY: 32 bytes each at 256 and 288.
            let (d, dmin) = unsafe { (load_f16x16(tb.add(256)), load_f16x16(tb.add(288))) };
            for g in 0..G {
                let da = _mm512_set1_ps(tokens[g].scales[b]);
                acc[g] = _mm512_fmadd_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(isum[g]), acc[g]);
                acc[g] =
                    _mm512_fnmadd_ps(_mm512_mul_ps(dmin, da), _mm512_cvtepi32_ps(msum[g]), acc[g]);
            }
        }
        store(acc)
    }

    /// The sixteen outputs of one Q6_K tile against `G` tokens (`first_sweep` as in
    /// [`q4k_tile`]).
    ///
    /// # Safety
    /// As [`q4k_tile`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn q6k_tile<const G: usize>(
        tile: &[u8],
        tokens: [TokenBlocks<'_>; G],
        first_sweep: bool,
    ) -> [[f32; TILE_ROWS]; G] {
        let m4 = _mm512_set1_epi8(15);
        let m30 = _mm512_set1_epi8(0x30);
        let mut acc = [_mm512_setzero_ps(); G];
        for (b, tb) in tile.chunks_exact(super::Q6K_TILE_BLOCK).enumerate() {
            let tb = tb.as_ptr();
            let ahead = tb.wrapping_add(super::KQ_AHEAD * super::Q6K_TILE_BLOCK);
            let mut isum = [_mm512_setzero_si512(); G];
            for k in 0..16 {
                super::prefetch_part(first_sweep, ahead, super::Q6K_TILE_BLOCK, k, 16);
                // SAFETY: the group's 192 bytes end at `320 + 192k + 192 ≤ 3392`.
                let (nib0, nib1, high) = unsafe {
                    let group = tb.add(super::Q6K_QUANTS + 192 * k);
                    (load(group), load(group.add(64)), load(group.add(128)))
                };
                // quants of step t: low nibble | (high bits 2t..2t+2) << 4, as `low | (h & 0x30)`
                let with_high = |low: __m512i, shifted: __m512i| {
                    _mm512_ternarylogic_epi32::<0xF8>(low, shifted, m30)
                };
                let w = [
                    with_high(_mm512_and_si512(nib0, m4), _mm512_slli_epi16::<4>(high)),
                    with_high(
                        _mm512_and_si512(_mm512_srli_epi16::<4>(nib0), m4),
                        _mm512_slli_epi16::<2>(high),
                    ),
                    with_high(_mm512_and_si512(nib1, m4), high),
                    with_high(
                        _mm512_and_si512(_mm512_srli_epi16::<4>(nib1), m4),
                        _mm512_srli_epi16::<2>(high),
                    ),
                ];
                // SAFETY: 16 bytes of scales at `16k`.
                let sc = _mm512_cvtepi8_epi32(unsafe { _mm_loadu_si128(tb.add(16 * k).cast()) });
                for g in 0..G {
                    // SAFETY: group `16b + k` of the token: its offset and its 16 quants.
                    unsafe {
                        let offset = *tokens[g].offset_sums.as_ptr().add(16 * b + k);
                        let a = tokens[g].quants.as_ptr().add(256 * b + 16 * k);
                        let mut dot = _mm512_set1_epi32(offset);
                        for (t, &wt) in w.iter().enumerate() {
                            dot = _mm512_dpbusd_epi32(dot, wt, broadcast_word(a.add(4 * t)));
                        }
                        isum[g] = _mm512_add_epi32(isum[g], _mm512_mullo_epi32(dot, sc));
                    }
                }
            }
            // SAFETY: 32 bytes at 256.
            let d = unsafe { load_f16x16(tb.add(256)) };
            for g in 0..G {
                let da = _mm512_set1_ps(tokens[g].scales[b]);
                acc[g] = _mm512_fmadd_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(isum[g]), acc[g]);
            }
        }
        store(acc)
    }

    /// The accumulators as arrays.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(in crate::quant) fn store<const G: usize>(acc: [__m512; G]) -> [[f32; TILE_ROWS]; G] {
        // SAFETY: `__m512` and `[f32; 16]` have the same size, and every bit pattern is valid.
        acc.map(|v| unsafe { std::mem::transmute::<__m512, [f32; TILE_ROWS]>(v) })
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    //! The tile kernels for CPUs with AVX2 and no AVX-512 VNNI: each half of a tile (rows
    //! `0..8`, `8..16`) in one 256-bit register, so the layout and the lane-wise arithmetic are
    //! those of [`super::avx512`], with `vpdpbusd` replaced by `vpmaddubsw` (u8 × i8 pair sums
    //! in 16 bits) and `vpmaddwd` (pairs into the 32-bit lane of each row). The 16-bit pair sums
    //! never saturate: a Q4_K lane adds eight of them per sub-block, at most
    //! `16 · 15 · 127 = 30480`; a Q6_K lane two, at most `4 · 63 · 127 = 32004`. So the block
    //! integers are exact and each row's float steps are the module's own (bit-identical to every
    //! other level, tested). Tokens come at most four at a time (sixteen registers).

    use super::{TokenBlocks, TILE_ROWS};
    use std::arch::x86_64::*;

    /// Rows per half-tile (the 32-bit lanes of a 256-bit register).
    const HALF: usize = TILE_ROWS / 2;

    /// A 32-byte load at `p` (unaligned allowed).
    ///
    /// # Safety
    /// `p .. p + 32` must be readable; the CPU must support AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(in crate::quant) unsafe fn load(p: *const u8) -> __m256i {
        // SAFETY: the caller guarantees 32 readable bytes.
        unsafe { _mm256_loadu_si256(p.cast()) }
    }

    /// The 32-bit word at `p`, broadcast to all eight lanes.
    ///
    /// # Safety
    /// `p .. p + 4` must be readable; the CPU must support AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn broadcast_word(p: *const i8) -> __m256i {
        // SAFETY: the caller guarantees 4 readable bytes; unaligned reads are allowed.
        _mm256_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
    }

    /// Eight f16 at `p` as f32.
    ///
    /// # Safety
    /// `p .. p + 16` must be readable; the CPU must support AVX2 and F16C.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub(in crate::quant) unsafe fn load_f16x8(p: *const u8) -> __m256 {
        // SAFETY: 16 readable bytes (caller).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }

    /// Eight bytes at `p` as the eight lanes' 32-bit integers (`signed`: as i8, else as u8).
    ///
    /// # Safety
    /// `p .. p + 8` must be readable; the CPU must support AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load_bytes8(p: *const u8, signed: bool) -> __m256i {
        // SAFETY: 8 readable bytes (caller); unaligned reads are allowed.
        let bytes = unsafe { _mm_loadl_epi64(p.cast()) };
        match signed {
            true => _mm256_cvtepi8_epi32(bytes),
            false => _mm256_cvtepu8_epi32(bytes),
        }
    }

    /// The sixteen outputs of one Q4_K tile against `G ≤ 4` tokens (`first_sweep` as in
    /// [`super::avx512::q4k_tile`]).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `tile` holds `blocks` tile-blocks and every
    /// token `blocks` activation blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4k_tile<const G: usize>(
        tile: &[u8],
        tokens: [TokenBlocks<'_>; G],
        first_sweep: bool,
    ) -> [[f32; TILE_ROWS]; G] {
        let mask = _mm256_set1_epi8(15);
        let mut acc = [[_mm256_setzero_ps(); G]; 2];
        for (b, tb) in tile.chunks_exact(super::Q4K_TILE_BLOCK).enumerate() {
            let tb = tb.as_ptr();
            let ahead = tb.wrapping_add(super::KQ_AHEAD * super::Q4K_TILE_BLOCK);
            for (h, acc) in acc.iter_mut().enumerate() {
                let mut isum = [_mm256_setzero_si256(); G];
                for j in 0..8 {
                    super::prefetch_part(first_sweep, ahead, super::Q4K_TILE_BLOCK, 8 * h + j, 16);
                    // SAFETY: 8 bytes of scales at `16j + 8h`; each lane (sc, sc) as two i16
                    let sc = unsafe { load_bytes8(tb.add(16 * j + HALF * h), false) };
                    let sc = _mm256_or_si256(sc, _mm256_slli_epi32::<16>(sc));
                    let mut dots = [_mm256_setzero_si256(); G];
                    for p in 0..4 {
                        // SAFETY: `320 + 256j + 64p + 32h + 32 ≤ 2368` bytes of the tile-block.
                        let packed =
                            unsafe { load(tb.add(super::Q4K_QUANTS + 256 * j + 64 * p + 32 * h)) };
                        let low = _mm256_and_si256(packed, mask);
                        let high = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), mask);
                        for g in 0..G {
                            // SAFETY: element `256b + 32j + 8p + 8 ≤ cols` of the token's quants.
                            unsafe {
                                let a = tokens[g].quants.as_ptr().add(256 * b + 32 * j + 8 * p);
                                let pairs = _mm256_add_epi16(
                                    _mm256_maddubs_epi16(low, broadcast_word(a)),
                                    _mm256_maddubs_epi16(high, broadcast_word(a.add(4))),
                                );
                                dots[g] = _mm256_add_epi16(dots[g], pairs);
                            }
                        }
                    }
                    for g in 0..G {
                        isum[g] = _mm256_add_epi32(isum[g], _mm256_madd_epi16(dots[g], sc));
                    }
                }
                let mut msum = [_mm256_setzero_si256(); G];
                for p in 0..4 {
                    // SAFETY: 16 bytes of min pairs at `128 + 32p + 16h`.
                    let mins = _mm256_cvtepu8_epi16(unsafe {
                        _mm_loadu_si128(tb.add(128 + 32 * p + 16 * h).cast())
                    });
                    for g in 0..G {
                        // SAFETY: sub-block sums `8b + 2p`, `8b + 2p + 1` of the token.
                        let pair = unsafe {
                            broadcast_word(
                                tokens[g].subblock_sums.as_ptr().add(8 * b + 2 * p).cast(),
                            )
                        };
                        msum[g] = _mm256_add_epi32(msum[g], _mm256_madd_epi16(mins, pair));
                    }
                }
                // SAFETY: 16 bytes each at `256 + 16h` and `288 + 16h`.
                let (d, dmin) = unsafe {
                    (
                        load_f16x8(tb.add(256 + 16 * h)),
                        load_f16x8(tb.add(288 + 16 * h)),
                    )
                };
                for g in 0..G {
                    let da = _mm256_set1_ps(tokens[g].scales[b]);
                    let a = &mut acc[g];
                    *a = _mm256_fmadd_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(isum[g]), *a);
                    *a = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(msum[g]), *a);
                }
            }
        }
        store(acc)
    }

    /// The sixteen outputs of one Q6_K tile against `G ≤ 4` tokens (`first_sweep` as in
    /// [`super::avx512::q4k_tile`]).
    ///
    /// # Safety
    /// As [`q4k_tile`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q6k_tile<const G: usize>(
        tile: &[u8],
        tokens: [TokenBlocks<'_>; G],
        first_sweep: bool,
    ) -> [[f32; TILE_ROWS]; G] {
        let m4 = _mm256_set1_epi8(15);
        let m30 = _mm256_set1_epi8(0x30);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); G]; 2];
        for (b, tb) in tile.chunks_exact(super::Q6K_TILE_BLOCK).enumerate() {
            let tb = tb.as_ptr();
            let ahead = tb.wrapping_add(super::KQ_AHEAD * super::Q6K_TILE_BLOCK);
            for (h, acc) in acc.iter_mut().enumerate() {
                let mut isum = [_mm256_setzero_si256(); G];
                for k in 0..16 {
                    super::prefetch_part(first_sweep, ahead, super::Q6K_TILE_BLOCK, 16 * h + k, 32);
                    // SAFETY: the half's bytes of the group's 192 end at `320 + 192k + 160 + 32`.
                    let (nib0, nib1, high) = unsafe {
                        let group = tb.add(super::Q6K_QUANTS + 192 * k + 32 * h);
                        (load(group), load(group.add(64)), load(group.add(128)))
                    };
                    // quants of step t: low nibble | (high bits 2t..2t+2) << 4
                    let with_high = |low: __m256i, shifted: __m256i| {
                        _mm256_or_si256(low, _mm256_and_si256(shifted, m30))
                    };
                    let w = [
                        with_high(_mm256_and_si256(nib0, m4), _mm256_slli_epi16::<4>(high)),
                        with_high(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(nib0), m4),
                            _mm256_slli_epi16::<2>(high),
                        ),
                        with_high(_mm256_and_si256(nib1, m4), high),
                        with_high(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(nib1), m4),
                            _mm256_srli_epi16::<2>(high),
                        ),
                    ];
                    // SAFETY: 8 bytes of scales at `16k + 8h`.
                    let sc = unsafe { load_bytes8(tb.add(16 * k + HALF * h), true) };
                    for g in 0..G {
                        // SAFETY: group `16b + k` of the token: its offset and its 16 quants.
                        unsafe {
                            let offset = *tokens[g].offset_sums.as_ptr().add(16 * b + k);
                            let a = tokens[g].quants.as_ptr().add(256 * b + 16 * k);
                            let step =
                                |t: usize| _mm256_maddubs_epi16(w[t], broadcast_word(a.add(4 * t)));
                            let dot = _mm256_add_epi32(
                                _mm256_madd_epi16(_mm256_add_epi16(step(0), step(1)), ones),
                                _mm256_madd_epi16(_mm256_add_epi16(step(2), step(3)), ones),
                            );
                            let dot = _mm256_add_epi32(_mm256_set1_epi32(offset), dot);
                            isum[g] = _mm256_add_epi32(isum[g], _mm256_mullo_epi32(dot, sc));
                        }
                    }
                }
                // SAFETY: 16 bytes at `256 + 16h`.
                let d = unsafe { load_f16x8(tb.add(256 + 16 * h)) };
                for g in 0..G {
                    let da = _mm256_set1_ps(tokens[g].scales[b]);
                    acc[g] =
                        _mm256_fmadd_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(isum[g]), acc[g]);
                }
            }
        }
        store(acc)
    }

    /// The accumulators (`acc[h][g]`: half `h` of token `g`) as one array per token.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(in crate::quant) fn store<const G: usize>(acc: [[__m256; G]; 2]) -> [[f32; TILE_ROWS]; G] {
        // SAFETY: `[__m256; 2]` and `[f32; 16]` have the same size, and every bit pattern is
        // valid.
        std::array::from_fn(|g| unsafe {
            std::mem::transmute::<[__m256; 2], [f32; TILE_ROWS]>([acc[0][g], acc[1][g]])
        })
    }
}
