//! `murmur bench stream`: one libp2p tensor stream against raw quinn, in the same run.
//!
//! libp2p-quic negotiates ChaCha20-Poly1305 (libp2p-tls puts it first and offers no way to
//! change it), while a plain quinn endpoint negotiates AES-GCM, which is cheaper on CPUs
//! with AES instructions. The benchmark therefore measures quinn twice, and this test holds
//! murmur's stream layer to 80% of quinn with the same cipher suite, where the difference
//! is only what libp2p and murmur's framing add. Against quinn's default suites the ratio
//! is also reported and must stay above 70%; the gap between the two is the cipher.

use std::time::Duration;

use murmur_gossip::net::bench::{StreamBenchConfig, stream_throughput};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tensor_stream_reaches_80_percent_of_raw_quinn_with_the_same_cipher() {
    let config = StreamBenchConfig {
        bytes: 96 << 20,
        chunk_bytes: 1 << 20,
        rounds: 4,
        timeout: Duration::from_secs(60),
    };
    let result = stream_throughput(&config).await.expect("benchmark runs");
    let mb = |r: f64| r / 1e6;
    let rounds = |r: &[f64]| {
        r[..result.rounds as usize]
            .iter()
            .map(|r| mb(*r).round())
            .collect::<Vec<_>>()
    };
    eprintln!(
        "libp2p {:.0} MB/s, quinn {:.0} MB/s (ratio {:.2}), quinn with libp2p's ciphers \
         {:.0} MB/s (ratio {:.2}); rounds: libp2p {:?}, quinn {:?}, quinn same ciphers {:?}",
        mb(result.libp2p_bytes_per_s),
        mb(result.quinn_bytes_per_s),
        result.ratio,
        mb(result.quinn_same_cipher_bytes_per_s),
        result.ratio_same_cipher,
        rounds(&result.libp2p_rounds),
        rounds(&result.quinn_rounds),
        rounds(&result.quinn_same_cipher_rounds),
    );
    assert_eq!(result.bytes, 96 << 20);
    assert!(result.quinn_bytes_per_s > 0.0 && result.libp2p_bytes_per_s > 0.0);
    assert!(
        result.ratio_same_cipher >= 0.8,
        "libp2p reached only {:.0}% of quinn with the same cipher suite",
        result.ratio_same_cipher * 100.0
    );
    assert!(
        result.ratio >= 0.7,
        "libp2p reached only {:.0}% of quinn with its default cipher suites",
        result.ratio * 100.0
    );
}
