// specdec CUDA prelude: prepended to every kernel family's source before NVRTC compiles it.
// Needs no CUDA header: 16-bit float conversions are written with inline PTX, integer types are
// spelled out, and reductions have a fixed order (butterfly shuffles give every lane the same,
// bitwise-identical result; block reductions combine warps in index order).
typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#define SD_INF __int_as_float(0x7f800000)
#define SD_WARP 32

// 16-bit floats as plain bit patterns, so templates can tell them apart.
struct bf16 { u16 bits; };
struct f16 { u16 bits; };

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __uint_as_float(((u32)x.bits) << 16); }
__device__ __forceinline__ float to_f32(f16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}
__device__ __forceinline__ float half_bits_to_f32(u16 bits) { f16 h; h.bits = bits; return to_f32(h); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
// Round to nearest even; NaN stays a (quiet) NaN.
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) {
  u32 u = __float_as_uint(x);
  bf16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.bits = (u16)((u >> 16) | 0x40u);
  } else {
    r.bits = (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  return r;
}
template <> __device__ __forceinline__ f16 from_f32<f16>(float x) {
  f16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
  return r;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Block-wide sum with a fixed order: each warp reduces by butterfly, then warp 0 reduces the
// per-warp sums in the same butterfly order. `scratch` holds >= 32 floats. Every thread returns
// the same value. Must be called by all threads of the block.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = (lane < nwarps) ? scratch[lane] : 0.0f;
  t = warp_sum(t);
  return t;
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = (lane < nwarps) ? scratch[lane] : -SD_INF;
  return warp_max(t);
}

// Exclusive prefix sum of integer `v` over the threads of the block in thread order; `*total`
// receives the block total. `warp_scratch` holds >= 32 values. Integer sums: order-independent.
// Must be called by all threads of the block.
template <typename T>
__device__ __forceinline__ T block_exclusive_scan(T v, T* warp_scratch, T* total) {
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  T inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= (u32)o) inc += n;
  }
  __syncthreads();
  if (lane == 31) warp_scratch[warp] = inc;
  __syncthreads();
  T before = 0, all = 0;
  for (u32 w = 0; w < nwarps; ++w) {
    const T s = warp_scratch[w];
    if (w < warp) before += s;
    all += s;
  }
  *total = all;
  return before + inc - v;
}
