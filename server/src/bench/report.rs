//! The records of `specdec bench serve` and what is written from them: `requests.jsonl` (one
//! line per request), `phases.jsonl` (one line per mode × load × repeat), `summary.csv` and
//! `summary.md` (one row per mode × load, with the speculative / plain ratios), and the plots
//! of TPOT and throughput against load.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use specdec_harness::metrics::{geometric_mean_interval, quantile, Interval};
use specdec_harness::report::{
    line_plot, table_cell, write_atomic, write_jsonl, Legend, Series, SeriesStyle,
};

use crate::error::{Result, ServerError};

/// Speculation off (the plain server) or on (the server of the chosen method).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The `--method plain` server.
    Plain,
    /// The server of the chosen method.
    Speculative,
}

impl Mode {
    /// `plain` or `speculative`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Speculative => "speculative",
        }
    }
}

/// How load was offered.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Load {
    /// Open-loop Poisson arrivals at `multiplier` × plain decoding's capacity, `rate_rps`
    /// requests per second.
    Rate {
        /// The rate relative to the measured capacity.
        multiplier: f64,
        /// Requests per second.
        rate_rps: f64,
    },
    /// `clients` closed-loop clients.
    Clients {
        /// How many.
        clients: usize,
    },
}

impl Load {
    /// The x value of the plots: the multiplier or the client count.
    pub fn level(&self) -> f64 {
        match *self {
            Load::Rate { multiplier, .. } => multiplier,
            Load::Clients { clients } => clients as f64,
        }
    }

    /// `0.5× (1.23 req/s)` or `8 clients`.
    pub fn label(&self) -> String {
        match *self {
            Load::Rate {
                multiplier,
                rate_rps,
            } => format!("{multiplier}× ({rate_rps:.3} req/s)"),
            Load::Clients { clients: 1 } => "1 client".into(),
            Load::Clients { clients } => format!("{clients} clients"),
        }
    }

    fn same_point(&self, other: &Load) -> bool {
        match (self, other) {
            (Load::Rate { multiplier: a, .. }, Load::Rate { multiplier: b, .. }) => a == b,
            (Load::Clients { clients: a }, Load::Clients { clients: b }) => a == b,
            _ => false,
        }
    }
}

/// One request of the benchmark (a line of `requests.jsonl`). Times are seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Speculation off or on.
    pub mode: Mode,
    /// The load it ran under.
    pub load: Load,
    /// Which repeat (0-based).
    pub repeat: usize,
    /// Its index within the repeat (the same index gets the same prompt, and at a rate the same
    /// arrival gap, in both modes).
    pub index: usize,
    /// The prompt's id (`mtbench/…`, `humaneval/…`).
    pub prompt_id: String,
    /// When it was sent, from its block's start.
    pub sent_s: f64,
    /// Time to the first chunk with text.
    pub ttft_s: Option<f64>,
    /// (last chunk − first chunk) / (completion tokens − 1); `None` below 2 tokens.
    pub tpot_s: Option<f64>,
    /// Send to the end of the response.
    pub e2e_s: f64,
    /// From the usage chunk.
    pub prompt_tokens: usize,
    /// From the usage chunk.
    pub completion_tokens: usize,
    /// `accepted_prediction_tokens` of the usage chunk.
    pub accepted: usize,
    /// `rejected_prediction_tokens` of the usage chunk.
    pub rejected: usize,
    /// The last chunk's finish reason.
    pub finish_reason: Option<String>,
    /// The generated text.
    pub text: String,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// One mode × load × repeat × block (a line of `phases.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseRecord {
    /// Speculation off or on.
    pub mode: Mode,
    /// The load.
    pub load: Load,
    /// Which repeat.
    pub repeat: usize,
    /// Which block of the repeat (0-based; a closed-loop point has one).
    #[serde(default)]
    pub block: usize,
    /// Seconds from the first send to the last answer.
    pub wall_s: f64,
    /// Requests sent.
    pub requests: usize,
    /// Target passes with a draft in this phase (from `/metrics`, after − before).
    pub steps_speculative: f64,
    /// Target passes without one.
    pub steps_plain: f64,
    /// Requests of the repeat whose prompt the run had sent before, counted on its first block
    /// (the servers may hold its answer: `--fresh-prompts`).
    #[serde(default)]
    pub reused_prompts: usize,
}

/// One row of the summary: a mode at a load, over every repeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryRow {
    /// Speculation off or on.
    pub mode: Mode,
    /// The load.
    pub load: Load,
    /// Requests sent.
    pub requests: usize,
    /// Requests that failed.
    pub failed: usize,
    /// Completion tokens of the completed requests per second of the phases' wall time.
    pub throughput_tps: f64,
    /// Completed requests per second of wall time.
    pub requests_per_s: f64,
    /// Median time to first token, seconds.
    pub ttft_p50_s: Option<f64>,
    /// 99th percentile of the time to first token.
    pub ttft_p99_s: Option<f64>,
    /// Median time per output token.
    pub tpot_p50_s: Option<f64>,
    /// 99th percentile of the time per output token.
    pub tpot_p99_s: Option<f64>,
    /// Accepted / (accepted + rejected) prediction tokens; `None` when none were proposed.
    pub acceptance: Option<f64>,
    /// Target passes with a draft / all target passes; `None` without passes.
    pub spec_share: Option<f64>,
    /// Speculative rows: TPOT p50 / plain's TPOT p50 at the same load.
    pub tpot_ratio: Option<f64>,
    /// Speculative rows: the geometric mean over requests of their TPOT / the same request's
    /// plain TPOT (same repeat and index, both completed), with its 95 % bootstrap interval.
    pub tpot_paired: Option<Interval>,
    /// Speculative rows: throughput / plain's throughput at the same load.
    pub throughput_ratio: Option<f64>,
    /// Speculative rows: completed requests whose text equals plain's for the same request.
    pub same_text: Option<usize>,
    /// Requests whose prompt the run had sent before ([`PhaseRecord::reused_prompts`]).
    pub reused_prompts: usize,
}

/// The `q` quantile (0..=1, interpolated) of the finite values; `None` when there are none.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    Some(quantile(&sorted, q))
}

/// A ratio of two positive finite numbers, else `None`.
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() && b.is_finite() => Some(a / b),
        _ => None,
    }
}

/// One summary row per mode × load (in the order the loads first appear, plain first), with
/// the speculative rows' ratios to plain at the same load.
pub fn summarize(requests: &[RequestRecord], phases: &[PhaseRecord]) -> Vec<SummaryRow> {
    let mut loads: Vec<Load> = Vec::new();
    for p in phases {
        if !loads.iter().any(|l| l.same_point(&p.load)) {
            loads.push(p.load);
        }
    }
    let mut rows = Vec::new();
    for load in &loads {
        let mut plain: Option<SummaryRow> = None;
        for mode in [Mode::Plain, Mode::Speculative] {
            let here = |m: Mode, l: &Load| m == mode && l.same_point(load);
            let reqs: Vec<&RequestRecord> =
                requests.iter().filter(|r| here(r.mode, &r.load)).collect();
            let runs: Vec<&PhaseRecord> = phases.iter().filter(|p| here(p.mode, &p.load)).collect();
            if runs.is_empty() {
                continue;
            }
            let ok: Vec<&&RequestRecord> = reqs.iter().filter(|r| r.error.is_none()).collect();
            let wall: f64 = runs.iter().map(|p| p.wall_s).sum();
            let tokens: usize = ok.iter().map(|r| r.completion_tokens).sum();
            let per_s = |x: f64| if wall > 0.0 { x / wall } else { 0.0 };
            let ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft_s).collect();
            let tpot: Vec<f64> = ok.iter().filter_map(|r| r.tpot_s).collect();
            let (accepted, rejected) = ok
                .iter()
                .fold((0, 0), |(a, j), r| (a + r.accepted, j + r.rejected));
            let (spec, plain_steps) = runs.iter().fold((0.0, 0.0), |(s, p), r| {
                (s + r.steps_speculative, p + r.steps_plain)
            });
            let mut row = SummaryRow {
                mode,
                // the first phase's rate: the capacity, so the rate, is the same in every repeat
                load: runs[0].load,
                requests: reqs.len(),
                failed: reqs.len() - ok.len(),
                throughput_tps: per_s(tokens as f64),
                requests_per_s: per_s(ok.len() as f64),
                ttft_p50_s: percentile(&ttft, 0.5),
                ttft_p99_s: percentile(&ttft, 0.99),
                tpot_p50_s: percentile(&tpot, 0.5),
                tpot_p99_s: percentile(&tpot, 0.99),
                acceptance: (accepted + rejected > 0)
                    .then(|| accepted as f64 / (accepted + rejected) as f64),
                spec_share: (spec + plain_steps > 0.0).then(|| spec / (spec + plain_steps)),
                tpot_ratio: None,
                tpot_paired: None,
                throughput_ratio: None,
                same_text: None,
                reused_prompts: runs.iter().map(|p| p.reused_prompts).sum(),
            };
            if let Some(base) = &plain {
                row.tpot_ratio = ratio(row.tpot_p50_s, base.tpot_p50_s);
                row.throughput_ratio = ratio(Some(row.throughput_tps), Some(base.throughput_tps));
                // the completed plain twins, by (repeat, index)
                let twins: HashMap<(usize, usize), &RequestRecord> = requests
                    .iter()
                    .filter(|r| r.mode == Mode::Plain && r.load.same_point(load))
                    .filter(|r| r.error.is_none())
                    .map(|r| ((r.repeat, r.index), r))
                    .collect();
                let plain_of = |r: &RequestRecord| twins.get(&(r.repeat, r.index));
                row.same_text = Some(
                    ok.iter()
                        .filter(|r| plain_of(r).is_some_and(|b| b.text == r.text))
                        .count(),
                );
                let paired: Vec<f64> = ok
                    .iter()
                    .filter_map(|r| ratio(r.tpot_s, plain_of(r)?.tpot_s))
                    .collect();
                row.tpot_paired = geometric_mean_interval(&paired);
            }
            if mode == Mode::Plain {
                plain = Some(row.clone());
            }
            rows.push(row);
        }
    }
    rows
}

fn ms(x: Option<f64>) -> String {
    x.map_or_else(|| "—".into(), |s| format!("{:.1}", s * 1e3))
}

fn fixed(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "—".into(), |v| format!("{v:.digits$}"))
}

/// A paired ratio with its interval, `0.812 [0.770, 0.856]`, or `—`.
fn paired(x: Option<Interval>) -> String {
    x.map_or_else(
        || "—".into(),
        |i| format!("{:.3} [{:.3}, {:.3}]", i.mean, i.lo, i.hi),
    )
}

fn csv_num(x: Option<f64>) -> String {
    x.map_or_else(String::new, |v| format!("{v}"))
}

/// `summary.csv`: one line per row; times in seconds; empty cells where a value is undefined.
pub fn summary_csv(rows: &[SummaryRow]) -> String {
    let mut out = String::from(
        "mode,load_kind,load,rate_rps,requests,failed,throughput_tps,requests_per_s,\
         ttft_p50_s,ttft_p99_s,tpot_p50_s,tpot_p99_s,acceptance,spec_share,tpot_ratio,\
         tpot_paired,tpot_paired_lo,tpot_paired_hi,throughput_ratio,same_text\n",
    );
    for r in rows {
        let (kind, rate) = match r.load {
            Load::Rate { rate_rps, .. } => ("rate", Some(rate_rps)),
            Load::Clients { .. } => ("clients", None),
        };
        let _ = writeln!(
            out,
            "{},{kind},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.mode.name(),
            r.load.level(),
            csv_num(rate),
            r.requests,
            r.failed,
            r.throughput_tps,
            r.requests_per_s,
            csv_num(r.ttft_p50_s),
            csv_num(r.ttft_p99_s),
            csv_num(r.tpot_p50_s),
            csv_num(r.tpot_p99_s),
            csv_num(r.acceptance),
            csv_num(r.spec_share),
            csv_num(r.tpot_ratio),
            csv_num(r.tpot_paired.map(|i| i.mean)),
            csv_num(r.tpot_paired.map(|i| i.lo)),
            csv_num(r.tpot_paired.map(|i| i.hi)),
            csv_num(r.throughput_ratio),
            r.same_text.map_or_else(String::new, |n| n.to_string()),
        );
    }
    out
}

/// What the markdown header says about the run.
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// The command's settings, one `name: value` line each.
    pub settings: Vec<(String, String)>,
    /// Plain decoding's measured capacity, completed requests per second.
    pub capacity_rps: f64,
}

/// `summary.md`: the settings, the table, and whether the two targets hold (at the
/// lowest rate TPOT with speculation ≤ 0.85× without; throughput with speculation ≥ 0.95×
/// without at every client count).
pub fn summary_markdown(rows: &[SummaryRow], info: &RunInfo) -> String {
    let mut md = String::from("# specdec bench serve\n\n");
    for (name, value) in &info.settings {
        let _ = writeln!(md, "- {name}: {}", table_cell(value));
    }
    let _ = writeln!(
        md,
        "- plain decoding's capacity: {:.3} requests/s (closed loop at the batch size)\n",
        info.capacity_rps
    );
    md.push_str(
        "| mode | load | requests | failed | throughput (tok/s) | TTFT p50 / p99 (ms) | \
         TPOT p50 / p99 (ms) | acceptance | spec share | TPOT spec/plain | \
         TPOT spec/plain, paired | throughput spec/plain | same text | reused prompts |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.1} | {} / {} | {} / {} | {} | {} | {} | {} | {} | {} | {} |",
            r.mode.name(),
            r.load.label(),
            r.requests,
            r.failed,
            r.throughput_tps,
            ms(r.ttft_p50_s),
            ms(r.ttft_p99_s),
            ms(r.tpot_p50_s),
            ms(r.tpot_p99_s),
            fixed(r.acceptance, 3),
            fixed(r.spec_share, 3),
            fixed(r.tpot_ratio, 3),
            paired(r.tpot_paired),
            fixed(r.throughput_ratio, 3),
            r.same_text.map_or_else(|| "—".into(), |n| n.to_string()),
            r.reused_prompts,
        );
    }
    md.push_str(
        "\nTTFT: send to the first chunk with text. TPOT: (last chunk − first chunk) / \
         (completion tokens − 1), per request; p50 / p99 over the completed requests of every \
         repeat. Throughput: completion tokens of the completed requests / the phases' wall \
         time. TPOT spec/plain: the p50s' ratio; paired: the geometric mean of each request's \
         TPOT ratio to the same request in plain decoding, with its 95 % bootstrap interval \
         over requests. Acceptance: accepted / (accepted + rejected) prediction tokens of the usage \
         chunks. Spec share: target passes with a draft / all passes (the server's \
         `/metrics`). Same text: speculative answers equal to plain's for the same request \
         (at T = 0 greedy speculation must give plain's text). Reused prompts: requests whose \
         prompt the run had sent before (a drafter that keeps finished requests' text, as \
         `history` does, may hold its answer; `--fresh-prompts` avoids them until the pool \
         runs out).\n\n",
    );
    for line in targets(rows) {
        let _ = writeln!(md, "- {line}");
    }
    md
}

/// The two targets, each as a line saying whether it holds.
pub fn targets(rows: &[SummaryRow]) -> Vec<String> {
    let spec = |r: &&SummaryRow| r.mode == Mode::Speculative;
    let mut lines = Vec::new();
    let lowest = rows
        .iter()
        .filter(spec)
        .filter(|r| matches!(r.load, Load::Rate { .. }))
        .min_by(|a, b| a.load.level().total_cmp(&b.load.level()));
    if let Some(r) = lowest {
        let reused = match r.reused_prompts {
            0 => String::new(),
            n => format!(" ({n} of its requests reused a prompt)"),
        };
        let per_request = match r.tpot_paired {
            Some(_) => format!(" (paired per request: {})", paired(r.tpot_paired)),
            None => String::new(),
        };
        lines.push(match r.tpot_ratio {
            Some(x) => format!(
                "lowest rate ({}): TPOT spec/plain {x:.3} {} 0.85 — {}{per_request}{reused}",
                r.load.label(),
                if x <= 0.85 { "≤" } else { ">" },
                if x <= 0.85 { "holds" } else { "misses" }
            ),
            None => format!("lowest rate ({}): no TPOT ratio", r.load.label()),
        });
    }
    let saturation: Vec<&SummaryRow> = rows
        .iter()
        .filter(spec)
        .filter(|r| matches!(r.load, Load::Clients { .. }))
        .collect();
    if !saturation.is_empty() {
        let misses: Vec<String> = saturation
            .iter()
            .filter(|r| r.throughput_ratio.is_none_or(|x| x < 0.95))
            .map(|r| format!("{} ({})", r.load.label(), fixed(r.throughput_ratio, 3)))
            .collect();
        lines.push(if misses.is_empty() {
            "saturation: throughput spec/plain ≥ 0.95 at every client count — holds".into()
        } else {
            format!(
                "saturation: throughput spec/plain < 0.95 at {} — misses",
                misses.join(", ")
            )
        });
    }
    lines
}

/// Draws `tpot_by_NAME.svg` and `throughput_by_NAME.svg` for the rows whose load `keep`s, x
/// the load level; returns the paths drawn (none when no row is kept).
fn plot_pair(
    dir: &Path,
    rows: &[SummaryRow],
    keep: fn(&Load) -> bool,
    name: &str,
    x_desc: &str,
    log_x: bool,
) -> Result<Vec<PathBuf>> {
    let kept: Vec<&SummaryRow> = rows.iter().filter(|r| keep(&r.load)).collect();
    if kept.is_empty() {
        return Ok(Vec::new());
    }
    let series = |value: fn(&SummaryRow) -> Option<f64>| -> Vec<Series> {
        [Mode::Plain, Mode::Speculative]
            .iter()
            .enumerate()
            .map(|(color, &mode)| Series {
                label: mode.name().into(),
                points: kept
                    .iter()
                    .filter(|r| r.mode == mode)
                    .filter_map(|r| value(r).map(|v| (r.load.level(), v)))
                    .collect(),
                style: SeriesStyle::Line,
                color,
            })
            .collect()
    };
    let mut paths = Vec::new();
    let tpot = dir.join(format!("tpot_by_{name}.svg"));
    line_plot(
        &tpot,
        &format!("TPOT p50 against {x_desc}"),
        x_desc,
        "TPOT p50 (ms)",
        &series(|r| r.tpot_p50_s.map(|s| s * 1e3)),
        log_x,
        Legend::UpperLeft,
    )
    .map_err(ServerError::Harness)?;
    paths.push(tpot);
    let throughput = dir.join(format!("throughput_by_{name}.svg"));
    line_plot(
        &throughput,
        &format!("Throughput against {x_desc}"),
        x_desc,
        "completion tokens / s",
        &series(|r| Some(r.throughput_tps)),
        log_x,
        Legend::UpperLeft,
    )
    .map_err(ServerError::Harness)?;
    paths.push(throughput);
    Ok(paths)
}

/// Writes `requests.jsonl`, `phases.jsonl`, `summary.csv`, `summary.md` and the plots into
/// `dir` (each through a temporary file renamed into place); returns the paths written.
///
/// # Errors
/// A file that cannot be written or a plot that cannot be drawn.
pub fn write_all(
    dir: &Path,
    requests: &[RequestRecord],
    phases: &[PhaseRecord],
    rows: &[SummaryRow],
    info: &RunInfo,
) -> Result<Vec<PathBuf>> {
    let mut paths = vec![
        write_jsonl(&dir.join("requests.jsonl"), requests)?,
        write_jsonl(&dir.join("phases.jsonl"), phases)?,
    ];
    for (name, text) in [
        ("summary.csv", summary_csv(rows)),
        ("summary.md", summary_markdown(rows, info)),
    ] {
        let path = dir.join(name);
        write_atomic(&path, |w| {
            w.write_all(text.as_bytes())
                .map_err(|e| specdec_harness::HarnessError::io(&path, e))
        })?;
        paths.push(path);
    }
    let is_rate = |l: &Load| matches!(l, Load::Rate { .. });
    let is_clients = |l: &Load| matches!(l, Load::Clients { .. });
    paths.extend(plot_pair(
        dir,
        rows,
        is_rate,
        "rate",
        "rate / plain capacity",
        false,
    )?);
    paths.extend(plot_pair(
        dir,
        rows,
        is_clients,
        "clients",
        "concurrent clients",
        true,
    )?);
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_and_skip_non_finite_values() {
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(percentile(&[f64::NAN], 0.5), None);
        let xs = [5.0, 1.0, f64::NAN, 3.0, 2.0, 4.0];
        assert_eq!(percentile(&xs, 0.5), Some(3.0));
        assert_eq!(percentile(&xs, 0.0), Some(1.0));
        assert_eq!(percentile(&xs, 1.0), Some(5.0));
        // h = 4 × 0.99 = 3.96: 4 + 0.96 × (5 − 4)
        assert!((percentile(&xs, 0.99).unwrap() - 4.96).abs() < 1e-12);
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
    }

    fn record(mode: Mode, load: Load, index: usize, tpot: f64, text: &str) -> RequestRecord {
        RequestRecord {
            mode,
            load,
            repeat: 0,
            index,
            prompt_id: format!("p{index}"),
            sent_s: 0.0,
            ttft_s: Some(0.1),
            tpot_s: Some(tpot),
            e2e_s: 1.0,
            prompt_tokens: 5,
            completion_tokens: 10,
            accepted: if mode == Mode::Plain { 0 } else { 6 },
            rejected: if mode == Mode::Plain { 0 } else { 2 },
            finish_reason: Some("length".into()),
            text: text.into(),
            error: None,
        }
    }

    fn phase(mode: Mode, load: Load, wall_s: f64, spec: f64, plain: f64) -> PhaseRecord {
        PhaseRecord {
            mode,
            load,
            repeat: 0,
            block: 0,
            wall_s,
            requests: 2,
            steps_speculative: spec,
            steps_plain: plain,
            reused_prompts: 0,
        }
    }

    #[test]
    fn rows_carry_ratios_to_plain_at_the_same_load() {
        let load = Load::Clients { clients: 2 };
        let requests = vec![
            record(Mode::Plain, load, 0, 0.02, "a"),
            record(Mode::Plain, load, 1, 0.04, "b"),
            record(Mode::Speculative, load, 0, 0.01, "a"),
            RequestRecord {
                error: Some("HTTP 503".into()),
                ..record(Mode::Speculative, load, 1, 0.5, "x")
            },
        ];
        let phases = vec![
            phase(Mode::Plain, load, 2.0, 0.0, 40.0),
            phase(Mode::Speculative, load, 1.0, 3.0, 1.0),
        ];
        let rows = summarize(&requests, &phases);
        assert_eq!(rows.len(), 2);
        let (plain, spec) = (&rows[0], &rows[1]);
        assert_eq!(
            (plain.mode, plain.requests, plain.failed),
            (Mode::Plain, 2, 0)
        );
        assert_eq!(plain.throughput_tps, 10.0); // 20 tokens / 2 s
        assert!((plain.tpot_p50_s.unwrap() - 0.03).abs() < 1e-12);
        assert_eq!((plain.acceptance, plain.spec_share), (None, Some(0.0)));
        assert_eq!(plain.tpot_ratio, None);
        assert_eq!((spec.requests, spec.failed), (2, 1));
        assert_eq!(spec.throughput_tps, 10.0); // the failed request's tokens do not count
        assert_eq!(spec.acceptance, Some(0.75));
        assert_eq!(spec.spec_share, Some(0.75));
        assert!((spec.tpot_ratio.unwrap() - 0.01 / 0.03).abs() < 1e-12);
        assert_eq!(spec.throughput_ratio, Some(1.0));
        assert_eq!(spec.same_text, Some(1));
        // only request 0 completed in both modes: 0.01 / 0.02
        let pair = spec.tpot_paired.unwrap();
        assert_eq!((pair.mean, pair.n), (0.5, 1));
        assert_eq!(plain.tpot_paired, None);
        let md = summary_markdown(
            &rows,
            &RunInfo {
                settings: vec![("target".into(), "m".into())],
                capacity_rps: 1.0,
            },
        );
        assert!(
            md.contains("| speculative | 2 clients | 2 | 1 | 10.0 |"),
            "{md}"
        );
        assert!(md.contains("throughput spec/plain ≥ 0.95 at every client count — holds"));
        let csv = summary_csv(&rows);
        assert_eq!(csv.lines().count(), 3);
        assert!(csv
            .lines()
            .nth(2)
            .unwrap()
            .starts_with("speculative,clients,2,,2,1,10,"));
    }

    #[test]
    fn the_paired_ratio_pairs_each_request_with_its_plain_twin_across_blocks() {
        let load = Load::Rate {
            multiplier: 0.25,
            rate_rps: 1.0,
        };
        // plain TPOTs 20, 40, 30 ms; speculative 10, 80, 30: ratios 0.5, 2, 1 (mean of logs 0)
        let tpots = [(0.02, 0.01), (0.04, 0.08), (0.03, 0.03)];
        let mut requests = Vec::new();
        for (index, (plain, spec)) in tpots.into_iter().enumerate() {
            requests.push(record(Mode::Plain, load, index, plain, "t"));
            requests.push(record(Mode::Speculative, load, index, spec, "t"));
        }
        // two blocks of each mode, their walls summed
        let mut phases = Vec::new();
        for block in 0..2 {
            for mode in [Mode::Speculative, Mode::Plain] {
                phases.push(PhaseRecord {
                    block,
                    ..phase(mode, load, 1.5, 1.0, 1.0)
                });
            }
        }
        let rows = summarize(&requests, &phases);
        let spec = &rows[1];
        assert_eq!(spec.throughput_tps, 10.0); // 30 tokens / 3 s
        let pair = spec.tpot_paired.unwrap();
        assert!((pair.mean - 1.0).abs() < 1e-12, "{pair:?}");
        assert_eq!(pair.n, 3);
        assert!(pair.lo <= pair.mean && pair.mean <= pair.hi && pair.lo < pair.hi);
        // the p50s' ratio differs: 30 / 30 ms
        assert!((spec.tpot_ratio.unwrap() - 1.0).abs() < 1e-12);
        let lines = targets(&rows);
        assert!(
            lines[0].contains("misses (paired per request: 1.000 ["),
            "{lines:?}"
        );
        let csv = summary_csv(&rows);
        let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
        let spec_line: Vec<&str> = csv.lines().nth(2).unwrap().split(',').collect();
        assert_eq!(header.len(), spec_line.len());
        let at = header.iter().position(|h| *h == "tpot_paired").unwrap();
        assert_eq!(spec_line[at].parse::<f64>().unwrap(), pair.mean);
    }
}
