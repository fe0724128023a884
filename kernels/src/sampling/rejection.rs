//! The rejection-sampling math of speculative decoding, generic over the number type.
//!
//! Draft token `x ~ q` is accepted with probability `min(1, p(x) / q(x))`
//! ([`Decisions::accept`]); on rejection the output is drawn from the **residual**
//! `norm(max(0, p − q))`; after a fully accepted draft the **bonus** token is drawn from `p`.
//! Together these emit exactly one draw from `p` (Leviathan et al. 2023; Chen et al. 2023).
//!
//! When the residual has no mass (exactly zero for rationals, zero in fixed point for floats)
//! the draw falls back to `p` itself; with exact arithmetic that branch has probability zero.
//! All argmaxes break ties toward the lowest token id.

use super::decisions::{Decisions, DrawKey};
use super::number::Prob;

/// Index of the largest weight, the lowest index among ties; 0 for an empty slice.
pub fn argmax<N: Prob>(weights: &[N]) -> usize {
    let mut best = 0;
    for (i, w) in weights.iter().enumerate().skip(1) {
        if *w > weights[best] {
            best = i;
        }
    }
    best
}

/// `max(0, p − q)` elementwise (unnormalised). `p` and `q` have the same length.
pub fn residual<N: Prob>(p: &[N], q: &[N]) -> Vec<N> {
    p.iter()
        .zip(q)
        .map(|(a, b)| {
            if *a > *b {
                a.clone() - b.clone()
            } else {
                N::zero()
            }
        })
        .collect()
}

/// `weights / Σ weights` (the sum by [`Prob::total`]); `None` if the total is not positive.
pub fn normalize<N: Prob>(weights: &[N]) -> Option<Vec<N>> {
    let mut normalized = weights.to_vec();
    normalize_in_place(&mut normalized).then_some(normalized)
}

/// [`normalize`] in place: `false` (and `weights` unchanged) if the total is not positive.
pub fn normalize_in_place<N: Prob>(weights: &mut [N]) -> bool {
    let total = N::total(weights);
    if !total.is_positive() {
        return false;
    }
    for w in weights.iter_mut() {
        *w = w.clone() / total.clone();
    }
    true
}

/// Draws from `weights`; if they have no mass, from `fallback`; if that has none either, returns
/// `argmax(fallback)` (lowest id). Never fails.
pub fn sample_or<N: Prob, D: Decisions<N> + ?Sized>(
    decisions: &mut D,
    key: DrawKey,
    weights: &[N],
    fallback: &[N],
) -> usize {
    decisions
        .categorical(key, weights)
        .or_else(|| decisions.categorical(key, fallback))
        .unwrap_or_else(|| argmax(fallback))
}

/// Draws the correction token after a rejection: from `norm(max(0, p − q))`, or from `p` when
/// that residual has no mass.
pub fn sample_residual<N: Prob, D: Decisions<N> + ?Sized>(
    decisions: &mut D,
    key: DrawKey,
    p: &[N],
    q: &[N],
) -> usize {
    sample_or(decisions, key, &residual(p, q), p)
}

/// Draws the bonus token from `p` (after every draft on the path was accepted).
pub fn sample_bonus<N: Prob, D: Decisions<N> + ?Sized>(
    decisions: &mut D,
    key: DrawKey,
    p: &[N],
) -> usize {
    sample_or(decisions, key, p, p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{ratio, Purpose, Replay};
    use num_rational::BigRational;

    #[test]
    fn argmax_ties_go_to_lowest_id() {
        assert_eq!(argmax(&[0.25f32, 0.5, 0.5]), 1);
        assert_eq!(argmax(&[ratio(1, 3), ratio(1, 3), ratio(1, 3)]), 0);
    }

    #[test]
    fn residual_is_positive_part_of_difference() {
        let p = [ratio(1, 2), ratio(1, 4), ratio(1, 4)];
        let q = [ratio(1, 4), ratio(1, 2), ratio(1, 4)];
        let r = residual(&p, &q);
        assert_eq!(r, vec![ratio(1, 4), ratio(0, 1), ratio(0, 1)]);
        assert_eq!(normalize(&r).unwrap()[0], ratio(1, 1));
        assert!(normalize::<BigRational>(&residual(&p, &p)).is_none());
    }

    #[test]
    fn residual_and_bonus_draw_from_their_own_weights() {
        // Every draw is forced: the residual max(0, p − q) = (0, 0, 1/2) and p's mass sit on
        // one token each, so any word picks it.
        let p = [0.5f32, 0.0, 0.5];
        let q = [0.5f32, 0.5, 0.0];
        let mut dec = Replay::production(1);
        let key = DrawKey::new(0, 0, 0, Purpose::Residual);
        assert_eq!(sample_residual(&mut dec, key, &p, &q), 2);
        assert_eq!(sample_bonus(&mut dec, key, &[0.0f32, 0.0, 1.0]), 2);
        assert_eq!(sample_or(&mut dec, key, &[0.0f32, 0.0], &[0.0, 0.0]), 0);
        assert_eq!(sample_or(&mut dec, key, &[0.0f32; 3], &[0.0, 0.0, 0.0]), 0);
        assert_eq!(
            sample_or(&mut dec, key, &[0.0f32; 3], &[0.0, 0.0, 2e-12]),
            2
        );
    }

    #[test]
    fn empty_residual_falls_back_to_p() {
        let p = [0.0f32, 1.0, 0.0];
        let mut dec = Replay::production(0);
        let key = DrawKey::new(0, 0, 0, Purpose::Residual);
        assert_eq!(sample_residual(&mut dec, key, &p, &p), 1);
        assert_eq!(sample_bonus(&mut dec, key, &p), 1);
    }
}
