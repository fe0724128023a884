//! RMSNorm.

use crate::error::{KernelError, Result};

/// RMSNorm of each token: `out[t][i] = (x[t][i] * s_t) * weight[i]` with
/// `s_t = 1 / sqrt(mean_i(x[t][i]²) + eps)`. The mean of squares is accumulated in f64 in index
/// order and `s_t` computed in f64, then rounded to f32 once.
///
/// `x` and `out` are `[n_tokens × dim]` with `dim = weight.len()`.
///
/// # Errors
/// [`KernelError::ShapeMismatch`] when `x.len()` is not a multiple of `dim` or `out.len() !=
/// x.len()`; [`KernelError::InvalidParameter`] when `dim == 0` or `eps` is negative or not finite.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> Result<()> {
    let dim = weight.len();
    if dim == 0 || !(eps >= 0.0 && eps.is_finite()) {
        return Err(KernelError::InvalidParameter {
            what: "rms_norm",
            reason: format!("dim {dim}, eps {eps}: need dim > 0 and a finite eps >= 0"),
        });
    }
    if !x.len().is_multiple_of(dim) || out.len() != x.len() {
        return Err(KernelError::ShapeMismatch {
            what: format!("rms_norm input/output (dim {dim}, input {})", x.len()),
            expected: x.len().div_ceil(dim) * dim,
            actual: if !x.len().is_multiple_of(dim) {
                x.len()
            } else {
                out.len()
            },
        });
    }
    for (xt, ot) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let sum_sq: f64 = xt.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let scale = (1.0 / (sum_sq / dim as f64 + f64::from(eps)).sqrt()) as f32;
        for ((o, &v), &g) in ot.iter_mut().zip(xt).zip(weight) {
            *o = (v * scale) * g;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_to_unit_rms_then_scales() {
        // x = [3, 4]: mean square 12.5, eps 0 → s = 1/sqrt(12.5)
        let mut out = [0.0; 4];
        rms_norm(&[3.0, 4.0, 0.0, 2.0], &[1.0, 2.0], 0.0, &mut out).unwrap();
        let s = (1.0 / 12.5f64.sqrt()) as f32;
        assert_eq!(out[0], 3.0 * s);
        assert_eq!(out[1], (4.0 * s) * 2.0);
        // second token [0, 2]: mean square 2
        let s2 = (1.0 / 2f64.sqrt()) as f32;
        assert_eq!(out[2], 0.0);
        assert_eq!(out[3], (2.0 * s2) * 2.0);
        let rms: f32 = ((out[0] * out[0] + (out[1] / 2.0).powi(2)) / 2.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }

    #[test]
    fn eps_keeps_zero_input_finite() {
        let mut out = [1.0; 3];
        rms_norm(&[0.0; 3], &[1.0; 3], 1e-6, &mut out).unwrap();
        assert_eq!(out, [0.0; 3]);
    }

    #[test]
    fn bad_shapes_are_refused() {
        let mut out = [0.0; 3];
        assert!(rms_norm(&[1.0; 3], &[1.0; 2], 1e-6, &mut out).is_err());
        assert!(rms_norm(&[1.0; 4], &[1.0; 2], 1e-6, &mut out).is_err());
        assert!(rms_norm(&[1.0; 3], &[], 1e-6, &mut out).is_err());
        assert!(rms_norm(&[1.0; 3], &[1.0; 3], f32::NAN, &mut out).is_err());
    }
}
