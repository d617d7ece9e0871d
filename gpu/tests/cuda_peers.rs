//! A CPU peer and a GPU peer averaging together, CenteredClip on the device, and the
//! device codec benchmark. Every test needs a GPU, so each is ignored unless asked for (see
//! `cuda_support`). Run on a GPU host with
//! `cargo test -p murmur-gpu --release --test cuda_peers -- --include-ignored --nocapture`.

// Only the buffer helpers are used here; the conformance checks run in cuda_backend.rs.
#[allow(dead_code)]
mod conformance;
mod cuda_support;

use conformance::{bits, buffer, contents};
use cuda_support::backend;
use murmur_gpu::bench::codec_throughput;
use murmur_gpu::{Backend, CpuBackend, GpuError, clip};
use murmur_protocol::codec::{Codec, CodecError, CodecSpec};

/// What a run of push-sum rounds between two peers produced: every message on the wire,
/// and each peer's vector at the end.
#[derive(Debug, PartialEq)]
struct Transcript {
    messages: Vec<Vec<u8>>,
    first: Vec<u32>,
    second: Vec<u32>,
}

/// One peer of the pair: its numerator `x`, the error-feedback residual, a scratch for the
/// pushed share, and a fixed "gradient".
struct Peer<B: Backend> {
    backend: B,
    x: B::Buffer,
    residual: B::Buffer,
    share: B::Buffer,
    gradient: B::Buffer,
}

impl<B: Backend> Peer<B> {
    fn new(mut backend: B, seed: u32, n: usize) -> Peer<B> {
        let start: Vec<f32> = (0..n)
            .map(|i| ((i as u32 * 7 + seed) % 97) as f32 / 13.0 - 3.5)
            .collect();
        let gradient: Vec<f32> = (0..n)
            .map(|i| ((i as u32 * 11 + seed) % 89) as f32 / 50.0 - 0.9)
            .collect();
        let x = buffer(&mut backend, &start);
        let gradient = buffer(&mut backend, &gradient);
        let residual = backend.alloc(n).unwrap();
        let share = backend.alloc(n).unwrap();
        Peer {
            backend,
            x,
            residual,
            share,
            gradient,
        }
    }

    /// A local step, then half of `x` leaves (encoded with feedback) and half stays.
    fn push(&mut self, codec: &mut Codec, n: usize) -> Vec<u8> {
        let b = &mut self.backend;
        b.axpy(-0.01, &self.gradient, 0..n, &mut self.x, 0..n)
            .unwrap();
        b.copy(&self.x, 0..n, &mut self.share, 0..n).unwrap();
        b.scale(&mut self.share, 0..n, 0.5).unwrap();
        b.scale(&mut self.x, 0..n, 0.5).unwrap();
        let mut wire = vec![0u8; codec.max_encoded_len(n)];
        let written = b
            .encode_with_feedback(codec, &self.share, &mut self.residual, 0..n, &mut wire)
            .unwrap();
        wire.truncate(written);
        wire
    }

    fn receive(&mut self, codec: &mut Codec, wire: &[u8], n: usize) {
        self.backend
            .decode_accumulate(codec, wire, 1.0, &mut self.x, 0..n)
            .unwrap();
    }

    fn values(&mut self) -> Vec<u32> {
        let x = contents(&mut self.backend, &self.x);
        bits(&x)
    }
}

fn run_pair<A: Backend, B: Backend>(a: A, b: B) -> Transcript {
    let n = 10_007;
    let mut first = Peer::new(a, 1, n);
    let mut second = Peer::new(b, 2, n);
    let mut messages = Vec::new();
    for spec in [
        CodecSpec::Int8 { block: 64 },
        CodecSpec::F16,
        CodecSpec::Sign1 { block: 256 },
        CodecSpec::Int4 { block: 32 },
        CodecSpec::TopK { keep_ppm: 50_000 },
        CodecSpec::Bf16,
    ] {
        let mut codec = Codec::new(spec).unwrap();
        for _ in 0..3 {
            let from_first = first.push(&mut codec, n);
            let from_second = second.push(&mut codec, n);
            second.receive(&mut codec, &from_first, n);
            first.receive(&mut codec, &from_second, n);
            messages.extend([from_first, from_second]);
        }
    }
    Transcript {
        messages,
        first: first.values(),
        second: second.values(),
    }
}

/// A swarm of one CPU peer and one GPU peer exchanges exactly the bytes, and ends with
/// exactly the vectors, that two CPU peers do: the backends mix freely.
#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn cpu_and_gpu_peers_mix_freely() {
    let gpu = backend();
    let cpu_pair = run_pair(CpuBackend::new(), CpuBackend::new());
    let mixed = run_pair(CpuBackend::new(), gpu);
    assert_eq!(cpu_pair.messages.len(), mixed.messages.len());
    for (k, (cpu, mixed)) in cpu_pair.messages.iter().zip(&mixed.messages).enumerate() {
        assert!(cpu == mixed, "message {k} differs");
    }
    assert!(
        cpu_pair.first == mixed.first,
        "the CPU peer ended elsewhere"
    );
    assert!(
        cpu_pair.second == mixed.second,
        "the GPU peer ended elsewhere"
    );
}

/// CenteredClip's distances and step on the device equal the host functions of
/// `murmur_gpu::clip` bit for bit, across tile boundaries.
#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn clip_matches_the_host_order() {
    let mut gpu = backend();
    let (rows, len, stride) = (5usize, 2048 * 3 + 77, 7000);
    let data: Vec<f32> = (0..rows * stride + 9)
        .map(|i| ((i as u64 * 2_654_435_761 % 65_537) as f32 - 32_768.0) * 1e-3)
        .collect();
    let starts: Vec<usize> = (0..rows).map(|r| r * stride + 9).collect();
    let center: Vec<f32> = (0..len + 3).map(|i| (i % 17) as f32 * 0.1).collect();
    let data_gpu = buffer(&mut gpu, &data);
    let mut center_gpu = buffer(&mut gpu, &center);
    let mut distances = vec![0.0f64; rows];
    gpu.clip_squared_distances(&data_gpu, &starts, &center_gpu, 3..len + 3, &mut distances)
        .unwrap();
    let host_rows: Vec<&[f32]> = starts.iter().map(|&s| &data[s..s + len]).collect();
    for (r, row) in host_rows.iter().enumerate() {
        let expected = clip::squared_distance(row, &center[3..]);
        assert_eq!(distances[r].to_bits(), expected.to_bits(), "row {r}");
    }
    let factors: Vec<f32> = distances
        .iter()
        .map(|&d| clip::clip_factor(d, 40.0, 0.2))
        .collect();
    gpu.clip_step(&data_gpu, &starts, &factors, &mut center_gpu, 3..len + 3)
        .unwrap();
    let mut expected = center.clone();
    clip::clip_step(&host_rows, &factors, &mut expected[3..]);
    assert_eq!(bits(&contents(&mut gpu, &center_gpu)), bits(&expected));
}

/// The acceptance bar of the device codecs: `int8` encode and decode-accumulate run at
/// 60% or more of a device-to-device copy of the same tensor, measured in the same run.
#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn int8_reaches_60_percent_of_copy_bandwidth() {
    let mut gpu = backend();
    let result = codec_throughput(&mut gpu, CodecSpec::Int8 { block: 64 }, 1 << 26, 30).unwrap();
    println!("{result:#?}");
    println!(
        "int8 encode {:.0} GB/s ({:.0}% of copy), decode-accumulate {:.0} GB/s ({:.0}%), copy {:.0} GB/s",
        result.encode_gbps,
        100.0 * result.encode_vs_copy(),
        result.decode_accumulate_gbps,
        100.0 * result.decode_accumulate_vs_copy(),
        result.copy_gbps,
    );
    assert!(result.encode_vs_copy() >= 0.6, "encode below 60% of copy");
    assert!(
        result.decode_accumulate_vs_copy() >= 0.6,
        "decode-accumulate below 60% of copy"
    );
}

/// Every device codec can be benchmarked and gives finite, positive rates; `topk`, which
/// runs on the host, is refused with a reason.
#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn bench_covers_every_device_codec() {
    let mut gpu = backend();
    for spec in CodecSpec::ALL_DEFAULT {
        let result = codec_throughput(&mut gpu, spec, 1 << 20, 5);
        if let CodecSpec::TopK { .. } = spec {
            assert!(matches!(
                result,
                Err(GpuError::Codec(CodecError::InvalidSpec { .. }))
            ));
            continue;
        }
        let result = result.unwrap();
        println!(
            "{spec}: encode {:.0} GB/s, decode-accumulate {:.0} GB/s, copy {:.0} GB/s",
            result.encode_gbps, result.decode_accumulate_gbps, result.copy_gbps
        );
        for rate in [
            result.encode_gbps,
            result.decode_accumulate_gbps,
            result.copy_gbps,
        ] {
            assert!(rate.is_finite() && rate > 0.0, "{spec}: {result:?}");
        }
        assert_eq!(
            result.encoded_bytes,
            Codec::new(spec).unwrap().max_encoded_len(1 << 20)
        );
    }
}
