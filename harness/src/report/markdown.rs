//! The markdown summary table.

use std::fmt::Write;

use super::Provenance;
use crate::metrics::first_seen;
use crate::metrics::{
    CategorySummary, ForwardOps, Interval, MethodSummary, BOOTSTRAP_RESAMPLES, FEW_PROMPTS,
};

/// `text` as one markdown table cell: `|` escaped, line breaks and other control characters
/// made spaces, so a method name or description cannot add columns or rows.
pub fn table_cell(text: &str) -> String {
    let mut cell = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '|' => cell.push_str("\\|"),
            '\\' => cell.push_str("\\\\"),
            c if c.is_control() => cell.push(' '),
            c => cell.push(c),
        }
    }
    cell
}

/// A markdown document: the per-configuration table, the definitions used, the per-category
/// table when the prompts have categories, and the provenance.
pub fn summary_markdown(
    summaries: &[MethodSummary],
    categories: &[CategorySummary],
    provenance: &Provenance,
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# {}\n", table_cell(&provenance.config.name));
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
        .map(|s| s.time_split.decode_s() / s.generated_tokens as f64)
        .fold(0.0f64, f64::max);
    let (unit, scale) = if slowest < 1e-4 {
        ("µs", 1e6)
    } else {
        ("ms", 1e3)
    };
    let _ = writeln!(
        md,
        "| method | drafter / verifier / policy | n | decode tokens/s | speedup (95% CI) | per-prompt speedup, geometric mean (95% CI) | acceptance (95% CI) | τ (95% CI) | TTFT ms (95% CI) | TPOT ms (95% CI) | = baseline | draft / target / verify / commit / overhead ({unit} per token) |"
    );
    let _ = writeln!(
        md,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    let ms = |i: Option<Interval>| {
        interval(
            i.map(|i| Interval {
                mean: i.mean * 1e3,
                lo: i.lo * 1e3,
                hi: i.hi * 1e3,
                n: i.n,
            }),
            1,
        )
    };
    for s in summaries {
        let speedup = match s.speedup_interval {
            Some(i) if !s.is_baseline => format!("{:.2}× [{:.2}, {:.2}]", s.speedup, i.lo, i.hi),
            _ => format!("{:.2}×", s.speedup),
        };
        let pp = interval(s.speedup_per_prompt, 2);
        let acc = interval(s.acceptance_interval, 3);
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
            "| {}{} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} |",
            table_cell(&s.method),
            if s.is_baseline && s.method != "baseline" {
                " (baseline)"
            } else {
                ""
            },
            table_cell(&s.description),
            s.tau.n,
            s.tokens_per_s,
            speedup,
            pp,
            acc,
            interval(Some(s.tau), 2),
            ms(s.ttft_s),
            ms(s.tpot_s),
            s.matches_baseline
                .map(|(equal, of)| format!("{equal}/{of}"))
                .unwrap_or_else(|| "-".into()),
            split.join(" / ")
        );
    }
    let n = summaries.iter().map(|s| s.tau.n).min().unwrap_or(0);
    let _ = writeln!(
        md,
        "\nTimes are {time_unit} ({} backend). n = prompts per method. Speedup = tokens/s over \
         the baseline's in this run, both over decode time (the prompt prefill, in TTFT, left out); \
         TTFT = time to first token (prefill + first step); TPOT = time per output token after \
         the first; per-prompt speedup = baseline seconds per token / the \
         method's on the same prompt, geometric mean over prompts. Acceptance = accepted drafts / \
         proposed drafts. τ = accepted drafts + 1 per target pass, mean over prompts. Intervals: \
         95% percentile bootstrap over prompts ({BOOTSTRAP_RESAMPLES} resamples, fixed seed), \
         inside the statistic's range. = baseline: prompts whose text equals the baseline's on \
         the same prompt (at temperature 0 a lossless method matches on every prompt; above 0 \
         texts differ by chance). Definitions: `harness/src/metrics/mod.rs`.\n",
        provenance.backend
    );
    if n < FEW_PROMPTS {
        let _ = writeln!(
            md,
            "**Warning: only {n} prompt{} per method: the intervals are rough (with 2 prompts they \
             are about the two prompts' values); run at least {FEW_PROMPTS}.**\n",
            if n == 1 { "" } else { "s" }
        );
    }
    let spreads: Vec<String> = summaries
        .iter()
        .filter(|s| !s.tokens_per_s_by_repeat.is_empty())
        .map(|s| {
            let r = &s.tokens_per_s_by_repeat;
            let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("{} {lo:.1}–{hi:.1} ({} runs)", s.method, r.len())
        })
        .collect();
    if !spreads.is_empty() {
        let _ = writeln!(
            md,
            "Repeats (the same prompts and seed run again; the prompt stays the unit of the \
             intervals): decode tokens/s, lowest–highest repeat: {}.\n",
            spreads.join(", ")
        );
    }
    write_category_table(&mut md, summaries, categories, provenance);
    write_acceptance_tables(&mut md, summaries);
    write_pass_times(&mut md, summaries, unit, scale);
    write_forward_ops(&mut md, summaries, unit, scale);
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

/// The per-category table, Spec-Bench's columns: per category the speedup and the mean accepted
/// tokens τ, then the overall speedup, τ and decode tokens/s of each method.
fn write_category_table(
    md: &mut String,
    summaries: &[MethodSummary],
    categories: &[CategorySummary],
    provenance: &Provenance,
) {
    if categories.is_empty() {
        return;
    }
    let mut names: Vec<&str> = Vec::new();
    for c in categories {
        if !names.contains(&c.category.as_str()) {
            names.push(&c.category);
        }
    }
    let _ = writeln!(md, "### Per category\n");
    let _ = writeln!(
        md,
        "| method | {} | overall speedup | mean accepted tokens τ | decode tokens/s |",
        names
            .iter()
            .map(|n| format!("{n}: speedup / τ"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(md, "|---|{}---:|---:|---:|", "---:|".repeat(names.len()));
    for s in summaries {
        let cells: Vec<String> = names
            .iter()
            .map(|name| {
                categories
                    .iter()
                    .find(|c| c.method == s.method && c.category == *name)
                    .map_or("-".into(), |c| {
                        let speedup = c.speedup.map_or("-".into(), |i| format!("{:.2}×", i.mean));
                        format!("{speedup} / {:.2} (n={})", c.tau.mean, c.tau.n)
                    })
            })
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {:.2}× | {:.2} | {:.1} |",
            table_cell(&s.method),
            cells.join(" | "),
            s.speedup,
            s.tau.mean,
            s.tokens_per_s
        );
    }
    let multi_turn = provenance.notes.iter().any(|n| n.contains("later turns"));
    let _ = writeln!(
        md,
        "\nSpeedup and τ per category over that category's prompts (intervals in \
         `categories.csv`){}.\n",
        if multi_turn {
            "; a category holds both turns of its questions, and every method's second turn \
             continues the **baseline's** first-turn answer, so all methods are compared on the \
             same contexts (at T > 0 too)"
        } else {
            ""
        }
    );
}

/// `mean [lo, hi]` with `decimals` decimals, `-` for none.
fn interval(i: Option<Interval>, decimals: usize) -> String {
    i.map(|i| format!("{:.d$} [{:.d$}, {:.d$}]", i.mean, i.lo, i.hi, d = decimals))
        .unwrap_or_else(|| "-".into())
}

/// Most forward sizes [`write_pass_times`] gives a column (the smallest ones; all are in
/// `summary.jsonl`).
const PASS_TIME_COLUMNS: usize = 12;

/// The target forward's median time by its size, per method, with its ratio to the baseline's
/// one-token forward: the verify-cost curve as the run met it. Written when some method drafted
/// (a forward of two or more tokens ran alone); times in `unit` (`scale` per second).
fn write_pass_times(md: &mut String, summaries: &[MethodSummary], unit: &str, scale: f64) {
    if !summaries
        .iter()
        .any(|s| s.pass_times.iter().any(|p| p.tokens > 1))
    {
        return;
    }
    let mut sizes: Vec<usize> = summaries
        .iter()
        .flat_map(|s| s.pass_times.iter().map(|p| p.tokens))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let more = sizes.len() > PASS_TIME_COLUMNS;
    sizes.truncate(PASS_TIME_COLUMNS);
    let one_token = summaries
        .iter()
        .find(|s| s.is_baseline)
        .and_then(|b| b.pass_times.iter().find(|p| p.tokens == 1))
        .map(|p| p.median_s)
        .filter(|&s| s > 0.0);
    let _ = writeln!(
        md,
        "### Target forward by tokens verified (steps that ran alone)\n\nMedian {unit} of one \
         target forward over n tokens (a step's root and its n − 1 drafts){}; forwards in \
         brackets. Two methods' forwards of one size differ by what runs between them (the drafter \
         above all) and by the prefixes they ran at; `specdec bench model` measures the same \
         curve with nothing between forwards.{}\n",
        if one_token.is_some() {
            ", and its ratio to the baseline's one-token forward"
        } else {
            ""
        },
        if more {
            format!(" The {PASS_TIME_COLUMNS} smallest sizes; all are in `summary.jsonl`.")
        } else {
            String::new()
        }
    );
    let header: Vec<String> = sizes.iter().map(|n| format!("n = {n}")).collect();
    let _ = writeln!(md, "| method | {} |", header.join(" | "));
    let _ = writeln!(md, "|---|{}", "---:|".repeat(sizes.len()));
    for s in summaries.iter().filter(|s| !s.pass_times.is_empty()) {
        let cells: Vec<String> = sizes
            .iter()
            .map(|&n| match s.pass_times.iter().find(|p| p.tokens == n) {
                Some(p) => match one_token {
                    Some(base) => format!(
                        "{:.2} ({:.2}×, {})",
                        p.median_s * scale,
                        p.median_s / base,
                        p.passes
                    ),
                    None => format!("{:.2} ({})", p.median_s * scale, p.passes),
                },
                None => "-".into(),
            })
            .collect();
        let _ = writeln!(md, "| {} | {} |", table_cell(&s.method), cells.join(" | "));
    }
    let _ = writeln!(md);
}

/// Most columns (method × forward size) of [`write_forward_ops`]'s table.
const FORWARD_OPS_COLUMNS: usize = 8;

/// The fewest forwards of one size that get a column in [`write_forward_ops`]'s table.
const FORWARD_OPS_MIN_PASSES: usize = 10;

/// The target forward's median op split, a column per method and forward size (those of at
/// least [`FORWARD_OPS_MIN_PASSES`] forwards, the first [`FORWARD_OPS_COLUMNS`] in method order),
/// a row per op and their sum; written when the run recorded op splits (`op_split = true`).
fn write_forward_ops(md: &mut String, summaries: &[MethodSummary], unit: &str, scale: f64) {
    let all: Vec<(&MethodSummary, &ForwardOps)> = summaries
        .iter()
        .flat_map(|s| s.forward_ops.iter().map(move |f| (s, f)))
        .collect();
    if all.is_empty() {
        return;
    }
    let columns: Vec<(&MethodSummary, &ForwardOps)> = all
        .iter()
        .copied()
        .filter(|(_, f)| f.passes >= FORWARD_OPS_MIN_PASSES)
        .take(FORWARD_OPS_COLUMNS)
        .collect();
    let _ = writeln!(
        md,
        "### Target forward by op (op_split)\n\nMedian {unit} of each op of one target forward \
         over n tokens, timed inside the forward (an op ends when all its threads have; the ops \
         add up to the forward); the method × size pairs of at least \
         {FORWARD_OPS_MIN_PASSES} forwards, at most {FORWARD_OPS_COLUMNS} (every pair is in \
         `forward_ops.csv`).\n"
    );
    if columns.is_empty() {
        let _ = writeln!(
            md,
            "No method × size had {FORWARD_OPS_MIN_PASSES} forwards.\n"
        );
        return;
    }
    let header: Vec<String> = columns
        .iter()
        .map(|(s, f)| format!("{} n = {} ({})", table_cell(&s.method), f.tokens, f.passes))
        .collect();
    let _ = writeln!(md, "| op | {} |", header.join(" | "));
    let _ = writeln!(md, "|---|{}", "---:|".repeat(columns.len()));
    let names = first_seen(
        columns
            .iter()
            .flat_map(|(_, f)| &f.ops)
            .map(|o| o.op.as_str()),
    );
    let median = |f: &ForwardOps, name: &str| {
        f.ops
            .iter()
            .find(|o| o.op == name)
            .map_or(0.0, |o| o.median_s)
    };
    for name in &names {
        let cells: Vec<String> = columns
            .iter()
            .map(|(_, f)| format!("{:.3}", median(f, name) * scale))
            .collect();
        let _ = writeln!(md, "| {} | {} |", table_cell(name), cells.join(" | "));
    }
    let sums: Vec<String> = columns
        .iter()
        .map(|(_, f)| {
            format!(
                "{:.3}",
                f.ops.iter().map(|o| o.median_s).sum::<f64>() * scale
            )
        })
        .collect();
    let _ = writeln!(md, "| sum of medians | {} |", sums.join(" | "));
    let _ = writeln!(md);
}

/// The accepted-length histogram and acceptance by position (conditional and unconditional,
/// each with its count) of every drafting method.
fn write_acceptance_tables(md: &mut String, summaries: &[MethodSummary]) {
    let drafting: Vec<&MethodSummary> = summaries
        .iter()
        .filter(|s| !s.accepted_lengths.is_empty())
        .collect();
    if drafting.is_empty() {
        return;
    }
    let longest = drafting
        .iter()
        .map(|s| s.accepted_lengths.len())
        .max()
        .unwrap_or(0);
    let _ = writeln!(md, "### Accepted drafts per step (steps that drafted)\n");
    let header: Vec<String> = (0..longest).map(|a| a.to_string()).collect();
    let _ = writeln!(md, "| method | {} | steps |", header.join(" | "));
    let _ = writeln!(md, "|---|{}---:|", "---:|".repeat(longest));
    for s in &drafting {
        let total: usize = s.accepted_lengths.iter().sum();
        let cells: Vec<String> = (0..longest)
            .map(|a| {
                let c = s.accepted_lengths.get(a).copied().unwrap_or(0);
                format!("{c} ({:.0}%)", 100.0 * c as f64 / total.max(1) as f64)
            })
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {total} |",
            table_cell(&s.method),
            cells.join(" | ")
        );
    }
    let deepest = drafting
        .iter()
        .map(|s| s.acceptance_by_depth.len())
        .max()
        .unwrap_or(0);
    let _ = writeln!(
        md,
        "\n### Acceptance by position\n\nConditional: P(position d accepted | d − 1 accepted, d \
         proposed), of the steps that reached d; unconditional (vLLM's per-position rate): \
         P(position d accepted | d proposed), of the steps that proposed d. Counts in brackets.\n"
    );
    let header: Vec<String> = (1..=deepest).map(|d| format!("d = {d}")).collect();
    let _ = writeln!(md, "| method | kind | {} |", header.join(" | "));
    let _ = writeln!(md, "|---|---|{}", "---:|".repeat(deepest));
    for s in &drafting {
        for (kind, conditional) in [("conditional", true), ("unconditional", false)] {
            let cells: Vec<String> = (0..deepest)
                .map(|d| match s.acceptance_by_depth.get(d) {
                    Some(a) if conditional => format!("{:.3} ({})", a.conditional, a.reached),
                    Some(a) => format!("{:.3} ({})", a.unconditional, a.proposed),
                    None => "-".into(),
                })
                .collect();
            let _ = writeln!(
                md,
                "| {} | {kind} | {} |",
                table_cell(&s.method),
                cells.join(" | ")
            );
        }
    }
    let _ = writeln!(md);
}
