//! The fault scenarios' plots: values over wall time, one line per series, coloured by the
//! series' group (a half of a partition, survivors and churned peers), with shaded bands for
//! the fault's windows and an optional dashed bound.
//!
//! Text needs DejaVu Sans, read at run time from Debian's `fonts-dejavu-core`
//! (`scripts/setup.sh` installs it); without it the plot is drawn without text and the
//! returned note says so.

use std::path::Path;

use plotters::prelude::*;

use crate::scenario::chart::{Axes, Canvas};

/// Image size in pixels.
const SIZE: (u32, u32) = (1100, 620);
/// Colours of the groups, in order.
const GROUP_COLOURS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// One line of a plot.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    /// The legend entry; only the first series of each group is listed.
    pub(crate) label: String,
    /// Series of one group share a colour.
    pub(crate) group: usize,
    /// `(seconds, value)`, in time order.
    pub(crate) points: Vec<(f64, f64)>,
}

/// A shaded stretch of time.
#[derive(Debug, Clone)]
pub(crate) struct Band {
    /// Start, in seconds.
    pub(crate) from: f64,
    /// End, in seconds.
    pub(crate) to: f64,
    /// What it marks, in the legend.
    pub(crate) label: String,
}

/// Draws `series` over time into `path`, with `bands` shaded and `bound` dashed; with
/// `log_y` the value axis is logarithmic (values at or below zero are left out). Returns a
/// note when it had to be drawn without text.
pub(crate) fn lines_over_time(
    path: &Path,
    title: &str,
    y_label: &str,
    series: &[Series],
    bands: &[Band],
    bound: Option<f64>,
    log_y: bool,
) -> anyhow::Result<Option<String>> {
    // A logarithmic axis is drawn as a linear one over log10 of the values.
    let scale = |v: f64| if log_y { v.log10() } else { v };
    let shown = |v: f64| v.is_finite() && (!log_y || v > 0.0);
    let values = || {
        series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|p| shown(p.1))
    };
    let x_max = values()
        .map(|p| p.0)
        .chain(bands.iter().map(|b| b.to))
        .fold(1.0, f64::max)
        * 1.02;
    let x_min = values().map(|p| p.0).fold(0.0, f64::min);
    let (mut y_min, mut y_max) = values()
        .map(|p| scale(p.1))
        .chain(bound.filter(|b| shown(*b)).map(scale))
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if y_min > y_max {
        (y_min, y_max) = (0.0, 1.0);
    }
    let pad = ((y_max - y_min) * 0.05).max(1e-3);
    let (y_min, y_max) = (
        if log_y { y_min - pad } else { y_min.min(0.0) },
        y_max + pad,
    );

    let canvas = Canvas::new(path, SIZE)?;
    let text = canvas.text;
    let mut chart = canvas.chart(title, x_min..x_max, y_min..y_max)?;
    let format_y = |v: &f64| {
        if log_y {
            format!("{:.1e}", 10f64.powf(*v))
        } else {
            format!("{v:.3}")
        }
    };
    let axes = Axes {
        x: Some("seconds since the first peer was ready"),
        y: y_label,
        y_format: Some(&format_y),
    };
    canvas.draw_axes(&mut chart, &axes)?;

    for band in bands {
        let area = chart.draw_series(std::iter::once(Rectangle::new(
            [(band.from, y_min), (band.to, y_max)],
            RGBColor(200, 200, 200).mix(0.35).filled(),
        )))?;
        if text {
            area.label(band.label.clone()).legend(|(x, y)| {
                Rectangle::new(
                    [(x, y - 5), (x + 16, y + 5)],
                    RGBColor(200, 200, 200).filled(),
                )
            });
        }
    }
    let mut listed = Vec::new();
    for s in series {
        let colour = GROUP_COLOURS[s.group % GROUP_COLOURS.len()];
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| shown(p.1))
            .map(|p| (p.0, scale(p.1)))
            .collect();
        let line = chart.draw_series(LineSeries::new(
            points.iter().copied(),
            colour.mix(0.6).stroke_width(1),
        ))?;
        if text && !listed.contains(&s.group) {
            listed.push(s.group);
            line.label(s.label.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(2))
            });
        }
        chart.draw_series(
            points
                .iter()
                .map(|&p| Circle::new(p, 2, colour.mix(0.8).filled())),
        )?;
    }
    if let Some(bound) = bound.filter(|b| shown(*b)) {
        let y = scale(bound);
        let dashed = DashedLineSeries::new([(x_min, y), (x_max, y)], 8, 6, BLACK.stroke_width(1));
        let drawn = chart.draw_series(dashed)?;
        if text {
            drawn.label(format!("bound {bound:.4}")).legend(|(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], BLACK.stroke_width(1))
            });
        }
    }
    canvas.draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    canvas.present()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plot_is_written_with_bands_bound_and_a_log_axis() {
        let dir = std::env::temp_dir().join(format!("murmur-fault-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let series = [
            Series {
                label: "half 0".into(),
                group: 0,
                points: vec![(0.0, 0.01), (1.0, 0.02), (2.0, 0.0)],
            },
            Series {
                label: "half 1".into(),
                group: 1,
                points: vec![(0.5, 0.3), (1.5, f64::NAN)],
            },
        ];
        let band = Band {
            from: 0.5,
            to: 1.2,
            label: "partitioned".into(),
        };
        for log_y in [true, false] {
            let path = dir.join(format!("plot-{log_y}.png"));
            let bands = std::slice::from_ref(&band);
            lines_over_time(&path, "t", "y", &series, bands, Some(0.05), log_y).unwrap();
            assert!(std::fs::metadata(&path).unwrap().len() > 1000);
        }
        lines_over_time(&dir.join("empty.png"), "t", "y", &[], &[], None, true).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
