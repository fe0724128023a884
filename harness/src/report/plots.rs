//! SVG plots (plotters): speedup and τ per configuration, acceptance by depth, time split, and a
//! generic line plot the reproductions use.

use std::path::Path;

use plotters::prelude::*;

use crate::error::{HarnessError, Result};
use crate::metrics::{CategorySummary, MethodSummary};

const SIZE: (u32, u32) = (900, 520);

/// Bar slots 0..n for a segmented axis: plotters' integer ranges include their end, so n bars
/// need the range 0..n-1 (one bar still needs a non-empty range).
fn segments(
    n: usize,
) -> plotters::coord::ranged1d::SegmentedCoord<plotters::coord::types::RangedCoordusize> {
    (0..n.saturating_sub(1).max(1)).into_segmented()
}

fn plot_err<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> HarnessError + '_ {
    move |e| HarnessError::Plot {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// One bar of a bar chart: a label, a value and an optional interval drawn as a whisker.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// Label under the bar.
    pub label: String,
    /// Height.
    pub value: f64,
    /// (low, high) whisker.
    pub interval: Option<(f64, f64)>,
}

/// Draws a bar chart with optional whiskers and an optional horizontal reference line.
pub fn bar_chart(
    path: &Path,
    title: &str,
    y_desc: &str,
    bars: &[Bar],
    reference: Option<f64>,
) -> Result<()> {
    let err = plot_err(path);
    let n = bars.len().max(1);
    let top = bars
        .iter()
        .map(|b| b.interval.map_or(b.value, |(_, hi)| hi.max(b.value)))
        .chain(reference)
        .fold(0.0f64, f64::max);
    let y_max = if top > 0.0 { top * 1.15 } else { 1.0 };
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(&err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(50)
        .y_label_area_size(60)
        .build_cartesian_2d(segments(n), 0.0..y_max)
        .map_err(&err)?;
    let labels: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(y_desc)
        .x_labels(n)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                labels.get(*i).cloned().unwrap_or_default()
            }
            SegmentValue::Last => String::new(),
        })
        .draw()
        .map_err(&err)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let mut r = Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), b.value),
                ],
                Palette99::pick(i).mix(0.8).filled(),
            );
            r.set_margin(0, 0, 12, 12);
            r
        }))
        .map_err(&err)?;
    chart
        .draw_series(bars.iter().enumerate().filter_map(|(i, b)| {
            b.interval.map(|(lo, hi)| {
                PathElement::new(
                    vec![
                        (SegmentValue::CenterOf(i), lo),
                        (SegmentValue::CenterOf(i), hi),
                    ],
                    BLACK.stroke_width(2),
                )
            })
        }))
        .map_err(&err)?;
    if let Some(r) = reference {
        chart
            .draw_series(LineSeries::new(
                vec![(SegmentValue::Exact(0), r), (SegmentValue::Last, r)],
                RED.stroke_width(1),
            ))
            .map_err(&err)?;
    }
    root.present().map_err(&err)?;
    Ok(())
}

/// How a series of a line plot is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeriesStyle {
    /// Markers joined by a line.
    Line,
    /// Unconnected markers.
    Points,
}

/// One series of a line plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// (x, y) points.
    pub points: Vec<(f64, f64)>,
    /// Line or markers.
    pub style: SeriesStyle,
    /// Palette index (series with the same index share a colour).
    pub color: usize,
}

/// Where the legend of a line plot goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Legend {
    /// Top left corner.
    UpperLeft,
    /// Bottom left corner.
    LowerLeft,
    /// Bottom right corner.
    LowerRight,
}

/// A tick label: an integer axis shows integers (no `4.0`), others up to 3 significant decimals
/// without trailing zeros (log axes get `1`, `10`, `100` rather than `1e1`).
fn tick_label(x: f64, integer: bool) -> String {
    if integer || (x.fract() == 0.0 && x.abs() < 1e9) {
        return format!("{}", x.round() as i64);
    }
    let text = format!("{x:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Draws series on linear axes with a legend, each series with a marker at every point (and a
/// line through them for [`SeriesStyle::Line`]); integer x values get integer ticks. `log_x`
/// draws the x axis logarithmically (all x must then be > 0).
pub fn line_plot(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    log_x: bool,
    legend: Legend,
) -> Result<()> {
    let err = plot_err(path);
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    let mut y0 = 0.0f64;
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let y1 = if y1 > y0 { y1 * 1.08 } else { y0 + 1.0 };
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(&err)?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60);
    // Integer x values (depths, K, batch sizes) get integer ticks, one per value when few.
    let integer_x = series
        .iter()
        .flat_map(|s| s.points.iter())
        .all(|&(x, _)| x.fract() == 0.0);
    let x_ticks = if integer_x && !log_x {
        ((x1 - x0).round() as usize + 1).clamp(2, 12)
    } else {
        10
    };
    let x_label = |x: &f64| tick_label(*x, integer_x);
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc(y_desc)
                .x_labels(x_ticks)
                .x_label_formatter(&x_label)
                .draw()
                .map_err(&err)?;
            for s in series {
                let color = Palette99::pick(s.color).to_rgba();
                let anno = match s.style {
                    SeriesStyle::Line => {
                        chart
                            .draw_series(
                                s.points.iter().map(|&p| Circle::new(p, 3, color.filled())),
                            )
                            .map_err(&err)?;
                        chart
                            .draw_series(LineSeries::new(s.points.clone(), color.stroke_width(2)))
                            .map_err(&err)?
                    }
                    SeriesStyle::Points => chart
                        .draw_series(s.points.iter().map(|&p| Circle::new(p, 4, color.filled())))
                        .map_err(&err)?,
                };
                let style = s.style;
                anno.label(s.label.clone())
                    .legend(move |(x, y)| match style {
                        SeriesStyle::Line => {
                            EmptyElement::at((x, y))
                                + PathElement::new(vec![(0, 0), (18, 0)], color.stroke_width(2))
                                + Circle::new((9, 0), 3, color.filled())
                        }
                        SeriesStyle::Points => {
                            EmptyElement::at((x, y))
                                + PathElement::new(vec![(0, 0), (0, 0)], color.stroke_width(0))
                                + Circle::new((9, 0), 4, color.filled())
                        }
                    });
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(match legend {
                    Legend::UpperLeft => SeriesLabelPosition::UpperLeft,
                    Legend::LowerLeft => SeriesLabelPosition::LowerLeft,
                    Legend::LowerRight => SeriesLabelPosition::LowerRight,
                })
                .draw()
                .map_err(&err)?;
        }};
    }
    if log_x {
        draw!(builder
            .build_cartesian_2d((x0..x1).log_scale(), y0..y1)
            .map_err(&err)?);
    } else {
        draw!(builder.build_cartesian_2d(x0..x1, y0..y1).map_err(&err)?);
    }
    root.present().map_err(&err)?;
    Ok(())
}

/// Speedup per configuration (bar = throughput ratio; whisker = the 95 % bootstrap interval of
/// that same ratio over prompts), with a red line at 1.
pub fn plot_speedup(path: &Path, summaries: &[MethodSummary]) -> Result<()> {
    let bars: Vec<Bar> = summaries
        .iter()
        .map(|s| Bar {
            label: s.method.clone(),
            value: s.speedup,
            interval: s.speedup_interval.map(|i| (i.lo, i.hi)),
        })
        .collect();
    bar_chart(
        path,
        "Speedup over plain decoding",
        "speedup (×)",
        &bars,
        Some(1.0),
    )
}

/// τ per configuration with its 95 % bootstrap interval over prompts.
pub fn plot_tau(path: &Path, summaries: &[MethodSummary]) -> Result<()> {
    let bars: Vec<Bar> = summaries
        .iter()
        .map(|s| Bar {
            label: s.method.clone(),
            value: s.tau.mean,
            interval: Some((s.tau.lo, s.tau.hi)),
        })
        .collect();
    bar_chart(
        path,
        "Mean accepted length τ (tokens per target pass)",
        "τ",
        &bars,
        Some(1.0),
    )
}

/// Per-category speedup bars (each method's bar in its colour beside the others in the
/// category), whiskers the bootstrap interval of that same ratio, a red line at 1.
pub fn plot_categories(path: &Path, categories: &[CategorySummary]) -> Result<()> {
    let bars: Vec<Bar> = categories
        .iter()
        .map(|c| Bar {
            label: format!("{} {}", c.category, c.method),
            value: c.speedup.map_or(0.0, |i| i.mean),
            interval: c.speedup.map(|i| (i.lo, i.hi)),
        })
        .collect();
    bar_chart(
        path,
        "Speedup per category",
        "speedup (×)",
        &bars,
        Some(1.0),
    )
}

/// Methods that differ only in a fixed K, as series: per (drafter, verifier) with two or more
/// fixed-K methods (no fallback), the points (K, f(summary)) in K order. `methods` are the run's
/// method configs (`provenance.config.methods`), matched to `summaries` by name.
pub fn series_by_k(
    methods: &[crate::config::MethodConfig],
    summaries: &[MethodSummary],
    f: fn(&MethodSummary) -> f64,
) -> Vec<Series> {
    use crate::methods::kinds::Fixed;
    let mut groups: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for m in methods.iter().filter(|m| m.fallback.is_none()) {
        let Some(k) = m.policy.as_ref().and_then(|p| p.as_kind::<Fixed>()) else {
            continue;
        };
        let Some(s) = summaries.iter().find(|s| s.method == m.name) else {
            continue;
        };
        let key = format!("{} / {}", m.drafter.describe(), m.verifier.describe());
        match groups.iter_mut().find(|(g, _)| *g == key) {
            Some((_, points)) => points.push((k.k as f64, f(s))),
            None => groups.push((key, vec![(k.k as f64, f(s))])),
        }
    }
    groups
        .into_iter()
        .filter(|(_, points)| points.len() >= 2)
        .enumerate()
        .map(|(i, (label, mut points))| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series {
                label,
                points,
                style: SeriesStyle::Line,
                color: i,
            }
        })
        .collect()
}

/// Acceptance by depth: per drafting configuration, the conditional rate (line) and the
/// unconditional one (markers), in the configuration's colour.
pub fn plot_acceptance_by_depth(path: &Path, summaries: &[MethodSummary]) -> Result<()> {
    let mut series = Vec::new();
    for (i, s) in summaries.iter().enumerate() {
        if s.acceptance_by_depth.is_empty() {
            continue;
        }
        let points = |f: fn(&crate::metrics::DepthAcceptance) -> f64| {
            s.acceptance_by_depth
                .iter()
                .map(|a| (a.depth as f64, f(a)))
                .collect()
        };
        series.push(Series {
            label: format!("{} conditional", s.method),
            points: points(|a| a.conditional),
            style: SeriesStyle::Line,
            color: i,
        });
        series.push(Series {
            label: format!("{} unconditional", s.method),
            points: points(|a| a.unconditional),
            style: SeriesStyle::Points,
            color: i,
        });
    }
    line_plot(
        path,
        "Acceptance by draft position",
        "position d",
        "P(accept d | d-1 accepted)  /  P(accept d)",
        &series,
        false,
        Legend::LowerLeft,
    )
}

/// The accepted-length histogram: per drafting configuration, the fraction of drafting steps
/// that accepted 0, 1, 2, … drafts.
pub fn plot_accepted_lengths(path: &Path, summaries: &[MethodSummary]) -> Result<()> {
    let series: Vec<Series> = summaries
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.accepted_lengths.is_empty())
        .map(|(i, s)| {
            let total: usize = s.accepted_lengths.iter().sum();
            Series {
                label: s.method.clone(),
                points: s
                    .accepted_lengths
                    .iter()
                    .enumerate()
                    .map(|(a, &c)| (a as f64, c as f64 / total.max(1) as f64))
                    .collect(),
                style: SeriesStyle::Line,
                color: i,
            }
        })
        .collect();
    line_plot(
        path,
        "Accepted drafts per step",
        "accepted drafts",
        "fraction of drafting steps",
        &series,
        false,
        Legend::UpperLeft,
    )
}

/// Time to first token (bar: mean over prompts; whisker: its bootstrap interval) beside time per
/// output token after the first, per configuration, in ms: the prefill apart from decoding.
pub fn plot_latency(path: &Path, summaries: &[MethodSummary]) -> Result<()> {
    let mut bars = Vec::new();
    for s in summaries {
        for (what, stat) in [("TTFT", s.ttft_s), ("TPOT", s.tpot_s)] {
            if let Some(i) = stat {
                bars.push(Bar {
                    label: format!("{} {what}", s.method),
                    value: i.mean * 1e3,
                    interval: Some((i.lo * 1e3, i.hi * 1e3)),
                });
            }
        }
    }
    bar_chart(
        path,
        "Time to first token (prefill + first step) and time per output token",
        "ms",
        &bars,
        None,
    )
}

/// Decode time per generated token split by phase (the prefill apart, in TTFT), stacked, per
/// configuration (ms per token).
pub fn plot_time_split(path: &Path, summaries: &[MethodSummary]) -> Result<()> {
    let err = plot_err(path);
    let n = summaries.len().max(1);
    let per_token = |s: &MethodSummary, x: f64| {
        if s.generated_tokens == 0 {
            0.0
        } else {
            x * 1e3 / s.generated_tokens as f64
        }
    };
    let top = summaries
        .iter()
        .map(|s| per_token(s, s.time_split.decode_s()))
        .fold(0.0f64, f64::max);
    let y_max = if top > 0.0 { top * 1.25 } else { 1.0 };
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(&err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Decode time per generated token by phase",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(50)
        .y_label_area_size(60)
        .build_cartesian_2d(segments(n), 0.0..y_max)
        .map_err(&err)?;
    let labels: Vec<String> = summaries.iter().map(|s| s.method.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc("ms per generated token")
        .x_labels(n)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                labels.get(*i).cloned().unwrap_or_default()
            }
            SegmentValue::Last => String::new(),
        })
        .draw()
        .map_err(&err)?;
    let phases = ["draft", "target", "verify", "commit", "overhead"];
    for (p, phase) in phases.iter().enumerate() {
        let color = Palette99::pick(p).to_rgba();
        let rects: Vec<Rectangle<_>> = summaries
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let parts = s.time_split.parts();
                let below: f64 = parts[..p].iter().map(|(_, v)| per_token(s, *v)).sum();
                let here = per_token(s, parts[p].1);
                let mut r = Rectangle::new(
                    [
                        (SegmentValue::Exact(i), below),
                        (SegmentValue::Exact(i + 1), below + here),
                    ],
                    color.filled(),
                );
                r.set_margin(0, 0, 12, 12);
                r
            })
            .collect();
        chart
            .draw_series(rects)
            .map_err(&err)?
            .label(*phase)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(&err)?;
    root.present().map_err(&err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels() {
        assert_eq!(tick_label(4.0, true), "4");
        assert_eq!(tick_label(100.0, false), "100");
        assert_eq!(tick_label(0.25, false), "0.25");
        assert_eq!(tick_label(1.0 / 3.0, false), "0.333");
    }
}
