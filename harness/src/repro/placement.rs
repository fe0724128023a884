//! Draft placement: a co-located draft (on the target's device, drafting and verifying in turn)
//! against a draft on a dedicated device behind a link (latency + bandwidth). Each step then pays a
//! round trip: the accepted tokens go to the drafter, the drafts (token ids, and the draft
//! distributions q for lossless sampling at temperature > 0) come back. Where does the remote
//! draft stop paying?
//!
//! The model is the simulation's cost model (see [`crate::simulation::CostModel`]): no overlap of
//! drafting with verification, the same draft cost per token on either device.

use std::fmt::Write;
use std::path::Path;

use super::{csv_row, md_row, measure_chain, write_text, Cell, ReproOutput};
use crate::error::{HarnessError, Result};
use crate::report::{line_plot, Legend, Series, SeriesStyle};
use crate::simulation::{expected_speedup, AcceptanceProcess, CostCurve, CostModel, LinkModel};

/// A pair of models' given costs.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Short name.
    pub name: String,
    /// Where the numbers come from.
    pub source: String,
    /// Draft cost per token (ms) and target pass curve; `link` is ignored here.
    pub cost: CostModel,
    /// Acceptance rate assumed.
    pub alpha: f64,
    /// Vocabulary size (for the bytes of q per draft token: 4 · vocab, f32).
    pub vocab: usize,
}

/// A named link.
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    /// Name (e.g. `NVLink`).
    pub name: String,
    /// One-way latency, µs.
    pub latency_us: f64,
    /// Bandwidth, GB/s.
    pub bandwidth_gb_per_s: f64,
}

/// What the draft device sends back per draft token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// Token ids only (greedy verification, or deterministic drafts): 4 bytes.
    Ids,
    /// Ids and the draft distribution q in f32 (lossless sampling at temperature > 0).
    IdsAndQ,
}

impl Payload {
    fn bytes(self, vocab: usize) -> f64 {
        match self {
            Payload::Ids => 4.0,
            Payload::IdsAndQ => 4.0 + 4.0 * vocab as f64,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Payload::Ids => "ids",
            Payload::IdsAndQ => "ids+q",
        }
    }
}

/// The scenarios and links used by default; every number is stated with its source in the README.
pub fn default_scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "cpu-qwen-1.5b/0.5b".into(),
            source: "llama.cpp on the 2-core dev machine (ANCHORS.md): target 37.7 tok/s, draft 65.9 tok/s, \
                     pass over K tokens 1.48x (2), 2.40x (4), 3.65x (8), 4.35x (16) of one"
                .into(),
            cost: CostModel {
                draft_ms_per_token: 1e3 / 65.9,
                target: CostCurve::Points {
                    tokens: vec![1, 2, 4, 8, 16],
                    ms: [1.0, 1.48, 2.40, 3.65, 4.35]
                        .iter()
                        .map(|m| m * 1e3 / 37.7)
                        .collect(),
                },
                verify_ms: 0.0,
                commit_ms: 0.0,
                overhead_ms: 0.0,
                link: None,
            },
            alpha: 0.8,
            vocab: 151_936,
        },
        Scenario {
            name: "h200-8b/1b".into(),
            source: "assumed from ANCHORS.md physics: 8B bf16 target streams weights in 3.5 ms per pass, \
                     nearly flat up to 64 tokens (+0.005 ms per token); a 1B draft at 0.6 ms per token"
                .into(),
            cost: CostModel {
                draft_ms_per_token: 0.6,
                target: CostCurve::Affine {
                    base_ms: 3.5,
                    per_token_ms: 0.005,
                },
                verify_ms: 0.0,
                commit_ms: 0.0,
                overhead_ms: 0.0,
                link: None,
            },
            alpha: 0.8,
            vocab: 128_256,
        },
    ]
}

/// Nominal links (round numbers, not measured here).
pub fn default_links() -> Vec<Link> {
    let l = |name: &str, latency_us: f64, bandwidth_gb_per_s: f64| Link {
        name: name.into(),
        latency_us,
        bandwidth_gb_per_s,
    };
    vec![
        l("NVLink", 2.0, 450.0),
        l("PCIe 5 x16", 5.0, 50.0),
        l("100GbE RDMA", 5.0, 12.5),
        l("datacenter TCP", 50.0, 12.5),
        l("metro WAN", 1000.0, 1.25),
    ]
}

/// Parameters of the reproduction.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacementParams {
    /// The model pairs.
    pub scenarios: Vec<Scenario>,
    /// The named links.
    pub links: Vec<Link>,
    /// Largest K searched.
    pub k_max: usize,
    /// Simulated requests per cell.
    pub requests: usize,
    /// Tokens per simulated request.
    pub tokens: usize,
    /// Seed.
    pub seed: u64,
}

impl Default for PlacementParams {
    fn default() -> Self {
        PlacementParams {
            scenarios: default_scenarios(),
            links: default_links(),
            k_max: 16,
            requests: 20,
            tokens: 256,
            seed: 7,
        }
    }
}

fn with_link(s: &Scenario, link: Option<(f64, f64)>, payload: Payload) -> CostModel {
    let mut c = s.cost.clone();
    c.link = link.map(|(latency_us, bandwidth_gb_per_s)| LinkModel {
        latency_us,
        bandwidth_gb_per_s,
        bytes_per_draft_token: payload.bytes(s.vocab),
        bytes_per_step: 64.0,
    });
    c
}

/// The K in 1..=k_max with the highest analytic speedup, and that speedup.
pub fn best_k(acc: &AcceptanceProcess, cost: &CostModel, k_max: usize) -> (usize, f64) {
    (1..=k_max)
        .map(|k| (k, expected_speedup(acc, cost, k)))
        .fold((1, f64::NEG_INFINITY), |b, x| if x.1 > b.1 { x } else { b })
}

/// A table cell to compute: placement name, link (latency µs, GB/s) or co-located, payload.
type Placement = (String, Option<(f64, f64)>, Payload);

/// The one-way latency (µs) at which the best remote speedup falls to `target`, by bisection over
/// [0, 1e6] µs; `None` when it is below `target` already at zero latency (or never falls).
pub fn break_even_latency_us(
    s: &Scenario,
    bandwidth_gb_per_s: f64,
    payload: Payload,
    k_max: usize,
    target: f64,
) -> Option<f64> {
    let acc = AcceptanceProcess::Fixed { alpha: s.alpha };
    let speed = |lat: f64| {
        best_k(
            &acc,
            &with_link(s, Some((lat, bandwidth_gb_per_s)), payload),
            k_max,
        )
        .1
    };
    let (mut lo, mut hi) = (0.0f64, 1e6f64);
    if speed(lo) < target || speed(hi) >= target {
        return None;
    }
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if speed(mid) >= target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(0.5 * (lo + hi))
}

/// Runs the reproduction and writes `placement.csv`, `placement.md` and one
/// `placement_<scenario>.svg` per scenario into `dir`.
pub fn run(dir: &Path, p: &PlacementParams) -> Result<ReproOutput> {
    if p.k_max == 0 || p.requests == 0 || p.tokens == 0 {
        return Err(HarnessError::Simulation(
            "placement needs k_max, requests and tokens ≥ 1".into(),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| HarnessError::io(dir, e))?;
    let mut files = Vec::new();
    let mut csv = String::from(
        "scenario,alpha,placement,latency_us,bandwidth_gb_per_s,payload,best_k,speedup_analytic,speedup_sim,speedup_sim_lo95,speedup_sim_hi95\n",
    );
    let mut md = format!(
        "Best-K speedup over plain decoding (K ≤ {}), analytic and simulated ({} requests × {} tokens, \
         95% bootstrap interval over requests, seed {}). Remote: the draft runs on its own device; each step \
         pays 2 × latency + bytes / bandwidth.\n\n\
         | scenario | α | placement | latency µs | GB/s | payload | best K | speedup analytic | speedup simulated [95% CI] |\n\
         |---|---:|---|---:|---:|---|---:|---:|---:|\n",
        p.k_max, p.requests, p.tokens, p.seed
    );
    let mut breakeven_md = String::from(
        "\n| scenario | bandwidth GB/s | payload | latency where speedup = 1 (µs) | latency where speedup = 90% of co-located (µs) |\n|---|---:|---|---:|---:|\n",
    );
    for s in &p.scenarios {
        s.cost.validate()?;
        let acc = AcceptanceProcess::Fixed { alpha: s.alpha };
        acc.validate()?;
        let mut cells: Vec<Placement> = vec![("co-located".into(), None, Payload::Ids)];
        for l in &p.links {
            for payload in [Payload::Ids, Payload::IdsAndQ] {
                cells.push((
                    l.name.clone(),
                    Some((l.latency_us, l.bandwidth_gb_per_s)),
                    payload,
                ));
            }
        }
        let (_, colocated) = best_k(&acc, &with_link(s, None, Payload::Ids), p.k_max);
        for (name, link, payload) in &cells {
            let cost = with_link(s, *link, *payload);
            let (k, analytic) = best_k(&acc, &cost, p.k_max);
            let m = measure_chain(&acc, &cost, k, p.requests, p.tokens, p.seed)?;
            let (lat, bw) = link.map_or(("-".to_string(), "-".to_string()), |(l, b)| {
                (format!("{l}"), format!("{b}"))
            });
            let payload_name = if link.is_some() { payload.name() } else { "-" };
            let cells = [
                Cell::Text(s.name.clone()),
                Cell::Text(s.alpha.to_string()),
                Cell::Text(name.clone()),
                Cell::Text(lat),
                Cell::Text(bw),
                Cell::Text(payload_name.to_string()),
                Cell::Text(k.to_string()),
                Cell::Num(analytic),
                Cell::Ci(m.speedup),
            ];
            csv.push_str(&csv_row(&cells));
            md.push_str(&md_row(&cells));
        }
        let mut bws: Vec<f64> = p.links.iter().map(|l| l.bandwidth_gb_per_s).collect();
        bws.sort_by(|a, b| b.total_cmp(a));
        bws.dedup();
        let fmt =
            |x: Option<f64>| x.map_or("already below at 0 µs".to_string(), |v| format!("{v:.1}"));
        for &bw in &bws {
            for payload in [Payload::Ids, Payload::IdsAndQ] {
                let one = break_even_latency_us(s, bw, payload, p.k_max, 1.0);
                let ninety = break_even_latency_us(s, bw, payload, p.k_max, 0.9 * colocated);
                let _ = writeln!(
                    breakeven_md,
                    "| {} | {} | {} | {} | {} |",
                    s.name,
                    bw,
                    payload.name(),
                    fmt(one),
                    fmt(ninety)
                );
            }
        }
        // Plot: best speedup against one-way latency, per bandwidth × payload, co-located as a line.
        let lats: Vec<f64> = (0..=60)
            .map(|i| 10f64.powf(-1.0 + i as f64 / 10.0))
            .collect();
        let mut series = vec![Series {
            label: "co-located".into(),
            points: vec![
                (lats[0], colocated),
                (*lats.last().unwrap_or(&1.0), colocated),
            ],
            style: SeriesStyle::Line,
            color: 0,
        }];
        let mut color = 1;
        for &bw in &bws {
            for payload in [Payload::Ids, Payload::IdsAndQ] {
                series.push(Series {
                    label: format!("{bw} GB/s, {}", payload.name()),
                    points: lats
                        .iter()
                        .map(|&l| {
                            (
                                l,
                                best_k(&acc, &with_link(s, Some((l, bw)), payload), p.k_max).1,
                            )
                        })
                        .collect(),
                    style: SeriesStyle::Line,
                    color,
                });
                color += 1;
            }
        }
        series.push(Series {
            label: "speedup = 1".into(),
            points: vec![(lats[0], 1.0), (*lats.last().unwrap_or(&1.0), 1.0)],
            style: SeriesStyle::Line,
            color: 40,
        });
        let file = format!(
            "placement_{}.svg",
            s.name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        );
        let path = dir.join(&file);
        line_plot(
            &path,
            &format!("{}: remote draft, α = {}", s.name, s.alpha),
            "one-way link latency (µs, log)",
            "best-K speedup over plain decoding",
            &series,
            true,
            Legend::LowerLeft,
        )?;
        files.push(path);
    }
    md.push_str(&breakeven_md);
    write_text(dir, "placement.csv", &csv, &mut files)?;
    write_text(dir, "placement.md", &md, &mut files)?;
    Ok(ReproOutput {
        markdown: md,
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_only_costs_and_break_even_is_where_speedup_is_one() {
        let s = &default_scenarios()[1];
        let acc = AcceptanceProcess::Fixed { alpha: s.alpha };
        let (_, co) = best_k(&acc, &with_link(s, None, Payload::Ids), 16);
        let (_, remote) = best_k(&acc, &with_link(s, Some((5.0, 50.0)), Payload::IdsAndQ), 16);
        assert!(remote < co, "{remote} {co}");
        let lat = break_even_latency_us(s, 450.0, Payload::Ids, 16, 1.0).unwrap();
        let at = |l: f64| best_k(&acc, &with_link(s, Some((l, 450.0)), Payload::Ids), 16).1;
        assert!((at(lat) - 1.0).abs() < 1e-6, "{}", at(lat));
        assert!(at(lat * 0.9) > 1.0 && at(lat * 1.1) < 1.0);
    }
}
