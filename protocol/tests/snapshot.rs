//! Snapshots round-trip, and every torn, corrupted or hostile one is refused with its own
//! error before anything large is allocated.

use std::io::{Cursor, Seek, SeekFrom, Write};

use murmur_protocol::snapshot::{
    NamedTensor, SNAPSHOT_HEADER_LEN, Snapshot, SnapshotError, SnapshotLimits,
};
use murmur_protocol::snapshot_file::read_snapshot;
use proptest::prelude::*;
use sha2::{Digest, Sha256};

fn sample() -> Snapshot {
    Snapshot {
        step: 1234,
        samples: 78_976,
        push_sum_weight: 0.75,
        swarm_id: "demo-swarm".into(),
        model_fingerprint: [7; 32],
        tensors: vec![
            NamedTensor {
                name: "params".into(),
                data: (0..1000).map(|i| (i as f32).sin()).collect(),
            },
            NamedTensor {
                name: "adamw.m".into(),
                data: vec![0.0; 1000],
            },
            NamedTensor {
                name: "empty".into(),
                data: vec![],
            },
        ],
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn roundtrips(
        step in any::<u64>(),
        weight in 0.0f64..1e6,
        tensors in prop::collection::vec(prop::collection::vec(-1e6f32..1e6, 0..300), 0..5),
    ) {
        let snapshot = Snapshot {
            step,
            samples: step / 3,
            push_sum_weight: weight,
            swarm_id: "s".into(),
            model_fingerprint: [1; 32],
            tensors: tensors.into_iter().enumerate()
                .map(|(i, data)| NamedTensor { name: format!("t{i}"), data }).collect(),
        };
        let bytes = snapshot.encode(1).unwrap();
        prop_assert_eq!(Snapshot::decode(&bytes, &SnapshotLimits::default()).unwrap(), snapshot);
    }
}

#[test]
fn every_truncation_is_refused() {
    let bytes = sample().encode(3).unwrap();
    for len in 0..bytes.len() {
        let err = Snapshot::decode(&bytes[..len], &SnapshotLimits::default()).unwrap_err();
        assert!(
            matches!(
                err,
                SnapshotError::Truncated(_) | SnapshotError::BodyLength { .. }
            ),
            "prefix of {len} bytes gave {err}"
        );
    }
}

#[test]
fn every_single_byte_corruption_is_refused() {
    let bytes = sample().encode(3).unwrap();
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0x10;
        let result = Snapshot::decode(&bad, &SnapshotLimits::default());
        assert!(result.is_err(), "flipping a bit of byte {i} went unnoticed");
        // The digest and the body are covered by the digest check itself.
        if i >= SNAPSHOT_HEADER_LEN - 32 {
            assert!(
                matches!(result, Err(SnapshotError::DigestMismatch)),
                "byte {i}: {result:?}"
            );
        }
    }
}

#[test]
fn header_errors_are_specific() {
    let bytes = sample().encode(3).unwrap();
    let mut bad = bytes.clone();
    bad[0] = b'X';
    assert!(matches!(
        Snapshot::decode(&bad, &SnapshotLimits::default()),
        Err(SnapshotError::BadMagic)
    ));
    let mut bad = bytes.clone();
    bad[8] = 9;
    assert!(matches!(
        Snapshot::decode(&bad, &SnapshotLimits::default()),
        Err(SnapshotError::UnsupportedVersion { found: 9 })
    ));
    let small = SnapshotLimits {
        max_raw_len: 1000,
        max_tensors: 16,
    };
    assert!(matches!(
        Snapshot::decode(&bytes, &small),
        Err(SnapshotError::TooLarge { limit: 1000, .. })
    ));
    assert_eq!(
        Snapshot::digest_of(&bytes).unwrap(),
        bytes[SNAPSHOT_HEADER_LEN - 32..SNAPSHOT_HEADER_LEN]
    );
}

#[test]
fn non_finite_state_is_neither_written_nor_read() {
    let mut snapshot = sample();
    snapshot.tensors[0].data[17] = f32::NAN;
    assert!(matches!(
        snapshot.encode(1),
        Err(SnapshotError::NonFinite { ref tensor, index: 17 }) if tensor == "params"
    ));
    // A hostile peer can still digest NaN correctly; the decoder refuses it anyway.
    let mut raw = Vec::new();
    raw.extend_from_slice(&1u64.to_le_bytes());
    raw.extend_from_slice(&1u64.to_le_bytes());
    raw.extend_from_slice(&1f64.to_le_bytes());
    raw.push(1);
    raw.push(b's');
    raw.extend_from_slice(&[0; 32]);
    raw.extend_from_slice(&1u32.to_le_bytes());
    raw.extend_from_slice(&1u16.to_le_bytes());
    raw.push(b'p');
    raw.extend_from_slice(&2u64.to_le_bytes());
    raw.extend_from_slice(&1f32.to_le_bytes());
    raw.extend_from_slice(&f32::INFINITY.to_le_bytes());
    let body = zstd::bulk::compress(&raw, 1).unwrap();
    let mut bytes = b"MRMRSNAP".to_vec();
    bytes.extend_from_slice(&1u16.to_le_bytes());
    bytes.extend_from_slice(&0u16.to_le_bytes());
    bytes.extend_from_slice(&(raw.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    let digest = Sha256::new()
        .chain_update(&bytes)
        .chain_update(&body)
        .finalize();
    bytes.extend_from_slice(&digest);
    bytes.extend_from_slice(&body);
    assert!(matches!(
        Snapshot::decode(&bytes, &SnapshotLimits::default()),
        Err(SnapshotError::NonFinite { index: 1, .. })
    ));
}

#[test]
fn a_lying_element_count_is_refused_without_allocating_it() {
    let mut raw = Vec::new();
    raw.extend_from_slice(&[0; 24]);
    raw.push(0);
    raw.extend_from_slice(&[0; 32]);
    raw.extend_from_slice(&1u32.to_le_bytes());
    raw.extend_from_slice(&1u16.to_le_bytes());
    raw.push(b'p');
    raw.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
    let body = zstd::bulk::compress(&raw, 1).unwrap();
    let mut bytes = b"MRMRSNAP".to_vec();
    bytes.extend_from_slice(&[1, 0, 0, 0]);
    bytes.extend_from_slice(&(raw.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    let digest = Sha256::new()
        .chain_update(&bytes)
        .chain_update(&body)
        .finalize();
    bytes.extend_from_slice(&digest);
    bytes.extend_from_slice(&body);
    assert!(matches!(
        Snapshot::decode(&bytes, &SnapshotLimits::default()),
        Err(SnapshotError::Malformed(_))
    ));
}

/// A snapshot written to a file from a borrowed view is byte for byte what `encode` gives,
/// at any offset in the file, and reads back from the file without reading past its end.
#[test]
fn a_snapshot_streamed_through_a_file_is_the_encoded_one() {
    let snapshot = sample();
    let encoded = snapshot.encode(3).unwrap();
    let mut file = Cursor::new(b"leading bytes".to_vec());
    file.seek(SeekFrom::End(0)).unwrap();
    let len = snapshot.view().write_to(&mut file, 3).unwrap();
    assert_eq!(len, encoded.len() as u64);
    assert_eq!(
        file.position(),
        13 + len,
        "the position is at the snapshot's end"
    );
    file.write_all(b"trailing").unwrap();
    let bytes = file.get_ref().clone();
    assert_eq!(&bytes[13..13 + encoded.len()], &encoded[..]);

    file.set_position(13);
    let read = read_snapshot(&mut file, &SnapshotLimits::default()).unwrap();
    assert_eq!(read, snapshot);
}

/// Read from a file, every truncation and every flipped bit is refused as from memory.
#[test]
fn a_torn_or_corrupt_file_is_refused() {
    let bytes = sample().encode(3).unwrap();
    for len in 0..bytes.len() {
        let result = read_snapshot(&mut Cursor::new(&bytes[..len]), &SnapshotLimits::default());
        assert!(
            matches!(result, Err(SnapshotError::Malformed(ref m)) if m.contains("torn write")),
            "prefix of {len} bytes gave {result:?}"
        );
    }
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0x10;
        let result = read_snapshot(&mut Cursor::new(bad), &SnapshotLimits::default());
        assert!(result.is_err(), "flipping a bit of byte {i} went unnoticed");
    }
}

/// A state that cannot be encoded writes nothing.
#[test]
fn a_non_finite_state_writes_no_byte() {
    let mut snapshot = sample();
    snapshot.tensors[1].data[3] = f32::NEG_INFINITY;
    let mut file = Cursor::new(Vec::new());
    assert!(matches!(
        snapshot.view().write_to(&mut file, 1),
        Err(SnapshotError::NonFinite { ref tensor, index: 3 }) if tensor == "adamw.m"
    ));
    assert!(file.get_ref().is_empty());
}
