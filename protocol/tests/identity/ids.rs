//! Keys, peer ids (against libp2p) and swarm ids.

use std::str::FromStr;

use murmur_protocol::identity::{Keypair, PeerId, PeerIdError, PublicKey, SwarmId, SwarmIdError};
use proptest::prelude::*;

use super::{keypair, swarm};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Our peer id is libp2p's, as text and as bytes, and each parses the other's.
    #[test]
    fn peer_id_is_libp2p_peer_id(seed in any::<[u8; 32]>()) {
        let ours = Keypair::from_seed(seed).peer_id();
        let theirs = libp2p_identity::Keypair::ed25519_from_bytes(seed)
            .expect("any 32 bytes are an ed25519 seed")
            .public()
            .to_peer_id();

        prop_assert_eq!(ours.to_string(), theirs.to_base58());
        prop_assert_eq!(ours.to_bytes().to_vec(), theirs.to_bytes());
        prop_assert!(ours.to_string().starts_with("12D3KooW"));
        prop_assert_eq!(PeerId::from_str(&theirs.to_base58()), Ok(ours));
        prop_assert_eq!(PeerId::from_bytes(&theirs.to_bytes()), Ok(ours));
        prop_assert_eq!(
            libp2p_identity::PeerId::from_str(&ours.to_string()).expect("libp2p parses ours"),
            theirs
        );
    }

    /// The same seed signs the same bytes in libp2p and here, and the peer id gives back the
    /// key that verifies them.
    #[test]
    fn seed_and_signatures_match_libp2p(seed in any::<[u8; 32]>(), message in any::<Vec<u8>>()) {
        let ours = Keypair::from_seed(seed);
        let theirs = libp2p_identity::Keypair::ed25519_from_bytes(seed)
            .expect("any 32 bytes are an ed25519 seed");
        let signature = ours.sign(&message);
        prop_assert_eq!(
            signature.to_bytes().to_vec(),
            theirs.sign(&message).expect("ed25519 signing cannot fail")
        );
        let recovered = ours.peer_id().public_key();
        prop_assert_eq!(recovered, ours.public());
        prop_assert_eq!(recovered.verify(&message, &signature), Ok(()));
    }
}

#[test]
fn generated_keys_differ_and_have_libp2p_ids() {
    let a = Keypair::generate().expect("the OS has a random number generator");
    let b = Keypair::generate().expect("the OS has a random number generator");
    assert_ne!(a.peer_id(), b.peer_id());
    assert!(a.peer_id().to_string().starts_with("12D3KooW"));
}

#[test]
fn keypair_debug_shows_the_peer_id_and_hides_the_secret() {
    let keypair = Keypair::from_seed([0xab; 32]);
    assert_eq!(
        format!("{keypair:?}"),
        format!(
            "Keypair {{ peer_id: PeerId({}), secret: \"<redacted>\" }}",
            keypair.peer_id()
        )
    );
}

#[test]
fn peer_id_parse_errors_are_specific() {
    assert_eq!(PeerId::from_str(""), Err(PeerIdError::Empty));
    let valid = keypair(9).peer_id().to_string();
    let with_zero = format!("{}0{}", &valid[..10], &valid[11..]);
    assert_eq!(
        PeerId::from_str(&with_zero),
        Err(PeerIdError::InvalidCharacter {
            ch: '0',
            position: 10
        })
    );
    assert!(matches!(
        PeerId::from_str(&format!("{valid}{valid}")),
        Err(PeerIdError::TooLong { len: 104, max: 52 })
    ));
    // An RSA-style id: a sha2-256 multihash of the key.
    assert_eq!(
        PeerId::from_str("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"),
        Err(PeerIdError::UnsupportedMultihash { code: 0x12 })
    );
}

#[test]
fn peer_id_byte_errors_are_specific() {
    let good = keypair(9).peer_id().to_bytes();

    // secp256k1: identity multihash of a 37-byte protobuf with KeyType 2.
    let mut secp = vec![0x00, 0x25, 0x08, 0x02, 0x12, 0x21];
    secp.extend_from_slice(&[2; 33]);
    assert_eq!(
        PeerId::from_bytes(&secp),
        Err(PeerIdError::UnsupportedKeyType { key_type: 2 })
    );

    assert_eq!(
        PeerId::from_bytes(&good[..37]),
        Err(PeerIdError::Malformed { len: 37 })
    );
    let mut long = good.to_vec();
    long.push(0);
    assert_eq!(
        PeerId::from_bytes(&long),
        Err(PeerIdError::Malformed { len: 39 })
    );
    let mut wrong_len = good;
    wrong_len[5] = 31;
    assert_eq!(
        PeerId::from_bytes(&wrong_len),
        Err(PeerIdError::Malformed { len: 38 })
    );
    assert_eq!(
        PeerId::from_bytes(&[]),
        Err(PeerIdError::Malformed { len: 0 })
    );

    // About half of all 32-byte strings are not curve points; find one.
    let not_a_point = (0u8..=255)
        .map(|b| [b; 32])
        .find(|bytes| PublicKey::from_bytes(bytes).is_err())
        .expect("some constant byte string is not a curve point");
    let mut bad_key = good;
    bad_key[6..].copy_from_slice(&not_a_point);
    assert_eq!(PeerId::from_bytes(&bad_key), Err(PeerIdError::InvalidKey));
}

#[test]
fn swarm_ids_are_validated() {
    for ok in ["a", "gpt2-small.run-3", "0_x", &"z".repeat(64)] {
        assert_eq!(swarm(ok).as_str(), ok);
    }
    assert_eq!(SwarmId::new(""), Err(SwarmIdError::Empty));
    assert_eq!(
        SwarmId::new("a".repeat(65)),
        Err(SwarmIdError::TooLong { len: 65, max: 64 })
    );
    assert_eq!(
        SwarmId::new("runA"),
        Err(SwarmIdError::InvalidCharacter {
            ch: 'A',
            position: 3
        })
    );
    assert_eq!(
        SwarmId::new("run/1"),
        Err(SwarmIdError::InvalidCharacter {
            ch: '/',
            position: 3
        })
    );
    assert_eq!(
        SwarmId::new("ré"),
        Err(SwarmIdError::InvalidCharacter {
            ch: 'é',
            position: 1
        })
    );
    assert_eq!(
        SwarmId::new("-run"),
        Err(SwarmIdError::InvalidStart { ch: '-' })
    );
    assert_eq!(
        SwarmId::from_bytes(b"run\xff"),
        Err(SwarmIdError::InvalidCharacter {
            ch: '\u{fffd}',
            position: 3
        })
    );
}
