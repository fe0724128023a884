//! Continuous batching over batch sizes 1–16: where speculation stops paying and how the
//! policies respond. A batched step verifies every sequence's tokens in one target pass, so the
//! cost of K drafts grows with the batch: once the batch alone fills the hardware, extra tokens
//! cost nearly their full price and speculation loses (SpecInfer/vLLM observations; Liu et al.
//! 2024, "Optimizing speculative decoding for serving LLMs using goodput", SmartSpec).
//!
//! Simulated ([`crate::simulation::simulate_batched`]) from the measured cost curve over tokens
//! per pass and per-prompt acceptance rates measured on the Qwen pair; plus a real run of the
//! engine at batch 1 and 4. Methods: plain, fixed K, the acceptance-threshold disable gate, and
//! the cost-model policy fed the batch-1 costs or the per-sequence costs at the run's batch
//! size. `--quick` loads no model (built-in cost curve and acceptance rates).

use crate::methods::kinds::*;
use std::fmt::Write;
use std::path::Path;

use serde::Serialize;

use super::real::{
    baseline, fixed, measure_curve, qwen_config, with_policy, write_json, RealSize, CURVE_POINTS,
    DRAFT,
};
use super::tree_scaling::builtin_cpu_cost;
use super::{md_row, write_text, Cell, ReproOutput};
use crate::config::{DrafterConfig, PolicyConfig};
use crate::error::{HarnessError, Result};
use crate::methods::{PolicyContext, PolicyCosts, PolicyKind};
use crate::report::{line_plot, Legend, Series, SeriesStyle};
use crate::runner::LoadedModel;
use crate::simulation::{simulate_batched, AcceptanceProcess, CostCurve, CostModel};
use specdec_algorithms::policy::{Budget, FixedPolicy, SpeculationPolicy};

/// Built-in per-prompt acceptance rates (`--quick`): an assumed spread of easy and hard prompts
/// (a full run measures them per prompt on the Qwen pair instead).
pub const BUILTIN_ALPHAS: [f64; 4] = [0.55, 0.68, 0.78, 0.86];

/// The real part's size.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchCheck {
    /// Prompts × tokens of each real run.
    pub size: RealSize,
    /// Batch sizes run for real.
    pub batches: Vec<usize>,
}

/// Parameters of the reproduction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchingParams {
    /// Batch sizes simulated.
    pub batches: Vec<usize>,
    /// Simulated requests per batch size.
    pub requests: usize,
    /// Tokens per simulated request.
    pub max_tokens: usize,
    /// K of the fixed and gated methods; k_max of the cost-model policy is 2K.
    pub k: usize,
    /// Seed of the acceptance draws.
    pub seed: u64,
    /// Real runs (`None`: built-in cost curve and acceptance rates).
    pub real: Option<BatchCheck>,
}

impl BatchingParams {
    /// The note's size: batches 1, 2, 4, 8, 16, 64 requests × 128 tokens; real runs at batch 1
    /// and 4 on 4 prompts × 16 tokens.
    pub fn full() -> Self {
        BatchingParams {
            batches: vec![1, 2, 4, 8, 16],
            requests: 64,
            max_tokens: 128,
            k: 4,
            seed: 16,
            real: Some(BatchCheck {
                size: RealSize {
                    prompts: 4,
                    max_tokens: 16,
                },
                batches: vec![1, 4],
            }),
        }
    }

    /// No models: batches 1, 4, 16, 16 requests × 32 tokens.
    pub fn quick() -> Self {
        BatchingParams {
            batches: vec![1, 4, 16],
            requests: 16,
            max_tokens: 32,
            real: None,
            ..Self::full()
        }
    }
}

/// An H200-like roofline (assumed): a target pass costs 3.5 ms up to 32 tokens in the batch
/// (memory-bound), then 0.11 ms per extra token (compute-bound); a draft pass 0.6 ms up to 32
/// tokens, then 0.019 ms per token. Knee low enough that batches of 1–16 with K = 4 cross it.
pub fn gpu_roofline() -> (CostModel, CostCurve) {
    let tokens = vec![1, 32, 64, 128, 256];
    (
        CostModel {
            draft_ms_per_token: 0.6,
            target: CostCurve::Points {
                tokens: tokens.clone(),
                ms: vec![3.5, 3.6, 7.1, 14.1, 28.2],
            },
            verify_ms: 0.05,
            commit_ms: 0.02,
            overhead_ms: 0.1,
            link: None,
        },
        CostCurve::Points {
            tokens,
            ms: vec![0.6, 0.62, 1.22, 2.44, 4.88],
        },
    )
}

/// One simulated (batch, method) cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchRow {
    /// Cost scenario.
    pub cost: String,
    /// Batch size (requests in flight).
    pub batch: usize,
    /// Method.
    pub method: String,
    /// Simulated tokens/s.
    pub tokens_per_s: f64,
    /// Over plain decoding at the same batch size.
    pub speedup: f64,
    /// Accepted / proposed drafts.
    pub acceptance: Option<f64>,
    /// Fraction of sequence-steps that speculated.
    pub speculating: f64,
    /// Mean K over speculating sequence-steps.
    pub mean_k: f64,
}

/// One real (batch, method) run, with the simulation's prediction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RealBatchRow {
    /// Batch size.
    pub batch: usize,
    /// Method.
    pub method: String,
    /// Measured tokens/s.
    pub tokens_per_s: f64,
    /// Measured speedup over the baseline of the same run.
    pub speedup: f64,
    /// Measured acceptance.
    pub acceptance: Option<f64>,
    /// The simulation's speedup for the same batch, prompts and tokens.
    pub speedup_simulated: f64,
}

/// The simulated methods at batch `b`: (name, policy).
fn methods_at(
    b: usize,
    k: usize,
    cost: &CostModel,
    draft: Option<&CostCurve>,
) -> Result<Vec<(String, Box<dyn SpeculationPolicy>)>> {
    let k_max = 2 * k;
    let cost_optimal = CostOptimal::up_to(k_max);
    let chain = |costs| PolicyContext {
        method: "batching",
        drafter: "chain",
        is_chain: true,
        shape: None,
        costs,
    };
    let at_one = cost
        .per_sequence_at_batch(1, k_max, draft)
        .policy_costs(k_max)?;
    let at_b = cost
        .per_sequence_at_batch(b, k_max, draft)
        .policy_costs(k_max)?;
    Ok(vec![
        ("plain".into(), Box::new(FixedPolicy::new(Budget::Plain))),
        (format!("fixed K={k}"), Box::new(FixedPolicy::chain(k))),
        (
            format!("gate (K={k}, off < 0.35)"),
            threshold(k).build(&chain(PolicyCosts::Unknown))?,
        ),
        (
            "cost model, batch-1 costs".into(),
            cost_optimal.build(&chain(PolicyCosts::Given(&at_one)))?,
        ),
        (
            "cost model, batch-aware".into(),
            cost_optimal.build(&chain(PolicyCosts::Given(&at_b)))?,
        ),
    ])
}

fn threshold(k: usize) -> Threshold {
    Threshold {
        k,
        min_acceptance: 0.35,
        probe_every: 16,
    }
}

/// Simulates every method at every batch size.
///
/// # Errors
/// Bad parameters.
#[allow(clippy::too_many_arguments)]
pub fn simulate(
    scenario: &str,
    p: &BatchingParams,
    requests: usize,
    max_tokens: usize,
    batches: &[usize],
    acceptance: &AcceptanceProcess,
    cost: &CostModel,
    draft: Option<&CostCurve>,
) -> Result<Vec<BatchRow>> {
    let mut rows = Vec::new();
    for &b in batches {
        let mut plain_tps = None;
        for (name, policy) in methods_at(b, p.k, cost, draft)? {
            let run = simulate_batched(
                requests,
                b,
                max_tokens,
                acceptance,
                cost,
                draft,
                policy.as_ref(),
                p.seed,
            )?;
            let tps = run.tokens_per_s();
            let plain = *plain_tps.get_or_insert(tps);
            rows.push(BatchRow {
                cost: scenario.to_string(),
                batch: b,
                method: name,
                tokens_per_s: tps,
                speedup: tps / plain,
                acceptance: run.acceptance(),
                speculating: run.speculative_fraction(),
                mean_k: run.proposed as f64 / run.speculative_steps.max(1) as f64,
            });
        }
    }
    Ok(rows)
}

/// Runs the reproduction into `dir`: `batching.md`, `batching.json`,
/// `batching_{throughput,speedup}_{cpu,gpu}.svg`, and with models the real runs' folders `dir/real-b1/`, `dir/real-b4/`.
///
/// # Errors
/// Missing models (full size), engine errors.
pub fn run(dir: &Path, p: &BatchingParams) -> Result<ReproOutput> {
    std::fs::create_dir_all(dir).map_err(|e| HarnessError::io(dir, e))?;
    let (mut cost, mut draft) = builtin_cpu_cost();
    let mut alphas = BUILTIN_ALPHAS.to_vec();
    let mut real_rows = Vec::new();
    if let Some(check) = &p.real {
        let k = p.k;
        let methods = vec![
            baseline(),
            fixed(
                &format!("fixed-k{k}"),
                DrafterConfig::of(Chain::default()),
                k,
            ),
            with_policy(
                &format!("gate-k{k}"),
                DrafterConfig::of(Chain::default()),
                PolicyConfig::of(threshold(k)),
            ),
        ];
        let mut per_batch = Vec::new();
        for &b in &check.batches {
            let loaded = qwen_config("batching", 0.0, check.size, b, methods.clone())?;
            let mut backend = crate::runner::EngineBackend::new(&loaded.config)?;
            if per_batch.is_empty() {
                eprintln!("batching: measuring the cost curves");
                let target = measure_curve(backend.target_mut(), &CURVE_POINTS)?;
                let mut d = LoadedModel::open(DRAFT)?.instantiate_one()?;
                draft = measure_curve(&mut d, &CURVE_POINTS)?;
                cost = CostModel {
                    draft_ms_per_token: draft.ms(1),
                    target,
                    ..cost
                };
            }
            let results =
                super::real::run_on(&loaded, &mut backend, &dir.join(format!("real-b{b}")))?;
            if per_batch.is_empty() {
                // Per-prompt acceptance of the fixed-K run at the first batch size.
                let measured: Vec<f64> = results
                    .requests
                    .iter()
                    .filter(|r| r.method == format!("fixed-k{k}") && r.proposed > 0)
                    .map(|r| r.accepted as f64 / r.proposed as f64)
                    .collect();
                if !measured.is_empty() {
                    alphas = measured;
                }
            }
            per_batch.push((b, results));
        }
        let acceptance = AcceptanceProcess::PerRequest {
            alphas: alphas.clone(),
        };
        for (b, results) in &per_batch {
            let sim = simulate(
                "CPU",
                p,
                check.size.prompts,
                check.size.max_tokens,
                &[*b],
                &acceptance,
                &cost,
                Some(&draft),
            )?;
            for s in &results.summaries {
                let predicted = match s.method.as_str() {
                    "baseline" => Some(1.0),
                    m if m.starts_with("fixed") => sim.get(1).map(|r| r.speedup),
                    m if m.starts_with("gate") => sim.get(2).map(|r| r.speedup),
                    _ => None,
                };
                real_rows.push(RealBatchRow {
                    batch: *b,
                    method: s.method.clone(),
                    tokens_per_s: s.tokens_per_s,
                    speedup: s.speedup,
                    acceptance: s.acceptance_rate,
                    speedup_simulated: predicted.unwrap_or(f64::NAN),
                });
            }
        }
    }
    let acceptance = AcceptanceProcess::PerRequest {
        alphas: alphas.clone(),
    };
    let cpu_name = if p.real.is_some() {
        "CPU (measured)"
    } else {
        "CPU (built in)"
    };
    let (gpu, gpu_draft) = gpu_roofline();
    let mut rows = simulate(
        cpu_name,
        p,
        p.requests,
        p.max_tokens,
        &p.batches,
        &acceptance,
        &cost,
        Some(&draft),
    )?;
    rows.extend(simulate(
        "GPU-like roofline (assumed)",
        p,
        p.requests,
        p.max_tokens,
        &p.batches,
        &acceptance,
        &gpu,
        Some(&gpu_draft),
    )?);

    let mut files = Vec::new();
    let mut md = format!(
        "Continuous batching in simulation: {} requests × {} tokens per batch size, request i \
         accepting each draft with α = {:?}[i mod {}] ({}), CPU cost curve ({}: target ms at \
         tokens per pass {:?}). Speedup = tokens/s over plain decoding at the same batch size.\n\n\
         GPU-like roofline (assumed): target 3.5 ms per pass up to 32 tokens, 0.11 ms per extra \
         token beyond; draft 0.6 ms up to 32 tokens.\n\n\
         | cost | batch | method | tokens/s | speedup | acceptance | speculating | mean K |\n\
         |---|---:|---|---:|---:|---:|---:|---:|\n",
        p.requests,
        p.max_tokens,
        alphas
            .iter()
            .map(|a| (a * 100.0).round() / 100.0)
            .collect::<Vec<_>>(),
        alphas.len(),
        if p.real.is_some() {
            "per-prompt rates measured in this run"
        } else {
            "built-in rates"
        },
        if p.real.is_some() {
            "measured in this run"
        } else {
            "built in"
        },
        CURVE_POINTS
            .iter()
            .map(|&n| (cost.target.ms(n) * 10.0).round() / 10.0)
            .collect::<Vec<_>>(),
    );
    for r in &rows {
        md.push_str(&md_row(&[
            Cell::Text(r.cost.clone()),
            Cell::Text(r.batch.to_string()),
            Cell::Text(r.method.clone()),
            Cell::Num(r.tokens_per_s),
            Cell::Num(r.speedup),
            r.acceptance.map_or(Cell::Text("–".into()), Cell::Num),
            Cell::Num(r.speculating),
            Cell::Num(r.mean_k),
        ]));
    }
    if !real_rows.is_empty() {
        md.push_str(
            "\n## Real runs (engine, Qwen pair, greedy, continuous batching)\n\n\
             | batch | method | tokens/s | speedup | acceptance | simulated speedup |\n\
             |---:|---|---:|---:|---:|---:|\n",
        );
        for r in &real_rows {
            md.push_str(&md_row(&[
                Cell::Text(r.batch.to_string()),
                Cell::Text(r.method.clone()),
                Cell::Num(r.tokens_per_s),
                Cell::Num(r.speedup),
                r.acceptance.map_or(Cell::Text("–".into()), Cell::Num),
                Cell::Num(r.speedup_simulated),
            ]));
        }
        let _ = writeln!(md, "\nReal run folders: {}/real-b*/", dir.display());
    }
    write_text(dir, "batching.md", &md, &mut files)?;
    write_json(
        dir,
        "batching.json",
        &serde_json::json!({
            "params": p,
            "alphas": alphas,
            "cost": cost,
            "draft_curve": draft,
            "gpu_roofline": gpu, "gpu_roofline_draft": gpu_draft, "rows": rows,
            "real": real_rows,
        }),
        &mut files,
    )?;
    let mut names: Vec<String> = Vec::new();
    for r in &rows {
        if !names.contains(&r.method) {
            names.push(r.method.clone());
        }
    }
    let series_of = |scenario: &str, value: fn(&BatchRow) -> f64| -> Vec<Series> {
        names
            .iter()
            .enumerate()
            .map(|(i, name)| Series {
                label: name.clone(),
                points: rows
                    .iter()
                    .filter(|r| &r.method == name && r.cost == scenario)
                    .map(|r| (r.batch as f64, value(r)))
                    .collect(),
                style: SeriesStyle::Line,
                color: i,
            })
            .collect()
    };
    for (file, scenario, label) in [
        ("cpu", cpu_name, "CPU cost curve"),
        ("gpu", "GPU-like roofline (assumed)", "GPU-like roofline"),
    ] {
        for (kind, title, y, value) in [
            (
                "throughput",
                "Simulated throughput against batch size",
                "tokens/s",
                (|r: &BatchRow| r.tokens_per_s) as fn(&BatchRow) -> f64,
            ),
            (
                "speedup",
                "Speedup over plain decoding at the same batch size",
                "speedup",
                |r: &BatchRow| r.speedup,
            ),
        ] {
            let path = dir.join(format!("batching_{kind}_{file}.svg"));
            line_plot(
                &path,
                &format!("{title} ({label})"),
                "batch size",
                y,
                &series_of(scenario, value),
                true,
                Legend::UpperLeft,
            )?;
            files.push(path);
        }
    }
    Ok(ReproOutput {
        markdown: md,
        files,
    })
}
