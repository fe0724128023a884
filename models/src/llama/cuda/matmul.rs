//! The decoder's matrix products on the device, `out = x · Wᵀ` (`x`: `[n × cols]` f32, `W`:
//! `[rows × cols]` bf16, `out`: `[n × rows]` f32), in one of two modes.

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use half::bf16;
use specdec_kernels::cuda::Gpu;
use specdec_kernels::ops::cuda::{cast_bf16_cuda, matmul_invariant_cuda};

use super::device_error;
use super::weights::DeviceMatrix;
use crate::error::{ModelError, Result};

/// How the device multiplies activations by weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuMatmul {
    /// cuBLAS `cublasGemmEx`: activations rounded to bf16 by a small kernel, bf16 weights,
    /// f32 accumulation (`CUBLAS_COMPUTE_32F`) and f32 output, on tensor cores. cuBLAS chooses
    /// its algorithm (and split-k) by shape, so a token's logits may change in the last bits
    /// with the number of tokens in the forward: **not** batch-invariant.
    #[default]
    Fast,
    /// The fixed-order kernel `matmul_invariant_bf16`: f32 activations, bf16 weights widened
    /// exactly, each output one FMA chain over the input dimension in order. A token's logits
    /// are bit-identical alone, in a chain, a tree or a batch. CUDA cores only (tensor cores
    /// accumulate in an unspecified order): expect decode (few rows, bandwidth bound on the
    /// weights) to cost about as much as the fast mode, and large prefills several times more
    /// (roughly 10–15% of the tensor-core rate).
    BatchInvariant,
}

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
    match mode {
        GpuMatmul::BatchInvariant => Ok(matmul_invariant_cuda(gpu, x, w.data(), cols, out)?),
        GpuMatmul::Fast => {
            let (m, nn, k) = gemm_dims(rows, cols, n)?;
            let st = gpu.stream();
            let mut xb = st
                .alloc_zeros::<bf16>(x.len())
                .map_err(|e| device_error("alloc bf16 activations", e))?;
            cast_bf16_cuda(gpu, x, &mut xb)?;
            let blas = gpu.blas()?;
            let (alpha, beta) = (1.0f32, 0.0f32);
            let (a, _ra) = w.data().device_ptr(st);
            let (b, _rb) = xb.device_ptr(st);
            let (c, _rc) = out.device_ptr_mut(st);
            // SAFETY: the handle is bound to `st`, the stream every buffer here is used on; A
            // holds rows x cols bf16 (lda = cols >= k), B n x cols bf16 (ldb = cols), C n x rows
            // f32 (ldc = rows = m), all checked above; alpha/beta are f32 host scalars as
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
    }
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
