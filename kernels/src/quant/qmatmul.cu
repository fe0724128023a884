// Products and row gathers that read GGUF blocks directly (blocks.cuh, prepended), so a quantised
// model needs about its file size of device memory instead of two bytes per weight.
//
// qmatmul_<type>: out[m][n] = sum_k a[m][k] * w[n][k], with a f32 activations [rows, k] and w the
// weight's rows [cols, k] as GGUF blocks (k a multiple of the block length; row n starts at byte
// n * row_bytes). Each weight element is decoded in registers while a tile is staged in shared
// memory, to exactly the f32 value the CPU reader gives; every output element is then one fma
// chain over k in ascending order, as in matmul_invariant.cu. So the result equals, bit for bit,
// `fold(0, |acc, i| a[i].mul_add(w[i], acc))` over the dequantised row on the CPU, whatever the
// number of rows, the tile the row falls in or the GPU: the batch-invariant mode's one product
// path for every number of tokens.
//
// Launch-size reasoning: fma_tile.cuh's tiles (64 x 64 outputs per block of 256 threads, 4 x 4
// per thread; k in steps of 32 through 2 * 32 * 65 * 4 B = 16.6 KB of shared memory). Bytes >= rows * k * 4 + cols * row_bytes * ceil(rows / 64) + rows * cols * 4: for
// decode (rows <= 64) one pass over the blocks, 0.56 B per weight for Q4_K against 2 B for bf16.
// The decode grid is cols / 64 blocks (24 for a 1536-wide projection), too few to fill an H200's
// 132 SMs on the small matrices: the bundle measures it (a split over k would change the order).
//
// qgather_<type>: out[t][j] = w[ids[t]][j] in f32 (the embedding lookup), one thread per output
// element, grid-stride.

// The tile loop is fma_tile.cuh's (prepended); here each weight is decoded from its block.
template <typename Q>
struct BlockRows {
  const u8* w;
  u64 row_bytes;
  __device__ __forceinline__ float operator()(u32 col, u32 kk) const {
    return Q::at(w + (u64)col * row_bytes + (u64)(kk / Q::QK) * Q::BYTES, kk % Q::QK);
  }
};

template <typename Q>
__device__ __forceinline__ void qgather_impl(const u8* __restrict__ w, const u32* __restrict__ ids,
                                             float* __restrict__ out, u32 n_ids, u32 width,
                                             u64 row_bytes) {
  const u64 n = (u64)n_ids * width;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    const u32 t = (u32)(i / width), j = (u32)(i % width);
    const u8* row = w + (u64)ids[t] * row_bytes;
    out[i] = Q::at(row + (u64)(j / Q::QK) * Q::BYTES, j % Q::QK);
  }
}

#define QM(Q, NAME)                                                                                \
  extern "C" __global__ void __launch_bounds__(256)                                               \
      qmatmul_##NAME(const float* a, const u8* w, float* out, u32 rows, u32 cols, u32 k,           \
                     u64 row_bytes) {                                                              \
    fma_tile_product(a, BlockRows<Q>{w, row_bytes}, out, rows, cols, k);                                          \
  }                                                                                                \
  extern "C" __global__ void qgather_##NAME(const u8* w, const u32* ids, float* out, u32 n_ids,    \
                                            u32 width, u64 row_bytes) {                            \
    qgather_impl<Q>(w, ids, out, n_ids, width, row_bytes);                                         \
  }
QM(Q8_0, q8_0)
QM(Q4_0, q4_0)
QM(Q4_1, q4_1)
QM(Q5_0, q5_0)
QM(Q4_K, q4_k)
QM(Q5_K, q5_k)
QM(Q6_K, q6_k)
