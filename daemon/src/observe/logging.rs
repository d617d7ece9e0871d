//! Logging: `tracing` events to standard error, as text for people or JSON lines for log
//! collectors.
//!
//! The level comes from the config (`info`, or directives such as `info,murmur=debug`);
//! `RUST_LOG`, when set, overrides it with the usual `tracing-subscriber` syntax.

use tracing::Subscriber;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// Levels a directive may name.
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum LogFormat {
    /// One readable line per event, coloured when standard error is a terminal.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoggingError {
    /// The config's level is not a level or `target=level` list.
    #[error(
        "invalid log level `{value}`: `{directive}` is not one of off, error, warn, info, \
         debug, trace, or `target=level`"
    )]
    Level {
        /// The whole setting.
        value: String,
        /// The part that is wrong.
        directive: String,
    },
    /// `RUST_LOG` does not parse.
    #[error("invalid RUST_LOG `{value}`: {reason}; unset it or fix its syntax")]
    RustLog {
        /// The variable's value.
        value: String,
        /// What the parser reported.
        reason: String,
    },
    /// Logging was set up already in this process.
    #[error("logging is already set up in this process")]
    AlreadyInitialized,
}

/// Sets up logging for the whole process, at `level` (from the config) unless `RUST_LOG`
/// is set, in `format`. Once per process.
pub(crate) fn init_logging(level: &str, format: LogFormat) -> Result<(), LoggingError> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = log_filter(level, rust_log.as_deref())?;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let subscriber = build_subscriber(filter, format, ansi, std::io::stderr);
    tracing::subscriber::set_global_default(subscriber)
        .map_err(|_| LoggingError::AlreadyInitialized)
}

/// The filter: `rust_log` when set and not blank, else the config's `level`.
fn log_filter(level: &str, rust_log: Option<&str>) -> Result<EnvFilter, LoggingError> {
    if let Some(value) = rust_log.filter(|v| !v.trim().is_empty()) {
        return EnvFilter::try_new(value).map_err(|e| LoggingError::RustLog {
            value: value.to_owned(),
            reason: e.to_string(),
        });
    }
    // EnvFilter reads a bare word as a target name, so a misspelt level (`infoo`) would
    // silently log nothing; check each directive names a level first.
    for directive in level.split(',') {
        let wanted = directive.rsplit_once('=').map_or(directive, |(_, l)| l);
        let target_ok = directive
            .split_once('=')
            .is_none_or(|(target, _)| !target.trim().is_empty());
        if !target_ok || !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(wanted.trim())) {
            return Err(LoggingError::Level {
                value: level.to_owned(),
                directive: directive.to_owned(),
            });
        }
    }
    EnvFilter::try_new(level).map_err(|_| LoggingError::Level {
        value: level.to_owned(),
        directive: level.to_owned(),
    })
}

fn build_subscriber<W>(
    filter: EnvFilter,
    format: LogFormat,
    ansi: bool,
    writer: W,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Human => Box::new(builder.with_ansi(ansi).finish()),
        LogFormat::Json => Box::new(builder.json().with_ansi(false).finish()),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn levels_and_target_directives_are_accepted() {
        for level in [
            "info",
            "DEBUG",
            "warn,murmur=trace",
            "off",
            "murmur::observe=debug",
        ] {
            assert!(log_filter(level, None).is_ok(), "{level}");
        }
    }

    #[test]
    fn a_misspelt_level_is_a_clear_error() {
        for (level, wrong) in [
            ("infoo", "infoo"),
            ("info,murmur=loud", "murmur=loud"),
            ("=info", "=info"),
            ("", ""),
        ] {
            let err = log_filter(level, None).expect_err(level);
            let message = err.to_string();
            assert!(message.contains(&format!("`{wrong}`")), "{message}");
            assert!(message.contains("debug"), "lists the levels: {message}");
        }
    }

    #[test]
    fn rust_log_overrides_the_config_and_is_checked_too() {
        // An invalid config level does not matter when RUST_LOG decides.
        assert!(log_filter("infoo", Some("debug")).is_ok());
        // A blank RUST_LOG does not override.
        assert!(log_filter("infoo", Some("  ")).is_err());
        let err = log_filter("info", Some("murmur=[")).expect_err("bad RUST_LOG");
        assert!(err.to_string().contains("RUST_LOG"), "{err}");
    }

    #[test]
    fn init_checks_the_level_first_and_installs_only_once() {
        if std::env::var_os("RUST_LOG").is_none() {
            let err = init_logging("infoo", LogFormat::Human).expect_err("misspelt");
            assert!(matches!(err, LoggingError::Level { .. }), "{err}");
        }
        // The first install may have happened elsewhere in this test process; the second
        // never succeeds.
        let first = init_logging("off", LogFormat::Human);
        assert!(
            matches!(first, Ok(()) | Err(LoggingError::AlreadyInitialized)),
            "{first:?}"
        );
        let second = init_logging("off", LogFormat::Json);
        assert!(
            matches!(second, Err(LoggingError::AlreadyInitialized)),
            "{second:?}"
        );
    }

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;

        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    #[test]
    fn json_lines_parse_and_the_filter_holds_back_lower_levels() {
        let out = Captured::default();
        let filter = log_filter("info", None).expect("valid");
        let subscriber = build_subscriber(filter, LogFormat::Json, false, out.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(step = 7, "averaged");
            tracing::debug!("too detailed");
        });
        let bytes = out.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let text = String::from_utf8(bytes).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        let event: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON line");
        assert_eq!(event["level"], "INFO");
        assert_eq!(event["fields"]["message"], "averaged");
        assert_eq!(event["fields"]["step"], 7);
    }

    #[test]
    fn human_lines_carry_the_message_without_colour_codes() {
        let out = Captured::default();
        let filter = log_filter("warn", None).expect("valid");
        let subscriber = build_subscriber(filter, LogFormat::Human, false, out.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!("peer dropped");
            tracing::info!("hidden");
        });
        let bytes = out.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let text = String::from_utf8(bytes).expect("utf-8");
        assert!(
            text.contains("WARN") && text.contains("peer dropped"),
            "{text}"
        );
        assert!(
            !text.contains("hidden") && !text.contains('\u{1b}'),
            "{text}"
        );
    }
}
