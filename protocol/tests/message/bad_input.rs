//! Bad input: one test per kind of malformed message, each asserting the specific error.

use murmur_protocol::codec::{CodecError, CodecSpec};
use murmur_protocol::frame::FrameFlags;
use murmur_protocol::frame::FrameKind;
use murmur_protocol::message::{
    AuthHello, AveragedChunk, AveragingMode, ChunkAddress, GroupBegin, GroupMember, GroupReject,
    GroupRejectReason, Heartbeat, HeartbeatBody, JoinGroup, MAX_GROUP_MEMBERS,
    MAX_HEARTBEAT_ENVELOPE_LEN, MAX_HELLO_INVITE_LEN, MAX_PEER_ID_LEN, MAX_REJECT_TEXT_LEN,
    Message, MessageError, PushSumShare, Reject, RejectCode, ShareCancel, ShareOutcome,
    ShareReceipt, ShareRefused, StateSyncRequest, TensorPartChunk, WireMessage,
};

use super::allocation_counter::allocations_during;
use super::{payload_of, sample_chunk};

fn with_trailing_byte(mut bytes: Vec<u8>) -> Vec<u8> {
    bytes.push(0);
    bytes
}

#[test]
fn trailing_bytes_are_rejected() {
    let join = JoinGroup {
        round: 1,
        deadline_ms: 2,
        bandwidth_bytes_per_s: 3,
        accepts_connections: true,
        samples: 4,
    };
    let hello = AuthHello {
        min_version: 1,
        max_version: 1,
        public_key: [1; 32],
        nonce: [2; 32],
        invite: b"invite",
    };
    let request = StateSyncRequest {
        from_offset: 0,
        max_bytes: 1,
        expected_digest: [0; 32],
    };
    let reject = Reject {
        code: RejectCode::Busy,
        text: "later",
    };
    let group_reject = GroupReject {
        round: 3,
        reason: GroupRejectReason::GroupFull,
    };
    let begin = GroupBegin {
        round: 1,
        group_id: 2,
        members: vec![GroupMember {
            peer_id: b"peer",
            part_elements: 10,
        }],
    };
    let refused = ShareRefused {
        step: 9,
        reference_step: 4,
    };
    let receipt = ShareReceipt {
        step: 9,
        outcome: ShareOutcome::Cancelled,
    };
    let cases: [(FrameKind, Vec<u8>); 10] = [
        (FrameKind::JoinGroup, payload_of(&join)),
        (FrameKind::AuthHello, payload_of(&hello)),
        (
            FrameKind::Heartbeat,
            payload_of(&Heartbeat {
                envelope: b"signed",
            }),
        ),
        (FrameKind::StateSyncRequest, payload_of(&request)),
        (FrameKind::Reject, payload_of(&reject)),
        (FrameKind::GroupReject, payload_of(&group_reject)),
        (FrameKind::GroupBegin, payload_of(&begin)),
        (FrameKind::ShareRefused, payload_of(&refused)),
        (FrameKind::ShareReceipt, payload_of(&receipt)),
        (FrameKind::ShareCancel, payload_of(&ShareCancel { step: 9 })),
    ];
    for (kind, payload) in cases {
        assert!(Message::decode(kind, &payload).is_ok());
        assert_eq!(
            Message::decode(kind, &with_trailing_byte(payload)),
            Err(MessageError::TrailingBytes { kind, extra: 1 })
        );
    }
    let body = HeartbeatBody {
        step: 1,
        timestamp_ms: 2,
        samples_per_s: 3.0,
        upload_bytes_per_s: 4,
        download_bytes_per_s: 5,
        mode: AveragingMode::Sgp,
        samples_accumulated: 6,
        looking_round: 0,
        looking_until_ms: 0,
        incarnation: 1,
    };
    let bytes = body.to_bytes().expect("valid").to_vec();
    assert_eq!(
        HeartbeatBody::decode(&with_trailing_byte(bytes)),
        Err(MessageError::TrailingBytes {
            kind: FrameKind::Heartbeat,
            extra: 1
        })
    );
}

#[test]
fn truncated_messages_name_the_missing_field() {
    let bytes = payload_of(&sample_chunk(&[]));
    assert_eq!(
        TensorPartChunk::decode(&bytes[..30]),
        Err(MessageError::Truncated {
            field: "weight",
            needed: 4,
            remaining: 2
        })
    );
    assert_eq!(
        JoinGroup::decode(&[0; 24]),
        Err(MessageError::Truncated {
            field: "accepts_connections",
            needed: 1,
            remaining: 0
        })
    );
}

#[test]
fn non_finite_weights_are_rejected() {
    let mut bytes = payload_of(&sample_chunk(&[0; 8]));
    for (bad, name) in [
        (f32::NAN, "NaN"),
        (f32::INFINITY, "+inf"),
        (f32::NEG_INFINITY, "-inf"),
    ] {
        bytes[28..32].copy_from_slice(&bad.to_le_bytes());
        let error = TensorPartChunk::decode(&bytes).expect_err(name);
        assert!(
            matches!(error, MessageError::NonFinite { field: "weight", value } if value.to_bits() == f64::from(bad).to_bits()),
            "{name}: {error:?}"
        );
    }

    let averaged = AveragedChunk {
        address: ChunkAddress {
            group_id: 1,
            part: 0,
            chunk: 0,
            offset: 0,
            elements: 0,
        },
        contributors: 1,
        total_weight: 1.0,
        codec: CodecSpec::F32,
        payload: &[],
    };
    let mut bytes = payload_of(&averaged);
    bytes[32..36].copy_from_slice(&f32::NAN.to_le_bytes());
    assert!(matches!(
        AveragedChunk::decode(&bytes),
        Err(MessageError::NonFinite {
            field: "total_weight",
            ..
        })
    ));

    let share = PushSumShare {
        step: 1,
        chunk: 0,
        chunk_count: 1,
        offset: 0,
        elements: 0,
        weight: 0.5,
        reference_step: None,
        codec: CodecSpec::F32,
        payload: &[],
    };
    let mut bytes = payload_of(&share);
    bytes[28..36].copy_from_slice(&f64::INFINITY.to_le_bytes());
    assert_eq!(
        PushSumShare::decode(&bytes),
        Err(MessageError::NonFinite {
            field: "weight",
            value: f64::INFINITY
        })
    );

    let body = HeartbeatBody {
        step: 1,
        timestamp_ms: 2,
        samples_per_s: f32::NAN,
        upload_bytes_per_s: 4,
        download_bytes_per_s: 5,
        mode: AveragingMode::Butterfly,
        samples_accumulated: 6,
        looking_round: 0,
        looking_until_ms: 0,
        incarnation: 1,
    };
    assert!(matches!(
        body.to_bytes(),
        Err(MessageError::NonFinite {
            field: "samples_per_s",
            ..
        })
    ));
}

#[test]
fn encoding_runs_the_decoder_checks_and_writes_nothing_on_error() {
    let bad = TensorPartChunk {
        weight: f32::NAN,
        ..sample_chunk(&[0; 8])
    };
    let mut out = vec![0xEEu8; 64];
    assert!(matches!(
        bad.encode_into(&mut out),
        Err(MessageError::NonFinite {
            field: "weight",
            ..
        })
    ));
    assert!(matches!(
        Message::from(bad).encode_frame(FrameFlags::EMPTY, &mut out),
        Err(MessageError::NonFinite {
            field: "weight",
            ..
        })
    ));
    assert!(
        out.iter().all(|&b| b == 0xEE),
        "bytes written for an invalid message"
    );

    let negative = TensorPartChunk {
        weight: -1.0,
        ..sample_chunk(&[0; 8])
    };
    assert_eq!(
        negative.encode_into(&mut out),
        Err(MessageError::InvalidField {
            field: "weight",
            reason: "must not be negative"
        })
    );
}

#[test]
fn small_buffers_are_reported() {
    let chunk = Message::from(sample_chunk(&[0; 8]));
    let mut out = vec![0u8; chunk.frame_len() - 1];
    assert_eq!(
        chunk.encode_frame(FrameFlags::EMPTY, &mut out),
        Err(MessageError::BufferTooSmall {
            needed: chunk.frame_len(),
            available: out.len()
        })
    );
    assert_eq!(
        chunk.encode_into(&mut out[..chunk.encoded_len() - 1]),
        Err(MessageError::BufferTooSmall {
            needed: chunk.encoded_len(),
            available: chunk.encoded_len() - 1
        })
    );
}

#[test]
fn undefined_enum_values_are_rejected() {
    let mut reject = payload_of(&Reject {
        code: RejectCode::Internal,
        text: "",
    });
    reject[0] = 0;
    assert_eq!(
        Reject::decode(&reject),
        Err(MessageError::InvalidEnum {
            field: "code",
            value: 0
        })
    );
    reject[0] = 11;
    assert_eq!(
        Reject::decode(&reject),
        Err(MessageError::InvalidEnum {
            field: "code",
            value: 11
        })
    );

    let mut group_reject = payload_of(&GroupReject {
        round: 1,
        reason: GroupRejectReason::RoundClosed,
    });
    group_reject[8] = 5;
    assert_eq!(
        GroupReject::decode(&group_reject),
        Err(MessageError::InvalidEnum {
            field: "reason",
            value: 5
        })
    );

    for value in [0, 3, 255] {
        let mut receipt = payload_of(&ShareReceipt {
            step: 1,
            outcome: ShareOutcome::Applied,
        });
        receipt[8] = value;
        assert_eq!(
            ShareReceipt::decode(&receipt),
            Err(MessageError::InvalidEnum {
                field: "outcome",
                value
            })
        );
    }

    let body = HeartbeatBody {
        step: 0,
        timestamp_ms: 0,
        samples_per_s: 0.0,
        upload_bytes_per_s: 0,
        download_bytes_per_s: 0,
        mode: AveragingMode::SyncRing,
        samples_accumulated: 0,
        looking_round: 0,
        looking_until_ms: 0,
        incarnation: 1,
    };
    let mut bytes = body.to_bytes().expect("valid");
    bytes[36] = 9;
    assert_eq!(
        HeartbeatBody::decode(&bytes),
        Err(MessageError::InvalidEnum {
            field: "mode",
            value: 9
        })
    );

    let join = JoinGroup {
        round: 0,
        deadline_ms: 0,
        bandwidth_bytes_per_s: 0,
        accepts_connections: false,
        samples: 0,
    };
    let mut bytes = payload_of(&join);
    bytes[24] = 2;
    assert_eq!(
        JoinGroup::decode(&bytes),
        Err(MessageError::InvalidEnum {
            field: "accepts_connections",
            value: 2
        })
    );
}

#[test]
fn non_canonical_encodings_are_rejected() {
    // An absent reference step must be all zeros, so that each value has one byte form.
    let share = PushSumShare {
        step: 1,
        chunk: 0,
        chunk_count: 1,
        offset: 0,
        elements: 0,
        weight: 1.0,
        reference_step: None,
        codec: CodecSpec::F32,
        payload: &[],
    };
    let mut bytes = payload_of(&share);
    bytes[37] = 1;
    assert_eq!(
        PushSumShare::decode(&bytes),
        Err(MessageError::InvalidField {
            field: "reference_step",
            reason: "absent but not zero"
        })
    );
    bytes[36] = 2;
    assert_eq!(
        PushSumShare::decode(&bytes),
        Err(MessageError::InvalidEnum {
            field: "reference_step",
            value: 2
        })
    );
}

#[test]
fn invalid_codecs_are_rejected() {
    let mut bytes = payload_of(&sample_chunk(&[]));
    bytes[32] = 99;
    assert_eq!(
        TensorPartChunk::decode(&bytes),
        Err(MessageError::Codec(CodecError::UnknownCodec { id: 99 }))
    );
    // int8 with a block size that is not a multiple of 8.
    bytes[32..37].copy_from_slice(&[4, 33, 0, 0, 0]);
    assert!(matches!(
        TensorPartChunk::decode(&bytes),
        Err(MessageError::Codec(CodecError::InvalidSpec { .. }))
    ));
}

#[test]
fn over_long_member_counts_are_rejected_before_allocating() {
    let mut bytes = vec![0u8; 16];
    let count = u16::try_from(MAX_GROUP_MEMBERS + 1).expect("fits");
    bytes.extend_from_slice(&count.to_le_bytes());
    let (result, allocations) = allocations_during(|| GroupBegin::decode(&bytes));
    assert_eq!(
        result,
        Err(MessageError::TooLong {
            field: "members",
            len: MAX_GROUP_MEMBERS + 1,
            max: MAX_GROUP_MEMBERS
        })
    );
    assert_eq!(allocations, 0);

    // A count within bounds, but without the bytes for that many members.
    let mut bytes = vec![0u8; 16];
    bytes.extend_from_slice(
        &u16::try_from(MAX_GROUP_MEMBERS)
            .expect("fits")
            .to_le_bytes(),
    );
    bytes.extend_from_slice(&[0; 50]);
    let (result, allocations) = allocations_during(|| GroupBegin::decode(&bytes));
    assert_eq!(
        result,
        Err(MessageError::Truncated {
            field: "members",
            needed: MAX_GROUP_MEMBERS * 10,
            remaining: 50
        })
    );
    assert_eq!(allocations, 0);
}

#[test]
fn over_long_fields_are_rejected_before_reading_them() {
    // Each length prefix claims one byte over the bound and no bytes follow: the bound is
    // reported, not the truncation.
    let mut hello = payload_of(&AuthHello {
        min_version: 1,
        max_version: 2,
        public_key: [0; 32],
        nonce: [0; 32],
        invite: b"x",
    });
    hello.truncate(66);
    hello.extend_from_slice(
        &u16::try_from(MAX_HELLO_INVITE_LEN + 1)
            .expect("fits")
            .to_le_bytes(),
    );
    assert_eq!(
        AuthHello::decode(&hello),
        Err(MessageError::TooLong {
            field: "invite",
            len: MAX_HELLO_INVITE_LEN + 1,
            max: MAX_HELLO_INVITE_LEN
        })
    );

    let envelope = u16::try_from(MAX_HEARTBEAT_ENVELOPE_LEN + 1)
        .expect("fits")
        .to_le_bytes();
    assert_eq!(
        Heartbeat::decode(&envelope),
        Err(MessageError::TooLong {
            field: "envelope",
            len: MAX_HEARTBEAT_ENVELOPE_LEN + 1,
            max: MAX_HEARTBEAT_ENVELOPE_LEN
        })
    );

    let mut reject = vec![RejectCode::Busy.to_byte()];
    reject.extend_from_slice(
        &u16::try_from(MAX_REJECT_TEXT_LEN + 1)
            .expect("fits")
            .to_le_bytes(),
    );
    assert_eq!(
        Reject::decode(&reject),
        Err(MessageError::TooLong {
            field: "text",
            len: MAX_REJECT_TEXT_LEN + 1,
            max: MAX_REJECT_TEXT_LEN
        })
    );

    let mut begin = vec![0u8; 16];
    begin.extend_from_slice(&1u16.to_le_bytes());
    begin.push(u8::try_from(MAX_PEER_ID_LEN + 1).expect("fits"));
    begin.extend_from_slice(&[0; 9]);
    assert_eq!(
        GroupBegin::decode(&begin),
        Err(MessageError::TooLong {
            field: "peer_id",
            len: MAX_PEER_ID_LEN + 1,
            max: MAX_PEER_ID_LEN
        })
    );

    let long_text = "x".repeat(MAX_REJECT_TEXT_LEN + 1);
    let mut out = vec![0u8; 512];
    assert_eq!(
        Reject {
            code: RejectCode::Internal,
            text: &long_text
        }
        .encode_into(&mut out),
        Err(MessageError::TooLong {
            field: "text",
            len: MAX_REJECT_TEXT_LEN + 1,
            max: MAX_REJECT_TEXT_LEN
        })
    );
}

#[test]
fn reject_text_must_be_utf8() {
    let mut bytes = payload_of(&Reject {
        code: RejectCode::WrongSwarm,
        text: "ab",
    });
    bytes[3] = 0xFF;
    assert_eq!(
        Reject::decode(&bytes),
        Err(MessageError::InvalidUtf8 { field: "text" })
    );
}
