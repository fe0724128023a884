//! CUDA launcher for GGUF dequantisation (`dequant.cu`): the values of
//! [`dequantize_row`](super::dequant::dequantize_row), bit for bit in f32 (the kernel rounds each
//! product and sum like the CPU, no FMA), or rounded once to bf16 / f16 for cuBLAS.

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits};

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

fn kernel_name(ty: QuantType, out: &str) -> Result<String> {
    let base = match ty {
        QuantType::Q8_0 => "q8_0",
        QuantType::Q4_0 => "q4_0",
        QuantType::Q4_1 => "q4_1",
        QuantType::Q5_0 => "q5_0",
        QuantType::Q4_K => "q4_k",
        QuantType::Q5_K => "q5_k",
        QuantType::Q6_K => "q6_k",
        QuantType::F16 if out != "f16" => "f16",
        QuantType::BF16 if out != "bf16" => "bf16",
        _ => {
            return Err(KernelError::InvalidParameter {
                what: "dequantisation",
                reason: format!("no CUDA kernel from {ty} to {out} (copy the bytes instead)"),
            })
        }
    };
    Ok(format!("dequant_{base}_{out}"))
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
        for ty in [
            QuantType::Q8_0,
            QuantType::Q4_0,
            QuantType::Q4_1,
            QuantType::Q5_0,
            QuantType::Q4_K,
            QuantType::Q5_K,
            QuantType::Q6_K,
            QuantType::F16,
            QuantType::BF16,
        ] {
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
}
