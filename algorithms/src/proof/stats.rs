//! Goodness-of-fit for sampled runs: the G-test, with its sample size, significance level and the
//! smallest total-variation distance it detects.
//!
//! Exact enumeration proves the algorithm; sampled runs check an implementation (the production
//! generator, a GPU kernel) against the enumerated distribution. [`g_test`] compares observed
//! counts with expected probabilities: `G = 2 Σ O ln(O / E)`, `E = n · p`, referred to a
//! chi-square with `bins − 1` degrees of freedom. Outcomes with `E < 5` are pooled into one bin
//! (merged into the smallest other bin if still below 5) so the chi-square approximation holds;
//! an observed outcome of expected probability 0 rejects outright (p-value 0).
//!
//! **Detectable distance.** A sampling distribution at total-variation distance `d` from the
//! expected one gives `G` a non-centrality `λ ≥ 4 n d²` (Pinsker, or Cauchy–Schwarz on the
//! chi-square divergence). [`detectable_tv`] is the smallest `d` whose `λ = 4 n d²` reaches the
//! critical value with the requested power, using the normal approximation of the non-central
//! chi-square (mean `k + λ`, variance `2(k + 2λ)`). Pooling only lowers the detectable distance
//! bound's validity for deviations hidden inside the pooled bin; state it with the result.

use super::distribution::Distribution;
use specdec_kernels::sampling::Prob;
use std::collections::BTreeMap;

/// The outcome of a G-test.
#[derive(Debug, Clone, PartialEq)]
pub struct GTest {
    /// Number of samples `n`.
    pub samples: u64,
    /// Significance level α (reject when `p_value < alpha`).
    pub alpha: f64,
    /// Degrees of freedom (bins after pooling − 1).
    pub dof: usize,
    /// The G statistic (`+∞` when an impossible outcome was observed).
    pub statistic: f64,
    /// The chi-square critical value at `alpha`.
    pub critical: f64,
    /// Probability of a statistic at least this large under the expected distribution.
    pub p_value: f64,
    /// Smallest total-variation distance detected with power 0.9 at this `n`, `alpha` and `dof`.
    pub detectable_tv: f64,
}

impl GTest {
    /// True iff the sample is consistent with the expected distribution at level `alpha`.
    pub fn passed(&self) -> bool {
        self.p_value >= self.alpha
    }
}

impl std::fmt::Display for GTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "G-test: n = {}, dof = {}, G = {:.3}, critical = {:.3} (alpha = {}), p = {:.4}, \
             detects TV >= {:.4} with power 0.9: {}",
            self.samples,
            self.dof,
            self.statistic,
            self.critical,
            self.alpha,
            self.p_value,
            self.detectable_tv,
            if self.passed() { "pass" } else { "REJECT" }
        )
    }
}

/// G-test of `observed` counts against `expected` probabilities (same length; see module docs).
/// `expected` should sum to 1.
pub fn g_test(observed: &[u64], expected: &[f64], alpha: f64) -> GTest {
    let n: u64 = observed.iter().sum();
    let nf = n as f64;
    let impossible = observed
        .iter()
        .zip(expected)
        .any(|(&o, &p)| o > 0 && p <= 0.0);
    // Pool bins with expected count below 5.
    let mut bins: Vec<(u64, f64)> = Vec::new();
    let mut pooled = (0u64, 0.0f64);
    for (&o, &p) in observed.iter().zip(expected) {
        if p <= 0.0 {
            continue;
        }
        if nf * p < 5.0 {
            pooled = (pooled.0 + o, pooled.1 + p);
        } else {
            bins.push((o, p));
        }
    }
    if pooled.1 > 0.0 {
        if nf * pooled.1 < 5.0 && !bins.is_empty() {
            let smallest = (0..bins.len())
                .min_by(|&a, &b| bins[a].1.total_cmp(&bins[b].1))
                .unwrap_or(0);
            bins[smallest] = (bins[smallest].0 + pooled.0, bins[smallest].1 + pooled.1);
        } else {
            bins.push(pooled);
        }
    }
    let dof = bins.len().saturating_sub(1);
    let statistic = if impossible {
        f64::INFINITY
    } else {
        2.0 * bins
            .iter()
            .filter(|(o, _)| *o > 0)
            .map(|&(o, p)| o as f64 * (o as f64 / (nf * p)).ln())
            .sum::<f64>()
    };
    let p_value = if impossible {
        0.0
    } else {
        chi_square_survival(statistic.max(0.0), dof)
    };
    GTest {
        samples: n,
        alpha,
        dof,
        statistic,
        critical: chi_square_critical(alpha, dof),
        p_value,
        detectable_tv: detectable_tv(n, dof, alpha, 0.9),
    }
}

/// G-test of sampled outcomes against an exact distribution (any outcome type).
pub fn g_test_samples<S: Ord + Clone, N: Prob>(
    samples: &[S],
    expected: &Distribution<S, N>,
    alpha: f64,
) -> GTest {
    let mut counts: BTreeMap<S, u64> = expected.iter().map(|(s, _)| (s.clone(), 0)).collect();
    for s in samples {
        *counts.entry(s.clone()).or_insert(0) += 1;
    }
    let observed: Vec<u64> = counts.values().copied().collect();
    let probs: Vec<f64> = counts.keys().map(|s| expected.prob(s).to_f64()).collect();
    g_test(&observed, &probs, alpha)
}

/// Smallest total-variation distance detected with probability `power` by a G-test with
/// `samples` samples, `dof` degrees of freedom and level `alpha` (see the module docs).
pub fn detectable_tv(samples: u64, dof: usize, alpha: f64, power: f64) -> f64 {
    if samples == 0 || dof == 0 {
        return 1.0;
    }
    let k = dof as f64;
    let critical = chi_square_critical(alpha, dof);
    let z = normal_quantile(power);
    let enough = |lambda: f64| (k + lambda - critical) / (2.0 * (k + 2.0 * lambda)).sqrt() >= z;
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while !enough(hi) {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if enough(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    (hi / (4.0 * samples as f64)).sqrt().min(1.0)
}

/// `P(X >= x)` for `X` chi-square with `dof` degrees of freedom (1 for `dof = 0`).
pub fn chi_square_survival(x: f64, dof: usize) -> f64 {
    if dof == 0 {
        return if x > 0.0 { 0.0 } else { 1.0 };
    }
    upper_regularized_gamma(dof as f64 / 2.0, x / 2.0)
}

/// The `x` with `chi_square_survival(x, dof) = alpha` (bisection).
pub fn chi_square_critical(alpha: f64, dof: usize) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while chi_square_survival(hi, dof) > alpha && hi < 1e7 {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if chi_square_survival(mid, dof) > alpha {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// The standard normal quantile (bisection on the CDF).
fn normal_quantile(p: f64) -> f64 {
    let cdf = |x: f64| {
        if x >= 0.0 {
            1.0 - 0.5 * upper_regularized_gamma(0.5, x * x / 2.0)
        } else {
            0.5 * upper_regularized_gamma(0.5, x * x / 2.0)
        }
    };
    let (mut lo, mut hi) = (-40.0f64, 40.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if cdf(mid) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// `ln Γ(x)` for `x > 0` (Lanczos, g = 7, 9 terms).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let series = C[1..]
        .iter()
        .enumerate()
        .fold(C[0], |acc, (i, c)| acc + c / (x + i as f64 + 1.0));
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + series.ln()
}

/// `Q(a, x) = Γ(a, x) / Γ(a)`: series below `x < a + 1`, continued fraction above.
fn upper_regularized_gamma(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let log_prefix = a * x.ln() - x - ln_gamma(a);
    if x < a + 1.0 {
        let (mut term, mut sum, mut n) = (1.0 / a, 1.0 / a, a);
        for _ in 0..1000 {
            n += 1.0;
            term *= x / n;
            sum += term;
            if term.abs() < sum.abs() * 1e-16 {
                break;
            }
        }
        (1.0 - sum * log_prefix.exp()).clamp(0.0, 1.0)
    } else {
        // Modified Lentz for the continued fraction of Γ(a, x).
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..1000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        (log_prefix.exp() * h).clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chi_square_tails_match_known_values() {
        // dof 1: P(X >= 3.841) = 0.05; dof 10: P(X >= 18.307) = 0.05; dof 2: exp(-x/2).
        assert!((chi_square_survival(3.841_458_8, 1) - 0.05).abs() < 1e-6);
        assert!((chi_square_survival(18.307_038, 10) - 0.05).abs() < 1e-6);
        assert!((chi_square_survival(4.0, 2) - (-2.0f64).exp()).abs() < 1e-12);
        assert!((chi_square_critical(0.001, 3) - 16.266_236).abs() < 1e-4);
        assert!((normal_quantile(0.9) - 1.281_551_6).abs() < 1e-6);
    }

    #[test]
    fn g_test_accepts_a_fair_sample_and_rejects_a_biased_one() {
        let expected = [0.25, 0.25, 0.5];
        let fair = g_test(&[2510, 2470, 5020], &expected, 0.01);
        assert!(fair.passed(), "{fair}");
        let biased = g_test(&[2800, 2200, 5000], &expected, 0.01);
        assert!(!biased.passed(), "{biased}");
        let impossible = g_test(&[1, 5, 5], &[0.0, 0.5, 0.5], 0.01);
        assert_eq!(impossible.p_value, 0.0);
        // The detectable distance shrinks like 1 / sqrt(n).
        let a = detectable_tv(10_000, 5, 0.01, 0.9);
        let b = detectable_tv(40_000, 5, 0.01, 0.9);
        assert!((a / b - 2.0).abs() < 1e-6 && a < 0.05, "{a} {b}");
    }
}
