//! Results on disk: JSONL (the raw records, re-readable), CSV, a markdown summary, SVG plots, and
//! the provenance of the run.
//!
//! A results folder holds:
//!
//! | file | content |
//! |---|---|
//! | `provenance.json` | git commit, versions, CPU/GPU, threads, seeds, model hashes, the config |
//! | `runs.jsonl` | one line per method: name, description, baseline flag, elapsed seconds |
//! | `requests.jsonl`, `requests.csv` | one line per method × prompt |
//! | `steps.jsonl`, `steps.csv` | one line per method × prompt × target pass |
//! | `summary.jsonl`, `summary.csv` | one line per method: the aggregates (provenance embedded in the JSONL) |
//! | `summary.md` | the summary table and the provenance in markdown |
//! | `speedup.svg`, `tau.svg`, `acceptance_by_depth.svg`, `accepted_lengths.svg`, `latency.svg`, `time_split.svg` | plots |
//!
//! | `categories.csv`, `categories.svg` | per method × category (only when the prompts have categories) |
//! | `speedup_by_k.svg`, `tau_by_k.svg` | speedup and τ against K per drafter (only when methods differ only in a fixed K) |
//! | `forward_ops.csv` | the target forward's median op split per method × forward size × op (only with `op_split = true`) |
//!
//! [`write_results`] writes all of them; [`rerender`] reads the raw JSONL back and rewrites the
//! derived files (summary, CSV, markdown, plots).

mod csv;
mod jsonl;
mod markdown;
mod plots;
mod provenance;

pub use csv::{categories_csv, forward_ops_csv, requests_csv, steps_csv, summary_csv};
pub use jsonl::{
    append_jsonl, read_appended_jsonl, read_jsonl, temp_path, write_atomic, write_jsonl,
};
pub use markdown::{summary_markdown, table_cell};
pub use plots::{
    bar_chart, line_plot, plot_acceptance_by_depth, plot_accepted_lengths, plot_categories,
    plot_latency, plot_speedup, plot_tau, plot_time_split, series_by_k, Bar, Legend, Series,
    SeriesStyle,
};
pub use provenance::{build_dirty, crate_versions, hash_file, Provenance, BUILD_COMMIT};

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{HarnessError, Result};
use crate::metrics::{
    summarize, summarize_categories, MethodRun, MethodSummary, RequestRecord, StepRecord,
};

/// Everything a run produced.
#[derive(Debug, Clone)]
pub struct RunResults {
    /// Where it came from.
    pub provenance: Provenance,
    /// One entry per method, in run order.
    pub runs: Vec<MethodRun>,
    /// One entry per method × prompt.
    pub requests: Vec<RequestRecord>,
    /// One entry per method × prompt × step.
    pub steps: Vec<StepRecord>,
    /// The aggregates (from [`summarize`]).
    pub summaries: Vec<MethodSummary>,
}

/// File names inside a results folder.
pub mod files {
    /// Provenance of the run.
    pub const PROVENANCE: &str = "provenance.json";
    /// Per-method runs.
    pub const RUNS: &str = "runs.jsonl";
    /// Per-request records.
    pub const REQUESTS_JSONL: &str = "requests.jsonl";
    /// Per-step records.
    pub const STEPS_JSONL: &str = "steps.jsonl";
    /// Per-method summaries.
    pub const SUMMARY_JSONL: &str = "summary.jsonl";
    /// Per-request CSV.
    pub const REQUESTS_CSV: &str = "requests.csv";
    /// Per-step CSV.
    pub const STEPS_CSV: &str = "steps.csv";
    /// Per-method CSV.
    pub const SUMMARY_CSV: &str = "summary.csv";
    /// Markdown summary.
    pub const SUMMARY_MD: &str = "summary.md";
    /// Speedup plot.
    pub const SPEEDUP_SVG: &str = "speedup.svg";
    /// τ plot.
    pub const TAU_SVG: &str = "tau.svg";
    /// Acceptance-by-depth plot.
    pub const ACCEPTANCE_SVG: &str = "acceptance_by_depth.svg";
    /// Accepted-length histogram.
    pub const ACCEPTED_LENGTHS_SVG: &str = "accepted_lengths.svg";
    /// TTFT / TPOT plot.
    pub const LATENCY_SVG: &str = "latency.svg";
    /// Time-split plot.
    pub const TIME_SPLIT_SVG: &str = "time_split.svg";
    /// Per-category CSV (only when the prompts have categories).
    pub const CATEGORIES_CSV: &str = "categories.csv";
    /// Per-category speedup plot (only when the prompts have categories).
    pub const CATEGORIES_SVG: &str = "categories.svg";
    /// Speedup against K per drafter (only when two or more methods differ only in a fixed K).
    pub const SPEEDUP_BY_K_SVG: &str = "speedup_by_k.svg";
    /// τ against K per drafter (as [`SPEEDUP_BY_K_SVG`]).
    pub const TAU_BY_K_SVG: &str = "tau_by_k.svg";
    /// The target forward's op split (only with `op_split = true`).
    pub const FORWARD_OPS_CSV: &str = "forward_ops.csv";
    /// The files a results folder holds only when the run has them (per category, by K, the
    /// op split).
    pub const OPTIONAL: [&str; 5] = [
        CATEGORIES_CSV,
        CATEGORIES_SVG,
        SPEEDUP_BY_K_SVG,
        TAU_BY_K_SVG,
        FORWARD_OPS_CSV,
    ];
    /// Every file a results folder holds after [`super::write_results`] (the per-category and
    /// by-K files besides, when the run has them).
    pub const ALL: [&str; 15] = [
        PROVENANCE,
        RUNS,
        REQUESTS_JSONL,
        STEPS_JSONL,
        SUMMARY_JSONL,
        REQUESTS_CSV,
        STEPS_CSV,
        SUMMARY_CSV,
        SUMMARY_MD,
        SPEEDUP_SVG,
        TAU_SVG,
        ACCEPTANCE_SVG,
        ACCEPTED_LENGTHS_SVG,
        LATENCY_SVG,
        TIME_SPLIT_SVG,
    ];
}

/// A summary line of `summary.jsonl`: the aggregates with the run's provenance embedded.
#[derive(Debug, Serialize)]
struct SummaryLine<'a> {
    #[serde(flatten)]
    summary: &'a MethodSummary,
    provenance: &'a Provenance,
}

/// Writes `dir/provenance.json` (through a temporary file and a rename).
pub fn write_provenance(dir: &Path, provenance: &Provenance) -> Result<PathBuf> {
    let p = dir.join(files::PROVENANCE);
    let text = serde_json::to_string_pretty(provenance)
        .map_err(|e| HarnessError::Metrics(e.to_string()))?;
    write_text(&p, &(text + "\n"))?;
    Ok(p)
}

/// Writes `text` to `path` through a temporary file and a rename ([`write_atomic`]).
fn write_text(path: &Path, text: &str) -> Result<()> {
    write_atomic(path, |w| {
        w.write_all(text.as_bytes())
            .map_err(|e| HarnessError::io(path, e))
    })
}

/// Draws a plot at `path` by `draw` into [`temp_path`] and renames it into place once drawn (a
/// failed drawing leaves `path` as it was and removes the temporary file).
fn write_plot(path: &Path, draw: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let temp = temp_path(path);
    if let Err(e) = draw(&temp) {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    std::fs::rename(&temp, path).map_err(|e| HarnessError::io(path, e))
}

/// Writes every file of a results folder (creating it), each through a temporary name renamed
/// into place. Returns the paths written.
pub fn write_results(dir: &Path, results: &RunResults) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| HarnessError::io(dir, e))?;
    let mut written = vec![write_provenance(dir, &results.provenance)?];
    written.push(write_jsonl(&dir.join(files::RUNS), &results.runs)?);
    written.push(write_jsonl(
        &dir.join(files::REQUESTS_JSONL),
        &results.requests,
    )?);
    written.push(write_jsonl(&dir.join(files::STEPS_JSONL), &results.steps)?);
    written.extend(write_derived(dir, results)?);
    Ok(written)
}

fn write_derived(dir: &Path, results: &RunResults) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let lines: Vec<SummaryLine> = results
        .summaries
        .iter()
        .map(|summary| SummaryLine {
            summary,
            provenance: &results.provenance,
        })
        .collect();
    written.push(write_jsonl(&dir.join(files::SUMMARY_JSONL), &lines)?);
    let categories = summarize_categories(&results.runs, &results.requests)?;
    if !categories.is_empty() {
        let p = dir.join(files::CATEGORIES_CSV);
        write_text(&p, &categories_csv(&categories))?;
        written.push(p);
        let p = dir.join(files::CATEGORIES_SVG);
        write_plot(&p, |temp| plot_categories(temp, &categories))?;
        written.push(p);
    }
    let methods = &results.provenance.config.methods;
    for (name, title, y, f) in [
        (
            files::SPEEDUP_BY_K_SVG,
            "Speedup against K",
            "speedup (×)",
            (|s| s.speedup) as fn(&MethodSummary) -> f64,
        ),
        (
            files::TAU_BY_K_SVG,
            "Mean accepted length τ against K",
            "τ",
            |s| s.tau.mean,
        ),
    ] {
        let series = series_by_k(methods, &results.summaries, f);
        if !series.is_empty() {
            let p = dir.join(name);
            write_plot(&p, |temp| {
                line_plot(
                    temp,
                    title,
                    "K (drafts per step)",
                    y,
                    &series,
                    false,
                    Legend::UpperLeft,
                )
            })?;
            written.push(p);
        }
    }
    if results.summaries.iter().any(|s| !s.forward_ops.is_empty()) {
        let p = dir.join(files::FORWARD_OPS_CSV);
        write_text(&p, &forward_ops_csv(&results.summaries))?;
        written.push(p);
    }
    for (name, text) in [
        (files::SUMMARY_CSV, summary_csv(&results.summaries)),
        (files::REQUESTS_CSV, requests_csv(&results.requests)),
        (files::STEPS_CSV, steps_csv(&results.steps)),
        (
            files::SUMMARY_MD,
            summary_markdown(&results.summaries, &categories, &results.provenance),
        ),
    ] {
        let p = dir.join(name);
        write_text(&p, &text)?;
        written.push(p);
    }
    let s = &results.summaries;
    type Plot = fn(&Path, &[MethodSummary]) -> Result<()>;
    let plots: [(&str, Plot); 6] = [
        (files::SPEEDUP_SVG, plot_speedup),
        (files::TAU_SVG, plot_tau),
        (files::ACCEPTANCE_SVG, plot_acceptance_by_depth),
        (files::ACCEPTED_LENGTHS_SVG, plot_accepted_lengths),
        (files::LATENCY_SVG, plot_latency),
        (files::TIME_SPLIT_SVG, plot_time_split),
    ];
    for (name, plot) in plots {
        let p = dir.join(name);
        write_plot(&p, |temp| plot(temp, s))?;
        written.push(p);
    }
    Ok(written)
}

/// Reads a results folder's raw records (provenance, runs, requests, steps) back.
pub fn read_results(dir: &Path) -> Result<RunResults> {
    let p = dir.join(files::PROVENANCE);
    let text = std::fs::read_to_string(&p).map_err(|e| HarnessError::io(&p, e))?;
    let provenance: Provenance =
        serde_json::from_str(&text).map_err(|e| HarnessError::ResultParse {
            path: p.clone(),
            line: e.line(),
            message: e.to_string(),
        })?;
    let runs: Vec<MethodRun> = read_jsonl(&dir.join(files::RUNS))?;
    let requests: Vec<RequestRecord> = read_jsonl(&dir.join(files::REQUESTS_JSONL))?;
    let steps: Vec<StepRecord> = read_jsonl(&dir.join(files::STEPS_JSONL))?;
    let summaries = summarize(&runs, &requests, &steps)?;
    Ok(RunResults {
        provenance,
        runs,
        requests,
        steps,
        summaries,
    })
}

/// Re-renders the derived files (summary JSONL/CSV/markdown, request/step CSV, plots) of a results
/// folder from its raw JSONL. Returns the results read and the paths written.
pub fn rerender(dir: &Path) -> Result<(RunResults, Vec<PathBuf>)> {
    let results = read_results(dir)?;
    let written = write_derived(dir, &results)?;
    Ok((results, written))
}
