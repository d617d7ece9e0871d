//! What every scenario plot does the same way: a white PNG, a chart with its title and
//! axis descriptions when the font is there (and no text at all when it is not), a legend,
//! and a note saying why a plot has no text.

use std::path::Path;

use anyhow::Context as _;
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::scenario::font::{FONT_FAMILY, register_font};

/// A chart of `f64` against `f64` drawn on a [`Canvas`] (borrowed for `'c`) whose image
/// goes to a path borrowed for `'p`.
pub(crate) type Chart<'c, 'p> =
    ChartContext<'c, BitMapBackend<'p>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Size of tick labels and legend entries.
const LABEL_SIZE: u32 = 14;

/// An image being drawn, and whether it can have text.
pub(crate) struct Canvas<'a> {
    root: DrawingArea<BitMapBackend<'a>, Shift>,
    path: &'a Path,
    /// Whether the font is there: without it nothing is written in words.
    pub(crate) text: bool,
}

/// The axes' descriptions.
pub(crate) struct Axes<'f> {
    /// The horizontal axis; `None` for none, without its tick labels or vertical grid
    /// lines (bar charts).
    pub(crate) x: Option<&'f str>,
    /// The vertical axis.
    pub(crate) y: &'f str,
    /// How vertical tick labels are written; plotters' default when `None`.
    pub(crate) y_format: Option<&'f dyn Fn(&f64) -> String>,
}

impl<'a> Canvas<'a> {
    /// A white image of `size` pixels to be written to `path`.
    pub(crate) fn new(path: &'a Path, size: (u32, u32)) -> anyhow::Result<Canvas<'a>> {
        let text = register_font().is_ok();
        let root = BitMapBackend::new(path, size).into_drawing_area();
        root.fill(&WHITE)?;
        Ok(Canvas { root, path, text })
    }

    /// A chart over `x` × `y`, with `title` above it and room for tick labels when there
    /// is text.
    pub(crate) fn chart(
        &self,
        title: &str,
        x: std::ops::Range<f64>,
        y: std::ops::Range<f64>,
    ) -> anyhow::Result<Chart<'_, 'a>> {
        let mut builder = ChartBuilder::on(&self.root);
        builder.margin(20);
        if self.text {
            builder
                .caption(title, (FONT_FAMILY, 20))
                .x_label_area_size(50)
                .y_label_area_size(70);
        }
        Ok(builder.build_cartesian_2d(x, y)?)
    }

    /// Draws the grid, and with text the tick labels and `axes`' descriptions.
    pub(crate) fn draw_axes<'c>(
        &'c self,
        chart: &mut Chart<'c, 'a>,
        axes: &Axes<'_>,
    ) -> anyhow::Result<()> {
        let mut mesh = chart.configure_mesh();
        if let Some(format) = axes.y_format {
            mesh.y_label_formatter(format);
        }
        match axes.x {
            Some(x) if self.text => {
                mesh.x_desc(x);
            }
            Some(_) => {
                mesh.x_labels(0);
            }
            None => {
                mesh.disable_x_mesh().x_labels(0);
            }
        }
        if self.text {
            mesh.y_desc(axes.y)
                .label_style((FONT_FAMILY, LABEL_SIZE))
                .axis_desc_style((FONT_FAMILY, 16));
        } else {
            mesh.y_labels(0);
        }
        mesh.draw()?;
        Ok(())
    }

    /// Draws the legend at `position`, when there is text.
    pub(crate) fn draw_legend<'c>(
        &'c self,
        chart: &mut Chart<'c, 'a>,
        position: SeriesLabelPosition,
    ) -> anyhow::Result<()> {
        if self.text {
            chart
                .configure_series_labels()
                .position(position)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font((FONT_FAMILY, LABEL_SIZE))
                .draw()?;
        }
        Ok(())
    }

    /// Writes the image; returns a note when it has no text, saying why.
    pub(crate) fn present(&self) -> anyhow::Result<Option<String>> {
        self.root
            .present()
            .with_context(|| format!("writing {}", self.path.display()))?;
        if self.text {
            return Ok(None);
        }
        let why = register_font().err().unwrap_or_default();
        Ok(Some(format!(
            "{} has no text: no font ({why}); install fonts-dejavu-core",
            self.path.display()
        )))
    }
}
