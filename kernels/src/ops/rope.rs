//! Rotary position embedding (RoPE) in both layouts GGUF models use.
//!
//! For a head of `head_dim = d` elements, pair `i` (`0 <= i < d/2`) is rotated by the angle
//! `pos · base^(-2i/d)`: `(a, b) → (a·cos − b·sin, a·sin + b·cos)`. The layouts differ only in
//! which two elements form pair `i`:
//! - [`RopeLayout::Interleaved`]: `(x[2i], x[2i+1])` — GGML's "normal" mode, used by llama-arch
//!   GGUF files (their Q/K weights are stored permuted for it);
//! - [`RopeLayout::HalfSplit`]: `(x[i], x[i + d/2])` — GGML's "NEOX" mode, used by qwen2.
//!
//! A model trained on a shorter context may stretch its positions ([`RopeScaling`], from GGUF
//! `{arch}.rope.scaling.*`): linear position interpolation, or YaRN as llama.cpp computes it.
//! Scaling only changes the angle table; the rotation is the same.
//!
//! Angles, cosines and sines are computed in f64 and rounded to f32 once ([`RopeAngles`]); the
//! rotation itself is f32: `a·cos − b·sin` and `a·sin + b·cos`, each product rounded, then the
//! sum (no fused multiply-add).

use std::f64::consts::PI;

use crate::error::{KernelError, Result};

/// Which elements of a head form a rotation pair (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Pairs `(2i, 2i+1)`: GGML normal mode (llama family).
    Interleaved,
    /// Pairs `(i, i + d/2)`: GGML NEOX mode (qwen2).
    HalfSplit,
}

/// How RoPE angles are stretched beyond the context a model was trained on.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum RopeScaling {
    /// No scaling: the angle of pair `i` at `pos` is `pos · base^(-2i/d)`.
    #[default]
    None,
    /// Linear position interpolation: every angle divided by `factor` (> 0).
    Linear {
        /// The stretch (e.g. 4 for a 4× longer context).
        factor: f32,
    },
    /// YaRN (Peng et al. 2023) in llama.cpp's form: with `θ` the unscaled angle, pair `i`
    /// takes `θ/factor · (1 − r_i) + θ · r_i`, where the ramp `r_i = 1 − clamp((i − lo) /
    /// max(0.001, hi − lo), 0, 1)` keeps fast-rotating pairs (`i ≤ lo`) unscaled and
    /// interpolates slow ones (`i ≥ hi`); `lo = floor(c(beta_fast))`, `hi = ceil(c(beta_slow))`
    /// clamped to `[0, d − 1]`, `c(β) = d · ln(original_context / (2π β)) / (2 ln base)`. Cosines
    /// and sines are multiplied by `attn_factor · (1 + 0.1 ln factor)`.
    Yarn {
        /// The stretch (≥ 1).
        factor: f32,
        /// The context the model was trained on.
        original_context: usize,
        /// Rotations over the original context above which a pair is not interpolated (32).
        beta_fast: f32,
        /// Rotations below which a pair is fully interpolated (1).
        beta_slow: f32,
        /// Extra magnitude scale of the cosines and sines (1).
        attn_factor: f32,
    },
}

impl RopeScaling {
    /// Checks the parameters: finite, `factor > 0` (≥ 1 for YaRN), `original_context ≥ 1`,
    /// `beta_fast > beta_slow > 0`, `attn_factor > 0`.
    ///
    /// # Errors
    /// [`KernelError::InvalidParameter`] naming the bad value.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| {
            Err(KernelError::InvalidParameter {
                what: "rope scaling",
                reason,
            })
        };
        match *self {
            RopeScaling::None => Ok(()),
            RopeScaling::Linear { factor } => {
                if !(factor.is_finite() && factor > 0.0) {
                    return bad(format!("linear factor {factor} must be finite and > 0"));
                }
                Ok(())
            }
            RopeScaling::Yarn {
                factor,
                original_context,
                beta_fast,
                beta_slow,
                attn_factor,
            } => {
                if !(factor.is_finite() && factor >= 1.0) {
                    return bad(format!("YaRN factor {factor} must be finite and >= 1"));
                }
                if original_context == 0 {
                    return bad("YaRN needs the original context length (>= 1)".into());
                }
                if !(beta_slow > 0.0 && beta_fast > beta_slow && beta_fast.is_finite()) {
                    return bad(format!(
                        "YaRN betas fast {beta_fast} and slow {beta_slow}: need fast > slow > 0"
                    ));
                }
                if !(attn_factor.is_finite() && attn_factor > 0.0) {
                    return bad(format!(
                        "YaRN attn_factor {attn_factor} must be finite and > 0"
                    ));
                }
                Ok(())
            }
        }
    }
}

/// Cosines and sines for a batch of tokens: `[n_tokens × head_dim/2]` each, computed once per
/// forward pass and shared by every head and layer.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeAngles {
    head_dim: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeAngles {
    /// Angles for tokens at `positions` (one per token), heads of `head_dim` elements and
    /// frequency base `theta_base` (e.g. 10000, or 1000000 for Qwen2.5).
    ///
    /// # Errors
    /// [`KernelError::InvalidParameter`] when `head_dim` is zero or odd, or `theta_base` is not
    /// finite and > 0.
    pub fn new(positions: &[usize], head_dim: usize, theta_base: f32) -> Result<Self> {
        Self::scaled(positions, head_dim, theta_base, &RopeScaling::None)
    }

    /// [`RopeAngles::new`] with the angles stretched by `scaling`.
    ///
    /// # Errors
    /// As [`RopeAngles::new`], and [`RopeScaling::validate`]'s.
    pub fn scaled(
        positions: &[usize],
        head_dim: usize,
        theta_base: f32,
        scaling: &RopeScaling,
    ) -> Result<Self> {
        scaling.validate()?;
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(KernelError::InvalidParameter {
                what: "rope head_dim",
                reason: format!("{head_dim} must be even and non-zero"),
            });
        }
        if !(theta_base > 0.0 && theta_base.is_finite()) {
            return Err(KernelError::InvalidParameter {
                what: "rope theta_base",
                reason: format!("{theta_base} must be finite and > 0"),
            });
        }
        let half = head_dim / 2;
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| f64::from(theta_base).powf(-((2 * i) as f64) / head_dim as f64))
            .collect();
        // pair i's angle from its unscaled angle θ, and the magnitude of its cosine and sine
        let (angle_of, magnitude): (Box<dyn Fn(f64, usize) -> f64>, f64) = match *scaling {
            RopeScaling::None => (Box::new(|theta, _| theta), 1.0),
            RopeScaling::Linear { factor } => {
                let factor = f64::from(factor);
                (Box::new(move |theta, _| theta / factor), 1.0)
            }
            RopeScaling::Yarn {
                factor,
                original_context,
                beta_fast,
                beta_slow,
                attn_factor,
            } => {
                let (factor, d) = (f64::from(factor), head_dim as f64);
                let corr = |beta: f32| {
                    let rotations = original_context as f64 / (2.0 * PI * f64::from(beta));
                    d * rotations.ln() / (2.0 * f64::from(theta_base).ln())
                };
                let lo = corr(beta_fast).floor().max(0.0);
                let hi = corr(beta_slow).ceil().min(d - 1.0);
                let ramp: Vec<f64> = (0..half)
                    .map(|i| 1.0 - ((i as f64 - lo) / (hi - lo).max(0.001)).clamp(0.0, 1.0))
                    .collect();
                let magnitude = f64::from(attn_factor) * (1.0 + 0.1 * factor.ln());
                let angle =
                    move |theta: f64, i: usize| theta / factor * (1.0 - ramp[i]) + theta * ramp[i];
                (Box::new(angle), magnitude)
            }
        };
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &pos in positions {
            for (i, &f) in inv_freq.iter().enumerate() {
                let angle = angle_of(pos as f64 * f, i);
                cos.push((angle.cos() * magnitude) as f32);
                sin.push((angle.sin() * magnitude) as f32);
            }
        }
        Ok(Self { head_dim, cos, sin })
    }

    /// Number of tokens.
    pub fn n_tokens(&self) -> usize {
        self.cos.len() / (self.head_dim / 2)
    }

    /// The head size these angles were made for.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The cosines, `[n_tokens × head_dim/2]` row-major (the table `rope_cuda` takes).
    pub fn cos(&self) -> &[f32] {
        &self.cos
    }

    /// The sines, `[n_tokens × head_dim/2]` row-major (the table `rope_cuda` takes).
    pub fn sin(&self) -> &[f32] {
        &self.sin
    }
}

/// Rotates `x` (`[n_tokens × n_heads × head_dim]`, row-major) in place with `angles`
/// (token `t` uses row `t` of the angles).
///
/// # Errors
/// [`KernelError::ShapeMismatch`] when `x.len() != angles.n_tokens() * n_heads * head_dim`.
pub fn apply_rope(
    x: &mut [f32],
    n_heads: usize,
    angles: &RopeAngles,
    layout: RopeLayout,
) -> Result<()> {
    let d = angles.head_dim;
    let half = d / 2;
    let expected = angles.n_tokens() * n_heads * d;
    if x.len() != expected {
        return Err(KernelError::ShapeMismatch {
            what: format!("rope input [n_tokens x {n_heads} heads x {d}]"),
            expected,
            actual: x.len(),
        });
    }
    if n_heads == 0 {
        return Ok(());
    }
    for (t, xt) in x.chunks_exact_mut(n_heads * d).enumerate() {
        let cos = &angles.cos[t * half..(t + 1) * half];
        let sin = &angles.sin[t * half..(t + 1) * half];
        for head in xt.chunks_exact_mut(d) {
            for i in 0..half {
                let (ia, ib) = match layout {
                    RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                    RopeLayout::HalfSplit => (i, i + half),
                };
                let (a, b) = (head[ia], head[ib]);
                head[ia] = a * cos[i] - b * sin[i];
                head[ib] = a * sin[i] + b * cos[i];
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_scaling_divides_positions_and_yarn_keeps_fast_pairs() {
        let d = 64;
        let plain = RopeAngles::new(&[0, 1, 2, 3, 1000], d, 10_000.0).unwrap();
        let linear = RopeAngles::scaled(
            &[0, 2, 4, 6, 2000],
            d,
            10_000.0,
            &RopeScaling::Linear { factor: 2.0 },
        )
        .unwrap();
        assert_eq!(
            plain, linear,
            "position 2p at factor 2 is position p unscaled"
        );
        let yarn = RopeScaling::Yarn {
            factor: 4.0,
            original_context: 512,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attn_factor: 1.0,
        };
        let pos = [1000];
        let y = RopeAngles::scaled(&pos, d, 10_000.0, &yarn).unwrap();
        let p = RopeAngles::new(&pos, d, 10_000.0).unwrap();
        let l =
            RopeAngles::scaled(&pos, d, 10_000.0, &RopeScaling::Linear { factor: 4.0 }).unwrap();
        let m = 1.0 + 0.1 * 4f64.ln();
        // pair 0 rotates fastest: unscaled (times the magnitude); the last pair slowest:
        // interpolated like linear scaling
        let last = d / 2 - 1;
        for (i, reference) in [(0, &p), (last, &l)] {
            let want = (f64::from(reference.cos()[i]) * m) as f32;
            let got = y.cos()[i];
            assert!((got - want).abs() < 1e-6, "pair {i}: {got} vs {want}");
        }
        let yarn_with = |factor: f32, original_context: usize| RopeScaling::Yarn {
            factor,
            original_context,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attn_factor: 1.0,
        };
        for bad in [
            RopeScaling::Linear { factor: 0.0 },
            RopeScaling::Linear { factor: f32::NAN },
            yarn_with(0.5, 512),
            yarn_with(4.0, 0),
        ] {
            assert!(
                RopeAngles::scaled(&pos, d, 10_000.0, &bad).is_err(),
                "{bad:?}"
            );
        }
    }

    fn sample(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((((i as u32).wrapping_mul(2_654_435_761u32)) ^ seed) % 1000) as f32 / 500.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn position_zero_is_identity_and_pairs_rotate_by_the_angle() {
        let angles = RopeAngles::new(&[0, 3], 4, 100.0).unwrap();
        let x0 = [1.0, 2.0, 3.0, 4.0];
        for layout in [RopeLayout::Interleaved, RopeLayout::HalfSplit] {
            let mut x = [x0, x0].concat();
            apply_rope(&mut x, 1, &angles, layout).unwrap();
            assert_eq!(x[..4], x0);
            // token 1, position 3: pair 0 angle 3, pair 1 angle 3 / 100^(2/4) = 0.3
            let (c0, s0, c1, s1) = (
                3f64.cos() as f32,
                3f64.sin() as f32,
                0.3f64.cos() as f32,
                0.3f64.sin() as f32,
            );
            let want = match layout {
                // pairs (1,2) and (3,4)
                RopeLayout::Interleaved => [
                    1.0 * c0 - 2.0 * s0,
                    1.0 * s0 + 2.0 * c0,
                    3.0 * c1 - 4.0 * s1,
                    3.0 * s1 + 4.0 * c1,
                ],
                // pairs (1,3) and (2,4)
                RopeLayout::HalfSplit => [
                    1.0 * c0 - 3.0 * s0,
                    2.0 * c1 - 4.0 * s1,
                    1.0 * s0 + 3.0 * c0,
                    2.0 * s1 + 4.0 * c1,
                ],
            };
            assert_eq!(x[4..], want, "{layout:?}");
        }
    }

    #[test]
    fn half_split_is_interleaved_under_the_pair_permutation() {
        let (d, heads) = (8, 3);
        let positions = [5, 17];
        let angles = RopeAngles::new(&positions, d, 10000.0).unwrap();
        let x = sample(positions.len() * heads * d, 7);
        // interleaved index 2i <-> split index i, 2i+1 <-> i + d/2
        let perm = |v: &[f32]| -> Vec<f32> {
            v.chunks_exact(d)
                .flat_map(|h| {
                    (0..d).map(move |j| {
                        if j % 2 == 0 {
                            h[j / 2]
                        } else {
                            h[j / 2 + d / 2]
                        }
                    })
                })
                .collect()
        };
        let mut split = x.clone();
        apply_rope(&mut split, heads, &angles, RopeLayout::HalfSplit).unwrap();
        let mut inter = perm(&x);
        apply_rope(&mut inter, heads, &angles, RopeLayout::Interleaved).unwrap();
        assert_eq!(perm(&split), inter);
    }

    #[test]
    fn scores_depend_only_on_relative_position() {
        let d = 16;
        let q = sample(d, 1);
        let k = sample(d, 2);
        let score = |pq: usize, pk: usize| {
            let a = RopeAngles::new(&[pq], d, 10000.0).unwrap();
            let b = RopeAngles::new(&[pk], d, 10000.0).unwrap();
            let (mut qq, mut kk) = (q.clone(), k.clone());
            apply_rope(&mut qq, 1, &a, RopeLayout::HalfSplit).unwrap();
            apply_rope(&mut kk, 1, &b, RopeLayout::HalfSplit).unwrap();
            qq.iter().zip(&kk).map(|(a, b)| a * b).sum::<f32>()
        };
        assert!((score(10, 3) - score(107, 100)).abs() < 1e-4);
        assert!((score(10, 3) - score(10, 4)).abs() > 1e-4);
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert!(RopeAngles::new(&[0], 7, 10000.0).is_err());
        assert!(RopeAngles::new(&[0], 0, 10000.0).is_err());
        assert!(RopeAngles::new(&[0], 8, 0.0).is_err());
        let angles = RopeAngles::new(&[0, 1], 8, 10000.0).unwrap();
        assert!(apply_rope(&mut [0.0; 15], 1, &angles, RopeLayout::Interleaved).is_err());
    }
}
