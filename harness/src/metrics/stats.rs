//! Small statistics: means and Student-t confidence intervals.

use serde::{Deserialize, Serialize};

/// A point estimate with a 95 % confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Sample mean.
    pub mean: f64,
    /// Lower end (= mean when n < 2).
    pub lo: f64,
    /// Upper end (= mean when n < 2).
    pub hi: f64,
    /// Number of samples (prompts).
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

/// The 97.5 % quantile of Student's t with `df` degrees of freedom (two-sided 95 %). Exact table
/// values (3 decimals) for df ≤ 30, a Cornish–Fisher expansion around the normal quantile above
/// (error < 0.001 for df > 30). `df = 0` gives infinity.
pub fn student_t_975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    if df == 0 {
        return f64::INFINITY;
    }
    if df <= 30 {
        return TABLE[df - 1];
    }
    let z: f64 = 1.959_963_984_540_054;
    let n = df as f64;
    let z3 = z.powi(3);
    let z5 = z.powi(5);
    let z7 = z.powi(7);
    z + (z3 + z) / (4.0 * n)
        + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * n * n)
        + (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / (384.0 * n * n * n)
}

/// Mean with a two-sided 95 % Student-t interval: mean ± t(n−1) · s / √n, s the sample standard
/// deviation. One sample gives a zero-width interval; `None` for no samples or non-finite values.
pub fn t_interval(xs: &[f64]) -> Option<Interval> {
    if xs.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let m = mean(xs)?;
    let n = xs.len();
    if n < 2 {
        return Some(Interval {
            mean: m,
            lo: m,
            hi: m,
            n,
        });
    }
    let var = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1) as f64;
    let half = student_t_975(n - 1) * (var / n as f64).sqrt();
    Some(Interval {
        mean: m,
        lo: m - half,
        hi: m + half,
        n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_quantile_matches_known_values() {
        assert_eq!(student_t_975(1), 12.706);
        assert_eq!(student_t_975(10), 2.228);
        // Published: df 40 → 2.021, 60 → 2.000, 120 → 1.980.
        assert!((student_t_975(40) - 2.021).abs() < 1e-3);
        assert!((student_t_975(60) - 2.000).abs() < 1e-3);
        assert!((student_t_975(120) - 1.980).abs() < 1e-3);
        assert!((student_t_975(100_000) - 1.960).abs() < 1e-3);
        // Continuity at the table edge.
        assert!((student_t_975(31) - 2.040).abs() < 1e-3);
    }

    #[test]
    fn t_interval_by_hand() {
        // xs = 1, 2, 3, 4: mean 2.5, s² = 5/3, se = sqrt(5/12), t(3) = 3.182.
        let i = t_interval(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        let half = 3.182 * (5.0f64 / 12.0).sqrt();
        assert!((i.mean - 2.5).abs() < 1e-12);
        assert!((i.lo - (2.5 - half)).abs() < 1e-12);
        assert!((i.hi - (2.5 + half)).abs() < 1e-12);
        assert_eq!(i.n, 4);
    }

    #[test]
    fn t_interval_edge_cases() {
        assert!(t_interval(&[]).is_none());
        assert!(t_interval(&[1.0, f64::NAN]).is_none());
        let one = t_interval(&[3.0]).unwrap();
        assert_eq!((one.lo, one.mean, one.hi), (3.0, 3.0, 3.0));
        let same = t_interval(&[2.0, 2.0, 2.0]).unwrap();
        assert_eq!(same.half_width(), 0.0);
    }
}
