// Paged KV cache kernels: append new tokens' K/V, and move token slots (tree-path commit).
//
// Layout (identical to kv/layout.rs, element for element): a pool of blocks; block b starts at
// element b * block_elems and holds [layer][part: 0 = K, 1 = V][kv_head][slot][head_dim].
// A *physical slot* is block * block_size + slot_in_block (u32, from the host block tables).
//
// Launch-size reasoning
// - kv_append: grid (tokens, kv_heads), block = head_dim threads (<= 1024). Bytes moved per layer
//   = tokens * kv_heads * head_dim * 2 * (4 + sizeof(T)); no FLOPs. Bandwidth bound, but at decode
//   sizes (tokens <= a few hundred) it is launch-latency bound (~3 us); one launch per layer.
// - Commit of an accepted tree path is a slot move src -> dst with dst <= src; in a batch the
//   destinations of one sequence can be sources of the same move list, so moves go through a
//   scratch buffer: kv_gather_slots (pool -> scratch) then kv_scatter_slots (scratch -> pool),
//   both grid (moves, layers * 2 * kv_heads), block = head_dim threads. Bytes = 4 * moves *
//   token_elems * sizeof(T) (read + write, twice). One pair of launches commits the whole batch;
//   a sequence accepting K of N nodes moves at most K slots, so at K <= 16 this is < 5 us.
// - Rewind is host metadata (block tables, reference counts); kv_clear_slots zeroes the freed
//   speculative slots when a caller wants them clean (same grid as gather).

template <typename T>
__device__ __forceinline__ void kv_append_impl(T* __restrict__ pool, const float* __restrict__ k_new,
                                               const float* __restrict__ v_new,
                                               const u32* __restrict__ slot_mapping, u32 layer,
                                               u32 kv_heads, u32 block_size, u32 head_dim,
                                               u64 block_elems) {
  const u32 token = blockIdx.x, head = blockIdx.y;
  const u32 phys = slot_mapping[token];
  const u64 block = phys / block_size, slot = phys % block_size;
  const u64 tile = (u64)block_size * head_dim;
  T* k_dst = pool + block * block_elems + ((u64)(layer * 2 + 0) * kv_heads + head) * tile + slot * head_dim;
  T* v_dst = pool + block * block_elems + ((u64)(layer * 2 + 1) * kv_heads + head) * tile + slot * head_dim;
  const u64 src = ((u64)token * kv_heads + head) * head_dim;
  for (u32 d = threadIdx.x; d < head_dim; d += blockDim.x) {
    k_dst[d] = from_f32<T>(k_new[src + d]);
    v_dst[d] = from_f32<T>(v_new[src + d]);
  }
}

// Per-slot element addressing shared by gather / scatter / clear: row r in 0..layers*2*kv_heads
// is the (layer, part, head) tile; within it the slot's head_dim elements are contiguous.
__device__ __forceinline__ u64 slot_row_offset(u32 phys, u32 row, u32 block_size, u32 head_dim,
                                               u64 block_elems) {
  const u64 block = phys / block_size, slot = phys % block_size;
  return block * block_elems + (u64)row * block_size * head_dim + slot * head_dim;
}

template <typename T>
__device__ __forceinline__ void kv_gather_impl(const T* __restrict__ pool, T* __restrict__ scratch,
                                               const u32* __restrict__ src_slots, u32 block_size,
                                               u32 head_dim, u64 block_elems) {
  const u32 move = blockIdx.x, row = blockIdx.y, rows = gridDim.y;
  const T* src = pool + slot_row_offset(src_slots[move], row, block_size, head_dim, block_elems);
  T* dst = scratch + ((u64)move * rows + row) * head_dim;
  for (u32 d = threadIdx.x; d < head_dim; d += blockDim.x) dst[d] = src[d];
}

template <typename T>
__device__ __forceinline__ void kv_scatter_impl(T* __restrict__ pool, const T* __restrict__ scratch,
                                                const u32* __restrict__ dst_slots, u32 block_size,
                                                u32 head_dim, u64 block_elems) {
  const u32 move = blockIdx.x, row = blockIdx.y, rows = gridDim.y;
  const T* src = scratch + ((u64)move * rows + row) * head_dim;
  T* dst = pool + slot_row_offset(dst_slots[move], row, block_size, head_dim, block_elems);
  for (u32 d = threadIdx.x; d < head_dim; d += blockDim.x) dst[d] = src[d];
}

template <typename T>
__device__ __forceinline__ void kv_clear_impl(T* __restrict__ pool, const u32* __restrict__ slots,
                                              u32 block_size, u32 head_dim, u64 block_elems) {
  const u32 row = blockIdx.y;
  T* dst = pool + slot_row_offset(slots[blockIdx.x], row, block_size, head_dim, block_elems);
  for (u32 d = threadIdx.x; d < head_dim; d += blockDim.x) dst[d] = from_f32<T>(0.0f);
}

#define KV_INSTANTIATE(T, SUFFIX)                                                                  \
  extern "C" __global__ void kv_append_##SUFFIX(T* pool, const float* k_new, const float* v_new,   \
                                                const u32* slot_mapping, u32 layer, u32 kv_heads,  \
                                                u32 block_size, u32 head_dim, u64 block_elems) {   \
    kv_append_impl<T>(pool, k_new, v_new, slot_mapping, layer, kv_heads, block_size, head_dim,     \
                      block_elems);                                                                \
  }                                                                                                \
  extern "C" __global__ void kv_gather_slots_##SUFFIX(const T* pool, T* scratch,                   \
                                                      const u32* src_slots, u32 block_size,        \
                                                      u32 head_dim, u64 block_elems) {             \
    kv_gather_impl<T>(pool, scratch, src_slots, block_size, head_dim, block_elems);                \
  }                                                                                                \
  extern "C" __global__ void kv_scatter_slots_##SUFFIX(T* pool, const T* scratch,                  \
                                                       const u32* dst_slots, u32 block_size,       \
                                                       u32 head_dim, u64 block_elems) {            \
    kv_scatter_impl<T>(pool, scratch, dst_slots, block_size, head_dim, block_elems);               \
  }                                                                                                \
  extern "C" __global__ void kv_clear_slots_##SUFFIX(T* pool, const u32* slots, u32 block_size,    \
                                                     u32 head_dim, u64 block_elems) {              \
    kv_clear_impl<T>(pool, slots, block_size, head_dim, block_elems);                              \
  }

KV_INSTANTIATE(float, f32)
KV_INSTANTIATE(bf16, bf16)
KV_INSTANTIATE(f16, f16)
