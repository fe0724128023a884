// Sampling preparation on the GPU: logits -> probabilities with temperature, top-k, top-p and
// min-p, without sorting the vocabulary. Semantics of sampling/prepare.rs (prepare_logits):
// temperature 0 is one-hot at the argmax (lowest id on ties); otherwise p = softmax(l / T), then
// top-k keeps the k most probable (ties: lower id first), then top-p keeps the shortest
// most-probable-first prefix (ties: lower id first) whose mass reaches top_p of the kept mass,
// then min-p drops every p below min_p * p_max (p_max = 1 / s, the argmax's softmax value, which
// top-k and top-p always keep; the same f32 product and comparison as the CPU), then the kept
// weights are divided by their 32-bit fixed-point total (as Prob::total).
//
// Selection without a sort: the k-th largest probability is found by a radix select over the
// float bit patterns (non-negative floats order like their bits): 4 passes of 8 bits, each a
// 256-bin shared-memory histogram (integer counts: deterministic). Top-p does the same radix
// select on *mass* (40-bit fixed-point, exact u64 sums), so the cut never depends on summation
// order. Ties at the threshold are resolved by an in-order block scan (lowest ids kept first).
// Differences from the CPU reference: the softmax sum is a fixed-order tree sum (the CPU sums
// left to right), and the top-p running mass is exact fixed point (the CPU sums floats in sorted
// order); probabilities agree within a few ulps and the top-p cut can differ only when the mass
// reaches top_p within that rounding.
//
// Launch-size reasoning: grid = rows, block = 1024; ~12 passes over the row (vocab 152k = 608 KB
// f32, L2-resident after the first), so ~0.5 us per pass per row at L2 bandwidth; a batch of 64
// rows fills half the SMs. Bytes that must move: the logits read once and probabilities written
// once (8 B per token).

#define PB 1024

struct PrepSmem {
  float scratch[32];
  u32 hist[256];
  u64 mass[256];
  u32 warp_u32[PB / 32];
  u32 sel_bits, sel_rank;
  u64 sel_mass;
};


__device__ __forceinline__ u64 mass40(float p) { return p > 0.0f ? __float2ull_rz(__fmul_rn(p, 1099511627776.0f)) : 0; }
__device__ __forceinline__ u64 fixed32(float p) {
  if (!(p > 0.0f)) return 0;
  if (p >= 1.0f) return 1ull << 32;
  return __float2ull_rz(__fmul_rn(p, 4294967296.0f));
}

// Radix select over the bits of row values (>= 0). by_mass = 0: find the value of rank `rank`
// (0 = largest) counting elements; by_mass = 1: find the largest value v such that the mass of
// elements > v is < target (so the cut falls among elements equal to v). Returns v's bits; sets
// sm.sel_rank (elements strictly greater) and sm.sel_mass (their mass).
__device__ u32 radix_select(const float* row, u32 len, bool by_mass, u32 rank, u64 target, PrepSmem& sm) {
  u32 prefix = 0, prefix_mask = 0;
  u32 above = 0;
  u64 above_mass = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (u32 i = threadIdx.x; i < 256; i += PB) { sm.hist[i] = 0; sm.mass[i] = 0; }
    __syncthreads();
    for (u32 i = threadIdx.x; i < len; i += PB) {
      const float v = row[i];
      const u32 bits = __float_as_uint(v);
      if ((bits & prefix_mask) == prefix && v > 0.0f) {
        const u32 bin = (bits >> shift) & 0xff;
        if (by_mass) atomicAdd(&sm.mass[bin], (unsigned long long)mass40(v));
        else atomicAdd(&sm.hist[bin], 1u);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      u32 acc = above;
      u64 accm = above_mass;
      u32 chosen = 0;
      for (int bin = 255; bin >= 0; --bin) {
        chosen = (u32)bin;
        if (by_mass) {
          if (accm + sm.mass[bin] >= target) break;
          accm += sm.mass[bin];
        } else {
          if (acc + sm.hist[bin] > rank) break;
          acc += sm.hist[bin];
        }
      }
      sm.sel_bits = chosen;
      sm.sel_rank = acc;
      sm.sel_mass = accm;
    }
    __syncthreads();
    prefix |= sm.sel_bits << shift;
    prefix_mask |= 0xffu << shift;
    above = sm.sel_rank;
    above_mass = sm.sel_mass;
    __syncthreads();
  }
  return prefix;
}

// Keeps elements > threshold and the first `quota` (in index order) equal to it; zeroes the rest.
__device__ void keep_threshold(float* row, u32 len, float threshold, u32 quota, PrepSmem& sm) {
  u32 seen = 0;
  for (u32 base = 0; base < len; base += PB) {
    const u32 i = base + threadIdx.x;
    const float v = i < len ? row[i] : 0.0f;
    const u32 tie = (i < len && v == threshold) ? 1u : 0u;
    u32 tile_ties;
    const u32 rank = seen + block_exclusive_scan<u32>(tie, sm.warp_u32, &tile_ties);
    if (i < len && (v < threshold || (tie && rank >= quota))) row[i] = 0.0f;
    seen += tile_ties;
  }
  __syncthreads();
}

extern "C" __global__ void __launch_bounds__(PB, 1)
sampling_prepare(const float* __restrict__ logits, float* __restrict__ out, u32 vocab,
                 float inv_temperature, u32 top_k, float top_p, float min_p,
                 u32* __restrict__ status) {
  __shared__ PrepSmem sm;
  const float* l = logits + (u64)blockIdx.x * vocab;
  float* p = out + (u64)blockIdx.x * vocab;
  // max (and argmax for greedy), flagging NaN
  float mx = -SD_INF;
  u32 bad = 0;
  for (u32 i = threadIdx.x; i < vocab; i += PB) {
    const float v = l[i];
    if (v != v) bad = 1;
    mx = fmaxf(mx, v);
  }
  mx = block_max(mx, sm.scratch);
  bad = __syncthreads_or(bad);
  if (bad || mx == -SD_INF || mx == SD_INF) {
    if (threadIdx.x == 0) status[blockIdx.x] = 1;
    return;
  }
  if (!(inv_temperature > 0.0f)) {  // greedy (the host passes 0 for temperature 0)
    u32 first = 0xffffffffu;
    for (u32 i = threadIdx.x; i < vocab; i += PB) if (l[i] == mx) { first = i; break; }
    first = __reduce_min_sync(0xffffffffu, first);
    if ((threadIdx.x & 31) == 0) sm.warp_u32[threadIdx.x >> 5] = first;
    __syncthreads();
    first = 0xffffffffu;
    for (u32 w = 0; w < PB / 32; ++w) first = min(first, sm.warp_u32[w]);
    for (u32 i = threadIdx.x; i < vocab; i += PB) p[i] = (i == first) ? 1.0f : 0.0f;
    if (threadIdx.x == 0) status[blockIdx.x] = 0;
    return;
  }
  const float inv_t = inv_temperature;  // (1 / T) in f64, rounded to f32 by the host, as the CPU
  float s = 0.0f;
  for (u32 i = threadIdx.x; i < vocab; i += PB) {
    const float e = expf(__fmul_rn(__fsub_rn(l[i], mx), inv_t));
    p[i] = e;
    s = __fadd_rn(s, e);
  }
  s = block_sum(s, sm.scratch);
  for (u32 i = threadIdx.x; i < vocab; i += PB) p[i] = __fdiv_rn(p[i], s);
  __syncthreads();
  if (top_k > 0 && top_k < vocab) {
    const u32 bits = radix_select(p, vocab, false, top_k - 1, 0, sm);
    keep_threshold(p, vocab, __uint_as_float(bits), top_k - sm.sel_rank, sm);
  }
  if (top_p > 0.0f && top_p < 1.0f) {
    u64 total = 0;
    for (u32 i = threadIdx.x; i < vocab; i += PB) total += mass40(p[i]);
    total = warp_sum_u64(total);
    if ((threadIdx.x & 31) == 0) sm.mass[threadIdx.x >> 5] = total;
    __syncthreads();
    total = 0;
    for (u32 w = 0; w < PB / 32; ++w) total += sm.mass[w];
    __syncthreads();
    u64 target = (u64)((double)total * (double)top_p);
    if (target == 0) target = 1;
    const u32 bits = radix_select(p, vocab, true, 0, target, sm);
    const float v = __uint_as_float(bits);
    const u64 mv = mass40(v);
    const u64 need = target - sm.sel_mass;  // > 0 by construction
    const u32 quota = mv > 0 ? (u32)((need + mv - 1) / mv) : 1u;
    keep_threshold(p, vocab, v, quota, sm);
  }
  if (min_p > 0.0f) {
    // The argmax's probability: exp(0) / s, computed as the softmax loop computed it.
    const float cut = __fmul_rn(min_p, __fdiv_rn(1.0f, s));
    for (u32 i = threadIdx.x; i < vocab; i += PB) if (p[i] < cut) p[i] = 0.0f;
    __syncthreads();
  }
  // Normalise by the 32-bit fixed-point total (Prob::total).
  u64 t = 0;
  for (u32 i = threadIdx.x; i < vocab; i += PB) t += fixed32(p[i]);
  t = warp_sum_u64(t);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sm.mass[threadIdx.x >> 5] = t;
  __syncthreads();
  t = 0;
  for (u32 w = 0; w < PB / 32; ++w) t += sm.mass[w];
  const float tf = __fmul_rn(__ull2float_rn(t), 2.3283064365386963e-10f);
  for (u32 i = threadIdx.x; i < vocab; i += PB) p[i] = tf > 0.0f ? __fdiv_rn(p[i], tf) : 0.0f;
  if (threadIdx.x == 0) status[blockIdx.x] = tf > 0.0f ? 0u : 2u;
}
