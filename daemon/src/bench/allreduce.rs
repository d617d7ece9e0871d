//! `murmur bench allreduce`: N peer processes on loopback average a vector round after
//! round with butterfly, ring or SGP; reported per round: time, bytes sent per peer, the
//! relative error against the exact weighted mean, and the efficiency ratio — aggregate
//! encoded bytes moved per second over one libp2p tensor stream's throughput, measured
//! first in the same run.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use murmur_gossip::net::bench::{StreamBenchConfig, stream_throughput};
use murmur_protocol::codec::CodecSpec;
use serde_json::{Value, json};

use crate::cli::{AllreduceAlgo, AllreduceArgs};
use crate::input_error::BadInput;
use crate::local::{LocalAveragingMode, LocalPlan, SwarmDir};

/// How long a peer may stay silent (no line) before the benchmark gives up.
const SILENCE_BOUND: Duration = Duration::from_secs(180);

/// The children, killed when dropped.
struct Children(Vec<Child>);

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
    if !(1..=16_000_000).contains(&args.elements) {
        return Err(BadInput(format!(
            "--elements {}: expected 1 to 16000000 (a share or ring segment travels in one frame of at most 64 MiB)",
            args.elements
        ))
        .into());
    }
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
    let mut codecs = Vec::new();
    for text in args.codec.split(',') {
        codecs.push(
            CodecSpec::parse(text.trim()).map_err(|e| BadInput(format!("--codec {text}: {e}")))?,
        );
    }
    let stream_bps = single_stream(args)?;
    let mut times = Vec::new();
    for &codec in &codecs {
        times.push(run_codec(args, codec, stream_bps)?);
    }
    // Several codecs in one run: how much faster each round is than the first codec's.
    if let [(first, first_time), rest @ ..] = times.as_slice() {
        for (codec, time) in rest {
            let speedup = first_time / time;
            if args.json {
                println!(
                    "{}",
                    json!({"compare": first.to_string(), "with": codec.to_string(), "speedup": speedup})
                );
            } else {
                println!("{codec} rounds are {speedup:.2}x as fast as {first} rounds (medians)");
            }
        }
    }
    Ok(())
}

/// Runs the benchmark with one codec; returns the codec and its median round time.
fn run_codec(
    args: &AllreduceArgs,
    codec: CodecSpec,
    stream_bps: f64,
) -> anyhow::Result<(CodecSpec, f64)> {
    let plan = LocalPlan {
        peers: args.peers,
        mode: LocalAveragingMode::Butterfly,
        codec,
        steps: 1,
        stragglers: Vec::new(),
        churn: false,
        json: args.json,
        out: None,
    };
    let dir = SwarmDir::create(None, args.peers)?;
    let (tx, rx) = mpsc::sync_channel::<(usize, String)>(1024);
    let mut children = Children(Vec::new());
    let mut bootstrap = Vec::new();
    for index in 0..args.peers {
        write_config(&dir, &plan, index, &bootstrap)?;
        children.0.push(spawn_peer(&dir, args, index, tx.clone())?);
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
    let (rounds, discovery_s) = collect(&rx, args, &mut children)?;
    drop(children);
    let median_time = report(args, codec, stream_bps, &rounds, discovery_s, dir.root())?;
    Ok((codec, median_time))
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

/// Writes peer `index`'s config, with frames large enough for a whole share or segment.
fn write_config(
    dir: &SwarmDir,
    plan: &LocalPlan,
    index: usize,
    bootstrap: &[String],
) -> anyhow::Result<()> {
    dir.write_config(plan, index, bootstrap)?;
    let path = dir.config_path(index);
    let text = std::fs::read_to_string(&path)?;
    let text = text.replacen("[net]\n", "[net]\nmax_frame_payload = 67108864\n", 1);
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

fn spawn_peer(
    dir: &SwarmDir,
    args: &AllreduceArgs,
    index: usize,
    tx: mpsc::SyncSender<(usize, String)>,
) -> anyhow::Result<Child> {
    let log = std::fs::File::create(dir.log_path(index))?;
    let algo = match args.algo {
        AllreduceAlgo::Butterfly => "butterfly",
        AllreduceAlgo::Ring => "ring",
        AllreduceAlgo::Sgp => "sgp",
    };
    let mut child = Command::new(std::env::current_exe()?)
        .args(["bench", "allreduce-peer", "--config"])
        .arg(dir.config_path(index))
        .args(["--index", &index.to_string()])
        .args(["--peers", &args.peers.to_string()])
        .args(["--elements", &args.elements.to_string()])
        .args(["--algo", algo])
        .args(["--rounds", &args.rounds.to_string()])
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

/// Per round, per peer: the round lines.
fn collect(
    rx: &mpsc::Receiver<(usize, String)>,
    args: &AllreduceArgs,
    children: &mut Children,
) -> anyhow::Result<(Vec<Vec<Option<Value>>>, f64)> {
    let mut rounds = vec![vec![None; args.peers]; args.rounds as usize];
    let mut done = vec![false; args.peers];
    let mut killed = false;
    let mut discovery = vec![None; args.peers];
    let started = Instant::now();
    let overall = SILENCE_BOUND * 2 + Duration::from_secs(60) * args.rounds as u32;
    while !done.iter().all(|&d| d) {
        if started.elapsed() > overall {
            bail!("the benchmark ran past {overall:?}");
        }
        let (index, line) = match rx.recv_timeout(SILENCE_BOUND) {
            Ok(got) => got,
            Err(_) => bail!("no benchmark peer said anything for {SILENCE_BOUND:?}"),
        };
        let Ok(value) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        match value["event"].as_str() {
            Some("round") => {
                let round = value["round"].as_u64().unwrap_or(u64::MAX) as usize;
                // The victim dies as the first peer moves on to the chosen round.
                if let Some(victim) = args.kill_peer
                    && !killed
                    && round as u64 + 1 == args.kill_at_round
                    && let Some(child) = children.0.get_mut(victim)
                {
                    child.kill().context("cannot kill the chosen peer")?;
                    killed = true;
                    done[victim] = true;
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
                done[index] = true;
            }
            _ => {}
        }
    }
    let slowest = discovery.iter().flatten().copied().fold(0.0, f64::max);
    Ok((rounds, slowest))
}

fn report(
    args: &AllreduceArgs,
    codec: CodecSpec,
    stream_bps: f64,
    rounds: &[Vec<Option<Value>>],
    discovery_s: f64,
    dir: &std::path::Path,
) -> anyhow::Result<f64> {
    let mut rows = Vec::new();
    for (round, peers) in rounds.iter().enumerate() {
        let lines: Vec<&Value> = peers.iter().flatten().collect();
        let expected = match args.kill_peer {
            // The victim may die before it reports the round before the chosen one.
            Some(_) if round as u64 + 1 >= args.kill_at_round => peers.len() - 1,
            _ => peers.len(),
        };
        if lines.len() < expected {
            bail!(
                "round {round}: only {} of {} peers reported",
                lines.len(),
                peers.len()
            );
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
        rows.push(json!({
            "round": round,
            "time_s": time,
            "bytes_sent_per_peer": bytes / lines.len() as f64,
            "rel_error": error,
            "coverage": coverage,
            "coverage_all": coverage_all,
            "efficiency": bytes / time / stream_bps,
        }));
    }
    let median = |key: &str| {
        let mut v: Vec<f64> = rows.iter().filter_map(|r| r[key].as_f64()).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let algo = format!("{:?}", args.algo).to_lowercase();
    let summary = json!({
        "peers": args.peers,
        "elements": args.elements,
        "codec": codec.to_string(),
        "algo": algo,
        "stream_bytes_per_s": stream_bps,
        "discovery_s": discovery_s,
        "median_time_s": median("time_s"),
        "median_efficiency": median("efficiency"),
        "median_rel_error": median("rel_error"),
        "rounds": rows,
        "logs": dir.display().to_string(),
    });
    if args.json {
        println!("{summary}");
        return Ok(median("time_s"));
    }
    println!(
        "{} peers, {} elements, {codec}, {algo}; one tensor stream: {:.1} MB/s",
        args.peers,
        args.elements,
        stream_bps / 1e6
    );
    println!("every peer found every other (via the DHT) within {discovery_s:.2} s");
    println!("round   time (s)   MB sent/peer   rel. error   coverage   efficiency");
    for row in &rows {
        println!(
            "{:>5}   {:>8.3}   {:>12.2}   {:>10.2e}   {:>8.3}   {:>10.3}",
            row["round"],
            row["time_s"].as_f64().unwrap_or(f64::NAN),
            row["bytes_sent_per_peer"].as_f64().unwrap_or(f64::NAN) / 1e6,
            row["rel_error"].as_f64().unwrap_or(f64::NAN),
            row["coverage"].as_f64().unwrap_or(f64::NAN),
            row["efficiency"].as_f64().unwrap_or(f64::NAN),
        );
    }
    println!(
        "median: {:.3} s per round, efficiency {:.3}",
        median("time_s"),
        median("efficiency")
    );
    Ok(median("time_s"))
}
