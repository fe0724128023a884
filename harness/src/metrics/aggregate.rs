//! Per-configuration aggregates.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{t_interval, Interval, MethodRun, RequestRecord, StepRecord};
use crate::error::{HarnessError, Result};

/// Seconds per phase, summed over a configuration's steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeSplit {
    /// Drafting.
    pub draft_s: f64,
    /// Target forward passes.
    pub target_s: f64,
    /// Verification.
    pub verify_s: f64,
    /// KV commit/rewind.
    pub commit_s: f64,
    /// Everything else.
    pub overhead_s: f64,
}

impl TimeSplit {
    /// Sum of the phases.
    pub fn total_s(&self) -> f64 {
        self.draft_s + self.target_s + self.verify_s + self.commit_s + self.overhead_s
    }

    /// The phases as (label, seconds), in plotting order.
    pub fn parts(&self) -> [(&'static str, f64); 5] {
        [
            ("draft", self.draft_s),
            ("target", self.target_s),
            ("verify", self.verify_s),
            ("commit", self.commit_s),
            ("overhead", self.overhead_s),
        ]
    }
}

/// Everything tables and plots show about one configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MethodSummary {
    /// Method configuration name.
    pub method: String,
    /// `drafter / verifier / policy`.
    pub description: String,
    /// Whether this is the baseline.
    pub is_baseline: bool,
    /// Requests run.
    pub requests: usize,
    /// Σ generated tokens.
    pub generated_tokens: usize,
    /// Σ target passes.
    pub target_passes: usize,
    /// Seconds of the run ([`MethodRun::elapsed_s`]).
    pub elapsed_s: f64,
    /// Seconds of one-time set-up, not in `elapsed_s` ([`MethodRun::setup_s`]).
    #[serde(default)]
    pub setup_s: f64,
    /// generated_tokens / elapsed_s.
    pub tokens_per_s: f64,
    /// tokens_per_s / the baseline's tokens_per_s (the baseline itself: 1).
    pub speedup: f64,
    /// Per-prompt speedup (baseline seconds per token / this method's, same prompt), mean and
    /// 95 % t-interval over prompts; `None` when per-prompt times are missing.
    pub speedup_per_prompt: Option<Interval>,
    /// Σ accepted / Σ proposed; `None` when nothing was proposed (plain decoding).
    pub acceptance_rate: Option<f64>,
    /// τ: per-prompt (Σ accepted + passes) / passes, mean and 95 % t-interval over prompts.
    pub tau: Interval,
    /// Acceptance at depth d+1 (see [`acceptance_by_depth`]).
    pub acceptance_by_depth: Vec<f64>,
    /// Seconds per phase.
    pub time_split: TimeSplit,
    /// Largest KV block count of any request.
    pub kv_blocks_peak: usize,
    /// `(equal, compared)`: prompts whose generated text equals the baseline's on the same
    /// prompt, out of those where both texts are recorded (at temperature 0 every lossless
    /// method must give `equal == compared`); `None` when no text was recorded.
    #[serde(default)]
    pub matches_baseline: Option<(usize, usize)>,
}

/// Acceptance by depth: entry d (0-based) is, among steps that proposed a node at depth d+1 and
/// whose accepted path reached depth d, the fraction that also accepted depth d+1. For a chain with
/// i.i.d. acceptance α every entry estimates α. Trailing depths never reached are omitted.
pub fn acceptance_by_depth(steps: &[&StepRecord]) -> Vec<f64> {
    let max_depth = steps.iter().map(|s| s.draft_depth).max().unwrap_or(0);
    let mut out = Vec::new();
    for d in 1..=max_depth {
        let reached = steps
            .iter()
            .filter(|s| s.draft_depth >= d && s.accepted + 1 >= d)
            .count();
        let passed = steps.iter().filter(|s| s.accepted >= d).count();
        if reached == 0 {
            break;
        }
        out.push(passed as f64 / reached as f64);
    }
    out
}

/// Aggregates raw records into one summary per run, in the order of `runs`. Errors when there is
/// no baseline run, or when a run has no requests.
pub fn summarize(
    runs: &[MethodRun],
    requests: &[RequestRecord],
    steps: &[StepRecord],
) -> Result<Vec<MethodSummary>> {
    let baseline = runs
        .iter()
        .find(|r| r.is_baseline)
        .ok_or_else(|| HarnessError::Metrics("no baseline run to compare against".into()))?;
    let mut by_method: HashMap<&str, Vec<&RequestRecord>> = HashMap::new();
    for r in requests {
        by_method.entry(r.method.as_str()).or_default().push(r);
    }
    let mut steps_by_method: HashMap<&str, Vec<&StepRecord>> = HashMap::new();
    for s in steps {
        steps_by_method
            .entry(s.method.as_str())
            .or_default()
            .push(s);
    }
    let tokens_per_s = |run: &MethodRun| -> Result<f64> {
        let reqs = by_method.get(run.method.as_str()).ok_or_else(|| {
            HarnessError::Metrics(format!("method `{}` has no request records", run.method))
        })?;
        let tokens: usize = reqs.iter().map(|r| r.generated_tokens).sum();
        if run.elapsed_s <= 0.0 {
            return Err(HarnessError::Metrics(format!(
                "method `{}` reports elapsed {} s",
                run.method, run.elapsed_s
            )));
        }
        Ok(tokens as f64 / run.elapsed_s)
    };
    let baseline_tps = tokens_per_s(baseline)?;
    let baseline_spt: HashMap<usize, f64> = by_method[baseline.method.as_str()]
        .iter()
        .filter(|r| r.generated_tokens > 0)
        .map(|r| (r.request, r.elapsed_s / r.generated_tokens as f64))
        .collect();

    let baseline_text: HashMap<usize, &str> = by_method
        .get(baseline.method.as_str())
        .map(|reqs| {
            reqs.iter()
                .filter_map(|r| r.text.as_deref().map(|t| (r.request, t)))
                .collect()
        })
        .unwrap_or_default();
    let mut out = Vec::with_capacity(runs.len());
    for run in runs {
        let reqs = &by_method[run.method.as_str()];
        let tps = tokens_per_s(run)?;
        let taus: Vec<f64> = reqs.iter().filter_map(|r| r.tau()).collect();
        let tau = t_interval(&taus).ok_or_else(|| {
            HarnessError::Metrics(format!("method `{}` has no target passes", run.method))
        })?;
        let per_prompt: Vec<f64> = reqs
            .iter()
            .filter(|r| r.generated_tokens > 0 && r.elapsed_s > 0.0)
            .filter_map(|r| {
                baseline_spt
                    .get(&r.request)
                    .map(|b| b / (r.elapsed_s / r.generated_tokens as f64))
            })
            .collect();
        let proposed: usize = reqs.iter().map(|r| r.proposed).sum();
        let accepted: usize = reqs.iter().map(|r| r.accepted).sum();
        let sum = |f: fn(&RequestRecord) -> f64| reqs.iter().map(|r| f(r)).sum::<f64>();
        let method_steps = steps_by_method
            .get(run.method.as_str())
            .cloned()
            .unwrap_or_default();
        out.push(MethodSummary {
            method: run.method.clone(),
            description: run.description.clone(),
            is_baseline: run.is_baseline,
            requests: reqs.len(),
            generated_tokens: reqs.iter().map(|r| r.generated_tokens).sum(),
            target_passes: reqs.iter().map(|r| r.target_passes).sum(),
            elapsed_s: run.elapsed_s,
            setup_s: run.setup_s,
            tokens_per_s: tps,
            speedup: tps / baseline_tps,
            speedup_per_prompt: t_interval(&per_prompt),
            acceptance_rate: (proposed > 0).then(|| accepted as f64 / proposed as f64),
            tau,
            acceptance_by_depth: acceptance_by_depth(&method_steps),
            time_split: TimeSplit {
                draft_s: sum(|r| r.draft_s),
                target_s: sum(|r| r.target_s),
                verify_s: sum(|r| r.verify_s),
                commit_s: sum(|r| r.commit_s),
                overhead_s: sum(|r| r.overhead_s),
            },
            kv_blocks_peak: reqs.iter().map(|r| r.kv_blocks_peak).max().unwrap_or(0),
            matches_baseline: {
                let compared: Vec<bool> = reqs
                    .iter()
                    .filter_map(|r| {
                        let text = r.text.as_deref()?;
                        baseline_text.get(&r.request).map(|b| *b == text)
                    })
                    .collect();
                (!compared.is_empty())
                    .then(|| (compared.iter().filter(|&&e| e).count(), compared.len()))
            },
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(method: &str, request: usize, proposed: usize, accepted: usize) -> StepRecord {
        StepRecord {
            method: method.into(),
            request,
            step: 0,
            proposed,
            draft_depth: proposed,
            accepted,
            emitted: accepted + 1,
            draft_s: 0.1 * proposed as f64,
            target_s: 1.0,
            verify_s: 0.0,
            commit_s: 0.0,
            overhead_s: 0.0,
            kv_blocks: 1,
            batch: 1,
        }
    }

    fn request(method: &str, request: usize, steps: &[StepRecord]) -> RequestRecord {
        let elapsed: f64 = steps.iter().map(StepRecord::total_s).sum();
        RequestRecord::from_steps(method, request, "p", 8, elapsed, steps)
    }

    #[test]
    fn request_sums_and_tau() {
        let steps = [step("m", 0, 4, 4), step("m", 0, 4, 1), step("m", 0, 4, 0)];
        let r = request("m", 0, &steps);
        assert_eq!(r.generated_tokens, 5 + 2 + 1);
        assert_eq!(r.proposed, 12);
        assert_eq!(r.accepted, 5);
        assert_eq!(r.target_passes, 3);
        // τ = (5 + 3) / 3
        assert!((r.tau().unwrap() - 8.0 / 3.0).abs() < 1e-12);
        assert!((r.draft_s - 1.2).abs() < 1e-12);
        assert!((r.elapsed_s - 4.2).abs() < 1e-12);
    }

    #[test]
    fn depth_acceptance_counts_only_reached_depths() {
        // accepted 2 of 3, 0 of 3, 3 of 3.
        let s = [step("m", 0, 3, 2), step("m", 0, 3, 0), step("m", 0, 3, 3)];
        let refs: Vec<&StepRecord> = s.iter().collect();
        let by_depth = acceptance_by_depth(&refs);
        // depth 1: reached 3, passed 2; depth 2: reached 2, passed 2; depth 3: reached 2, passed 1.
        assert_eq!(by_depth, vec![2.0 / 3.0, 1.0, 0.5]);
        assert!(acceptance_by_depth(&[]).is_empty());
    }

    #[test]
    fn summary_speedup_and_acceptance() {
        let base0: Vec<_> = (0..4).map(|_| step("base", 0, 0, 0)).collect();
        let base1: Vec<_> = (0..4).map(|_| step("base", 1, 0, 0)).collect();
        let spec0 = vec![step("spec", 0, 2, 2), step("spec", 0, 2, 0)];
        let spec1 = vec![step("spec", 1, 2, 1), step("spec", 1, 2, 0)];
        let requests = vec![
            request("base", 0, &base0),
            request("base", 1, &base1),
            request("spec", 0, &spec0),
            request("spec", 1, &spec1),
        ];
        let runs = vec![
            MethodRun {
                method: "base".into(),
                description: "none".into(),
                is_baseline: true,
                elapsed_s: 8.0,
                setup_s: 0.0,
            },
            MethodRun {
                method: "spec".into(),
                description: "chain".into(),
                is_baseline: false,
                elapsed_s: 4.8,
                setup_s: 0.0,
            },
        ];
        let steps: Vec<StepRecord> = [base0, base1, spec0, spec1].concat();
        let s = summarize(&runs, &requests, &steps).unwrap();
        assert_eq!(s[0].speedup, 1.0);
        assert_eq!(s[0].acceptance_rate, None);
        assert_eq!(s[0].tau.mean, 1.0);
        // spec: 4 + 3 = 7 tokens in 4.8 s vs base 8 tokens in 8 s.
        assert_eq!(s[1].generated_tokens, 7);
        assert!((s[1].speedup - (7.0 / 4.8) / 1.0).abs() < 1e-12);
        assert_eq!(s[1].acceptance_rate, Some(3.0 / 8.0));
        // per-prompt τ: (2+2)/2 = 2 and (1+2)/2 = 1.5.
        assert!((s[1].tau.mean - 1.75).abs() < 1e-12);
        assert_eq!(s[1].tau.n, 2);
        // per-prompt speedup: prompt 0: 1.0 / (2.4/4) = 5/3; prompt 1: 1.0 / (2.4/3) = 1.25.
        let pp = s[1].speedup_per_prompt.unwrap();
        assert!((pp.mean - (5.0 / 3.0 + 1.25) / 2.0).abs() < 1e-12);
        assert!((s[1].time_split.draft_s - 0.8).abs() < 1e-12);
        assert!((s[1].time_split.target_s - 4.0).abs() < 1e-12);
        assert_eq!(s[1].acceptance_by_depth, vec![0.5, 0.5]);
    }

    #[test]
    fn summary_needs_a_baseline() {
        let runs = vec![MethodRun {
            method: "spec".into(),
            description: String::new(),
            is_baseline: false,
            elapsed_s: 1.0,
            setup_s: 0.0,
        }];
        let err = summarize(&runs, &[], &[]).unwrap_err();
        assert!(err.to_string().contains("baseline"));
    }
}
