//! The daemon's metrics against a real Prometheus and promtool, and `/status` under a crash.
//!
//! A swarm of three `murmur run` peers trains on loopback while a real Prometheus server
//! scrapes their `/metrics` every second; once in SGP and once in butterfly mode. Every
//! dashboard in `dashboards/grafana/*.json` filters its queries by the `swarm` and `peer`
//! variables, which are substituted as Grafana would (the swarm's id, and one peer's id or
//! every peer). Through Prometheus' HTTP API, every PromQL expression of every panel that is
//! meant for the swarm's mode must return data, and every one that is not (a panel joined on
//! `murmur_build_info{mode="sgp"}` in a butterfly swarm, or on
//! `murmur_training_device_info{device!="cpu"}` in these CPU swarms) must return none; every
//! metric a dashboard names must be one the daemons export (the GPU panels' metrics:
//! `scripts/gpu-check.sh` checks them on a GPU host); `promtool check metrics` must
//! find nothing to say about any daemon's page, and `promtool check config` must accept the
//! example `dashboards/prometheus.yml`. Then one peer is killed with SIGKILL and the
//! survivors' `/status` and `/metrics` must show it gone, and their rounds' outcomes change,
//! within two heartbeat intervals.
//!
//! `prometheus` and `promtool` come from Debian's `prometheus` package, which
//! `scripts/setup.sh` installs; without them these tests fail, saying so.

#[path = "support/tool.rs"]
mod checker;
mod run_support;
#[path = "support/swarm.rs"]
mod swarm;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use swarm::{LocalSwarm, SwarmPeer, SwarmSpec, free_port, http_get, listed_peers};

/// How long the swarm may take until every peer lists every other.
const MESH_PATIENCE: Duration = Duration::from_secs(120);
/// How long Prometheus may take to answer `/-/ready`.
const PROMETHEUS_PATIENCE: Duration = Duration::from_secs(60);
/// How long, after Prometheus is ready, the dashboards' queries may take to return data:
/// rates need two scrapes, ratios of increases need a round and a sample in their window.
const QUERY_PATIENCE: Duration = Duration::from_secs(90);
/// The window that stands for Grafana's `$__rate_interval` (ten 1 s scrapes).
const RATE_INTERVAL: &str = "10s";
/// How long a `promtool` command may take.
const PROMTOOL_PATIENCE: Duration = Duration::from_secs(60);

/// The repository's `dashboards/` folder.
fn dashboards_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards")
}

/// The path of `name` on `PATH`; fails the test, saying how to install it, when missing.
fn tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not on PATH; run scripts/setup.sh, which installs Debian's \
                 `prometheus` package (it carries both `prometheus` and `promtool`)"
            )
        })
}

/// Runs `promtool args…` with `stdin` on its standard input, bounded; its exit status and
/// everything it printed.
fn promtool(args: &[&str], stdin: &str) -> (bool, String) {
    checker::run_bounded(&tool("promtool"), args, None, stdin, PROMTOOL_PATIENCE)
}

/// A Prometheus server on a free loopback port, scraping `targets` every second; killed when
/// dropped.
struct Prometheus {
    addr: SocketAddr,
    child: Child,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(targets: &[SocketAddr]) -> Prometheus {
        let binary = tool("prometheus");
        let dir = tempfile::tempdir().expect("a temporary folder");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: murmur\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("the Prometheus config is written");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = File::create(dir.path().join("prometheus.log")).expect("a log file");
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("prometheus starts");
        let mut prometheus = Prometheus { addr, child, dir };
        prometheus.wait_ready();
        prometheus
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + PROMETHEUS_PATIENCE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.fail(&format!("exited ({status}) before it was ready"));
            }
            if matches!(http_get(self.addr, "/-/ready"), Ok((200, _))) {
                return;
            }
            if Instant::now() > deadline {
                self.fail(&format!("not ready within {PROMETHEUS_PATIENCE:?}"));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// An instant query: the result vector, or what went wrong.
    fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let path = format!("/api/v1/query?query={}", percent_encode(expr));
        let (status, body) = http_get(self.addr, &path)?;
        let answer: Value =
            serde_json::from_str(&body).map_err(|e| format!("HTTP {status}, not JSON ({e})"))?;
        if answer["status"] != "success" {
            return Err(format!("HTTP {status}: {answer}"));
        }
        answer["data"]["result"]
            .as_array()
            .cloned()
            .ok_or_else(|| format!("no result vector in {answer}"))
    }

    fn fail(&self, why: &str) -> ! {
        let log = std::fs::read_to_string(self.dir.path().join("prometheus.log"));
        panic!("prometheus: {why}\nlog:\n{}", log.unwrap_or_default());
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `text` for a URL query value: unreserved bytes as they are, every other byte `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// One PromQL expression of a dashboard, with where it comes from.
#[derive(Debug)]
struct PanelQuery {
    /// `file: panel title`.
    origin: String,
    expr: String,
}

/// Every panel query and every `label_values(metric, label)` variable of every dashboard.
fn dashboard_queries() -> (Vec<PanelQuery>, Vec<(String, String, String)>) {
    let dir = dashboards_dir().join("grafana");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 3,
        "expected the overview, peer detail and cost dashboards in {}",
        dir.display()
    );
    let mut queries = Vec::new();
    let mut variables = Vec::new();
    for file in &files {
        let name = file
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let text = std::fs::read_to_string(file).expect("the dashboard is readable");
        let board: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"));
        let mut panels: Vec<&Value> = board["panels"].as_array().into_iter().flatten().collect();
        while let Some(panel) = panels.pop() {
            panels.extend(panel["panels"].as_array().into_iter().flatten());
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().unwrap_or_default();
                assert!(
                    !expr.trim().is_empty(),
                    "{name}: panel {:?} has a target without an expression",
                    panel["title"]
                );
                queries.push(PanelQuery {
                    origin: format!("{name}: {}", panel["title"].as_str().unwrap_or("?")),
                    expr: expr.to_owned(),
                });
            }
        }
        for variable in board["templating"]["list"].as_array().into_iter().flatten() {
            if variable["type"] != "query" {
                continue;
            }
            let query = variable["query"]["query"]
                .as_str()
                .or_else(|| variable["query"].as_str())
                .unwrap_or_default();
            let inner = query
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .unwrap_or_else(|| {
                    panic!("{name}: variable query {query:?} is not label_values(metric, label)")
                });
            let (metric, label) = inner
                .rsplit_once(',')
                .unwrap_or_else(|| panic!("{name}: {query:?} names no label"));
            variables.push((
                name.clone(),
                metric.trim().to_owned(),
                label.trim().to_owned(),
            ));
        }
    }
    (queries, variables)
}

/// Every series name the page `text` exports (a histogram's `_bucket`, `_sum`, `_count`).
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        names.insert(name.to_owned());
        if kind == "histogram" || kind == "summary" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// The `murmur_…` metric names an expression mentions.
fn metrics_named(expr: &str) -> Vec<&str> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    expr.split(|c: char| !is_name(c))
        .filter(|word| word.starts_with("murmur_"))
        .collect()
}

/// The values a dashboard's variables take.
#[derive(Debug, Clone)]
struct Choice {
    /// `$swarm`: a swarm id.
    swarm: String,
    /// `$peer`: a peer id, or `.*` for Grafana's "All".
    peer: String,
}

/// `expr` with Grafana's variables replaced as a dashboard would.
fn substitute(expr: &str, choice: &Choice) -> String {
    expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("${swarm}", &choice.swarm)
        .replace("$swarm", &choice.swarm)
        .replace("${peer}", &choice.peer)
        .replace("$peer", &choice.peer)
}

/// Where the peers of the swarms here train.
const SWARM_DEVICE: &str = "cpu";

/// Whether `expr` is meant for a swarm in `mode` on the CPU: every `mode="…"` and
/// `mode!="…"` matcher it holds (the dashboards put them on their `murmur_build_info` join)
/// accepts `mode`, and every `device` matcher (on a `murmur_training_device_info` join)
/// accepts `cpu`.
fn meant_for(expr: &str, mode: &str) -> bool {
    matchers_accept(expr, "mode", mode) && matchers_accept(expr, "device", SWARM_DEVICE)
}

/// Whether `expr` is meant for a GPU peer in one of the checked modes: the GPU panels,
/// which no swarm here can feed. `scripts/gpu-check.sh` checks on a GPU host that a peer
/// training on the GPU exports every metric they name.
fn meant_for_gpu(expr: &str) -> bool {
    CHECKED_MODES
        .iter()
        .any(|mode| matchers_accept(expr, "mode", mode))
        && matchers_accept(expr, "device", "cuda:0")
}

/// Whether every `label="…"` and `label!="…"` matcher in `expr` accepts `value`.
fn matchers_accept(expr: &str, label: &str, value: &str) -> bool {
    let mut rest = expr;
    while let Some(at) = rest.find(label) {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + label.len()..];
        rest = after;
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let (equal, quoted) = if let Some(v) = after.strip_prefix("=\"") {
            (true, v)
        } else if let Some(v) = after.strip_prefix("!=\"") {
            (false, v)
        } else {
            continue;
        };
        let wanted = quoted.split('"').next().unwrap_or_default();
        if (wanted == value) != equal {
            return false;
        }
    }
    true
}

/// Whether a query's result holds at least one finite sample.
fn has_finite_sample(result: &[Value]) -> bool {
    result.iter().any(|series| {
        series["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(f64::is_finite)
    })
}

/// The value of the unlabelled sample `name` on a `/metrics` page.
fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Rounds that did not average the whole vector (`partial` or `failed`), all modes.
fn unfinished_rounds(page: &str) -> f64 {
    page.lines()
        .filter(|l| l.starts_with("murmur_averaging_rounds_total{"))
        .filter(|l| !l.contains("outcome=\"complete\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn the_example_prometheus_config_passes_promtool() {
    let config = dashboards_dir().join("prometheus.yml");
    let path = config.to_str().expect("a UTF-8 path");
    let (ok, said) = promtool(&["check", "config", path], "");
    assert!(ok, "promtool check config {path}:\n{said}");
}

/// The averaging modes the live-swarm tests below run; every dashboard query must be meant
/// for at least one of them.
const CHECKED_MODES: [&str; 2] = ["sgp", "butterfly"];

#[test]
fn every_dashboard_query_is_filtered_by_swarm_and_peer_and_checked_in_some_mode() {
    let (queries, variables) = dashboard_queries();
    let mut problems = String::new();
    for query in &queries {
        for variable in ["$swarm", "$peer"] {
            if !query.expr.contains(variable) {
                let _ = writeln!(
                    problems,
                    "{}: not filtered by {variable}: {}",
                    query.origin, query.expr
                );
            }
        }
        if !CHECKED_MODES
            .iter()
            .any(|mode| meant_for(&query.expr, mode))
            && !meant_for_gpu(&query.expr)
        {
            let _ = writeln!(
                problems,
                "{}: meant for none of {CHECKED_MODES:?}, on the CPU or a GPU: {}",
                query.origin, query.expr
            );
        }
    }
    for (file, _, label) in &variables {
        if !["swarm", "peer"].contains(&label.as_str()) {
            let _ = writeln!(
                problems,
                "{file}: variable over `{label}`, not swarm or peer"
            );
        }
    }
    for needed in ["swarm", "peer"] {
        let files: BTreeSet<&String> = variables.iter().map(|(file, _, _)| file).collect();
        for file in files {
            if !variables.iter().any(|(f, _, l)| f == file && l == needed) {
                let _ = writeln!(problems, "{file}: no `{needed}` variable");
            }
        }
    }
    assert!(problems.is_empty(), "{problems}");
    // The matcher reading itself, so that the checks above cannot pass by reading nothing.
    let sgp_only = r#"x and on (job, instance) murmur_build_info{swarm=~"s", mode="sgp"}"#;
    let rounds_only = r#"sum by (mode) (x and on (job, instance) murmur_build_info{mode!="sgp"})"#;
    assert!(meant_for(sgp_only, "sgp") && !meant_for(sgp_only, "butterfly"));
    assert!(!meant_for(rounds_only, "sgp") && meant_for(rounds_only, "butterfly"));
    assert!(meant_for("sum by (mode) (rate(x[1m]))", "sgp"));
    let gpu_only = r#"x and on (job, instance) murmur_training_device_info{device!="cpu"}"#;
    assert!(!meant_for(gpu_only, "sgp") && meant_for_gpu(gpu_only));
    let cpu_only = r#"x and on (job, instance) murmur_training_device_info{device="cpu"}"#;
    assert!(meant_for(cpu_only, "sgp") && !meant_for_gpu(cpu_only));
}

#[test]
fn every_sgp_dashboard_query_returns_data_from_a_live_swarm_and_promtool_lints_clean() {
    dashboards_against_a_live_swarm("sgp");
}

#[test]
fn every_butterfly_dashboard_query_returns_data_from_a_live_swarm_and_promtool_lints_clean() {
    dashboards_against_a_live_swarm("butterfly");
}

/// One query to run against the live swarm, and what it returned last.
#[derive(Debug)]
struct Pending {
    origin: String,
    expr: String,
    last: String,
}

/// Starts a swarm in `mode` and a Prometheus scraping it, and checks every dashboard query
/// and variable against it (see the module docs).
fn dashboards_against_a_live_swarm(mode: &str) {
    // Fail early, before starting a swarm, when the tools are missing.
    tool("prometheus");
    tool("promtool");
    let (queries, variables) = dashboard_queries();
    let _one_swarm_at_a_time = swarm::exclusive();
    let swarm = LocalSwarm::start(&SwarmSpec {
        mode: mode.to_owned(),
        ..SwarmSpec::default()
    });
    swarm.wait_until_meshed(MESH_PATIENCE);

    for peer in &swarm.peers {
        let page = peer.metrics().unwrap_or_else(|e| peer.fail(&e));
        let (ok, said) = promtool(&["check", "metrics"], &page);
        assert!(
            ok && said.trim().is_empty(),
            "promtool check metrics on {}'s /metrics (exit ok: {ok}):\n{said}",
            peer.name
        );
    }

    let prometheus = Prometheus::start(&swarm.metrics_addrs());
    let swarm_id = swarm_id_of(&swarm.peers[0]);
    let choices = [
        Choice {
            swarm: swarm_id.clone(),
            peer: swarm.peers[0].peer_id.clone(),
        },
        Choice {
            swarm: swarm_id,
            peer: ".*".to_owned(),
        },
    ];
    let (meant, not_meant): (Vec<&PanelQuery>, Vec<&PanelQuery>) =
        queries.iter().partition(|q| meant_for(&q.expr, mode));
    let mut pending = Vec::new();
    for choice in &choices {
        for query in &meant {
            pending.push(Pending {
                origin: format!("{} (peer {})", query.origin, choice.peer),
                expr: substitute(&query.expr, choice),
                last: String::new(),
            });
        }
        for (file, metric, label) in &variables {
            pending.push(Pending {
                origin: format!("{file}: variable {label}"),
                expr: substitute(&format!("count by ({label}) ({metric})"), choice),
                last: String::new(),
            });
        }
    }
    for p in &pending {
        assert!(
            !p.expr.contains('$'),
            "{}: unknown variable left in {}",
            p.origin,
            p.expr
        );
    }
    let deadline = Instant::now() + QUERY_PATIENCE;
    while !pending.is_empty() && Instant::now() < deadline {
        for p in &mut pending {
            p.last = match prometheus.query(&p.expr) {
                Ok(result) if has_finite_sample(&result) => String::new(),
                Ok(result) => format!("no finite sample yet: {}", Value::from(result)),
                Err(e) => format!("query failed: {e}"),
            };
        }
        pending.retain(|p| !p.last.is_empty());
        std::thread::sleep(Duration::from_millis(500));
    }
    // The swarm is live and scraped now: what is meant for other modes must show nothing.
    let mut shown_elsewhere = String::new();
    for choice in &choices {
        for query in &not_meant {
            let expr = substitute(&query.expr, choice);
            match prometheus.query(&expr) {
                Ok(result) if result.is_empty() => {}
                Ok(result) => {
                    let _ = writeln!(
                        shown_elsewhere,
                        "{}\n  {expr}\n  shows {} in a {mode} swarm",
                        query.origin,
                        Value::from(result)
                    );
                }
                Err(e) => {
                    let _ = writeln!(shown_elsewhere, "{}\n  {expr}\n  failed: {e}", query.origin);
                }
            }
        }
    }
    // Some families appear only once there is something to export (the per-link throughput
    // after the first large transfer), so the pages are read after the queries had their time.
    let mut exported = BTreeSet::new();
    for peer in &swarm.peers {
        exported.extend(exported_names(
            &peer.metrics().unwrap_or_else(|e| peer.fail(&e)),
        ));
    }
    let mut unknown = String::new();
    for query in &meant {
        let named = metrics_named(&query.expr);
        if named.is_empty() {
            let _ = writeln!(
                unknown,
                "{}: names no murmur metric: {}",
                query.origin, query.expr
            );
        }
        for name in named.into_iter().filter(|n| !exported.contains(*n)) {
            let _ = writeln!(unknown, "{}: `{name}` is not exported", query.origin);
        }
    }
    for (file, metric, _) in &variables {
        for name in metrics_named(metric) {
            if !exported.contains(name) {
                let _ = writeln!(unknown, "{file}: variable over `{name}`, not exported");
            }
        }
    }
    let mut report = String::new();
    for p in &pending {
        let _ = writeln!(report, "{}\n  {}\n  {}", p.origin, p.expr, p.last);
    }
    assert!(
        unknown.is_empty() && pending.is_empty() && shown_elsewhere.is_empty(),
        "dashboards reference metrics a {mode} swarm does not export:\n{unknown}\n\
         {} dashboard queries for {mode} returned no data within {QUERY_PATIENCE:?}:\n{report}\n\
         queries meant for other modes that showed data:\n{shown_elsewhere}",
        pending.len()
    );
}

/// The swarm id a peer's `/status` names.
fn swarm_id_of(peer: &SwarmPeer) -> String {
    let status = peer.status().unwrap_or_else(|e| peer.fail(&e));
    status["swarm"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| peer.fail(&format!("no swarm in /status: {status}")))
}

/// What a survivor shows of the crash, and when it first showed it.
#[derive(Debug, Default)]
struct Seen {
    peer_gone: Option<Duration>,
    outcomes_changed: Option<Duration>,
}

#[test]
fn a_killed_peer_leaves_the_survivors_status_within_two_heartbeats() {
    let spec = SwarmSpec::default();
    let interval = Duration::from_millis(spec.heartbeat_interval_ms);
    let poll = Duration::from_millis(100);
    let bound = 2 * interval + poll;
    let _one_swarm_at_a_time = swarm::exclusive();
    let mut swarm = LocalSwarm::start(&spec);
    swarm.wait_until_meshed(MESH_PATIENCE);
    // Every survivor has averaged before the crash, so a change of outcome is a change.
    let settle = Instant::now() + MESH_PATIENCE;
    for peer in &swarm.peers {
        while peer.status().map_or(true, |s| {
            s["last_rounds"].as_array().is_none_or(|r| r.is_empty())
        }) {
            if Instant::now() > settle {
                peer.fail("no averaging round before the crash");
            }
            std::thread::sleep(poll);
        }
    }
    let before: Vec<f64> = swarm.peers[..2]
        .iter()
        .map(|p| unfinished_rounds(&p.metrics().unwrap_or_else(|e| p.fail(&e))))
        .collect();

    let victim = swarm.peers[2].peer_id.clone();
    swarm.peers[2].kill_hard();
    let killed = Instant::now();
    let survivors: &[SwarmPeer] = &swarm.peers[..2];
    let mut seen: Vec<Seen> = survivors.iter().map(|_| Seen::default()).collect();
    // Watch well past the bound, so a failure says when (if ever) the change came.
    let watch_until = killed + Duration::from_secs(30);
    while Instant::now() < watch_until {
        for ((peer, seen), before) in survivors.iter().zip(&mut seen).zip(&before) {
            let at = killed.elapsed();
            let (Ok(status), Ok(page)) = (peer.status(), peer.metrics()) else {
                peer.fail("stopped answering /status or /metrics after another peer's crash");
            };
            let listed = listed_peers(&status).contains(&victim);
            let connected = sample(&page, "murmur_net_connected_peers");
            if seen.peer_gone.is_none() && !listed && connected == Some(1.0) {
                seen.peer_gone = Some(at);
            }
            let outcome_in_status = status["last_rounds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r["outcome"] != "complete");
            if seen.outcomes_changed.is_none()
                && (outcome_in_status || unfinished_rounds(&page) > *before)
            {
                seen.outcomes_changed = Some(at);
            }
        }
        if seen
            .iter()
            .all(|s| s.peer_gone.is_some() && s.outcomes_changed.is_some())
        {
            break;
        }
        std::thread::sleep(poll);
    }
    let mut report = String::new();
    for (peer, seen) in survivors.iter().zip(&seen) {
        let _ = writeln!(
            report,
            "{}: peer gone from /status and murmur_net_connected_peers after {}; \
             a partial or failed round after {}",
            peer.name,
            shown(seen.peer_gone),
            shown(seen.outcomes_changed)
        );
    }
    assert!(
        seen.iter().all(|s| !late(s, bound)),
        "after SIGKILL of one of 3 peers (heartbeat every {interval:?}), the survivors must \
         show it within {bound:?}:\n{report}{}",
        survivors[0].log_tail(20)
    );
}

/// Whether either change came later than `bound`, or not at all.
fn late(seen: &Seen, bound: Duration) -> bool {
    [seen.peer_gone, seen.outcomes_changed]
        .iter()
        .any(|at| at.is_none_or(|at| at > bound))
}

fn shown(at: Option<Duration>) -> String {
    at.map_or_else(
        || "never (watched 30 s)".to_owned(),
        |at| format!("{at:.2?}"),
    )
}
