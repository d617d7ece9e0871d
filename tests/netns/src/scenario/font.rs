//! The font the scenarios' plots write their text in: DejaVu Sans, read at run time from
//! Debian's `fonts-dejavu-core` (`scripts/setup.sh` installs it). Without it plots are drawn
//! without text, and the plotting functions say so.

use std::sync::OnceLock;

use plotters::style::FontStyle;

/// Where the font is looked for.
pub(crate) const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// The family the font is registered under; only text styled with it is drawn, so a plot
/// without the font cannot draw text with plotters' default family by accident.
pub(crate) const FONT_FAMILY: &str = "murmur-netns-dejavu-sans";

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
