//! Small statistics: means and percentile-bootstrap intervals over prompts.
//!
//! Every interval a table or plot shows comes from [`bootstrap`]: the prompts are resampled with
//! replacement [`BOOTSTRAP_RESAMPLES`] times from a fixed seed ([`BOOTSTRAP_SEED`], so a
//! re-rendered report gives the same numbers), the statistic is recomputed on each resample,
//! and the interval is the 2.5 % and 97.5 % quantiles of those values. Each resampled mean lies
//! between the smallest and the largest prompt's value, and each resampled ratio of sums
//! between the smallest and the largest prompt's ratio, so an interval never leaves the range
//! the statistic can take (τ ≥ 1, acceptance in [0, 1], speedup > 0), unlike mean ± t·s/√n.
//! With fewer than [`FEW_PROMPTS`] prompts the interval says little (two prompts give
//! roughly their two values); reports print a warning then.

use serde::{Deserialize, Serialize};

use crate::simulation::SplitMix64;

/// Resamples per bootstrap interval.
pub const BOOTSTRAP_RESAMPLES: usize = 2000;

/// Seed of every bootstrap (fixed: the same records give the same interval).
pub const BOOTSTRAP_SEED: u64 = 0x5EED_B007_5EED_B007;

/// Below this many prompts, reports warn that the intervals are not to be trusted.
pub const FEW_PROMPTS: usize = 5;

/// A point estimate with a 95 % interval over `n` prompts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// The point estimate: the statistic on all prompts (for a mean, the sample mean).
    pub mean: f64,
    /// Lower end (= `mean` when n < 2).
    pub lo: f64,
    /// Upper end (= `mean` when n < 2).
    pub hi: f64,
    /// Number of samples (prompts) the statistic is computed over.
    pub n: usize,
}

impl Interval {
    /// Half width of the interval.
    pub fn half_width(&self) -> f64 {
        (self.hi - self.lo) / 2.0
    }
}

/// Arithmetic mean; `None` for an empty slice.
pub fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

/// The median of `samples` (mean of the two middle values for an even count); `None` when empty
/// or when a sample is NaN.
pub fn median(samples: &[f64]) -> Option<f64> {
    if samples.is_empty() || samples.iter().any(|s| s.is_nan()) {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    })
}

/// The `q` quantile (0..=1) of sorted values, linearly interpolated between order statistics
/// (Hyndman–Fan type 7, numpy's default). `sorted` must be non-empty and ascending; `q` is
/// clamped to 0..=1.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    let h = (sorted.len() - 1) as f64 * q.clamp(0.0, 1.0);
    let (i, frac) = (h.floor() as usize, h - h.floor());
    match sorted.get(i + 1) {
        Some(next) => sorted[i] + frac * (next - sorted[i]),
        None => sorted[i],
    }
}

/// Percentile-bootstrap 95 % interval of a statistic of `n` samples (see the module docs).
/// `statistic(indices)` computes it on the samples at `indices` (repeats allowed); it may give
/// `None` for a resample where it is undefined (such resamples are skipped). Returns `None` when
/// `n = 0` or the statistic is undefined or not finite on all samples.
pub fn bootstrap(n: usize, statistic: impl Fn(&[usize]) -> Option<f64>) -> Option<Interval> {
    let all: Vec<usize> = (0..n).collect();
    let point = statistic(&all).filter(|x| x.is_finite())?;
    if n < 2 {
        return Some(Interval {
            mean: point,
            lo: point,
            hi: point,
            n,
        });
    }
    let mut rng = SplitMix64::new(BOOTSTRAP_SEED);
    let mut indices = vec![0; n];
    let mut values = Vec::with_capacity(BOOTSTRAP_RESAMPLES);
    for _ in 0..BOOTSTRAP_RESAMPLES {
        for i in indices.iter_mut() {
            // multiply-shift: an index in 0..n from 64 random bits
            *i = ((u128::from(rng.next_u64()) * n as u128) >> 64) as usize;
        }
        if let Some(v) = statistic(&indices).filter(|v| v.is_finite()) {
            values.push(v);
        }
    }
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(Interval {
        mean: point,
        lo: quantile(&values, 0.025),
        hi: quantile(&values, 0.975),
        n,
    })
}

/// Mean of `xs` with its bootstrap interval; `None` for no samples or a non-finite one.
pub fn mean_interval(xs: &[f64]) -> Option<Interval> {
    if xs.iter().any(|x| !x.is_finite()) {
        return None;
    }
    bootstrap(xs.len(), |idx| {
        Some(idx.iter().map(|&i| xs[i]).sum::<f64>() / idx.len() as f64)
    })
}

/// Ratio of sums Σ num / Σ den over the same samples (pairs), with its bootstrap interval
/// (resampling pairs); resamples with Σ den = 0 are skipped. `None` when the slices differ in
/// length, are empty, hold a non-finite value, or Σ den = 0.
pub fn ratio_interval(num: &[f64], den: &[f64]) -> Option<Interval> {
    if num.len() != den.len() || num.iter().chain(den).any(|x| !x.is_finite()) {
        return None;
    }
    bootstrap(num.len(), |idx| {
        let d: f64 = idx.iter().map(|&i| den[i]).sum();
        (d != 0.0).then(|| idx.iter().map(|&i| num[i]).sum::<f64>() / d)
    })
}

/// Geometric mean of positive `xs` (the mean of ratios on a log scale: a 2× and a 0.5× average
/// to 1×) with its bootstrap interval; `None` for no samples or one ≤ 0 or not finite.
pub fn geometric_mean_interval(xs: &[f64]) -> Option<Interval> {
    if xs.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
        return None;
    }
    let logs: Vec<f64> = xs.iter().map(|x| x.ln()).collect();
    bootstrap(xs.len(), |idx| {
        Some((idx.iter().map(|&i| logs[i]).sum::<f64>() / idx.len() as f64).exp())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_and_invalid() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.5]), Some(7.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::NAN]), None);
    }
    use proptest::prelude::*;

    #[test]
    fn two_values_give_their_range() {
        // Resampled means of [1, 3] are 1, 2 or 3 with probabilities 1/4, 1/2, 1/4: the 2.5 %
        // and 97.5 % quantiles are the two values themselves.
        let i = mean_interval(&[1.0, 3.0]).unwrap();
        assert_eq!((i.mean, i.lo, i.hi, i.n), (2.0, 1.0, 3.0, 2));
    }

    #[test]
    fn bootstrap_matches_the_normal_approximation_on_many_samples() {
        // 0..100: mean 49.5, population sd √((100² − 1)/12) = 28.866, se 2.8866; the bootstrap
        // interval is about 49.5 ± 1.96 · 2.8866 = [43.84, 55.16].
        let xs: Vec<f64> = (0..100).map(f64::from).collect();
        let i = mean_interval(&xs).unwrap();
        assert_eq!(i.mean, 49.5);
        assert!((i.lo - 43.84).abs() < 0.6, "{i:?}");
        assert!((i.hi - 55.16).abs() < 0.6, "{i:?}");
        // the fixed seed: the same numbers every time
        assert_eq!(mean_interval(&xs), Some(i));
    }

    #[test]
    fn edge_cases() {
        assert!(mean_interval(&[]).is_none());
        assert!(mean_interval(&[1.0, f64::NAN]).is_none());
        let one = mean_interval(&[3.0]).unwrap();
        assert_eq!((one.lo, one.mean, one.hi, one.n), (3.0, 3.0, 3.0, 1));
        let same = mean_interval(&[2.0, 2.0, 2.0]).unwrap();
        assert_eq!((same.lo, same.hi), (2.0, 2.0));
        assert!(ratio_interval(&[1.0], &[0.0]).is_none());
        assert!(ratio_interval(&[1.0], &[1.0, 2.0]).is_none());
        assert!(geometric_mean_interval(&[1.0, 0.0]).is_none());
        let g = geometric_mean_interval(&[2.0, 8.0]).unwrap();
        assert!((g.mean - 4.0).abs() < 1e-12);
        assert!(
            (g.lo - 2.0).abs() < 1e-12 && (g.hi - 8.0).abs() < 1e-12,
            "{g:?}"
        );
        let r = ratio_interval(&[1.0, 3.0], &[2.0, 4.0]).unwrap();
        assert!((r.mean - 4.0 / 6.0).abs() < 1e-12);
        assert!(
            (r.lo - 0.5).abs() < 1e-12 && (r.hi - 0.75).abs() < 1e-12,
            "{r:?}"
        );
    }

    #[test]
    fn quantiles_interpolate() {
        let s = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(quantile(&s, 0.0), 1.0);
        assert_eq!(quantile(&s, 0.5), 3.0);
        assert_eq!(quantile(&s, 0.125), 1.5);
        assert_eq!(quantile(&s, 1.0), 5.0);
    }

    proptest! {
        /// An interval never leaves the range of its samples: τ (≥ 1) stays ≥ 1.
        #[test]
        fn mean_interval_stays_within_the_samples(xs in prop::collection::vec(1.0f64..9.0, 1..12)) {
            let i = mean_interval(&xs).unwrap();
            let min = xs.iter().copied().fold(f64::INFINITY, f64::min);
            let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            prop_assert!(i.lo >= min - 1e-12 && i.hi <= max + 1e-12, "{:?} {:?}", i, xs);
            prop_assert!(i.lo <= i.hi);
            prop_assert!(i.lo >= 1.0);
        }

        /// Σ accepted / Σ proposed with accepted ≤ proposed stays in [0, 1].
        #[test]
        fn ratio_interval_of_rates_stays_in_unit_range(
            pairs in prop::collection::vec((0u32..20, 1u32..20), 1..12)
        ) {
            let den: Vec<f64> = pairs.iter().map(|&(_, d)| f64::from(d)).collect();
            let num: Vec<f64> = pairs.iter().map(|&(a, d)| f64::from(a.min(d))).collect();
            let i = ratio_interval(&num, &den).unwrap();
            prop_assert!(i.lo >= 0.0 && i.hi <= 1.0 && i.lo <= i.hi, "{:?}", i);
        }
    }
}
