//! The two inner loops of attention — a dot product and `acc += p * v` — written so their result
//! does not depend on the instruction set: eight fixed lanes, a fixed pairwise lane reduction,
//! and no fused multiply-add. The AVX2 build of the same code (chosen at run time) is therefore
//! bit-identical to the portable one; it is only faster.

/// Lanes of the fixed-order reduction.
const LANES: usize = 8;

/// `sum_d a[d] * b[d]` with lane `l` accumulating `d ≡ l (mod 8)` in increasing `d`, then lanes
/// combined as `((0+4)+(2+6)) + ((1+5)+(3+7))`. `a` and `b` have equal length.
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
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// `acc[d] += p * v[d]` for every `d` (elementwise, so order-free).
#[inline(always)]
pub(crate) fn axpy(acc: &mut [f32], p: f32, v: &[f32]) {
    debug_assert_eq!(acc.len(), v.len());
    for (a, x) in acc.iter_mut().zip(v) {
        *a += p * x;
    }
}

/// `acc[d] *= s` for every `d`.
#[inline(always)]
pub(crate) fn scale(acc: &mut [f32], s: f32) {
    for a in acc {
        *a *= s;
    }
}

/// True if the AVX2 build of the kernels may run on this CPU.
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
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

    #[test]
    fn axpy_and_scale() {
        let mut acc = vec![1.0f32, 2.0, 3.0];
        axpy(&mut acc, 2.0, &[1.0, 0.5, -1.0]);
        assert_eq!(acc, [3.0, 3.0, 1.0]);
        scale(&mut acc, 0.5);
        assert_eq!(acc, [1.5, 1.5, 0.5]);
    }
}
