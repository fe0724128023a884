//! The loss curve of a run as an SVG: total loss and its parts against the optimiser step, on a
//! logarithmic loss axis.

use std::path::Path;

use plotters::prelude::*;

use crate::checkpoint::LossRecord;
use crate::error::{Result, TrainError};

/// Smallest loss drawn (the axis is logarithmic).
const FLOOR: f64 = 1e-4;

/// Draws `history` to `path` (total loss and each part named by `components`), written
/// through a temporary file renamed into place.
///
/// # Errors
/// [`TrainError::Plot`] when drawing fails; I/O errors naming the path.
pub(crate) fn loss_curve(
    path: &Path,
    title: &str,
    history: &[LossRecord],
    components: &[String],
) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| TrainError::Plot {
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    let mut series: Vec<(String, Vec<(f64, f64)>)> = vec![(
        "total".into(),
        history
            .iter()
            .map(|r| (r.step as f64, f64::from(r.loss)))
            .collect(),
    )];
    for (i, name) in components.iter().enumerate() {
        series.push((
            name.clone(),
            history
                .iter()
                .filter_map(|r| r.components.get(i).map(|&v| (r.step as f64, f64::from(v))))
                .collect(),
        ));
    }
    let x1 = history.last().map_or(1.0, |r| r.step as f64).max(1.0);
    let values = series.iter().flat_map(|(_, p)| p.iter().map(|&(_, y)| y));
    let (mut y0, mut y1) = (f64::INFINITY, 0f64);
    for y in values.filter(|y| y.is_finite()) {
        y0 = y0.min(y.max(FLOOR));
        y1 = y1.max(y.max(FLOOR));
    }
    if !y0.is_finite() || y1 <= y0 {
        (y0, y1) = (FLOOR, 1.0);
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 540)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..x1, (y0 * 0.9..y1 * 1.1).log_scale())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("optimiser step")
            .y_desc("loss")
            .draw()
            .map_err(|e| err(&e))?;
        for (i, (label, points)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let width = if i == 0 { 3 } else { 1 };
            let points: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (x, y.max(FLOOR))).collect();
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(width)))
                .map_err(|e| err(&e))?
                .label(label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    crate::checkpoint::write_atomically(path, svg.as_bytes())
}
