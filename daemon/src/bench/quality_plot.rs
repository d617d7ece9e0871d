//! `quality.png`: each mode's mean eval loss against samples per peer (left) and against
//! wall time (right), first seed, one line per mode and swarm size.

use std::path::Path;

use anyhow::Context as _;
use plotters::prelude::*;

use crate::local::plot::{FONT_FAMILY, register_font};

use super::quality::RunResult;

/// Image size in pixels: two panels side by side.
const SIZE: (u32, u32) = (1400, 600);

/// Draws the plot; returns a note when it had to be drawn without text (no font).
pub(crate) fn write(path: &Path, runs: &[RunResult]) -> anyhow::Result<Option<String>> {
    let first: Vec<&RunResult> = runs.iter().filter(|r| r.seed == 1).collect();
    let (text, note) = match register_font() {
        Ok(()) => (true, None),
        Err(why) => (
            false,
            Some(format!(
                "{} has no text: no font ({why}); install fonts-dejavu-core",
                path.display()
            )),
        ),
    };
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2);
    panel(&left, &first, "samples per peer", |p| p.0 as f64, text)?;
    panel(&right, &first, "wall time (s)", |p| p.1, text)?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(note)
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    runs: &[&RunResult],
    x_name: &str,
    x: fn(&(u64, f64, f64)) -> f64,
    text: bool,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let points = |r: &RunResult| -> Vec<(f64, f64)> {
        r.curve
            .iter()
            .map(|p| (x(p), p.2))
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect()
    };
    let all: Vec<(f64, f64)> = runs.iter().flat_map(|r| points(r)).collect();
    let x_max = all.iter().map(|p| p.0).fold(1.0, f64::max);
    let (mut y_min, mut y_max) = all
        .iter()
        .map(|p| p.1)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), y| {
            (lo.min(y), hi.max(y))
        });
    if y_min > y_max {
        (y_min, y_max) = (0.0, 1.0);
    }
    let pad = ((y_max - y_min) * 0.05).max(0.01);
    let mut builder = ChartBuilder::on(area);
    builder.margin(16);
    if text {
        builder
            .caption(format!("eval loss against {x_name}"), (FONT_FAMILY, 22))
            .x_label_area_size(45)
            .y_label_area_size(60);
    }
    let mut chart = builder.build_cartesian_2d(0.0..x_max * 1.02, (y_min - pad)..(y_max + pad))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc(x_name)
            .y_desc("mean eval loss")
            .label_style((FONT_FAMILY, 14))
            .axis_desc_style((FONT_FAMILY, 16));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw()?;
    for (i, r) in runs.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let series = chart.draw_series(LineSeries::new(points(r), color.stroke_width(2)))?;
        if text {
            series
                .label(format!("{} peers, {} {}", r.peers, r.mode.name(), r.codec))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color));
        }
    }
    if text {
        chart
            .configure_series_labels()
            .label_font((FONT_FAMILY, 14))
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    Ok(())
}
