//! Acceptance rate and τ against the sampling temperature for the Qwen2.5-Coder pair (0.5B
//! drafting for 1.5B), linear K = 4, on HumanEval prompts. Leviathan et al. (2023, table 3) and
//! Chen et al. (2023) report the acceptance of a draft/target pair falling as the temperature
//! rises: at T = 0 a draft only has to match the target's argmax, at T > 0 the acceptance is the
//! overlap Σ min(p, q) of two flatter distributions.

use crate::methods::kinds::*;
use std::fmt::Write;
use std::path::Path;

use serde::Serialize;

use super::real::{baseline, fixed, qwen_config, run_config, summary, write_json, RealSize};
use super::{md_row, write_text, Cell, ReproOutput};
use crate::config::DrafterConfig;
use crate::error::{HarnessError, Result};
use crate::metrics::Interval;
use crate::report::{line_plot, Legend, Series, SeriesStyle};

/// Parameters of the reproduction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemperatureParams {
    /// Sampling temperatures (0 = greedy).
    pub temperatures: Vec<f64>,
    /// Prompts and tokens per temperature.
    pub size: RealSize,
    /// Chain length K.
    pub k: usize,
}

impl TemperatureParams {
    /// The size of the note: T ∈ {0, 0.3, 0.6, 1.0}, 2 prompts × 32 tokens (minutes on a loaded
    /// 2-core CPU).
    pub fn full() -> Self {
        TemperatureParams {
            temperatures: vec![0.0, 0.3, 0.6, 1.0],
            size: RealSize {
                prompts: 2,
                max_tokens: 32,
            },
            k: 4,
        }
    }

    /// A smoke-test size: T ∈ {0, 1}, 1 prompt × 12 tokens.
    pub fn quick() -> Self {
        TemperatureParams {
            temperatures: vec![0.0, 1.0],
            size: RealSize {
                prompts: 1,
                max_tokens: 12,
            },
            k: 4,
        }
    }
}

/// One temperature's measurements.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemperatureRow {
    /// Sampling temperature.
    pub temperature: f64,
    /// Accepted / proposed drafts of the linear method.
    pub acceptance: Option<f64>,
    /// Conditional acceptance at depth 1..=K (see [`crate::metrics::DepthAcceptance`]).
    pub acceptance_by_depth: Vec<f64>,
    /// τ (accepted + 1 per target pass), mean and 95 % interval over prompts.
    pub tau: Interval,
    /// Tokens/s of the linear method over the baseline's in the same run.
    pub speedup: f64,
    /// Baseline tokens/s.
    pub baseline_tokens_per_s: f64,
    /// Linear method tokens/s.
    pub linear_tokens_per_s: f64,
}

/// Runs every temperature (one results folder each, `dir/t0.3/` …) and writes
/// `acceptance_temperature.md`, `.json`, `acceptance_temperature.svg` (acceptance overall and
/// by depth) and `acceptance_temperature_tau.svg` (τ and speedup).
///
/// # Errors
/// Missing models (the message names the fetch command), engine errors.
pub fn run(dir: &Path, p: &TemperatureParams) -> Result<ReproOutput> {
    std::fs::create_dir_all(dir).map_err(|e| HarnessError::io(dir, e))?;
    let name = format!("linear-k{}", p.k);
    let mut rows = Vec::new();
    for &t in &p.temperatures {
        let loaded = qwen_config(
            "acceptance-temperature",
            t,
            p.size,
            1,
            vec![
                baseline(),
                fixed(&name, DrafterConfig::of(Chain::default()), p.k),
            ],
        )?;
        let results = run_config(&loaded, &dir.join(format!("t{t}")))?;
        let base = summary(&results, "baseline")?;
        let lin = summary(&results, &name)?;
        rows.push(TemperatureRow {
            temperature: t,
            acceptance: lin.acceptance_rate,
            acceptance_by_depth: lin
                .acceptance_by_depth
                .iter()
                .map(|d| d.conditional)
                .collect(),
            tau: lin.tau,
            speedup: lin.speedup,
            baseline_tokens_per_s: base.tokens_per_s,
            linear_tokens_per_s: lin.tokens_per_s,
        });
    }
    let mut files = Vec::new();
    let mut md = format!(
        "Acceptance and τ against temperature: {} drafting for {}, linear K = {}, {} HumanEval \
         prompts × {} tokens per temperature (95% bootstrap interval over prompts; speedup = tokens/s \
         over the plain baseline of the same run).\n\n\
         | T | acceptance | acceptance by depth 1..K | τ [95% CI] | speedup | baseline tok/s | linear tok/s |\n\
         |---:|---:|---|---:|---:|---:|---:|\n",
        super::real::DRAFT,
        super::real::TARGET,
        p.k,
        p.size.prompts,
        p.size.max_tokens
    );
    for r in &rows {
        let depth: Vec<String> = r
            .acceptance_by_depth
            .iter()
            .map(|a| format!("{a:.2}"))
            .collect();
        md.push_str(&md_row(&[
            Cell::Text(format!("{}", r.temperature)),
            r.acceptance.map_or(Cell::Text("–".into()), Cell::Num),
            Cell::Text(depth.join(", ")),
            Cell::Ci(r.tau),
            Cell::Num(r.speedup),
            Cell::Num(r.baseline_tokens_per_s),
            Cell::Num(r.linear_tokens_per_s),
        ]));
    }
    let _ = writeln!(
        md,
        "\nPer-temperature results folders (summary, requests, steps, plots, provenance): {}/t*/",
        dir.display()
    );
    write_text(dir, "acceptance_temperature.md", &md, &mut files)?;
    write_json(
        dir,
        "acceptance_temperature.json",
        &serde_json::json!({ "params": p, "rows": rows }),
        &mut files,
    )?;

    let mut acc_series = vec![Series {
        label: "acceptance (all depths)".into(),
        points: rows
            .iter()
            .filter_map(|r| r.acceptance.map(|a| (r.temperature, a)))
            .collect(),
        style: SeriesStyle::Line,
        color: 0,
    }];
    for d in 0..p.k {
        acc_series.push(Series {
            label: format!("depth {}", d + 1),
            points: rows
                .iter()
                .filter_map(|r| r.acceptance_by_depth.get(d).map(|&a| (r.temperature, a)))
                .collect(),
            style: SeriesStyle::Points,
            color: d + 1,
        });
    }
    let p1 = dir.join("acceptance_temperature.svg");
    line_plot(
        &p1,
        "Draft acceptance against temperature (Qwen2.5-Coder 0.5B → 1.5B, K = 4)",
        "temperature",
        "acceptance rate",
        &acc_series,
        false,
        Legend::LowerLeft,
    )?;
    files.push(p1);
    let p2 = dir.join("acceptance_temperature_tau.svg");
    line_plot(
        &p2,
        "τ and speedup against temperature",
        "temperature",
        "tokens per target pass / speedup",
        &[
            Series {
                label: "τ".into(),
                points: rows.iter().map(|r| (r.temperature, r.tau.mean)).collect(),
                style: SeriesStyle::Line,
                color: 0,
            },
            Series {
                label: "speedup".into(),
                points: rows.iter().map(|r| (r.temperature, r.speedup)).collect(),
                style: SeriesStyle::Line,
                color: 1,
            },
        ],
        false,
        Legend::LowerLeft,
    )?;
    files.push(p2);
    Ok(ReproOutput {
        markdown: md,
        files,
    })
}
