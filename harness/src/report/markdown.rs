//! The markdown summary table.

use std::fmt::Write;

use super::Provenance;
use crate::metrics::MethodSummary;

/// A markdown document: the per-configuration table, the definitions used, and the provenance.
pub fn summary_markdown(summaries: &[MethodSummary], provenance: &Provenance) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# {}\n", provenance.config.name);
    if !provenance.config.description.is_empty() {
        let _ = writeln!(md, "{}\n", provenance.config.description);
    }
    let time_unit = match provenance.backend.as_str() {
        "simulation" => "simulated from the cost model",
        "toy" => "wall time of the toy loop, which has no model cost: compare acceptance and τ, not speed",
        _ => "measured",
    };
    // Milliseconds per token, or microseconds when every method is faster than 0.1 ms per token.
    let slowest = summaries
        .iter()
        .filter(|s| s.generated_tokens > 0)
        .map(|s| s.time_split.total_s() / s.generated_tokens as f64)
        .fold(0.0f64, f64::max);
    let (unit, scale) = if slowest < 1e-4 {
        ("µs", 1e6)
    } else {
        ("ms", 1e3)
    };
    let _ = writeln!(
        md,
        "| method | drafter / verifier / policy | tokens/s | speedup | per-prompt speedup (95% CI) | acceptance | τ (95% CI) | = baseline | draft / target / verify / commit / overhead ({unit} per token) |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---|");
    for s in summaries {
        let pp = s
            .speedup_per_prompt
            .map(|i| format!("{:.2} [{:.2}, {:.2}]", i.mean, i.lo, i.hi))
            .unwrap_or_else(|| "-".into());
        let acc = s
            .acceptance_rate
            .map(|a| format!("{:.3}", a))
            .unwrap_or_else(|| "-".into());
        let per_token = |x: f64| {
            if s.generated_tokens == 0 {
                0.0
            } else {
                x * scale / s.generated_tokens as f64
            }
        };
        let split: Vec<String> = s
            .time_split
            .parts()
            .iter()
            .map(|(_, v)| format!("{:.2}", per_token(*v)))
            .collect();
        let _ = writeln!(
            md,
            "| {}{} | {} | {:.1} | {:.2}× | {} | {} | {:.2} [{:.2}, {:.2}] | {} | {} |",
            s.method,
            if s.is_baseline && s.method != "baseline" {
                " (baseline)"
            } else {
                ""
            },
            s.description,
            s.tokens_per_s,
            s.speedup,
            pp,
            acc,
            s.tau.mean,
            s.tau.lo,
            s.tau.hi,
            s.matches_baseline
                .map(|(equal, of)| format!("{equal}/{of}"))
                .unwrap_or_else(|| "-".into()),
            split.join(" / ")
        );
    }
    let n = summaries.first().map(|s| s.requests).unwrap_or(0);
    let _ = writeln!(
        md,
        "\nTimes are {time_unit} ({} backend). {n} prompts per method. Speedup = tokens/s over the \
         baseline's in this run. Acceptance = accepted drafts / proposed drafts. τ = accepted \
         drafts + 1 per target pass, mean over prompts with a two-sided 95% Student-t interval \
         over prompts; the per-prompt speedup interval is the same kind. = baseline: prompts whose \
         text equals the baseline's on the same prompt (at temperature 0 a lossless method \
         matches on every prompt; above 0 texts differ by chance).\n",
        provenance.backend
    );
    let setups: Vec<String> = summaries
        .iter()
        .filter(|s| s.setup_s > 0.0)
        .map(|s| format!("{} {:.2} s", s.method, s.setup_s))
        .collect();
    if !setups.is_empty() {
        let _ = writeln!(
            md,
            "One-time set-up (loading and instantiating draft models, measuring costs, tuning), \
             not counted in tokens/s: {}.\n",
            setups.join(", ")
        );
    }
    let _ = writeln!(
        md,
        "Schedule: {}.\n",
        match provenance.config.schedule {
            crate::config::Schedule::Interleaved => {
                "interleaved (every method on each group of `batch_size` prompts in turn, the \
                 order rotating), so machine drift spreads over all methods"
            }
            crate::config::Schedule::ByMethod => "method after method",
        }
    );
    let _ = writeln!(md, "## Provenance\n");
    let _ = writeln!(
        md,
        "- git commit: `{}`{}",
        provenance.git_commit,
        match provenance.git_dirty {
            Some(true) => " (uncommitted changes)",
            _ => "",
        }
    );
    let _ = writeln!(md, "- specdec: {}", provenance.specdec_version);
    let _ = writeln!(
        md,
        "- CPU: {} ({} threads), {}",
        provenance.cpu_model, provenance.threads, provenance.os
    );
    let _ = writeln!(
        md,
        "- GPU: {}",
        provenance.gpu.as_deref().unwrap_or("none detected")
    );
    let _ = writeln!(md, "- seed: {}", provenance.seed);
    let _ = writeln!(md, "- started: unix {}", provenance.started_unix_s);
    for (model, hash) in &provenance.model_hashes {
        let _ = writeln!(md, "- model `{model}`: sha256 {hash}");
    }
    for note in &provenance.notes {
        let _ = writeln!(md, "- note: {note}");
    }
    md
}
