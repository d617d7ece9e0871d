//! The averaging scenarios' plots: round periods against the bandwidth bound
//! (`butterfly-efficiency.png`) and round times in round trips (`latency.png`).
//!
//! Text needs DejaVu Sans, read at run time from Debian's `fonts-dejavu-core`
//! (`scripts/setup.sh` installs it); without it the plots are drawn without text and the
//! returned note says so.

use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;

use crate::scenario::chart::{Axes, Canvas};

/// Image size in pixels.
const SIZE: (u32, u32) = (960, 640);

/// One configuration's rounds against its bound.
#[derive(Debug, Clone)]
pub(super) struct EfficiencyPoint {
    /// What the points are, e.g. `N=4 f32`.
    pub(super) label: String,
    /// `2(N−1)/N·S/B` with `S` the f32 size, seconds.
    pub(super) bound_s: f64,
    /// Every round's period, seconds.
    pub(super) periods_s: Vec<f64>,
}

/// One collective's rounds.
#[derive(Debug, Clone)]
pub(super) struct LatencySeries {
    /// The collective.
    pub(super) label: String,
    /// Every round's time, seconds.
    pub(super) round_times_s: Vec<f64>,
}

/// Round period (y) against the bound (x), every round a point, one colour per
/// configuration; the line `y = x` is the bound itself.
/// Returns a note when it had to be drawn without text.
pub(super) fn efficiency(
    path: &Path,
    points: &[EfficiencyPoint],
) -> anyhow::Result<Option<String>> {
    let x_max = points.iter().map(|p| p.bound_s).fold(0.1, f64::max) * 1.15;
    let y_max = points
        .iter()
        .flat_map(|p| p.periods_s.iter().copied())
        .filter(|t| t.is_finite())
        .fold(x_max, f64::max)
        * 1.1;
    let canvas = Canvas::new(path, SIZE)?;
    let text = canvas.text;
    let mut chart = canvas.chart(
        "butterfly all-reduce: round period against the bound",
        0.0..x_max,
        0.0..y_max,
    )?;
    let axes = Axes {
        x: Some("bound 2(N−1)/N · S/B, S = f32 bytes (s)"),
        y: "round period (s)",
        y_format: None,
    };
    canvas.draw_axes(&mut chart, &axes)?;
    let line = BLACK.stroke_width(1);
    let series = chart.draw_series(DashedLineSeries::new(
        [(0.0, 0.0), (x_max, x_max)],
        8,
        6,
        line,
    ))?;
    if text {
        series
            .label("period = bound (busbw = B)")
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], line));
    }
    let mut labels: Vec<&str> = Vec::new();
    for (i, point) in points.iter().enumerate() {
        // A case run more than once keeps its first run's colour and legend entry; colours
        // go by case, so repeated runs do not use up the palette.
        let first = points
            .iter()
            .position(|p| p.label == point.label)
            .unwrap_or(i);
        if first == i {
            labels.push(&point.label);
        }
        let case = labels
            .iter()
            .position(|label| *label == point.label)
            .unwrap_or(0);
        let color = Palette99::pick(case).to_rgba();
        let dots = point
            .periods_s
            .iter()
            .map(|&t| Circle::new((point.bound_s, t), 5, color.filled()));
        let series = chart.draw_series(dots)?;
        if text && first == i {
            series
                .label(point.label.clone())
                .legend(move |(x, y)| Circle::new((x + 9, y), 5, color.filled()));
        }
    }
    canvas.draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    canvas.present()
}

/// Round time in round trips (y) against the round (x), one line per collective, with
/// horizontal lines at `marks` (round trips, label) and at the bandwidth bound. Returns a
/// note when it had to be drawn without text.
pub(super) fn latency(
    path: &Path,
    series: &[LatencySeries],
    rtt: Duration,
    marks: &[(f64, &str)],
    bandwidth_bound_s: f64,
) -> anyhow::Result<Option<String>> {
    let rtt_s = rtt.as_secs_f64();
    let rounds = series
        .iter()
        .map(|s| s.round_times_s.len())
        .max()
        .unwrap_or(1);
    let x_max = rounds.saturating_sub(1).max(1) as f64;
    let y_max = series
        .iter()
        .flat_map(|s| s.round_times_s.iter().map(|t| t / rtt_s))
        .chain(marks.iter().map(|m| m.0))
        .filter(|y| y.is_finite())
        .fold(1.0, f64::max)
        * 1.15;
    let canvas = Canvas::new(path, SIZE)?;
    let text = canvas.text;
    let title = format!(
        "averaging a small vector with {} ms round trips",
        rtt.as_millis()
    );
    let mut chart = canvas.chart(&title, 0.0..x_max, 0.0..y_max)?;
    let axes = Axes {
        x: Some("round"),
        y: "round time (round trips)",
        y_format: None,
    };
    canvas.draw_axes(&mut chart, &axes)?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> = s
            .round_times_s
            .iter()
            .enumerate()
            .map(|(round, t)| (round as f64, t / rtt_s))
            .collect();
        let drawn = chart.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?;
        if text {
            drawn
                .label(s.label.clone())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color));
        }
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 4, color.filled())),
        )?;
    }
    let bandwidth = (bandwidth_bound_s / rtt_s, "bandwidth bound 2(N−1)/N·S/B");
    for (i, &(y, label)) in marks.iter().chain([&bandwidth]).enumerate() {
        let style = Palette99::pick(i + 5).to_rgba().stroke_width(1);
        let drawn =
            chart.draw_series(DashedLineSeries::new([(0.0, y), (x_max, y)], 8, 6, style))?;
        if text {
            drawn
                .label(format!("{label}: {y:.2} RTT"))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], style));
        }
    }
    canvas.draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    canvas.present()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_plots_are_written_as_png() {
        let dir = std::env::temp_dir().join(format!(
            "murmur-netns-allreduce-plot-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let efficiency_png = dir.join("e.png");
        let points = [EfficiencyPoint {
            label: "N=4 f32".into(),
            bound_s: 4.0,
            periods_s: vec![5.0, 4.5, 4.6],
        }];
        let latency_png = dir.join("l.png");
        let series = [LatencySeries {
            label: "butterfly".into(),
            round_times_s: vec![0.2, 0.1, 0.11],
        }];
        let results = [
            efficiency(&efficiency_png, &points),
            latency(
                &latency_png,
                &series,
                Duration::from_millis(50),
                &[(3.0, "bar")],
                0.001,
            ),
        ];
        for (png, result) in [&efficiency_png, &latency_png].iter().zip(results) {
            // Without the font the plot is still written, with a note that says so.
            if let Some(note) = result.unwrap() {
                assert!(note.contains("no text"), "{note}");
            }
            let bytes = std::fs::read(png).unwrap();
            assert_eq!(&bytes[1..4], b"PNG", "{}", png.display());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
