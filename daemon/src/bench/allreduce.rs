//! `murmur bench allreduce`: N peer processes average a vector round after round with
//! butterfly, ring or SGP; reported per round: time, bytes sent per peer, the relative error
//! against the exact weighted mean, and the efficiency ratio — aggregate encoded bytes moved
//! per second over one libp2p tensor stream's throughput, measured first in the same run.
//!
//! The peers are children of this process on loopback, or, with `--hosts FILE`, started
//! under each host's launcher and listening on its address (see [`crate::hosts`]). There the
//! links are not loopback, so no single-stream reference is measured and the efficiency is
//! left out: whoever shaped the links knows their rate and divides by it.
//!
//! A round's time is the latest time any peer had its whole result, counted from when that
//! peer began the round. Its period is the time from the previous round's last result to
//! this one's (the first round's from its earliest start): what back-to-back rounds cost,
//! waits between rounds included. Periods compare the peers' wall clocks, so they mean
//! something only where all peers run on one host (loopback, or network namespaces).
//! Butterfly and ring peers begin each round once every peer has said it is ready for it,
//! unless `--free-start`.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use murmur_gossip::butterfly::ButterflyConfig;
use murmur_gossip::net::MIN_QUIC_RECEIVE_WINDOW;
use murmur_gossip::net::bench::{StreamBenchConfig, stream_throughput};
use murmur_protocol::codec::CodecSpec;
use murmur_protocol::frame::FrameLimits;
use serde_json::{Value, json};

use murmur_protocol::message::AveragingMode;

use crate::cli::AllreduceArgs;
use crate::hosts::Hosts;
use crate::input_error::BadInput;
use crate::local::{LocalPlan, SwarmDir};

/// How long a peer may stay silent (no line) before the benchmark gives up.
const SILENCE_BOUND: Duration = Duration::from_secs(180);
/// How long finished peers get to close their connections and exit before they are killed.
const EXIT_BOUND: Duration = Duration::from_secs(10);
/// The most elements one tensor frame carries in f32: a frame is at most 64 MiB
/// (`max_frame_payload` below), and a ring segment travels in one frame (an SGP share
/// travels in pieces).
const MAX_FRAME_ELEMENTS: usize = 16_000_000;
/// The most elements of a ring vector: every peer holds a few copies of it, so 64 Mi
/// elements already need gigabytes per peer.
const MAX_VECTOR_ELEMENTS: usize = 1 << 26;
/// The most elements of an SGP vector: a pair of peers holds about fourteen copies each
/// (BENCHMARKS.md), so 2²⁷ elements (512 MiB) need about 7 GiB per peer, and the 100M-element
/// runs the issue of real model sizes asks for fit two peers on a 24 GiB host.
const MAX_SGP_ELEMENTS: usize = 1 << 27;
/// The most elements of a butterfly vector: a peer holds about two and a half times its
/// f32 bytes (BENCHMARKS.md), so 2²⁹ elements (2 GiB) need about 5 GiB per peer.
const MAX_BUTTERFLY_ELEMENTS: usize = 1 << 29;
/// The frame payload limit written into every peer's config.
const MAX_FRAME_PAYLOAD: u32 = 64 << 20;

/// The children, killed when dropped.
struct Children(Vec<Child>);

impl Children {
    /// Tells every peer that all have finished (by closing its standard input), so that
    /// each may close its connections, and waits for them to exit, at most [`EXIT_BOUND`].
    fn release(&mut self) {
        for child in &mut self.0 {
            drop(child.stdin.take());
        }
        let until = Instant::now() + EXIT_BOUND;
        for child in &mut self.0 {
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub(crate) fn run(args: &AllreduceArgs) -> anyhow::Result<()> {
    if !(2..=32).contains(&args.peers) {
        return Err(BadInput(format!("--peers {}: expected 2 to 32", args.peers)).into());
    }
    check_elements(args.algo, args.peers, args.elements)?;
    if !(1..=100).contains(&args.rounds) {
        return Err(BadInput(format!("--rounds {}: expected 1 to 100", args.rounds)).into());
    }
    if let Some(victim) = args.kill_peer
        && (victim >= args.peers || victim == 0 || !(1..args.rounds).contains(&args.kill_at_round))
    {
        return Err(BadInput(format!(
            "--kill-peer {victim} --kill-at-round {}: the peer must be 1 to {} (peer 0 is the bootstrap) and the round 1 to {}",
            args.kill_at_round,
            args.peers - 1,
            args.rounds - 1
        ))
        .into());
    }
    let tables = ConfigTables::of(args)?;
    let mut variants = Vec::new();
    let parts = parse_parts(&args.parts)?;
    for text in args.codec.split(',') {
        let codec =
            CodecSpec::parse(text.trim()).map_err(|e| BadInput(format!("--codec {text}: {e}")))?;
        for &equal_parts in &parts {
            variants.push(Variant { codec, equal_parts });
        }
    }
    let hosts = Hosts::from_flag(args.hosts.as_deref(), args.peers)?;
    // On links other than loopback, a loopback stream is no reference.
    let stream_bps = match args.hosts {
        None => Some(single_stream(args)?),
        Some(_) => None,
    };
    let mut times = Vec::new();
    for &variant in &variants {
        times.push(run_variant(args, &hosts, &tables, variant, stream_bps)?);
    }
    // Several codecs or part sizings in one run: how much faster each round is than the
    // first's.
    if let [(first, first_time), rest @ ..] = times.as_slice() {
        for (variant, time) in rest {
            let speedup = first_time / time;
            if args.json {
                println!(
                    "{}",
                    json!({"compare": first.to_string(), "with": variant.to_string(), "speedup": speedup})
                );
            } else {
                println!("{variant} rounds are {speedup:.2}x as fast as {first} rounds (medians)");
            }
        }
    }
    Ok(())
}

/// One configuration of the benchmark: a codec, and how parts are sized.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Variant {
    codec: CodecSpec,
    equal_parts: bool,
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts = if self.equal_parts {
            "equal"
        } else {
            "bandwidth"
        };
        write!(f, "{}, {parts} parts", self.codec)
    }
}

/// `--parts`: `bandwidth` and `equal`, comma-separated; whether each sizes parts equally.
fn parse_parts(text: &str) -> Result<Vec<bool>, BadInput> {
    text.split(',')
        .map(|p| match p.trim() {
            "bandwidth" => Ok(false),
            "equal" => Ok(true),
            other => Err(BadInput(format!(
                "--parts {text}: {other:?} is no part sizing; expected bandwidth or equal"
            ))),
        })
        .collect()
}

/// `--upload-caps`: one cap per peer, bytes per second; none given, no caps.
fn parse_upload_caps(text: Option<&str>, peers: usize) -> Result<Vec<u64>, BadInput> {
    let Some(text) = text else {
        return Ok(vec![0; peers]);
    };
    let caps: Vec<u64> = text
        .split(',')
        .map(|c| c.trim().parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|e| {
            BadInput(format!(
                "--upload-caps {text}: {e}; expected bytes per second"
            ))
        })?;
    if caps.len() != peers {
        return Err(BadInput(format!(
            "--upload-caps {text}: {} caps for {peers} peers; give one per peer",
            caps.len()
        )));
    }
    Ok(caps)
}

/// Checks `--elements` for the collective: a ring segment is a part of the vector
/// (`elements / peers`) in one frame; SGP sends shares in pieces and the butterfly its parts
/// in chunks, so only memory bounds them.
fn check_elements(algo: AveragingMode, peers: usize, elements: usize) -> Result<(), BadInput> {
    let frame_mib = MAX_FRAME_PAYLOAD >> 20;
    let (fits, allowed) = match algo {
        AveragingMode::Sgp => (
            elements <= MAX_SGP_ELEMENTS,
            format!("1 to {MAX_SGP_ELEMENTS} (every peer holds a few copies of the vector)"),
        ),
        AveragingMode::SyncRing => (
            elements <= MAX_VECTOR_ELEMENTS
                && elements.div_ceil(peers.max(1)) <= MAX_FRAME_ELEMENTS,
            format!(
                "1 to {MAX_VECTOR_ELEMENTS}, with at most {MAX_FRAME_ELEMENTS} per peer (a ring \
                 segment travels in one frame of at most {frame_mib} MiB)"
            ),
        ),
        AveragingMode::Butterfly => (
            elements <= MAX_BUTTERFLY_ELEMENTS,
            format!("1 to {MAX_BUTTERFLY_ELEMENTS} (every peer holds a few copies of the vector)"),
        ),
        AveragingMode::LocalSgd | AveragingMode::Solo => {
            return Err(BadInput(format!(
                "--algo {algo}: not a collective; expected butterfly, sync-ring or sgp"
            )));
        }
    };
    if elements == 0 || !fits {
        return Err(BadInput(format!(
            "--elements {elements}: expected {allowed} for --algo {algo} with {peers} peers"
        )));
    }
    Ok(())
}

/// Runs the benchmark in one configuration; returns it and its median round time.
fn run_variant(
    args: &AllreduceArgs,
    hosts: &Hosts,
    tables: &ConfigTables,
    variant: Variant,
    stream_bps: Option<f64>,
) -> anyhow::Result<(Variant, f64)> {
    let plan = LocalPlan {
        peers: args.peers,
        task: murmur_trainer::TaskPreset::MarkovGpt,
        mode: args.algo,
        codec: variant.codec,
        steps: 1,
        stragglers: Vec::new(),
        churn: false,
        non_iid: false,
        stop_after: None,
        json: args.json,
        out: None,
        hosts: hosts.clone(),
        synthetic_step_ms: 0,
        error_feedback: true,
        clip: None,
        faults: Vec::new(),
        overrides: Vec::new(),
    };
    let dir = SwarmDir::create(None, args.peers)?;
    match run_peers(args, hosts, tables, variant, &plan, &dir, stream_bps) {
        Ok((median_time, kept)) => {
            if !kept && let Err(e) = std::fs::remove_dir_all(dir.root()) {
                eprintln!("could not remove {}: {e}", dir.root().display());
            }
            Ok((variant, median_time))
        }
        Err(e) => Err(e.context(format!("the peers' logs are in {}", dir.root().display()))),
    }
}

/// Starts the peers in `dir`, collects their rounds and reports them; returns the median
/// round time, and whether the peers' folder is to be kept (asked for, or shares were
/// missed: their logs say why).
fn run_peers(
    args: &AllreduceArgs,
    hosts: &Hosts,
    tables: &ConfigTables,
    variant: Variant,
    plan: &LocalPlan,
    dir: &SwarmDir,
    stream_bps: Option<f64>,
) -> anyhow::Result<(f64, bool)> {
    let (tx, rx) = mpsc::sync_channel::<(usize, String)>(1024);
    let mut children = Children(Vec::new());
    let mut bootstrap = Vec::new();
    // One peer per host; `Hosts::from_flag` made them as many as `--peers`.
    for index in 0..hosts.len() {
        write_config(dir, plan, index, &bootstrap, tables)?;
        children
            .0
            .push(spawn_peer(dir, args, variant, hosts, index, tx.clone())?);
        if index == 0 {
            let (_, line) = rx
                .recv_timeout(Duration::from_secs(30))
                .context("peer 0 did not report ready within 30 s")?;
            let ready: Value = serde_json::from_str(&line).context("peer 0's ready line")?;
            let addr = ready["listen"][0]
                .as_str()
                .context("peer 0 reported no listen address")?;
            bootstrap.push(addr.to_owned());
        }
    }
    drop(tx);
    let collected = collect(&rx, args, &mut children)?;
    children.release();
    drop(children);
    let missed: u64 = collected
        .rounds
        .iter()
        .flatten()
        .flatten()
        .filter_map(|line| line["missed_shares"].as_u64())
        .sum();
    let logs = (args.keep_logs || missed > 0).then(|| dir.root());
    if let Some(logs) = logs {
        write_round_lines(&logs.join("rounds.jsonl"), &collected.rounds)?;
    }
    let median_time = report(args, variant, stream_bps, &collected, (missed, logs))?;
    Ok((median_time, logs.is_some()))
}

/// Every peer's round lines, one JSON object a line with the peer's index added: what the
/// summary's per-round medians are made of.
fn write_round_lines(path: &Path, rounds: &[Vec<Option<Value>>]) -> anyhow::Result<()> {
    let mut out = String::new();
    for (index, line) in rounds
        .iter()
        .flat_map(|peers| peers.iter().enumerate())
        .filter_map(|(index, line)| Some((index, line.as_ref()?)))
    {
        let mut line = line.clone();
        line["peer"] = json!(index);
        out.push_str(&line.to_string());
        out.push('\n');
    }
    std::fs::write(path, out).with_context(|| format!("cannot write {}", path.display()))
}

/// One libp2p tensor stream's throughput on this machine, bytes per second (median).
fn single_stream(args: &AllreduceArgs) -> anyhow::Result<f64> {
    let payload = (args.elements as u64 * 4).clamp(16 << 20, 256 << 20);
    let config = StreamBenchConfig {
        bytes: payload,
        chunk_bytes: 1 << 20,
        rounds: 3,
        timeout: Duration::from_secs(120),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(stream_throughput(&config))?;
    let mut rounds = result.libp2p_rounds[..result.rounds as usize].to_vec();
    rounds.sort_by(f64::total_cmp);
    Ok(rounds[rounds.len() / 2])
}

/// What every peer's config gets besides `murmur local`'s.
#[derive(Debug, Clone)]
struct ConfigTables {
    /// Frames large enough for a whole share or segment, and the QUIC receive windows when
    /// `--quic-receive-window` is given.
    max_frame_payload: u32,
    quic_receive_window: Option<u32>,
    /// Each peer's upload cap (`[volunteer] max_upload_bytes_per_s`).
    upload_caps: Vec<u64>,
    /// `[averaging.butterfly]`, with the timeouts given.
    butterfly: ButterflyConfig,
}

impl ConfigTables {
    /// The tables of `args`, checked the way the config loader will check them.
    fn of(args: &AllreduceArgs) -> Result<ConfigTables, BadInput> {
        if let Some(window) = args.quic_receive_window
            && window < MIN_QUIC_RECEIVE_WINDOW
        {
            return Err(BadInput(format!(
                "--quic-receive-window {window}: expected at least {MIN_QUIC_RECEIVE_WINDOW} bytes"
            )));
        }
        let mut butterfly = ButterflyConfig {
            // The peers' weights are 1 to N on purpose and the exact weighted mean is the
            // reference: nothing is bounded.
            max_weight_ratio: 0.0,
            // Every round averages the vectors the benchmark hands in, checked against
            // their exact mean: no round averages parameters instead.
            average_params_every: 0,
            target_group: args.target_group.unwrap_or(args.peers),
            ..ButterflyConfig::default()
        };
        butterfly.chunk_timeout_ms = args.chunk_timeout_ms.unwrap_or(butterfly.chunk_timeout_ms);
        butterfly.reducer_timeout_ms = args
            .reducer_timeout_ms
            .unwrap_or(butterfly.reducer_timeout_ms);
        butterfly.validate().map_err(|e| {
            BadInput(format!(
                "--chunk-timeout-ms / --reducer-timeout-ms / --target-group: {e}"
            ))
        })?;
        Ok(ConfigTables {
            max_frame_payload: MAX_FRAME_PAYLOAD,
            quic_receive_window: args.quic_receive_window,
            upload_caps: parse_upload_caps(args.upload_caps.as_deref(), args.peers)?,
            butterfly,
        })
    }
}

/// Writes peer `index`'s config: `murmur local`'s, with the benchmark's tables.
fn write_config(
    dir: &SwarmDir,
    plan: &LocalPlan,
    index: usize,
    bootstrap: &[String],
    tables: &ConfigTables,
) -> anyhow::Result<()> {
    let mut config = dir.peer_config(plan, index, bootstrap)?;
    config.net.max_frame_payload = tables.max_frame_payload;
    // Larger frames than the default: room for two of them in flight per peer, and as long
    // to arrive per byte as the default allows its own.
    let frame = u64::from(tables.max_frame_payload) + murmur_protocol::frame::HEADER_LEN as u64;
    config.net.max_partial_frame_bytes_per_peer = 2 * frame;
    let scale = u64::from(
        tables
            .max_frame_payload
            .div_ceil(FrameLimits::DEFAULT_MAX_PAYLOAD),
    );
    config.net.frame_timeout_ms = config.net.frame_timeout_ms.saturating_mul(scale.max(1));
    if let Some(window) = tables.quic_receive_window {
        config.net.quic_stream_receive_window = window;
        config.net.quic_connection_receive_window = window;
    }
    config.averaging.butterfly = tables.butterfly.clone();
    config.volunteer.max_upload_bytes_per_s = tables.upload_caps.get(index).copied().unwrap_or(0);
    dir.write_peer_config(plan, index, &config)
}

fn spawn_peer(
    dir: &SwarmDir,
    args: &AllreduceArgs,
    variant: Variant,
    hosts: &Hosts,
    index: usize,
    tx: mpsc::SyncSender<(usize, String)>,
) -> anyhow::Result<Child> {
    let log = std::fs::File::create(dir.log_path(index))?;
    let algo = args.algo.name();
    let mut child = hosts
        .command(index, std::env::current_exe()?)
        .args(["bench", "allreduce-peer", "--config"])
        .arg(dir.config_path(index))
        .args(["--index", &index.to_string()])
        .args(["--peers", &args.peers.to_string()])
        .args(["--elements", &args.elements.to_string()])
        .args(["--algo", algo])
        .args(["--rounds", &args.rounds.to_string()])
        .args(variant.equal_parts.then_some("--equal-parts"))
        .args(["--threads", &args.peer_threads.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .context("cannot start a benchmark peer")?;
    let stdout = child.stdout.take().context("no stdout")?;
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send((index, line)).is_err() {
                return;
            }
        }
    });
    Ok(child)
}

/// What the peers said.
struct Collected {
    /// Per round, per peer: the round lines.
    rounds: Vec<Vec<Option<Value>>>,
    /// When the slowest peer had found every other, in seconds from its start.
    discovery_s: f64,
    /// Each peer's peak resident memory, from its `done` line.
    peak_rss: Vec<Option<u64>>,
}

fn collect(
    rx: &mpsc::Receiver<(usize, String)>,
    args: &AllreduceArgs,
    children: &mut Children,
) -> anyhow::Result<Collected> {
    let mut rounds = vec![vec![None; args.peers]; args.rounds as usize];
    let mut peak_rss = vec![None; args.peers];
    let mut done = vec![false; args.peers];
    let mut killed = false;
    // When the victim is due to die: `--kill-delay-ms` after the first peer finished the
    // round before the chosen one.
    let mut kill_at: Option<Instant> = None;
    let mut discovery = vec![None; args.peers];
    let started = Instant::now();
    let overall = SILENCE_BOUND * 2 + Duration::from_secs(60) * args.rounds as u32;
    while !done.iter().all(|&d| d) {
        if started.elapsed() > overall {
            bail!("the benchmark ran past {overall:?}");
        }
        if let (Some(at), Some(victim)) = (kill_at, args.kill_peer)
            && Instant::now() >= at
            && !killed
        {
            if let Some(child) = children.0.get_mut(victim) {
                child.kill().context("cannot kill the chosen peer")?;
            }
            killed = true;
            done[victim] = true;
            continue;
        }
        let wait = match kill_at.filter(|_| !killed) {
            Some(at) => at
                .saturating_duration_since(Instant::now())
                .min(SILENCE_BOUND),
            None => SILENCE_BOUND,
        };
        let (index, line) = match rx.recv_timeout(wait) {
            Ok(got) => got,
            Err(_) if kill_at.is_some() && !killed => continue,
            Err(_) => bail!("no benchmark peer said anything for {SILENCE_BOUND:?}"),
        };
        let Ok(value) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        match value["event"].as_str() {
            Some("round") => {
                let round = value["round"].as_u64().unwrap_or(u64::MAX) as usize;
                // The victim dies as the first peer moves on to the chosen round (and
                // `--kill-delay-ms` later).
                if args.kill_peer.is_some()
                    && kill_at.is_none()
                    && round as u64 + 1 == args.kill_at_round
                {
                    kill_at = Some(Instant::now() + Duration::from_millis(args.kill_delay_ms));
                }
                if let Some(slot) = rounds.get_mut(round).and_then(|r| r.get_mut(index)) {
                    *slot = Some(value);
                }
            }
            Some("gathered") => discovery[index] = value["after_s"].as_f64(),
            Some("done") => {
                if let Some(error) = value["error"].as_str() {
                    bail!("peer {index} failed: {error}");
                }
                peak_rss[index] = value["peak_rss_bytes"].as_u64();
                done[index] = true;
            }
            _ => {}
        }
    }
    let slowest = discovery.iter().flatten().copied().fold(0.0, f64::max);
    Ok(Collected {
        rounds,
        discovery_s: slowest,
        peak_rss,
    })
}

fn report(
    args: &AllreduceArgs,
    variant: Variant,
    stream_bps: Option<f64>,
    collected: &Collected,
    (missed, logs): (u64, Option<&std::path::Path>),
) -> anyhow::Result<f64> {
    let discovery_s = collected.discovery_s;
    let rows = round_rows(args, stream_bps, &collected.rounds)?;
    // The largest peer's peak resident memory, and that over the vector's f32 bytes.
    let peak_rss = collected.peak_rss.iter().flatten().copied().max();
    let vector_bytes = args.elements as f64 * 4.0;
    let peak_rss_per_vector = peak_rss.map(|b| b as f64 / vector_bytes);
    let median = |key: &str| {
        let mut v: Vec<f64> = rows.iter().filter_map(|r| r[key].as_f64()).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let algo = args.algo.name();
    let codec = variant.codec;
    let parts = if variant.equal_parts {
        "equal"
    } else {
        "bandwidth"
    };
    let summary = json!({
        "peers": args.peers,
        "elements": args.elements,
        "codec": codec.to_string(),
        "parts": parts,
        "algo": algo,
        "stream_bytes_per_s": stream_bps,
        "discovery_s": discovery_s,
        "median_time_s": median("time_s"),
        "median_period_s": median("period_s"),
        "median_efficiency": median("efficiency"),
        "median_rel_error": median("rel_error"),
        "missed_shares": missed,
        "peak_rss_bytes": peak_rss,
        "peak_rss_per_vector": peak_rss_per_vector,
        "rounds": rows,
        "logs": logs.map(|dir| dir.display().to_string()),
    });
    if args.json {
        println!("{summary}");
        return Ok(median("time_s"));
    }
    match stream_bps {
        Some(stream) => println!(
            "{} peers, {} elements, {codec}, {algo}, {parts} parts; one tensor stream: {:.1} MB/s",
            args.peers,
            args.elements,
            stream / 1e6
        ),
        None => println!(
            "{} peers, {} elements, {codec}, {algo}, {parts} parts; on the --hosts links",
            args.peers, args.elements
        ),
    }
    println!("every peer found every other (via the DHT) within {discovery_s:.2} s");
    println!(
        "round   time (s)   period (s)   MB sent/peer   rel. error   group   coverage   efficiency"
    );
    for row in &rows {
        let (low, high) = (
            row["group_min"].as_f64().unwrap_or(f64::NAN),
            row["group_max"].as_f64().unwrap_or(f64::NAN),
        );
        let group = if low == high {
            format!("{low}")
        } else {
            format!("{low}-{high}")
        };
        println!(
            "{:>5}   {:>8.3}   {:>10.3}   {:>12.2}   {:>10.2e}   {:>5}   {:>8.3}   {:>10.3}",
            row["round"],
            row["time_s"].as_f64().unwrap_or(f64::NAN),
            row["period_s"].as_f64().unwrap_or(f64::NAN),
            row["bytes_sent_per_peer"].as_f64().unwrap_or(f64::NAN) / 1e6,
            row["rel_error"].as_f64().unwrap_or(f64::NAN),
            group,
            row["coverage"].as_f64().unwrap_or(f64::NAN),
            row["efficiency"].as_f64().unwrap_or(f64::NAN),
        );
    }
    println!(
        "median: {:.3} s per round, efficiency {:.3}",
        median("time_s"),
        median("efficiency")
    );
    if let (Some(bytes), Some(ratio)) = (peak_rss, peak_rss_per_vector) {
        println!(
            "peak resident memory of the largest peer: {:.1} MiB, {ratio:.2}× the vector's f32 bytes",
            bytes as f64 / f64::from(1 << 20)
        );
    }
    if missed > 0 {
        println!(
            "{missed} SGP steps went on without the share they waited for (taken back or \
             refused: the peers' logs say which)"
        );
    }
    if let Some(dir) = logs {
        println!("the peers' logs: {}", dir.display());
    }
    Ok(median("time_s"))
}

/// One summary row per round from the peers' lines (`None` for a peer that did not report
/// it).
fn round_rows(
    args: &AllreduceArgs,
    stream_bps: Option<f64>,
    rounds: &[Vec<Option<Value>>],
) -> anyhow::Result<Vec<Value>> {
    let mut rows = Vec::new();
    let mut last_finish: Option<f64> = None;
    for (round, peers) in rounds.iter().enumerate() {
        let reported: Vec<&Value> = peers.iter().flatten().collect();
        let expected = match args.kill_peer {
            // The victim may die before it reports the round before the chosen one.
            Some(_) if round as u64 + 1 >= args.kill_at_round => peers.len() - 1,
            _ => peers.len(),
        };
        if reported.len() < expected {
            bail!(
                "round {round}: only {} of {} peers reported",
                reported.len(),
                peers.len()
            );
        }
        // A peer that caught up with the swarm skipped the round: it counts as reported,
        // and the round's figures are those of the peers that took part.
        let lines: Vec<&Value> = reported
            .iter()
            .copied()
            .filter(|v| v["skipped"] != true)
            .collect();
        let skipped = reported.len() - lines.len();
        if lines.is_empty() {
            bail!("round {round}: every peer skipped it");
        }
        let f = |key: &'static str| {
            lines
                .iter()
                .map(move |v| v[key].as_f64().unwrap_or(f64::NAN))
        };
        let time = f("time_s").fold(0.0, f64::max);
        let bytes: f64 = f("bytes_sent").sum();
        let error = f("rel_error").fold(0.0, f64::max);
        let coverage = f("coverage").fold(1.0, f64::min);
        let coverage_all = f("coverage_all").fold(1.0, f64::min);
        // Each peer's group: a swarm split into several groups, or a peer averaging alone,
        // shows as a smallest group below the peers that reported.
        let group_min = f("group").fold(f64::INFINITY, f64::min);
        let group_max = f("group").fold(0.0, f64::max);
        // SGP: the shares this round's steps went on without, over every peer.
        let missed: u64 = lines
            .iter()
            .filter_map(|v| v["missed_shares"].as_u64())
            .sum();
        let finish = f("finished_unix_s").fold(f64::NAN, f64::max);
        let period = finish - last_finish.unwrap_or(f("began_unix_s").fold(f64::NAN, f64::min));
        last_finish = Some(finish);
        rows.push(json!({
            "round": round,
            "time_s": time,
            "period_s": period,
            "bytes_sent_per_peer": bytes / lines.len() as f64,
            "rel_error": error,
            "coverage": coverage,
            "coverage_all": coverage_all,
            "group_min": group_min,
            "group_max": group_max,
            "skipped": skipped,
            "missed_shares": missed,
            "efficiency": stream_bps.map(|stream| bytes / time / stream),
        }));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_64_mib_f32_vector_is_accepted_where_frames_carry_parts_of_it() {
        let elements = 16_777_216;
        assert!(check_elements(AveragingMode::Butterfly, 4, elements).is_ok());
        assert!(check_elements(AveragingMode::Butterfly, 2, elements).is_ok());
        assert!(check_elements(AveragingMode::SyncRing, 2, elements).is_ok());
        assert!(check_elements(AveragingMode::SyncRing, 8, elements).is_ok());
        // An SGP share travels in pieces: only memory bounds it.
        assert!(check_elements(AveragingMode::Sgp, 4, elements).is_ok());
        assert!(check_elements(AveragingMode::Sgp, 2, 100_000_000).is_ok());
        let sgp = check_elements(AveragingMode::Sgp, 4, MAX_SGP_ELEMENTS + 1).unwrap_err();
        assert!(sgp.0.contains("copies of the vector"), "{sgp}");
    }

    #[test]
    fn a_ring_segment_past_one_frame_or_a_vector_past_memory_is_refused() {
        // Two peers: each segment is half of 40 M elements, more than a frame holds.
        let ring = check_elements(AveragingMode::SyncRing, 2, 40_000_000).unwrap_err();
        assert!(ring.0.contains("per peer"), "{ring}");
        assert!(check_elements(AveragingMode::SyncRing, 4, 40_000_000).is_ok());
        let huge = MAX_VECTOR_ELEMENTS + 1;
        assert!(check_elements(AveragingMode::SyncRing, 32, huge).is_err());
        // A butterfly peer holds fewer copies: 250 M elements are taken, 2²⁹ + 1 not.
        assert!(check_elements(AveragingMode::Butterfly, 4, 250_000_000).is_ok());
        let past = MAX_BUTTERFLY_ELEMENTS + 1;
        assert!(check_elements(AveragingMode::Butterfly, 32, past).is_err());
        for algo in [AveragingMode::Butterfly, AveragingMode::SyncRing] {
            assert!(check_elements(algo, 32, 0).is_err(), "{algo:?}");
        }
    }

    fn args(chunk_timeout_ms: Option<u64>, reducer_timeout_ms: Option<u64>) -> AllreduceArgs {
        AllreduceArgs {
            peers: 4,
            elements: 1000,
            codec: "f32".into(),
            algo: AveragingMode::Butterfly,
            rounds: 1,
            json: true,
            kill_peer: None,
            kill_at_round: 1,
            kill_delay_ms: 0,
            target_group: None,
            hosts: None,
            chunk_timeout_ms,
            reducer_timeout_ms,
            quic_receive_window: None,
            parts: "bandwidth".to_owned(),
            upload_caps: None,
            keep_logs: false,
            peer_threads: 2,
        }
    }

    #[test]
    fn a_period_runs_from_the_last_result_of_the_round_before() {
        let line = |began: f64, time: f64| {
            Some(json!({
                "time_s": time, "bytes_sent": 100.0, "rel_error": 0.0, "coverage": 1.0,
                "coverage_all": 1.0, "began_unix_s": began, "finished_unix_s": began + time,
            }))
        };
        // Round 0: starts at 100 and 101, results at 103 and 102. Round 1: the second
        // peer begins late, at 104.5, and has its result at 105.
        let rounds = vec![
            vec![line(100.0, 3.0), line(101.0, 1.0)],
            vec![line(103.5, 1.0), line(104.5, 0.5)],
        ];
        let rows = round_rows(&args(None, None), None, &rounds).unwrap();
        let get = |r: usize, key: &str| rows[r][key].as_f64().unwrap();
        assert_eq!(get(0, "period_s"), 3.0);
        assert_eq!(get(0, "time_s"), 3.0);
        assert_eq!(get(1, "period_s"), 2.0);
        assert_eq!(get(1, "time_s"), 1.0);
    }

    #[test]
    fn a_round_counts_the_shares_its_peers_went_on_without() {
        let line = |missed: u64| {
            Some(json!({
                "time_s": 1.0, "bytes_sent": 100.0, "rel_error": 0.0, "coverage": 1.0,
                "coverage_all": 1.0, "began_unix_s": 100.0, "finished_unix_s": 101.0,
                "missed_shares": missed,
            }))
        };
        let rounds = vec![vec![line(0), line(0)], vec![line(1), line(2)]];
        let rows = round_rows(&args(None, None), None, &rounds).unwrap();
        let missed: Vec<u64> = rows
            .iter()
            .map(|r| r["missed_shares"].as_u64().unwrap())
            .collect();
        assert_eq!(missed, [0, 3]);
    }

    #[test]
    fn tables_are_checked_the_way_the_loader_checks_them() {
        let mut a = args(None, None);
        a.quic_receive_window = Some(MIN_QUIC_RECEIVE_WINDOW - 1);
        let error = ConfigTables::of(&a).unwrap_err();
        assert!(error.0.starts_with("--quic-receive-window"), "{error}");
        let error = ConfigTables::of(&args(Some(60_000), None)).unwrap_err();
        assert!(error.0.contains("reducer_timeout_ms"), "{error}");
        let mut a = args(Some(60_000), Some(90_000));
        a.peers = 2;
        a.upload_caps = Some("1,2,3".to_owned());
        let error = ConfigTables::of(&a).unwrap_err();
        assert!(error.0.contains("3 caps for 2 peers"), "{error}");
        a.upload_caps = Some("1000, 2000".to_owned());
        let tables = ConfigTables::of(&a).unwrap();
        assert_eq!(tables.upload_caps, [1000, 2000]);
        assert_eq!(tables.butterfly.chunk_timeout_ms, 60_000);
        assert_eq!(parse_parts("bandwidth,equal").unwrap(), [false, true]);
        assert!(parse_parts("even").is_err());
    }

    #[test]
    fn hosts_configs_load_with_the_hosts_address_and_large_frames() {
        let tmp = tempfile::tempdir().unwrap();
        let hosts_file = tmp.path().join("hosts.toml");
        std::fs::write(
            &hosts_file,
            "[[peer]]\nlisten_ip = \"10.77.1.2\"\n\n[[peer]]\nlisten_ip = \"10.77.2.2\"\n",
        )
        .unwrap();
        let plan = LocalPlan {
            peers: 2,
            task: murmur_trainer::TaskPreset::MarkovGpt,
            mode: AveragingMode::Butterfly,
            codec: CodecSpec::F32,
            steps: 1,
            stragglers: Vec::new(),
            churn: false,
            non_iid: false,
            stop_after: None,
            json: true,
            out: None,
            hosts: Hosts::from_flag(Some(&hosts_file), 2).unwrap(),
            synthetic_step_ms: 0,
            error_feedback: true,
            clip: None,
            faults: Vec::new(),
            overrides: Vec::new(),
        };
        let dir = SwarmDir::create(Some(&tmp.path().join("swarm")), 2).unwrap();
        let mut a = args(Some(60_000), Some(90_000));
        a.peers = 2;
        a.quic_receive_window = Some(250_000);
        a.upload_caps = Some("0,777000".to_owned());
        let tables = ConfigTables::of(&a).unwrap();
        write_config(&dir, &plan, 1, &[], &tables).unwrap();
        let loaded = crate::config::load_for_another_host(&dir.config_path(1))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loaded.net.listen_addrs, ["/ip4/10.77.2.2/udp/0/quic-v1"]);
        assert_eq!(loaded.net.max_frame_payload, MAX_FRAME_PAYLOAD);
        assert_eq!(loaded.net.quic_stream_receive_window, 250_000);
        assert_eq!(loaded.net.quic_connection_receive_window, 250_000);
        let murmur_gossip::engine::ModeSettings::Butterfly { butterfly, .. } =
            &loaded.averaging.mode
        else {
            panic!("{:?}", loaded.averaging.mode);
        };
        assert_eq!(butterfly.chunk_timeout_ms, 60_000);
        assert_eq!(butterfly.reducer_timeout_ms, 90_000);
        assert_eq!(loaded.net.max_upload_bytes_per_s, 777_000);
    }
}
