//! Quantised matrix product: GGUF weight blocks × f32 activations, without materialising the
//! f32 weights.
//!
//! `out[t][r] = Σ_c W[r][c] · x[t][c]` for weights `W: [rows × cols]` stored as GGUF rows of one
//! [`QuantType`], activations `x: [n_tokens × cols]` and `out: [n_tokens × rows]`, all
//! row-major f32.
//!
//! **How.** Parallel (rayon) over blocks of output rows; each weight row is read once for all
//! `n_tokens` (one sweep of the weights per call). A row is dequantised 256 elements at a time
//! into an L1-resident buffer and immediately consumed by every token, tokens being processed
//! up to four at a time so the dequantised weights stay in registers. Sixty-four lanes give
//! four independent fused-multiply-add chains per token (AVX-512), so even one token is not
//! bound by the FMA latency.
//!
//! **Fixed reduction order (batch invariance, path invariance).** Each output element has 64
//! partial sums ("lanes"): element `c` of the row goes to lane `c % 64` as
//! `lane = fma(w[c], x[c], lane)`, for `c` in increasing order; at the end the lanes are folded
//! pairwise (`l[k] += l[k + 32]` for k < 32, then `+16`, `+8`, `+4`, `+2`, `+1`). The sequence of rounded operations for
//! one output element depends only on that token's activations and the weight row, never on
//! `n_tokens`, the token's position in the batch, the thread split or the SIMD level: all
//! [`SimdLevel`]s give bit-identical results (they use the same fused multiply-adds and the
//! same lane structure). The CUDA port must keep this order to be bit-identical too.

use std::sync::OnceLock;

use rayon::prelude::*;

use super::dequant::{dequantize_blocks, with_block_format, BlockFormat};
use super::types::QuantType;
use crate::error::{KernelError, Result};

/// Partial sums per output element (see the module docs).
pub const LANES: usize = 64;
/// Elements dequantised at a time (a multiple of every block length).
const CHUNK: usize = 256;

/// Splits tokens `0..$n` into consecutive groups of the largest listed size (the list must be
/// `1, 2, ..., max`), the last group taking the remainder, and evaluates `$body` for each group
/// with `$t` its first token and `$G` its size as a `const` (so kernels monomorphise per size).
/// How tokens are grouped never changes a token's arithmetic (see the module docs).
macro_rules! for_token_groups {
    ($n:expr, [$($size:literal),+], $t:ident, $G:ident => $body:expr) => {{
        let n: usize = $n;
        let max: usize = 0 $(.max($size))+;
        let mut $t = 0;
        while $t < n {
            let group = (n - $t).min(max);
            match group {
                $($size => {
                    const $G: usize = $size;
                    $body
                })+
                _ => {}
            }
            $t += group;
        }
    }};
}
pub(crate) use for_token_groups;
/// Output rows per parallel task.
pub(crate) const ROWS_PER_TASK: usize = 16;

/// A borrowed quantised weight matrix `[rows × cols]`: `rows` consecutive GGUF rows of `cols`
/// elements of type `ty`, each `ty.row_bytes(cols)` bytes.
#[derive(Debug, Clone, Copy)]
pub struct QuantMatrix<'a> {
    ty: QuantType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    data: &'a [u8],
}

impl<'a> QuantMatrix<'a> {
    /// Wraps `data` as a `[rows × cols]` matrix of type `ty`.
    ///
    /// # Errors
    /// [`KernelError::NotBlockAligned`] when `cols` is not a multiple of the block length;
    /// [`KernelError::ShapeMismatch`] when `data.len() != rows * ty.row_bytes(cols)`.
    pub fn new(ty: QuantType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self> {
        let row_bytes = ty.row_bytes(cols)?;
        if data.len() != rows * row_bytes {
            return Err(KernelError::ShapeMismatch {
                what: format!("{ty} matrix bytes for [{rows} x {cols}]"),
                expected: rows * row_bytes,
                actual: data.len(),
            });
        }
        Ok(Self {
            ty,
            rows,
            cols,
            row_bytes,
            data,
        })
    }

    /// The element type.
    pub fn quant_type(&self) -> QuantType {
        self.ty
    }
    /// Number of rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Number of columns (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// The raw bytes of row `r` (`r < rows`, else a panic: an index bug in the caller).
    pub fn row(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
    /// The sub-matrix of rows `start..end` (for row-parallel sharding).
    ///
    /// # Errors
    /// [`KernelError::InvalidParameter`] when the range is empty-reversed or beyond `rows`.
    pub fn row_range(&self, start: usize, end: usize) -> Result<Self> {
        if start > end || end > self.rows {
            return Err(KernelError::InvalidParameter {
                what: "row range",
                reason: format!("{start}..{end} of a matrix with {} rows", self.rows),
            });
        }
        Ok(Self {
            rows: end - start,
            data: &self.data[start * self.row_bytes..end * self.row_bytes],
            ..*self
        })
    }
}

/// The instruction set a kernel is compiled for. Chosen once per process by
/// [`SimdLevel::detect`]; all levels give bit-identical results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimdLevel {
    /// Plain Rust, no target features (on x86_64 the fused multiply-add is a library call:
    /// slow, for tests and for CPUs without FMA).
    Portable,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
    /// x86_64 AVX-512 (F, BW, VL, VNNI) + AVX2 + FMA + F16C.
    Avx512,
}

impl SimdLevel {
    /// The best level this CPU supports (detected at run time, cached).
    pub fn detect() -> Self {
        static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
        *LEVEL.get_or_init(|| {
            [SimdLevel::Avx512, SimdLevel::Avx2]
                .into_iter()
                .find(|l| l.is_available())
                .unwrap_or(SimdLevel::Portable)
        })
    }

    /// `Ok` when this CPU can run kernels of this level.
    ///
    /// # Errors
    /// [`KernelError::InvalidParameter`] naming the level otherwise.
    pub fn ensure_available(self) -> Result<()> {
        if self.is_available() {
            Ok(())
        } else {
            Err(KernelError::InvalidParameter {
                what: "simd level",
                reason: format!("{self:?} is not supported by this CPU"),
            })
        }
    }

    /// Whether this CPU can run kernels of this level.
    pub fn is_available(self) -> bool {
        match self {
            SimdLevel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
                    && is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// `out = x · Wᵀ`: `x` is `[n_tokens × w.cols()]`, `out` is `[n_tokens × w.rows()]`, both
/// row-major, using the CPU's best [`SimdLevel`]. See the module docs for the reduction order.
///
/// # Errors
/// [`KernelError::ShapeMismatch`] when `x` or `out` has the wrong length.
pub fn quant_matmul(
    w: &QuantMatrix<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
) -> Result<()> {
    quant_matmul_with(w, x, n_tokens, out, SimdLevel::detect())
}

/// [`quant_matmul`] with an explicit [`SimdLevel`] (for tests and benchmarks).
///
/// # Errors
/// As [`quant_matmul`], and [`KernelError::InvalidParameter`] when `level` is not available on
/// this CPU.
pub fn quant_matmul_with(
    w: &QuantMatrix<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    level: SimdLevel,
) -> Result<()> {
    check_len("activations [n_tokens x cols]", n_tokens * w.cols, x.len())?;
    check_len("output [n_tokens x rows]", n_tokens * w.rows, out.len())?;
    level.ensure_available()?;
    if n_tokens == 0 || w.rows == 0 {
        return Ok(());
    }
    par_over_rows(w.rows, n_tokens, out, |first_row, chunk| {
        with_block_format!(w.ty, F => run_rows::<F>(level, w, x, n_tokens, first_row, chunk));
    });
    Ok(())
}

/// Runs `task(first_row, scratch)` in parallel over blocks of [`ROWS_PER_TASK`] output rows,
/// `scratch` being those rows' outputs as `[rows_in_block × n_tokens]` (for one token, the
/// output itself), and writes each block's results into `out` (`[n_tokens × rows]`) as soon as
/// its task ends, while they are in cache. Each output element is written by one task only.
///
/// # Panics
/// When `out.len() != rows * n_tokens` (every caller checks the shapes first).
pub(crate) fn par_over_rows(
    rows: usize,
    n_tokens: usize,
    out: &mut [f32],
    task: impl Fn(usize, &mut [f32]) + Sync,
) {
    assert_eq!(out.len(), rows * n_tokens, "par_over_rows: output length");
    if n_tokens == 1 {
        // `[rows × 1]` is `[1 × rows]`: the tasks write the output in place.
        out.par_chunks_mut(ROWS_PER_TASK)
            .enumerate()
            .for_each(|(i, chunk)| task(i * ROWS_PER_TASK, chunk));
        return;
    }
    let out = SharedOut(out.as_mut_ptr());
    (0..rows.div_ceil(ROWS_PER_TASK))
        .into_par_iter()
        .for_each_init(Vec::new, |scratch, i| {
            let first = i * ROWS_PER_TASK;
            let count = ROWS_PER_TASK.min(rows - first);
            scratch.clear();
            scratch.resize(count * n_tokens, 0.0f32);
            task(first, scratch);
            for (r, vals) in scratch.chunks_exact(n_tokens).enumerate() {
                for (t, &v) in vals.iter().enumerate() {
                    // SAFETY: `t < n_tokens` and `first + r < rows`, so the offset is inside
                    // `out` (length `rows · n_tokens`, asserted above), which outlives this
                    // loop; row `first + r` belongs to this task alone, so no other thread
                    // reads or writes the element.
                    unsafe { out.write(t * rows + first + r, v) };
                }
            }
        });
}

/// Runs `task(product, tile_out)` in parallel over every 16-row tile ([`ROWS_PER_TASK`]) of
/// several products that are computed together (e.g. the Q, K and V projections of one input):
/// `outs[p]` is product `p`'s output, `[n_tokens × rows_p]` with `rows_p` the first element.
/// The tiles of all products form one pool of tasks, so one parallel region serves them all.
/// Each task writes its results straight into the output through [`TileOut`] (no scratch
/// buffer, no transpose); each output element is written by one task only.
///
/// # Panics
/// When an output's length is not `rows_p * n_tokens` (every caller checks the shapes first).
pub(crate) fn par_over_tiles(
    outs: &mut [(usize, &mut [f32])],
    n_tokens: usize,
    task: impl Fn(usize, &mut TileOut<'_>) + Sync,
) {
    let mut first_tile = Vec::with_capacity(outs.len() + 1);
    first_tile.push(0);
    let mut shared = Vec::with_capacity(outs.len());
    for (rows, out) in outs.iter_mut() {
        assert_eq!(out.len(), *rows * n_tokens, "par_over_tiles: output length");
        first_tile.push(first_tile.last().copied().unwrap_or(0) + rows.div_ceil(ROWS_PER_TASK));
        shared.push((*rows, SharedOut(out.as_mut_ptr())));
    }
    let tiles = first_tile.last().copied().unwrap_or(0);
    (0..tiles).into_par_iter().for_each(|i| {
        // the product whose tiles include `i` (few products: a linear scan)
        let p = first_tile[1..].iter().position(|&end| i < end).unwrap_or(0);
        let (rows, ref out) = shared[p];
        let first = (i - first_tile[p]) * ROWS_PER_TASK;
        let mut tile_out = TileOut {
            out,
            rows,
            n_tokens,
            first,
            count: ROWS_PER_TASK.min(rows - first),
        };
        task(p, &mut tile_out);
    });
}

/// The outputs one task of [`par_over_tiles`] owns: rows `first_row() ..` (up to
/// [`ROWS_PER_TASK`] of them, fewer in a matrix's last tile) of every token.
pub(crate) struct TileOut<'a> {
    out: &'a SharedOut,
    rows: usize,
    n_tokens: usize,
    first: usize,
    count: usize,
}

impl TileOut<'_> {
    /// The first output row of the tile.
    pub(crate) fn first_row(&self) -> usize {
        self.first
    }

    /// Writes token `t`'s outputs of the tile: `values[r]` becomes row `first_row() + r` (the
    /// values past the matrix's last row are dropped).
    ///
    /// # Panics
    /// When `t` is not a token of the call.
    pub(crate) fn write(&mut self, t: usize, values: &[f32; ROWS_PER_TASK]) {
        assert!(
            t < self.n_tokens,
            "TileOut::write: token {t} of {}",
            self.n_tokens
        );
        // SAFETY: `t < n_tokens` and `first + count ≤ rows`, so the `count` elements from
        // `t · rows + first` lie inside the output (length `rows · n_tokens`, asserted by
        // `par_over_tiles`), which outlives the parallel loop; these rows belong to this task
        // alone, so no other thread reads or writes them.
        unsafe {
            std::ptr::copy_nonoverlapping(
                values.as_ptr(),
                self.out.0.add(t * self.rows + self.first),
                self.count,
            )
        };
    }
}

/// The output of [`par_over_rows`] or [`par_over_tiles`], written through by tasks that own
/// disjoint rows.
struct SharedOut(*mut f32);

impl SharedOut {
    /// Writes `v` at element `at`.
    ///
    /// # Safety
    /// `at` must be inside the output, and no other thread may access that element meanwhile.
    unsafe fn write(&self, at: usize, v: f32) {
        // SAFETY: forwarded to the caller.
        unsafe { *self.0.add(at) = v };
    }
}

// SAFETY: the pointer is only dereferenced for elements of rows a task owns (disjoint across
// tasks) while the borrowed output is alive (see `par_over_rows` and `par_over_tiles`).
unsafe impl Sync for SharedOut {}

/// The shared preconditions of the 8-bit products: `supported` (else the type is named),
/// `act_cols == w.cols()`, `out.len() == n_tokens * w.rows()`, and `level` available here.
/// Returns whether there is any work (`n_tokens > 0` and `w.rows() > 0`).
pub(crate) fn check_int8_product(
    w: &QuantMatrix<'_>,
    supported: bool,
    n_tokens: usize,
    act_cols: usize,
    out: &[f32],
    level: SimdLevel,
) -> Result<bool> {
    if !supported {
        let ty = w.quant_type();
        return Err(KernelError::UnsupportedQuantType {
            id: ty.ggml_id(),
            name: ty.name(),
        });
    }
    check_len("activation columns", w.cols(), act_cols)?;
    check_len("output [n_tokens x rows]", n_tokens * w.rows(), out.len())?;
    level.ensure_available()?;
    Ok(n_tokens > 0 && w.rows() > 0)
}

pub(crate) fn check_len(what: &str, expected: usize, actual: usize) -> Result<()> {
    if expected != actual {
        return Err(KernelError::ShapeMismatch {
            what: what.to_string(),
            expected,
            actual,
        });
    }
    Ok(())
}

/// Computes rows `first_row ..` (as many as `out.len() / n_tokens`) into `out`
/// (`[rows × n_tokens]`), dispatching to the SIMD variant.
fn run_rows<F: BlockFormat>(
    level: SimdLevel,
    w: &QuantMatrix<'_>,
    x: &[f32],
    n_tokens: usize,
    first_row: usize,
    out: &mut [f32],
) {
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `quant_matmul_with` checked `level.is_available()` (AVX-512 F/BW/VL + FMA).
        SimdLevel::Avx512 => unsafe { rows_avx512::<F>(w, x, n_tokens, first_row, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `quant_matmul_with` checked `level.is_available()` (AVX2 + FMA).
        SimdLevel::Avx2 => unsafe { rows_avx2::<F>(w, x, n_tokens, first_row, out) },
        _ => rows_generic::<F>(w, x, n_tokens, first_row, out),
    }
}

/// Defines `$name`, the generic row kernel compiled with the target features `$features`.
macro_rules! rows_with_features {
    ($name:ident, $features:literal) => {
        #[doc = concat!("The generic row kernel compiled for `", $features, "`.")]
        ///
        /// # Safety
        /// The CPU must support every feature named above.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<F: BlockFormat>(
            w: &QuantMatrix<'_>,
            x: &[f32],
            n_tokens: usize,
            first_row: usize,
            out: &mut [f32],
        ) {
            rows_generic::<F>(w, x, n_tokens, first_row, out)
        }
    };
}
rows_with_features!(rows_avx512, "avx512f,avx512bw,avx512vl,avx2,fma");
rows_with_features!(rows_avx2, "avx2,fma");

#[inline(always)]
fn rows_generic<F: BlockFormat>(
    w: &QuantMatrix<'_>,
    x: &[f32],
    n_tokens: usize,
    first_row: usize,
    out: &mut [f32],
) {
    let cols = w.cols;
    let mut buf = [0.0f32; CHUNK];
    for (i, out_row) in out.chunks_exact_mut(n_tokens).enumerate() {
        let row = w.row(first_row + i);
        for_token_groups!(n_tokens, [1, 2, 3, 4], t, G => {
            let sums = row_dot::<F, G>(row, cols, &x[t * cols..], &mut buf);
            out_row[t..t + G].copy_from_slice(&sums);
        });
    }
}

/// Dot products of one weight row with `G` consecutive activation rows starting at `x`.
#[inline(always)]
fn row_dot<F: BlockFormat, const G: usize>(
    row: &[u8],
    cols: usize,
    x: &[f32],
    buf: &mut [f32; CHUNK],
) -> [f32; G] {
    let mut acc = [[0.0f32; LANES]; G];
    let chunk_bytes = CHUNK / F::LEN * F::BYTES;
    for (c, start) in (0..cols).step_by(CHUNK).enumerate() {
        let len = CHUNK.min(cols - start);
        let bytes = &row[c * chunk_bytes..c * chunk_bytes + len / F::LEN * F::BYTES];
        let wv = &mut buf[..len];
        dequantize_blocks::<F>(bytes, wv);
        let xs: [&[f32]; G] = std::array::from_fn(|g| &x[g * cols + start..g * cols + start + len]);
        let full = len / LANES * LANES;
        for (v, wl) in wv[..full].chunks_exact(LANES).enumerate() {
            for (a, xg) in acc.iter_mut().zip(&xs) {
                let xl = &xg[v * LANES..(v + 1) * LANES];
                for k in 0..LANES {
                    a[k] = wl[k].mul_add(xl[k], a[k]);
                }
            }
        }
        for e in full..len {
            for (a, xg) in acc.iter_mut().zip(&xs) {
                a[e % LANES] = wv[e].mul_add(xg[e], a[e % LANES]);
            }
        }
    }
    acc.map(fold_lanes)
}

/// Folds the 64 lanes pairwise in the fixed order of the module docs.
#[inline(always)]
pub(crate) fn fold_lanes(mut l: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for k in 0..width {
            l[k] += l[k + width];
        }
        width /= 2;
    }
    l[0]
}
