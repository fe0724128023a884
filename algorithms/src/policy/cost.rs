//! Measured costs and the expected-tokens model the cost-model policy optimises.
//!
//! Units: every cost is relative to **one plain decoding step** (one target forward over one new
//! token), so plain decoding produces 1 token per unit of cost and a speculative step producing
//! `E` tokens on average at cost `c` is worth it iff `E / c > 1`.

use crate::error::{ensure_param, Result};

/// Measured cost of one target forward over `n` new tokens, relative to `n = 1`.
///
/// Built from measured points `(tokens, time)`; costs between points are interpolated linearly,
/// beyond the last point extrapolated with the last segment's slope (flat for a single point).
#[derive(Debug, Clone, PartialEq)]
pub struct CostCurve {
    points: Vec<(usize, f64)>,
}

impl CostCurve {
    /// From measured `(tokens, time)` pairs in any time unit. Tokens must be strictly increasing
    /// and start at 1; times positive and finite. Times are normalised so that `cost(1) = 1`.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] naming the offending point.
    pub fn from_measurements(points: &[(usize, f64)]) -> Result<Self> {
        ensure_param(
            !points.is_empty(),
            "verify_cost",
            "needs at least the point (1, t)",
        )?;
        ensure_param(
            points[0].0 == 1,
            "verify_cost",
            format!("first point must be for 1 token, got {}", points[0].0),
        )?;
        for (i, &(n, t)) in points.iter().enumerate() {
            ensure_param(
                t.is_finite() && t > 0.0,
                "verify_cost",
                format!("time {t} for {n} tokens must be positive and finite"),
            )?;
            if i > 0 {
                ensure_param(
                    n > points[i - 1].0,
                    "verify_cost",
                    format!(
                        "token counts must increase strictly ({} then {n})",
                        points[i - 1].0
                    ),
                )?;
            }
        }
        let base = points[0].1;
        Ok(Self {
            points: points.iter().map(|&(n, t)| (n, t / base)).collect(),
        })
    }

    /// `cost(n) = 1 + slope · (n − 1)`: e.g. slope 0 for a memory-bound GPU, about 1 for a
    /// compute-bound CPU.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] unless `slope ≥ 0` and finite.
    pub fn linear(slope: f64) -> Result<Self> {
        ensure_param(
            slope >= 0.0 && slope.is_finite(),
            "slope",
            format!("must be ≥ 0, got {slope}"),
        )?;
        Self::from_measurements(&[(1, 1.0), (2, 1.0 + slope)])
    }

    /// Cost of a target forward over `tokens` new tokens relative to one token (0 tokens: 0).
    pub fn cost(&self, tokens: usize) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        let idx = self.points.partition_point(|&(n, _)| n <= tokens);
        if idx > 0 && self.points[idx - 1].0 == tokens {
            return self.points[idx - 1].1;
        }
        // Segment to interpolate / extrapolate on.
        let (a, b) = if self.points.len() == 1 {
            return self.points[0].1;
        } else if idx >= self.points.len() {
            (
                self.points[self.points.len() - 2],
                self.points[self.points.len() - 1],
            )
        } else {
            (self.points[idx - 1], self.points[idx])
        };
        let slope = (b.1 - a.1) / (b.0 - a.0) as f64;
        (a.1 + slope * (tokens as f64 - a.0 as f64)).max(f64::MIN_POSITIVE)
    }

    /// The normalised points `(tokens, cost)`.
    pub fn points(&self) -> &[(usize, f64)] {
        &self.points
    }
}

/// Cost of one speculative step: draft cost plus verify cost, in plain-step units.
///
/// `draft_cost = per_pass · draft_passes + per_token · drafts`, where a *draft pass* is one forward
/// of the draft model (a chain of K drafts needs K passes, a tree drafted level by level needs one
/// per depth) and `per_token` covers costs that grow with the number of drafted tokens (tree
/// expansion, n-gram lookup). `verify_cost = verify.cost(drafts + 1)` (the root plus the drafts).
/// A plain step costs exactly 1.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// Target forward cost curve.
    pub verify: CostCurve,
    /// Cost of one draft-model forward pass, relative to one target step (e.g. 0.6 for a 0.5B
    /// draft of a 1.5B target on CPU; 0 for an n-gram drafter).
    pub draft_per_pass: f64,
    /// Cost per drafted token beyond the passes (0 for most drafters).
    pub draft_per_token: f64,
}

impl CostModel {
    /// A model from a verify curve and draft costs.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] if a draft cost is negative or not finite.
    pub fn new(verify: CostCurve, draft_per_pass: f64, draft_per_token: f64) -> Result<Self> {
        for (name, v) in [
            ("draft_per_pass", draft_per_pass),
            ("draft_per_token", draft_per_token),
        ] {
            ensure_param(
                v >= 0.0 && v.is_finite(),
                name,
                format!("must be ≥ 0, got {v}"),
            )?;
        }
        Ok(Self {
            verify,
            draft_per_pass,
            draft_per_token,
        })
    }

    /// Cost of a step with `drafts` draft tokens made in `draft_passes` draft passes.
    pub fn step_cost(&self, drafts: usize, draft_passes: usize) -> f64 {
        if drafts == 0 {
            return 1.0;
        }
        self.verify.cost(drafts + 1) + self.draft_cost(drafts, draft_passes)
    }

    /// The drafting part of [`CostModel::step_cost`]: `drafts` tokens in `draft_passes` passes.
    pub fn draft_cost(&self, drafts: usize, draft_passes: usize) -> f64 {
        self.draft_per_pass * draft_passes as f64 + self.draft_per_token * drafts as f64
    }

    /// Cost of a chain of `k` drafts (`k` passes).
    pub fn chain_cost(&self, k: usize) -> f64 {
        self.step_cost(k, k)
    }
}

/// Expected tokens per target pass of a chain with conditional acceptances `alphas[i]` at draft
/// position `i`: `E = 1 + Σ_{i<K} Π_{j≤i} α_j` (the accepted drafts plus the bonus/corrected
/// token). Exact at α = 1 (gives `K + 1`): no division by `1 − α`.
pub fn expected_tokens(alphas: &[f64]) -> f64 {
    let mut survive = 1.0;
    let mut total = 1.0;
    for &a in alphas {
        survive *= a;
        total += survive;
    }
    total
}

/// [`expected_tokens`] for a constant `alpha` and `k` drafts: `(1 − α^{K+1}) / (1 − α)`, and
/// `K + 1` at `α = 1` (the closed form of Leviathan et al.).
pub fn expected_tokens_constant(alpha: f64, k: usize) -> f64 {
    if (1.0 - alpha).abs() < 1e-12 {
        (k + 1) as f64
    } else {
        (1.0 - alpha.powi(k as i32 + 1)) / (1.0 - alpha)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curve_interpolates_and_extrapolates() {
        let c = CostCurve::from_measurements(&[(1, 2.0), (3, 4.0), (5, 10.0)]).unwrap();
        assert_eq!(c.cost(1), 1.0);
        assert_eq!(c.cost(2), 1.5);
        assert_eq!(c.cost(3), 2.0);
        assert_eq!(c.cost(4), 3.5);
        assert_eq!(c.cost(7), 8.0);
        assert_eq!(c.cost(0), 0.0);
        let flat = CostCurve::from_measurements(&[(1, 3.0)]).unwrap();
        assert_eq!(flat.cost(9), 1.0);
        assert!(CostCurve::from_measurements(&[(2, 1.0)]).is_err());
        assert!(CostCurve::from_measurements(&[(1, 1.0), (1, 2.0)]).is_err());
        assert!(CostCurve::from_measurements(&[(1, 0.0)]).is_err());
        assert!(CostCurve::linear(-1.0).is_err());
        assert_eq!(CostCurve::linear(0.5).unwrap().cost(5), 3.0);
    }

    #[test]
    fn expected_tokens_matches_closed_form() {
        for &alpha in &[0.0, 0.3, 0.8, 0.999_999, 1.0] {
            for k in 0..10 {
                let e = expected_tokens(&vec![alpha; k]);
                let closed = expected_tokens_constant(alpha, k);
                assert!(
                    (e - closed).abs() < 1e-6,
                    "α={alpha} K={k}: {e} vs {closed}"
                );
            }
        }
        assert_eq!(expected_tokens(&[1.0; 4]), 5.0);
        assert_eq!(expected_tokens(&[0.5, 0.5]), 1.75);
    }

    #[test]
    fn step_costs() {
        let m = CostModel::new(CostCurve::linear(1.0).unwrap(), 0.5, 0.1).unwrap();
        assert_eq!(m.step_cost(0, 0), 1.0);
        assert!((m.chain_cost(2) - (3.0 + 1.0 + 0.2)).abs() < 1e-12);
        assert!(CostModel::new(CostCurve::linear(0.0).unwrap(), -0.1, 0.0).is_err());
    }
}
