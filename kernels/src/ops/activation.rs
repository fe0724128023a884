//! SwiGLU, softmax (and its scaled exponentials) and argmax.

use crate::error::{KernelError, Result};
use crate::quant::SimdLevel;

/// SwiGLU: `out[i] = silu(gate[i]) * up[i]` with `silu(g) = g / (1 + exp_f32(-g))`, all f32
/// ([`exp_f32`] is this crate's exponential, within 1 ulp of `exp`). Every element is computed
/// by the same sequence of rounded operations on every [`SimdLevel`] (AVX-512 sixteen at a
/// time, AVX2 eight, the portable loop one at a time), so the result is bit-identical on every CPU with
/// correctly rounded fused multiply-adds.
///
/// # Errors
/// [`KernelError::ShapeMismatch`] when the three slices differ in length.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<()> {
    for (what, len) in [("swiglu up", up.len()), ("swiglu output", out.len())] {
        if len != gate.len() {
            return Err(KernelError::ShapeMismatch {
                what: what.to_string(),
                expected: gate.len(),
                actual: len,
            });
        }
    }
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    match SimdLevel::detect() {
        // SAFETY: `detect()` found AVX-512 F on this CPU; the three slices have one length.
        SimdLevel::Avx512 => done = unsafe { avx512::swiglu(gate, up, out) },
        // SAFETY: `detect()` found AVX2 and FMA on this CPU; the three slices have one length.
        SimdLevel::Avx2 => done = unsafe { avx2::swiglu(gate, up, out) },
        SimdLevel::Portable => {}
    }
    for ((o, &g), &u) in out[done..].iter_mut().zip(&gate[done..]).zip(&up[done..]) {
        *o = g / (1.0 + exp_f32(-g)) * u;
    }
    Ok(())
}

/// Softmax weights at a temperature: `out[i] = exp_f32((x[i] − shift) · scale)` for every `i`,
/// with `shift` usually the row's maximum (so every weight is at most 1) and `scale` the inverse
/// temperature. Like [`swiglu`], every element is the same sequence of rounded operations on
/// every [`SimdLevel`], so the result is bit-identical on every CPU with correctly rounded fused
/// multiply-adds.
///
/// # Errors
/// [`KernelError::ShapeMismatch`] when `out` is not as long as `x`.
pub fn exp_scaled(x: &[f32], shift: f32, scale: f32, out: &mut [f32]) -> Result<()> {
    if out.len() != x.len() {
        return Err(KernelError::ShapeMismatch {
            what: "exp_scaled output".to_string(),
            expected: x.len(),
            actual: out.len(),
        });
    }
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    match SimdLevel::detect() {
        // SAFETY: `detect()` found AVX-512 F on this CPU; `x` and `out` have one length.
        SimdLevel::Avx512 => done = unsafe { avx512::exp_scaled(x, shift, scale, out) },
        // SAFETY: `detect()` found AVX2 and FMA on this CPU; `x` and `out` have one length.
        SimdLevel::Avx2 => done = unsafe { avx2::exp_scaled(x, shift, scale, out) },
        SimdLevel::Portable => {}
    }
    for (o, &v) in out[done..].iter_mut().zip(&x[done..]) {
        *o = exp_f32((v - shift) * scale);
    }
    Ok(())
}

/// `log2(e)`, rounded to f32.
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` in two parts: `LN2_HI` has few significant bits, so `n · LN2_HI` is exact for the
/// `|n| ≤ 151` used here.
const LN2_HI: f32 = 0.693_145_75;
/// `ln 2 − LN2_HI`.
const LN2_LO: f32 = 1.428_606_8e-6;
/// Taylor coefficients `1/k!` of `e^r`, `k = 0 ..= 7` (the truncation error on
/// `|r| ≤ ln 2 / 2` is below `5 · 10⁻⁹` relative).
const EXP_COEFFS: [f32; 8] = [
    1.0,
    1.0,
    0.5,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
];
/// Inputs are clamped to this range first: below it `e^x` rounds to 0 in f32, above it to
/// infinity, and the clamped values still do.
const EXP_RANGE: (f32, f32) = (-104.0, 89.0);

/// `e^x` in f32, within 1 ulp (tested against f64): `x = n·ln 2 + r` with
/// `n = round_ties_even(x · log2 e)` and `r` by two fused multiply-adds (Cody–Waite), `e^r` by a
/// degree-7 Horner polynomial of fused multiply-adds, then scaled by `2^n` with one rounding
/// (subnormal results and overflow to infinity included). NaN stays NaN. The AVX-512 version in
/// [`swiglu`] performs the same operations, so the two agree bit for bit.
pub fn exp_f32(x: f32) -> f32 {
    // `max(lo, x)` then `min(hi, ·)` in this order, as the SIMD version, keeping NaN
    let x = if x.is_nan() {
        x
    } else {
        x.max(EXP_RANGE.0).min(EXP_RANGE.1)
    };
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let p = EXP_COEFFS[..7]
        .iter()
        .rev()
        .fold(EXP_COEFFS[7], |p, &c| p.mul_add(r, c));
    // `p · 2^n` is exact in f64 (`p` has 24 bits, `2^n` is a power of two within f64's range);
    // the cast rounds it once, as `vscalefps` does.
    if n.is_nan() {
        return f32::NAN;
    }
    (f64::from(p) * 2f64.powi(n as i32)) as f32
}

// The AVX-512 intrinsics are stable since Rust 1.89, the workspace's `rust-version`.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! [`super::swiglu`] sixteen elements at a time.

    use super::{EXP_COEFFS, EXP_RANGE, LN2_HI, LN2_LO, LOG2E};
    use std::arch::x86_64::*;

    /// [`super::exp_f32`] of sixteen lanes: the same operations.
    #[target_feature(enable = "avx512f")]
    fn exp16(x: __m512) -> __m512 {
        let x = _mm512_min_ps(
            _mm512_set1_ps(EXP_RANGE.1),
            _mm512_max_ps(_mm512_set1_ps(EXP_RANGE.0), x),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
        );
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), x);
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
        let mut p = _mm512_set1_ps(EXP_COEFFS[7]);
        for &c in EXP_COEFFS[..7].iter().rev() {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        _mm512_scalef_ps(p, n)
    }

    /// The first `16 · ⌊len / 16⌋` elements of [`super::swiglu`]; returns how many it wrote.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F; `gate`, `up` and `out` have one length.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) -> usize {
        let whole = gate.len() / 16 * 16;
        let one = _mm512_set1_ps(1.0);
        for i in (0..whole).step_by(16) {
            // SAFETY: `i + 16 ≤ whole ≤ len` for all three slices; unaligned access is allowed.
            unsafe {
                let g = _mm512_loadu_ps(gate.as_ptr().add(i));
                let u = _mm512_loadu_ps(up.as_ptr().add(i));
                let e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
                let silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
                _mm512_storeu_ps(out.as_mut_ptr().add(i), _mm512_mul_ps(silu, u));
            }
        }
        whole
    }

    /// The first `16 · ⌊len / 16⌋` elements of [`super::exp_scaled`]; returns how many it wrote.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F; `x` and `out` have one length.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_scaled(x: &[f32], shift: f32, scale: f32, out: &mut [f32]) -> usize {
        let whole = x.len() / 16 * 16;
        let (shift, scale) = (_mm512_set1_ps(shift), _mm512_set1_ps(scale));
        for i in (0..whole).step_by(16) {
            // SAFETY: `i + 16 ≤ whole ≤ len` for both slices; unaligned access is allowed.
            unsafe {
                let v = _mm512_loadu_ps(x.as_ptr().add(i));
                let e = exp16(_mm512_mul_ps(_mm512_sub_ps(v, shift), scale));
                _mm512_storeu_ps(out.as_mut_ptr().add(i), e);
            }
        }
        whole
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! [`super::swiglu`] eight elements at a time.

    use super::{EXP_COEFFS, EXP_RANGE, LN2_HI, LN2_LO, LOG2E};
    use std::arch::x86_64::*;

    /// `p · 2^n` lane by lane for four lanes of `p` and of the integers `n` (`|n| ≤ 151`),
    /// exact in f64 (`p` has 24 bits, `2^n` is a normal f64).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn scale4(p: __m128, n: __m128i) -> __m256d {
        let biased = _mm256_add_epi64(_mm256_cvtepi32_epi64(n), _mm256_set1_epi64x(1023));
        let two_to_n = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(biased));
        _mm256_mul_pd(_mm256_cvtps_pd(p), two_to_n)
    }

    /// [`super::exp_f32`] of eight lanes: the same operations (the scaling in f64, rounded
    /// once to f32, as the scalar version does).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn exp8(x: __m256) -> __m256 {
        let x = _mm256_min_ps(
            _mm256_set1_ps(EXP_RANGE.1),
            _mm256_max_ps(_mm256_set1_ps(EXP_RANGE.0), x),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        );
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
        let mut p = _mm256_set1_ps(EXP_COEFFS[7]);
        for &c in EXP_COEFFS[..7].iter().rev() {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        // a NaN `n` gives a garbage power, but then `p` is NaN too and so is the product
        let n = _mm256_cvtps_epi32(n);
        let low = scale4(_mm256_castps256_ps128(p), _mm256_castsi256_si128(n));
        let high = scale4(
            _mm256_extractf128_ps::<1>(p),
            _mm256_extracti128_si256::<1>(n),
        );
        _mm256_set_m128(_mm256_cvtpd_ps(high), _mm256_cvtpd_ps(low))
    }

    /// The first `8 · ⌊len / 8⌋` elements of [`super::swiglu`]; returns how many it wrote.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `gate`, `up` and `out` have one length.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) -> usize {
        let whole = gate.len() / 8 * 8;
        let one = _mm256_set1_ps(1.0);
        for i in (0..whole).step_by(8) {
            // SAFETY: `i + 8 ≤ whole ≤ len` for all three slices; unaligned access is allowed.
            unsafe {
                let g = _mm256_loadu_ps(gate.as_ptr().add(i));
                let u = _mm256_loadu_ps(up.as_ptr().add(i));
                let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
                let silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
                _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(silu, u));
            }
        }
        whole
    }

    /// The first `8 · ⌊len / 8⌋` elements of [`super::exp_scaled`]; returns how many it wrote.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `x` and `out` have one length.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_scaled(x: &[f32], shift: f32, scale: f32, out: &mut [f32]) -> usize {
        let whole = x.len() / 8 * 8;
        let (shift, scale) = (_mm256_set1_ps(shift), _mm256_set1_ps(scale));
        for i in (0..whole).step_by(8) {
            // SAFETY: `i + 8 ≤ whole ≤ len` for both slices; unaligned access is allowed.
            unsafe {
                let v = _mm256_loadu_ps(x.as_ptr().add(i));
                let e = exp8(_mm256_mul_ps(_mm256_sub_ps(v, shift), scale));
                _mm256_storeu_ps(out.as_mut_ptr().add(i), e);
            }
        }
        whole
    }
}

/// Numerically stable softmax of one row, in place: `x[i] ← exp(x[i] − max) / Σ exp(x[j] − max)`,
/// the sum accumulated in f64 in index order. `-inf` entries become 0. An empty row is left
/// alone.
///
/// # Errors
/// [`KernelError::InvalidParameter`] when the row contains a NaN or `+inf`, or every entry is
/// `-inf` (no distribution).
pub fn softmax_in_place(x: &mut [f32]) -> Result<()> {
    if x.is_empty() {
        return Ok(());
    }
    if let Some(i) = x.iter().position(|v| v.is_nan() || *v == f32::INFINITY) {
        return Err(KernelError::InvalidParameter {
            what: "softmax input",
            reason: format!("entry {i} is {}", x[i]),
        });
    }
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return Err(KernelError::InvalidParameter {
            what: "softmax input",
            reason: "every entry is -inf".to_string(),
        });
    }
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
    Ok(())
}

/// Index of the largest entry; ties go to the lowest index. NaNs are skipped; `None` for an
/// empty row or a row of NaNs.
pub fn argmax(x: &[f32]) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in x.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swiglu_values() {
        let mut out = [0.0; 3];
        swiglu(&[0.0, 1.0, -2.0], &[5.0, 2.0, 3.0], &mut out).unwrap();
        assert_eq!(out[0], 0.0);
        assert!((out[1] - 2.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-7);
        assert!((out[2] - 3.0 * (-2.0 / (1.0 + 2.0f32.exp()))).abs() < 1e-6);
        assert!(swiglu(&[0.0; 3], &[0.0; 2], &mut out).is_err());
        assert!(swiglu(&[0.0; 3], &[0.0; 3], &mut [0.0; 4]).is_err());
    }

    /// Distance in units in the last place between two non-negative floats.
    fn ulps(a: f32, b: f32) -> u32 {
        a.to_bits().abs_diff(b.to_bits())
    }

    #[test]
    fn exp_is_within_one_ulp_of_the_f64_exponential() {
        // a dense sweep of the whole range that rounds to neither 0 nor infinity, subnormal
        // results included, plus the points next to the clamps
        let (lo, hi) = (-103.9f32, 88.72f32);
        let steps = 400_000;
        let mut worst = 0;
        for i in 0..=steps {
            let x = lo + (hi - lo) * (i as f32 / steps as f32);
            let want = f64::from(x).exp() as f32;
            let got = exp_f32(x);
            worst = worst.max(ulps(got, want));
            assert!(ulps(got, want) <= 1, "exp({x}) = {got}, want {want}");
        }
        assert!(worst <= 1);
        for x in [
            0.0,
            -0.0,
            1.0,
            -1.0,
            1e-8,
            -1e-8,
            0.5 * std::f32::consts::LN_2,
        ] {
            assert!(ulps(exp_f32(x), f64::from(x).exp() as f32) <= 1, "exp({x})");
        }
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-200.0), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
    }

    #[test]
    fn swiglu_is_the_same_arithmetic_on_every_level() {
        // long enough for the SIMD part and a tail; extremes, zeros, subnormals and NaN
        let specials = [
            0.0,
            -0.0,
            1e-40,
            -1e-40,
            88.0,
            -88.0,
            104.5,
            -104.5,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        let gate: Vec<f32> = (0..1037)
            .map(|i| {
                specials
                    .get(i % 97)
                    .copied()
                    .unwrap_or((i as f32 * 0.37).sin() * 12.0)
            })
            .collect();
        let up: Vec<f32> = (0..gate.len())
            .map(|i| 1.0 + (i % 13) as f32 * 0.25)
            .collect();
        let mut out = vec![0.0; gate.len()];
        swiglu(&gate, &up, &mut out).unwrap();
        for ((&o, &g), &u) in out.iter().zip(&gate).zip(&up) {
            let want = g / (1.0 + exp_f32(-g)) * u;
            assert!(
                o.to_bits() == want.to_bits() || (o.is_nan() && want.is_nan()),
                "swiglu({g}, {u}) = {o}, want {want}"
            );
        }
    }

    #[test]
    fn exp_scaled_is_the_same_arithmetic_on_every_level() {
        // lengths with and without a tail past the SIMD width; huge, tiny and non-finite inputs
        let specials = [
            0.0,
            -0.0,
            1e-40,
            -1e-40,
            -150.0,
            60.0,
            f32::NAN,
            f32::NEG_INFINITY,
        ];
        for len in [1usize, 8, 15, 16, 17, 1037] {
            let x: Vec<f32> = (0..len)
                .map(|i| {
                    specials
                        .get(i % 61)
                        .copied()
                        .unwrap_or((i as f32 * 0.37).sin() * 30.0)
                })
                .collect();
            for (shift, scale) in [(0.0, 1.0), (29.5, 1.0), (29.5, 1.0 / 0.7), (-3.0, 0.25)] {
                let mut out = vec![0.0; len];
                exp_scaled(&x, shift, scale, &mut out).unwrap();
                for (&o, &v) in out.iter().zip(&x) {
                    let want = exp_f32((v - shift) * scale);
                    assert!(
                        o.to_bits() == want.to_bits() || (o.is_nan() && want.is_nan()),
                        "exp(({v} - {shift}) * {scale}) = {o}, want {want}"
                    );
                }
            }
        }
        assert!(exp_scaled(&[0.0; 3], 0.0, 1.0, &mut [0.0; 2]).is_err());
    }

    #[test]
    fn softmax_is_a_distribution_and_shift_invariant() {
        let mut a = [1.0, 2.0, 3.0, f32::NEG_INFINITY];
        let mut b = [1001.0, 1002.0, 1003.0, f32::NEG_INFINITY];
        softmax_in_place(&mut a).unwrap();
        softmax_in_place(&mut b).unwrap();
        assert_eq!(a, b);
        assert_eq!(a[3], 0.0);
        assert!((a.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let e = [1.0f64, 1f64.exp(), 2f64.exp()];
        let z: f64 = e.iter().sum();
        assert!((f64::from(a[2]) - e[2] / z).abs() < 1e-6);
        assert!(softmax_in_place(&mut [0.0, f32::NAN]).is_err());
        assert!(softmax_in_place(&mut [f32::NEG_INFINITY; 2]).is_err());
    }

    #[test]
    fn argmax_ties_go_low_and_nans_are_skipped() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), Some(1));
        assert_eq!(argmax(&[f32::NAN, -1.0, -5.0]), Some(1));
        assert_eq!(argmax(&[]), None);
        assert_eq!(argmax(&[f32::NAN]), None);
        assert_eq!(argmax(&[f32::NEG_INFINITY]), Some(0));
    }
}
