//! `murmur local --set KEY=VALUE`: any key of the daemon's config, set in every peer's
//! config file, so a local swarm can try a setting that has no flag of its own (an SGP
//! out-degree, a butterfly window, a learning rate).
//!
//! Keys with a flag of their own (`--mode`, `--codec`, `--steps`, ...) are refused: the
//! summary reports the flags. A key the schema does not know, a value of the wrong kind, or a value out of
//! range is refused before any peer starts, with the same words `murmur config check`
//! would use.

use std::path::Path;

use crate::config::schema::Config;
use crate::config::{Locator, check};
use crate::input_error::BadInput;

/// Keys that have a flag of their own, which the summary reports: setting them with
/// `--set` would leave the summary describing a run that did not happen.
const FLAG_KEYS: [(&str, &str); 6] = [
    ("averaging.mode", "--mode"),
    ("averaging.codec", "--codec"),
    ("averaging.error_feedback", "--no-error-feedback"),
    ("training.steps", "--steps"),
    ("training.slowdown", "--straggler"),
    ("training.synthetic_step_ms", "--synthetic-step-ms"),
];

/// One `--set KEY=VALUE`, parsed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Override {
    /// The flag as given, for messages.
    text: String,
    /// The dotted key, split: `["averaging", "sgp", "out_degree"]`.
    path: Vec<String>,
    value: toml::Value,
}

impl Override {
    /// Parses `KEY=VALUE`. VALUE is read as a TOML value (`2`, `0.5`, `true`, `"f32"`,
    /// `[1, 2]`); text that is not one is taken as a string, so `averaging.codec=int8:64`
    /// needs no quotes.
    pub(crate) fn parse(text: &str) -> Result<Override, BadInput> {
        let Some((key, value)) = text.split_once('=') else {
            return Err(BadInput(format!(
                "--set {text}: expected KEY=VALUE, e.g. averaging.sgp.out_degree=2"
            )));
        };
        let key = key.trim();
        let path: Vec<String> = key.split('.').map(|part| part.trim().to_owned()).collect();
        if path.iter().any(String::is_empty) {
            return Err(BadInput(format!(
                "--set {text}: `{key}` is not a dotted config key, e.g. averaging.sgp.out_degree"
            )));
        }
        if let Some((_, flag)) = FLAG_KEYS.iter().find(|(k, _)| *k == key) {
            return Err(BadInput(format!(
                "--set {text}: `{key}` has its own flag: use {flag}"
            )));
        }
        let value = value.trim();
        let value = match toml::from_str::<toml::Table>(&format!("v = {value}")) {
            Ok(mut table) => table
                .remove("v")
                .unwrap_or_else(|| toml::Value::String(value.to_owned())),
            Err(_) => toml::Value::String(value.to_owned()),
        };
        Ok(Override {
            text: text.to_owned(),
            path,
            value,
        })
    }

    /// The flag as given.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }
}

/// `config` with every override set, in order. Each is checked as `murmur run` would
/// check the file: unknown keys and wrong kinds by the schema, ranges by
/// [`check`]. The error names the flag.
pub(crate) fn apply(config: Config, overrides: &[Override]) -> Result<Config, BadInput> {
    if overrides.is_empty() {
        return Ok(config);
    }
    let mut table = toml::Table::try_from(&config)
        .map_err(|e| BadInput(format!("--set: the peer config does not serialize: {e}")))?;
    for o in overrides {
        set(&mut table, o)?;
    }
    let text = toml::to_string(&table)
        .map_err(|e| BadInput(format!("--set: the peer config does not serialize: {e}")))?;
    let config: Config = toml::from_str(&text).map_err(|e| {
        let names = overrides
            .iter()
            .map(Override::text)
            .collect::<Vec<_>>()
            .join(" --set ");
        BadInput(format!("--set {names}: {}", e.message()))
    })?;
    check(&config, &Locator::new(Path::new("--set"), &text)).map_err(|e| {
        // The error places the key in the generated text ("--set:LINE: key = value: why");
        // the line means nothing to the user, the key and the reason do.
        let said = e.to_string();
        let detail = said
            .split_once(": ")
            .map_or(said.as_str(), |(_, rest)| rest);
        BadInput(format!("--set: {detail}"))
    })?;
    Ok(config)
}

/// Sets one override's value in the config's table, creating the tables on its path.
fn set(table: &mut toml::Table, o: &Override) -> Result<(), BadInput> {
    let (last, parents) = o.path.split_last().ok_or_else(|| {
        // `parse` never yields an empty path; this guards a hand-built one.
        BadInput(format!("--set {}: no key", o.text))
    })?;
    let mut at = table;
    for (depth, part) in parents.iter().enumerate() {
        let entry = at
            .entry(part.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        at = match entry {
            toml::Value::Table(inner) => inner,
            _ => {
                return Err(BadInput(format!(
                    "--set {}: `{}` is a value, not a section",
                    o.text,
                    o.path[..=depth].join(".")
                )));
            }
        };
    }
    at.insert(last.clone(), o.value.clone());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str) -> toml::Value {
        Override::parse(text).unwrap().value
    }

    #[test]
    fn values_are_read_as_toml_and_bare_words_as_strings() {
        assert_eq!(value("a.b=2"), toml::Value::Integer(2));
        assert_eq!(value("a.b = 0.5"), toml::Value::Float(0.5));
        assert_eq!(value("a.b=true"), toml::Value::Boolean(true));
        assert_eq!(value("a.b=\"f32\""), toml::Value::String("f32".into()));
        assert_eq!(value("a.b=int8:64"), toml::Value::String("int8:64".into()));
        assert_eq!(Override::parse("a.b.c=1").unwrap().path, ["a", "b", "c"]);
    }

    #[test]
    fn malformed_flags_are_refused_with_the_flag() {
        for bad in ["averaging", "=2", "a..b=1", ".a=1", "averaging.mode=none"] {
            let e = Override::parse(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("--set {bad}")), "{e}");
        }
    }
}
