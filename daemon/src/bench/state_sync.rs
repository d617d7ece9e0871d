//! `murmur bench state-sync`: a joiner's download of a served state against one tensor
//! stream, between the same two network stacks on loopback, in the same run.
//!
//! One stack serves a snapshot of `--mib` MiB of parameters (random values, which zstd
//! cannot shrink) with the daemon's own serving task; the other downloads it with the
//! daemon's own download, into a file, as a joiner does. Each round also moves as many
//! bytes over one tensor stream from the server to the joiner, in 1 MiB frames. The
//! download's rate counts its ranges only (the first request to the last range); the
//! decoding that follows is reported apart. With `--servers N`, N stacks serve the same
//! snapshot and the joiner downloads from all of them at once.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use murmur_gossip::net::bench::{Libp2pPair, StreamBenchConfig};
use murmur_protocol::frame::FrameLimits;
use murmur_protocol::snapshot::SnapshotLimits;
use murmur_protocol::snapshot_file::{SnapshotView, TensorView};
use rand::{RngExt as _, SeedableRng as _};

use crate::cli::StateSyncBenchArgs;
use crate::run::state_sync::{self, StateCell};

/// Bytes per tensor-stream frame.
const FRAME_BYTES: usize = 1 << 20;
/// Most rounds one run may ask for.
const MAX_ROUNDS: u32 = 16;
/// Most serving stacks one run may ask for.
const MAX_SERVERS: usize = 4;

pub(crate) fn run(args: &StateSyncBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.mib > 0, "--mib must be at least 1");
    anyhow::ensure!(
        (1..=MAX_ROUNDS).contains(&args.rounds),
        "--rounds must be 1 to {MAX_ROUNDS}"
    );
    anyhow::ensure!(
        (1..=MAX_SERVERS).contains(&args.servers),
        "--servers must be 1 to {MAX_SERVERS}"
    );
    let folder = args
        .dir
        .join(format!("murmur-bench-state-sync-{}", std::process::id()));
    std::fs::create_dir(&folder).with_context(|| format!("cannot create {}", folder.display()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(measure(args, &folder));
    let _ = std::fs::remove_dir_all(&folder);
    result
}

async fn measure(args: &StateSyncBenchArgs, folder: &Path) -> anyhow::Result<()> {
    let elements = usize::try_from(args.mib << 18).context("--mib is too large")?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let params: Vec<f32> = (0..elements).map(|_| rng.random_range(-0.1..0.1)).collect();
    let view = SnapshotView {
        step: 1,
        samples: 256,
        push_sum_weight: 1.0,
        swarm_id: "bench",
        model_fingerprint: [0; 32],
        tensors: vec![TensorView::floats("params", &params)],
    };
    let cell = StateCell::in_dir(folder.join("served"));
    cell.publish(&view)?;
    let limits = murmur_gossip::net::NetConfig::default().max_control_payload;
    let limits = FrameLimits::new(limits).context("the control frame limit")?;
    let snapshot_limits = SnapshotLimits {
        max_raw_len: (elements as u64 * 4 + (1 << 20)) * 2,
        max_tensors: 4,
    };

    let mut pair = Libp2pPair::start().await?;
    let control = pair
        .take_sender_control()
        .context("the server's control requests")?;
    let mut servers = vec![pair.sender.local_peer_id()];
    tokio::spawn(state_sync::serve(
        pair.sender.clone(),
        control,
        cell.clone(),
        limits,
    ));
    let mut others = Vec::new();
    for _ in 1..args.servers {
        let (net, control) = pair.another_sender().await?;
        servers.push(net.local_peer_id());
        tokio::spawn(state_sync::serve(
            net.clone(),
            control,
            cell.clone(),
            limits,
        ));
        others.push(net);
    }

    let mut streamed = Vec::new();
    let mut fetched = Vec::new();
    let mut decoded = Vec::new();
    let mut bytes = 0;
    for _ in 0..args.rounds {
        let downloaded = state_sync::download(
            &pair.receiver,
            &servers,
            &folder.join("joiner"),
            &limits,
            &snapshot_limits,
        )
        .await?;
        let got = &downloaded.snapshot.tensors[0].data;
        anyhow::ensure!(
            got.len() == params.len() && got[..] == params[..],
            "the downloaded parameters differ from the served ones"
        );
        anyhow::ensure!(
            downloaded.servers == args.servers,
            "{} of {} servers answered ranges",
            downloaded.servers,
            args.servers
        );
        bytes = downloaded.bytes;
        fetched.push(rate(bytes, downloaded.fetch));
        decoded.push(downloaded.decode.as_secs_f64());
        drop(downloaded);
        let config = StreamBenchConfig {
            bytes,
            chunk_bytes: FRAME_BYTES,
            rounds: 1,
            timeout: Duration::from_secs(300),
        };
        let chunks = bytes.div_ceil(FRAME_BYTES as u64);
        let took = pair.transfer(chunks, &config).await?;
        streamed.push(rate(chunks * FRAME_BYTES as u64, took));
    }
    for net in others.iter().chain([&pair.sender, &pair.receiver]) {
        let _ = net.shutdown().await;
    }
    report(args, bytes, &fetched, &streamed, &decoded);
    Ok(())
}

fn rate(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / took.as_secs_f64().max(1e-9)
}

fn report(
    args: &StateSyncBenchArgs,
    bytes: u64,
    fetched: &[f64],
    streamed: &[f64],
    decoded: &[f64],
) {
    let download = median(fetched) / 1e6;
    let stream = median(streamed) / 1e6;
    let decode_s = median(decoded);
    let ratio = download / stream;
    if args.json {
        let row = serde_json::json!({
            "state_bytes": bytes,
            "rounds": args.rounds,
            "servers": args.servers,
            "download_mb_per_s": download,
            "tensor_stream_mb_per_s": stream,
            "ratio": ratio,
            "decode_s": decode_s,
            "download_rounds_mb_per_s": fetched.iter().map(|r| r / 1e6).collect::<Vec<_>>(),
            "stream_rounds_mb_per_s": streamed.iter().map(|r| r / 1e6).collect::<Vec<_>>(),
        });
        println!("{row}");
    } else {
        println!(
            "{:.1} MB of encoded state from {} server(s), median of {} rounds",
            bytes as f64 / 1e6,
            args.servers,
            args.rounds
        );
        println!("state download (ranges)   {download:>8.1} MB/s");
        println!("one tensor stream         {stream:>8.1} MB/s");
        println!("download / stream         {ratio:>8.3}");
        println!("decoding after the ranges {decode_s:>8.2} s");
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}
