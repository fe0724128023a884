// Dequantisation of GGUF (GGML) block formats to bf16 / f16 / f32 rows, for the matrix products
// that go through cuBLAS (dequantise a weight tile, then multiply) and for tests against the
// CPU reader. The block decoders (`Q::at`) are blocks.cuh's, prepended to this file.
//
// Launch-size reasoning: one thread per output element, grid-stride; the block header is re-read
// by the threads of a block (L1 hits). Bytes = n * (bits/8 + sizeof(out)); for Q4_K to bf16 that
// is 2.56 B per element: bandwidth bound; a 4096 x 4096 weight (~9.4 MiB in + 32 MiB out) should
// take ~10 us at 4 TB/s.

template <typename Q, typename Out>
__device__ __forceinline__ void dequant_impl(const u8* __restrict__ src, Out* __restrict__ dst, u64 n) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    const u64 blk = i / Q::QK;
    dst[i] = from_f32<Out>(Q::at(src + blk * Q::BYTES, (u32)(i % Q::QK)));
  }
}

#define DQ(Q, NAME, Out, OSUF)                                                                     \
  extern "C" __global__ void dequant_##NAME##_##OSUF(const u8* src, Out* dst, u64 n) {           \
    dequant_impl<Q, Out>(src, dst, n);                                                             \
  }
#define DQ3(Q, NAME) DQ(Q, NAME, bf16, bf16) DQ(Q, NAME, f16, f16) DQ(Q, NAME, float, f32)
DQ3(Q8_0, q8_0)
DQ3(Q4_0, q4_0)
DQ3(Q4_1, q4_1)
DQ3(Q5_0, q5_0)
DQ3(Q4_K, q4_k)
DQ3(Q5_K, q5_k)
DQ3(Q6_K, q6_k)
DQ(F16S, f16, bf16, bf16)
DQ(BF16S, bf16, f16, f16)
DQ(F16S, f16, float, f32)
DQ(BF16S, bf16, float, f32)
