//! The alerting rules in `dashboards/alerts.yml`, checked and unit-tested by promtool.
//!
//! `promtool check rules` must accept the file, and `promtool test rules` must pass
//! `dashboards/alerts.test.yml`, which must test every alert both firing and silent. Every
//! metric a rule reads must be one the daemon exports: one listed in the metric table of
//! `daemon/src/observe/mod.rs`, which a unit test there holds equal to what the registry
//! exports.
//!
//! `promtool` comes from Debian's `prometheus` package (`scripts/setup.sh` installs it). A
//! build on a machine without it marks the promtool tests ignored, so the runner reports
//! them skipped rather than passed (see `daemon/build.rs`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[path = "support/tool.rs"]
mod tool;

/// How long one promtool command may take.
const PROMTOOL_PATIENCE: Duration = Duration::from_secs(60);

/// The repository's `dashboards/` folder.
fn dashboards_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Runs `promtool args…` in `dashboards/`, bounded: whether it succeeded, and what it said.
fn promtool(args: &[&str]) -> (bool, String) {
    tool::run_bounded(
        Path::new("promtool"),
        args,
        Some(&dashboards_dir()),
        "",
        PROMTOOL_PATIENCE,
    )
}

/// The value after `key:` on a YAML line (one `- ` list marker allowed), unquoted.
fn yaml_value<'l>(line: &'l str, key: &str) -> Option<&'l str> {
    let line = line.trim_start();
    let line = line.strip_prefix("- ").unwrap_or(line);
    let value = line.strip_prefix(key)?.strip_prefix(':')?.trim();
    Some(value.trim_matches(|c| c == '"' || c == '\''))
}

/// The names of the alerts `alerts.yml` defines.
fn alert_names(rules: &str) -> BTreeSet<String> {
    rules
        .lines()
        .filter_map(|l| yaml_value(l, "alert"))
        .map(str::to_owned)
        .collect()
}

/// For each alert name `alerts.test.yml` tests: whether a case expects it to fire, and
/// whether one expects it silent (`exp_alerts: []`).
fn tested_cases(tests: &str) -> Vec<(String, bool)> {
    let lines: Vec<&str> = tests.lines().collect();
    let mut cases = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = yaml_value(line, "alertname") else {
            continue;
        };
        let expects = lines[i + 1..]
            .iter()
            .find_map(|l| yaml_value(l, "exp_alerts"))
            .unwrap_or_else(|| panic!("alerts.test.yml: no exp_alerts after alertname {name}"));
        cases.push((name.to_owned(), expects != "[]"));
    }
    cases
}

/// The `murmur_…` metric names (not recorded series, which hold a `:`) a text mentions.
fn metrics_named(text: &str) -> BTreeSet<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    text.split(|c: char| !is_name(c))
        .filter(|word| word.starts_with("murmur_") && !word.contains(':'))
        .map(str::to_owned)
        .collect()
}

/// The metric names the table in the daemon's `observe/mod.rs` documents.
fn documented_metrics() -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/observe/mod.rs");
    read(&path)
        .lines()
        .filter_map(|l| l.strip_prefix("//! | `murmur_"))
        .filter_map(|rest| rest.split_once('`'))
        .map(|(name, _)| format!("murmur_{name}"))
        .collect()
}

#[test]
#[cfg_attr(
    not(murmur_has_promtool),
    ignore = "promtool was not on PATH when murmur was built: install Debian's `prometheus` \
              package (scripts/setup.sh), then rebuild (touch daemon/build.rs)"
)]
fn promtool_accepts_the_alert_rules() {
    let (ok, said) = promtool(&["check", "rules", "alerts.yml"]);
    assert!(ok, "promtool check rules dashboards/alerts.yml:\n{said}");
}

#[test]
#[cfg_attr(
    not(murmur_has_promtool),
    ignore = "promtool was not on PATH when murmur was built: install Debian's `prometheus` \
              package (scripts/setup.sh), then rebuild (touch daemon/build.rs)"
)]
fn the_alert_rules_pass_their_promtool_unit_tests() {
    let (ok, said) = promtool(&["test", "rules", "alerts.test.yml"]);
    assert!(
        ok && said.contains("SUCCESS"),
        "promtool test rules dashboards/alerts.test.yml:\n{said}"
    );
}

#[test]
fn every_alert_is_tested_firing_and_silent() {
    let dir = dashboards_dir();
    let alerts = alert_names(&read(&dir.join("alerts.yml")));
    let cases = tested_cases(&read(&dir.join("alerts.test.yml")));
    for needed in [
        "MurmurPeerAlone",
        "MurmurSwarmLossRising",
        "MurmurAveragingRoundsFailing",
        "MurmurPeerStraggling",
        "MurmurStragglersDropped",
        "MurmurCheckpointsFailing",
    ] {
        assert!(
            alerts.contains(needed),
            "alerts.yml has no {needed}: {alerts:?}"
        );
    }
    let mut missing = Vec::new();
    for alert in &alerts {
        for firing in [true, false] {
            if !cases.iter().any(|(name, f)| name == alert && *f == firing) {
                let how = if firing { "firing" } else { "silent" };
                missing.push(format!("{alert} {how}"));
            }
        }
    }
    for (name, _) in &cases {
        assert!(
            alerts.contains(name),
            "alerts.test.yml tests {name}, which alerts.yml lacks"
        );
    }
    assert!(
        missing.is_empty(),
        "alerts.test.yml has no case for: {missing:?}"
    );
}

#[test]
fn the_alert_rules_read_only_metrics_the_daemon_exports() {
    let rules = read(&dashboards_dir().join("alerts.yml"));
    let named = metrics_named(&rules);
    assert!(
        named.len() >= 6,
        "too few metrics found in alerts.yml: {named:?}"
    );
    let documented = documented_metrics();
    assert!(
        documented.contains("murmur_build_info"),
        "the metric table of observe/mod.rs was not read: {documented:?}"
    );
    let unknown: Vec<&String> = named.difference(&documented).collect();
    assert!(
        unknown.is_empty(),
        "alerts.yml reads metrics the daemon does not export: {unknown:?}"
    );
}

#[test]
fn the_yaml_readers_find_what_they_look_for() {
    assert_eq!(
        yaml_value("      - alert: MurmurX", "alert"),
        Some("MurmurX")
    );
    assert_eq!(yaml_value("  alertname: 'Y'", "alertname"), Some("Y"));
    assert_eq!(yaml_value("  alerting: z", "alert"), None);
    let cases = tested_cases(
        "- eval_time: 1m\n  alertname: A\n  exp_alerts: []\n\
         - eval_time: 2m\n  alertname: A\n  exp_alerts:\n    - exp_labels: {}\n",
    );
    assert_eq!(cases, [("A".to_owned(), false), ("A".to_owned(), true)]);
    let named = metrics_named("rate(murmur_a_total[5m]) > murmur:b:avg * murmur_c");
    assert_eq!(
        named,
        BTreeSet::from(["murmur_a_total".to_owned(), "murmur_c".to_owned()])
    );
}
