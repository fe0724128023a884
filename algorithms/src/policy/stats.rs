//! [`AcceptanceStats`]: live acceptance statistics of one sequence, with censoring handled.
//!
//! A chain step that accepts `a` of `k` drafts tells us about positions `0..=a` only: positions
//! `0..a` were tried and accepted, position `a` (if `a < k`) was tried and rejected, and positions
//! after it were **never tried** — they are censored, not rejected. So the per-position
//! *conditional* acceptance `α_i = P(position i accepted | positions < i accepted)` is estimated as
//! `successes_i / trials_i` counting only positions that were tried. (The naive
//! "accepted / proposed" rate mixes censored positions in as failures and is biased low for long
//! chains; it is still reported as the acceptance rate, per the shared definition.)
//!
//! The same bookkeeping per *rank* gives the acceptance vector of tree drafting: the probability
//! that the rank-`r` candidate is accepted given it is tried (candidates are tried in rank order).
//!
//! Estimates are smoothed so that unseen positions and ranks have a sensible value: the pooled
//! conditional acceptance `ᾱ = (S + n α₀) / (T + n)` over all tried positions, its prior `α₀`
//! counted as `n` tries (by default uniform, `(S + 1) / (T + 2)`; a policy may set what earlier
//! sequences measured, [`AcceptanceStats::set_pooled_prior`]), and per position
//! `α̂_i = (s_i + m ᾱ) / (t_i + m)` with prior strength `m`. All counts may decay geometrically
//! per observed step so that the statistics follow a drifting sequence.

use crate::error::{ensure_param, Result};
use crate::policy::StepOutcome;

/// The default pooled prior `(α₀, n)`: acceptance one half counted as two tries (uniform).
const UNIFORM_POOLED_PRIOR: (f64, f64) = (0.5, 2.0);

/// Weighted (trials, successes) of one Bernoulli quantity.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Tally {
    trials: f64,
    successes: f64,
}

impl Tally {
    fn add(&mut self, accepted: bool) {
        self.trials += 1.0;
        if accepted {
            self.successes += 1.0;
        }
    }

    fn scale(&mut self, factor: f64) {
        self.trials *= factor;
        self.successes *= factor;
    }
}

/// Live acceptance statistics of one sequence (see the module docs for the estimators).
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptanceStats {
    decay: f64,
    prior_strength: f64,
    /// `(α₀, n)`: the pooled estimate's prior acceptance and how many tries it counts as.
    pooled_prior: (f64, f64),
    positions: Vec<Tally>,
    ranks: Vec<Tally>,
    proposed: u64,
    accepted: u64,
    passes: u64,
    speculative_passes: u64,
}

impl Default for AcceptanceStats {
    fn default() -> Self {
        Self::new()
    }
}

impl AcceptanceStats {
    /// Statistics that never forget (decay 1) with prior strength 2 and a uniform pooled prior
    /// (`α₀ = 0.5` counted as 2 tries).
    pub fn new() -> Self {
        Self {
            decay: 1.0,
            prior_strength: 2.0,
            pooled_prior: UNIFORM_POOLED_PRIOR,
            positions: Vec::new(),
            ranks: Vec::new(),
            proposed: 0,
            accepted: 0,
            passes: 0,
            speculative_passes: 0,
        }
    }

    /// Sets the per-step decay of the per-position and per-rank counts: before each speculative
    /// step's counts are added, old counts are multiplied by `decay` (1 = never forget; 0.95
    /// remembers roughly the last 20 steps).
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] unless `0 < decay ≤ 1`.
    pub fn with_decay(mut self, decay: f64) -> Result<Self> {
        ensure_param(
            decay > 0.0 && decay <= 1.0,
            "decay",
            format!("must be in (0, 1], got {decay}"),
        )?;
        self.decay = decay;
        Ok(self)
    }

    /// Sets the prior strength `m` pulling each position's estimate towards the pooled one.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] unless `m ≥ 0` and finite.
    pub fn with_prior_strength(mut self, m: f64) -> Result<Self> {
        ensure_param(
            m >= 0.0 && m.is_finite(),
            "prior_strength",
            format!("must be ≥ 0, got {m}"),
        )?;
        self.prior_strength = m;
        Ok(self)
    }

    /// Sets the pooled estimate's prior: acceptance `alpha` counted as `tries` tries, so that
    /// `ᾱ = (S + tries · alpha) / (T + tries)` (the uniform default is `alpha = 0.5`,
    /// `tries = 2`). A policy sets what earlier sequences of its drafter measured, so that a
    /// sequence's first few tries are weighed against that instead of against a coin.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] unless `0 < alpha < 1` and `tries > 0`, both
    /// finite (nothing is changed then).
    pub fn set_pooled_prior(&mut self, alpha: f64, tries: f64) -> Result<()> {
        ensure_param(
            alpha > 0.0 && alpha < 1.0,
            "pooled prior acceptance",
            format!("must be in (0, 1), got {alpha}"),
        )?;
        ensure_param(
            tries > 0.0 && tries.is_finite(),
            "pooled prior tries",
            format!("must be positive and finite, got {tries}"),
        )?;
        self.pooled_prior = (alpha, tries);
        Ok(())
    }

    /// Back to the uniform pooled prior (`α₀ = 0.5` counted as 2 tries).
    pub fn clear_pooled_prior(&mut self) {
        self.pooled_prior = UNIFORM_POOLED_PRIOR;
    }

    /// Adds one step's outcome. Plain steps only count as target passes.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidOutcome`] if the outcome breaks its invariants (nothing is
    /// recorded then).
    pub fn observe(&mut self, outcome: &StepOutcome) -> Result<()> {
        outcome.validate()?;
        self.passes += 1;
        if outcome.proposed == 0 {
            return Ok(());
        }
        self.speculative_passes += 1;
        self.proposed += outcome.proposed as u64;
        self.accepted += outcome.accepted as u64;
        if self.decay < 1.0 {
            self.positions.iter_mut().for_each(|t| t.scale(self.decay));
            self.ranks.iter_mut().for_each(|t| t.scale(self.decay));
        }
        for (depth, trial) in outcome.trials.iter().enumerate() {
            if self.positions.len() <= depth {
                self.positions.resize(depth + 1, Tally::default());
            }
            self.positions[depth].add(trial.accepted_rank.is_some());
            for &rank in &trial.candidate_ranks {
                if trial.accepted_rank.is_some_and(|a| rank > a) {
                    break; // not tried: an earlier-ranked candidate was accepted
                }
                if self.ranks.len() <= rank {
                    self.ranks.resize(rank + 1, Tally::default());
                }
                self.ranks[rank].add(trial.accepted_rank == Some(rank));
            }
        }
        Ok(())
    }

    /// Forgets everything (same configuration).
    pub fn reset(&mut self) {
        *self = Self {
            decay: self.decay,
            prior_strength: self.prior_strength,
            pooled_prior: self.pooled_prior,
            ..Self::new()
        };
    }

    /// Total drafts proposed.
    pub fn proposed(&self) -> u64 {
        self.proposed
    }

    /// Total drafts accepted.
    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    /// Target passes observed (plain steps included).
    pub fn passes(&self) -> u64 {
        self.passes
    }

    /// Target passes that verified at least one draft.
    pub fn speculative_passes(&self) -> u64 {
        self.speculative_passes
    }

    /// Acceptance rate = accepted drafts / proposed drafts (`None` before any draft).
    pub fn acceptance_rate(&self) -> Option<f64> {
        (self.proposed > 0).then(|| self.accepted as f64 / self.proposed as f64)
    }

    /// Mean accepted length τ = (accepted drafts + 1) per target pass, over all passes
    /// (`None` before any pass).
    pub fn tau(&self) -> Option<f64> {
        (self.passes > 0).then(|| (self.accepted + self.passes) as f64 / self.passes as f64)
    }

    /// Weighted number of position trials observed (after decay), all positions together.
    pub fn position_trials(&self) -> f64 {
        self.positions.iter().map(|t| t.trials).sum()
    }

    /// Raw pooled conditional acceptance `S / T` over all tried positions, `None` if nothing was
    /// tried. This is the α̂ the disable rule compares with its threshold.
    pub fn pooled_alpha_raw(&self) -> Option<f64> {
        let (s, t) = self.pooled();
        (t > 0.0).then(|| s / t)
    }

    /// Smoothed pooled conditional acceptance `(S + n α₀) / (T + n)` with the pooled prior
    /// `(α₀, n)` ([`Self::set_pooled_prior`]; uniform: `(S + 1) / (T + 2)`, 0.5 before any
    /// data), in (0, 1).
    pub fn pooled_alpha(&self) -> f64 {
        let (s, t) = self.pooled();
        let (alpha, tries) = self.pooled_prior;
        (s + tries * alpha) / (t + tries)
    }

    pub(crate) fn pooled(&self) -> (f64, f64) {
        self.positions
            .iter()
            .fold((0.0, 0.0), |(s, t), p| (s + p.successes, t + p.trials))
    }

    /// Raw conditional acceptance at draft position `i` (0 = first draft): successes / trials
    /// counting only steps where position `i` was tried. `None` if it never was.
    pub fn position_alpha_raw(&self, i: usize) -> Option<f64> {
        self.positions
            .get(i)
            .filter(|t| t.trials > 0.0)
            .map(|t| t.successes / t.trials)
    }

    /// Smoothed conditional acceptance at draft position `i`, in (0, 1).
    pub fn position_alpha(&self, i: usize) -> f64 {
        let pooled = self.pooled_alpha();
        let t = self.positions.get(i).copied().unwrap_or_default();
        (t.successes + self.prior_strength * pooled)
            / (t.trials + self.prior_strength).max(f64::MIN_POSITIVE)
    }

    /// Smoothed conditional acceptances of positions `0..k`.
    pub fn position_alphas(&self, k: usize) -> Vec<f64> {
        (0..k).map(|i| self.position_alpha(i)).collect()
    }

    /// Raw acceptance of the rank-`r` candidate given it is tried; `None` if never tried.
    pub fn rank_alpha_raw(&self, r: usize) -> Option<f64> {
        self.ranks
            .get(r)
            .filter(|t| t.trials > 0.0)
            .map(|t| t.successes / t.trials)
    }

    /// Smoothed acceptance vector of ranks `0..n`: rank `r` is pulled towards the estimate of rank
    /// `r - 1` (towards the pooled position estimate for rank 0) with the prior strength.
    pub fn rank_alphas(&self, n: usize) -> Vec<f64> {
        let mut out = Vec::with_capacity(n);
        let mut prior = self.pooled_alpha();
        for r in 0..n {
            let t = self.ranks.get(r).copied().unwrap_or_default();
            let value = (t.successes + self.prior_strength * prior)
                / (t.trials + self.prior_strength).max(f64::MIN_POSITIVE);
            out.push(value);
            prior = value;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_rng::SplitMix;

    #[test]
    fn censored_positions_are_not_failures() {
        let mut stats = AcceptanceStats::new();
        // K = 3: accept 1 then reject; accept all 3.
        stats.observe(&StepOutcome::chain(3, 1).unwrap()).unwrap();
        stats.observe(&StepOutcome::chain(3, 3).unwrap()).unwrap();
        assert_eq!(stats.position_alpha_raw(0), Some(1.0));
        assert_eq!(stats.position_alpha_raw(1), Some(0.5));
        assert_eq!(stats.position_alpha_raw(2), Some(1.0)); // tried once (step 2), accepted
        assert_eq!(stats.acceptance_rate(), Some(4.0 / 6.0));
        assert_eq!(stats.tau(), Some((4.0 + 2.0) / 2.0));
        stats.observe(&StepOutcome::plain()).unwrap();
        assert_eq!(stats.tau(), Some((4.0 + 3.0) / 3.0));
        assert_eq!(stats.speculative_passes(), 2);
    }

    #[test]
    fn per_position_estimates_converge_under_censoring() {
        // Conditional acceptance 0.9, 0.6, 0.3 by position; chains of 3.
        let truth = [0.9, 0.6, 0.3];
        let mut rng = SplitMix::new(7);
        let mut stats = AcceptanceStats::new();
        for _ in 0..20_000 {
            let accepted = truth.iter().take_while(|&&a| rng.uniform() < a).count();
            stats
                .observe(&StepOutcome::chain(3, accepted).unwrap())
                .unwrap();
        }
        for (i, &a) in truth.iter().enumerate() {
            let est = stats.position_alpha_raw(i).unwrap();
            assert!((est - a).abs() < 0.02, "position {i}: {est} vs {a}");
        }
        // The naive rate is biased: E[accepted]/3 = (0.9 + 0.54 + 0.162) / 3 = 0.534.
        let naive = stats.acceptance_rate().unwrap();
        assert!((naive - 0.534).abs() < 0.02, "{naive}");
    }

    #[test]
    fn rank_vector_from_tree_trials() {
        use crate::policy::DepthTrial;
        let mut stats = AcceptanceStats::new();
        // Rank 1 accepted after rank 0 rejected; then all of ranks 0..3 rejected.
        let o1 = StepOutcome {
            proposed: 3,
            accepted: 1,
            trials: vec![DepthTrial {
                candidate_ranks: vec![0, 1, 2],
                accepted_rank: Some(1),
            }],
        };
        let o2 = StepOutcome {
            proposed: 3,
            accepted: 0,
            trials: vec![DepthTrial {
                candidate_ranks: vec![0, 1, 2],
                accepted_rank: None,
            }],
        };
        stats.observe(&o1).unwrap();
        stats.observe(&o2).unwrap();
        assert_eq!(stats.rank_alpha_raw(0), Some(0.0));
        assert_eq!(stats.rank_alpha_raw(1), Some(0.5));
        assert_eq!(stats.rank_alpha_raw(2), Some(0.0)); // tried only in o2
        assert_eq!(stats.position_alpha_raw(0), Some(0.5));
    }

    #[test]
    fn a_pooled_prior_weighs_the_first_tries_against_what_it_says() {
        let mut stats = AcceptanceStats::new();
        stats.observe(&StepOutcome::chain(4, 0).unwrap()).unwrap();
        // uniform: one rejected try gives (0 + 1) / (1 + 2)
        assert!((stats.pooled_alpha() - 1.0 / 3.0).abs() < 1e-12);
        stats.set_pooled_prior(0.8, 8.0).unwrap();
        assert!((stats.pooled_alpha() - 6.4 / 9.0).abs() < 1e-12);
        // position 0 (tried once, rejected) is pulled towards that, position 1 (never tried) is it
        assert!((stats.position_alpha(0) - 2.0 * (6.4 / 9.0) / 3.0).abs() < 1e-12);
        assert!((stats.position_alpha(1) - 6.4 / 9.0).abs() < 1e-12);
        // kept by reset, refused out of range (unchanged then), cleared back to uniform
        stats.reset();
        assert!((stats.pooled_alpha() - 0.8).abs() < 1e-12);
        for (alpha, tries) in [
            (0.0, 8.0),
            (1.0, 8.0),
            (f64::NAN, 8.0),
            (0.5, 0.0),
            (0.5, -1.0),
        ] {
            assert!(
                stats.set_pooled_prior(alpha, tries).is_err(),
                "{alpha}, {tries}"
            );
        }
        assert!(stats.set_pooled_prior(0.5, f64::INFINITY).is_err());
        assert!((stats.pooled_alpha() - 0.8).abs() < 1e-12);
        stats.clear_pooled_prior();
        assert_eq!(stats.pooled_alpha(), 0.5);
    }

    #[test]
    fn decay_and_smoothing() {
        let mut stats = AcceptanceStats::new().with_decay(0.5).unwrap();
        assert_eq!(stats.pooled_alpha(), 0.5);
        assert_eq!(stats.position_alpha(4), 0.5);
        stats.observe(&StepOutcome::chain(1, 0).unwrap()).unwrap();
        stats.observe(&StepOutcome::chain(1, 1).unwrap()).unwrap();
        // weights: old trial 0.5 (failed), new 1 (accepted)
        assert!((stats.pooled_alpha_raw().unwrap() - 1.0 / 1.5).abs() < 1e-12);
        assert!(AcceptanceStats::new().with_decay(0.0).is_err());
        assert!(AcceptanceStats::new().with_prior_strength(-1.0).is_err());
        let all = StepOutcome::chain(2, 2).unwrap();
        let mut s = AcceptanceStats::new();
        for _ in 0..1000 {
            s.observe(&all).unwrap();
        }
        let a = s.position_alpha(1);
        assert!(a > 0.99 && a < 1.0, "{a}");
        s.reset();
        assert_eq!(s.passes(), 0);
    }
}
