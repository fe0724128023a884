//! The cost model: what drafting, a target pass, verification and commit cost.

use serde::{Deserialize, Serialize};

use crate::error::{HarnessError, Result};

/// Milliseconds of one target forward pass over `n` new tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum CostCurve {
    /// `base_ms + per_token_ms · (n − 1)`: one token costs `base_ms`.
    Affine {
        /// Cost of a pass over one token, ms (> 0).
        base_ms: f64,
        /// Extra cost per additional token, ms (≥ 0).
        per_token_ms: f64,
    },
    /// Measured points, linearly interpolated; beyond the last point the last segment's slope
    /// continues (flat for a single point); below the first, the first point's cost.
    Points {
        /// Token counts, strictly increasing, the first ≥ 1.
        tokens: Vec<usize>,
        /// Cost at each token count, ms (> 0).
        ms: Vec<f64>,
    },
}

impl CostCurve {
    /// Checks the curve is well formed (see the variants).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(HarnessError::Simulation(m));
        match self {
            CostCurve::Affine {
                base_ms,
                per_token_ms,
            } => {
                if !(base_ms.is_finite() && *base_ms > 0.0) {
                    return bad(format!("cost.target.base_ms {base_ms} must be > 0"));
                }
                if !(per_token_ms.is_finite() && *per_token_ms >= 0.0) {
                    return bad(format!(
                        "cost.target.per_token_ms {per_token_ms} must be ≥ 0"
                    ));
                }
            }
            CostCurve::Points { tokens, ms } => {
                if tokens.is_empty() || tokens.len() != ms.len() {
                    return bad(format!(
                        "cost.target needs as many ms as tokens (got {} and {}), at least one",
                        tokens.len(),
                        ms.len()
                    ));
                }
                if tokens[0] == 0 || tokens.windows(2).any(|w| w[0] >= w[1]) {
                    return bad("cost.target.tokens must be ≥ 1 and strictly increasing".into());
                }
                if let Some(m) = ms.iter().find(|m| !(m.is_finite() && **m > 0.0)) {
                    return bad(format!("cost.target.ms holds {m}; every cost must be > 0"));
                }
            }
        }
        Ok(())
    }

    /// Cost of a pass over `n` tokens in ms (`n = 0` is treated as 1).
    pub fn ms(&self, n: usize) -> f64 {
        let n = n.max(1);
        match self {
            CostCurve::Affine {
                base_ms,
                per_token_ms,
            } => base_ms + per_token_ms * (n - 1) as f64,
            CostCurve::Points { tokens, ms } => {
                if n <= tokens[0] {
                    return ms[0];
                }
                let i = tokens.partition_point(|&t| t < n);
                let (j0, j1) = if i < tokens.len() {
                    (i - 1, i)
                } else if tokens.len() >= 2 {
                    (tokens.len() - 2, tokens.len() - 1)
                } else {
                    return ms[0];
                };
                let (x0, x1) = (tokens[j0] as f64, tokens[j1] as f64);
                ms[j0] + (ms[j1] - ms[j0]) * (n as f64 - x0) / (x1 - x0)
            }
        }
    }
}

/// A link between a remote draft device and the target device. Per speculative step it costs a
/// round trip: `2 · latency + (k · bytes_per_draft_token + bytes_per_step) / bandwidth`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkModel {
    /// One-way latency, microseconds (≥ 0).
    pub latency_us: f64,
    /// Bandwidth, GB/s (10⁹ bytes per second, > 0).
    pub bandwidth_gb_per_s: f64,
    /// Bytes sent back per draft token: 4 for a token id (greedy), 4 + 4·vocab with the draft
    /// distribution q (lossless sampling at temperature > 0).
    #[serde(default = "four")]
    pub bytes_per_draft_token: f64,
    /// Bytes sent to the drafter per step (the accepted tokens), default 64.
    #[serde(default = "sixty_four")]
    pub bytes_per_step: f64,
}

fn four() -> f64 {
    4.0
}
fn sixty_four() -> f64 {
    64.0
}

impl LinkModel {
    /// Milliseconds of one step's round trip with `k` drafts.
    pub fn ms(&self, k: usize) -> f64 {
        let bytes = k as f64 * self.bytes_per_draft_token + self.bytes_per_step;
        2.0 * self.latency_us / 1e3 + bytes / (self.bandwidth_gb_per_s * 1e9) * 1e3
    }
}

/// Costs of everything in a step. Speculative steps with K drafts cost
/// `K · draft_ms_per_token + link(K)` (drafting, reported as draft time) + `target(K + 1)` +
/// `verify_ms` + `commit_ms` + `overhead_ms`; plain-decoding steps cost `target(1) + overhead_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostModel {
    /// One draft forward over one token, ms (≥ 0).
    pub draft_ms_per_token: f64,
    /// Target pass cost curve.
    pub target: CostCurve,
    /// Verification per speculative step, ms.
    #[serde(default)]
    pub verify_ms: f64,
    /// KV commit/rewind per speculative step, ms.
    #[serde(default)]
    pub commit_ms: f64,
    /// Other work per step, ms.
    #[serde(default)]
    pub overhead_ms: f64,
    /// A link to a remote draft device, when the draft is not co-located.
    #[serde(default)]
    pub link: Option<LinkModel>,
}

/// The cost of one step, split by phase, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    /// Drafting (including the link).
    pub draft_s: f64,
    /// Target pass.
    pub target_s: f64,
    /// Verification.
    pub verify_s: f64,
    /// Commit.
    pub commit_s: f64,
    /// Overhead.
    pub overhead_s: f64,
}

impl StepCost {
    /// Total seconds.
    pub fn total_s(&self) -> f64 {
        self.draft_s + self.target_s + self.verify_s + self.commit_s + self.overhead_s
    }
}

impl CostModel {
    /// Checks every cost is finite and ≥ 0 and the curve is well formed.
    pub fn validate(&self) -> Result<()> {
        self.target.validate()?;
        for (name, v) in [
            ("draft_ms_per_token", self.draft_ms_per_token),
            ("verify_ms", self.verify_ms),
            ("commit_ms", self.commit_ms),
            ("overhead_ms", self.overhead_ms),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(HarnessError::Simulation(format!(
                    "cost.{name} {v} must be a finite number ≥ 0"
                )));
            }
        }
        if let Some(l) = &self.link {
            if !(l.latency_us.is_finite() && l.latency_us >= 0.0) {
                return Err(HarnessError::Simulation(format!(
                    "cost.link.latency_us {} must be ≥ 0",
                    l.latency_us
                )));
            }
            if !(l.bandwidth_gb_per_s.is_finite() && l.bandwidth_gb_per_s > 0.0) {
                return Err(HarnessError::Simulation(format!(
                    "cost.link.bandwidth_gb_per_s {} must be > 0",
                    l.bandwidth_gb_per_s
                )));
            }
            if !(l.bytes_per_draft_token >= 0.0 && l.bytes_per_step >= 0.0) {
                return Err(HarnessError::Simulation(
                    "cost.link byte counts must be ≥ 0".into(),
                ));
            }
        }
        Ok(())
    }

    /// The same costs in the units of `specdec_algorithms`' cost-model policy (relative to one
    /// plain step), exact for chains of 1..=`k_max` drafts: the verify curve holds the whole
    /// non-drafting cost of a step with n − 1 drafts (target pass, verify, commit, overhead, the
    /// link's latency and per-step bytes), the draft cost per pass is the draft cost per token,
    /// and the link's per-draft bytes are the cost per drafted token.
    pub fn policy_costs(&self, k_max: usize) -> Result<specdec_algorithms::policy::CostModel> {
        use specdec_algorithms::policy::{CostCurve as PolicyCurve, CostModel as PolicyCosts};
        let plain_ms = self.step(0).total_s() * 1e3;
        let link_fixed_ms = self.link.as_ref().map_or(0.0, |l| l.ms(0));
        let link_per_draft_ms = self.link.as_ref().map_or(0.0, |l| l.ms(1) - l.ms(0));
        let mut points = vec![(1, plain_ms)];
        for n in 2..=k_max.max(1) + 1 {
            points.push((
                n,
                self.target.ms(n)
                    + self.verify_ms
                    + self.commit_ms
                    + self.overhead_ms
                    + link_fixed_ms,
            ));
        }
        let curve = PolicyCurve::from_measurements(&points)?;
        Ok(PolicyCosts::new(
            curve,
            self.draft_ms_per_token / plain_ms,
            link_per_draft_ms / plain_ms,
        )?)
    }

    /// The cost of a step with `k` drafts (`k = 0`: plain decoding).
    pub fn step(&self, k: usize) -> StepCost {
        if k == 0 {
            return StepCost {
                draft_s: 0.0,
                target_s: self.target.ms(1) / 1e3,
                verify_s: 0.0,
                commit_s: 0.0,
                overhead_s: self.overhead_ms / 1e3,
            };
        }
        let link = self.link.as_ref().map_or(0.0, |l| l.ms(k));
        StepCost {
            draft_s: (k as f64 * self.draft_ms_per_token + link) / 1e3,
            target_s: self.target.ms(k + 1) / 1e3,
            verify_s: self.verify_ms / 1e3,
            commit_s: self.commit_ms / 1e3,
            overhead_s: self.overhead_ms / 1e3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_interpolate_and_extrapolate() {
        let c = CostCurve::Points {
            tokens: vec![1, 3, 5],
            ms: vec![10.0, 14.0, 15.0],
        };
        c.validate().unwrap();
        assert_eq!(c.ms(0), 10.0);
        assert_eq!(c.ms(1), 10.0);
        assert_eq!(c.ms(2), 12.0);
        assert_eq!(c.ms(3), 14.0);
        assert_eq!(c.ms(4), 14.5);
        assert_eq!(c.ms(7), 16.0);
        let single = CostCurve::Points {
            tokens: vec![2],
            ms: vec![5.0],
        };
        assert_eq!(single.ms(9), 5.0);
    }

    #[test]
    fn bad_curves_are_refused() {
        let c = CostCurve::Points {
            tokens: vec![1, 1],
            ms: vec![1.0, 2.0],
        };
        assert!(c.validate().unwrap_err().to_string().contains("increasing"));
        let c = CostCurve::Affine {
            base_ms: 0.0,
            per_token_ms: 1.0,
        };
        assert!(c.validate().unwrap_err().to_string().contains("base_ms"));
    }

    #[test]
    fn policy_costs_agree_with_step_costs() {
        let m = CostModel {
            draft_ms_per_token: 1.5,
            target: CostCurve::Points {
                tokens: vec![1, 4, 16],
                ms: vec![10.0, 13.0, 20.0],
            },
            verify_ms: 0.2,
            commit_ms: 0.1,
            overhead_ms: 0.3,
            link: Some(LinkModel {
                latency_us: 40.0,
                bandwidth_gb_per_s: 2.0,
                bytes_per_draft_token: 1e5,
                bytes_per_step: 64.0,
            }),
        };
        let p = m.policy_costs(12).unwrap();
        let plain = m.step(0).total_s();
        for k in 1..=12 {
            let rel = m.step(k).total_s() / plain;
            assert!(
                (p.chain_cost(k) - rel).abs() < 1e-9,
                "k {k}: {} vs {rel}",
                p.chain_cost(k)
            );
        }
    }

    #[test]
    fn step_costs_add_up() {
        let m = CostModel {
            draft_ms_per_token: 2.0,
            target: CostCurve::Affine {
                base_ms: 10.0,
                per_token_ms: 1.0,
            },
            verify_ms: 0.5,
            commit_ms: 0.25,
            overhead_ms: 1.0,
            link: Some(LinkModel {
                latency_us: 500.0,
                bandwidth_gb_per_s: 1.0,
                bytes_per_draft_token: 1e6,
                bytes_per_step: 0.0,
            }),
        };
        m.validate().unwrap();
        let plain = m.step(0);
        assert!((plain.total_s() - 0.011).abs() < 1e-12);
        let s = m.step(4);
        // draft 4·2 = 8 ms, link 2·0.5 + 4e6 B / 1e9 B/s = 1 + 4 = 5 ms; target 10 + 4 = 14 ms.
        assert!((s.draft_s - 0.013).abs() < 1e-12);
        assert!((s.target_s - 0.014).abs() < 1e-12);
        assert!((s.total_s() - (0.013 + 0.014 + 0.0005 + 0.00025 + 0.001)).abs() < 1e-12);
    }
}
