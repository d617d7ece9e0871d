//! The CPU reference on the shared vectors: its bytes and decoded values are pinned by
//! digests committed in `tests/vectors/reference.digests`, so that a change to any codec's
//! wire format (which would split a swarm of old and new peers) cannot go unnoticed. The
//! GPU suite checks the CUDA backend against the same vectors.
//!
//! After a deliberate wire-format change, regenerate the file with
//! `MURMUR_BLESS=1 cargo test -p murmur-gpu --test reference_vectors` and commit it.

mod vectors;

use std::fmt::Write as _;
use std::path::PathBuf;

use murmur_protocol::codec::{Codec, CodecSpec};

/// 64-bit FNV-1a: small, stable, and plenty to notice a changed byte.
fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// One line per vector and codec: the encoding's digest (or the error), then the decoded
/// values' digest (or the error). `topk`'s bytes come from zstd, whose output may change
/// with its version without breaking decoding, so only its decoded values are pinned.
fn digests() -> String {
    let mut out = String::new();
    for vector in vectors::all() {
        let n = vector.values.len();
        for spec in vectors::specs() {
            let mut codec = Codec::new(spec).unwrap();
            let mut wire = vec![0u8; codec.max_encoded_len(n)];
            let (encoded, decoded) = match codec.encode(&vector.values, &mut wire) {
                Err(e) => (format!("error {e}"), "-".to_owned()),
                Ok(written) => {
                    let bytes = &wire[..written];
                    let encoded = match spec {
                        CodecSpec::TopK { .. } => format!("{written} bytes"),
                        _ => format!("{:016x}", fnv1a(bytes.iter().copied())),
                    };
                    let mut values = vec![0.0f32; n];
                    let decoded = match codec.decode_into(bytes, &mut values) {
                        Ok(()) => format!(
                            "{:016x}",
                            fnv1a(values.iter().flat_map(|v| v.to_le_bytes()))
                        ),
                        Err(e) => format!("error {e}"),
                    };
                    (encoded, decoded)
                }
            };
            writeln!(out, "{} {spec} {n}: {encoded} | {decoded}", vector.name).unwrap();
        }
    }
    out
}

#[test]
fn reference_bytes_match_the_committed_digests() {
    // The run-time value first: a test binary built elsewhere and run from a nextest archive
    // (scripts/gpu-check.sh) finds the crate where the archive was unpacked.
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    let path = manifest_dir.join("tests/vectors/reference.digests");
    let actual = digests();
    if std::env::var("MURMUR_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; create it with MURMUR_BLESS=1",
            path.display()
        )
    });
    let changed: Vec<String> = expected
        .lines()
        .zip(actual.lines())
        .filter(|(e, a)| e != a)
        .map(|(e, a)| format!("  was: {e}\n  now: {a}"))
        .collect();
    assert!(
        changed.is_empty() && expected.lines().count() == actual.lines().count(),
        "the reference codecs' output changed for {} of {} cases (a wire-format change):\n{}",
        changed.len(),
        actual.lines().count(),
        changed.join("\n")
    );
}

/// The vectors reach the corners they are meant to: values up to `f32::MAX` encode and
/// decode with every codec (blockwise maxima are capped at 2^127 so that no level decodes to
/// ±Inf), and sign1's sum overflows to its max fallback.
#[test]
fn vectors_reach_their_corner_cases() {
    let all = digests();
    assert!(all.lines().any(|l| l.starts_with("plus_minus_max int8")));
    for line in all.lines() {
        assert!(!line.contains("error"), "{line}");
    }
    let huge = vectors::all()
        .into_iter()
        .find(|v| v.name == "huge")
        .unwrap();
    let sum: f32 = huge.values[..32].iter().map(|x| x.abs()).sum();
    assert!(
        sum.is_infinite(),
        "the huge vector must overflow a sign1 block sum"
    );
}
