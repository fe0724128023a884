//! Test helpers: a tiny deterministic generator and block *packers* written from the format
//! definitions (the reverse direction of the dequantisers), used to build blocks by hand.

use super::float16::f32_to_f16;
use super::types::QuantType;

/// SplitMix64: deterministic, dependency-free pseudo-random numbers for tests.
pub struct TestRng(pub u64);

impl TestRng {
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform integer in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// Uniform f32 in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// f16 bits of `v` as little-endian bytes.
pub fn f16_bytes(v: f32) -> [u8; 2] {
    f32_to_f16(v).to_le_bytes()
}

/// Packs 8 six-bit scales and mins into the 12 `scales` bytes of Q4_K / Q5_K.
pub fn pack_k_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
    }
    s
}

/// Packs a Q4_K super-block from `d`, `dmin`, 6-bit `sc`/`m` and 256 4-bit quants.
pub fn pack_q4_k(d: f32, dmin: f32, sc: &[u8; 8], m: &[u8; 8], q: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(144);
    b.extend(f16_bytes(d));
    b.extend(f16_bytes(dmin));
    b.extend(pack_k_scales(sc, m));
    for c in 0..4 {
        for l in 0..32 {
            b.push((q[64 * c + l] & 15) | ((q[64 * c + 32 + l] & 15) << 4));
        }
    }
    b
}

/// Packs a Q5_K super-block from `d`, `dmin`, 6-bit `sc`/`m` and 256 5-bit quants.
pub fn pack_q5_k(d: f32, dmin: f32, sc: &[u8; 8], m: &[u8; 8], q: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(176);
    b.extend(f16_bytes(d));
    b.extend(f16_bytes(dmin));
    b.extend(pack_k_scales(sc, m));
    let mut qh = [0u8; 32];
    for c in 0..4 {
        for l in 0..32 {
            qh[l] |= ((q[64 * c + l] >> 4) & 1) << (2 * c);
            qh[l] |= ((q[64 * c + 32 + l] >> 4) & 1) << (2 * c + 1);
        }
    }
    b.extend(qh);
    for c in 0..4 {
        for l in 0..32 {
            b.push((q[64 * c + l] & 15) | ((q[64 * c + 32 + l] & 15) << 4));
        }
    }
    b
}

/// Packs a Q6_K super-block from 256 6-bit quants (0..64), 16 signed scales and `d`.
pub fn pack_q6_k(d: f32, scales: &[i8; 16], q: &[u8]) -> Vec<u8> {
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for h in 0..2 {
        let qq = &q[128 * h..128 * h + 128];
        for l in 0..32 {
            ql[64 * h + l] = (qq[l] & 15) | ((qq[l + 64] & 15) << 4);
            ql[64 * h + l + 32] = (qq[l + 32] & 15) | ((qq[l + 96] & 15) << 4);
            qh[32 * h + l] = (qq[l] >> 4)
                | ((qq[l + 32] >> 4) << 2)
                | ((qq[l + 64] >> 4) << 4)
                | ((qq[l + 96] >> 4) << 6);
        }
    }
    let mut b = Vec::with_capacity(210);
    b.extend(ql);
    b.extend(qh);
    b.extend(scales.iter().map(|&s| s as u8));
    b.extend(f16_bytes(d));
    b
}

/// A random row of `n` elements of type `ty`: random quant bytes, with every scale field set to
/// a moderate f16 (so no NaN/inf), like a real weight row.
pub fn random_row(ty: QuantType, n: usize, rng: &mut TestRng) -> Vec<u8> {
    let bytes = ty.row_bytes(n).expect("aligned test row");
    let mut row: Vec<u8> = (0..bytes).map(|_| rng.next_u64() as u8).collect();
    let bb = ty.block_bytes();
    for block in row.chunks_exact_mut(bb) {
        let mut put = |at: usize, v: f32| block[at..at + 2].copy_from_slice(&f16_bytes(v));
        match ty {
            QuantType::F32 => block.copy_from_slice(&rng.uniform(-1.0, 1.0).to_le_bytes()),
            QuantType::F16 => put(0, rng.uniform(-1.0, 1.0)),
            QuantType::BF16 => {
                let v = rng.uniform(-1.0, 1.0).to_bits();
                block.copy_from_slice(&((v >> 16) as u16).to_le_bytes());
            }
            QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q5_0 => put(0, rng.uniform(-0.02, 0.02)),
            QuantType::Q4_1 => {
                put(0, rng.uniform(0.0, 0.02));
                put(2, rng.uniform(-0.1, 0.0));
            }
            QuantType::Q4_K | QuantType::Q5_K => {
                put(0, rng.uniform(0.0, 0.002));
                put(2, rng.uniform(0.0, 0.002));
            }
            QuantType::Q6_K => put(208, rng.uniform(0.0, 0.002)),
        }
    }
    row
}

/// Every [`super::SimdLevel`] this CPU can run, portable first.
pub fn available_levels() -> Vec<super::SimdLevel> {
    use super::SimdLevel;
    [SimdLevel::Portable, SimdLevel::Avx2, SimdLevel::Avx512]
        .into_iter()
        .filter(|l| l.is_available())
        .collect()
}

/// Asserts that each token's row of `batch` (`[n × rows]`) is bit-identical to `alone[t]`.
pub fn assert_rows_bit_identical(batch: &[f32], alone: &[Vec<f32>], rows: usize, what: &str) {
    for (t, (got, want)) in batch.chunks_exact(rows).zip(alone).enumerate() {
        assert!(
            got.iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: token {t} differs"
        );
    }
}

/// The f64 reference of one output element, `Σ w·x`, and the magnitude `Σ |w·x|` that error
/// bounds are stated relative to.
pub(crate) fn reference_dot(weights: &[f32], x: &[f32]) -> (f64, f64) {
    weights
        .iter()
        .zip(x)
        .map(|(&a, &b)| a as f64 * b as f64)
        .fold((0.0, 0.0), |(sum, abs), p| (sum + p, abs + p.abs()))
}
