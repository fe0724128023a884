//! An independent oracle for sampling preparation: the target's reference distribution.
//!
//! The exact proofs compare speculative decoding with *the target's own* distribution. If that
//! reference were computed by the code under test ([`prepare_probs`]), a mistake there would
//! sit on both sides of the comparison and cancel. [`reference_probs`] is the same
//! specification written a second time, differently, in exact operations only (`+`, `·`, `/`,
//! comparisons), so it is exact for rationals:
//!
//! - temperature `T = 0`: one-hot at the most probable token, the lowest id among ties;
//! - temperature `T = 1/n` for a whole `n` (the only ones that stay rational): `p_i^n` by `n`
//!   multiplications; any other temperature is refused;
//! - top-k, by **rank** rather than by sorting: token `i` ranks after every token of larger
//!   weight and after equal-weight tokens of lower id; it is kept iff fewer than `k` tokens rank
//!   before it;
//! - top-p, on what top-k kept, also by rank: with `S` the kept mass, token `i` stays iff the
//!   kept mass ranking before it is `< top_p · S` (so the shortest most-probable-first prefix
//!   reaching `top_p · S` stays, and always at least one token);
//! - min-p, on what top-p kept, by pairwise comparison rather than through the maximum: token
//!   `i` stays iff no kept token `j` has `w_i < min_p · w_j`;
//! - then normalisation.
//!
//! The repetition / frequency / presence penalties are not oracled: they act on logits in the
//! engine (`specdec-harness`), not on the probability tables the proofs use.

use crate::error::{AlgorithmError, Result};
use specdec_kernels::sampling::{Prob, SamplingParams};

/// The largest `n` of a temperature `1/n` the oracle accepts.
pub const MAX_INVERSE_TEMPERATURE: u32 = 64;

/// The prepared distribution of `probs` under `params`, computed independently of
/// [`specdec_kernels::sampling::prepare_probs`] (see the module docs). `probs` need not be
/// normalised; the result is.
///
/// # Errors
/// [`AlgorithmError::InvalidParameter`] for parameters out of range, a temperature that is not
/// 0 or `1/n` with `n <= 64`, an empty or negative table, or one with no mass left.
pub fn reference_probs<N: Prob>(probs: &[N], params: &SamplingParams) -> Result<Vec<N>> {
    let refuse = |reason: String| AlgorithmError::InvalidParameter {
        name: "sampling oracle",
        reason,
    };
    if probs.is_empty() || probs.iter().any(|p| *p < N::zero()) {
        return Err(refuse(format!("{probs:?} is not a table of weights >= 0")));
    }
    if params.temperature == 0.0 {
        let best = probs
            .iter()
            .fold(N::zero(), |m, p| if *p > m { p.clone() } else { m });
        let first = probs.iter().position(|p| *p == best).unwrap_or(0);
        return Ok(indicator(probs.len(), |i| i == first));
    }
    let n = (1..=MAX_INVERSE_TEMPERATURE)
        .find(|&n| 1.0 / f64::from(n) == params.temperature)
        .ok_or_else(|| {
            refuse(format!(
                "temperature {} is not 0 or 1/n for a whole n <= {MAX_INVERSE_TEMPERATURE}",
                params.temperature
            ))
        })?;
    let tempered: Vec<N> = probs
        .iter()
        .map(|p| (1..n).fold(p.clone(), |acc, _| acc * p.clone()))
        .collect();
    // ranks_before(i): the tokens that rank before i (larger weight, or equal and lower id).
    let ranks_before = |i: usize| -> Vec<usize> {
        (0..tempered.len())
            .filter(|&j| tempered[j] > tempered[i] || (tempered[j] == tempered[i] && j < i))
            .collect()
    };
    let mut kept: Vec<bool> = vec![true; tempered.len()];
    if let Some(k) = params.top_k {
        if k == 0 {
            return Err(refuse("top-k must be at least 1".into()));
        }
        for (i, keep) in kept.iter_mut().enumerate() {
            *keep = ranks_before(i).len() < k;
        }
    }
    if let Some(top_p) = params.top_p {
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(refuse(format!("top-p {top_p} is not in (0, 1]")));
        }
        let kept_mass = sum((0..tempered.len())
            .filter(|&j| kept[j])
            .map(|j| &tempered[j]));
        let threshold = N::from_f64(top_p) * kept_mass;
        let after_top_k = kept.clone();
        for (i, keep) in kept.iter_mut().enumerate() {
            if after_top_k[i] {
                let before = sum(ranks_before(i)
                    .into_iter()
                    .filter(|&j| after_top_k[j])
                    .map(|j| &tempered[j]));
                *keep = before < threshold;
            }
        }
    }
    if let Some(min_p) = params.min_p {
        if !(0.0..=1.0).contains(&min_p) {
            return Err(refuse(format!("min-p {min_p} is not in [0, 1]")));
        }
        let share = N::from_f64(min_p);
        let after_top_p = kept.clone();
        for (i, keep) in kept.iter_mut().enumerate() {
            *keep = after_top_p[i]
                && (0..tempered.len())
                    .filter(|&j| after_top_p[j])
                    .all(|j| tempered[i] >= share.clone() * tempered[j].clone());
        }
    }
    let weights: Vec<N> = tempered
        .iter()
        .zip(&kept)
        .map(|(w, &k)| if k { w.clone() } else { N::zero() })
        .collect();
    let total = sum(weights.iter());
    if !total.is_positive() {
        return Err(refuse(format!(
            "{probs:?} has no mass left under {params:?}"
        )));
    }
    Ok(weights.into_iter().map(|w| w / total.clone()).collect())
}

fn indicator<N: Prob>(len: usize, on: impl Fn(usize) -> bool) -> Vec<N> {
    (0..len)
        .map(|i| if on(i) { N::one() } else { N::zero() })
        .collect()
}

/// A plain left-to-right sum (exact for rationals; the oracle never uses [`Prob::total`]).
fn sum<'a, N: Prob + 'a>(values: impl Iterator<Item = &'a N>) -> N {
    values.fold(N::zero(), |acc, v| acc + v.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use specdec_kernels::sampling::{prepare_probs, ratio, BigRational};

    fn params(temperature: f64, top_k: Option<usize>, top_p: Option<f64>) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p: None,
        }
    }

    fn table(weights: &[i64], denominator: i64) -> Vec<BigRational> {
        weights.iter().map(|&w| ratio(w, denominator)).collect()
    }

    /// The kept tokens (positive entries) of a prepared table.
    fn support<N: Prob>(probs: &[N]) -> Vec<usize> {
        (0..probs.len())
            .filter(|&i| probs[i].is_positive())
            .collect()
    }

    #[test]
    fn top_k_ties_at_the_boundary_keep_the_lower_ids() {
        // Three tokens tied at 1/4, two at 1/8, listed out of order.
        let p = table(&[1, 2, 2, 1, 2], 8);
        let want: [&[usize]; 5] = [&[1], &[1, 2], &[1, 2, 4], &[0, 1, 2, 4], &[0, 1, 2, 3, 4]];
        for (k, want) in (1..=5).zip(want) {
            let got = reference_probs(&p, &params(1.0, Some(k), None)).unwrap();
            assert_eq!(support(&got), want, "k = {k}");
        }
    }

    #[test]
    fn top_p_exactly_at_each_cumulative_threshold() {
        // Ranked: 1/2 (id 1), 1/4 (id 3), 1/8 (id 0), 1/8 (id 2); cumulative 1/2, 3/4, 7/8, 1.
        let p = table(&[1, 4, 1, 2], 8);
        let cases: [(f64, &[usize]); 8] = [
            (0.25, &[1]),
            (0.5, &[1]),
            (0.5 + 1.0 / 1024.0, &[1, 3]),
            (0.75, &[1, 3]),
            (0.75 + 1.0 / 1024.0, &[0, 1, 3]),
            (0.875, &[0, 1, 3]),
            (0.875 + 1.0 / 1024.0, &[0, 1, 2, 3]),
            (1.0, &[0, 1, 2, 3]),
        ];
        for (top_p, want) in cases {
            let got = reference_probs(&p, &params(1.0, None, Some(top_p))).unwrap();
            assert_eq!(support(&got), want, "top-p = {top_p}");
        }
        // With top-k first, top-p is relative to the mass top-k kept: 3/4 of (1/2 + 1/4) is
        // reached by token 1 alone... only at 2/3; at 3/4 token 3 is needed as well.
        let got = reference_probs(&p, &params(1.0, Some(2), Some(2.0 / 3.0))).unwrap();
        assert_eq!(support(&got), [1]);
        let got = reference_probs(&p, &params(1.0, Some(2), Some(0.75))).unwrap();
        assert_eq!(got, table(&[0, 2, 0, 1], 3));
    }

    #[test]
    fn min_p_exactly_at_each_share_of_the_largest() {
        // Weights 1/8, 4/8, 1/8, 2/8: shares of the largest 1/4, 1, 1/4, 1/2.
        let p = table(&[1, 4, 1, 2], 8);
        let with_min_p = |min_p| SamplingParams {
            min_p: Some(min_p),
            ..params(1.0, None, None)
        };
        let cases: [(f64, &[usize]); 6] = [
            (0.0, &[0, 1, 2, 3]),
            (0.25, &[0, 1, 2, 3]),
            (0.25 + 1.0 / 1024.0, &[1, 3]),
            (0.5, &[1, 3]),
            (0.5 + 1.0 / 1024.0, &[1]),
            (1.0, &[1]),
        ];
        for (min_p, want) in cases {
            let got = reference_probs(&p, &with_min_p(min_p)).unwrap();
            assert_eq!(support(&got), want, "min-p = {min_p}");
        }
        // After top-k 1 only the largest is left, whatever min-p says.
        let got = reference_probs(
            &p,
            &SamplingParams {
                top_k: Some(1),
                ..with_min_p(0.0)
            },
        )
        .unwrap();
        assert_eq!(support(&got), [1]);
    }

    #[test]
    fn temperature_one_half_squares_and_greedy_takes_the_lowest_argmax() {
        let p = table(&[1, 2, 2, 3], 8);
        let got = reference_probs(&p, &params(0.5, None, None)).unwrap();
        assert_eq!(got, table(&[1, 4, 4, 9], 18));
        let tied = table(&[1, 3, 3, 1], 8);
        assert_eq!(
            reference_probs(&tied, &params(0.0, Some(1), Some(0.1))).unwrap(),
            table(&[0, 1, 0, 0], 1)
        );
        // Ties after squaring at the top-k boundary: 3/8 and 3/8 squared tie, the lower id stays.
        let got = reference_probs(&tied, &params(0.5, Some(1), None)).unwrap();
        assert_eq!(support(&got), [1]);
    }

    #[test]
    fn bad_parameters_are_refused_with_a_reason() {
        let p = table(&[1, 1], 2);
        for bad in [
            params(0.7, None, None),
            params(1.0, Some(0), None),
            params(1.0, None, Some(0.0)),
            params(1.0, None, Some(1.5)),
            SamplingParams {
                min_p: Some(1.5),
                ..params(1.0, None, None)
            },
        ] {
            let err = reference_probs(&p, &bad).unwrap_err().to_string();
            assert!(err.contains("sampling oracle"), "{err}");
        }
        assert!(reference_probs(&table(&[0, 0], 1), &params(1.0, None, None)).is_err());
        assert!(reference_probs::<BigRational>(&[], &params(1.0, None, None)).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        /// On dyadic tables with ties everywhere (weights k/16) and dyadic top-p and min-p
        /// values that fall exactly on cumulative masses and shares, the production preparation equals the oracle:
        /// exactly for rationals, and with the same support (and values within rounding) for
        /// `f64` and `f32`.
        #[test]
        fn production_preparation_equals_the_oracle_on_dyadic_ties(
            weights in proptest::collection::vec(0i64..=4, 1..6),
            inverse_temperature in 1u32..=2,
            top_k in proptest::option::of(1usize..=6),
            top_p in proptest::option::of(1i64..=16),
            min_p in proptest::option::of(0i64..=16),
        ) {
            prop_assume!(weights.iter().any(|&w| w > 0));
            let params = SamplingParams {
                temperature: 1.0 / f64::from(inverse_temperature),
                top_k,
                top_p: top_p.map(|p| p as f64 / 16.0),
                min_p: min_p.map(|m| m as f64 / 16.0),
            };
            let exact = table(&weights, 16);
            let oracle = reference_probs(&exact, &params).unwrap();
            prop_assert_eq!(&prepare_probs(&exact, &params).unwrap(), &oracle);
            let wide: Vec<f64> = weights.iter().map(|&w| w as f64 / 16.0).collect();
            let narrow: Vec<f32> = weights.iter().map(|&w| w as f32 / 16.0).collect();
            let wide = prepare_probs(&wide, &params).unwrap();
            let narrow = prepare_probs(&narrow, &params).unwrap();
            prop_assert_eq!(support(&wide), support(&oracle));
            prop_assert_eq!(support(&narrow), support(&oracle));
            for ((o, w), n) in oracle.iter().zip(&wide).zip(&narrow) {
                prop_assert!((o.to_f64() - w).abs() < 1e-9 && (o.to_f64() - f64::from(*n)).abs() < 1e-6);
            }
        }
    }
}
