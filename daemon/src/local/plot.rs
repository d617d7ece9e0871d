//! `<out>/loss.png`: training loss and eval loss over wall time, one line per peer, the task's
//! loss floor dashed.
//!
//! Text needs a font: DejaVu Sans is read from the system at run time (Debian's
//! `fonts-dejavu-core`, which `scripts/setup.sh` installs). Without it the plot is drawn
//! without any text, and the caller says so once.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::Context;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::record::{Reading, ReadingKind};

/// Where the font is looked for.
const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// The family name the font is registered under. Only text styled with it is drawn, so a
/// plot without the font cannot draw text by accident with plotters' default family.
pub(crate) const FONT_FAMILY: &str = "murmur-dejavu-sans";
/// Image size in pixels: two panels side by side.
const SIZE: (u32, u32) = (1400, 560);

/// Registers the font once per process; the error says why there is none.
pub(crate) fn register_font() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let bytes = std::fs::read(FONT_PATH).map_err(|e| format!("{FONT_PATH}: {e}"))?;
            // plotters keeps registered fonts for the life of the process and wants
            // 'static bytes; this happens at most once.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, bytes)
                .map_err(|_| format!("{FONT_PATH} is not a font plotters can read"))
        })
        .clone()
}

/// Draws the plot; returns a note when it had to be drawn without text.
pub(crate) fn write_loss_plot(
    path: &Path,
    readings: &[Reading],
    peers: usize,
    floor: Option<f64>,
) -> anyhow::Result<Option<String>> {
    match register_font() {
        Ok(()) => draw(path, readings, peers, floor, true).map(|()| None),
        Err(why) => draw(path, readings, peers, floor, false).map(|()| {
            Some(format!(
                "{} has no text: no font ({why}); install fonts-dejavu-core",
                path.display()
            ))
        }),
    }
}

/// One panel: its title and which readings it shows.
struct Panel {
    title: &'static str,
    value: fn(&Reading) -> Option<f64>,
}

fn draw(
    path: &Path,
    readings: &[Reading],
    peers: usize,
    floor: Option<f64>,
    text: bool,
) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2);
    let panels = [
        Panel {
            title: "training loss",
            value: |r| {
                (r.kind == ReadingKind::Progress)
                    .then_some(r.loss)
                    .flatten()
            },
        },
        Panel {
            title: "eval loss",
            value: |r| {
                (r.kind != ReadingKind::Progress)
                    .then_some(r.eval_loss)
                    .flatten()
            },
        },
    ];
    for (area, panel) in [left, right].iter().zip(&panels) {
        draw_panel(area, panel, readings, peers, floor, text)?;
    }
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
    readings: &[Reading],
    peers: usize,
    floor: Option<f64>,
    text: bool,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let points = |peer: usize| -> Vec<(f64, f64)> {
        readings
            .iter()
            .filter(|r| r.peer == peer)
            .filter_map(|r| Some((r.wall_s, (panel.value)(r)?)))
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect()
    };
    let all: Vec<(f64, f64)> = (0..peers).flat_map(points).collect();
    let x_max = all.iter().map(|p| p.0).fold(1.0, f64::max);
    let ys = all.iter().map(|p| p.1).chain(floor);
    let axes = Axes {
        title: panel.title,
        x_desc: "wall time (s)",
        y_desc: "loss",
    };
    let mut chart = panel_chart(area, &axes, x_max, ys, text)?;

    for peer in 0..peers {
        let color = Palette99::pick(peer).to_rgba();
        let series = chart.draw_series(LineSeries::new(points(peer), color.stroke_width(2)))?;
        if text {
            series
                .label(format!("peer {peer}"))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color));
        }
    }
    if let Some(floor) = floor {
        let style = BLACK.stroke_width(1);
        let series = chart.draw_series(DashedLineSeries::new(
            [(0.0, floor), (x_max * 1.02, floor)],
            8,
            6,
            style,
        ))?;
        if text {
            series
                .label(format!("floor {floor:.4}"))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], style));
        }
    }
    draw_legend(&mut chart, text)
}

/// A panel's title and axis names.
pub(crate) struct Axes<'a> {
    pub(crate) title: &'a str,
    pub(crate) x_desc: &'a str,
    pub(crate) y_desc: &'a str,
}

/// The chart of one panel over `0..x_max` and the range of `ys` (padded), its mesh drawn;
/// without the font (`text` false) it has no caption, labels or axis names.
pub(crate) fn panel_chart<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, plotters::coord::Shift>,
    axes: &Axes<'_>,
    x_max: f64,
    ys: impl Iterator<Item = f64>,
    text: bool,
) -> anyhow::Result<ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>>
where
    DB::ErrorType: 'static,
{
    let (mut y_min, mut y_max) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), y| {
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
            .caption(axes.title, (FONT_FAMILY, 22))
            .x_label_area_size(45)
            .y_label_area_size(60);
    }
    let mut chart = builder.build_cartesian_2d(0.0..x_max * 1.02, (y_min - pad)..(y_max + pad))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc(axes.x_desc)
            .y_desc(axes.y_desc)
            .label_style((FONT_FAMILY, 14))
            .axis_desc_style((FONT_FAMILY, 16));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw()?;
    Ok(chart)
}

/// The legend of every labelled series, top right (none without the font).
pub(crate) fn draw_legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    text: bool,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
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

#[cfg(test)]
mod tests {
    use super::*;

    fn readings() -> Vec<Reading> {
        let mut out = Vec::new();
        for peer in 0..3 {
            for i in 0..20u32 {
                let t = f64::from(i) * 0.5;
                let loss = 3.0 / (1.0 + t) + 1.0 + 0.02 * peer as f64;
                let base = Reading {
                    wall_s: t,
                    peer,
                    kind: ReadingKind::Progress,
                    step: Some(u64::from(i) * 5),
                    loss: Some(loss),
                    eval_loss: None,
                    samples_per_s: Some(100.0),
                    bytes_sent: Some(u64::from(i) * 1000),
                };
                out.push(base.clone());
                if i % 5 == 0 {
                    out.push(Reading {
                        kind: ReadingKind::Eval,
                        loss: None,
                        eval_loss: Some(loss + 0.1),
                        ..base
                    });
                }
            }
        }
        out
    }

    fn assert_png(path: &Path) {
        let bytes = std::fs::read(path).unwrap();
        assert!(bytes.len() > 1000, "{} bytes", bytes.len());
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    }

    #[test]
    fn the_plot_is_a_png_with_or_without_text() {
        let dir = tempfile::tempdir().unwrap();
        let with_text = dir.path().join("loss.png");
        let note = write_loss_plot(&with_text, &readings(), 3, Some(1.0)).unwrap();
        assert_eq!(note.is_some(), register_font().is_err());
        assert_png(&with_text);

        // Drawing without text must not need any font.
        let without = dir.path().join("plain.png");
        draw(&without, &readings(), 3, Some(1.0), false).unwrap();
        assert_png(&without);
    }

    #[test]
    fn an_empty_run_still_gives_a_plot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.png");
        write_loss_plot(&path, &[], 2, None).unwrap();
        assert_png(&path);
    }
}
