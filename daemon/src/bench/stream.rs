//! `murmur bench stream`: one libp2p tensor stream against raw quinn, both on loopback in
//! the same run, so the ratio is free of the machine's mood. Raw quinn is measured twice:
//! with its default cipher suites (AES-GCM first) and with libp2p's order (ChaCha20
//! first), which separates libp2p's own overhead from its choice of cipher.

use std::time::Duration;

use anyhow::{Context, bail};
use murmur_gossip::net::bench::{MAX_ROUNDS, StreamBenchConfig, stream_throughput};

use crate::cli::StreamArgs;

pub(crate) fn run(args: &StreamArgs) -> anyhow::Result<()> {
    if !(1..=MAX_ROUNDS as u32).contains(&args.rounds) {
        bail!("--rounds must be 1 to {MAX_ROUNDS}");
    }
    if args.mib == 0 || args.chunk_kib == 0 {
        bail!("--mib and --chunk-kib must be at least 1");
    }
    let config = StreamBenchConfig {
        bytes: args.mib << 20,
        chunk_bytes: args.chunk_kib << 10,
        rounds: args.rounds,
        timeout: Duration::from_secs(300),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(stream_throughput(&config))?;
    let rounds = result.rounds as usize;
    let libp2p = median(&result.libp2p_rounds[..rounds]);
    let quinn = median(&result.quinn_rounds[..rounds]);
    let quinn_same = median(&result.quinn_same_cipher_rounds[..rounds]);
    let mb = |bytes_per_s: f64| bytes_per_s / 1e6;
    if args.json {
        let row = serde_json::json!({
            "bytes": result.bytes,
            "rounds": rounds,
            "libp2p_mb_per_s": mb(libp2p),
            "quinn_mb_per_s": mb(quinn),
            "quinn_same_cipher_mb_per_s": mb(quinn_same),
            "ratio": libp2p / quinn,
            "ratio_same_cipher": libp2p / quinn_same,
        });
        println!("{row}");
    } else {
        println!(
            "{} MiB per transfer, median of {rounds} transfers each",
            args.mib
        );
        println!("libp2p tensor stream              {:>8.1} MB/s", mb(libp2p));
        println!("raw quinn, default ciphers        {:>8.1} MB/s", mb(quinn));
        println!(
            "raw quinn, libp2p's cipher order  {:>8.1} MB/s",
            mb(quinn_same)
        );
        println!("libp2p / quinn                    {:>8.3}", libp2p / quinn);
        println!(
            "libp2p / quinn (same ciphers)     {:>8.3}",
            libp2p / quinn_same
        );
    }
    Ok(())
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}
