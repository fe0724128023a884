//! Leviathan et al. (2023), "Fast Inference from Transformers via Speculative Decoding": expected
//! tokens per target pass E(α, γ) = (1 − α^(γ+1)) / (1 − α) and the walltime gain
//! E / (γc + 1), analytic against the simulation.

use crate::methods::kinds::*;
use std::fmt::Write;
use std::path::Path;

use super::{csv_row, md_row, measure_chain, write_text, Cell, ReproOutput};
use crate::error::{HarnessError, Result};
use crate::report::{line_plot, Legend, Series, SeriesStyle};
use crate::simulation::{
    leviathan_expected_tokens, leviathan_walltime_gain, AcceptanceProcess, CostCurve, CostModel,
};

/// Parameters of the reproduction.
#[derive(Debug, Clone, PartialEq)]
pub struct LeviathanParams {
    /// Acceptance rates α.
    pub alphas: Vec<f64>,
    /// Largest γ (drafts per pass); γ = 1..=gamma_max.
    pub gamma_max: usize,
    /// Cost ratio c = draft cost / target cost per token.
    pub c: f64,
    /// Simulated requests per (α, γ).
    pub requests: usize,
    /// Tokens per simulated request.
    pub tokens: usize,
    /// Seed.
    pub seed: u64,
}

impl Default for LeviathanParams {
    fn default() -> Self {
        LeviathanParams {
            alphas: vec![0.5, 0.6, 0.7, 0.8, 0.9],
            gamma_max: 8,
            c: 0.05,
            requests: 30,
            tokens: 400,
            seed: 2023,
        }
    }
}

/// One (α, γ) row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeviathanRow {
    /// α.
    pub alpha: f64,
    /// γ.
    pub gamma: usize,
    /// Analytic E(α, γ).
    pub e_analytic: f64,
    /// Simulated τ with its 95 % bootstrap interval over requests.
    pub tau_sim: crate::metrics::Interval,
    /// Analytic walltime gain at c.
    pub gain_analytic: f64,
    /// Simulated speedup with its 95 % bootstrap interval over requests.
    pub gain_sim: crate::metrics::Interval,
}

/// Computes the rows (no files).
pub fn rows(p: &LeviathanParams) -> Result<Vec<LeviathanRow>> {
    if !(p.c.is_finite() && p.c >= 0.0) || p.gamma_max == 0 || p.requests == 0 || p.tokens == 0 {
        return Err(HarnessError::Simulation(
            "leviathan needs c ≥ 0, gamma_max ≥ 1, requests ≥ 1, tokens ≥ 1".into(),
        ));
    }
    // The paper's model: a target pass over γ + 1 tokens costs as much as over one (1 unit), and
    // a draft token costs c units.
    let cost = CostModel {
        draft_ms_per_token: p.c,
        target: CostCurve::Affine {
            base_ms: 1.0,
            per_token_ms: 0.0,
        },
        verify_ms: 0.0,
        commit_ms: 0.0,
        overhead_ms: 0.0,
        link: None,
    };
    let mut out = Vec::new();
    for &alpha in &p.alphas {
        let acc = AcceptanceProcess::Fixed { alpha };
        acc.validate()?;
        for gamma in 1..=p.gamma_max {
            let m = measure_chain(&acc, &cost, gamma, p.requests, p.tokens, p.seed)?;
            out.push(LeviathanRow {
                alpha,
                gamma,
                e_analytic: leviathan_expected_tokens(alpha, gamma),
                tau_sim: m.tau,
                gain_analytic: leviathan_walltime_gain(alpha, gamma, p.c),
                gain_sim: m.speedup,
            });
        }
    }
    Ok(out)
}

/// One row measured with toy models: a context-free (order-0) toy pair whose every draft is
/// accepted by chain rejection sampling with probability exactly α = Σ min(p, q).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ToyRow {
    /// Toy pair seed.
    pub toy_seed: u64,
    /// Exact α of the pair at temperature 1.
    pub alpha: f64,
    /// γ.
    pub gamma: usize,
    /// E(α, γ).
    pub e_analytic: f64,
    /// Measured τ with its 95 % bootstrap interval over requests.
    pub tau_measured: crate::metrics::Interval,
}

/// Measures τ with real chain rejection sampling on order-0 toy pairs (vocab 8, dense tables,
/// temperature 1) for γ = 1..=gamma_max, `requests` × `tokens` per cell.
pub fn toy_rows(p: &LeviathanParams, toy_seeds: &[u64]) -> Result<Vec<ToyRow>> {
    use crate::config::{
        DrafterConfig, ExperimentConfig, MethodConfig, ModelsConfig, PolicyConfig, PromptSet,
        SamplingConfig, ToyConfig, VerifierConfig,
    };
    use crate::metrics::{mean_interval, RequestRecord};
    use crate::runner::{Backend, RequestSpec, ToyBackend};
    let mut out = Vec::new();
    for &toy_seed in toy_seeds {
        let config = ExperimentConfig {
            name: "leviathan-toy".into(),
            description: String::new(),
            models: ModelsConfig {
                target: "toy".into(),
                draft: Some("toy".into()),
                ..ModelsConfig::default()
            },
            prompts: PromptSet::Synthetic {
                count: p.requests,
                prompt_tokens: 1,
            },
            sampling: SamplingConfig {
                temperature: 1.0,
                seed: p.seed,
                ..SamplingConfig::default()
            },
            max_tokens: p.tokens,
            batch_size: 1,
            repeat: 1,
            baseline: crate::config::BaselineRule::Add,
            schedule: Default::default(),
            simulation: None,
            toy: Some(ToyConfig {
                vocab: 8,
                order: 0,
                seed: toy_seed,
                dense: true,
            }),
            op_split: false,
            methods: Vec::new(),
        };
        let mut backend = ToyBackend::new(&config)?;
        let alpha = backend.alpha_after(&[])?;
        let prompts = config.prompts.load(Path::new("."))?;
        let specs: Vec<RequestSpec> = prompts
            .iter()
            .enumerate()
            .map(|(index, prompt)| RequestSpec { index, prompt })
            .collect();
        for gamma in 1..=p.gamma_max {
            let fixed = Some(PolicyConfig::of(Fixed { k: gamma }));
            let method = MethodConfig {
                verifier: VerifierConfig::of(ChainRejection {}),
                ..MethodConfig::new(
                    format!("chain-k{gamma}"),
                    DrafterConfig::of(Chain::default()),
                    fixed,
                )
            };
            let outcome = backend.run_method(&method, &specs, &mut |_| {})?;
            let taus: Vec<f64> = outcome
                .requests
                .iter()
                .filter_map(|r| {
                    RequestRecord::from_steps(&method.name, r.request, "", 0, r.elapsed_s, &r.steps)
                        .tau()
                })
                .collect();
            out.push(ToyRow {
                toy_seed,
                alpha,
                gamma,
                e_analytic: leviathan_expected_tokens(alpha, gamma),
                tau_measured: mean_interval(&taus)
                    .ok_or_else(|| HarnessError::Metrics("no toy requests".into()))?,
            });
        }
    }
    Ok(out)
}

/// Runs the reproduction and writes `leviathan.csv`, `leviathan_toy.csv`, `leviathan.md`, `leviathan_tokens.svg`,
/// `leviathan_gain.svg` into `dir`.
pub fn run(dir: &Path, p: &LeviathanParams) -> Result<ReproOutput> {
    std::fs::create_dir_all(dir).map_err(|e| HarnessError::io(dir, e))?;
    let rows = rows(p)?;
    let mut files = Vec::new();
    let mut csv = String::from(
        "alpha,gamma,e_analytic,tau_sim,tau_sim_lo95,tau_sim_hi95,gain_analytic,gain_sim,gain_sim_lo95,gain_sim_hi95\n",
    );
    let cells = |r: &LeviathanRow| {
        vec![
            Cell::Text(format!("{:.1}", r.alpha)),
            Cell::Text(r.gamma.to_string()),
            Cell::Num(r.e_analytic),
            Cell::Ci(r.tau_sim),
            Cell::Num(r.gain_analytic),
            Cell::Ci(r.gain_sim),
        ]
    };
    for r in &rows {
        csv.push_str(&csv_row(&cells(r)));
    }
    write_text(dir, "leviathan.csv", &csv, &mut files)?;

    let mut md = format!(
        "Expected tokens per target pass E(α, γ) and walltime gain at c = {} (draft/target cost), \
         analytic vs simulated ({} requests × {} tokens per cell, 95% bootstrap interval over requests, seed {}).\n\n\
         | α | γ | E analytic | τ simulated [95% CI] | gain analytic | gain simulated [95% CI] |\n|---:|---:|---:|---:|---:|---:|\n",
        p.c, p.requests, p.tokens, p.seed
    );
    for r in &rows {
        md.push_str(&md_row(&cells(r)));
    }
    let inside = rows
        .iter()
        .filter(|r| r.tau_sim.lo <= r.e_analytic && r.e_analytic <= r.tau_sim.hi)
        .count();
    let _ = writeln!(
        md,
        "\nThe analytic E lies inside the simulated 95% interval in {inside} of {} cells.",
        rows.len()
    );
    let toy = toy_rows(p, &[3, 11])?;
    let mut toy_csv =
        String::from("toy_seed,alpha,gamma,e_analytic,tau_measured,tau_lo95,tau_hi95\n");
    let _ = write!(
        md,
        "\n## Measured with toy models\n\nReal chain rejection sampling (the kernels' verifier, production \
         randomness) on context-free toy pairs (vocab 8, dense tables, temperature 1), where every \
         draft is accepted with probability exactly α = Σ min(p, q); {} requests × {} tokens per \
         cell, 95% bootstrap interval over requests.\n\n| toy seed | α (exact) | γ | E analytic | τ measured [95% CI] |\n|---:|---:|---:|---:|---:|\n",
        p.requests, p.tokens
    );
    for r in &toy {
        let cells = [
            Cell::Text(r.toy_seed.to_string()),
            Cell::Num(r.alpha),
            Cell::Text(r.gamma.to_string()),
            Cell::Num(r.e_analytic),
            Cell::Ci(r.tau_measured),
        ];
        toy_csv.push_str(&csv_row(&cells));
        md.push_str(&md_row(&cells));
    }
    let toy_inside = toy
        .iter()
        .filter(|r| r.tau_measured.lo <= r.e_analytic && r.e_analytic <= r.tau_measured.hi)
        .count();
    let _ = writeln!(
        md,
        "\nThe analytic E lies inside the measured 95% interval in {toy_inside} of {} cells.",
        toy.len()
    );
    write_text(dir, "leviathan_toy.csv", &toy_csv, &mut files)?;
    write_text(dir, "leviathan.md", &md, &mut files)?;

    let series_for = |value: fn(&LeviathanRow) -> f64, sim: fn(&LeviathanRow) -> f64| {
        let mut series = Vec::new();
        for (i, &alpha) in p.alphas.iter().enumerate() {
            let of_alpha: Vec<&LeviathanRow> = rows.iter().filter(|r| r.alpha == alpha).collect();
            series.push(Series {
                label: format!("α = {alpha} analytic"),
                points: of_alpha
                    .iter()
                    .map(|r| (r.gamma as f64, value(r)))
                    .collect(),
                style: SeriesStyle::Line,
                color: i,
            });
            series.push(Series {
                label: format!("α = {alpha} simulated"),
                points: of_alpha.iter().map(|r| (r.gamma as f64, sim(r))).collect(),
                style: SeriesStyle::Points,
                color: i,
            });
        }
        series
    };
    let p1 = dir.join("leviathan_tokens.svg");
    line_plot(
        &p1,
        "Expected tokens per target pass E(α, γ)",
        "γ (drafts per pass)",
        "tokens per target pass",
        &series_for(|r| r.e_analytic, |r| r.tau_sim.mean),
        false,
        Legend::UpperLeft,
    )?;
    files.push(p1);
    let p2 = dir.join("leviathan_gain.svg");
    line_plot(
        &p2,
        &format!("Walltime gain at c = {}", p.c),
        "γ (drafts per pass)",
        "speedup over plain decoding",
        &series_for(|r| r.gain_analytic, |r| r.gain_sim.mean),
        false,
        Legend::UpperLeft,
    )?;
    files.push(p2);
    Ok(ReproOutput {
        markdown: md,
        files,
    })
}
