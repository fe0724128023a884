//! CUDA launchers for the model-forward operations (`ops.cu`, `matmul_invariant.cu`), on device
//! buffers, with the contracts of the CPU functions in this folder:
//! [`rms_norm`](super::norm::rms_norm) (equal except when the f64 sum of squares rounds across an
//! f32 boundary), [`apply_rope`](super::rope::apply_rope) (bit-identical, given the same angle
//! tables), [`swiglu`](super::activation::swiglu) (within 8 ulp: CUDA's `expf`, within 2 ulp, vs the
//! CPU's [`exp_f32`](super::activation::exp_f32), within 1, and three roundings on each side), and
//! the batch-invariant matrix product (each output one FMA chain over `k` in order), and
//! [`sum_ranks`](super::reduce::sum_ranks) and
//! [`join_rank_columns`](super::reduce::join_rank_columns) (bit-identical).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::reduce::{check_join, check_sum_ranks};
use super::rope::RopeLayout;
use crate::cuda::nvrtc::cuda_error;
use crate::cuda::{sources, Gpu};
use crate::error::{KernelError, Result};
use crate::quant::cuda::DequantOutput;

/// A grid-stride launch of 256-thread blocks over `len` elements (at most 65 535 blocks).
fn grid_stride(len: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (len.div_ceil(256).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn mismatch(what: &str, expected: usize, actual: usize) -> KernelError {
    KernelError::ShapeMismatch {
        what: what.to_string(),
        expected,
        actual,
    }
}

/// RMSNorm of each row of `x` (`[rows × weight.len()]`) into `out`.
///
/// # Errors
/// [`KernelError::InvalidParameter`] for `dim == 0` or a bad `eps`; [`KernelError::ShapeMismatch`]
/// for sizes that do not fit; [`KernelError::Cuda`] on CUDA errors.
pub fn rms_norm_cuda(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    weight: &CudaSlice<f32>,
    eps: f32,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let dim = weight.len();
    if dim == 0 || !(eps >= 0.0 && eps.is_finite()) {
        return Err(KernelError::InvalidParameter {
            what: "rms_norm",
            reason: format!("dim {dim}, eps {eps}: need dim > 0 and a finite eps >= 0"),
        });
    }
    if !x.len().is_multiple_of(dim) {
        return Err(mismatch(
            "rms_norm input (multiple of dim)",
            x.len().div_ceil(dim) * dim,
            x.len(),
        ));
    }
    if out.len() != x.len() {
        return Err(mismatch("rms_norm output", x.len(), out.len()));
    }
    let rows = (x.len() / dim) as u32;
    if rows == 0 {
        return Ok(());
    }
    let f = gpu.function(&sources::OPS, "rms_norm_f32")?;
    let n = dim as u32;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(x).arg(weight).arg(out).arg(&n).arg(&eps);
    let cfg = LaunchConfig {
        grid_dim: (rows, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: x and out hold rows x dim floats, weight dim; argument order matches rms_norm_f32.
    unsafe { l.launch(cfg) }.map_err(|e| cuda_error("launch rms_norm_f32", e))?;
    Ok(())
}

/// Rotates `x` (`[tokens × heads × head_dim]`) in place with per-token `cos`/`sin` tables
/// (`[tokens × head_dim/2]`, e.g. the values of [`RopeAngles`](super::rope::RopeAngles)).
///
/// # Errors
/// [`KernelError::InvalidParameter`] for an odd or zero `head_dim`; [`KernelError::ShapeMismatch`]
/// for tables or `x` of the wrong size; [`KernelError::Cuda`] on CUDA errors.
pub fn rope_cuda(
    gpu: &Gpu,
    x: &mut CudaSlice<f32>,
    heads: usize,
    head_dim: usize,
    cos: &CudaSlice<f32>,
    sin: &CudaSlice<f32>,
    layout: RopeLayout,
) -> Result<()> {
    if head_dim == 0 || !head_dim.is_multiple_of(2) || head_dim > 2048 {
        return Err(KernelError::InvalidParameter {
            what: "rope head_dim",
            reason: format!("{head_dim} must be even, non-zero and <= 2048"),
        });
    }
    let half = head_dim / 2;
    let tokens = cos.len() / half;
    if cos.len() != sin.len() || !cos.len().is_multiple_of(half) {
        return Err(mismatch("rope sin table", cos.len(), sin.len()));
    }
    if x.len() != tokens * heads * head_dim {
        return Err(mismatch(
            "rope input [tokens x heads x head_dim]",
            tokens * heads * head_dim,
            x.len(),
        ));
    }
    if tokens == 0 || heads == 0 {
        return Ok(());
    }
    let f = gpu.function(&sources::OPS, "rope_f32")?;
    let (h, d, inter) = (
        heads as u32,
        head_dim as u32,
        u32::from(layout == RopeLayout::Interleaved),
    );
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(x).arg(cos).arg(sin).arg(&h).arg(&d).arg(&inter);
    let cfg = LaunchConfig {
        grid_dim: (tokens as u32, h, 1),
        block_dim: (half.min(1024) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: sizes checked above; argument order matches rope_f32.
    unsafe { l.launch(cfg) }.map_err(|e| cuda_error("launch rope_f32", e))?;
    Ok(())
}

/// SwiGLU `out = silu(gate) * up`, elementwise.
///
/// # Errors
/// [`KernelError::ShapeMismatch`] when the lengths differ; [`KernelError::Cuda`] on CUDA errors.
pub fn swiglu_cuda(
    gpu: &Gpu,
    gate: &CudaSlice<f32>,
    up: &CudaSlice<f32>,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    if up.len() != gate.len() {
        return Err(mismatch("swiglu up", gate.len(), up.len()));
    }
    if out.len() != gate.len() {
        return Err(mismatch("swiglu output", gate.len(), out.len()));
    }
    if gate.is_empty() {
        return Ok(());
    }
    let f = gpu.function(&sources::OPS, "swiglu_f32")?;
    let n = gate.len() as u64;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(gate).arg(up).arg(out).arg(&n);
    // SAFETY: the three buffers hold n floats; grid-stride loop bounded by n.
    unsafe { l.launch(grid_stride(gate.len())) }.map_err(|e| cuda_error("launch swiglu_f32", e))?;
    Ok(())
}

/// Batch-invariant product `out[m][n] = Σ_k a[m][k] · w[n][k]` (`a`: `[rows × k]` f32, `w`:
/// `[cols × k]` in f32, bf16 or f16, `out`: `[rows × cols]` f32): each output is one FMA chain
/// over `k` in order (weights widened to f32 exactly), so a row's result does not depend on
/// `rows` (bit-identical alone or in any batch).
///
/// # Errors
/// [`KernelError::ShapeMismatch`] for sizes that do not fit; [`KernelError::Cuda`] on CUDA errors.
pub fn matmul_invariant_cuda<W: DequantOutput>(
    gpu: &Gpu,
    a: &CudaSlice<f32>,
    w: &CudaSlice<W>,
    k: usize,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    if k == 0 || !a.len().is_multiple_of(k) || !w.len().is_multiple_of(k) {
        return Err(mismatch(
            "matmul operands (multiples of k)",
            a.len().div_ceil(k.max(1)) * k,
            a.len(),
        ));
    }
    let (rows, cols) = (a.len() / k, w.len() / k);
    if out.len() != rows * cols {
        return Err(mismatch(
            "matmul output [rows x cols]",
            rows * cols,
            out.len(),
        ));
    }
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    if rows.div_ceil(64) > 65_535 || [rows, cols, k].iter().any(|&d| d > u32::MAX as usize) {
        return Err(KernelError::InvalidParameter {
            what: "matmul_invariant",
            reason: format!("[{rows} x {k}] x [{cols} x {k}] exceeds the launch grid"),
        });
    }
    let name = format!("matmul_invariant_{}", W::SUFFIX);
    let f = gpu.function(&sources::MATMUL_INVARIANT, &name)?;
    let (r, c, kk) = (rows as u32, cols as u32, k as u32);
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(a).arg(w).arg(out).arg(&r).arg(&c).arg(&kk);
    let cfg = LaunchConfig {
        grid_dim: (c.div_ceil(64), r.div_ceil(64), 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: sizes checked above; argument order matches matmul_invariant_{f32,bf16,f16}
    // (a, w, out, rows, cols, k), and W is the kernel's weight type.
    unsafe { l.launch(cfg) }.map_err(|e| cuda_error(&format!("launch {name}"), e))?;
    Ok(())
}

/// Gathers rows `ids` of `table` (`[vocab × hidden]` in f32, bf16 or f16) into `out`
/// (`[ids.len() × hidden]` f32, each value widened exactly), as
/// [`embed_rows`](super::embedding::embed_rows) does from a quantised table.
///
/// # Errors
/// [`KernelError::OutOfRange`] for an id `>= vocab` (checked on the host, and by the kernel's
/// error flag); [`KernelError::ShapeMismatch`] for buffers that do not fit; [`KernelError::Cuda`]
/// on CUDA errors.
pub fn embedding_gather_cuda<T: DequantOutput>(
    gpu: &Gpu,
    table: &CudaSlice<T>,
    hidden: usize,
    ids: &[u32],
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    if hidden == 0 || !table.len().is_multiple_of(hidden) || hidden > u32::MAX as usize {
        return Err(mismatch(
            "embedding table (multiple of hidden)",
            table.len().div_ceil(hidden.max(1)) * hidden,
            table.len(),
        ));
    }
    let vocab = table.len() / hidden;
    if out.len() != ids.len() * hidden {
        return Err(mismatch(
            "embedding output [tokens x hidden]",
            ids.len() * hidden,
            out.len(),
        ));
    }
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(KernelError::OutOfRange {
            what: "token id".into(),
            index: bad as usize,
            limit: vocab,
        });
    }
    if ids.is_empty() {
        return Ok(());
    }
    if ids.len() > i32::MAX as usize || vocab > u32::MAX as usize {
        return Err(KernelError::InvalidParameter {
            what: "embedding_gather",
            reason: format!(
                "{} tokens of a {vocab}-row table exceed the launch grid",
                ids.len()
            ),
        });
    }
    let st = gpu.stream();
    let ids_d = st
        .clone_htod(ids)
        .map_err(|e| cuda_error("upload token ids", e))?;
    let mut flag = st
        .alloc_zeros::<u32>(1)
        .map_err(|e| cuda_error("alloc gather error flag", e))?;
    let name = format!("embedding_gather_{}", T::SUFFIX);
    let f = gpu.function(&sources::OPS, &name)?;
    let (h, v) = (hidden as u32, vocab as u32);
    let mut l = st.launch_builder(&f);
    l.arg(table)
        .arg(&ids_d)
        .arg(&mut *out)
        .arg(&h)
        .arg(&v)
        .arg(&mut flag);
    let cfg = LaunchConfig {
        grid_dim: (ids.len() as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: argument order matches embedding_gather_{f32,bf16,f16} (table, ids, out, hidden,
    // vocab, error_flag); table holds vocab x hidden values, out tokens x hidden, ids tokens.
    unsafe { l.launch(cfg) }.map_err(|e| cuda_error(&format!("launch {name}"), e))?;
    let flag = st
        .clone_dtoh(&flag)
        .map_err(|e| cuda_error("download gather error flag", e))?;
    if flag[0] != 0 {
        let token = flag[0] as usize - 1;
        return Err(KernelError::OutOfRange {
            what: format!("token id at position {token} (seen by the kernel)"),
            index: ids[token] as usize,
            limit: vocab,
        });
    }
    Ok(())
}

/// Rounds `x` (f32) to bf16 (nearest even) into `out` of the same length: the activations'
/// rounding before a bf16 cuBLAS product.
///
/// # Errors
/// [`KernelError::ShapeMismatch`] when the lengths differ; [`KernelError::Cuda`] on CUDA errors.
pub fn cast_bf16_cuda(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    out: &mut CudaSlice<half::bf16>,
) -> Result<()> {
    if out.len() != x.len() {
        return Err(mismatch("bf16 cast output", x.len(), out.len()));
    }
    if x.is_empty() {
        return Ok(());
    }
    let f = gpu.function(&sources::OPS, "cast_f32_bf16")?;
    let n = x.len() as u64;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(x).arg(out).arg(&n);
    // SAFETY: x and out hold n elements (checked); argument order matches cast_f32_bf16.
    unsafe { l.launch(grid_stride(x.len())) }.map_err(|e| cuda_error("launch cast_f32_bf16", e))?;
    Ok(())
}

/// `x[i] += y[i % y.len()]` for every element of `x`: a residual add when the lengths are equal,
/// a bias added to every row when `y` is one row of `x`.
///
/// # Errors
/// [`KernelError::ShapeMismatch`] when `x.len()` is not a multiple of a non-empty `y.len()`;
/// [`KernelError::Cuda`] on CUDA errors.
pub fn add_broadcast_cuda(gpu: &Gpu, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>) -> Result<()> {
    if y.is_empty() || !x.len().is_multiple_of(y.len()) {
        return Err(mismatch(
            "broadcast add (x a multiple of y)",
            x.len().div_ceil(y.len().max(1)) * y.len(),
            x.len(),
        ));
    }
    if x.is_empty() {
        return Ok(());
    }
    let f = gpu.function(&sources::OPS, "add_broadcast_f32")?;
    let (n, period) = (x.len() as u64, y.len() as u64);
    let cfg = grid_stride(x.len());
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(x).arg(y).arg(&n).arg(&period);
    // SAFETY: x holds n and y period elements, period > 0 divides n (checked); argument order
    // matches add_broadcast_f32 (x, y, len, period).
    unsafe { l.launch(cfg) }.map_err(|e| cuda_error("launch add_broadcast_f32", e))?;
    Ok(())
}

/// The rank-order sum of `world` partial buffers laid end to end in `gathered`
/// (`[world × out.len()]`) into `out`: [`sum_ranks`](super::reduce::sum_ranks) on the device,
/// bit-identical to it.
///
/// # Errors
/// As [`sum_ranks`](super::reduce::sum_ranks) (shapes); [`KernelError::Cuda`] on CUDA errors.
pub fn sum_ranks_cuda(
    gpu: &Gpu,
    gathered: &CudaSlice<f32>,
    world: usize,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    check_sum_ranks(gathered.len(), world, out.len())?;
    if out.is_empty() {
        return Ok(());
    }
    let world = world_u32(world)?;
    let f = gpu.function(&sources::OPS, "sum_ranks_f32")?;
    let len = out.len() as u64;
    let cfg = grid_stride(out.len());
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(gathered).arg(out).arg(&len).arg(&world);
    // SAFETY: gathered holds world × len and out len elements (checked); argument order matches
    // sum_ranks_f32 (gathered, out, len, world).
    unsafe { l.launch(cfg) }.map_err(|e| cuda_error("launch sum_ranks_f32", e))?;
    Ok(())
}

/// A rank count as the collective kernels take it.
fn world_u32(world: usize) -> Result<u32> {
    u32::try_from(world).map_err(|_| KernelError::InvalidParameter {
        what: "world",
        reason: format!("{world} ranks do not fit in 32 bits"),
    })
}

/// Joins the column blocks of `world` ranks gathered in `gathered` into whole rows of `out`:
/// [`join_rank_columns`](super::reduce::join_rank_columns) on the device, bit-identical to it.
///
/// # Errors
/// As [`join_rank_columns`](super::reduce::join_rank_columns) (shapes); [`KernelError::Cuda`] on
/// CUDA errors.
pub fn join_rank_columns_cuda(
    gpu: &Gpu,
    gathered: &CudaSlice<f32>,
    world: usize,
    stride: usize,
    rows: usize,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let cols = check_join(gathered.len(), world, stride, rows, out.len())?;
    if out.is_empty() {
        return Ok(());
    }
    let world = world_u32(world)?;
    let f = gpu.function(&sources::OPS, "join_rank_columns_f32")?;
    let (rows, cols, stride) = (rows as u64, cols as u64, stride as u64);
    let cfg = grid_stride(out.len());
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(gathered)
        .arg(out)
        .arg(&rows)
        .arg(&cols)
        .arg(&world)
        .arg(&stride);
    // SAFETY: out holds rows × cols and gathered world × stride elements with every rank's
    // block inside its stride (checked); argument order matches join_rank_columns_f32
    // (gathered, out, rows, cols, world, stride).
    unsafe { l.launch(cfg) }.map_err(|e| cuda_error("launch join_rank_columns_f32", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::testing::gpu_for_test;
    use crate::ops::activation::swiglu;
    use crate::ops::norm::rms_norm;
    use crate::ops::reduce::{join_rank_columns, split_even, sum_ranks};
    use crate::ops::rope::{apply_rope, RopeAngles};
    use crate::sampling::mix64;

    fn values(n: usize, salt: u64) -> Vec<f32> {
        (0..n)
            .map(|i| ((mix64(salt ^ i as u64) >> 40) as f32 / 4_194_304.0) - 2.0)
            .collect()
    }

    /// cos/sin tables exactly as `RopeAngles::new` computes them (f64 angles rounded once).
    fn tables(positions: &[usize], head_dim: usize, base: f32) -> (Vec<f32>, Vec<f32>) {
        let half = head_dim / 2;
        let (mut c, mut s) = (Vec::new(), Vec::new());
        for &p in positions {
            for i in 0..half {
                let angle = p as f64 * f64::from(base).powf(-((2 * i) as f64) / head_dim as f64);
                c.push(angle.cos() as f32);
                s.push(angle.sin() as f32);
            }
        }
        (c, s)
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn ops_match_cpu() {
        let Some(gpu) = gpu_for_test("ops::cuda::ops_match_cpu") else {
            return;
        };
        let st = gpu.stream();
        // RMSNorm: odd row length and a GPU-filling row count.
        for (rows, dim) in [(3usize, 333usize), (4096, 4096)] {
            let x = values(rows * dim, 1);
            let w = values(dim, 2);
            let mut want = vec![0.0; x.len()];
            rms_norm(&x, &w, 1e-5, &mut want).unwrap();
            let (xd, wd) = (st.clone_htod(&x).unwrap(), st.clone_htod(&w).unwrap());
            let mut od = st.alloc_zeros::<f32>(x.len()).unwrap();
            rms_norm_cuda(&gpu, &xd, &wd, 1e-5, &mut od).unwrap();
            let got = st.clone_dtoh(&od).unwrap();
            let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            assert!(
                differ * 1000 <= want.len(),
                "rms_norm: {differ} of {} differ",
                want.len()
            );
            for (a, b) in got.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                    "rms_norm {a} vs {b}"
                );
            }
        }
        // RoPE, both layouts: bit-identical.
        let (heads, hd) = (7, 128);
        let positions: Vec<usize> = (0..37).map(|i| i * 977 % 32768).collect();
        let angles = RopeAngles::new(&positions, hd, 1_000_000.0).unwrap();
        let (c, s) = tables(&positions, hd, 1_000_000.0);
        for layout in [RopeLayout::Interleaved, RopeLayout::HalfSplit] {
            let mut want = values(positions.len() * heads * hd, 3);
            let mut xd = st.clone_htod(&want).unwrap();
            apply_rope(&mut want, heads, &angles, layout).unwrap();
            let (cd, sd) = (st.clone_htod(&c).unwrap(), st.clone_htod(&s).unwrap());
            rope_cuda(&gpu, &mut xd, heads, hd, &cd, &sd, layout).unwrap();
            assert_eq!(st.clone_dtoh(&xd).unwrap(), want, "rope {layout:?}");
        }
        // SwiGLU within 8 ulp: the two exponentials differ by at most 3 ulp (expf 2, exp_f32 1);
        // `1 + e` passes that on damped by e / (1 + e) ≤ 1, and each side rounds three times.
        let (g, u) = (values(100_003, 4), values(100_003, 5));
        let mut want = vec![0.0; g.len()];
        swiglu(&g, &u, &mut want).unwrap();
        let (gd, ud) = (st.clone_htod(&g).unwrap(), st.clone_htod(&u).unwrap());
        let mut od = st.alloc_zeros::<f32>(g.len()).unwrap();
        swiglu_cuda(&gpu, &gd, &ud, &mut od).unwrap();
        for (a, b) in st.clone_dtoh(&od).unwrap().iter().zip(&want) {
            assert!(
                (a - b).abs() <= 8.0 * f32::EPSILON * b.abs().max(1e-30),
                "swiglu {a} vs {b}"
            );
        }
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn matmul_invariant_rows_are_batch_invariant() {
        let Some(gpu) = gpu_for_test("ops::cuda::matmul_invariant") else {
            return;
        };
        let st = gpu.stream();
        let (rows, cols, k) = (77usize, 131usize, 1000usize);
        let (a, w) = (values(rows * k, 6), values(cols * k, 7));
        let (ad, wd) = (st.clone_htod(&a).unwrap(), st.clone_htod(&w).unwrap());
        let mut od = st.alloc_zeros::<f32>(rows * cols).unwrap();
        matmul_invariant_cuda(&gpu, &ad, &wd, k, &mut od).unwrap();
        let all = st.clone_dtoh(&od).unwrap();
        // Each output is exactly the in-order FMA chain, so the CPU reproduces it bit for bit.
        for r in [0, 13, 76] {
            for c in 0..cols {
                let want = (0..k).fold(0.0f32, |acc, i| a[r * k + i].mul_add(w[c * k + i], acc));
                assert_eq!(all[r * cols + c], want, "row {r} col {c}");
            }
            // The same row alone: bit-identical.
            let one = st.clone_htod(&a[r * k..(r + 1) * k]).unwrap();
            let mut o1 = st.alloc_zeros::<f32>(cols).unwrap();
            matmul_invariant_cuda(&gpu, &one, &wd, k, &mut o1).unwrap();
            assert_eq!(
                st.clone_dtoh(&o1).unwrap(),
                all[r * cols..(r + 1) * cols].to_vec()
            );
        }
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn gather_cast_add_and_bf16_matmul() {
        let Some(gpu) = gpu_for_test("ops::cuda::gather_cast_add_and_bf16_matmul") else {
            return;
        };
        let st = gpu.stream();
        let (vocab, hidden) = (37usize, 300usize);
        let table: Vec<half::bf16> = values(vocab * hidden, 8)
            .into_iter()
            .map(half::bf16::from_f32)
            .collect();
        let ids = [3u32, 0, 36, 3];
        let td = st.clone_htod(&table).unwrap();
        let mut out = st.alloc_zeros::<f32>(ids.len() * hidden).unwrap();
        embedding_gather_cuda(&gpu, &td, hidden, &ids, &mut out).unwrap();
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| table[i as usize * hidden..(i as usize + 1) * hidden].iter())
            .map(|v| v.to_f32())
            .collect();
        assert_eq!(st.clone_dtoh(&out).unwrap(), want, "gather");
        assert!(embedding_gather_cuda(&gpu, &td, hidden, &[37], &mut out).is_err());
        // Cast: round to nearest even, as half's from_f32.
        let x = values(10_001, 9);
        let xd = st.clone_htod(&x).unwrap();
        let mut xb = st.alloc_zeros::<half::bf16>(x.len()).unwrap();
        cast_bf16_cuda(&gpu, &xd, &mut xb).unwrap();
        let want: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
        assert_eq!(st.clone_dtoh(&xb).unwrap(), want, "cast");
        // Broadcast add: a bias per row, then a residual.
        let (rows, cols) = (5usize, 77usize);
        let (a, b) = (values(rows * cols, 10), values(cols, 11));
        let mut ad = st.clone_htod(&a).unwrap();
        add_broadcast_cuda(&gpu, &mut ad, &st.clone_htod(&b).unwrap()).unwrap();
        let biased: Vec<f32> = a.iter().enumerate().map(|(i, v)| v + b[i % cols]).collect();
        assert_eq!(st.clone_dtoh(&ad).unwrap(), biased, "bias");
        add_broadcast_cuda(&gpu, &mut ad, &st.clone_htod(&a).unwrap()).unwrap();
        let summed: Vec<f32> = biased.iter().zip(&a).map(|(x, y)| x + y).collect();
        assert_eq!(st.clone_dtoh(&ad).unwrap(), summed, "residual");
        assert!(add_broadcast_cuda(&gpu, &mut ad, &st.clone_htod(&b[..4]).unwrap()).is_err());
        // bf16-weight invariant product: the in-order FMA chain over widened weights.
        let (rows, cols, k) = (9usize, 70usize, 300usize);
        let a = values(rows * k, 12);
        let w: Vec<half::bf16> = values(cols * k, 13)
            .into_iter()
            .map(half::bf16::from_f32)
            .collect();
        let mut od = st.alloc_zeros::<f32>(rows * cols).unwrap();
        let (adev, wdev) = (st.clone_htod(&a).unwrap(), st.clone_htod(&w).unwrap());
        matmul_invariant_cuda(&gpu, &adev, &wdev, k, &mut od).unwrap();
        let got = st.clone_dtoh(&od).unwrap();
        for r in 0..rows {
            for c in 0..cols {
                let want = (0..k).fold(0.0f32, |acc, i| {
                    a[r * k + i].mul_add(w[c * k + i].to_f32(), acc)
                });
                assert_eq!(got[r * cols + c], want, "bf16 matmul row {r} col {c}");
            }
        }
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn sum_ranks_equals_the_cpu_bit_for_bit() {
        let Some(gpu) = gpu_for_test("ops::cuda::sum_ranks_equals_the_cpu_bit_for_bit") else {
            return;
        };
        let st = gpu.stream();
        for (world, len) in [(1usize, 5usize), (2, 1537), (3, 70_001), (8, 300)] {
            let gathered = values(world * len, 20 + world as u64);
            let mut want = vec![0.0f32; len];
            sum_ranks(&gathered, world, &mut want).unwrap();
            let mut out = st.alloc_zeros::<f32>(len).unwrap();
            sum_ranks_cuda(&gpu, &st.clone_htod(&gathered).unwrap(), world, &mut out).unwrap();
            let got = st.clone_dtoh(&out).unwrap();
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "world {world}, len {len}"
            );
        }
        let short = st.clone_htod(&[1.0f32; 5]).unwrap();
        let mut out = st.alloc_zeros::<f32>(2).unwrap();
        assert!(sum_ranks_cuda(&gpu, &short, 3, &mut out).is_err());
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn join_rank_columns_equals_the_cpu_bit_for_bit() {
        let Some(gpu) = gpu_for_test("ops::cuda::join_rank_columns_equals_the_cpu_bit_for_bit")
        else {
            return;
        };
        let st = gpu.stream();
        for (rows, cols, world) in [
            (1usize, 9usize, 1usize),
            (3, 151_937, 2),
            (5, 49_153, 3),
            (2, 3, 4),
        ] {
            let stride = rows * split_even(cols, world, 0).len() + 1;
            let gathered = values(world * stride, 30 + world as u64);
            let mut want = vec![0.0f32; rows * cols];
            join_rank_columns(&gathered, world, stride, rows, &mut want).unwrap();
            let mut out = st.alloc_zeros::<f32>(rows * cols).unwrap();
            let gd = st.clone_htod(&gathered).unwrap();
            join_rank_columns_cuda(&gpu, &gd, world, stride, rows, &mut out).unwrap();
            let got = st.clone_dtoh(&out).unwrap();
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{rows} × {cols} over {world}"
            );
        }
        let mut out = st.alloc_zeros::<f32>(6).unwrap();
        let short = st.clone_htod(&[0.0f32; 4]).unwrap();
        assert!(join_rank_columns_cuda(&gpu, &short, 2, 2, 2, &mut out).is_err());
    }
}
