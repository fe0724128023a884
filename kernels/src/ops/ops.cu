// Model-forward row and elementwise operations (f32 activations).
//
// Launch-size reasoning (all bandwidth bound: < 1 FLOP per byte moved)
// - embedding_gather: grid (tokens), block 256; bytes = tokens * hidden * (sizeof(T) + 4).
// - rms_norm: grid (rows), block 256; bytes = rows * n * 8 + n * 4; FLOPs = 3 * rows * n.
//   One block per row with a fixed reduction order (thread-strided partial sums, butterfly warp
//   sums, warps combined in index order), so a row's result does not depend on how many rows
//   share the launch (batch invariance).
// - rope: grid (tokens, heads), block = head_dim / 2 threads; bytes = 8 * tokens * heads * head_dim.
//   cos/sin tables [tokens][head_dim / 2] come from the host (f64 angles rounded once, as
//   ops/rope.rs), and the rotation rounds each product (no FMA), so it equals the CPU bit for bit;
//   `interleaved` = 1 rotates pairs (2i, 2i+1) (GGML "normal", Llama), 0 rotates
//   (i, i + head_dim/2) (GGML "neox", Qwen2).
// - swiglu: grid-stride over rows * n; bytes = 12 * rows * n.

template <typename T>
__device__ __forceinline__ void embedding_gather_impl(const T* __restrict__ table,
                                                      const u32* __restrict__ ids,
                                                      float* __restrict__ out, u32 hidden,
                                                      u32 vocab, u32* __restrict__ error_flag) {
  const u32 token = blockIdx.x;
  const u32 id = ids[token];
  float* dst = out + (u64)token * hidden;
  if (id >= vocab) {
    if (threadIdx.x == 0) atomicExch(error_flag, token + 1);
    return;
  }
  const T* src = table + (u64)id * hidden;
  for (u32 i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = to_f32(src[i]);
}

#define GATHER_INSTANTIATE(T, SUFFIX)                                                              \
  extern "C" __global__ void embedding_gather_##SUFFIX(const T* table, const u32* ids, float* out, \
                                                       u32 hidden, u32 vocab, u32* error_flag) {   \
    embedding_gather_impl<T>(table, ids, out, hidden, vocab, error_flag);                          \
  }
GATHER_INSTANTIATE(float, f32)
GATHER_INSTANTIATE(bf16, bf16)
GATHER_INSTANTIATE(f16, f16)

extern "C" __global__ void rms_norm_f32(const float* __restrict__ x, const float* __restrict__ weight,
                                        float* __restrict__ out, u32 n, float eps) {
  __shared__ double scratch[32];
  const float* row = x + (u64)blockIdx.x * n;
  float* dst = out + (u64)blockIdx.x * n;
  // Squares are exact in f64; the f64 sum (fixed tree order) rounds to the same f32 scale as
  // the CPU's index-order f64 sum except at an f32 rounding boundary.
  double acc = 0.0;
  for (u32 i = threadIdx.x; i < n; i += blockDim.x) acc += (double)row[i] * (double)row[i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  if (lane == 0) scratch[warp] = acc;
  __syncthreads();
  double ss = lane < nwarps ? scratch[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
  for (u32 i = threadIdx.x; i < n; i += blockDim.x) dst[i] = __fmul_rn(__fmul_rn(row[i], scale), weight[i]);
}

extern "C" __global__ void rope_f32(float* __restrict__ x, const float* __restrict__ cos_t,
                                    const float* __restrict__ sin_t, u32 heads, u32 head_dim,
                                    u32 interleaved) {
  const u32 token = blockIdx.x, head = blockIdx.y, half = head_dim / 2;
  float* v = x + ((u64)token * heads + head) * head_dim;
  const float* c = cos_t + (u64)token * half;
  const float* s = sin_t + (u64)token * half;
  for (u32 i = threadIdx.x; i < half; i += blockDim.x) {
    const u32 a = interleaved ? 2 * i : i;
    const u32 b = interleaved ? 2 * i + 1 : i + half;
    const float x0 = v[a], x1 = v[b];
    v[a] = __fsub_rn(__fmul_rn(x0, c[i]), __fmul_rn(x1, s[i]));
    v[b] = __fadd_rn(__fmul_rn(x0, s[i]), __fmul_rn(x1, c[i]));
  }
}

extern "C" __global__ void swiglu_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                      float* __restrict__ out, u64 len) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += (u64)gridDim.x * blockDim.x) {
    const float g = gate[i];
    out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
  }
}

// - cast_f32_bf16: grid-stride over len; bytes = 6 * len. Rounds to nearest even (from_f32), the
//   activations' one rounding before a bf16 x bf16 cuBLAS product with f32 accumulation.
extern "C" __global__ void cast_f32_bf16(const float* __restrict__ x, bf16* __restrict__ out,
                                         u64 len) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += (u64)gridDim.x * blockDim.x)
    out[i] = from_f32<bf16>(x[i]);
}

// - add_broadcast_f32: x[i] += y[i % period], grid-stride over len; bytes = 12 * len. With
//   period = len a residual add, with period = cols a bias added to every row. One rounded f32
//   add per element, as the CPU's `a += b`.
extern "C" __global__ void add_broadcast_f32(float* __restrict__ x, const float* __restrict__ y,
                                             u64 len, u64 period) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += (u64)gridDim.x * blockDim.x)
    x[i] = __fadd_rn(x[i], y[i % period]);
}

// - sum_ranks_f32: out[i] = gathered[i] + gathered[len + i] + ... in rank order (world partial
//   buffers of len values end to end), grid-stride over len; bytes = 4 * (world + 1) * len. One
//   rounded f32 add per rank after the first, as the CPU's `sum_ranks`.
extern "C" __global__ void sum_ranks_f32(const float* __restrict__ gathered, float* __restrict__ out,
                                         u64 len, u32 world) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += (u64)gridDim.x * blockDim.x) {
    float sum = gathered[i];
    for (u32 r = 1; r < world; ++r) sum = __fadd_rn(sum, gathered[(u64)r * len + i]);
    out[i] = sum;
  }
}

// - join_rank_columns_f32: out[row][col] = rank r's block [row][col - start_r], where rank r holds
//   columns split_even(cols, world, r) of every row as [rows × width_r] at gathered + r * stride
//   (the first cols % world ranks one column wider), grid-stride over rows * cols; bytes =
//   8 * rows * cols. Pure copies, as the CPU's `join_rank_columns`.
extern "C" __global__ void join_rank_columns_f32(const float* __restrict__ gathered,
                                                 float* __restrict__ out, u64 rows, u64 cols,
                                                 u32 world, u64 stride) {
  const u64 base = cols / world, extra = cols % world, wide = extra * (base + 1);
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < rows * cols; i += (u64)gridDim.x * blockDim.x) {
    const u64 row = i / cols, col = i % cols;
    u64 rank, start;
    if (col < wide) {
      rank = col / (base + 1);
      start = rank * (base + 1);
    } else {
      rank = extra + (col - wide) / base;
      start = wide + (rank - extra) * base;
    }
    const u64 width = base + (rank < extra ? 1 : 0);
    out[i] = gathered[rank * stride + row * width + (col - start)];
  }
}
