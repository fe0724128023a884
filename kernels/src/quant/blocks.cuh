// GGUF (GGML) block decoders for the device, shared by the dequantiser (dequant.cu) and the
// products that read the blocks (qmatmul.cu). `Q::at(block, j)` is element j of one block in
// f32, equal bit for bit to the CPU reader's `dequantize_row` (products and sums rounded with
// __fmul_rn / __fadd_rn / __fsub_rn, so no fused multiply-add changes the rounding).
//
// Block formats (little-endian, as stored in GGUF):
//   Q8_0  34 B / 32:  f16 d, i8 q[32]                         y = d * q
//   Q4_0  18 B / 32:  f16 d, u8 qs[16] (lo nibbles = 0..15)    y = (q - 8) * d
//   Q4_1  20 B / 32:  f16 d, f16 m, u8 qs[16]                  y = q * d + m
//   Q5_0  22 B / 32:  f16 d, u32 qh, u8 qs[16] (bit 4 in qh)   y = (q - 16) * d
//   Q4_K 144 B / 256: f16 d, f16 dmin, u8 scales[12] (6-bit packed), u8 qs[128]
//                     y = (d * sc) * q - (dmin * m), per 32-element sub-block
//   Q5_K 176 B / 256: as Q4_K plus u8 qh[32] (before qs): q gains bit 4
//   Q6_K 210 B / 256: u8 ql[128], u8 qh[64], i8 scales[16], f16 d   y = (d * sc) * (q - 32)

__device__ __forceinline__ float rd_f16(const u8* p) { return half_bits_to_f32((u16)p[0] | ((u16)p[1] << 8)); }
__device__ __forceinline__ u32 rd_u32(const u8* p) {
  return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// The 6-bit (scale, min) pair `is` (0..7) of a K-quant super-block's packed 12-byte table.
__device__ __forceinline__ void k_scale_min(const u8* s, u32 is, u32* sc, u32* m) {
  if (is < 4) {
    *sc = s[is] & 63;
    *m = s[is + 4] & 63;
  } else {
    *sc = (s[is + 4] & 0xF) | ((s[is - 4] >> 6) << 4);
    *m = (s[is + 4] >> 4) | ((s[is] >> 6) << 4);
  }
}

struct Q8_0 { static constexpr u32 QK = 32, BYTES = 34;
  __device__ static float at(const u8* b, u32 j) { return __fmul_rn(rd_f16(b), (float)(i8)b[2 + j]); } };
struct Q4_0 { static constexpr u32 QK = 32, BYTES = 18;
  __device__ static float at(const u8* b, u32 j) {
    const u8 byte = b[2 + (j & 15)];
    const int q = (j < 16 ? (byte & 0xF) : (byte >> 4)) - 8;
    return __fmul_rn((float)q, rd_f16(b)); } };
struct Q4_1 { static constexpr u32 QK = 32, BYTES = 20;
  __device__ static float at(const u8* b, u32 j) {
    const u8 byte = b[4 + (j & 15)];
    const int q = j < 16 ? (byte & 0xF) : (byte >> 4);
    return __fadd_rn(__fmul_rn((float)q, rd_f16(b)), rd_f16(b + 2)); } };
struct Q5_0 { static constexpr u32 QK = 32, BYTES = 22;
  __device__ static float at(const u8* b, u32 j) {
    const u32 qh = rd_u32(b + 2);
    const u32 l = j & 15;
    const u8 byte = b[6 + l];
    const int q = j < 16 ? ((byte & 0xF) | (((qh >> l) & 1) << 4))
                         : ((byte >> 4) | (((qh >> (l + 16)) & 1) << 4));
    return __fmul_rn((float)(q - 16), rd_f16(b)); } };
struct Q4_K { static constexpr u32 QK = 256, BYTES = 144;
  __device__ static float at(const u8* b, u32 j) {
    const u32 c = j / 64, within = j % 64, hi = within >= 32, l = within % 32;
    u32 sc, m;
    k_scale_min(b + 4, 2 * c + hi, &sc, &m);
    const u8 byte = b[16 + 32 * c + l];
    const u32 q = hi ? (byte >> 4) : (byte & 0xF);
    return __fsub_rn(__fmul_rn(__fmul_rn(rd_f16(b), (float)sc), (float)q),
                     __fmul_rn(rd_f16(b + 2), (float)m)); } };
struct Q5_K { static constexpr u32 QK = 256, BYTES = 176;
  __device__ static float at(const u8* b, u32 j) {
    const u32 c = j / 64, within = j % 64, hi = within >= 32, l = within % 32;
    u32 sc, m;
    k_scale_min(b + 4, 2 * c + hi, &sc, &m);
    const u8 byte = b[48 + 32 * c + l];
    const u32 bit = (b[16 + l] >> (2 * c + hi)) & 1;
    const u32 q = (hi ? (byte >> 4) : (byte & 0xF)) + 16 * bit;
    return __fsub_rn(__fmul_rn(__fmul_rn(rd_f16(b), (float)sc), (float)q),
                     __fmul_rn(rd_f16(b + 2), (float)m)); } };
struct Q6_K { static constexpr u32 QK = 256, BYTES = 210;
  __device__ static float at(const u8* b, u32 j) {
    const u32 n = j / 128, r = j % 128, g = r / 32, l = r % 32;
    const u8* ql = b + 64 * n;
    const u8* qh = b + 128 + 32 * n;
    const i8* sc = (const i8*)(b + 192) + 8 * n;
    const u8 lo = (g & 1) ? ql[l + 32] : ql[l];
    const u32 low = (g < 2) ? (lo & 0xF) : (lo >> 4);
    const u32 high = (qh[l] >> (2 * g)) & 3;
    const int q = (int)(low | (high << 4)) - 32;
    return __fmul_rn(__fmul_rn(rd_f16(b + 208), (float)sc[l / 16 + 2 * g]), (float)q); } };
struct F16S { static constexpr u32 QK = 1, BYTES = 2;
  __device__ static float at(const u8* b, u32) { return rd_f16(b); } };
struct BF16S { static constexpr u32 QK = 1, BYTES = 2;
  __device__ static float at(const u8* b, u32) { return __uint_as_float(((u32)b[0] | ((u32)b[1] << 8)) << 16); } };
