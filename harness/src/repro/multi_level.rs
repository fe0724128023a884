//! Multi-level (staged) speculation against linear speculation and n-gram drafting alone, on the
//! Qwen2.5-Coder pair: staged = an n-gram level 0 verified losslessly by the 0.5B draft, whose
//! extended chain the 1.5B target verifies (Spector & Ré 2023, "Accelerating LLM inference with
//! staged speculative decoding"; Chen et al. 2023, "Cascade speculative drafting").

use crate::methods::kinds::*;
use std::fmt::Write;
use std::path::Path;

use serde::Serialize;

use super::real::{baseline, fixed, qwen_config, run_config, write_json, RealSize, DRAFT};
use super::{md_row, write_text, Cell, ReproOutput};
use crate::config::DrafterConfig;
use crate::error::{HarnessError, Result};
use crate::metrics::Interval;
use crate::report::{bar_chart, Bar};

/// Parameters of the reproduction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MultiLevelParams {
    /// Prompts and tokens.
    pub size: RealSize,
    /// Draft length K of every speculative method.
    pub k: usize,
    /// Sampling temperature.
    pub temperature: f64,
}

impl MultiLevelParams {
    /// The size of the note: 2 HumanEval prompts × 32 tokens, greedy, K = 4.
    pub fn full() -> Self {
        MultiLevelParams {
            size: RealSize {
                prompts: 2,
                max_tokens: 32,
            },
            k: 4,
            temperature: 0.0,
        }
    }

    /// A smoke-test size: 1 prompt × 12 tokens.
    pub fn quick() -> Self {
        MultiLevelParams {
            size: RealSize {
                prompts: 1,
                max_tokens: 12,
            },
            ..Self::full()
        }
    }
}

/// One method's measurements.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MultiLevelRow {
    /// Method name.
    pub method: String,
    /// Accepted / proposed drafts (`None` for the baseline).
    pub acceptance: Option<f64>,
    /// τ with its 95 % interval over prompts.
    pub tau: Interval,
    /// Tokens/s.
    pub tokens_per_s: f64,
    /// Tokens/s over the baseline's.
    pub speedup: f64,
    /// Per-prompt speedup with its 95 % interval.
    pub speedup_per_prompt: Option<Interval>,
    /// Fraction of the method's step time spent drafting.
    pub draft_share: f64,
}

/// Runs baseline, n-gram, linear and staged on the Qwen pair into `dir/run/` and writes
/// `multi_level.md`, `multi_level.json` and `multi_level.svg` (speedup per method).
///
/// # Errors
/// Missing models, engine errors.
pub fn run(dir: &Path, p: &MultiLevelParams) -> Result<ReproOutput> {
    std::fs::create_dir_all(dir).map_err(|e| HarnessError::io(dir, e))?;
    let k = p.k;
    let methods = vec![
        baseline(),
        fixed(&format!("ngram-k{k}"), DrafterConfig::of(Ngram { n: 3 }), k),
        fixed(
            &format!("linear-k{k}"),
            DrafterConfig::of(Chain::default()),
            k,
        ),
        fixed(
            &format!("staged-k{k}"),
            DrafterConfig::of(Staged {
                levels: vec![DRAFT.into()],
                head: None,
            }),
            k,
        ),
    ];
    let loaded = qwen_config("multi-level", p.temperature, p.size, 1, methods)?;
    let results = run_config(&loaded, &dir.join("run"))?;
    let rows: Vec<MultiLevelRow> = results
        .summaries
        .iter()
        .map(|s| MultiLevelRow {
            method: s.method.clone(),
            acceptance: s.acceptance_rate,
            tau: s.tau,
            tokens_per_s: s.tokens_per_s,
            speedup: s.speedup,
            speedup_per_prompt: s.speedup_per_prompt,
            draft_share: s.time_split.draft_s / s.time_split.decode_s().max(f64::MIN_POSITIVE),
        })
        .collect();
    let mut files = Vec::new();
    let mut md = format!(
        "Multi-level vs linear vs n-gram: {} (target) on {} HumanEval prompts × {} tokens, T = {}, \
         K = {k} (95% bootstrap intervals over prompts).\n\n\
         | method | acceptance | τ [95% CI] | tokens/s | speedup | per-prompt speedup [95% CI] | draft share |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        super::real::TARGET,
        p.size.prompts,
        p.size.max_tokens,
        p.temperature
    );
    for r in &rows {
        md.push_str(&md_row(&[
            Cell::Text(r.method.clone()),
            r.acceptance.map_or(Cell::Text("–".into()), Cell::Num),
            Cell::Ci(r.tau),
            Cell::Num(r.tokens_per_s),
            Cell::Num(r.speedup),
            r.speedup_per_prompt
                .map_or(Cell::Text("–".into()), Cell::Ci),
            Cell::Num(r.draft_share),
        ]));
    }
    let _ = writeln!(
        md,
        "\nFull results (requests, steps, time split, provenance): {}/run/",
        dir.display()
    );
    write_text(dir, "multi_level.md", &md, &mut files)?;
    write_json(
        dir,
        "multi_level.json",
        &serde_json::json!({ "params": p, "rows": rows }),
        &mut files,
    )?;
    let bars: Vec<Bar> = rows
        .iter()
        .map(|r| Bar {
            label: r.method.clone(),
            value: r.speedup,
            interval: r.speedup_per_prompt.map(|i| (i.lo, i.hi)),
        })
        .collect();
    let plot = dir.join("multi_level.svg");
    bar_chart(
        &plot,
        "Multi-level vs linear vs n-gram: speedup over plain decoding",
        "speedup (tokens/s ratio; whisker: per-prompt 95% CI)",
        &bars,
        Some(1.0),
    )?;
    files.push(plot);
    Ok(ReproOutput {
        markdown: md,
        files,
    })
}
