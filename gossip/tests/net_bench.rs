//! The stream benchmark behind `murmur bench stream`: one libp2p tensor stream against raw
//! quinn, in the same run. quinn is measured twice, with its default cipher suites and with
//! libp2p's order (ChaCha20-Poly1305 first, which libp2p-tls fixes), so that the cipher and
//! the stream layer's own cost can be told apart.

use std::time::Duration;

use murmur_gossip::net::bench::{StreamBenchConfig, stream_throughput};

/// The stream benchmark runs end to end on every transport and reports consistent numbers.
/// Its ratios are measured by `murmur bench stream` and recorded in BENCHMARKS.md; a timed
/// assertion here would only measure how busy the test machine is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_benchmark_runs_every_transport() {
    let config = StreamBenchConfig {
        bytes: 8 << 20,
        chunk_bytes: 1 << 20,
        rounds: 2,
        timeout: Duration::from_secs(60),
    };
    let result = stream_throughput(&config).await.expect("benchmark runs");
    assert_eq!(result.bytes, 8 << 20);
    assert_eq!(result.rounds, 2);
    for rates in [
        &result.libp2p_rounds[..2],
        &result.quinn_rounds[..2],
        &result.quinn_same_cipher_rounds[..2],
    ] {
        assert!(rates.iter().all(|r| r.is_finite() && *r > 0.0), "{rates:?}");
    }
    assert!((result.ratio - result.libp2p_bytes_per_s / result.quinn_bytes_per_s).abs() < 1e-9);
    assert!(
        (result.ratio_same_cipher
            - result.libp2p_bytes_per_s / result.quinn_same_cipher_bytes_per_s)
            .abs()
            < 1e-9
    );
}
