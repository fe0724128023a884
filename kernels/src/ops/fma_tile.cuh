// The fixed-order tile product both batch-invariant products use: out[m][n] = sum_k a[m][k] *
// w(n, k), with `weight_at(n, k)` the weight's element as f32 (widened floats in
// matmul_invariant.cu, GGUF blocks decoded in registers in qmatmul.cu).
//
// Invariance: every output element is one fma chain over k in ascending order, whatever the
// number of rows, the tile it falls in or the GPU.
//
// Launch-size reasoning: tile 64 x 64 outputs per block of 256 threads (4 x 4 per thread), k in
// steps of 32 staged through shared memory (2 * 32 * 65 * 4 B = 16.6 KB); grid (cols / 64,
// rows / 64).

#define FT_TILE 64
#define FT_KT 32

template <typename WeightAt>
__device__ __forceinline__ void fma_tile_product(const float* __restrict__ a, WeightAt weight_at,
                                                 float* __restrict__ out, u32 rows, u32 cols,
                                                 u32 k) {
  __shared__ float as[FT_KT][FT_TILE + 1];
  __shared__ float ws[FT_KT][FT_TILE + 1];
  const u32 tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const u32 row0 = blockIdx.y * FT_TILE, col0 = blockIdx.x * FT_TILE;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  for (u32 k0 = 0; k0 < k; k0 += FT_KT) {
    // 64 x 32 elements of each operand, 256 threads: 8 each, consecutive threads along k.
    for (u32 e = threadIdx.x; e < FT_TILE * FT_KT; e += blockDim.x) {
      const u32 r = e / FT_KT, kk = e % FT_KT;
      const u32 gk = k0 + kk;
      const u32 gr = row0 + r, gc = col0 + r;
      as[kk][r] = (gr < rows && gk < k) ? a[(u64)gr * k + gk] : 0.0f;
      ws[kk][r] = (gc < cols && gk < k) ? weight_at(gc, gk) : 0.0f;
    }
    __syncthreads();
    const u32 kend = min((u32)FT_KT, k - k0);
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

