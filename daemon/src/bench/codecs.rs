//! `murmur bench codecs`: per codec, on one thread, encode and decode-accumulate throughput
//! (counted in f32 input bytes), encoded bytes per element, and MSE/variance on Gaussian and
//! heavy-tailed data, next to memcpy bandwidth measured in the same run.

use std::hint::black_box;

use anyhow::{Context, bail};
use murmur_protocol::codec::{Codec, CodecSpec};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, StandardNormal, StudentT};
use serde::Serialize;

use super::timing::{gbps, median_time};
use crate::cli::{BenchDevice, CodecsArgs};

/// One line of output: one codec on one kind of data.
#[derive(Debug, Serialize)]
struct CodecRow {
    codec: &'static str,
    /// The codec with its parameter, as accepted by `--codecs`.
    spec: String,
    block: Option<u32>,
    data: &'static str,
    elements: usize,
    encode_gbps: f64,
    decode_acc_gbps: f64,
    bytes_per_elem: f64,
    mse_over_var: f64,
    memcpy_gbps: f64,
    encode_over_memcpy: f64,
    decode_acc_over_memcpy: f64,
}

/// The two kinds of data every codec is measured on.
const DATA: [&str; 2] = ["normal", "student-t3"];

fn make_data(kind: &str, n: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(0x6d75726d7572);
    match kind {
        "normal" => (0..n).map(|_| StandardNormal.sample(&mut rng)).collect(),
        // Gradient-like: heavy tails, small typical magnitude.
        _ => {
            let t = StudentT::new(3.0).expect("3 degrees of freedom is valid");
            (0..n).map(|_| (t.sample(&mut rng) * 1e-3) as f32).collect()
        }
    }
}

fn specs(args: &CodecsArgs) -> anyhow::Result<Vec<CodecSpec>> {
    if args.codecs.is_empty() {
        return CodecSpec::ALL_DEFAULT
            .into_iter()
            .map(|spec| {
                let spec = match spec {
                    CodecSpec::Int8 { .. } => CodecSpec::Int8 { block: args.block },
                    CodecSpec::Int4 { .. } => CodecSpec::Int4 { block: args.block },
                    CodecSpec::Sign1 { .. } => CodecSpec::Sign1 { block: args.block },
                    other => other,
                };
                spec.validate().map(|()| spec).context("--block")
            })
            .collect();
    }
    args.codecs
        .iter()
        .map(|text| CodecSpec::parse(text).with_context(|| format!("--codecs {text}")))
        .collect()
}

pub(crate) fn run(args: &CodecsArgs) -> anyhow::Result<()> {
    if args.elements == 0 {
        bail!("--elements must be at least 1");
    }
    let specs = specs(args)?;
    if args.device == BenchDevice::Cuda {
        return run_cuda(args, &specs);
    }
    let n = args.elements;
    let input_bytes = n * 4;

    let mut rows = Vec::new();
    for data in DATA {
        let x = make_data(data, n);
        let var = variance(&x);
        let mut copy = vec![0f32; n];
        let memcpy = median_time(args.repeats, || copy.copy_from_slice(black_box(&x)));
        let memcpy_gbps = gbps(input_bytes, memcpy);

        let mut acc = vec![0f32; n];
        let mut decoded = vec![0f32; n];
        for &spec in &specs {
            let mut codec = Codec::new(spec)?;
            let mut bytes = vec![0u8; codec.max_encoded_len(n)];
            let mut written = 0;
            let encode = median_time(args.repeats, || {
                written = codec
                    .encode(black_box(&x), &mut bytes)
                    .expect("finite data encodes");
            });
            let encoded = &bytes[..written];
            let decode_acc = median_time(args.repeats, || {
                codec
                    .decode_accumulate(black_box(encoded), 0.5, &mut acc)
                    .expect("own part decodes");
            });
            codec.decode_into(encoded, &mut decoded)?;
            let mse = x
                .iter()
                .zip(&decoded)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum::<f64>()
                / n as f64;
            let (encode_gbps, decode_acc_gbps) =
                (gbps(input_bytes, encode), gbps(input_bytes, decode_acc));
            rows.push(CodecRow {
                codec: spec.name(),
                spec: spec.to_string(),
                block: spec.block(),
                data,
                elements: n,
                encode_gbps,
                decode_acc_gbps,
                bytes_per_elem: written as f64 / n as f64,
                mse_over_var: mse / var,
                memcpy_gbps,
                encode_over_memcpy: encode_gbps / memcpy_gbps,
                decode_acc_over_memcpy: decode_acc_gbps / memcpy_gbps,
            });
        }
        black_box(&acc);
    }
    print_rows(&rows, args.json)
}

fn variance(x: &[f32]) -> f64 {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    x.iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n
}

fn print_rows(rows: &[CodecRow], json: bool) -> anyhow::Result<()> {
    if json {
        for row in rows {
            println!("{}", serde_json::to_string(row)?);
        }
        return Ok(());
    }
    println!(
        "{:<12} {:<11} {:>9} {:>9} {:>8} {:>8} {:>7} {:>10} {:>8}",
        "codec",
        "data",
        "enc GB/s",
        "dec GB/s",
        "enc/cpy",
        "dec/cpy",
        "B/elem",
        "MSE/var",
        "cpy GB/s"
    );
    for r in rows {
        println!(
            "{:<12} {:<11} {:>9.2} {:>9.2} {:>7.0}% {:>7.0}% {:>7.3} {:>10.2e} {:>8.2}",
            r.spec,
            r.data,
            r.encode_gbps,
            r.decode_acc_gbps,
            100.0 * r.encode_over_memcpy,
            100.0 * r.decode_acc_over_memcpy,
            r.bytes_per_elem,
            r.mse_over_var,
            r.memcpy_gbps
        );
    }
    Ok(())
}

/// `--device cuda`: device-resident tensors on GPU 0, next to a device-to-device copy.
fn run_cuda(args: &CodecsArgs, specs: &[CodecSpec]) -> anyhow::Result<()> {
    // Detection checks for the driver library before any other CUDA call.
    let report = murmur_gpu::detect();
    if !report.is_cuda() {
        bail!("--device cuda: {report}");
    }
    let mut backend = murmur_gpu::CudaBackend::new(0)?;
    if !args.json {
        println!("{report}");
        println!(
            "{:<12} {:>9} {:>9} {:>9} {:>8} {:>8} {:>7}",
            "codec", "enc GB/s", "dec GB/s", "cpy GB/s", "enc/cpy", "dec/cpy", "B/elem"
        );
    }
    // Top-k has no device kernels; the CPU table covers it.
    for &spec in specs
        .iter()
        .filter(|s| !matches!(s, CodecSpec::TopK { .. }))
    {
        let t =
            murmur_gpu::bench::codec_throughput(&mut backend, spec, args.elements, args.repeats)?;
        let bytes_per_elem = t.encoded_bytes as f64 / t.elements as f64;
        if args.json {
            let row = serde_json::json!({
                "codec": spec.name(), "spec": spec.to_string(), "block": spec.block(),
                "device": t.device, "elements": t.elements, "encode_gbps": t.encode_gbps,
                "decode_acc_gbps": t.decode_accumulate_gbps, "copy_gbps": t.copy_gbps,
                "encode_over_copy": t.encode_gbps / t.copy_gbps,
                "decode_acc_over_copy": t.decode_accumulate_gbps / t.copy_gbps,
                "bytes_per_elem": bytes_per_elem,
            });
            println!("{row}");
        } else {
            println!(
                "{:<12} {:>9.1} {:>9.1} {:>9.1} {:>7.0}% {:>7.0}% {:>7.3}",
                spec.to_string(),
                t.encode_gbps,
                t.decode_accumulate_gbps,
                t.copy_gbps,
                100.0 * t.encode_gbps / t.copy_gbps,
                100.0 * t.decode_accumulate_gbps / t.copy_gbps,
                bytes_per_elem
            );
        }
    }
    Ok(())
}
