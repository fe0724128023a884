//! The decoder's matrix products on the device, `out = x · Wᵀ` (`x`: `[n × cols]` f32, `W`:
//! `[rows × cols]` GGUF blocks or bf16, `out`: `[n × rows]` f32), in one of two modes.

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use half::bf16;
use specdec_kernels::cuda::Gpu;
use specdec_kernels::ops::cuda::{cast_bf16_cuda, matmul_invariant_cuda};
use specdec_kernels::quant::cuda::{dequantize_cuda, qmatmul_cuda};

use super::device_error;
use super::weights::{DeviceMatrix, DeviceStorage};
use crate::error::{ModelError, Result};

/// How the device multiplies activations by weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuMatmul {
    /// Up to [`BLOCK_PRODUCT_MAX_TOKENS`] tokens, block weights through `qmatmul_cuda` (one
    /// pass over the blocks); otherwise cuBLAS `cublasGemmEx`: activations rounded to bf16 by a
    /// small kernel, bf16 weights (block ones dequantised to a scratch first), f32 accumulation
    /// (`CUBLAS_COMPUTE_32F`) and f32 output, on tensor cores. The path and cuBLAS's algorithm
    /// (and split-k) change with the number of tokens, so a token's logits may change in the
    /// last bits with the size of the forward: **not** batch-invariant.
    #[default]
    Fast,
    /// One fixed-order kernel for every number of tokens (`qmatmul_cuda` over block weights,
    /// `matmul_invariant_bf16` over bf16 ones): f32 activations, weights decoded or widened
    /// exactly, each output one FMA chain over the input dimension in order. A token's logits
    /// are bit-identical alone, in a chain, a tree or a batch. CUDA cores only (tensor cores
    /// accumulate in an unspecified order): expect decode (few rows, bandwidth bound on the
    /// weights) to cost about as much as the fast mode, and large prefills several times more
    /// (roughly 10–15% of the tensor-core rate).
    BatchInvariant,
}

/// The most tokens a [`GpuMatmul::Fast`] product reads block weights for directly; larger
/// products (prefill chunks) dequantise to bf16 and use tensor cores. Decode and verification
/// steps (1 to K + 1 tokens per sequence, a few sequences) stay under it. A first choice, to be
/// measured on the GPU against the matrix shapes of the three models.
pub const BLOCK_PRODUCT_MAX_TOKENS: usize = 16;

/// `(m, n, k)` of the column-major cuBLAS call computing `out[n × rows] = x[n × cols] · Wᵀ`
/// (row-major): `C[rows × n] = op(A) · B` with `A` the weight stored `[cols × rows]`
/// column-major (`transa = T`, `lda = cols`), `B` the activations `[cols × n]` (`ldb = cols`),
/// `C` the output `[rows × n]` (`ldc = rows`).
///
/// # Errors
/// [`ModelError::Shape`] when a dimension exceeds cuBLAS's `int`.
pub fn gemm_dims(rows: usize, cols: usize, n: usize) -> Result<(i32, i32, i32)> {
    let int = |what: &str, v: usize| {
        i32::try_from(v).map_err(|_| ModelError::Shape {
            what: "cuBLAS product".into(),
            reason: format!("{what} {v} exceeds i32"),
        })
    };
    Ok((int("rows", rows)?, int("tokens", n)?, int("cols", cols)?))
}

/// `out = x · wᵀ` for `n` rows of `x` in `mode`.
///
/// # Errors
/// [`ModelError::Shape`] for buffers that do not match `w` and `n`; CUDA and cuBLAS failures as
/// [`ModelError::Kernel`].
pub fn product(
    gpu: &Gpu,
    mode: GpuMatmul,
    x: &CudaSlice<f32>,
    n: usize,
    w: &DeviceMatrix,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let (rows, cols) = (w.rows(), w.cols());
    if x.len() != n * cols || out.len() != n * rows {
        return Err(ModelError::Shape {
            what: format!("product with {w:?}"),
            reason: format!(
                "input {} (want {n} x {cols}), output {} (want {n} x {rows})",
                x.len(),
                out.len()
            ),
        });
    }
    if n == 0 || rows == 0 {
        return Ok(());
    }
    match (mode, w.storage()) {
        (GpuMatmul::BatchInvariant, DeviceStorage::Bf16(data)) => {
            Ok(matmul_invariant_cuda(gpu, x, data, cols, out)?)
        }
        (GpuMatmul::BatchInvariant, DeviceStorage::Blocks { ty, bytes }) => {
            Ok(qmatmul_cuda(gpu, *ty, x, bytes, rows, cols, out)?)
        }
        (GpuMatmul::Fast, DeviceStorage::Blocks { ty, bytes }) if n <= BLOCK_PRODUCT_MAX_TOKENS => {
            Ok(qmatmul_cuda(gpu, *ty, x, bytes, rows, cols, out)?)
        }
        (GpuMatmul::Fast, DeviceStorage::Blocks { ty, bytes }) => {
            // a prefill-size product: the blocks once through bf16, then tensor cores (the
            // stream-ordered allocation is returned to the pool when `scratch` drops)
            let mut scratch = gpu
                .stream()
                .alloc_zeros::<bf16>(rows * cols)
                .map_err(|e| device_error(&format!("alloc bf16 scratch for {w:?}"), e))?;
            dequantize_cuda(gpu, *ty, bytes, rows * cols, &mut scratch)?;
            cublas_bf16(gpu, x, n, &scratch, rows, cols, out)
        }
        (GpuMatmul::Fast, DeviceStorage::Bf16(data)) => {
            cublas_bf16(gpu, x, n, data, rows, cols, out)
        }
    }
}

/// `out[n × rows] = bf16(x)[n × cols] · w[rows × cols]ᵀ` by cuBLAS (f32 accumulation and output).
fn cublas_bf16(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    n: usize,
    w: &CudaSlice<bf16>,
    rows: usize,
    cols: usize,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let (m, nn, k) = gemm_dims(rows, cols, n)?;
    let st = gpu.stream();
    let mut xb = st
        .alloc_zeros::<bf16>(x.len())
        .map_err(|e| device_error("alloc bf16 activations", e))?;
    cast_bf16_cuda(gpu, x, &mut xb)?;
    let blas = gpu.blas()?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    let (a, _ra) = w.device_ptr(st);
    let (b, _rb) = xb.device_ptr(st);
    let (c, _rc) = out.device_ptr_mut(st);
    // SAFETY: the handle is bound to `st`, the stream every buffer here is used on; A holds
    // rows x cols bf16 (lda = cols >= k), B n x cols bf16 (ldb = cols), C n x rows f32
    // (ldc = rows = m), all checked by the caller; alpha/beta are f32 host scalars as
    // CUBLAS_COMPUTE_32F requires; the pointer guards outlive the call.
    unsafe {
        cudarc::cublas::result::gemm_ex(
            *blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            m,
            nn,
            k,
            (&alpha as *const f32).cast(),
            a as *const _,
            cudaDataType::CUDA_R_16BF,
            k,
            b as *const _,
            cudaDataType::CUDA_R_16BF,
            k,
            (&beta as *const f32).cast(),
            c as *mut _,
            cudaDataType::CUDA_R_32F,
            m,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| device_error("cublasGemmEx (bf16 x bf16 -> f32)", format!("{e:?}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_dims_map_row_major_to_column_major() {
        // out [n x rows] = x [n x cols] · Wᵀ: m = rows, n = tokens, k = cols.
        assert_eq!(gemm_dims(896, 4864, 7).unwrap(), (896, 7, 4864));
        assert!(gemm_dims(1 << 31, 8, 1).is_err());
    }
}
