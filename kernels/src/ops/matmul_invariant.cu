// Batch-invariant matrix product: out[m][n] = sum_k a[m][k] * w[n][k] (a: f32 activations
// [rows, k]; w: weight rows [cols, k] in f32 / bf16 / f16, as GGUF stores them; out f32).
//
// Invariance: every output element is one fma chain over k in ascending order, whatever the
// number of rows, the tile it falls in or the GPU; so a token's logits are bit-identical alone,
// in a chain, a tree or a batch. cuBLAS gives no such promise (it picks split-k and algorithms
// by shape), which is why the batch-invariant mode uses this kernel.
//
// Launch-size reasoning: tile 64 x 64 outputs per block of 256 threads (4 x 4 per thread), k in
// steps of 32 staged through shared memory (2 * 32 * 65 * 4 B = 16.6 KB). FLOPs = 2 * rows *
// cols * k; bytes >= rows * k * 4 + cols * k * sizeof(W) + rows * cols * 4. Decode (rows <= 64)
// is bandwidth bound on the weights (one pass over w per 64 rows); large rows are compute bound
// at CUDA-core FMA rate (no tensor cores: their internal order is unspecified), so expect
// ~10-15% of the bf16 tensor-core rate: that is the price of invariance the bundle measures.

#define MI_TILE 64
#define MI_KT 32

template <typename W>
__device__ __forceinline__ void matmul_invariant_impl(const float* __restrict__ a,
                                                      const W* __restrict__ w,
                                                      float* __restrict__ out, u32 rows, u32 cols,
                                                      u32 k) {
  __shared__ float as[MI_KT][MI_TILE + 1];
  __shared__ float ws[MI_KT][MI_TILE + 1];
  const u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const u32 row0 = blockIdx.y * MI_TILE, col0 = blockIdx.x * MI_TILE;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  for (u32 k0 = 0; k0 < k; k0 += MI_KT) {
    // 64 x 32 elements of each operand, 256 threads: 8 each, consecutive threads along k.
    for (u32 e = threadIdx.x; e < MI_TILE * MI_KT; e += blockDim.x) {
      const u32 r = e / MI_KT, kk = e % MI_KT;
      const u32 gk = k0 + kk;
      const u32 gr = row0 + r, gc = col0 + r;
      as[kk][r] = (gr < rows && gk < k) ? a[(u64)gr * k + gk] : 0.0f;
      ws[kk][r] = (gc < cols && gk < k) ? to_f32(w[(u64)gc * k + gk]) : 0.0f;
    }
    __syncthreads();
    const u32 kend = min((u32)MI_KT, k - k0);
    for (u32 kk = 0; kk < kend; ++kk) {
      float av[4], wv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) wv[j] = ws[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], wv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const u32 r = row0 + ty + 16 * i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const u32 c = col0 + tx + 16 * j;
      if (r < rows && c < cols) out[(u64)r * cols + c] = acc[i][j];
    }
  }
}

#define MI_INSTANTIATE(W, SUFFIX)                                                                  \
  extern "C" __global__ void __launch_bounds__(256)                                               \
      matmul_invariant_##SUFFIX(const float* a, const W* w, float* out, u32 rows, u32 cols, u32 k) { \
    matmul_invariant_impl<W>(a, w, out, rows, cols, k);                                            \
  }
MI_INSTANTIATE(float, f32)
MI_INSTANTIATE(bf16, bf16)
MI_INSTANTIATE(f16, f16)
