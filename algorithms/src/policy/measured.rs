//! Costs measured at run time: what the engine's timings say a step of each size costs.
//!
//! The engine reports, after every step of a sequence, a [`StepTiming`] (seconds spent drafting,
//! in the target forward and in verify + commit; and, on the first step, the prompt prefill).
//! [`LiveCosts`] keeps a short window of recent samples per quantity and answers with medians
//! (robust to the spikes a shared machine produces):
//!
//! - **plain step**: total seconds of steps that drafted nothing;
//! - **target forward over `n` tokens**: `target_s` of steps whose tree had `n` nodes (root
//!   included); `n = 1` comes from plain steps. Between measured sizes the curve is interpolated;
//!   beyond the largest one it runs along the chord to the prompt-prefill point (`P` tokens in
//!   `prefill_s`), which never overstates a concave cost curve, so unmeasured sizes look at least
//!   as cheap as they are and get tried. A size this sequence has not measured yet but earlier
//!   sequences of the same method did (or a curve timed at set-up) comes from their relative
//!   cost (`t(n) / t(1)`, see [`LiveCosts::with_verify_prior`]) times this sequence's `t(1)`:
//!   the real curve on a CPU is flat for a few tokens, then steep, which the chord overstates
//!   at small `n`;
//! - **draft pass**: `draft_s / passes` of *steady* speculative steps (the drafter was in sync:
//!   at most two tokens arrived since it last drafted), else a prior given at construction (a
//!   one-token forward the backend timed), else unknown;
//! - **catch-up per token**: a model drafter that sat out plain steps must first forward the
//!   tokens it missed (the whole prompt before its first draft). Measured on the first
//!   speculative step after a pause, as (draft time − steady draft time) / missed tokens; before
//!   any such step it is estimated as the target's prefill time per token scaled by the draft /
//!   target pass ratio.
//!
//! [`LiveCosts::cost_model`] turns these into the relative [`CostModel`] the policy optimises,
//! [`LiveCosts::switch_cost`] prices the catch-up a speculative step would pay now, and
//! [`LiveCosts::cost_model_under_load`] prices a step in a batch by the [`ForwardCurve`] all
//! sequences share (its shape timed at set-up, its level live).

use std::collections::VecDeque;

use crate::error::{ensure_param, Result};
use crate::policy::{CostCurve, CostModel, StepOutcome};

/// Timings of one engine step of one sequence, in seconds, as the engine measured them.
///
/// With several sequences in one batch, `target_s` is the time of the shared forward.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTiming {
    /// Draft passes (depth of the draft tree; 0 for a plain step).
    pub draft_passes: usize,
    /// Seconds the drafter spent proposing (its catch-up included).
    pub draft_s: f64,
    /// Seconds of the target forward attributed to this sequence: all of it at batch size 1;
    /// when sequences share the forward, its time × this sequence's share of its tokens (the
    /// engine divides it, so a policy sees its own cost, not the batch's).
    pub target_s: f64,
    /// Seconds of verification and KV commit/rewind.
    pub other_s: f64,
    /// Prompt tokens prefilled (in one target forward) before this step: the first step of a
    /// sequence only, 0 otherwise.
    pub prefill_tokens: usize,
    /// Seconds of that prefill (0 when `prefill_tokens` is 0).
    pub prefill_s: f64,
    /// Tokens the sequence may still generate after this step, when the engine knows.
    pub remaining_tokens: Option<usize>,
    /// Tokens in the whole shared target forward (every sequence of the batch; this
    /// sequence's tree alone at batch size 1); 0 when not reported.
    pub forward_tokens: usize,
    /// Seconds of that whole forward (`target_s` is this sequence's share of it).
    pub forward_s: f64,
    /// Forwards the prompt prefill took (chunks of at most a fixed size); 0 when
    /// `prefill_tokens` is 0.
    pub prefill_forwards: usize,
}

/// What a batch's decoding forward costs by the tokens in it, all sequences together: the
/// median of recent samples per size, linear between measured sizes and, beyond the largest,
/// never flatter than it was (see [`ForwardCurve::seconds`]). Shared by every sequence of a
/// method (one machine, one model), it is what prices speculation under load: at batch size
/// `B`, a sequence drafting `K` shares a forward of about `B·(K + 1)` tokens instead of `B`.
///
/// Given a **shape** timed at set-up ([`ForwardCurve::with_shape`]: `t(n) / t(1)` at sizes up
/// to the largest batch's largest tree), the load pricing takes the curve's shape from it and
/// only its level from the live medians. Live samples alone cannot give the slope under load:
/// a full batch forwards nearly always the same size, the few other sizes are sampled minutes
/// apart while contexts grow and the host's speed drifts by a third, so neighbouring medians
/// differ by more than the slope between them (measured: 15.7 ms at 8 tokens, 11.1 ms at 9).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForwardCurve {
    sizes: std::collections::BTreeMap<usize, Window>,
    /// `(tokens, t(n) / t(1))` timed at set-up, sizes ascending from 1; empty when not given.
    shape: Vec<(usize, f64)>,
}

/// Samples kept per forward size.
const FORWARD_WINDOW: usize = 9;

impl ForwardCurve {
    /// Records one forward of `tokens` tokens that took `seconds` (ignored when `tokens` is 0 or
    /// `seconds` is not a positive finite number).
    pub fn record(&mut self, tokens: usize, seconds: f64) {
        if tokens == 0 || !(seconds.is_finite() && seconds > 0.0) {
            return;
        }
        self.sizes
            .entry(tokens)
            .or_default()
            .push(seconds, FORWARD_WINDOW);
    }

    /// Records the shared forward of one step. A prompt's prefill forwards are left out: one
    /// sequence's prompt costs far less per token than as many tokens spread over a batch's
    /// sequences (each with its own context), so pricing drafts by it would make extra tokens
    /// look cheap under load.
    pub fn record_step(&mut self, timing: &StepTiming) {
        self.record(timing.forward_tokens, timing.forward_s);
    }

    /// The relative forward costs `points` = `(n, t(n) / t(1))` timed at set-up (sizes
    /// ascending from 1) as the curve's shape under load.
    ///
    /// # Errors
    /// [`crate::AlgorithmError::InvalidParameter`] (named `verify_curve`) unless the sizes
    /// ascend from 1 and every ratio is finite and positive.
    pub fn with_shape(mut self, points: &[(usize, f64)]) -> Result<Self> {
        ensure_param(
            points.first().is_some_and(|&(n, _)| n == 1)
                && points.windows(2).all(|w| w[0].0 < w[1].0),
            "verify_curve",
            "sizes must ascend from 1",
        )?;
        ensure_param(
            points.iter().all(|(_, r)| r.is_finite() && *r > 0.0),
            "verify_curve",
            "every t(n) / t(1) must be finite and positive",
        )?;
        self.shape = points.to_vec();
        Ok(self)
    }

    /// Sizes measured.
    pub fn sizes(&self) -> usize {
        self.sizes.len()
    }

    /// Seconds of a batch forward of `tokens` tokens for load pricing at `sequences` sequences:
    /// with a shape, the shape at `tokens` scaled to the live median of the measured size
    /// nearest to `sequences` (`None` before any size was measured); without one, `medians`
    /// interpolated ([`ForwardCurve::seconds`]).
    fn priced(&self, medians: &[(usize, f64)], sequences: usize, tokens: usize) -> Option<f64> {
        if self.shape.is_empty() {
            return interpolate(medians, tokens);
        }
        let &(anchor, seconds) = medians
            .iter()
            .min_by_key(|(n, _)| (n.abs_diff(sequences), usize::MAX - n))?;
        let level = seconds / interpolate(&self.shape, anchor)?;
        Some(level * interpolate(&self.shape, tokens)?)
    }

    /// Seconds of a forward of `tokens` tokens: the median where measured, linear between
    /// measured sizes, the smallest size's time below them; beyond the largest, rising by the
    /// steeper of the last segment and the chord from the smallest size (a batch's forward grows
    /// at least as steeply with its tokens as it did from the smallest size on, so two noisy
    /// neighbours never make extra tokens look free); `None` with fewer than two sizes measured
    /// (no slope) unless `tokens` itself was.
    pub fn seconds(&self, tokens: usize) -> Option<f64> {
        interpolate(&self.medians(), tokens)
    }

    /// `(size, median seconds)` of every measured size, sizes ascending.
    fn medians(&self) -> Vec<(usize, f64)> {
        self.sizes
            .iter()
            .filter_map(|(&n, w)| Some((n, w.median()?)))
            .collect()
    }
}

/// [`ForwardCurve::seconds`] over its medians `points` (sizes ascending).
fn interpolate(points: &[(usize, f64)], tokens: usize) -> Option<f64> {
    if let Some(&(_, t)) = points.iter().find(|(n, _)| *n == tokens) {
        return Some(t);
    }
    if points.len() < 2 {
        return None;
    }
    let (first, last) = (points[0], points[points.len() - 1]);
    if tokens < first.0 {
        return Some(first.1);
    }
    let ((n0, t0), (n1, t1)) = match points.windows(2).find(|w| tokens < w[1].0) {
        Some(w) => (w[0], w[1]),
        None => (points[points.len() - 2], last),
    };
    let segment = ((t1 - t0) / (n1 - n0) as f64).max(0.0);
    if tokens < last.0 {
        return Some(t0 + segment * (tokens - n0) as f64);
    }
    let chord = ((last.1 - first.1) / (last.0 - first.0) as f64).max(0.0);
    Some(last.1 + segment.max(chord) * (tokens - last.0) as f64)
}

/// A short window of recent samples with a median.
#[derive(Debug, Clone, Default, PartialEq)]
struct Window {
    samples: VecDeque<f64>,
}

impl Window {
    fn push(&mut self, value: f64, limit: usize) {
        if !value.is_finite() || value < 0.0 {
            return;
        }
        self.samples.push_back(value);
        while self.samples.len() > limit {
            self.samples.pop_front();
        }
    }

    fn median(&self) -> Option<f64> {
        if self.samples.is_empty() {
            return None;
        }
        let mut sorted: Vec<f64> = self.samples.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        let mid = sorted.len() / 2;
        Some(if sorted.len() % 2 == 1 {
            sorted[mid]
        } else {
            0.5 * (sorted[mid - 1] + sorted[mid])
        })
    }
}

/// Tokens that may arrive between two drafts with the drafter still counted as in sync (the
/// bonus token after a fully accepted chain, and the last draft it never forwarded).
const IN_SYNC_TOKENS: usize = 2;

/// Run-time cost estimates of one sequence (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct LiveCosts {
    window: usize,
    plain: Window,
    target: Vec<Window>,
    draft_pass: Window,
    draft_pass_prior_s: Option<f64>,
    catch_up: Window,
    prefill: Option<(usize, f64)>,
    unsynced: usize,
    remaining: Option<usize>,
    per_node: bool,
    /// `verify_prior[n - 1]`: an earlier sequence's `t(n) / t(1)`, for sizes not measured here.
    verify_prior: Vec<Option<f64>>,
}

impl LiveCosts {
    /// No measurements yet; `draft_pass_prior_s` is the drafter's one-pass time if the caller
    /// timed it (used until steady speculative steps measure it), windows of 9 samples.
    pub fn new(draft_pass_prior_s: Option<f64>) -> Self {
        Self {
            window: 9,
            plain: Window::default(),
            target: Vec::new(),
            draft_pass: Window::default(),
            draft_pass_prior_s: draft_pass_prior_s.filter(|s| s.is_finite() && *s >= 0.0),
            catch_up: Window::default(),
            prefill: None,
            unsynced: 0,
            remaining: None,
            per_node: false,
            verify_prior: Vec::new(),
        }
    }

    /// The steady draft-pass time measured so far (the median of the window), if any: what a
    /// later sequence of the same drafter can start from.
    pub fn measured_draft_pass_s(&self) -> Option<f64> {
        self.draft_pass.median()
    }

    /// Replaces the prior one-pass time (e.g. by what earlier sequences measured).
    pub fn with_draft_pass_prior(mut self, seconds: f64) -> Self {
        if seconds.is_finite() && seconds >= 0.0 {
            self.draft_pass_prior_s = Some(seconds);
        }
        self
    }

    /// The relative cost `t(n) / t(1)` of every target-forward size this sequence measured
    /// (`None` where it did not), index `n - 1`: what a later sequence can start from.
    pub fn relative_target_costs(&self) -> Vec<Option<f64>> {
        let Some(t1) = self.target_s(1).filter(|t| *t > 0.0) else {
            return Vec::new();
        };
        (1..=self.target.len())
            .map(|n| self.target_s(n).map(|t| t / t1))
            .collect()
    }

    /// Starts from earlier sequences' relative target-forward costs (`ratios[n - 1]` =
    /// `t(n) / t(1)`, as [`Self::relative_target_costs`] gives them), used for the sizes this
    /// sequence has not measured itself. Non-finite or non-positive ratios are ignored.
    pub fn with_verify_prior(mut self, ratios: Vec<Option<f64>>) -> Self {
        self.verify_prior = ratios
            .into_iter()
            .map(|r| r.filter(|r| r.is_finite() && *r > 0.0))
            .collect();
        self
    }

    /// Counts the draft cost per drafted node instead of per pass (tree drafters that forward
    /// each expanded node on its own); the "pass" figures then mean one node.
    pub fn per_node(mut self, per_node: bool) -> Self {
        self.per_node = per_node;
        self
    }

    /// Records one step: its outcome (what was proposed and accepted) and its timings.
    pub fn record(&mut self, outcome: &StepOutcome, timing: &StepTiming) {
        let limit = self.window;
        if timing.prefill_tokens > 0 {
            self.prefill = Some((timing.prefill_tokens, timing.prefill_s));
            // The prompt (prefill + the root token) is unseen by any drafter with a memory.
            self.unsynced = timing.prefill_tokens + 1;
        }
        self.remaining = timing.remaining_tokens;
        let n = outcome.proposed + 1;
        if self.target.len() < n {
            self.target.resize(n, Window::default());
        }
        self.target[n - 1].push(timing.target_s, limit);
        if outcome.proposed == 0 {
            self.plain
                .push(timing.draft_s + timing.target_s + timing.other_s, limit);
            self.unsynced += 1;
            return;
        }
        let passes = if self.per_node {
            outcome.proposed
        } else {
            timing.draft_passes.max(1)
        };
        if self.unsynced <= IN_SYNC_TOKENS {
            self.draft_pass.push(timing.draft_s / passes as f64, limit);
        } else {
            let steady = self.draft_pass_s().unwrap_or(0.0) * passes as f64;
            let per_token = (timing.draft_s - steady).max(0.0) / self.unsynced as f64;
            self.catch_up.push(per_token, limit);
        }
        // The drafter now holds the context up to its first rejected draft: the next step
        // brings it the correction (or bonus) token.
        self.unsynced = 1;
    }

    /// Records that `emitted` tokens arrived in a step another drafter drove: this drafter has
    /// not seen them (they add to its catch-up), and `remaining_tokens` may still be generated.
    pub fn skip(&mut self, emitted: usize, remaining_tokens: Option<usize>) {
        self.unsynced += emitted;
        if remaining_tokens.is_some() {
            self.remaining = remaining_tokens;
        }
    }

    /// Median seconds of a plain step, `None` before the first one.
    pub fn plain_s(&self) -> Option<f64> {
        self.plain.median()
    }

    /// Median seconds of a target forward over `n` tokens of this sequence, if measured.
    pub fn target_s(&self, n: usize) -> Option<f64> {
        self.target.get(n.checked_sub(1)?)?.median()
    }

    /// Seconds of one steady draft pass (one node with [`LiveCosts::per_node`]): measured, else
    /// the prior, else `None`.
    pub fn draft_pass_s(&self) -> Option<f64> {
        self.draft_pass.median().or(self.draft_pass_prior_s)
    }

    /// Seconds per missed token a drafter pays to catch up (see the module docs), if known.
    pub fn catch_up_s_per_token(&self) -> Option<f64> {
        if let Some(measured) = self.catch_up.median() {
            return Some(measured);
        }
        let pass = self.draft_pass_s()?;
        match (self.prefill, self.target_s(1)) {
            (Some((tokens, seconds)), Some(t1)) if tokens > 1 && t1 > 0.0 => {
                Some(seconds / tokens as f64 * pass / t1)
            }
            _ => Some(pass),
        }
    }

    /// Tokens the drafter has not seen yet (its catch-up before the next draft).
    pub fn unsynced_tokens(&self) -> usize {
        self.unsynced
    }

    /// Tokens the sequence may still generate, as the engine last reported.
    pub fn remaining_tokens(&self) -> Option<usize> {
        self.remaining
    }

    /// The catch-up a speculative step taken now would pay first, relative to one plain target
    /// forward (0 when the drafter is in sync or catching up is free).
    pub fn switch_cost(&self) -> f64 {
        if self.unsynced <= IN_SYNC_TOKENS {
            return 0.0;
        }
        match (self.catch_up_s_per_token(), self.target_s(1)) {
            (Some(per_token), Some(t1)) if t1 > 0.0 => per_token * self.unsynced as f64 / t1,
            _ => 0.0,
        }
    }

    /// The relative cost model of this sequence under a batch of `sequences` (≥ 2) from the
    /// shared `forward` curve, for trees of up to `max_tokens` tokens (root included): a
    /// sequence's plain step costs its share `c(B) / B` of a forward of `B` tokens, a step
    /// with an `n`-token tree `c(B·n) / B` (every sequence assumed to draft alike), and a draft
    /// pass its own measured time, so the budget shrinks as the batch grows and the forward
    /// stops being flat. With a shape timed at set-up, `c` is that shape scaled to the live
    /// forward nearest `B` tokens ([`ForwardCurve::with_shape`]). `None` when the curve cannot
    /// price `c(B)` and `c(B·n)` yet or the draft cost is unknown: then [`Self::cost_model`]
    /// decides.
    pub fn cost_model_under_load(
        &self,
        sequences: usize,
        forward: &ForwardCurve,
        max_tokens: usize,
    ) -> Option<CostModel> {
        let least_sizes = if forward.shape.is_empty() { 2 } else { 1 };
        if sequences < 2 || forward.sizes() < least_sizes {
            return None;
        }
        // the medians once, not once per size asked for
        let medians = forward.medians();
        let share = |n: usize| {
            forward
                .priced(&medians, sequences, sequences * n)
                .map(|t| t / sequences as f64)
        };
        let t1 = share(1).filter(|t| *t > 0.0)?;
        let mut points = vec![(1, t1)];
        let mut last = t1;
        for n in 2..=max_tokens.max(2) {
            // a curve is never cheaper for more tokens (noise in the medians aside)
            last = share(n)?.max(last);
            points.push((n, last));
        }
        self.model_from(&points)
    }

    /// The cost model of target-forward `points` (seconds by tree tokens, the first for one
    /// token: the plain step) and this sequence's draft cost, relative to the plain step.
    fn model_from(&self, points: &[(usize, f64)]) -> Option<CostModel> {
        let verify = CostCurve::from_measurements(points).ok()?;
        let draft = self.draft_pass_s()? / points.first()?.1;
        if self.per_node {
            CostModel::new(verify, 0.0, draft).ok()
        } else {
            CostModel::new(verify, draft, 0.0).ok()
        }
    }

    /// The relative cost model of the measurements (costs over one plain target forward), or
    /// `None` until a plain step and the draft pass cost are known.
    pub fn cost_model(&self) -> Option<CostModel> {
        let t1 = self.target_s(1).filter(|t| *t > 0.0)?;
        let mut points = vec![(1usize, t1)];
        for n in 2..=self.target.len().max(self.verify_prior.len()) {
            let prior = || {
                self.verify_prior
                    .get(n - 1)
                    .copied()
                    .flatten()
                    .map(|r| r * t1)
            };
            if let Some(t) = self.target_s(n).or_else(prior).filter(|t| *t > 0.0) {
                points.push((n, t));
            }
        }
        if let Some((tokens, seconds)) = self.prefill {
            let last = points.last().expect("n = 1 is there").0;
            if tokens > last && seconds > 0.0 {
                points.push((tokens, seconds));
            }
        }
        self.model_from(&points)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(target_s: f64) -> (StepOutcome, StepTiming) {
        (
            StepOutcome::plain(),
            StepTiming {
                target_s,
                ..StepTiming::default()
            },
        )
    }

    fn chain(k: usize, accepted: usize, draft_s: f64, target_s: f64) -> (StepOutcome, StepTiming) {
        (
            StepOutcome::chain(k, accepted).unwrap(),
            StepTiming {
                draft_passes: k,
                draft_s,
                target_s,
                ..StepTiming::default()
            },
        )
    }

    #[test]
    fn the_forward_curve_interpolates_extrapolates_and_leaves_prefill_out() {
        let mut curve = ForwardCurve::default();
        assert_eq!(curve.seconds(4), None);
        curve.record(4, 0.010);
        assert_eq!(curve.seconds(4), Some(0.010));
        assert_eq!(curve.seconds(8), None, "one size: no slope");
        // a prompt's prefill forwards are no decoding forwards: not recorded
        curve.record_step(&StepTiming {
            prefill_tokens: 1000,
            prefill_s: 0.5,
            prefill_forwards: 2,
            ..StepTiming::default()
        });
        assert_eq!(curve.sizes(), 1);
        assert_eq!(curve.seconds(500), None);
        curve.record_step(&StepTiming {
            forward_tokens: 12,
            forward_s: 0.018,
            ..StepTiming::default()
        });
        // between sizes, linear: 1 ms per token from 4 to 12
        assert!((curve.seconds(8).unwrap() - 0.014).abs() < 1e-12);
        // beyond the largest size along the last segment; below the smallest, flat
        assert!((curve.seconds(20).unwrap() - 0.026).abs() < 1e-12);
        assert_eq!(curve.seconds(1), Some(0.010));
        // a flat (noisy) last segment does not make more tokens free: the chord from the
        // smallest size (1 ms per token) is the least slope beyond the largest
        let mut noisy = curve.clone();
        noisy.record(13, 0.0179);
        let at_21 = noisy.seconds(21).unwrap();
        let chord = (0.0179 - 0.010) / 9.0;
        assert!((at_21 - (0.0179 + 8.0 * chord)).abs() < 1e-12, "{at_21}");
        // medians per size; nonsense ignored
        for s in [0.012, 0.5, f64::NAN, -1.0] {
            curve.record(4, s);
        }
        curve.record(0, 1.0);
        assert_eq!(curve.seconds(4), Some(0.012), "median of 0.010, 0.012, 0.5");
        assert_eq!(curve.sizes(), 2);
        // a sequence of a batch of 4 is priced from the shared curve: its plain share is
        // c(4) / 4, a 2-token tree c(8) / 4
        let mut live = LiveCosts::new(Some(0.0));
        let model = live.cost_model_under_load(4, &curve, 3).unwrap();
        let (c4, c8) = (curve.seconds(4).unwrap(), curve.seconds(8).unwrap());
        assert!((model.verify.cost(2) - c8 / c4).abs() < 1e-12);
        assert_eq!(model.draft_per_pass, 0.0);
        assert!(
            live.cost_model_under_load(1, &curve, 3).is_none(),
            "alone: own timings"
        );
        live = LiveCosts::new(None);
        assert!(
            live.cost_model_under_load(4, &curve, 3).is_none(),
            "draft cost unknown"
        );
    }

    #[test]
    fn medians_curve_and_prefill_chord() {
        let mut live = LiveCosts::new(None);
        assert!(live.cost_model().is_none());
        let (o, mut t) = plain(0.010);
        t.prefill_tokens = 99;
        t.prefill_s = 0.010 + 98.0 * 0.002; // chord slope 2 ms per token
        live.record(&o, &t);
        for s in [0.011, 0.5, 0.010] {
            let (o, t) = plain(s);
            live.record(&o, &t);
        }
        let median = live.plain_s().unwrap();
        assert!((median - 0.0105).abs() < 1e-12, "{median}"); // median of 4, the spike ignored
        assert_eq!(live.unsynced_tokens(), 100 + 4);
        // The draft pass is unknown: no model yet (an n-gram prior of 0 would give one).
        assert!(live.cost_model().is_none());
        let mut ngram = live.clone();
        ngram.draft_pass_prior_s = Some(0.0);
        let model = ngram.cost_model().unwrap();
        // t(1) = 10.5 ms; chord to (99, 206.5 ms): cost(5) = (10.5 + 4 · (196/98)) / 10.5.
        let want = (0.0105 + 4.0 * (0.206 - 0.0105) / 98.0) / 0.0105;
        assert!(
            (model.verify.cost(5) - want).abs() < 1e-9,
            "{}",
            model.verify.cost(5)
        );
        assert_eq!(model.draft_per_pass, 0.0);
    }

    #[test]
    fn earlier_sequences_relative_costs_fill_the_sizes_not_measured_here() {
        let mut first = LiveCosts::new(Some(0.0));
        for (o, t) in [
            plain(0.010),
            chain(3, 3, 0.0, 0.012),
            chain(1, 0, 0.0, 0.011),
        ] {
            first.record(&o, &t);
        }
        let ratios = first.relative_target_costs();
        assert_eq!(ratios.len(), 4);
        assert!((ratios[3].unwrap() - 1.2).abs() < 1e-12 && ratios[2].is_none());
        // A new sequence at a longer context: t(1) = 20 ms; n = 4 from the prior (1.2 · 20 ms),
        // n = 2 from its own measurement, and NaN ratios ignored.
        let mut later = LiveCosts::new(Some(0.0)).with_verify_prior(vec![
            Some(1.0),
            ratios[1],
            Some(f64::NAN),
            ratios[3],
        ]);
        let (o, t) = plain(0.020);
        later.record(&o, &t);
        let model = later.cost_model().unwrap();
        assert!(
            (model.verify.cost(4) - 1.2).abs() < 1e-12,
            "{}",
            model.verify.cost(4)
        );
        let (o, t) = chain(1, 1, 0.0, 0.030);
        later.record(&o, &t);
        let model = later.cost_model().unwrap();
        assert!((model.verify.cost(2) - 1.5).abs() < 1e-12);
        assert!(
            (model.verify.cost(4) - 1.2).abs() < 1e-12,
            "own points win, prior fills"
        );
        // A sequence without a plain step has no t(1), so nothing to share.
        let mut alone = LiveCosts::new(Some(0.0));
        alone.record(&o, &t);
        assert!(
            alone.relative_target_costs().is_empty(),
            "no plain step: no t(1)"
        );
    }

    #[test]
    fn steady_and_catch_up_draft_costs_are_told_apart() {
        let mut live = LiveCosts::new(Some(0.004));
        let (o, mut t) = plain(0.010);
        t.prefill_tokens = 49;
        t.prefill_s = 0.1;
        live.record(&o, &t);
        // Prior pass 4 ms; prefill 2.04 ms/token; catch-up prior scales by 4/10.
        let prior = live.catch_up_s_per_token().unwrap();
        assert!((prior - 0.1 / 49.0 * 0.4).abs() < 1e-12);
        assert!((live.switch_cost() - prior * 51.0 / 0.010).abs() < 1e-9);
        // First speculative step: 51 missed tokens + 2 passes of (prior) 4 ms.
        let (o, t) = chain(2, 1, 0.008 + 51.0 * 0.001, 0.013);
        live.record(&o, &t);
        assert!((live.catch_up_s_per_token().unwrap() - 0.001).abs() < 1e-12);
        assert_eq!(live.switch_cost(), 0.0, "in sync after drafting");
        // Steady steps measure the pass: 3 ms.
        for _ in 0..3 {
            let (o, t) = chain(2, 2, 0.006, 0.013);
            live.record(&o, &t);
        }
        assert_eq!(live.draft_pass_s(), Some(0.003));
        assert_eq!(live.target_s(3), Some(0.013));
        let model = live.cost_model().unwrap();
        assert!((model.draft_per_pass - 0.3).abs() < 1e-12);
        assert!((model.verify.cost(3) - 1.3).abs() < 1e-12);
        // Three plain steps later the drafter is out of sync again.
        for _ in 0..3 {
            let (o, t) = plain(0.010);
            live.record(&o, &t);
        }
        assert_eq!(live.unsynced_tokens(), 4);
        assert!((live.switch_cost() - 4.0 * 0.001 / 0.010).abs() < 1e-12);
    }
}
