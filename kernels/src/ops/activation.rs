//! SwiGLU, softmax and argmax.

use crate::error::{KernelError, Result};

/// SwiGLU: `out[i] = silu(gate[i]) * up[i]` with `silu(g) = g / (1 + exp(-g))`, all f32.
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
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
    Ok(())
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
