//! `murmur local --set KEY=VALUE`: any key of the daemon's config, set in every peer's
//! config file, so a local swarm can try a setting that has no flag of its own (an SGP
//! out-degree, a butterfly window, a learning rate). `--set-peer PEER:KEY=VALUE` sets it
//! in one peer's file only (a mixed swarm: one peer on a GPU, the others on the CPU); it
//! applies after every `--set`.
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

/// One `--set KEY=VALUE` or `--set-peer PEER:KEY=VALUE`, parsed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Override {
    /// The flag and its value as given, for messages: `--set a.b=1`.
    text: String,
    /// The one peer it applies to (`--set-peer`), or every peer.
    peer: Option<usize>,
    /// The dotted key, split: `["averaging", "sgp", "out_degree"]`.
    path: Vec<String>,
    value: toml::Value,
}

impl Override {
    /// Parses `KEY=VALUE`. VALUE is read as a TOML value (`2`, `0.5`, `true`, `"f32"`,
    /// `[1, 2]`); text that is not one is taken as a string, so `averaging.codec=int8:64`
    /// needs no quotes.
    pub(crate) fn parse(text: &str) -> Result<Override, BadInput> {
        Override::parse_as(text, format!("--set {text}"), None)
    }

    /// Parses `PEER:KEY=VALUE`, for peer PEER (0-based) of `peers` only.
    pub(crate) fn parse_for_peer(text: &str, peers: usize) -> Result<Override, BadInput> {
        let flag = format!("--set-peer {text}");
        let Some((peer, setting)) = text.split_once(':') else {
            return Err(BadInput(format!(
                "{flag}: expected PEER:KEY=VALUE, e.g. 0:training.device=cuda"
            )));
        };
        let peer = match peer.trim().parse::<usize>() {
            Ok(peer) if peer < peers => peer,
            _ => {
                return Err(BadInput(format!(
                    "{flag}: `{peer}` is not a peer: give a number from 0 to {}",
                    peers.saturating_sub(1)
                )));
            }
        };
        Override::parse_as(setting, flag, Some(peer))
    }

    /// Parses `KEY=VALUE`; `flag` is the flag and its value as given, for messages.
    fn parse_as(text: &str, flag: String, peer: Option<usize>) -> Result<Override, BadInput> {
        let Some((key, value)) = text.split_once('=') else {
            return Err(BadInput(format!(
                "{flag}: expected KEY=VALUE, e.g. averaging.sgp.out_degree=2"
            )));
        };
        let key = key.trim();
        let path: Vec<String> = key.split('.').map(|part| part.trim().to_owned()).collect();
        if path.iter().any(String::is_empty) {
            return Err(BadInput(format!(
                "{flag}: `{key}` is not a dotted config key, e.g. averaging.sgp.out_degree"
            )));
        }
        if let Some((_, own)) = FLAG_KEYS.iter().find(|(k, _)| *k == key) {
            return Err(BadInput(format!(
                "{flag}: `{key}` has its own flag: use {own}"
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
            text: flag,
            peer,
            path,
            value,
        })
    }

    /// The flag and its value as given.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// The one peer this override is for, if any.
    pub(crate) fn peer(&self) -> Option<usize> {
        self.peer
    }

    /// Whether it applies to peer `index`.
    fn applies_to(&self, index: usize) -> bool {
        self.peer.is_none_or(|peer| peer == index)
    }
}

/// Peer `index`'s `config` with every override for it set, in order. Each is checked as
/// `murmur run` would check the file: unknown keys and wrong kinds by the schema, ranges by
/// [`check`]. The error names the flag.
pub(crate) fn apply(
    config: Config,
    overrides: &[Override],
    index: usize,
) -> Result<Config, BadInput> {
    let overrides: Vec<&Override> = overrides.iter().filter(|o| o.applies_to(index)).collect();
    if overrides.is_empty() {
        return Ok(config);
    }
    let mut table = toml::Table::try_from(&config)
        .map_err(|e| BadInput(format!("--set: the peer config does not serialize: {e}")))?;
    for o in &overrides {
        set(&mut table, o)?;
    }
    let text = toml::to_string(&table)
        .map_err(|e| BadInput(format!("--set: the peer config does not serialize: {e}")))?;
    let config: Config = toml::from_str(&text).map_err(|e| {
        let names = overrides
            .iter()
            .map(|o| o.text())
            .collect::<Vec<_>>()
            .join(" ");
        BadInput(format!("{names}: {}", e.message()))
    })?;
    check(&config, &Locator::new(Path::new("--set"), &text)).map_err(|e| {
        // The error places the key in the generated text ("--set:LINE: key = value: why");
        // the line means nothing to the user, the key and the reason do.
        let said = e.to_string();
        let detail = said
            .split_once(": ")
            .map_or(said.as_str(), |(_, rest)| rest);
        let flag = if overrides.iter().any(|o| o.peer.is_some()) {
            format!("--set/--set-peer (peer {index})")
        } else {
            "--set".to_owned()
        };
        BadInput(format!("{flag}: {detail}"))
    })?;
    Ok(config)
}

/// Sets one override's value in the config's table, creating the tables on its path.
fn set(table: &mut toml::Table, o: &Override) -> Result<(), BadInput> {
    let (last, parents) = o.path.split_last().ok_or_else(|| {
        // `parse` never yields an empty path; this guards a hand-built one.
        BadInput(format!("{}: no key", o.text))
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
                    "{}: `{}` is a value, not a section",
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
    fn a_peer_override_names_one_peer_of_the_swarm() {
        let o = Override::parse_for_peer("1:training.device=cuda", 2).unwrap();
        assert_eq!(o.peer(), Some(1));
        assert!(o.applies_to(1) && !o.applies_to(0));
        assert_eq!(o.value, toml::Value::String("cuda".into()));
        assert_eq!(o.text(), "--set-peer 1:training.device=cuda");
        assert!(Override::parse("a.b=1").unwrap().applies_to(7));
        for bad in [
            "2:a.b=1",
            "x:a.b=1",
            "a.b=1",
            ":a.b=1",
            "0:averaging.mode=none",
        ] {
            let e = Override::parse_for_peer(bad, 2).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--set-peer {bad}: ")), "{e}");
        }
    }

    #[test]
    fn malformed_flags_are_refused_with_the_flag() {
        for bad in ["averaging", "=2", "a..b=1", ".a=1", "averaging.mode=none"] {
            let e = Override::parse(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("--set {bad}")), "{e}");
        }
    }
}
