//! CUDA launcher for GGUF dequantisation (`dequant.cu`): the values of
//! [`dequantize_row`](super::dequant::dequantize_row), bit for bit in f32 (the kernel rounds each
//! product and sum like the CPU, no FMA), or rounded once to bf16 / f16 for cuBLAS.

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits};

use super::qmatmul::{check_gather, check_product};
use super::types::QuantType;
use crate::cuda::nvrtc::cuda_error;
use crate::cuda::{sources, Gpu};
use crate::error::{KernelError, Result};

/// Element types the dequantiser writes: `f32`, and bf16 / f16 as their `u16` bit patterns.
pub trait DequantOutput: DeviceRepr + ValidAsZeroBits + Copy {
    /// Kernel-name suffix (`f32`, `bf16`, `f16`).
    const SUFFIX: &'static str;
}
impl DequantOutput for f32 {
    const SUFFIX: &'static str = "f32";
}
impl DequantOutput for half::bf16 {
    const SUFFIX: &'static str = "bf16";
}
impl DequantOutput for half::f16 {
    const SUFFIX: &'static str = "f16";
}

/// The kernel-name stem of a GGUF block type (`q4_k`, …), `None` for the float types.
fn block_stem(ty: QuantType) -> Option<&'static str> {
    Some(match ty {
        QuantType::Q8_0 => "q8_0",
        QuantType::Q4_0 => "q4_0",
        QuantType::Q4_1 => "q4_1",
        QuantType::Q5_0 => "q5_0",
        QuantType::Q4_K => "q4_k",
        QuantType::Q5_K => "q5_k",
        QuantType::Q6_K => "q6_k",
        _ => return None,
    })
}

fn kernel_name(ty: QuantType, out: &str) -> Result<String> {
    let base = match (block_stem(ty), ty) {
        (Some(stem), _) => stem,
        (None, QuantType::F16) if out != "f16" => "f16",
        (None, QuantType::BF16) if out != "bf16" => "bf16",
        _ => {
            return Err(KernelError::InvalidParameter {
                what: "dequantisation",
                reason: format!("no CUDA kernel from {ty} to {out} (copy the bytes instead)"),
            })
        }
    };
    Ok(format!("dequant_{base}_{out}"))
}

/// Whether [`qmatmul_cuda`] and [`qgather_cuda`] read blocks of type `ty` (the GGUF block
/// types; float matrices go through `matmul_invariant` instead).
pub fn qmatmul_supported(ty: QuantType) -> bool {
    block_stem(ty).is_some()
}

/// The stem of `ty` for the block-reading kernels, or the error naming it.
fn qmatmul_stem(ty: QuantType, what: &'static str) -> Result<&'static str> {
    block_stem(ty).ok_or_else(|| KernelError::InvalidParameter {
        what,
        reason: format!("{ty} is not a GGUF block type (use matmul_invariant for floats)"),
    })
}

/// `out = a · wᵀ` on the device reading `w`'s GGUF blocks (`w_rows` rows of `k` elements of
/// `ty`; `a`: `[m × k]` f32; `out`: `[m × w_rows]` f32), each output the in-order FMA chain of
/// [`qmatmul_fma`](super::qmatmul_fma), bit for bit: batch-invariant.
///
/// # Errors
/// [`KernelError::InvalidParameter`] for a float type or a shape past the launch grid;
/// [`KernelError::ShapeMismatch`] / [`KernelError::NotBlockAligned`] for buffers that do not
/// fit; [`KernelError::Cuda`] on CUDA errors.
pub fn qmatmul_cuda(
    gpu: &Gpu,
    ty: QuantType,
    a: &CudaSlice<f32>,
    w: &CudaSlice<u8>,
    w_rows: usize,
    k: usize,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let stem = qmatmul_stem(ty, "qmatmul")?;
    let row_bytes = ty.row_bytes(k)?;
    if w.len() != w_rows * row_bytes {
        return Err(KernelError::ShapeMismatch {
            what: format!("{ty} weight bytes for [{w_rows} x {k}]"),
            expected: w_rows * row_bytes,
            actual: w.len(),
        });
    }
    let m = check_product(a.len(), k, w_rows, out.len())?;
    if m == 0 || w_rows == 0 {
        return Ok(());
    }
    if m.div_ceil(64) > 65_535 || [m, w_rows, k].iter().any(|&d| d > u32::MAX as usize) {
        return Err(KernelError::InvalidParameter {
            what: "qmatmul",
            reason: format!("[{m} x {k}] x [{w_rows} x {k}] exceeds the launch grid"),
        });
    }
    let name = format!("qmatmul_{stem}");
    let f = gpu.function(&sources::QMATMUL, &name)?;
    let (r, c, kk, rb) = (m as u32, w_rows as u32, k as u32, row_bytes as u64);
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(a)
        .arg(w)
        .arg(&mut *out)
        .arg(&r)
        .arg(&c)
        .arg(&kk)
        .arg(&rb);
    let cfg = LaunchConfig {
        grid_dim: (c.div_ceil(64), r.div_ceil(64), 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: argument order matches qmatmul_<type> (a, w, out, rows, cols, k, row_bytes); a
    // holds m x k f32, w w_rows rows of row_bytes, out m x w_rows f32 (all checked above); the
    // grid covers the output in 64 x 64 tiles, each thread guarding its bounds.
    unsafe { l.launch(cfg) }.map_err(|e| cuda_error(&format!("launch {name}"), e))?;
    Ok(())
}

/// `out[t] = w[ids[t]]` dequantised on the device (`w`: rows of `width` elements of `ty`;
/// `out`: `[ids.len() × width]` f32), equal to [`qgather_rows`](super::qgather_rows).
///
/// # Errors
/// [`KernelError::OutOfRange`] for an id past the last row (checked on the host before the
/// launch); shapes and CUDA errors as [`qmatmul_cuda`].
pub fn qgather_cuda(
    gpu: &Gpu,
    ty: QuantType,
    w: &CudaSlice<u8>,
    width: usize,
    ids: &[u32],
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let stem = qmatmul_stem(ty, "qgather")?;
    let row_bytes = ty.row_bytes(width)?;
    if row_bytes == 0 || !w.len().is_multiple_of(row_bytes) {
        return Err(KernelError::ShapeMismatch {
            what: format!("{ty} table bytes (whole rows of {width})"),
            expected: w.len().div_ceil(row_bytes.max(1)) * row_bytes,
            actual: w.len(),
        });
    }
    check_gather(w.len() / row_bytes, width, ids, out.len())?;
    if ids.is_empty() {
        return Ok(());
    }
    if ids.len() > u32::MAX as usize || width > u32::MAX as usize {
        return Err(KernelError::InvalidParameter {
            what: "qgather",
            reason: format!("{} ids of width {width} exceed the launch grid", ids.len()),
        });
    }
    let st = gpu.stream();
    let ids_d = st
        .clone_htod(ids)
        .map_err(|e| cuda_error("upload token ids", e))?;
    let name = format!("qgather_{stem}");
    let f = gpu.function(&sources::QMATMUL, &name)?;
    let (n, wd, rb) = (ids.len() as u32, width as u32, row_bytes as u64);
    let mut l = st.launch_builder(&f);
    l.arg(w)
        .arg(&ids_d)
        .arg(&mut *out)
        .arg(&n)
        .arg(&wd)
        .arg(&rb);
    let total = ids.len() * width;
    let cfg = LaunchConfig {
        grid_dim: (total.div_ceil(256).min(132 * 32) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: argument order matches qgather_<type> (w, ids, out, n_ids, width, row_bytes);
    // every id is below the table's rows (checked), out holds n_ids x width f32; grid-stride.
    unsafe { l.launch(cfg) }.map_err(|e| cuda_error(&format!("launch {name}"), e))?;
    Ok(())
}

/// Dequantises `n` elements of type `ty` (`src`: whole blocks, `ty.row_bytes(n)` bytes) into
/// `out` (`n` elements of `O`).
///
/// # Errors
/// [`KernelError::NotBlockAligned`] / [`KernelError::ShapeMismatch`] as the CPU reader;
/// [`KernelError::InvalidParameter`] for a pair of types without a kernel;
/// [`KernelError::Cuda`] on CUDA errors.
pub fn dequantize_cuda<O: DequantOutput>(
    gpu: &Gpu,
    ty: QuantType,
    src: &CudaSlice<u8>,
    n: usize,
    out: &mut CudaSlice<O>,
) -> Result<()> {
    let name = kernel_name(ty, O::SUFFIX)?;
    let bytes = ty.row_bytes(n)?;
    if src.len() != bytes {
        return Err(KernelError::ShapeMismatch {
            what: format!("{ty} bytes for {n} elements"),
            expected: bytes,
            actual: src.len(),
        });
    }
    if out.len() != n {
        return Err(KernelError::ShapeMismatch {
            what: "dequantised output".into(),
            expected: n,
            actual: out.len(),
        });
    }
    if n == 0 {
        return Ok(());
    }
    let f = gpu.function(&sources::DEQUANT, &name)?;
    let nn = n as u64;
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(src).arg(out).arg(&nn);
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(256).min(132 * 32) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: src holds the n elements' blocks and out n values (checked); grid-stride over n.
    unsafe { l.launch(cfg) }.map_err(|e| cuda_error(&format!("launch {name}"), e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::testing::gpu_for_test;
    use crate::quant::dequant::dequantize_row_to_vec;
    use crate::sampling::mix64;

    /// The GGUF block types the device kernels decode.
    const BLOCK_TYPES: [QuantType; 7] = [
        QuantType::Q8_0,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q4_K,
        QuantType::Q5_K,
        QuantType::Q6_K,
    ];

    /// Random blocks with sane f16 scales (finite, moderate) at their header positions.
    fn random_blocks(ty: QuantType, n: usize, salt: u64) -> Vec<u8> {
        let mut b: Vec<u8> = (0..ty.row_bytes(n).unwrap())
            .map(|i| mix64(salt ^ i as u64) as u8)
            .collect();
        let (bb, scale_at): (usize, &[usize]) = match ty {
            QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q5_0 => (ty.block_bytes(), &[0]),
            QuantType::Q4_1 | QuantType::Q4_K | QuantType::Q5_K => (ty.block_bytes(), &[0, 2]),
            QuantType::Q6_K => (ty.block_bytes(), &[208]),
            _ => (2, &[0]),
        };
        for blk in b.chunks_mut(bb) {
            for &at in scale_at {
                let v = half::f16::from_f32(((blk[at] as f32) - 128.0) / 512.0)
                    .to_bits()
                    .to_le_bytes();
                blk[at] = v[0];
                blk[at + 1] = v[1];
            }
        }
        b
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn dequant_matches_cpu_bit_for_bit() {
        let Some(gpu) = gpu_for_test("quant::cuda::dequant") else {
            return;
        };
        let st = gpu.stream();
        for ty in BLOCK_TYPES
            .into_iter()
            .chain([QuantType::F16, QuantType::BF16])
        {
            for n in [256usize, 256 * 4099] {
                let bytes = random_blocks(ty, n, ty.ggml_id() as u64);
                let want = dequantize_row_to_vec(ty, &bytes, n).unwrap();
                let src = st.clone_htod(&bytes).unwrap();
                let mut out = st.alloc_zeros::<f32>(n).unwrap();
                dequantize_cuda(&gpu, ty, &src, n, &mut out).unwrap();
                let got = st.clone_dtoh(&out).unwrap();
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())),
                    "{ty} n {n}"
                );
                if ty != QuantType::BF16 {
                    let mut out16 = st.alloc_zeros::<half::bf16>(n).unwrap();
                    dequantize_cuda(&gpu, ty, &src, n, &mut out16).unwrap();
                    let got16 = st.clone_dtoh(&out16).unwrap();
                    assert!(
                        got16
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| *a == half::bf16::from_f32(*b) || b.is_nan()),
                        "{ty} to bf16"
                    );
                }
            }
        }
        let src = st.clone_htod(&[0u8; 10]).unwrap();
        let mut out = st.alloc_zeros::<f32>(32).unwrap();
        assert!(
            dequantize_cuda(&gpu, QuantType::Q8_0, &src, 32, &mut out).is_err(),
            "short input refused"
        );
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn qmatmul_and_qgather_match_their_cpu_twins_bit_for_bit() {
        use crate::quant::{qgather_rows, qmatmul_fma, QuantMatrix};
        let Some(gpu) = gpu_for_test("quant::cuda::qmatmul") else {
            return;
        };
        let st = gpu.stream();
        for ty in BLOCK_TYPES {
            // 70 rows: two column tiles, the second partial; k = 768: 24 k-steps, 3 K-blocks
            let (w_rows, k, m) = (70usize, 768usize, 67usize);
            let bytes = random_blocks(ty, w_rows * k, 7 + ty.ggml_id() as u64);
            let w = QuantMatrix::new(ty, w_rows, k, &bytes).unwrap();
            let a: Vec<f32> = (0..m * k)
                .map(|i| (mix64(i as u64) % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            let mut want = vec![0.0; m * w_rows];
            qmatmul_fma(&a, &w, &mut want).unwrap();
            let (ad, wd) = (st.clone_htod(&a).unwrap(), st.clone_htod(&bytes).unwrap());
            let mut od = st.alloc_zeros::<f32>(m * w_rows).unwrap();
            qmatmul_cuda(&gpu, ty, &ad, &wd, w_rows, k, &mut od).unwrap();
            let got = st.clone_dtoh(&od).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{ty} product");
            // one row alone (a different tile position): the same bits
            let one = st.clone_htod(&a[66 * k..]).unwrap();
            let mut o1 = st.alloc_zeros::<f32>(w_rows).unwrap();
            qmatmul_cuda(&gpu, ty, &one, &wd, w_rows, k, &mut o1).unwrap();
            assert_eq!(
                bits(&st.clone_dtoh(&o1).unwrap()),
                bits(&want[66 * w_rows..]),
                "{ty} alone"
            );
            let ids = [69u32, 0, 5, 69];
            let mut rows_want = vec![0.0; ids.len() * k];
            qgather_rows(&w, &ids, &mut rows_want).unwrap();
            let mut gd = st.alloc_zeros::<f32>(ids.len() * k).unwrap();
            qgather_cuda(&gpu, ty, &wd, k, &ids, &mut gd).unwrap();
            assert_eq!(
                bits(&st.clone_dtoh(&gd).unwrap()),
                bits(&rows_want),
                "{ty} gather"
            );
            assert!(
                qgather_cuda(&gpu, ty, &wd, k, &[70], &mut gd).is_err(),
                "{ty} bad id"
            );
        }
        let f32s = st.alloc_zeros::<u8>(4 * 32).unwrap();
        let a = st.alloc_zeros::<f32>(32).unwrap();
        let mut out = st.alloc_zeros::<f32>(1).unwrap();
        assert!(qmatmul_cuda(&gpu, QuantType::F32, &a, &f32s, 1, 32, &mut out).is_err());
    }
}
