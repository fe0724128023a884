//! CSV tables (RFC 4180 quoting) of summaries, requests and steps.

use crate::metrics::{CategorySummary, MethodSummary, RequestRecord, StepRecord};

fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn table(header: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let mut out = header.join(",");
    out.push('\n');
    for row in rows {
        let cells: Vec<String> = row.iter().map(|c| field(c)).collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

fn opt(x: Option<f64>) -> String {
    x.map(|v| v.to_string()).unwrap_or_default()
}

/// One row per configuration. Times are seconds; the histogram and the per-depth rates are
/// `;`-separated lists, the target forward's median by size `tokens:seconds` pairs.
pub fn summary_csv(summaries: &[MethodSummary]) -> String {
    table(
        &[
            "method",
            "description",
            "is_baseline",
            "requests",
            "generated_tokens",
            "target_passes",
            "elapsed_s",
            "prefill_s",
            "tokens_per_s",
            "speedup",
            "speedup_lo95",
            "speedup_hi95",
            "speedup_per_prompt_geomean",
            "speedup_per_prompt_lo95",
            "speedup_per_prompt_hi95",
            "acceptance_rate",
            "acceptance_lo95",
            "acceptance_hi95",
            "tau_mean",
            "tau_lo95",
            "tau_hi95",
            "tau_n",
            "ttft_s_mean",
            "ttft_s_lo95",
            "ttft_s_hi95",
            "tpot_s_mean",
            "tpot_s_lo95",
            "tpot_s_hi95",
            "accepted_lengths",
            "acceptance_by_depth",
            "acceptance_by_depth_unconditional",
            "draft_s",
            "target_s",
            "verify_s",
            "commit_s",
            "overhead_s",
            "kv_blocks_peak",
            "tokens_per_s_by_repeat",
            "target_forward_s_by_tokens",
        ],
        summaries.iter().map(|s| {
            let pp = s.speedup_per_prompt;
            vec![
                s.method.clone(),
                s.description.clone(),
                s.is_baseline.to_string(),
                s.requests.to_string(),
                s.generated_tokens.to_string(),
                s.target_passes.to_string(),
                s.elapsed_s.to_string(),
                s.prefill_s.to_string(),
                s.tokens_per_s.to_string(),
                s.speedup.to_string(),
                opt(s.speedup_interval.map(|i| i.lo)),
                opt(s.speedup_interval.map(|i| i.hi)),
                opt(pp.map(|i| i.mean)),
                opt(pp.map(|i| i.lo)),
                opt(pp.map(|i| i.hi)),
                opt(s.acceptance_rate),
                opt(s.acceptance_interval.map(|i| i.lo)),
                opt(s.acceptance_interval.map(|i| i.hi)),
                s.tau.mean.to_string(),
                s.tau.lo.to_string(),
                s.tau.hi.to_string(),
                s.tau.n.to_string(),
                opt(s.ttft_s.map(|i| i.mean)),
                opt(s.ttft_s.map(|i| i.lo)),
                opt(s.ttft_s.map(|i| i.hi)),
                opt(s.tpot_s.map(|i| i.mean)),
                opt(s.tpot_s.map(|i| i.lo)),
                opt(s.tpot_s.map(|i| i.hi)),
                s.accepted_lengths
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(";"),
                s.acceptance_by_depth
                    .iter()
                    .map(|a| format!("{:.4}", a.conditional))
                    .collect::<Vec<_>>()
                    .join(";"),
                s.acceptance_by_depth
                    .iter()
                    .map(|a| format!("{:.4}", a.unconditional))
                    .collect::<Vec<_>>()
                    .join(";"),
                s.time_split.draft_s.to_string(),
                s.time_split.target_s.to_string(),
                s.time_split.verify_s.to_string(),
                s.time_split.commit_s.to_string(),
                s.time_split.overhead_s.to_string(),
                s.kv_blocks_peak.to_string(),
                s.tokens_per_s_by_repeat
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(";"),
                s.pass_times
                    .iter()
                    .map(|p| format!("{}:{}", p.tokens, p.median_s))
                    .collect::<Vec<_>>()
                    .join(";"),
            ]
        }),
    )
}

/// One row per method × forward size × op of the target forwards' op split (`op_split = true`):
/// the op's median seconds over the forwards of that size (see [`crate::metrics::forward_ops`]).
pub fn forward_ops_csv(summaries: &[MethodSummary]) -> String {
    table(
        &["method", "tokens", "passes", "op", "median_s"],
        summaries.iter().flat_map(|s| {
            s.forward_ops.iter().flat_map(move |f| {
                f.ops.iter().map(move |o| {
                    vec![
                        s.method.clone(),
                        f.tokens.to_string(),
                        f.passes.to_string(),
                        o.op.clone(),
                        o.median_s.to_string(),
                    ]
                })
            })
        }),
    )
}

/// One row per method × category.
pub fn categories_csv(categories: &[CategorySummary]) -> String {
    table(
        &[
            "method",
            "category",
            "prompts",
            "tau_mean",
            "tau_lo95",
            "tau_hi95",
            "speedup",
            "speedup_lo95",
            "speedup_hi95",
            "tokens_per_s",
        ],
        categories.iter().map(|c| {
            vec![
                c.method.clone(),
                c.category.clone(),
                c.tau.n.to_string(),
                c.tau.mean.to_string(),
                c.tau.lo.to_string(),
                c.tau.hi.to_string(),
                opt(c.speedup.map(|i| i.mean)),
                opt(c.speedup.map(|i| i.lo)),
                opt(c.speedup.map(|i| i.hi)),
                c.tokens_per_s.to_string(),
            ]
        }),
    )
}

/// One row per request (the generated text is left out; it is in `requests.jsonl`).
pub fn requests_csv(requests: &[RequestRecord]) -> String {
    table(
        &[
            "method",
            "request",
            "repeat",
            "prompt_id",
            "prompt_tokens",
            "generated_tokens",
            "target_passes",
            "proposed",
            "accepted",
            "tau",
            "elapsed_s",
            "prefill_s",
            "ttft_s",
            "tpot_s",
            "draft_s",
            "target_s",
            "verify_s",
            "commit_s",
            "overhead_s",
            "kv_blocks_peak",
        ],
        requests.iter().map(|r| {
            vec![
                r.method.clone(),
                r.request.to_string(),
                r.repeat.to_string(),
                r.prompt_id.clone(),
                r.prompt_tokens.to_string(),
                r.generated_tokens.to_string(),
                r.target_passes.to_string(),
                r.proposed.to_string(),
                r.accepted.to_string(),
                opt(r.tau()),
                r.elapsed_s.to_string(),
                r.prefill_s.to_string(),
                r.ttft_s.to_string(),
                opt(r.tpot_s()),
                r.draft_s.to_string(),
                r.target_s.to_string(),
                r.verify_s.to_string(),
                r.commit_s.to_string(),
                r.overhead_s.to_string(),
                r.kv_blocks_peak.to_string(),
            ]
        }),
    )
}

/// One row per step.
pub fn steps_csv(steps: &[StepRecord]) -> String {
    table(
        &[
            "method",
            "request",
            "repeat",
            "step",
            "proposed",
            "draft_depth",
            "accepted",
            "emitted",
            "draft_s",
            "target_s",
            "verify_s",
            "commit_s",
            "overhead_s",
            "prefill_s",
            "kv_blocks",
            "batch",
            "drafter",
        ],
        steps.iter().map(|s| {
            vec![
                s.method.clone(),
                s.request.to_string(),
                s.repeat.to_string(),
                s.step.to_string(),
                s.proposed.to_string(),
                s.draft_depth.to_string(),
                s.accepted.to_string(),
                s.emitted.to_string(),
                s.draft_s.to_string(),
                s.target_s.to_string(),
                s.verify_s.to_string(),
                s.commit_s.to_string(),
                s.overhead_s.to_string(),
                s.prefill_s.to_string(),
                s.kv_blocks.to_string(),
                s.batch.to_string(),
                s.drafter.clone(),
            ]
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(field("plain"), "plain");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
        let t = table(
            &["x", "y"],
            std::iter::once(vec!["1".into(), "a\nb".into()]),
        );
        assert_eq!(t, "x,y\n1,\"a\nb\"\n");
    }
}
