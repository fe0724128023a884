//! Sampling preparation: temperature, top-k, top-p and min-p turn a model's distribution (or
//! logits) into the probabilities that drafting and verification use. Apply the same parameters
//! to the target and the draft before verification.
//!
//! Order: temperature, then top-k, then top-p, then min-p, then normalisation.
//! - `temperature = 0` means greedy: the result is one-hot at the argmax (lowest id on ties) and
//!   top-k / top-p are irrelevant.
//! - `temperature = 1/k` for a whole number `k` (checked exactly in `f64`) raises probabilities to
//!   the power `k`, which keeps rationals exact; any other temperature needs [`Prob::powf`] and is
//!   refused for exact rationals ([`KernelError::InexactTemperature`]).
//! - top-k keeps the `k` most probable tokens (ties: lower id first); top-p then keeps the
//!   shortest most-probable-first prefix whose mass reaches `top_p` of the total (at least one
//!   token). min-p then keeps the tokens whose weight is at least `min_p` times the largest
//!   weight (the most probable token always stays). Removed tokens get probability exactly zero.

use super::number::Prob;
use super::rejection::{argmax, normalize_in_place};
use crate::error::{KernelError, Result};
use crate::ops::exp_scaled;

/// Temperature, top-k, top-p and min-p.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Temperature `T >= 0` (finite); 0 is greedy.
    pub temperature: f64,
    /// Keep only the `k >= 1` most probable tokens; `None` keeps all.
    pub top_k: Option<usize>,
    /// Keep the smallest most-probable set with mass `>= top_p`, `0 < top_p <= 1`; `None` keeps all.
    pub top_p: Option<f64>,
    /// Drop the tokens whose probability is below `min_p` times the largest, `0 <= min_p <= 1`;
    /// `None` (or 0) keeps all.
    pub min_p: Option<f64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::with_temperature(1.0)
    }
}

impl SamplingParams {
    /// Plain sampling at `temperature`, no top-k, top-p or min-p.
    pub fn with_temperature(temperature: f64) -> Self {
        Self {
            temperature,
            top_k: None,
            top_p: None,
            min_p: None,
        }
    }

    /// Greedy decoding (`temperature = 0`).
    pub fn greedy() -> Self {
        Self::with_temperature(0.0)
    }

    /// True for `temperature == 0`.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Checks the ranges documented on the fields.
    ///
    /// # Errors
    /// [`KernelError::InvalidParameter`] naming the field.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(invalid(
                "temperature",
                format!("{} is not a finite value >= 0", self.temperature),
            ));
        }
        if self.top_k == Some(0) {
            return Err(invalid("top_k", "must be at least 1".to_string()));
        }
        if let Some(top_p) = self.top_p {
            if !(top_p > 0.0 && top_p <= 1.0) {
                return Err(invalid("top_p", format!("{top_p} is not in (0, 1]")));
            }
        }
        if let Some(min_p) = self.min_p {
            if !(0.0..=1.0).contains(&min_p) {
                return Err(invalid("min_p", format!("{min_p} is not in [0, 1]")));
            }
        }
        Ok(())
    }

    /// `Some(k)` when `temperature == 1/k` exactly for a whole `k >= 1`.
    pub fn inverse_whole_temperature(&self) -> Option<u32> {
        if self.temperature <= 0.0 {
            return None;
        }
        let k = (1.0 / self.temperature).round();
        (k >= 1.0 && k <= f64::from(u32::MAX) && 1.0 / k == self.temperature).then_some(k as u32)
    }
}

fn invalid(what: &'static str, reason: String) -> KernelError {
    KernelError::InvalidParameter { what, reason }
}

/// Checks that `probs` is a usable distribution: non-empty, entries `>= 0`, positive total.
///
/// # Errors
/// [`KernelError::InvalidDistribution`] naming `what`.
pub fn check_distribution<N: Prob>(what: &str, probs: &[N]) -> Result<()> {
    let bad = |reason: String| KernelError::InvalidDistribution {
        what: what.to_string(),
        reason,
    };
    if probs.is_empty() {
        return Err(bad("it is empty".to_string()));
    }
    if let Some(i) = probs
        .iter()
        .position(|p| p.partial_cmp(&N::zero()).is_none_or(|o| o.is_lt()))
    {
        return Err(bad(format!("entry {i} is {:?}, not >= 0", probs[i])));
    }
    if !N::total(probs).is_positive() {
        return Err(bad("it has no mass".to_string()));
    }
    Ok(())
}

/// Applies temperature, top-k, top-p and min-p to a distribution (normalised or not) and
/// normalises.
///
/// # Errors
/// Invalid parameters or distribution; [`KernelError::InexactTemperature`] for a temperature
/// that is not `0` or `1/k` on a type without [`Prob::powf`].
pub fn prepare_probs<N: Prob>(probs: &[N], params: &SamplingParams) -> Result<Vec<N>> {
    params.validate()?;
    check_distribution("probabilities to prepare", probs)?;
    if params.is_greedy() {
        let best = argmax(probs);
        return Ok((0..probs.len())
            .map(|i| if i == best { N::one() } else { N::zero() })
            .collect());
    }
    let weights: Vec<N> = match params.inverse_whole_temperature() {
        Some(1) => probs.to_vec(),
        Some(k) => probs.iter().map(|p| p.pow_u32(k)).collect(),
        None => probs
            .iter()
            .map(|p| p.powf(1.0 / params.temperature))
            .collect::<Option<Vec<N>>>()
            .ok_or(KernelError::InexactTemperature {
                temperature: params.temperature.to_string(),
            })?,
    };
    cut_and_normalize(weights, params)
}

/// Applies top-k, top-p and min-p to `weights` (non-negative, positive total; normalised or not)
/// and normalises them by their order-independent total ([`Prob::total`]), in place.
///
/// # Errors
/// [`KernelError::InvalidDistribution`] when no mass is left.
fn cut_and_normalize<N: Prob>(mut weights: Vec<N>, params: &SamplingParams) -> Result<Vec<N>> {
    if params.top_k.is_some() || params.top_p.is_some() {
        let mut kept = top_k_top_p_ids(&weights, params);
        kept.sort_unstable();
        // zero the runs between kept ids (no mask over the whole row)
        let mut next = 0;
        for i in kept {
            weights[next..i].fill(N::zero());
            next = i + 1;
        }
        weights[next..].fill(N::zero());
    }
    if let Some(min_p) = params.min_p.filter(|&m| m > 0.0) {
        // The largest weight survived top-k and top-p, so the cut is relative to it either way.
        let threshold = N::from_f64(min_p) * weights[argmax(&weights)].clone();
        for w in &mut weights {
            if *w < threshold {
                *w = N::zero();
            }
        }
    }
    if !normalize_in_place(&mut weights) {
        return Err(KernelError::InvalidDistribution {
            what: "prepared probabilities".to_string(),
            reason: "no mass left after temperature/top-k/top-p/min-p".to_string(),
        });
    }
    Ok(weights)
}

/// The ids top-k and then top-p keep (in no particular order): with the row sorted most probable
/// first (lower id first among ties), top-k keeps the first `k`, and top-p the shortest prefix
/// of those whose running sum (in `N`, in that order) reaches `top_p` times their total.
///
/// Sorting the whole row is what this must equal, but it is not what it does: the top-k set is
/// selected in linear time, and top-p sorts only the candidates whose weight is at least a cut
/// (2^-10, then 2^-20 of the largest) when the running sum already reaches the threshold among
/// them. Every id below the cut weighs less than every candidate, so the sorted row begins with
/// the sorted candidates and the prefix found among them is the one the whole row gives; when
/// no cut suffices, all ids are sorted.
fn top_k_top_p_ids<N: Prob>(weights: &[N], params: &SamplingParams) -> Vec<usize> {
    let most_probable_first = |&a: &usize, &b: &usize| {
        weights[b]
            .partial_cmp(&weights[a])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    };
    // The top-k set, when top-k cuts anything; `None` stands for every id (no row-long list).
    let top_k_ids = params.top_k.filter(|&k| k < weights.len()).map(|k| {
        let mut ids: Vec<usize> = (0..weights.len()).collect();
        ids.select_nth_unstable_by(k - 1, most_probable_first);
        ids.truncate(k);
        ids
    });
    let Some(top_p) = params.top_p else {
        return top_k_ids.unwrap_or_else(|| (0..weights.len()).collect());
    };
    let (total, largest) = match &top_k_ids {
        Some(ids) => {
            let kept: Vec<N> = ids.iter().map(|&i| weights[i].clone()).collect();
            let largest = kept[argmax(&kept)].clone();
            (N::total(&kept), largest)
        }
        None => (N::total(weights), weights[argmax(weights)].clone()),
    };
    let threshold = N::from_f64(top_p) * total;
    // The ids of the top-k set (every id without top-k) that pass `keep` (generic, not `dyn`,
    // so that the filter over the whole row compiles to a tight loop).
    fn members(
        top_k_ids: Option<&[usize]>,
        len: usize,
        keep: impl Fn(usize) -> bool,
    ) -> Vec<usize> {
        match top_k_ids {
            Some(ids) => ids.iter().copied().filter(|&i| keep(i)).collect(),
            None => (0..len).filter(|&i| keep(i)).collect(),
        }
    }
    let top_k_ids = top_k_ids.as_deref();
    // `ids` sorted most probable first: `Ok` with the shortest prefix whose running sum reaches
    // the threshold, `Err` with all of them when their whole sum stays below it.
    let prefix = |mut ids: Vec<usize>| -> std::result::Result<Vec<usize>, Vec<usize>> {
        ids.sort_unstable_by(most_probable_first);
        let mut mass = N::zero();
        match ids.iter().position(|&i| {
            mass = mass.clone() + weights[i].clone();
            mass >= threshold
        }) {
            Some(end) => {
                ids.truncate(end + 1);
                Ok(ids)
            }
            None => Err(ids),
        }
    };
    for cut in [1.0 / 1024.0, 1.0 / 1_048_576.0] {
        let bound = N::from_f64(cut) * largest.clone();
        if let Ok(kept) = prefix(members(top_k_ids, weights.len(), |i| weights[i] >= bound)) {
            return kept;
        }
    }
    // No cut held enough mass (or rounding kept the sum below the threshold): every id.
    prefix(members(top_k_ids, weights.len(), |_| true)).unwrap_or_else(|every| every)
}

/// Softmax of `logits / temperature` in `f32` (max-subtracted, by [`exp_scaled`]: the same bits
/// on every CPU), then top-k / top-p / min-p and normalisation as in [`prepare_probs`].
/// `temperature = 0` gives one-hot at the argmax logit.
///
/// # Errors
/// As [`prepare_probs`]; non-finite logits are refused, naming the first; a temperature so small
/// that its inverse overflows f32 is [`KernelError::InvalidParameter`].
pub fn prepare_logits(logits: &[f32], params: &SamplingParams) -> Result<Vec<f32>> {
    params.validate()?;
    let max = finite_max(logits)?;
    if params.is_greedy() {
        // every logit is finite, so the first equal to the largest is the argmax (lowest id)
        let best = logits.iter().position(|&l| l == max).unwrap_or(0);
        let mut one_hot = vec![0.0f32; logits.len()];
        one_hot[best] = 1.0;
        return Ok(one_hot);
    }
    let inverse_temperature = inverse_temperature(params)?;
    let mut weights = vec![0.0f32; logits.len()];
    exp_scaled(logits, max, inverse_temperature, &mut weights)?;
    cut_and_normalize(weights, params)
}

/// `1 / temperature` in f64, rounded to f32: the factor f32 logits are scaled by (on the CPU
/// and the GPU alike) for a temperature above 0.
///
/// # Errors
/// [`KernelError::InvalidParameter`] for a temperature so small that the factor overflows f32.
pub(crate) fn inverse_temperature(params: &SamplingParams) -> Result<f32> {
    let inverse = (1.0 / params.temperature) as f32;
    if !inverse.is_finite() {
        return Err(invalid(
            "temperature",
            format!(
                "{} is so small that 1 / temperature overflows f32; use 0 for greedy",
                params.temperature
            ),
        ));
    }
    Ok(inverse)
}

/// The largest of `logits`, all of which must be finite.
///
/// # Errors
/// [`KernelError::InvalidDistribution`] naming the first non-finite logit, or the empty row.
fn finite_max(logits: &[f32]) -> Result<f32> {
    let invalid = |reason: String| KernelError::InvalidDistribution {
        what: "logits".to_string(),
        reason,
    };
    // One branch-free pass in lanes of 16, which the compiler vectorises: the largest logit,
    // and whether any has the all-ones exponent of an infinity or a NaN; the position of the
    // first non-finite logit is searched only on failure.
    const LANES: usize = 16;
    const EXPONENT: u32 = 0x7f80_0000;
    let mut lane_max = [f32::NEG_INFINITY; LANES];
    let mut lane_bad = [0u32; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for ((m, bad), &l) in lane_max.iter_mut().zip(&mut lane_bad).zip(chunk) {
            *m = if l > *m { l } else { *m };
            *bad |= u32::from(l.to_bits() & EXPONENT == EXPONENT);
        }
    }
    for (m, &l) in lane_max.iter_mut().zip(tail) {
        *m = if l > *m { l } else { *m };
    }
    let max = lane_max.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let finite = lane_bad.iter().all(|&b| b == 0) && tail.iter().all(|l| l.is_finite());
    if !finite {
        if let Some(i) = logits.iter().position(|l| !l.is_finite()) {
            return Err(invalid(format!("logit {i} is {}", logits[i])));
        }
    }
    if logits.is_empty() {
        return Err(invalid("it is empty".to_string()));
    }
    Ok(max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::ratio;
    use num_rational::BigRational;

    fn dist() -> Vec<BigRational> {
        vec![ratio(1, 2), ratio(1, 4), ratio(1, 8), ratio(1, 8)]
    }

    #[test]
    fn greedy_is_one_hot_at_lowest_argmax() {
        let p = vec![ratio(1, 3), ratio(1, 3), ratio(1, 3)];
        let out = prepare_probs(&p, &SamplingParams::greedy()).unwrap();
        assert_eq!(out, vec![ratio(1, 1), ratio(0, 1), ratio(0, 1)]);
        let logits = prepare_logits(&[1.0, 3.0, 3.0], &SamplingParams::greedy()).unwrap();
        assert_eq!(logits, vec![0.0, 1.0, 0.0]);
    }

    #[test]
    fn validate_names_the_field_out_of_range() {
        let refused = |params: SamplingParams| match params.validate() {
            Err(KernelError::InvalidParameter { what, .. }) => Some(what),
            Err(other) => panic!("{other}"),
            Ok(()) => None,
        };
        let t = SamplingParams::with_temperature;
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(refused(t(bad)), Some("temperature"), "{bad}");
        }
        for good in [0.0, 0.5, 1.0, 7.0] {
            assert_eq!(refused(t(good)), None, "{good}");
        }
        let k = |top_k| SamplingParams { top_k, ..t(1.0) };
        assert_eq!(refused(k(Some(0))), Some("top_k"));
        assert_eq!(refused(k(Some(1))), None);
        let p = |top_p| SamplingParams {
            top_p: Some(top_p),
            ..t(1.0)
        };
        for bad in [0.0, -0.5, 1.5, f64::NAN] {
            assert_eq!(refused(p(bad)), Some("top_p"), "{bad}");
        }
        for good in [1e-9, 0.5, 1.0] {
            assert_eq!(refused(p(good)), None, "{good}");
        }
    }

    #[test]
    fn only_zero_temperature_is_greedy() {
        assert!(SamplingParams::greedy().is_greedy());
        assert_eq!(SamplingParams::greedy().temperature, 0.0);
        assert!(!SamplingParams::with_temperature(0.5).is_greedy());
        let default = SamplingParams::default();
        assert_eq!(
            (default.temperature, default.top_k, default.top_p),
            (1.0, None, None)
        );
    }

    #[test]
    fn inverse_whole_temperature_is_exactly_one_over_k() {
        let k = |t: f64| SamplingParams::with_temperature(t).inverse_whole_temperature();
        assert_eq!(k(1.0), Some(1));
        assert_eq!(k(0.5), Some(2));
        assert_eq!(k(1.0 / 3.0), Some(3));
        assert_eq!(k(0.25), Some(4));
        // Not 1/k: near misses, temperatures above 1, zero, and k beyond u32.
        for t in [0.7, 0.34, 2.0, 1.5, 0.0, 1e-12] {
            assert_eq!(k(t), None, "{t}");
        }
    }

    #[test]
    fn inverse_whole_temperature_is_exact() {
        let params = SamplingParams::with_temperature(0.5);
        assert_eq!(params.inverse_whole_temperature(), Some(2));
        let out = prepare_probs(&dist(), &params).unwrap();
        // squares 16/64, 4/64, 1/64, 1/64 over 22/64
        assert_eq!(
            out,
            vec![ratio(16, 22), ratio(4, 22), ratio(1, 22), ratio(1, 22)]
        );
        let refused = prepare_probs(&dist(), &SamplingParams::with_temperature(0.7));
        assert!(matches!(
            refused,
            Err(KernelError::InexactTemperature { .. })
        ));
        let float = prepare_probs(&[0.5f64, 0.5], &SamplingParams::with_temperature(0.7)).unwrap();
        assert!(float.iter().all(|p| (p - 0.5).abs() < 1e-9), "{float:?}");
        // a float type takes any temperature: p^(1/T), renormalised
        let float =
            prepare_probs(&[0.75f64, 0.25], &SamplingParams::with_temperature(0.7)).unwrap();
        let (a, b) = (0.75f64.powf(1.0 / 0.7), 0.25f64.powf(1.0 / 0.7));
        assert!((float[0] - a / (a + b)).abs() < 1e-6, "{float:?}");
    }

    #[test]
    fn top_p_counts_the_mass_after_the_temperature() {
        // T = 1/2: weights 16, 4, 1, 1 (/64), total 22/64; top-p 0.7 of that needs the first only
        let params = SamplingParams {
            top_p: Some(0.7),
            ..SamplingParams::with_temperature(0.5)
        };
        let out = prepare_probs(&dist(), &params).unwrap();
        assert_eq!(
            out,
            vec![ratio(1, 1), ratio(0, 1), ratio(0, 1), ratio(0, 1)]
        );
    }

    #[test]
    fn top_k_and_top_p_keep_the_most_probable() {
        let params = SamplingParams {
            top_k: Some(2),
            ..SamplingParams::default()
        };
        let out = prepare_probs(&dist(), &params).unwrap();
        assert_eq!(
            out,
            vec![ratio(2, 3), ratio(1, 3), ratio(0, 1), ratio(0, 1)]
        );
        let params = SamplingParams {
            top_p: Some(0.8),
            ..SamplingParams::default()
        };
        let out = prepare_probs(&dist(), &params).unwrap();
        assert_eq!(out[3], ratio(0, 1), "ties: token 2 kept before token 3");
        assert_eq!(out[2], ratio(1, 7));
    }

    #[test]
    fn min_p_drops_what_is_below_its_share_of_the_largest() {
        let with_min_p = |min_p| SamplingParams {
            min_p: Some(min_p),
            ..SamplingParams::default()
        };
        // 1/2, 1/4, 1/8, 1/8: min-p 1/4 keeps weights >= 1/8 (all), 0.26 keeps >= 0.13.
        let all = prepare_probs(&dist(), &with_min_p(0.25)).unwrap();
        assert_eq!(all, dist());
        let two = prepare_probs(&dist(), &with_min_p(0.26)).unwrap();
        assert_eq!(
            two,
            vec![ratio(2, 3), ratio(1, 3), ratio(0, 1), ratio(0, 1)]
        );
        let one = prepare_probs(&dist(), &with_min_p(1.0)).unwrap();
        assert_eq!(
            one,
            vec![ratio(1, 1), ratio(0, 1), ratio(0, 1), ratio(0, 1)]
        );
        // After the temperature: squares 16, 4, 1, 1 (over 22); 1/4 of the largest is 4/22.
        let tempered = SamplingParams {
            temperature: 0.5,
            ..with_min_p(0.25)
        };
        let out = prepare_probs(&dist(), &tempered).unwrap();
        assert_eq!(
            out,
            vec![ratio(4, 5), ratio(1, 5), ratio(0, 1), ratio(0, 1)]
        );
        // Off at 0, refused outside [0, 1].
        assert_eq!(prepare_probs(&dist(), &with_min_p(0.0)).unwrap(), dist());
        for bad in [-0.1, 1.5, f64::NAN] {
            assert!(matches!(
                prepare_probs(&dist(), &with_min_p(bad)),
                Err(KernelError::InvalidParameter { what: "min_p", .. })
            ));
        }
    }

    #[test]
    fn bad_inputs_are_refused_with_a_reason() {
        let bad_t = prepare_probs(&[0.5f32, 0.5], &SamplingParams::with_temperature(-1.0));
        assert!(matches!(bad_t, Err(KernelError::InvalidParameter { .. })));
        let bad_p = prepare_probs(&[0.0f32, 0.0], &SamplingParams::default());
        assert!(matches!(
            bad_p,
            Err(KernelError::InvalidDistribution { .. })
        ));
        let bad_l = prepare_logits(&[f32::NAN], &SamplingParams::default());
        assert!(bad_l.is_err());
    }

    #[test]
    fn logits_are_divided_by_the_temperature_once() {
        // T = 1/2 squares the probabilities (1/3, 2/3) into (1/5, 4/5); shifting every logit
        // by 100 changes nothing (the softmax subtracts the largest logit before exp).
        let half = SamplingParams::with_temperature(0.5);
        for shift in [0.0f32, 100.0] {
            let out = prepare_logits(&[shift, shift + (2.0f32).ln()], &half).unwrap();
            assert!(
                (out[0] - 0.2).abs() < 1e-6 && (out[1] - 0.8).abs() < 1e-6,
                "{shift}: {out:?}"
            );
        }
        let one = prepare_logits(&[3.0], &SamplingParams::default()).unwrap();
        assert_eq!(one, vec![1.0]);
    }

    #[test]
    fn logits_softmax_is_the_f64_softmax_over_a_real_sized_row() {
        // a row as long as SmolLM2's vocabulary plus a tail, with standouts, ties and a spread
        // wide enough that some weights underflow f32
        let vocab = 49_152 + 5;
        let logits: Vec<f32> = (0..vocab)
            .map(|i| match i % 4099 {
                7 => 14.0,
                8 => 14.0,
                _ => ((i as f32 * 0.618).fract() - 0.5) * 240.0,
            })
            .collect();
        for temperature in [1.0, 0.7, 1.6] {
            let params = SamplingParams::with_temperature(temperature);
            let got = prepare_logits(&logits, &params).unwrap();
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f64> = logits
                .iter()
                .map(|&l| ((f64::from(l) - f64::from(max)) / temperature).exp())
                .collect();
            let sum: f64 = exps.iter().sum();
            let mut total = 0.0f64;
            for (i, (&g, e)) in got.iter().zip(&exps).enumerate() {
                let want = e / sum;
                total += f64::from(g);
                if want > 1e-30 {
                    assert!(
                        (f64::from(g) - want).abs() <= 4e-6 * want,
                        "T {temperature} id {i}: {g} vs {want}"
                    );
                } else {
                    assert!(f64::from(g) <= 1e-30, "T {temperature} id {i}: {g}");
                }
            }
            assert!((total - 1.0).abs() < 1e-5, "T {temperature}: sum {total}");
            assert_eq!(got[7], got[8], "ties keep equal probabilities");
        }
    }

    /// What [`top_k_top_p_ids`] must equal: the row sorted whole (stable, most probable first),
    /// its first `k`, then the shortest prefix whose running sum reaches `top_p` of their total.
    fn kept_by_sorting_everything<N: Prob>(weights: &[N], params: &SamplingParams) -> Vec<usize> {
        let mut order: Vec<usize> = (0..weights.len()).collect();
        order.sort_by(|&a, &b| {
            weights[b]
                .partial_cmp(&weights[a])
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        let mut keep = params.top_k.unwrap_or(order.len()).min(order.len());
        if let Some(top_p) = params.top_p {
            let kept: Vec<N> = order[..keep].iter().map(|&i| weights[i].clone()).collect();
            let threshold = N::from_f64(top_p) * N::total(&kept);
            let mut mass = N::zero();
            for (n, &i) in order[..keep].iter().enumerate() {
                mass = mass + weights[i].clone();
                if mass >= threshold {
                    keep = n + 1;
                    break;
                }
            }
        }
        let mut kept = order[..keep].to_vec();
        kept.sort_unstable();
        kept
    }

    #[test]
    fn top_k_and_top_p_keep_what_sorting_the_whole_row_keeps() {
        // rows with long flat tails, heavy heads, ties at every level and exact zeros, so that
        // each cut (2^-10, 2^-20, none) is the one that decides in some case
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for case in 0..300 {
            let len = 1 + (next() % 3000) as usize;
            let spread = (next() % 40) as i32;
            let row: Vec<f64> = (0..len)
                .map(|_| match next() % 10 {
                    0 => 0.0,
                    1 => 0.25, // ties
                    _ => 2f64.powi(-((next() % (spread as u64 + 1)) as i32)) * 0.75,
                })
                .collect();
            let top_k = (next() % 3 == 0).then(|| 1 + (next() % (len as u64 + 5)) as usize);
            let top_p =
                [None, Some(0.5), Some(0.9), Some(0.999_999), Some(1.0)][(next() % 5) as usize];
            let params = SamplingParams {
                top_k,
                top_p,
                ..SamplingParams::default()
            };
            let single: Vec<f32> = row.iter().map(|&w| w as f32).collect();
            assert_keeps_what_sorting_keeps(&row, &params, case);
            assert_keeps_what_sorting_keeps(&single, &params, case);
        }
    }

    fn assert_keeps_what_sorting_keeps<N: Prob>(row: &[N], params: &SamplingParams, case: usize) {
        let mut got = top_k_top_p_ids(row, params);
        got.sort_unstable();
        assert_eq!(
            got,
            kept_by_sorting_everything(row, params),
            "case {case}: {params:?}"
        );
    }

    #[test]
    fn a_non_finite_logit_is_named_and_nothing_is_prepared() {
        for (bad, at) in [(f32::NAN, 3), (f32::INFINITY, 0), (f32::NEG_INFINITY, 40)] {
            let mut logits = vec![0.5f32; 41];
            logits[at] = bad;
            for params in [SamplingParams::greedy(), SamplingParams::default()] {
                match prepare_logits(&logits, &params) {
                    Err(KernelError::InvalidDistribution { reason, .. }) => {
                        assert_eq!(reason, format!("logit {at} is {bad}"))
                    }
                    other => panic!("{bad} at {at}: {other:?}"),
                }
            }
        }
        assert!(matches!(
            prepare_logits(&[1.0, 2.0], &SamplingParams::with_temperature(1e-40)),
            Err(KernelError::InvalidParameter {
                what: "temperature",
                ..
            })
        ));
        assert!(matches!(
            prepare_logits(&[], &SamplingParams::default()),
            Err(KernelError::InvalidDistribution { reason, .. }) if reason == "it is empty"
        ));
    }

    #[test]
    fn logits_softmax_matches_probabilities() {
        let out = prepare_logits(&[0.0, (2.0f32).ln()], &SamplingParams::default()).unwrap();
        assert!((out[0] - 1.0 / 3.0).abs() < 1e-6 && (out[1] - 2.0 / 3.0).abs() < 1e-6);
    }
}
