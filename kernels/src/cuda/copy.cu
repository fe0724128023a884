// Copy-bandwidth probe for the GPU bundle: each element read once and written once, 16-byte
// vector accesses, grid-stride loop. Bytes moved = 2 * 16 * n4; bound: HBM bandwidth.
extern "C" __global__ void bench_copy_f32x4(const float4* __restrict__ src, float4* __restrict__ dst,
                                            u64 n4) {
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (u64)gridDim.x * blockDim.x) {
    dst[i] = src[i];
  }
}
