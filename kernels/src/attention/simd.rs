//! The two inner loops of attention — a dot product and `acc += p * v` — written so their result
//! does not depend on the instruction set: 32 fixed lanes (four independent 8-wide accumulators,
//! so the adds pipeline), a fixed pairwise lane reduction, and no fused multiply-add. The AVX2
//! build of the same code (chosen at run time) is therefore bit-identical to the portable one; it
//! is only faster. Measured on a Xeon with AVX-512 (`tree_attention_simd` bench, SmolLM2's and
//! Qwen2.5's shapes) and not kept: both loops on zmm registers (the 32 lanes as two) ran from
//! 14 % faster to 8 % slower than this code depending on the size, with no consistent gain; a
//! vectorised chunk maximum and an accumulation two 32-lane blocks at a time stayed within the
//! run-to-run spread (about ±5 %).

/// Lanes of the fixed-order reduction.
const LANES: usize = 32;

/// `sum_d a[d] * b[d]` with lane `l` accumulating `d ≡ l (mod 32)` in increasing `d`, then lanes
/// combined pairwise: `lane[l] += lane[l + 16]`, then `+ lane[l + 8]`, `+ lane[l + 4]`,
/// `+ lane[l + 2]`, `+ lane[l + 1]`, leaving the sum in lane 0. `a` and `b` have equal length.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        acc[l] += x * y;
    }
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    acc[0]
}

/// `acc[d] += weights[j] * rows[j][d]` for `j` ascending, for every `d`: each element sees the
/// same adds in the same order as a plain loop over `j`. Done in blocks of 32 elements held in
/// registers across all rows. Every row has `acc.len()` elements.
#[inline(always)]
pub(crate) fn accumulate(acc: &mut [f32], weights: &[f32], rows: &[&[f32]]) {
    let whole = acc.len() / LANES * LANES;
    for start in (0..whole).step_by(LANES) {
        let mut block = [0.0f32; LANES];
        block.copy_from_slice(&acc[start..start + LANES]);
        for (p, row) in weights.iter().zip(rows) {
            let row = &row[start..start + LANES];
            for l in 0..LANES {
                block[l] += p * row[l];
            }
        }
        acc[start..start + LANES].copy_from_slice(&block);
    }
    for (p, row) in weights.iter().zip(rows) {
        for (a, x) in acc[whole..].iter_mut().zip(&row[whole..]) {
            *a += p * x;
        }
    }
}

/// `exp(x)` for `x <= 0` (softmax weights), within 3e-7 relative of the true value, from
/// elementwise IEEE operations only (no FMA, no table), so a vectorised loop and a scalar call
/// give the same bits. `x` below -87 is treated as -87 (a weight of about 1.6e-38 instead of
/// 0); NaN stays NaN. Being our own code, it also gives the same bits whatever the libm.
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75; // ln 2 rounded to 17 significant bits: n * LN2_HI is exact
    const LN2_LO: f32 = 1.428_606_8e-6; // ln 2 - LN2_HI
    let x = if x < -87.0 { -87.0 } else { x };
    let n = (x * LOG2E).round();
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // n is in -126..=0 for x in -87..=0: 2^n is a normal number.
    let two_n = f32::from_bits(((n as i32 + 127) as u32) << 23);
    p * two_n
}

/// `acc[d] *= s` for every `d`.
#[inline(always)]
pub(crate) fn scale(acc: &mut [f32], s: f32) {
    for a in acc {
        *a *= s;
    }
}

/// A dot-product implementation; every one gives the bits of [`dot`].
pub(crate) trait Dot: Copy + Send + Sync {
    /// `dot(a, b)`, bit-identical to the portable [`dot`].
    fn dot(self, a: &[f32], b: &[f32]) -> f32;
}

/// The portable [`dot`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Portable;

impl Dot for Portable {
    #[inline(always)]
    fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        dot(a, b)
    }
}

/// AVX2 intrinsics for [`dot`]; a value exists only on CPUs with AVX2.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2(());

#[cfg(target_arch = "x86_64")]
impl Avx2 {
    /// `Some` iff this CPU supports AVX2.
    pub(crate) fn detect() -> Option<Self> {
        std::is_x86_feature_detected!("avx2").then_some(Self(()))
    }
}

#[cfg(target_arch = "x86_64")]
impl Dot for Avx2 {
    #[inline(always)]
    fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        if a.len().is_multiple_of(LANES) && a.len() == b.len() {
            // SAFETY: an `Avx2` value exists only after run-time detection of AVX2.
            unsafe { dot_avx2(a, b) }
        } else {
            dot(a, b)
        }
    }
}

/// [`dot`] for lengths that are a multiple of 32: lanes 0-7, 8-15, 16-23, 24-31 are four ymm
/// accumulators (multiply, then add: no FMA), reduced in the same pairwise order.
///
/// # Safety
/// The CPU must support AVX2; `a.len() == b.len()` and both are multiples of 32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
#[allow(unused_unsafe)] // the arithmetic intrinsics are safe here on newer compilers only
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: AVX2 is available (caller contract); every load reads 8 floats inside a
    // 32-float chunk of `a` or `b`.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        for (x, y) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
            for (v, lane) in acc.iter_mut().enumerate() {
                let xv = _mm256_loadu_ps(x.as_ptr().add(8 * v));
                let yv = _mm256_loadu_ps(y.as_ptr().add(8 * v));
                *lane = _mm256_add_ps(*lane, _mm256_mul_ps(xv, yv));
            }
        }
        // lane[l] += lane[l + 16], then lane[l] += lane[l + 8]
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
        // lane[l] += lane[l + 4]
        let q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        // lane[l] += lane[l + 2]
        let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
        // lane[0] += lane[1]
        let q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
        _mm_cvtss_f32(q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_f64_and_handles_remainders() {
        for len in [1usize, 7, 8, 9, 64, 100, 128] {
            let a: Vec<f32> = (0..len).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..len).map(|i| (i as f32 * 0.11).cos()).collect();
            let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - exact).abs() < 1e-4, "len {len}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_dot_is_bit_identical_to_portable() {
        let Some(avx2) = Avx2::detect() else {
            return;
        };
        for len in [32usize, 64, 96, 128, 256] {
            for seed in 0..20u32 {
                let a: Vec<f32> = (0..len)
                    .map(|i| {
                        (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 37.0 - 13.0
                    })
                    .collect();
                let b: Vec<f32> = (0..len)
                    .map(|i| ((i as u32 * 40503 + seed * 7) % 997) as f32 / 101.0 - 4.9)
                    .collect();
                assert_eq!(
                    avx2.dot(&a, &b).to_bits(),
                    Portable.dot(&a, &b).to_bits(),
                    "len {len} seed {seed}"
                );
            }
        }
    }

    #[test]
    fn exp_is_accurate_on_nonpositive_inputs() {
        let mut x = 0.0f32;
        while x > -87.0 {
            let want = (x as f64).exp();
            let got = exp_nonpositive(x) as f64;
            assert!(
                ((got - want) / want).abs() < 3e-7,
                "exp({x}) = {got}, want {want}"
            );
            x -= 0.0173;
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert!(exp_nonpositive(-1000.0) < 1e-37);
        assert!(exp_nonpositive(f32::NAN).is_nan());
    }

    #[test]
    fn accumulate_equals_row_by_row_adds() {
        for len in [3usize, 32, 40, 128] {
            let rows: Vec<Vec<f32>> = (0..5)
                .map(|j| {
                    (0..len)
                        .map(|d| ((j * 31 + d * 7) % 13) as f32 / 3.0 - 2.0)
                        .collect()
                })
                .collect();
            let refs: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
            let weights = [0.3f32, 1.7, 0.01, 2.5, 0.9];
            let mut want: Vec<f32> = (0..len).map(|d| d as f32 * 0.1).collect();
            let mut got = want.clone();
            for (p, row) in weights.iter().zip(&rows) {
                for (a, x) in want.iter_mut().zip(row) {
                    *a += p * x;
                }
            }
            accumulate(&mut got, &weights, &refs);
            assert_eq!(got, want, "len {len}");
        }
        let mut acc = vec![1.0f32, 2.0, 3.0];
        scale(&mut acc, 0.5);
        assert_eq!(acc, [0.5, 1.0, 1.5]);
    }
}
