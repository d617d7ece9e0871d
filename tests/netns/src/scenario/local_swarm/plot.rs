//! The training scenarios' plots: the swarm's mean eval loss over wall time, one line per
//! mode (`loss-over-time.png`), and aggregate throughput without and with a straggler, two
//! bars per mode (`throughput-stragglers.png`).
//!
//! Text needs DejaVu Sans, read at run time from Debian's `fonts-dejavu-core`
//! (`scripts/setup.sh` installs it); without it the plots are drawn without text and the
//! returned note says so.

use std::path::Path;

use plotters::prelude::*;

use crate::scenario::chart::{Axes, Canvas};
use crate::scenario::font::FONT_FAMILY;

/// Image size in pixels.
const SIZE: (u32, u32) = (960, 640);

/// One mode's loss curve.
#[derive(Debug, Clone)]
pub(crate) struct LossCurve {
    /// The legend entry, e.g. `sgp`.
    pub(crate) label: String,
    /// `(wall seconds, mean eval loss)`.
    pub(crate) points: Vec<(f64, f64)>,
}

/// One mode's aggregate throughput without and with a straggler.
#[derive(Debug, Clone)]
pub(crate) struct ThroughputBars {
    /// The mode.
    pub(crate) mode: String,
    /// Samples per second without a straggler.
    pub(crate) baseline: f64,
    /// Samples per second with one.
    pub(crate) straggled: f64,
    /// What the swarm would keep if only the straggler's own share were lost.
    pub(crate) ideal: f64,
}

/// The mean eval loss over wall time, one line per curve, and the task's loss floor dashed.
/// Returns a note when it had to be drawn without text.
pub(crate) fn loss_over_time(
    path: &Path,
    title: &str,
    curves: &[LossCurve],
    floor: Option<f64>,
) -> anyhow::Result<Option<String>> {
    let all = || curves.iter().flat_map(|c| c.points.iter().copied());
    let x_max = all().map(|p| p.0).fold(1.0, f64::max) * 1.05;
    let y_max = all().map(|p| p.1).fold(f64::MIN, f64::max).max(0.1) * 1.05;
    let y_min = all()
        .map(|p| p.1)
        .chain(floor)
        .fold(f64::MAX, f64::min)
        .min(y_max * 0.9)
        * 0.95;
    let canvas = Canvas::new(path, SIZE)?;
    let text = canvas.text;
    let mut chart = canvas.chart(title, 0.0..x_max, y_min..y_max)?;
    let axes = Axes {
        x: Some("wall time since the swarm started (s)"),
        y: "eval loss, mean over peers",
        y_format: None,
    };
    canvas.draw_axes(&mut chart, &axes)?;
    for (i, curve) in curves.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let drawn = chart.draw_series(LineSeries::new(
            curve.points.iter().copied(),
            color.stroke_width(2),
        ))?;
        if text {
            drawn
                .label(curve.label.clone())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color));
        }
    }
    if let Some(floor) = floor {
        let style = BLACK.stroke_width(1);
        let drawn = chart.draw_series(DashedLineSeries::new(
            [(0.0, floor), (x_max, floor)],
            8,
            6,
            style,
        ))?;
        if text {
            drawn
                .label("the task's loss floor")
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], style));
        }
    }
    canvas.draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    canvas.present()
}

/// Two bars per mode (without and with the straggler) and a dashed mark at the ideal.
/// Returns a note when it had to be drawn without text.
pub(crate) fn throughput_bars(
    path: &Path,
    title: &str,
    bars: &[ThroughputBars],
) -> anyhow::Result<Option<String>> {
    let x_max = bars.len().max(1) as f64;
    let y_max = bars
        .iter()
        .flat_map(|b| [b.baseline, b.straggled, b.ideal])
        .filter(|v| v.is_finite())
        .fold(1.0, f64::max)
        * 1.4;
    let canvas = Canvas::new(path, SIZE)?;
    let text = canvas.text;
    let mut chart = canvas.chart(title, 0.0..x_max, 0.0..y_max)?;
    let axes = Axes {
        x: None,
        y: "aggregate samples/s",
        y_format: None,
    };
    canvas.draw_axes(&mut chart, &axes)?;
    let baseline = Palette99::pick(0).to_rgba();
    let straggled = Palette99::pick(1).to_rgba();
    let ideal = BLACK.stroke_width(2);
    for (i, bar) in bars.iter().enumerate() {
        let x = i as f64;
        // The legend lists each kind of mark once: from the first mode's.
        let legend = text && i == 0;
        let drawn = chart.draw_series([Rectangle::new(
            [(x + 0.15, 0.0), (x + 0.5, bar.baseline)],
            baseline.filled(),
        )])?;
        if legend {
            drawn.label("no straggler").legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 14, y + 5)], baseline.filled())
            });
        }
        let drawn = chart.draw_series([Rectangle::new(
            [(x + 0.5, 0.0), (x + 0.85, bar.straggled)],
            straggled.filled(),
        )])?;
        if legend {
            drawn.label("one peer 4x slower").legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 14, y + 5)], straggled.filled())
            });
        }
        let drawn = chart.draw_series(DashedLineSeries::new(
            [(x + 0.45, bar.ideal), (x + 0.9, bar.ideal)],
            6,
            4,
            ideal,
        ))?;
        if legend {
            drawn
                .label("only the straggler's share lost")
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], ideal));
        }
        if text {
            let top = bar.baseline.max(bar.straggled).max(bar.ideal);
            chart.draw_series([Text::new(
                bar.mode.clone(),
                (x + 0.4, top + y_max * 0.06),
                (FONT_FAMILY, 18),
            )])?;
        }
    }
    canvas.draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    canvas.present()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_plots_are_drawn_as_png_files() {
        let dir = tempfile_dir();
        let bars = [ThroughputBars {
            mode: "sgp".into(),
            baseline: 120.0,
            straggled: 110.0,
            ideal: 108.75,
        }];
        let path = dir.join("bars.png");
        throughput_bars(&path, "bars", &bars).unwrap();
        let curves = [LossCurve {
            label: "sgp".into(),
            points: vec![(1.0, 3.4), (5.0, 2.0), (9.0, 1.4)],
        }];
        let loss = dir.join("loss.png");
        loss_over_time(&loss, "loss", &curves, Some(1.05)).unwrap();
        for file in [path, loss] {
            let bytes = std::fs::read(&file).unwrap();
            assert!(bytes.starts_with(b"\x89PNG"), "{}", file.display());
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("murmur-netns-swarm-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
