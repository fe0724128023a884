// Tree attention over the paged KV cache, split-K ("flash-decoding") with a fixed reduction order.
//
// Queries: the new tokens of every sequence of a ragged batch (prefill chunk, chain or tree),
// q: f32 [total_q, q_heads, head_dim] (after RoPE). Keys/values: the sequence's paged cache
// (layout of kv/layout.rs: block b at b * block_elems, [layer][K|V][kv_head][slot][head_dim]),
// into which the new tokens' K/V were appended at positions prefix_len + node beforehand.
// Visibility of query node i: every prefix key, and new key j iff bit j of i's ancestor mask.
// GQA: query head h reads KV head h / (q_heads / kv_heads).
//
// Fixed reduction order (batch invariance): for each query the *visible* keys are enumerated in
// one logical order — prefix positions 0..prefix_len, then the ancestors in index order — and the
// t-th visible key always goes to chunk t / CHUNK, warp (t % CHUNK) % WARPS. Warps are merged in
// index order, then chunks in index order. A token therefore reduces over the same values in the
// same order whether it is alone (after its ancestors were committed), in a chain, in a tree or
// in any batch: the output is bit-identical across all of them.
//
// Launch-size reasoning
// - partial: grid (total_q, kv_heads, max_chunks), block 128 (4 warps). Each block reads its
//   chunk's K and V rows for one KV head once and serves all q_heads / kv_heads query heads of
//   the group from them (at most MAXG = 8). Lanes own head_dim / 32 elements; one warp handles
//   one key at a time (8- or 16-byte loads per lane, a 256-byte coalesced row for bf16 d128).
//   Bytes = visible keys * kv_heads * head_dim * 2 * sizeof(T) per query token (+ q and partials);
//   FLOPs = 4 * visible * q_heads * head_dim. At decode sizes FLOP/byte = 2 * G / sizeof(T) <= 8:
//   bandwidth bound, target >= 70% of copy bandwidth at 32k prefixes. CHUNK = 256 keys makes a
//   32k prefix 128 blocks per (token, KV head): enough to fill 132 SMs at batch 1.
// - merge: grid (total_q, q_heads), block head_dim threads; reads max_chunks * (head_dim + 2)
//   floats per head: small next to the K/V read.

#define TA_CHUNK 256
#define TA_WARPS 4
#define TA_MAXG 8

template <typename T, int EPL> struct RowLoad;
template <> struct RowLoad<float, 4> {
  __device__ static void load(const float* p, float* o) {
    const float4 v = *(const float4*)p; o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w; } };
template <> struct RowLoad<float, 2> {
  __device__ static void load(const float* p, float* o) {
    const float2 v = *(const float2*)p; o[0] = v.x; o[1] = v.y; } };
template <typename H> __device__ __forceinline__ float lo16(u32 w) { H h; h.bits = (u16)(w & 0xffffu); return to_f32(h); }
template <typename H> __device__ __forceinline__ float hi16(u32 w) { H h; h.bits = (u16)(w >> 16); return to_f32(h); }
template <typename H> struct RowLoad16_4 {
  __device__ static void load(const H* p, float* o) {
    const uint2 v = *(const uint2*)p;
    o[0] = lo16<H>(v.x); o[1] = hi16<H>(v.x); o[2] = lo16<H>(v.y); o[3] = hi16<H>(v.y); } };
template <typename H> struct RowLoad16_2 {
  __device__ static void load(const H* p, float* o) {
    const u32 v = *(const u32*)p; o[0] = lo16<H>(v); o[1] = hi16<H>(v); } };
template <> struct RowLoad<bf16, 4> : RowLoad16_4<bf16> {};
template <> struct RowLoad<bf16, 2> : RowLoad16_2<bf16> {};
template <> struct RowLoad<f16, 4> : RowLoad16_4<f16> {};
template <> struct RowLoad<f16, 2> : RowLoad16_2<f16> {};

// Index of the r-th (0-based) set bit of a multi-word mask row (the caller guarantees it exists).
__device__ __forceinline__ u32 nth_set_bit(const u64* row, u32 words, u32 r) {
  for (u32 w = 0; w < words; ++w) {
    const u64 bits = row[w];
    const u32 c = __popcll(bits);
    if (r < c) {
      const u32 lo = (u32)bits, clo = __popc(lo);
      if (r < clo) return w * 64 + __fns(lo, 0, r + 1);
      return w * 64 + 32 + __fns((u32)(bits >> 32), 0, r - clo + 1);
    }
    r -= c;
  }
  return 0xffffffffu;
}

__device__ __forceinline__ u32 popcount_row(const u64* row, u32 words) {
  u32 c = 0;
  for (u32 w = 0; w < words; ++w) c += __popcll(row[w]);
  return c;
}

struct TaParams {
  const float* q;             // [total_q, q_heads, D]
  const void* pool;           // KV block pool (T elements)
  const u32* q_seq;           // [total_q] sequence of each query token
  const u32* q_node;          // [total_q] node index of the token inside its sequence's new tokens
  const u32* prefix_len;      // [batch] cached tokens before this step's new tokens
  const u32* new_len;         // [batch] new tokens (nodes) this step
  const u32* table_offsets;   // [batch] start of the sequence's block table in block_tables
  const u32* block_tables;    // physical block ids
  const u32* mask_offsets;    // [batch] start (in u64 words) of the sequence's ancestor masks
  const u64* masks;           // rows of ceil(new_len / 64) words per node
  float* partial_o;           // [total_q, q_heads, max_chunks, D] unnormalised
  float* partial_ml;          // [total_q, q_heads, max_chunks, 2] (running max, sum)
  float scale;
  u32 q_heads, kv_heads, layer, block_size, max_chunks;
  u64 block_elems;
};

template <typename T, int D>
__device__ __forceinline__ void tree_attention_partial_impl(const TaParams& p) {
  constexpr int EPL = D / 32;
  __shared__ float sm_o[TA_WARPS][TA_MAXG][D];
  __shared__ float sm_m[TA_WARPS][TA_MAXG];
  __shared__ float sm_l[TA_WARPS][TA_MAXG];
  const u32 tok = blockIdx.x, kvh = blockIdx.y, chunk = blockIdx.z;
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const u32 seq = p.q_seq[tok], node = p.q_node[tok];
  const u32 prefix = p.prefix_len[seq], n_new = p.new_len[seq];
  const u32 words = (n_new + 63) / 64;
  const u64* mask_row = p.masks + p.mask_offsets[seq] + (u64)node * words;
  const u32 visible = prefix + popcount_row(mask_row, words);
  const u32 t_begin = chunk * TA_CHUNK;
  if (t_begin >= visible) return;  // uniform over the block
  const u32 t_end = min(visible, t_begin + TA_CHUNK);
  const u32 group = p.q_heads / p.kv_heads;
  const T* pool = (const T*)p.pool;
  const u32* table = p.block_tables + p.table_offsets[seq];
  const u64 tile = (u64)p.block_size * D;
  const u64 k_tile = ((u64)(p.layer * 2 + 0) * p.kv_heads + kvh) * tile;
  const u64 v_tile = ((u64)(p.layer * 2 + 1) * p.kv_heads + kvh) * tile;

  float qv[TA_MAXG][EPL], acc[TA_MAXG][EPL], m[TA_MAXG], l[TA_MAXG];
#pragma unroll
  for (int h = 0; h < TA_MAXG; ++h) {
    m[h] = -SD_INF;
    l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < EPL; ++e) {
      acc[h][e] = 0.0f;
      qv[h][e] = (h < (int)group)
          ? p.q[((u64)tok * p.q_heads + kvh * group + h) * D + lane * EPL + e] * p.scale
          : 0.0f;
    }
  }
  for (u32 t = t_begin + warp; t < t_end; t += TA_WARPS) {
    const u32 pos = t < prefix ? t : prefix + nth_set_bit(mask_row, words, t - prefix);
    const u64 base = (u64)table[pos / p.block_size] * p.block_elems + (u64)(pos % p.block_size) * D + lane * EPL;
    float kf[EPL], vf[EPL];
    RowLoad<T, EPL>::load(pool + base + k_tile, kf);
    RowLoad<T, EPL>::load(pool + base + v_tile, vf);
#pragma unroll
    for (int h = 0; h < TA_MAXG; ++h) {
      if (h >= (int)group) break;
      float s = 0.0f;
#pragma unroll
      for (int e = 0; e < EPL; ++e) s = fmaf(qv[h][e], kf[e], s);
      s = warp_sum(s);
      const float m_new = fmaxf(m[h], s);
      const float corr = m[h] == -SD_INF ? 0.0f : expf(m[h] - m_new);
      const float pk = expf(s - m_new);
      l[h] = l[h] * corr + pk;
#pragma unroll
      for (int e = 0; e < EPL; ++e) acc[h][e] = fmaf(pk, vf[e], acc[h][e] * corr);
      m[h] = m_new;
    }
  }
#pragma unroll
  for (int h = 0; h < TA_MAXG; ++h) {
    if (h >= (int)group) break;
#pragma unroll
    for (int e = 0; e < EPL; ++e) sm_o[warp][h][lane * EPL + e] = acc[h][e];
    if (lane == 0) { sm_m[warp][h] = m[h]; sm_l[warp][h] = l[h]; }
  }
  __syncthreads();
  // Merge the warps in index order; one thread per (head, element).
  for (u32 i = threadIdx.x; i < group * D; i += blockDim.x) {
    const u32 h = i / D, d = i % D;
    float mm = -SD_INF;
    for (int w = 0; w < TA_WARPS; ++w) mm = fmaxf(mm, sm_m[w][h]);
    float ll = 0.0f, oo = 0.0f;
    for (int w = 0; w < TA_WARPS; ++w) {
      const float c = sm_m[w][h] == -SD_INF ? 0.0f : expf(sm_m[w][h] - mm);
      ll = fmaf(sm_l[w][h], c, ll);
      oo = fmaf(sm_o[w][h][d], c, oo);
    }
    const u64 slot = ((u64)tok * p.q_heads + kvh * group + h) * p.max_chunks + chunk;
    p.partial_o[slot * D + d] = oo;
    if (d == 0) { p.partial_ml[slot * 2] = mm; p.partial_ml[slot * 2 + 1] = ll; }
  }
}

// Combines the chunks of one (query token, head) in chunk order and normalises.
template <int D>
__device__ __forceinline__ void tree_attention_merge_impl(const float* __restrict__ partial_o,
                                                          const float* __restrict__ partial_ml,
                                                          const u32* __restrict__ q_seq,
                                                          const u32* __restrict__ q_node,
                                                          const u32* __restrict__ prefix_len,
                                                          const u32* __restrict__ new_len,
                                                          const u32* __restrict__ mask_offsets,
                                                          const u64* __restrict__ masks,
                                                          float* __restrict__ out, u32 q_heads,
                                                          u32 max_chunks) {
  const u32 tok = blockIdx.x, head = blockIdx.y;
  const u32 seq = q_seq[tok];
  const u32 words = (new_len[seq] + 63) / 64;
  const u32 visible = prefix_len[seq] + popcount_row(masks + mask_offsets[seq] + (u64)q_node[tok] * words, words);
  const u32 chunks = (visible + TA_CHUNK - 1) / TA_CHUNK;
  const u64 base = ((u64)tok * q_heads + head) * max_chunks;
  float mm = -SD_INF;
  for (u32 c = 0; c < chunks; ++c) mm = fmaxf(mm, partial_ml[(base + c) * 2]);
  for (u32 d = threadIdx.x; d < D; d += blockDim.x) {
    float ll = 0.0f, oo = 0.0f;
    for (u32 c = 0; c < chunks; ++c) {
      const float mc = partial_ml[(base + c) * 2];
      const float w = mc == -SD_INF ? 0.0f : expf(mc - mm);
      ll = fmaf(partial_ml[(base + c) * 2 + 1], w, ll);
      oo = fmaf(partial_o[(base + c) * D + d], w, oo);
    }
    out[((u64)tok * q_heads + head) * D + d] = ll > 0.0f ? oo / ll : 0.0f;
  }
}

#define TA_PARTIAL(T, SUF, D)                                                                      \
  extern "C" __global__ void __launch_bounds__(128) tree_attention_partial_##SUF##_d##D(TaParams p) { \
    tree_attention_partial_impl<T, D>(p);                                                          \
  }
TA_PARTIAL(float, f32, 64)
TA_PARTIAL(float, f32, 128)
TA_PARTIAL(bf16, bf16, 64)
TA_PARTIAL(bf16, bf16, 128)
TA_PARTIAL(f16, f16, 64)
TA_PARTIAL(f16, f16, 128)

#define TA_MERGE(D)                                                                                \
  extern "C" __global__ void tree_attention_merge_d##D(                                            \
      const float* partial_o, const float* partial_ml, const u32* q_seq, const u32* q_node,        \
      const u32* prefix_len, const u32* new_len, const u32* mask_offsets, const u64* masks,        \
      float* out, u32 q_heads, u32 max_chunks) {                                                   \
    tree_attention_merge_impl<D>(partial_o, partial_ml, q_seq, q_node, prefix_len, new_len,        \
                                 mask_offsets, masks, out, q_heads, max_chunks);                   \
  }
TA_MERGE(64)
TA_MERGE(128)
