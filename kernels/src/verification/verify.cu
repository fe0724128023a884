// Batched verification of draft trees: one block per sequence, the whole batch in one launch.
//
// Contract: bit-for-bit the CPU reference of verification/ and sampling/replay.rs:
// - random words: the counter-based generator of sampling/counter.rs (SplitMix64 stages over
//   seed, sequence id, step, then node << 32 | purpose << 24 | draw), each sequence keyed by its
//   own (seed, key sequence) pair: SeededSequences::key_of, i.e. (run seed, sequence id) for an
//   unseeded sequence and (its own seed, 0) for one seeded on its own;
// - accept(p, q): u = (word >> 40) * 2^-24; accept iff q > 0 and (u * q, rounded, no FMA) < p;
// - categorical(w): W_i = floor(clamp(w_i, 0, 1) * 2^32) (NaN -> 0), T = sum W_i (exact u64),
//   t = (word * T) >> 64, answer = lowest i with W_0 + ... + W_i > t; T = 0 means no mass;
// - normalise(w) = w_i / (float(T) * 2^-32) with T the fixed-point total (IEEE division);
// - argmax: lowest id among the largest values.
// Methods: 0 greedy, 1 multi-round with i.i.d. siblings (SpecInfer; on a chain this is
// Leviathan/Chen chain rejection sampling), 2 recursive rejection sampling (siblings drawn without
// replacement), 3 target-only. Keys: accept (child, 2), residual (node, 3), bonus (leaf, 4),
// sample (node, 5).
//
// Launch-size reasoning: grid = batch, block = 512 threads; every pass over a vocabulary row is
// tiled by 4 * 512 elements with 16-byte loads when the row length is a multiple of 4, and the
// categorical search scans tiles in order with an integer block scan (no sort, no float sums).
// Bytes: per visited node one pass over p for the bonus/argmax (greedy, target-only), and for the
// rejection methods up to 3 passes over p, q and the residual scratch per rejected sibling.
// For chain K = 8, vocab 152k, batch 64: p and q rows of the accepted path are read once
// (~9 * 2 * 608 KB per sequence); bandwidth bound, one block per sequence keeps 64 SMs busy.
// Row reads also check the data: a NaN, infinity or negative probability sets status = 1.

#define VB 512
#define VTILE (4 * VB)

__device__ __forceinline__ u64 sd_mix64(u64 z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ u64 sd_word(u64 seed, u64 sequence, u64 step, u32 node, u32 purpose) {
  const u64 golden = 0x9e3779b97f4a7c15ull;
  u64 h = sd_mix64(seed + golden);
  h = sd_mix64(h ^ sequence);
  h = sd_mix64((h + golden) ^ step);
  return sd_mix64(h ^ (((u64)node << 32) | ((u64)purpose << 24)));
}
__device__ __forceinline__ u64 sd_fixed(float w) {
  if (!(w > 0.0f)) return 0;
  if (w >= 1.0f) return 1ull << 32;
  return __float2ull_rz(__fmul_rn(w, 4294967296.0f));
}
__device__ __forceinline__ float sd_from_fixed(u64 t) { return __fmul_rn(__ull2float_rn(t), 2.3283064365386963e-10f); }
__device__ __forceinline__ bool sd_accept(u64 word, float p, float q) {
  if (!(q > 0.0f)) return false;
  const float u = __fmul_rn((float)(u32)(word >> 40), 5.9604644775390625e-08f);
  return __fmul_rn(u, q) < p;
}
__device__ __forceinline__ bool sd_bad(float x) { return !(x >= 0.0f) || x == SD_INF; }

// Loads elements [i, i + 4) of a row (0 beyond `len`); 16-byte loads when `vec`.
__device__ __forceinline__ void load4(const float* row, u32 i, u32 len, bool vec, float* o) {
  if (vec && i + 3 < len) {
    const float4 v = *(const float4*)(row + i);
    o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[e] = (i + e < len) ? row[i + e] : 0.0f;
  }
}

struct Smem {
  u64 warp_u64[VB / 32];
  float warp_f[VB / 32];
  u32 warp_i[VB / 32];
  u32 found;
  u32 bad;
};

__device__ __forceinline__ u64 block_sum_u64(u64 v, Smem& sm) {
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum_u64(v);
  __syncthreads();
  if (lane == 0) sm.warp_u64[warp] = v;
  __syncthreads();
  u64 t = lane < VB / 32 ? sm.warp_u64[lane] : 0;
  return warp_sum_u64(t);
}


// Fixed-point total of a row (optionally of max(0, a - b)), flagging bad values.
__device__ __forceinline__ u64 row_total(const float* a, const float* b, u32 len, bool vec, Smem& sm) {
  u64 acc = 0;
  for (u32 base = 0; base < len; base += VTILE) {
    const u32 i = base + 4 * threadIdx.x;
    if (i >= len) continue;
    float x[4], y[4];
    load4(a, i, len, vec, x);
    if (b) load4(b, i, len, vec, y);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (i + e < len) {
        if (sd_bad(x[e]) || (b && sd_bad(y[e]))) sm.bad = 1;
        const float w = b ? (x[e] > y[e] ? __fsub_rn(x[e], y[e]) : 0.0f) : x[e];
        acc += sd_fixed(w);
      }
    }
  }
  return block_sum_u64(acc, sm);
}

// Lowest i with W_0 + ... + W_i > target, W from a row (total > target required).
__device__ __forceinline__ u32 row_search(const float* a, u32 len, bool vec, u64 target, Smem& sm) {
  u64 before_tile = 0;
  __syncthreads();  // every thread is done reading `found` from an earlier search
  if (threadIdx.x == 0) sm.found = 0xffffffffu;
  __syncthreads();
  for (u32 base = 0; base < len; base += VTILE) {
    const u32 i = base + 4 * threadIdx.x;
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (i < len) load4(a, i, len, vec, x);
    u64 w[4], mine = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) { w[e] = (i + e < len) ? sd_fixed(x[e]) : 0; mine += w[e]; }
    u64 tile_total;
    u64 prefix = before_tile + block_exclusive_scan<u64>(mine, sm.warp_u64, &tile_total);
    if (prefix <= target && target < prefix + mine) {
      u32 hit = 3;
#pragma unroll
      for (int e = 3; e >= 0; --e) {
        u64 upto = prefix;
#pragma unroll
        for (int f = 0; f <= e; ++f) upto += w[f];
        if (upto > target) hit = (u32)e;
      }
      sm.found = i + hit;
    }
    __syncthreads();
    if (sm.found != 0xffffffffu) break;
    before_tile += tile_total;
  }
  return sm.found;
}

__device__ __forceinline__ u32 row_argmax(const float* a, u32 len, bool vec, Smem& sm) {
  float best = -SD_INF;
  u32 best_i = 0xffffffffu;
  for (u32 base = 0; base < len; base += VTILE) {
    const u32 i = base + 4 * threadIdx.x;
    if (i >= len) continue;
    float x[4];
    load4(a, i, len, vec, x);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (i + e < len) {
        if (sd_bad(x[e])) sm.bad = 1;
        if (best_i == 0xffffffffu || x[e] > best) { best = x[e]; best_i = i + e; }
      }
    }
  }
  // Combine: larger value wins, ties to the lower index. Order-independent.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const u32 oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (oi != 0xffffffffu && (best_i == 0xffffffffu || ob > best || (ob == best && oi < best_i))) { best = ob; best_i = oi; }
  }
  __syncthreads();
  const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { sm.warp_f[warp] = best; sm.warp_i[warp] = best_i; }
  __syncthreads();
  best = -SD_INF;
  best_i = 0xffffffffu;
  for (u32 w = 0; w < VB / 32; ++w) {
    const float ob = sm.warp_f[w];
    const u32 oi = sm.warp_i[w];
    if (oi != 0xffffffffu && (best_i == 0xffffffffu || ob > best || (ob == best && oi < best_i))) { best = ob; best_i = oi; }
  }
  return best_i == 0xffffffffu ? 0 : best_i;
}

// categorical(w) with fallback p, then argmax(p) (sampling/rejection.rs sample_or).

__device__ __forceinline__ u32 sample_or(const float* w, const float* p, u32 len, bool vec, u64 word, Smem& sm) {
  u64 total = row_total(w, nullptr, len, vec, sm);
  if (total > 0) return row_search(w, len, vec, (u64)__umul64hi(word, total), sm);
  total = row_total(p, nullptr, len, vec, sm);
  if (total > 0) return row_search(p, len, vec, (u64)__umul64hi(word, total), sm);
  return row_argmax(p, len, vec, sm);
}

// dst_i = f(i) / (float(T) * 2^-32) where f = max(0, a - b) (b != null) or a with a[skip] = 0.
__device__ __forceinline__ void write_normalised(float* dst, const float* a, const float* b, u32 skip, u32 len,
                                 float total) {
  for (u32 i = threadIdx.x; i < len; i += VB) {
    float w = b ? (a[i] > b[i] ? __fsub_rn(a[i], b[i]) : 0.0f) : (i == skip ? 0.0f : a[i]);
    dst[i] = __fdiv_rn(w, total);
  }
  __syncthreads();
}

struct VerifyParams {
  const float* p;            // [total_nodes, vocab] target probabilities at every node
  const float* q;            // [q_rows, vocab] draft probabilities of expanded nodes
  const i32* q_row;          // [total_nodes] row of q for the node, -1 if none
  const u32* tokens;         // [total_nodes] token of each node (root's unused)
  const u32* node_offsets;   // [batch + 1] first node of each sequence
  const u32* child_offsets;  // [total_nodes + 1] CSR over global node ids (children in order)
  const u32* child_nodes;    // children, as local node ids of their sequence
  const u64* key_seeds;      // [batch] seed of each sequence's words
  const u64* key_sequences;  // [batch] DrawKey.sequence of each sequence's words
  const u64* steps;          // [batch] decoding steps (DrawKey.step)
  float* scratch;            // [batch, 2, vocab] residual r and proposal s (methods 1, 2)
  u32* accepted_path;        // [batch, max_path] accepted local node ids
  u32* accepted_len;         // [batch]
  u32* next_token;           // [batch]
  u32* status;               // [batch] 0 ok, 1 bad probability, 2 missing q, 3 path overflow
  u32 vocab, method, max_path;
};

extern "C" __global__ void __launch_bounds__(VB, 1) verify_tree(VerifyParams prm) {
  __shared__ Smem sm;
  const u32 b = blockIdx.x;
  const u32 first = prm.node_offsets[b];
  const u32 V = prm.vocab;
  const bool vec = (V % 4) == 0;
  if (threadIdx.x == 0) { sm.bad = 0; sm.found = 0; }
  __syncthreads();
  float* r_buf = prm.scratch + (u64)b * 2 * V;
  float* s_buf = r_buf + V;
  const u64 seed = prm.key_seeds[b], seq = prm.key_sequences[b], step = prm.steps[b];
  u32 node = 0, path_len = 0, status = 0, next = 0;
  for (;;) {
    const u32 g = first + node;
    const float* p = prm.p + (u64)g * V;
    const u32 c0 = prm.child_offsets[g], c1 = prm.child_offsets[g + 1];
    if (prm.method == 0 || prm.method == 3) {
      const u32 y = prm.method == 0
          ? row_argmax(p, V, vec, sm)
          : sample_or(p, p, V, vec, sd_word(seed, seq, step, node, 5), sm);
      u32 child = 0xffffffffu;
      for (u32 c = c0; c < c1; ++c) {
        const u32 cn = prm.child_nodes[c];
        if (prm.tokens[first + cn] == y) { child = cn; break; }
      }
      if (child == 0xffffffffu) { next = y; break; }
      if (path_len == prm.max_path) { status = 3; break; }
      if (threadIdx.x == 0) prm.accepted_path[(u64)b * prm.max_path + path_len] = child;
      ++path_len;
      node = child;
      continue;
    }
    if (c0 == c1) {  // leaf: bonus from p
      next = sample_or(p, p, V, vec, sd_word(seed, seq, step, node, 4), sm);
      break;
    }
    const i32 qr = prm.q_row[g];
    if (qr < 0) { status = 2; break; }
    const float* q = prm.q + (u64)qr * V;
    const float* r = p;  // current residual (p until the first rejection)
    const float* s = q;  // current proposal
    u32 accepted = 0xffffffffu;
    for (u32 c = c0; c < c1; ++c) {
      const u32 cn = prm.child_nodes[c];
      const u32 x = prm.tokens[first + cn];
      if (x >= V) { status = 1; break; }
      if (sd_accept(sd_word(seed, seq, step, cn, 2), r[x], s[x])) { accepted = cn; break; }
      // r <- norm(max(0, r - s)), or p when that has no mass.
      const u64 t = row_total(r, s, V, vec, sm);
      if (t > 0) {
        write_normalised(r_buf, r, s, 0, V, sd_from_fixed(t));
      } else {
        for (u32 i = threadIdx.x; i < V; i += VB) r_buf[i] = p[i];
        __syncthreads();
      }
      r = r_buf;
      if (prm.method == 2) {  // s <- norm(s with x removed), kept when that has no mass
        if (s != s_buf) {
          for (u32 i = threadIdx.x; i < V; i += VB) s_buf[i] = s[i];
          __syncthreads();
          s = s_buf;
        }
        if (threadIdx.x == 0) s_buf[x] = 0.0f;
        __syncthreads();
        const u64 ts = row_total(s_buf, nullptr, V, vec, sm);
        if (ts > 0) write_normalised(s_buf, s_buf, nullptr, 0xffffffffu, V, sd_from_fixed(ts));
      }
    }
    if (status) break;
    if (accepted == 0xffffffffu) {
      next = sample_or(r, p, V, vec, sd_word(seed, seq, step, node, 3), sm);
      break;
    }
    if (path_len == prm.max_path) { status = 3; break; }
    if (threadIdx.x == 0) prm.accepted_path[(u64)b * prm.max_path + path_len] = accepted;
    ++path_len;
    node = accepted;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    prm.accepted_len[b] = path_len;
    prm.next_token[b] = next;
    prm.status[b] = status ? status : (sm.bad ? 1u : 0u);
  }
}
