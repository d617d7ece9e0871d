//! Quantized SGP shares: mass stays exact, and the error follows the drift, not the values.
//!
//! Errors are relative to the initial disagreement `D₀` (see `RoundRecord`).

use murmur_gossip::sgp::SgpConfig;
use murmur_gossip::sim::Scenario;
use murmur_gossip::sim::{self, AlgorithmSpec, SimReport};
use murmur_protocol::codec::{Codec, CodecSpec};

const PEERS: usize = 32;
const LEN: usize = 256;

fn run(codec: CodecSpec, offset: f32, rounds: u64) -> SimReport {
    let mut scenario = Scenario::new(PEERS, LEN, rounds);
    scenario.seed = 5;
    scenario.compute.jitter = 0.2;
    scenario.link.latency_ms = 2.0;
    scenario.init.offset = offset;
    scenario.record_every = 5;
    scenario.algorithm = AlgorithmSpec::Sgp(SgpConfig {
        share_codec: codec,
        ..SgpConfig::default()
    });
    sim::run(&scenario).expect("valid scenario")
}

fn int8() -> CodecSpec {
    CodecSpec::Int8 { block: 64 }
}

/// The sender subtracts exactly the de-quantized share the receiver adds, so total weight
/// and the numerators' sum are conserved, and the swarm agrees on the exact initial average,
/// not on an average shifted by accumulated quantization error.
#[test]
fn int8_shares_conserve_mass_and_reach_the_exact_average() {
    let report = run(int8(), 0.0, 60);
    for record in &report.rounds {
        let drift = (record.total_weight - PEERS as f64).abs() / PEERS as f64;
        assert!(
            drift <= 1e-9,
            "round {}: weight drift {drift:e}",
            record.round
        );
    }
    assert_eq!(report.summary.dropped_weight, 0.0);
    let last = report.rounds.last().expect("records");
    assert!(last.average_error <= 1e-6, "{last:?}");

    // And it sends far fewer bytes than exact shares.
    let exact = run(CodecSpec::F32, 0.0, 60);
    assert!(report.summary.bytes_sent * 2 < exact.summary.bytes_sent);
}

/// int4 is coarser but still converges to the exact average: its error shrinks with the
/// deviations it quantizes.
#[test]
fn int4_shares_converge_too() {
    let report = run(CodecSpec::Int4 { block: 64 }, 0.0, 60);
    let last = report.rounds.last().expect("records");
    assert!(last.average_error <= 1e-5, "{last:?}");
}

/// Shifting every value by 10⁴ does not make quantized shares worse than exact ones: both
/// stop at the resolution of `f32` numbers near 10⁴. Quantizing the shares themselves
/// would have added errors of about 10⁴ / 127 per element, a thousand times the spread.
#[test]
fn quantization_error_scales_with_drift_not_with_magnitude() {
    let offset = 1e4;
    let rounds = 40;
    let quantized = run(int8(), offset, rounds);
    let exact = run(CodecSpec::F32, offset, rounds);
    let quantized_error = quantized.summary.final_consensus_error;
    let exact_error = exact.summary.final_consensus_error;
    assert!(
        quantized_error <= 2.0 * exact_error,
        "int8 {quantized_error:e} vs f32 {exact_error:e} at offset {offset}"
    );
    // What quantizing raw half-shares (values near offset / 2) would cost, relative to the
    // initial spread of about √(LEN / 3).
    let codec = Codec::new(int8()).expect("valid codec");
    let raw_share = vec![offset / 2.0; LEN];
    let naive =
        f64::from(codec.error_bound(&raw_share)) * (LEN as f64).sqrt() / (LEN as f64 / 3.0).sqrt();
    assert!(
        naive > 1e3 * quantized_error,
        "naive error {naive:e} vs {quantized_error:e}"
    );
    // At offset zero the same run agrees far better: the plateau above is `f32` resolution.
    let centred = run(int8(), 0.0, rounds);
    assert!(centred.summary.final_consensus_error < quantized_error / 10.0);
}
