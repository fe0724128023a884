//! Paper reproductions: each writes a table (markdown, and CSV or JSON), SVG plots and, where it
//! runs real models, full results folders into a folder, and returns the markdown. Simulated
//! columns come from [`crate::simulation`]; analytic ones from the closed forms; real ones from
//! the Qwen2.5-Coder pair through the engine ([`real`]).

pub mod acceptance_temperature;
pub mod batching;
pub mod leviathan;
pub mod multi_level;
pub mod placement;
pub mod real;
pub mod tree_scaling;

use std::path::{Path, PathBuf};

use crate::error::{HarnessError, Result};
use crate::metrics::{mean_interval, Interval};
use specdec_algorithms::policy::FixedPolicy;

use crate::simulation::{simulate_request, AcceptanceProcess, CostModel, SplitMix64};

/// What a reproduction wrote.
#[derive(Debug, Clone)]
pub struct ReproOutput {
    /// The markdown table (also written to a `.md` file).
    pub markdown: String,
    /// Every file written.
    pub files: Vec<PathBuf>,
}

/// Simulated τ and speedup of a fixed-K chain over `requests` requests of `tokens` tokens each.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChainMeasurement {
    /// Per-request τ, mean and 95 % bootstrap interval over requests.
    pub tau: Interval,
    /// Per-request speedup over plain decoding on the same cost model (plain seconds per token /
    /// this K's seconds per token), mean and 95 % bootstrap interval over requests.
    pub speedup: Interval,
}

/// Simulates a fixed-K chain (K ≥ 0) and plain decoding on the same cost model, request by request
/// with random stream `seed`/request.
pub fn measure_chain(
    acceptance: &AcceptanceProcess,
    cost: &CostModel,
    k: usize,
    requests: usize,
    tokens: usize,
    seed: u64,
) -> Result<ChainMeasurement> {
    let plain_spt = cost.step(0).total_s();
    let mut taus = Vec::with_capacity(requests);
    let mut speedups = Vec::with_capacity(requests);
    for r in 0..requests {
        let mut rng = SplitMix64::stream(seed, r as u64);
        let sim = simulate_request(
            "repro",
            r,
            0,
            tokens,
            acceptance,
            cost,
            &mut FixedPolicy::chain(k),
            &mut rng,
        )?;
        let passes = sim.steps.len() as f64;
        let accepted: usize = sim.steps.iter().map(|s| s.accepted).sum();
        taus.push((accepted as f64 + passes) / passes);
        speedups.push(plain_spt / (sim.elapsed_s / tokens as f64));
    }
    let none = || HarnessError::Metrics("no requests to measure".into());
    Ok(ChainMeasurement {
        tau: mean_interval(&taus).ok_or_else(none)?,
        speedup: mean_interval(&speedups).ok_or_else(none)?,
    })
}

/// One cell of a reproduction table, written to both the CSV and the markdown version.
#[derive(Debug, Clone)]
enum Cell {
    /// Text as is.
    Text(String),
    /// A number: 6 decimals in CSV, 3 in markdown.
    Num(f64),
    /// A mean with its interval: three CSV columns, `mean [lo, hi]` in markdown.
    Ci(Interval),
}

fn csv_row(cells: &[Cell]) -> String {
    let parts: Vec<String> = cells
        .iter()
        .map(|c| match c {
            Cell::Text(t) => t.clone(),
            Cell::Num(x) => format!("{x:.6}"),
            Cell::Ci(i) => format!("{:.6},{:.6},{:.6}", i.mean, i.lo, i.hi),
        })
        .collect();
    parts.join(",") + "\n"
}

fn md_row(cells: &[Cell]) -> String {
    let parts: Vec<String> = cells
        .iter()
        .map(|c| match c {
            Cell::Text(t) => t.clone(),
            Cell::Num(x) => format!("{x:.3}"),
            Cell::Ci(i) => format!("{:.3} [{:.3}, {:.3}]", i.mean, i.lo, i.hi),
        })
        .collect();
    format!("| {} |\n", parts.join(" | "))
}

fn write_text(dir: &Path, name: &str, text: &str, files: &mut Vec<PathBuf>) -> Result<()> {
    let p = dir.join(name);
    std::fs::write(&p, text).map_err(|e| HarnessError::io(&p, e))?;
    files.push(p);
    Ok(())
}
