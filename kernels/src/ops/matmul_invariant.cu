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

// The tile loop is fma_tile.cuh's (prepended); here the weights are f32 / bf16 / f16 rows.

template <typename W>
struct FloatRows {
  const W* w;
  u32 k;
  __device__ __forceinline__ float operator()(u32 col, u32 kk) const {
    return to_f32(w[(u64)col * k + kk]);
  }
};

#define MI_INSTANTIATE(W, SUFFIX)                                                                  \
  extern "C" __global__ void __launch_bounds__(256)                                               \
      matmul_invariant_##SUFFIX(const float* a, const W* w, float* out, u32 rows, u32 cols, u32 k) { \
    fma_tile_product(a, FloatRows<W>{w, k}, out, rows, cols, k);                                   \
  }
MI_INSTANTIATE(float, f32)
MI_INSTANTIATE(bf16, bf16)
MI_INSTANTIATE(f16, f16)
