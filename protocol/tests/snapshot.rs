//! Snapshots round-trip, and every torn, corrupted or hostile one is refused with its own
//! error before anything large is allocated.

use murmur_protocol::snapshot::{
    NamedTensor, SNAPSHOT_HEADER_LEN, Snapshot, SnapshotError, SnapshotLimits,
};
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
