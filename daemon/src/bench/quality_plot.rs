//! `quality.png`: each mode's mean eval loss against samples per peer (left) and against
//! wall time (right), first seed, one line per mode and swarm size.

use std::path::Path;

use anyhow::Context as _;
use plotters::prelude::*;

use crate::local::plot::{Axes, draw_legend, panel_chart, register_font};

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
    let title = format!("eval loss against {x_name}");
    let axes = Axes {
        title: &title,
        x_desc: x_name,
        y_desc: "mean eval loss",
    };
    let mut chart = panel_chart(area, &axes, x_max, all.iter().map(|p| p.1), text)?;
    for (i, r) in runs.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let series = chart.draw_series(LineSeries::new(points(r), color.stroke_width(2)))?;
        if text {
            series
                .label(format!("{} peers, {} {}", r.peers, r.mode.name(), r.codec))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color));
        }
    }
    draw_legend(&mut chart, text)
}
