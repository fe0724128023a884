//! Tree-size scaling, the Sequoia figure (Chen et al. 2024, "Sequoia: scalable, robust and
//! hardware-aware speculative decoding", fig. 1/4): mean accepted length τ and speedup against
//! the draft-node budget for a chain, k-ary trees, an EAGLE-2-style dynamic tree and the
//! Sequoia DP-optimal tree.
//!
//! The comparison runs in simulation ([`crate::simulation::TreeAcceptance`]) from an acceptance
//! table measured on the Qwen2.5-Coder pair: the target's greedy continuation of HumanEval
//! prompts is teacher-forced through target and draft, and at every position the rank of the
//! target's token in the draft's ranking is recorded. Rank-0 acceptance by depth comes from runs
//! of matches (a chain's depth-d draft is the draft's argmax after d − 1 accepted tokens); the
//! acceptance of rank r ≥ 1 given ranks < r missed is pooled over positions; the per-step spread
//! (Beta concentration) from the variance of the draft's top-1 probability. A small real run of
//! the engine's chain and Sequoia drafters checks the simulated τ. `--quick` skips the models
//! and uses the table and cost curve built in below (measured by an earlier full run).

use crate::methods::kinds::*;
use std::fmt::Write;
use std::path::Path;

use serde::Serialize;
use specdec_algorithms::trees::{sequoia_tree, SequoiaPlanner, TreeShape};
use specdec_kernels::TreeTopology;
use specdec_models::SequenceStep;

use super::real::{
    baseline, fixed, measure_curve, qwen_config, run_on, summary, write_json, RealSize, DRAFT,
    TARGET,
};
use super::{md_row, write_text, Cell, ReproOutput};
use crate::config::{DrafterConfig, PromptSet};
use crate::engine::Request;
use crate::error::{HarnessError, Result};
use crate::methods::drafters::{SEQUOIA_ALPHAS, SEQUOIA_MAX_DEPTH};
use crate::metrics::{mean_interval, Interval};
use crate::report::{line_plot, Legend, Series, SeriesStyle};
use crate::runner::{EngineBackend, LoadedModel};
use crate::simulation::{accepted_length, dynamic_tree, CostCurve, CostModel, TreeAcceptance};
use specdec_kernels::sampling::SamplingParams;

/// Ranks measured per position (the rest count as "not among the candidates").
const RANKS: usize = 8;
/// Depths of the measured rank-0 acceptance.
const DEPTHS: usize = 8;
/// Depth limit of the dynamic and Sequoia trees.
const MAX_DEPTH: usize = 16;

/// The built-in acceptance table (`--quick`): measured by a full run on the Qwen pair, greedy,
/// 4 HumanEval prompts × 64 tokens (see experiments/repro/tree-scaling/README.md; ranks ≥ 1 rest
/// on 23 positions). Row d: depth d + 1; entry r: rank r.
pub fn builtin_acceptance() -> TreeAcceptance {
    let ranks = [0.43, 0.31, 0.44, 0.40, 0.0, 0.33, 0.0];
    let rank0_by_depth = [0.91, 0.92, 0.92, 0.92, 0.91, 0.91, 0.90, 0.91];
    let rows = rank0_by_depth
        .iter()
        .map(|&a0| std::iter::once(a0).chain(ranks).collect())
        .collect();
    TreeAcceptance::new(rows, Some(0.85)).expect("valid built-in table")
}

/// The built-in CPU cost model (`--quick`): the Qwen 1.5B target's pass cost at 1–16 tokens and
/// the 0.5B draft's per token as in experiments/sim-fixed-k.toml (measured on this 2-core CPU
/// when it was quiet); the points beyond 16 tokens and the draft curve's shape are assumed
/// (about 5 ms per extra target token, 2.3 ms per extra draft token).
pub fn builtin_cpu_cost() -> (CostModel, CostCurve) {
    let tokens = super::real::CURVE_POINTS.to_vec();
    let target = CostCurve::Points {
        tokens: tokens.clone(),
        ms: vec![26.5, 39.3, 63.7, 96.8, 115.4, 190.0, 350.0, 510.0],
    };
    let draft = CostCurve::Points {
        tokens,
        ms: vec![15.2, 19.0, 27.0, 38.0, 52.0, 85.0, 155.0, 225.0],
    };
    (
        CostModel {
            draft_ms_per_token: 15.2,
            target,
            verify_ms: 1.0,
            commit_ms: 0.2,
            overhead_ms: 0.5,
            link: None,
        },
        draft,
    )
}

/// An H200-like cost model (assumed, as in ../placement): a target pass of 3.5 ms + 0.005 ms per
/// extra token, a draft pass of 0.6 ms (the same shape), small verify/commit/overhead.
pub fn gpu_like_cost() -> CostModel {
    CostModel {
        draft_ms_per_token: 0.6,
        target: CostCurve::Affine {
            base_ms: 3.5,
            per_token_ms: 0.005,
        },
        verify_ms: 0.05,
        commit_ms: 0.02,
        overhead_ms: 0.1,
        link: None,
    }
}

/// How big the real-model parts are.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TreeMeasureSize {
    /// Prompts × tokens of the greedy continuation teacher-forced to measure the table.
    pub measure: RealSize,
    /// Prompts × tokens of the real check.
    pub check: RealSize,
    /// Node budgets of the engine's Sequoia drafter in the real check.
    pub check_budgets: Vec<usize>,
}

/// Parameters of the reproduction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TreeScalingParams {
    /// Draft-node budgets.
    pub budgets: Vec<usize>,
    /// Simulated steps per (budget, tree).
    pub steps: usize,
    /// Children per node of the dynamic tree.
    pub top_k: usize,
    /// Seed of the simulated worlds.
    pub seed: u64,
    /// Real-model measurement and check; `None`: the built-in table and cost curve.
    pub measure: Option<TreeMeasureSize>,
}

impl TreeScalingParams {
    /// The note's size: budgets 4..64, 20 000 steps, measured on 4 prompts × 64 tokens, checked
    /// on 2 prompts × 32 tokens at budgets 4 and 16.
    pub fn full() -> Self {
        TreeScalingParams {
            budgets: vec![4, 8, 16, 32, 64],
            steps: 20_000,
            top_k: 8,
            seed: 2024,
            measure: Some(TreeMeasureSize {
                measure: RealSize {
                    prompts: 4,
                    max_tokens: 64,
                },
                check: RealSize {
                    prompts: 2,
                    max_tokens: 32,
                },
                check_budgets: vec![4, 16],
            }),
        }
    }

    /// No models, budgets 4, 8, 16, 2 000 steps.
    pub fn quick() -> Self {
        TreeScalingParams {
            budgets: vec![4, 8, 16],
            steps: 2_000,
            measure: None,
            ..Self::full()
        }
    }
}

/// What the teacher-forced measurement saw.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankMeasurement {
    /// Positions measured.
    pub positions: usize,
    /// Positions whose target token was the draft's rank r (r < 8); the last entry counts the
    /// rest.
    pub rank_counts: Vec<usize>,
    /// Rank-0 acceptance at depth 1..=8 given every shallower draft accepted.
    pub rank0_by_depth: Vec<f64>,
    /// Acceptance of rank r given ranks < r missed, r = 0..8, pooled over positions.
    pub rank_conditional: Vec<f64>,
    /// Mean of the draft's top-1 probability.
    pub top1_mean: f64,
    /// Variance of the draft's top-1 probability.
    pub top1_var: f64,
    /// The Beta concentration used: m(1 − m)/var − 1 with m the rank-0 acceptance, in [0.5, 50].
    pub concentration: f64,
}

/// One simulated (budget, tree) cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TreeRow {
    /// Draft-node budget.
    pub budget: usize,
    /// Tree kind.
    pub tree: String,
    /// Mean draft nodes used.
    pub nodes: f64,
    /// Mean depth.
    pub depth: f64,
    /// Exact expected τ for static shapes.
    pub tau_analytic: Option<f64>,
    /// Simulated τ, mean and 95 % interval over steps.
    pub tau_sim: Interval,
    /// Simulated speedup over plain decoding with the CPU cost curve.
    pub speedup_cpu: f64,
    /// Simulated speedup with the H200-like cost model.
    pub speedup_gpu: f64,
}

/// One real-check method.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckRow {
    /// Method.
    pub method: String,
    /// Draft nodes of its tree.
    pub nodes: usize,
    /// τ the measured table predicts for its shape.
    pub tau_predicted: f64,
    /// τ measured, with its interval over prompts.
    pub tau_measured: Interval,
    /// Speedup the simulation predicts with the measured CPU curve.
    pub speedup_predicted: f64,
    /// Measured speedup (tokens/s over the baseline's).
    pub speedup_measured: f64,
}

/// The first `n` nodes of the infinite k-ary tree in breadth-first order.
pub fn bfs_k_ary(k: usize, n: usize) -> TreeShape {
    let mut paths: Vec<Vec<usize>> = Vec::with_capacity(n);
    let mut queue = std::collections::VecDeque::from([Vec::new()]);
    while paths.len() < n {
        let Some(p) = queue.pop_front() else { break };
        for r in 0..k {
            if paths.len() == n {
                break;
            }
            let mut c: Vec<usize> = p.clone();
            c.push(r);
            paths.push(c.clone());
            queue.push_back(c);
        }
    }
    TreeShape::from_choices(&paths).expect("breadth-first paths are prefix-closed")
}

/// Measures the acceptance table on the Qwen pair (see the module docs).
///
/// # Errors
/// Missing models, engine errors.
pub fn measure_table(
    backend: &mut EngineBackend,
    size: RealSize,
) -> Result<(TreeAcceptance, RankMeasurement)> {
    let prompts = PromptSet::Humaneval {
        count: Some(size.prompts),
        chat: None,
    }
    .load(Path::new("."))?;
    let loaded = LoadedModel::open(DRAFT)?;
    let mut draft = loaded.instantiate_one()?;
    let mut rank_counts = vec![0usize; RANKS + 1];
    let mut matches: Vec<Vec<bool>> = Vec::new();
    let mut top1 = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let request = Request {
            id: i as u64,
            seed: None,
            workload: None,
            prompt: backend.encode(&prompt.text, false)?,
            stop: backend.stop_rule(size.max_tokens),
        };
        let generation = backend
            .run_requests(
                &baseline(),
                std::slice::from_ref(&request),
                &mut |_, _| {},
                &mut |_| {},
            )?
            .pop()
            .ok_or_else(|| HarnessError::Metrics("no generation".into()))?;
        let mut full = request.prompt.clone();
        full.extend(&generation.tokens);
        let start = request.prompt.len() - 1;
        let target_rows = forward_all(backend.target_mut(), &full)?;
        let draft_rows = forward_all(&mut draft, &full)?;
        let vocab = target_rows.len() / full.len();
        let draft_vocab = draft_rows.len() / full.len();
        let mut m = Vec::new();
        for pos in start..full.len() - 1 {
            let t_row = &target_rows[pos * vocab..(pos + 1) * vocab];
            let d_row = &draft_rows[pos * draft_vocab..(pos + 1) * draft_vocab];
            let token = argmax(t_row);
            let rank = rank_of(d_row, token);
            rank_counts[rank.min(RANKS)] += 1;
            m.push(rank == 0);
            top1.push(top1_probability(d_row));
        }
        matches.push(m);
    }
    let positions: usize = matches.iter().map(Vec::len).sum();
    if positions == 0 {
        return Err(HarnessError::Metrics(
            "no generated positions to measure".into(),
        ));
    }
    let mut rank0_by_depth = Vec::with_capacity(DEPTHS);
    for d in 1..=DEPTHS {
        let (mut num, mut den) = (0usize, 0usize);
        for m in &matches {
            for i in 0..m.len() {
                if i + d > m.len() || !m[i..i + d - 1].iter().all(|&x| x) {
                    continue;
                }
                den += 1;
                num += usize::from(m[i + d - 1]);
            }
        }
        let prev = rank0_by_depth.last().copied().unwrap_or(0.5);
        rank0_by_depth.push(if den >= 10 {
            num as f64 / den as f64
        } else {
            prev
        });
    }
    let mut rank_conditional = Vec::with_capacity(RANKS);
    let mut remaining = positions;
    for &c in &rank_counts[..RANKS] {
        rank_conditional.push(if remaining > 0 {
            c as f64 / remaining as f64
        } else {
            0.0
        });
        remaining -= c;
    }
    let n = top1.len() as f64;
    let top1_mean = top1.iter().sum::<f64>() / n;
    let top1_var = top1.iter().map(|x| (x - top1_mean).powi(2)).sum::<f64>() / n;
    let m0 = rank_conditional[0];
    let concentration = (m0 * (1.0 - m0) / top1_var.max(1e-9) - 1.0).clamp(0.5, 50.0);
    let rows = rank0_by_depth
        .iter()
        .map(|&a0| {
            std::iter::once(a0)
                .chain(rank_conditional[1..].iter().copied())
                .collect()
        })
        .collect();
    let table = TreeAcceptance::new(rows, Some(concentration))?;
    Ok((
        table,
        RankMeasurement {
            positions,
            rank_counts,
            rank0_by_depth,
            rank_conditional,
            top1_mean,
            top1_var,
            concentration,
        },
    ))
}

/// Logits of every position of `tokens` (one chained forward on a fresh sequence).
fn forward_all(model: &mut dyn specdec_models::LanguageModel, tokens: &[u32]) -> Result<Vec<f32>> {
    let seq = model.new_sequence()?;
    let chain = TreeTopology::chain(tokens.len());
    let out = model.forward(&[SequenceStep::chain(seq, tokens, &chain)]);
    model.release(seq)?;
    let mut out = out?;
    Ok(out.pop().map(|l| l.into_vec()).unwrap_or_default())
}

/// The largest logit's id (ties to the lower id; NaN never wins).
fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (j, &x) in row.iter().enumerate() {
        if x > row[best] || row[best].is_nan() && !x.is_nan() {
            best = j;
        }
    }
    best
}

/// Rank of `token` in `row` by descending logit, ties to the lower id.
fn rank_of(row: &[f32], token: usize) -> usize {
    let v = row.get(token).copied().unwrap_or(f32::NEG_INFINITY);
    row.iter()
        .enumerate()
        .filter(|&(j, &x)| x > v || (x == v && j < token))
        .count()
}

/// The softmax probability of the largest logit.
fn top1_probability(row: &[f32]) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    1.0 / z
}

/// Simulates every tree kind at every budget.
///
/// # Errors
/// Bad acceptance vectors.
pub fn simulate(
    p: &TreeScalingParams,
    acc: &TreeAcceptance,
    cpu: &CostModel,
    cpu_draft: Option<&CostCurve>,
    gpu: &CostModel,
) -> Result<Vec<TreeRow>> {
    let max_budget = p.budgets.iter().copied().max().unwrap_or(1);
    let planner = SequoiaPlanner::new(&acc.rank_vector(), max_budget, MAX_DEPTH)?;
    let cpu_plain = cpu.step(0).total_s();
    let gpu_plain = gpu.step(0).total_s();
    let mut rows = Vec::new();
    for &n in &p.budgets {
        let statics = [
            ("chain", TreeShape::chain(n)),
            ("binary (2-ary)", bfs_k_ary(2, n)),
            ("4-ary", bfs_k_ary(4, n)),
            ("Sequoia DP", planner.tree(n, MAX_DEPTH).shape),
        ];
        let kinds = statics.len() + 1;
        let mut taus = vec![Vec::with_capacity(p.steps); kinds];
        let mut cpu_s = vec![0.0; kinds];
        let mut gpu_s = vec![0.0; kinds];
        let mut nodes = vec![0.0; kinds];
        let mut depth = vec![0.0; kinds];
        for s in 0..p.steps {
            let world = acc.world(p.seed, s as u64);
            let dynamic = dynamic_tree(&world, n, p.top_k, MAX_DEPTH);
            for (i, shape) in statics
                .iter()
                .map(|(_, s)| s)
                .chain(std::iter::once(&dynamic))
                .enumerate()
            {
                taus[i].push((accepted_length(shape, &world) + 1) as f64);
                cpu_s[i] += cpu.tree_step(shape, cpu_draft).total_s();
                gpu_s[i] += gpu.tree_step(shape, None).total_s();
                nodes[i] += shape.drafts() as f64;
                depth[i] += shape.max_depth() as f64;
            }
        }
        let steps = p.steps as f64;
        for i in 0..kinds {
            let (name, analytic) = match statics.get(i) {
                Some((name, shape)) => (name.to_string(), Some(acc.expected_tau(shape))),
                None => (format!("dynamic (EAGLE-2, top-{})", p.top_k), None),
            };
            let tau = mean_interval(&taus[i])
                .ok_or_else(|| HarnessError::Metrics("no simulated steps".into()))?;
            rows.push(TreeRow {
                budget: n,
                tree: name,
                nodes: nodes[i] / steps,
                depth: depth[i] / steps,
                tau_analytic: analytic,
                tau_sim: tau,
                speedup_cpu: tau.mean * cpu_plain / (cpu_s[i] / steps),
                speedup_gpu: tau.mean * gpu_plain / (gpu_s[i] / steps),
            });
        }
    }
    Ok(rows)
}

/// Runs the reproduction into `dir`: `tree_scaling.md`, `tree_scaling.json`,
/// `tree_scaling_tau.svg`, `tree_scaling_speedup_cpu.svg`, `tree_scaling_speedup_gpu.svg`, and
/// with models the real check's results folder `dir/real/`.
///
/// # Errors
/// Missing models (full size), engine errors.
pub fn run(dir: &Path, p: &TreeScalingParams) -> Result<ReproOutput> {
    std::fs::create_dir_all(dir).map_err(|e| HarnessError::io(dir, e))?;
    let gpu = gpu_like_cost();
    let (acc, measured, cpu, cpu_draft, check) = match &p.measure {
        None => {
            let (cpu, draft) = builtin_cpu_cost();
            (builtin_acceptance(), None, cpu, draft, Vec::new())
        }
        Some(m) => {
            let greedy = SamplingParams::greedy();
            let mut backend =
                EngineBackend::open(TARGET, Some(DRAFT), greedy, 7, m.check.max_tokens, 1)?;
            eprintln!("tree-scaling: measuring the acceptance table");
            let (acc, measured) = measure_table(&mut backend, m.measure)?;
            eprintln!("tree-scaling: measuring the cost curves");
            let points = super::real::CURVE_POINTS;
            let target_curve = measure_curve(backend.target_mut(), &points)?;
            let mut draft_model = LoadedModel::open(DRAFT)?.instantiate_one()?;
            let draft_curve = measure_curve(&mut draft_model, &points)?;
            drop(draft_model);
            let mut cpu = CostModel {
                draft_ms_per_token: draft_curve.ms(1),
                target: target_curve,
                verify_ms: 0.0,
                commit_ms: 0.0,
                overhead_ms: 0.0,
                link: None,
            };
            let mut methods = vec![
                baseline(),
                fixed("chain-k4", DrafterConfig::of(Chain::default()), 4),
            ];
            for &b in &m.check_budgets {
                methods.push(fixed(
                    &format!("sequoia-{b}"),
                    DrafterConfig::of(Sequoia { nodes: b }),
                    b,
                ));
            }
            let loaded = qwen_config("tree-scaling-check", 0.0, m.check, 1, methods)?;
            let results = run_on(&loaded, &mut backend, &dir.join("real"))?;
            // Per-step verify + commit of the chain, from the real run (its overhead holds the
            // prefill, which a decoding step does not pay).
            let chain = summary(&results, "chain-k4")?;
            let ts = chain.time_split;
            cpu.verify_ms = (ts.verify_s + ts.commit_s) / chain.target_passes.max(1) as f64 * 1e3;
            let mut check = Vec::new();
            let mut shapes = vec![("chain-k4".to_string(), TreeShape::chain(4))];
            for &b in &m.check_budgets {
                shapes.push((
                    format!("sequoia-{b}"),
                    sequoia_tree(&SEQUOIA_ALPHAS, b, SEQUOIA_MAX_DEPTH)?.shape,
                ));
            }
            for (name, shape) in shapes {
                let s = summary(&results, &name)?;
                let tau = acc.expected_tau(&shape);
                check.push(CheckRow {
                    method: name,
                    nodes: shape.drafts(),
                    tau_predicted: tau,
                    tau_measured: s.tau,
                    speedup_predicted: tau * cpu.step(0).total_s()
                        / cpu.tree_step(&shape, Some(&draft_curve)).total_s(),
                    speedup_measured: s.speedup,
                });
            }
            (acc, Some(measured), cpu, draft_curve, check)
        }
    };
    let rows = simulate(p, &acc, &cpu, Some(&cpu_draft), &gpu)?;

    let mut files = Vec::new();
    let source = if measured.is_some() {
        "measured in this run on the Qwen pair"
    } else {
        "built in (an earlier full run's measurement; `--quick` loads no model)"
    };
    let mut md = format!(
        "Tree-size scaling in simulation: τ and speedup against the draft-node budget, {} steps \
         per cell (common random worlds), seed {}. Acceptance table {source}: rank-0 acceptance \
         by depth {:?}, rank r ≥ 1 given lower ranks missed {:?}, per-step Beta concentration \
         {:.2}. Speedups: CPU = this machine's measured Qwen cost curves (2 cores); GPU-like = \
         an assumed H200-like curve (target 3.5 ms + 0.005 ms/token).\n\n\
         | budget | tree | nodes | depth | τ exact | τ simulated [95% CI] | speedup CPU | speedup GPU-like |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|\n",
        p.steps,
        p.seed,
        acc.by_depth
            .iter()
            .map(|r| (r[0] * 100.0).round() / 100.0)
            .collect::<Vec<_>>(),
        acc.by_depth[0][1..]
            .iter()
            .map(|a| (a * 100.0).round() / 100.0)
            .collect::<Vec<_>>(),
        acc.concentration.unwrap_or(0.0),
    );
    for r in &rows {
        md.push_str(&md_row(&[
            Cell::Text(r.budget.to_string()),
            Cell::Text(r.tree.clone()),
            Cell::Num(r.nodes),
            Cell::Num(r.depth),
            r.tau_analytic.map_or(Cell::Text("–".into()), Cell::Num),
            Cell::Ci(r.tau_sim),
            Cell::Num(r.speedup_cpu),
            Cell::Num(r.speedup_gpu),
        ]));
    }
    if !check.is_empty() {
        md.push_str(
            "\n## Real check (engine, Qwen pair, greedy)\n\n\
             | method | nodes | τ predicted | τ measured [95% CI] | speedup predicted (CPU) | speedup measured |\n\
             |---|---:|---:|---:|---:|---:|\n",
        );
        for c in &check {
            md.push_str(&md_row(&[
                Cell::Text(c.method.clone()),
                Cell::Text(c.nodes.to_string()),
                Cell::Num(c.tau_predicted),
                Cell::Ci(c.tau_measured),
                Cell::Num(c.speedup_predicted),
                Cell::Num(c.speedup_measured),
            ]));
        }
        let _ = writeln!(md, "\nReal run folder: {}/real/", dir.display());
    }
    write_text(dir, "tree_scaling.md", &md, &mut files)?;
    write_json(
        dir,
        "tree_scaling.json",
        &serde_json::json!({
            "params": p,
            "acceptance": acc,
            "measurement": measured,
            "cpu_cost": cpu,
            "cpu_draft_curve": cpu_draft,
            "gpu_like_cost": gpu,
            "rows": rows,
            "real_check": check,
        }),
        &mut files,
    )?;

    let kinds: Vec<String> = {
        let mut k: Vec<String> = rows.iter().map(|r| r.tree.clone()).collect();
        k.dedup();
        k.truncate(5);
        k
    };
    let series_of = |value: fn(&TreeRow) -> f64| -> Vec<Series> {
        kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| Series {
                label: kind.clone(),
                points: rows
                    .iter()
                    .filter(|r| &r.tree == kind)
                    .map(|r| (r.budget as f64, value(r)))
                    .collect(),
                style: SeriesStyle::Line,
                color: i,
            })
            .collect()
    };
    let mut tau_series = series_of(|r| r.tau_sim.mean);
    if !check.is_empty() {
        tau_series.push(Series {
            label: "real engine (chain-k4, sequoia)".into(),
            points: check
                .iter()
                .map(|c| (c.nodes as f64, c.tau_measured.mean))
                .collect(),
            style: SeriesStyle::Points,
            color: kinds.len(),
        });
    }
    for (name, title, series, legend) in [
        (
            "tree_scaling_tau.svg",
            "Mean accepted length τ against node budget",
            tau_series,
            Legend::UpperLeft,
        ),
        (
            "tree_scaling_speedup_cpu.svg",
            "Simulated speedup, CPU cost curve (Qwen 1.5B / 0.5B, 2 cores)",
            series_of(|r| r.speedup_cpu),
            Legend::UpperLeft,
        ),
        (
            "tree_scaling_speedup_gpu.svg",
            "Simulated speedup, H200-like cost curve",
            series_of(|r| r.speedup_gpu),
            Legend::UpperLeft,
        ),
    ] {
        let path = dir.join(name);
        line_plot(&path, title, "draft-node budget", "", &series, true, legend)?;
        files.push(path);
    }
    Ok(ReproOutput {
        markdown: md,
        files,
    })
}
