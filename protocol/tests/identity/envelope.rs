//! Signed envelopes: round trip without copying the payload, and specific errors.

use murmur_protocol::identity::{
    EnvelopeError, MAX_ENVELOPE_PAYLOAD_LEN, PayloadType, SignedEnvelope,
};
use proptest::prelude::*;

use super::keypair;

#[test]
fn envelope_round_trips_borrowing_the_payload() {
    let author = keypair(3);
    let payload = b"step=42 samples_per_s=1830.5";
    let sealed = SignedEnvelope::seal(&author, PayloadType::HEARTBEAT, payload).expect("seal");
    assert_eq!(
        sealed.encoded_len(),
        SignedEnvelope::encoded_len_for(payload.len())
    );
    assert_eq!(
        (sealed.payload(), sealed.signer()),
        (&payload[..], author.peer_id())
    );

    let mut buf = vec![0u8; 1024];
    let n = SignedEnvelope::seal_into(&author, PayloadType::HEARTBEAT, payload, &mut buf)
        .expect("seal_into");
    assert_eq!(
        &buf[..n],
        sealed.as_bytes(),
        "ed25519 signing is deterministic"
    );

    let bytes = sealed.as_bytes();
    let view = SignedEnvelope::decode(bytes).expect("decode");
    assert_eq!(view.encoded_len(), bytes.len());
    let (signer, opened) = view.open(PayloadType::HEARTBEAT).expect("open");
    assert_eq!(signer, author.peer_id());
    assert_eq!(opened, payload);
    let within_input = bytes.as_ptr_range();
    assert!(
        within_input.contains(&opened.as_ptr()),
        "payload is borrowed, not copied"
    );
    assert_eq!(
        sealed.open(PayloadType::HEARTBEAT),
        Ok((author.peer_id(), &payload[..]))
    );

    let empty = SignedEnvelope::seal(&author, PayloadType(9), &[]).expect("empty payload");
    assert_eq!(empty.open(PayloadType(9)), Ok((author.peer_id(), &[][..])));
}

#[test]
fn tampered_envelope_is_bad_signature() {
    let author = keypair(3);
    let sealed = SignedEnvelope::seal(&author, PayloadType::HEARTBEAT, b"step=42").expect("seal");
    let bytes = sealed.into_bytes();
    let payload_at = 19 + 2 + 32 + 4;

    let mut payload = bytes.clone();
    payload[payload_at] ^= 0x20;
    let view = SignedEnvelope::decode(&payload).expect("decodes");
    assert_eq!(
        view.open(PayloadType::HEARTBEAT),
        Err(EnvelopeError::BadSignature)
    );

    let mut signature = bytes.clone();
    let last = signature.len() - 1;
    signature[last] ^= 0x01;
    let view = SignedEnvelope::decode(&signature).expect("decodes");
    assert_eq!(
        view.open(PayloadType::HEARTBEAT),
        Err(EnvelopeError::BadSignature)
    );

    // Re-typing the payload is caught by the signature too, not only by the type check.
    let mut retyped = bytes.clone();
    retyped[19] = 2;
    let view = SignedEnvelope::decode(&retyped).expect("decodes");
    assert_eq!(view.open(PayloadType(2)), Err(EnvelopeError::BadSignature));

    // Claiming another author.
    let mut impostor = bytes;
    impostor[21..53].copy_from_slice(&keypair(4).public().to_bytes());
    let view = SignedEnvelope::decode(&impostor).expect("decodes");
    assert_eq!(view.claimed_signer(), keypair(4).peer_id());
    assert_eq!(
        view.open(PayloadType::HEARTBEAT),
        Err(EnvelopeError::BadSignature)
    );
}

#[test]
fn envelope_of_another_type_is_wrong_payload_type() {
    let sealed = SignedEnvelope::seal(&keypair(3), PayloadType(7), b"x").expect("seal");
    assert_eq!(
        sealed.open(PayloadType::HEARTBEAT),
        Err(EnvelopeError::WrongPayloadType {
            expected: PayloadType::HEARTBEAT,
            found: PayloadType(7)
        })
    );
}

#[test]
fn malformed_envelopes_give_specific_errors() {
    let author = keypair(3);
    let bytes = SignedEnvelope::seal(&author, PayloadType::HEARTBEAT, b"step=42")
        .expect("seal")
        .into_bytes();

    for len in 0..bytes.len() {
        assert!(
            matches!(
                SignedEnvelope::decode(&bytes[..len]),
                Err(EnvelopeError::Truncated(_))
            ),
            "prefix of {len} bytes"
        );
    }
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert_eq!(
        SignedEnvelope::decode(&trailing),
        Err(EnvelopeError::TrailingBytes { count: 1 })
    );
    assert_eq!(
        SignedEnvelope::decode(b"murmur/invite/v1\0 and more"),
        Err(EnvelopeError::UnknownFormat)
    );

    let mut huge = bytes;
    huge[53..57].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        SignedEnvelope::decode(&huge),
        Err(EnvelopeError::PayloadTooLong {
            len: u32::MAX as usize,
            max: MAX_ENVELOPE_PAYLOAD_LEN
        })
    );

    let too_long = vec![0u8; MAX_ENVELOPE_PAYLOAD_LEN + 1];
    assert_eq!(
        SignedEnvelope::seal(&author, PayloadType::HEARTBEAT, &too_long),
        Err(EnvelopeError::PayloadTooLong {
            len: MAX_ENVELOPE_PAYLOAD_LEN + 1,
            max: MAX_ENVELOPE_PAYLOAD_LEN
        })
    );
    let largest = &too_long[1..];
    let sealed = SignedEnvelope::seal(&author, PayloadType::HEARTBEAT, largest).expect("max");
    assert_eq!(
        sealed.open(PayloadType::HEARTBEAT),
        Ok((author.peer_id(), largest))
    );

    let mut small = [0u8; 64];
    assert!(matches!(
        SignedEnvelope::seal_into(&author, PayloadType::HEARTBEAT, b"x", &mut small),
        Err(EnvelopeError::BufferTooSmall(err))
            if err.needed == SignedEnvelope::encoded_len_for(1) && err.available == 64
    ));
}

proptest! {
    /// Changing any byte of a valid envelope makes it fail to decode or to open.
    #[test]
    fn any_altered_envelope_byte_is_refused(index in any::<prop::sample::Index>(), flip in 1u8..) {
        let sealed = SignedEnvelope::seal(&keypair(3), PayloadType::HEARTBEAT, b"step=7")
            .expect("small payload");
        let mut bytes = sealed.into_bytes();
        let at = index.index(bytes.len());
        bytes[at] ^= flip;
        if let Ok(view) = SignedEnvelope::decode(&bytes) {
            prop_assert!(view.open(PayloadType::HEARTBEAT).is_err());
        }
    }
}
