//! Per-configuration aggregates.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::stats::{bootstrap, geometric_mean_interval, mean_interval, median, ratio_interval};
#[cfg(test)]
use super::OpSeconds;
use super::{Interval, MethodRun, RequestRecord, StepRecord};
use crate::error::{HarnessError, Result};

/// Seconds per phase, summed over a configuration's steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeSplit {
    /// Prompt prefill (admission), apart from decoding.
    #[serde(default)]
    pub prefill_s: f64,
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
    /// Sum of the decode phases (prefill excluded).
    pub fn decode_s(&self) -> f64 {
        self.draft_s + self.target_s + self.verify_s + self.commit_s + self.overhead_s
    }

    /// The decode phases as (label, seconds), in plotting order (prefill, apart, is not one).
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

/// Everything tables and plots show about one configuration. The statistics are defined in
/// [`crate::metrics`]; every interval is a percentile bootstrap over prompts
/// ([`super::bootstrap`]).
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
    /// Σ prefill seconds of the requests (in `elapsed_s`, not in decode).
    #[serde(default)]
    pub prefill_s: f64,
    /// Decode tokens/s: generated_tokens / (elapsed_s − prefill_s).
    pub tokens_per_s: f64,
    /// tokens_per_s / the baseline's tokens_per_s (the baseline itself: 1).
    pub speedup: f64,
    /// Time to first token (prefill + the first step), mean over prompts with its bootstrap
    /// interval, seconds.
    #[serde(default)]
    pub ttft_s: Option<Interval>,
    /// Time per output token after the first ([`RequestRecord::tpot_s`]), mean over prompts
    /// with its bootstrap interval, seconds.
    #[serde(default)]
    pub tpot_s: Option<Interval>,
    /// The same throughput ratio with its bootstrap interval over the prompts both ran (each
    /// request's decode seconds scaled so that a method's sum to its run's); `None`
    /// when no prompt has times for both.
    #[serde(default)]
    pub speedup_interval: Option<Interval>,
    /// Per-prompt speedup (baseline seconds per token / this method's, same prompt): geometric
    /// mean over prompts with its bootstrap interval; `None` when per-prompt times are missing.
    pub speedup_per_prompt: Option<Interval>,
    /// Σ accepted / Σ proposed; `None` when nothing was proposed (plain decoding).
    pub acceptance_rate: Option<f64>,
    /// The acceptance rate with its bootstrap interval over the prompts that proposed.
    #[serde(default)]
    pub acceptance_interval: Option<Interval>,
    /// τ: per-prompt (Σ accepted + passes) / passes, mean over prompts with its bootstrap
    /// interval.
    pub tau: Interval,
    /// Accepted-length histogram: entry a counts the steps that proposed drafts and accepted
    /// exactly a of them (empty for plain decoding).
    #[serde(default)]
    pub accepted_lengths: Vec<usize>,
    /// Acceptance by draft position, conditional and unconditional, with counts (see
    /// [`acceptance_by_depth`]).
    pub acceptance_by_depth: Vec<DepthAcceptance>,
    /// The target forward's median time by the tokens it verified, over the steps that ran
    /// alone (see [`pass_times`]); empty when none did.
    #[serde(default)]
    pub pass_times: Vec<PassTime>,
    /// The target forward's median op split by the tokens it verified, over the steps that ran
    /// alone and recorded one (`op_split = true`; see [`forward_ops`]); empty otherwise.
    #[serde(default)]
    pub forward_ops: Vec<ForwardOps>,
    /// Seconds per phase.
    pub time_split: TimeSplit,
    /// Largest KV block count of any request.
    pub kv_blocks_peak: usize,
    /// Decode tokens/s of each repeat of the schedule (`repeat = N`; empty for one run): the
    /// run-to-run spread.
    #[serde(default)]
    pub tokens_per_s_by_repeat: Vec<f64>,
    /// `(equal, compared)`: prompts whose generated text equals the baseline's on the same
    /// prompt, out of those where both texts are recorded (at temperature 0 every lossless
    /// method must give `equal == compared`); `None` when no text was recorded.
    #[serde(default)]
    pub matches_baseline: Option<(usize, usize)>,
}

/// Acceptance at one draft position (depth d ≥ 1), counted over steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DepthAcceptance {
    /// The position, 1-based (1 = the first draft token).
    pub depth: usize,
    /// Steps that proposed a node at depth d and whose accepted path reached depth d − 1.
    pub reached: usize,
    /// passed / reached: P(depth d accepted | depth d − 1 accepted, depth d proposed). For a
    /// chain with i.i.d. acceptance α it estimates α at every depth.
    pub conditional: f64,
    /// Steps that proposed a node at depth d.
    pub proposed: usize,
    /// passed / proposed: P(depth d accepted | depth d proposed), vLLM's per-position
    /// acceptance rate (α^d for the i.i.d. chain).
    pub unconditional: f64,
    /// Steps that accepted depth d (accepted length ≥ d).
    pub passed: usize,
}

/// Acceptance by depth d = 1, 2, … (see [`DepthAcceptance`]); trailing depths never proposed are
/// omitted.
pub fn acceptance_by_depth(steps: &[&StepRecord]) -> Vec<DepthAcceptance> {
    let max_depth = steps.iter().map(|s| s.draft_depth).max().unwrap_or(0);
    let mut out = Vec::new();
    for depth in 1..=max_depth {
        let at_depth = || steps.iter().filter(|s| s.draft_depth >= depth);
        let proposed = at_depth().count();
        let reached = at_depth().filter(|s| s.accepted + 1 >= depth).count();
        let passed = at_depth().filter(|s| s.accepted >= depth).count();
        if reached == 0 {
            break;
        }
        out.push(DepthAcceptance {
            depth,
            reached,
            conditional: passed as f64 / reached as f64,
            proposed,
            unconditional: passed as f64 / proposed as f64,
            passed,
        });
    }
    out
}

/// The target forwards of one size: the steps that ran alone (batch 1) and verified `tokens`
/// tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PassTime {
    /// Tokens in the forward: the step's root and its drafts (`proposed + 1`), ≥ 1.
    pub tokens: usize,
    /// Forwards of that size (≥ 1).
    pub passes: usize,
    /// Median seconds of one such forward (`target_s`; the prompt's prefill is not in it).
    pub median_s: f64,
}

/// The verify-cost curve as the run met it: for each forward size that occurs, the median
/// `target_s` of the steps of that size that ran alone (`batch == 1`), ascending by size.
/// Batched steps are left out: their `target_s` is a share of a forward over other sequences'
/// tokens too.
pub fn pass_times(steps: &[&StepRecord]) -> Vec<PassTime> {
    unbatched_by_size(steps.iter().copied())
        .into_iter()
        .map(|(tokens, steps)| {
            let seconds: Vec<f64> = steps.iter().map(|s| s.target_s).collect();
            PassTime {
                tokens,
                passes: steps.len(),
                median_s: median(&seconds).unwrap_or(f64::NAN),
            }
        })
        .collect()
}

/// `steps` that ran alone (`batch == 1`), grouped by forward size (`proposed + 1`).
fn unbatched_by_size<'s>(
    steps: impl Iterator<Item = &'s StepRecord>,
) -> BTreeMap<usize, Vec<&'s StepRecord>> {
    let mut by_tokens: BTreeMap<usize, Vec<&StepRecord>> = BTreeMap::new();
    for s in steps.filter(|s| s.batch == 1) {
        by_tokens.entry(s.proposed + 1).or_default().push(s);
    }
    by_tokens
}

/// `names` without repeats, in the order they first occur (the order ops first ran).
pub(crate) fn first_seen<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen: Vec<&str> = Vec::new();
    for name in names {
        if !seen.contains(&name) {
            seen.push(name);
        }
    }
    seen
}

/// One op's median seconds in the target forwards of one size ([`ForwardOps`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpMedian {
    /// The op's name ("qkv", "attention", "lm_head", ...).
    pub op: String,
    /// Median seconds over the forwards (0 in a forward that did not run the op).
    pub median_s: f64,
}

/// The op split of the target forwards of one size: the steps that ran alone (batch 1),
/// verified `tokens` tokens and recorded their ops ([`StepRecord::ops`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForwardOps {
    /// Tokens in the forward (`proposed + 1`).
    pub tokens: usize,
    /// Forwards of that size with an op split (≥ 1).
    pub passes: usize,
    /// Each op's median, in the order the ops first ran.
    pub ops: Vec<OpMedian>,
}

/// The op split of the target forward by size, as [`pass_times`] gives its time: for each size
/// among the unbatched steps that recorded ops, each op's median seconds, ascending by size.
pub fn forward_ops(steps: &[&StepRecord]) -> Vec<ForwardOps> {
    unbatched_by_size(steps.iter().copied().filter(|s| !s.ops.is_empty()))
        .into_iter()
        .map(|(tokens, steps)| {
            let names = first_seen(steps.iter().flat_map(|s| &s.ops).map(|o| o.op.as_str()));
            let ops = names
                .into_iter()
                .map(|name| {
                    let seconds: Vec<f64> = steps
                        .iter()
                        .map(|s| {
                            s.ops
                                .iter()
                                .find(|o| o.op == name)
                                .map_or(0.0, |o| o.seconds)
                        })
                        .collect();
                    OpMedian {
                        op: name.to_string(),
                        median_s: median(&seconds).unwrap_or(f64::NAN),
                    }
                })
                .collect();
            ForwardOps {
                tokens,
                passes: steps.len(),
                ops,
            }
        })
        .collect()
}

/// Accepted-length histogram (see [`MethodSummary::accepted_lengths`]).
pub fn accepted_lengths(steps: &[&StepRecord]) -> Vec<usize> {
    let mut counts = Vec::new();
    for s in steps.iter().filter(|s| s.proposed > 0) {
        if counts.len() <= s.accepted {
            counts.resize(s.accepted + 1, 0);
        }
        counts[s.accepted] += 1;
    }
    counts
}

/// One method's requests on one prompt, summed over repeats.
#[derive(Debug, Clone, Copy, Default)]
struct PromptTotals {
    tokens: usize,
    passes: usize,
    proposed: usize,
    accepted: usize,
    elapsed_s: f64,
}

impl PromptTotals {
    fn tau(&self) -> Option<f64> {
        (self.passes > 0).then(|| (self.accepted + self.passes) as f64 / self.passes as f64)
    }

    fn seconds_per_token(&self) -> Option<f64> {
        (self.tokens > 0 && self.elapsed_s > 0.0).then(|| self.elapsed_s / self.tokens as f64)
    }
}

/// Per prompt (request index, ascending) totals of one method's requests (`elapsed_s`: decode
/// seconds, the prefill left out).
fn per_prompt(reqs: &[&RequestRecord]) -> BTreeMap<usize, PromptTotals> {
    let mut out: BTreeMap<usize, PromptTotals> = BTreeMap::new();
    for r in reqs {
        let t = out.entry(r.request).or_default();
        t.tokens += r.generated_tokens;
        t.passes += r.target_passes;
        t.proposed += r.proposed;
        t.accepted += r.accepted;
        t.elapsed_s += r.decode_s();
    }
    out
}

/// The factor that makes a method's per-request decode seconds sum to its run's decode seconds
/// `run_decode_s` (1 when requests ran one at a time; below 1 when batched requests overlapped).
fn time_scale(prompts: &BTreeMap<usize, PromptTotals>, run_decode_s: f64) -> Option<f64> {
    let sum: f64 = prompts.values().map(|t| t.elapsed_s).sum();
    (sum > 0.0).then(|| run_decode_s / sum)
}

/// The throughput ratio of `method` over `baseline` with its bootstrap interval over the prompts
/// both ran, request seconds multiplied by each method's [`time_scale`] (`scales`: method's,
/// baseline's), so that on all of a run's prompts the ratio is the [`MethodSummary::speedup`].
fn speedup_interval(
    method: &BTreeMap<usize, PromptTotals>,
    baseline: &BTreeMap<usize, PromptTotals>,
    (cm, cb): (f64, f64),
) -> Option<Interval> {
    let pairs: Vec<(PromptTotals, PromptTotals)> = method
        .iter()
        .filter_map(|(i, m)| baseline.get(i).map(|b| (*m, *b)))
        .collect();
    bootstrap(pairs.len(), |idx| {
        let sum = |f: &dyn Fn(&(PromptTotals, PromptTotals)) -> f64| -> f64 {
            idx.iter().map(|&i| f(&pairs[i])).sum()
        };
        let (mt, ms) = (sum(&|p| p.0.tokens as f64), sum(&|p| p.0.elapsed_s) * cm);
        let (bt, bs) = (sum(&|p| p.1.tokens as f64), sum(&|p| p.1.elapsed_s) * cb);
        (mt > 0.0 && ms > 0.0 && bt > 0.0 && bs > 0.0).then(|| (mt / ms) / (bt / bs))
    })
}

/// One method on one category of prompts (MT-Bench, Spec-Bench): Spec-Bench's columns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CategorySummary {
    /// Method configuration name.
    pub method: String,
    /// The category (every turn of its questions).
    pub category: String,
    /// Mean accepted tokens τ over the category's prompts (per-prompt τ, repeats summed), with
    /// its bootstrap interval.
    pub tau: Interval,
    /// Decode throughput ratio over the baseline on the category's prompts, with its bootstrap
    /// interval (request seconds scaled as for [`MethodSummary::speedup_interval`]).
    pub speedup: Option<Interval>,
    /// Decode tokens/s on the category's prompts (scaled request seconds).
    pub tokens_per_s: f64,
}

/// Per-category summaries, categories in order of first appearance, methods in run order;
/// empty when no request has a category.
///
/// # Errors
/// As [`summarize`] (no baseline, a method without requests or decode time).
pub fn summarize_categories(
    runs: &[MethodRun],
    requests: &[RequestRecord],
) -> Result<Vec<CategorySummary>> {
    let mut categories: Vec<&str> = Vec::new();
    for r in requests {
        if let Some(c) = r.category.as_deref() {
            if !categories.contains(&c) {
                categories.push(c);
            }
        }
    }
    if categories.is_empty() {
        return Ok(Vec::new());
    }
    let baseline = runs
        .iter()
        .find(|r| r.is_baseline)
        .ok_or_else(|| HarnessError::Metrics("no baseline run to compare against".into()))?;
    let of = |method: &str, category: Option<&str>| -> Vec<&RequestRecord> {
        requests
            .iter()
            .filter(|r| {
                r.method == method && category.is_none_or(|c| r.category.as_deref() == Some(c))
            })
            .collect()
    };
    let scale = |run: &MethodRun| -> Result<f64> {
        let reqs = of(&run.method, None);
        let prefill: f64 = reqs.iter().map(|r| r.prefill_s).sum();
        time_scale(&per_prompt(&reqs), run.elapsed_s - prefill).ok_or_else(|| {
            HarnessError::Metrics(format!("method `{}` has no decode time", run.method))
        })
    };
    let baseline_scale = scale(baseline)?;
    let mut out = Vec::new();
    for category in categories {
        let baseline_prompts = per_prompt(&of(&baseline.method, Some(category)));
        for run in runs {
            let prompts = per_prompt(&of(&run.method, Some(category)));
            let taus: Vec<f64> = prompts.values().filter_map(PromptTotals::tau).collect();
            let Some(tau) = mean_interval(&taus) else {
                continue;
            };
            let c = scale(run)?;
            let tokens: usize = prompts.values().map(|t| t.tokens).sum();
            let seconds: f64 = prompts.values().map(|t| t.elapsed_s).sum::<f64>() * c;
            out.push(CategorySummary {
                method: run.method.clone(),
                category: category.to_string(),
                tau,
                speedup: speedup_interval(&prompts, &baseline_prompts, (c, baseline_scale)),
                tokens_per_s: if seconds > 0.0 {
                    tokens as f64 / seconds
                } else {
                    0.0
                },
            });
        }
    }
    Ok(out)
}

/// Decode tokens/s of each repeat of `run` (see [`MethodSummary::tokens_per_s_by_repeat`]);
/// empty for a single run or a repeat without decode time.
fn tokens_per_s_by_repeat(run: &MethodRun, reqs: &[&RequestRecord]) -> Vec<f64> {
    if run.repeat_elapsed_s.len() < 2 {
        return Vec::new();
    }
    let rates: Vec<f64> = run
        .repeat_elapsed_s
        .iter()
        .enumerate()
        .map(|(repeat, elapsed)| {
            let mine = reqs.iter().filter(|r| r.repeat == repeat);
            let tokens: usize = mine.clone().map(|r| r.generated_tokens).sum();
            let prefill: f64 = mine.map(|r| r.prefill_s).sum();
            tokens as f64 / (elapsed - prefill)
        })
        .collect();
    match rates.iter().all(|r| r.is_finite() && *r > 0.0) {
        true => rates,
        false => Vec::new(),
    }
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
    // (decode seconds, decode tokens/s) of a run
    let decode = |run: &MethodRun| -> Result<(f64, f64)> {
        let reqs = by_method.get(run.method.as_str()).ok_or_else(|| {
            HarnessError::Metrics(format!("method `{}` has no request records", run.method))
        })?;
        let tokens: usize = reqs.iter().map(|r| r.generated_tokens).sum();
        // the prompts' own prefill work: a batched request's prefill wall time also holds
        // the other requests' steps, which are decode time
        let prefill: f64 = match steps_by_method.get(run.method.as_str()) {
            Some(steps) => steps
                .iter()
                .map(|s| s.prefill_work_s.unwrap_or(s.prefill_s))
                .sum(),
            None => reqs.iter().map(|r| r.prefill_s).sum(),
        };
        let seconds = run.elapsed_s - prefill;
        if seconds <= 0.0 {
            return Err(HarnessError::Metrics(format!(
                "method `{}` reports elapsed {} s, of which {prefill} s prefill",
                run.method, run.elapsed_s
            )));
        }
        Ok((seconds, tokens as f64 / seconds))
    };
    let (baseline_decode_s, baseline_tps) = decode(baseline)?;
    let baseline_prompts = per_prompt(&by_method[baseline.method.as_str()]);

    let baseline_text: HashMap<(usize, usize), &str> = by_method
        .get(baseline.method.as_str())
        .map(|reqs| {
            reqs.iter()
                .filter_map(|r| r.text.as_deref().map(|t| ((r.request, r.repeat), t)))
                .collect()
        })
        .unwrap_or_default();
    let mut out = Vec::with_capacity(runs.len());
    for run in runs {
        let reqs = &by_method[run.method.as_str()];
        let (decode_s, tps) = decode(run)?;
        let ttfts: Vec<f64> = reqs
            .iter()
            .filter(|r| r.target_passes > 0)
            .map(|r| r.ttft_s)
            .collect();
        let tpots: Vec<f64> = reqs.iter().filter_map(|r| r.tpot_s()).collect();
        let prompts = per_prompt(reqs);
        let taus: Vec<f64> = prompts.values().filter_map(PromptTotals::tau).collect();
        let tau = mean_interval(&taus).ok_or_else(|| {
            HarnessError::Metrics(format!("method `{}` has no target passes", run.method))
        })?;
        let per_prompt_speedups: Vec<f64> = prompts
            .iter()
            .filter_map(|(i, t)| {
                let mine = t.seconds_per_token()?;
                baseline_prompts
                    .get(i)
                    .and_then(PromptTotals::seconds_per_token)
                    .map(|b| b / mine)
            })
            .collect();
        let drafting: Vec<&PromptTotals> = prompts.values().filter(|t| t.proposed > 0).collect();
        let accepted: Vec<f64> = drafting.iter().map(|t| t.accepted as f64).collect();
        let proposed: Vec<f64> = drafting.iter().map(|t| t.proposed as f64).collect();
        let acceptance_interval = ratio_interval(&accepted, &proposed);
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
            prefill_s: sum(|r| r.prefill_s),
            tokens_per_s: tps,
            speedup: tps / baseline_tps,
            ttft_s: mean_interval(&ttfts),
            tpot_s: mean_interval(&tpots),
            speedup_interval: time_scale(&prompts, decode_s)
                .zip(time_scale(&baseline_prompts, baseline_decode_s))
                .and_then(|scales| speedup_interval(&prompts, &baseline_prompts, scales)),
            speedup_per_prompt: geometric_mean_interval(&per_prompt_speedups),
            acceptance_rate: acceptance_interval.map(|i| i.mean),
            acceptance_interval,
            tau,
            accepted_lengths: accepted_lengths(&method_steps),
            acceptance_by_depth: acceptance_by_depth(&method_steps),
            pass_times: pass_times(&method_steps),
            forward_ops: forward_ops(&method_steps),
            time_split: TimeSplit {
                prefill_s: sum(|r| r.prefill_s),
                draft_s: sum(|r| r.draft_s),
                target_s: sum(|r| r.target_s),
                verify_s: sum(|r| r.verify_s),
                commit_s: sum(|r| r.commit_s),
                overhead_s: sum(|r| r.overhead_s),
            },
            kv_blocks_peak: reqs.iter().map(|r| r.kv_blocks_peak).max().unwrap_or(0),
            tokens_per_s_by_repeat: tokens_per_s_by_repeat(run, reqs),
            matches_baseline: {
                let compared: Vec<bool> = reqs
                    .iter()
                    .filter_map(|r| {
                        let text = r.text.as_deref()?;
                        baseline_text
                            .get(&(r.request, r.repeat))
                            .map(|b| *b == text)
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
            repeat: 0,
            proposed,
            draft_depth: proposed,
            accepted,
            emitted: accepted + 1,
            draft_s: 0.1 * proposed as f64,
            target_s: 1.0,
            verify_s: 0.0,
            commit_s: 0.0,
            overhead_s: 0.0,
            prefill_s: 0.0,
            prefill_work_s: None,
            kv_blocks: 1,
            batch: 1,
            drafter: "d".into(),
            decision: None,
            tokens: Vec::new(),
            ops: Vec::new(),
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
    fn pass_times_are_medians_by_forward_size_over_unbatched_steps() {
        let timed = |proposed: usize, target_s: f64, batch: usize| StepRecord {
            target_s,
            batch,
            ..step("m", 0, proposed, 0)
        };
        let s = [
            timed(0, 4.0, 1),
            timed(0, 6.0, 1),
            timed(2, 9.0, 1),
            timed(0, 5.0, 1),
            timed(2, 7.0, 1),
            // batched: a share of a shared forward, left out
            timed(0, 1.0, 2),
            timed(5, 1.0, 3),
        ];
        let refs: Vec<&StepRecord> = s.iter().collect();
        let got: Vec<(usize, usize, f64)> = pass_times(&refs)
            .iter()
            .map(|p| (p.tokens, p.passes, p.median_s))
            .collect();
        // one token: 4, 5, 6 -> 5; three tokens: 7, 9 -> 8 (the mean of the middle two)
        assert_eq!(got, vec![(1, 3, 5.0), (3, 2, 8.0)]);
        assert!(pass_times(&[]).is_empty());
        assert!(pass_times(&refs[5..]).is_empty());
    }

    #[test]
    fn forward_ops_are_each_ops_median_by_forward_size() {
        let split = |proposed: usize, ops: &[(&str, f64)], batch: usize| StepRecord {
            batch,
            ops: ops
                .iter()
                .map(|&(op, seconds)| OpSeconds {
                    op: op.into(),
                    seconds,
                })
                .collect(),
            ..step("m", 0, proposed, 0)
        };
        let s = [
            split(0, &[("qkv", 1.0), ("attention", 4.0)], 1),
            split(0, &[("qkv", 3.0), ("attention", 2.0)], 1),
            split(0, &[("qkv", 2.0), ("attention", 9.0)], 1),
            split(2, &[("qkv", 5.0), ("lm_head", 1.0)], 1),
            split(2, &[("qkv", 7.0)], 1),
            split(2, &[("qkv", 100.0)], 2), // batched: left out
            step("m", 0, 2, 0),             // no split recorded: left out
        ];
        let refs: Vec<&StepRecord> = s.iter().collect();
        type Split = (usize, usize, Vec<(String, f64)>);
        let got: Vec<Split> = forward_ops(&refs)
            .into_iter()
            .map(|f| {
                let ops = f.ops.into_iter().map(|o| (o.op, o.median_s)).collect();
                (f.tokens, f.passes, ops)
            })
            .collect();
        let ops = |v: &[(&str, f64)]| v.iter().map(|&(o, x)| (o.to_string(), x)).collect();
        assert_eq!(
            got,
            vec![
                (1, 3, ops(&[("qkv", 2.0), ("attention", 4.0)])),
                // an op a forward did not run counts 0 there
                (3, 2, ops(&[("qkv", 6.0), ("lm_head", 0.5)])),
            ]
        );
        assert!(forward_ops(&refs[5..]).is_empty());
    }

    #[test]
    fn depth_acceptance_counts_only_reached_depths() {
        // accepted 2 of 3, 0 of 3, 3 of 3.
        let s = [step("m", 0, 3, 2), step("m", 0, 3, 0), step("m", 0, 3, 3)];
        let refs: Vec<&StepRecord> = s.iter().collect();
        let by_depth = acceptance_by_depth(&refs);
        // depth 1: reached 3, passed 2; depth 2: reached 2, passed 2; depth 3: reached 2, passed 1.
        let conditional: Vec<f64> = by_depth.iter().map(|d| d.conditional).collect();
        assert_eq!(conditional, vec![2.0 / 3.0, 1.0, 0.5]);
        let counts: Vec<(usize, usize, usize)> = by_depth
            .iter()
            .map(|d| (d.reached, d.passed, d.proposed))
            .collect();
        assert_eq!(counts, vec![(3, 2, 3), (2, 2, 3), (2, 1, 3)]);
        // unconditional: passed / proposed = 2/3, 2/3, 1/3.
        let unconditional: Vec<f64> = by_depth.iter().map(|d| d.unconditional).collect();
        assert_eq!(unconditional, vec![2.0 / 3.0, 2.0 / 3.0, 1.0 / 3.0]);
        assert!(acceptance_by_depth(&[]).is_empty());
        // histogram: one step each at 0, 2 and 3 accepted; plain steps are not counted.
        let mut with_plain = s.to_vec();
        with_plain.push(step("m", 0, 0, 0));
        let refs: Vec<&StepRecord> = with_plain.iter().collect();
        assert_eq!(accepted_lengths(&refs), vec![1, 0, 1, 1]);
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
                repeat_elapsed_s: Vec::new(),
            },
            MethodRun {
                method: "spec".into(),
                description: "chain".into(),
                is_baseline: false,
                elapsed_s: 4.8,
                setup_s: 0.0,
                repeat_elapsed_s: Vec::new(),
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
        // per-prompt speedup: prompt 0: 1.0 / (2.4/4) = 5/3; prompt 1: 1.0 / (2.4/3) = 1.25;
        // their geometric mean, between them.
        let pp = s[1].speedup_per_prompt.unwrap();
        assert!((pp.mean - (5.0f64 / 3.0 * 1.25).sqrt()).abs() < 1e-12);
        assert!((pp.lo - 1.25).abs() < 1e-12 && (pp.hi - 5.0 / 3.0).abs() < 1e-12);
        // the throughput ratio's interval: on both prompts it is the speedup itself; the
        // resamples of one prompt twice give prompt 0's (4/2.4) and prompt 1's (3/2.4) ratio.
        let si = s[1].speedup_interval.unwrap();
        assert!((si.mean - s[1].speedup).abs() < 1e-12);
        assert!(
            (si.lo - 1.25).abs() < 1e-12 && (si.hi - 5.0 / 3.0).abs() < 1e-12,
            "{si:?}"
        );
        assert_eq!(si.n, 2);
        // acceptance: 2/4 and 1/4 per prompt, 3/8 pooled
        let ai = s[1].acceptance_interval.unwrap();
        assert_eq!((ai.lo, ai.mean, ai.hi), (0.25, 3.0 / 8.0, 0.5));
        assert_eq!(s[1].accepted_lengths, vec![2, 1, 1]);
        assert!((s[1].time_split.draft_s - 0.8).abs() < 1e-12);
        assert!((s[1].time_split.target_s - 4.0).abs() < 1e-12);
        let conditional: Vec<f64> = s[1]
            .acceptance_by_depth
            .iter()
            .map(|d| d.conditional)
            .collect();
        assert_eq!(conditional, vec![0.5, 0.5]);
    }

    #[test]
    fn prefill_is_apart_from_decode() {
        let mut first = step("m", 0, 0, 0);
        first.prefill_s = 2.0;
        let steps = [first, step("m", 0, 0, 0), step("m", 0, 0, 0)];
        let r = request("m", 0, &steps);
        // elapsed 2 + 3 × 1 s; TTFT = prefill + first step = 3 s; TPOT = (5 − 3) / (3 − 1).
        assert_eq!((r.elapsed_s, r.prefill_s, r.ttft_s), (5.0, 2.0, 3.0));
        assert_eq!(r.tpot_s(), Some(1.0));
        assert_eq!(r.decode_s(), 3.0);
        assert_eq!(r.tokens_per_s(), Some(1.0));
        let runs = [MethodRun {
            method: "m".into(),
            description: String::new(),
            is_baseline: true,
            elapsed_s: 5.0,
            setup_s: 0.0,
            repeat_elapsed_s: Vec::new(),
        }];
        let s = &summarize(&runs, &[r], &steps).unwrap()[0];
        // decode tokens/s: 3 tokens over 5 − 2 s
        assert_eq!(s.tokens_per_s, 1.0);
        assert_eq!(s.prefill_s, 2.0);
        assert_eq!(s.time_split.prefill_s, 2.0);
        assert_eq!(s.time_split.decode_s(), 3.0);
        assert_eq!(s.ttft_s.unwrap().mean, 3.0);
        assert_eq!(s.tpot_s.unwrap().mean, 1.0);
        // plain steps: no histogram, no depths
        assert!(s.accepted_lengths.is_empty() && s.acceptance_by_depth.is_empty());
    }

    #[test]
    fn a_batched_runs_decode_time_leaves_out_only_the_prompts_own_prefill_work() {
        // two requests in one batch: each waited 2 s for its prompt to be in (its chunks and
        // the other's steps in between), of which 0.5 s forwarding its own chunks; the run
        // took 4 s in all, so 3 s of it decoded their 3 + 3 tokens
        let steps_of = |request| {
            let mut first = step("m", request, 0, 0);
            (first.prefill_s, first.prefill_work_s) = (2.0, Some(0.5));
            vec![first, step("m", request, 0, 0), step("m", request, 0, 0)]
        };
        let steps: Vec<StepRecord> = [steps_of(0), steps_of(1)].concat();
        let requests = [request("m", 0, &steps[..3]), request("m", 1, &steps[3..])];
        let runs = [MethodRun {
            method: "m".into(),
            description: String::new(),
            is_baseline: true,
            elapsed_s: 4.0,
            setup_s: 0.0,
            repeat_elapsed_s: Vec::new(),
        }];
        let s = &summarize(&runs, &requests, &steps).unwrap()[0];
        assert_eq!(s.tokens_per_s, 2.0);
        // records without the work figure fall back to the wall time (equal unbatched)
        let old: Vec<StepRecord> = steps
            .iter()
            .cloned()
            .map(|mut s| {
                s.prefill_work_s = None;
                s
            })
            .collect();
        let err = summarize(&runs, &requests, &old).unwrap_err().to_string();
        assert!(err.contains("of which 4 s prefill"), "{err}");
    }

    #[test]
    fn repeats_are_summed_per_prompt_and_spread_by_repeat() {
        // one prompt, run twice: 2 tokens in 2 s, then 2 tokens in 4 s
        let mut second = vec![step("m", 0, 0, 0), step("m", 0, 0, 0)];
        for s in &mut second {
            s.repeat = 1;
            s.target_s = 2.0;
        }
        let first = vec![step("m", 0, 0, 0), step("m", 0, 0, 0)];
        let requests = [request("m", 0, &first), request("m", 0, &second)];
        assert_eq!(requests[1].repeat, 1);
        let runs = [MethodRun {
            method: "m".into(),
            description: String::new(),
            is_baseline: true,
            elapsed_s: 6.0,
            setup_s: 0.0,
            repeat_elapsed_s: vec![2.0, 4.0],
        }];
        let steps = [first, second].concat();
        let s = &summarize(&runs, &requests, &steps).unwrap()[0];
        assert_eq!(s.tokens_per_s_by_repeat, vec![1.0, 0.5]);
        // the prompt is the unit: τ over one prompt, both repeats summed into it
        assert_eq!(s.tau.n, 1);
        assert_eq!(s.requests, 2);
    }

    #[test]
    fn categories_split_the_prompts() {
        let base: Vec<_> = (0..2)
            .map(|i| (0..4).map(|_| step("base", i, 0, 0)).collect::<Vec<_>>())
            .collect();
        let spec = [
            vec![step("spec", 0, 2, 2), step("spec", 0, 2, 0)],
            vec![step("spec", 1, 2, 1), step("spec", 1, 2, 0)],
        ];
        let mut requests = Vec::new();
        for (i, (b, s)) in base.iter().zip(&spec).enumerate() {
            for mut r in [request("base", i, b), request("spec", i, s)] {
                r.category = Some(["writing", "math"][i].into());
                requests.push(r);
            }
        }
        let run = |method: &str, baseline: bool, elapsed_s: f64| MethodRun {
            method: method.into(),
            description: String::new(),
            is_baseline: baseline,
            elapsed_s,
            setup_s: 0.0,
            repeat_elapsed_s: Vec::new(),
        };
        let runs = [run("base", true, 8.0), run("spec", false, 4.8)];
        let c = summarize_categories(&runs, &requests).unwrap();
        let rows: Vec<(&str, &str)> = c
            .iter()
            .map(|c| (c.method.as_str(), c.category.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                ("base", "writing"),
                ("spec", "writing"),
                ("base", "math"),
                ("spec", "math")
            ]
        );
        // writing = prompt 0: 4 tokens in 2.4 s vs 4 in 4 s; τ (2 + 2) / 2
        assert!((c[1].speedup.unwrap().mean - (4.0 / 2.4) / 1.0).abs() < 1e-12);
        assert!((c[1].tokens_per_s - 4.0 / 2.4).abs() < 1e-12);
        assert_eq!(c[1].tau.mean, 2.0);
        // math = prompt 1: 3 tokens in 2.4 s; τ 1.5
        assert!((c[3].speedup.unwrap().mean - 1.25).abs() < 1e-12);
        assert_eq!(c[3].tau.mean, 1.5);
        assert_eq!(c[0].speedup.unwrap().mean, 1.0);
        // no categories, no rows
        for r in &mut requests {
            r.category = None;
        }
        assert!(summarize_categories(&runs, &requests).unwrap().is_empty());
    }

    #[test]
    fn summary_needs_a_baseline() {
        let runs = vec![MethodRun {
            method: "spec".into(),
            description: String::new(),
            is_baseline: false,
            elapsed_s: 1.0,
            setup_s: 0.0,
            repeat_elapsed_s: Vec::new(),
        }];
        let err = summarize(&runs, &[], &[]).unwrap_err();
        assert!(err.to_string().contains("baseline"));
    }
}
