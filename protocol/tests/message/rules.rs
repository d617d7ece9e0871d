//! The rules messages enforce beyond their byte layout: ranges, and fields that must agree
//! with each other. The encoder and the decoder enforce the same ones.

use murmur_protocol::codec::CodecSpec;
use murmur_protocol::frame::{Frame, FrameError, FrameFlags, FrameKind, FrameLimits};
use murmur_protocol::message::{
    AuthHello, AveragedChunk, GroupBegin, GroupMember, MAX_HEARTBEAT_ENVELOPE_LEN,
    MAX_HELLO_INVITE_LEN, Message, MessageError, PushSumShare, Reject, RejectCode,
    StateSyncRequest, StateSyncResponse, TensorPartChunk, WireMessage,
};

use super::{frame_of, payload_of, sample_chunk};

#[test]
fn group_begin_rules_are_enforced() {
    let mut out = vec![0u8; 256];
    let empty = GroupBegin {
        round: 1,
        group_id: 1,
        members: vec![],
    };
    assert!(matches!(
        empty.encode_into(&mut out),
        Err(MessageError::InvalidField {
            field: "members",
            ..
        })
    ));

    let twice = GroupBegin {
        round: 1,
        group_id: 1,
        members: vec![
            GroupMember {
                peer_id: b"a",
                part_elements: 1,
            },
            GroupMember {
                peer_id: b"b",
                part_elements: 1,
            },
            GroupMember {
                peer_id: b"a",
                part_elements: 1,
            },
        ],
    };
    assert_eq!(
        twice.encode_into(&mut out),
        Err(MessageError::InvalidField {
            field: "peer_id",
            reason: "the same peer is listed twice"
        })
    );
    // The same check on the wire: encode with distinct ids, then make two equal.
    let distinct = GroupBegin {
        members: vec![
            GroupMember {
                peer_id: b"a",
                part_elements: 1,
            },
            GroupMember {
                peer_id: b"b",
                part_elements: 1,
            },
        ],
        ..twice.clone()
    };
    let mut bytes = payload_of(&distinct);
    bytes[19 + 1 + 8 + 1] = b'a';
    assert_eq!(
        GroupBegin::decode(&bytes),
        Err(MessageError::InvalidField {
            field: "peer_id",
            reason: "the same peer is listed twice"
        })
    );

    let overflow = GroupBegin {
        round: 1,
        group_id: 1,
        members: vec![
            GroupMember {
                peer_id: b"a",
                part_elements: u64::MAX,
            },
            GroupMember {
                peer_id: b"b",
                part_elements: 1,
            },
        ],
    };
    assert!(matches!(
        overflow.encode_into(&mut out),
        Err(MessageError::InvalidField {
            field: "part_elements",
            ..
        })
    ));
    assert_eq!(distinct.total_elements(), Some(2));
}

#[test]
fn push_sum_share_rules_are_enforced() {
    let valid = PushSumShare {
        step: 1,
        chunk: 2,
        chunk_count: 3,
        offset: 0,
        elements: 0,
        weight: 0.25,
        reference_step: Some(0),
        codec: CodecSpec::F32,
        payload: &[],
    };
    let mut out = vec![0u8; 128];
    assert!(valid.encode_into(&mut out).is_ok());
    let cases = [
        (PushSumShare { chunk: 3, ..valid }, "chunk"),
        (
            PushSumShare {
                chunk: 0,
                chunk_count: 0,
                ..valid
            },
            "chunk_count",
        ),
        (
            PushSumShare {
                weight: 0.0,
                ..valid
            },
            "weight",
        ),
        (
            PushSumShare {
                weight: -0.5,
                ..valid
            },
            "weight",
        ),
        (
            PushSumShare {
                offset: u64::MAX,
                elements: 1,
                ..valid
            },
            "offset",
        ),
    ];
    for (share, field) in cases {
        assert!(
            matches!(share.encode_into(&mut out), Err(MessageError::InvalidField { field: f, .. }) if f == field),
            "{share:?}"
        );
    }
}

#[test]
fn state_sync_rules_are_enforced() {
    let mut out = vec![0u8; 128];
    let request = StateSyncRequest {
        from_offset: 0,
        max_bytes: 0,
        expected_digest: [0; 32],
    };
    assert!(matches!(
        request.encode_into(&mut out),
        Err(MessageError::InvalidField {
            field: "max_bytes",
            ..
        })
    ));
    assert!(
        StateSyncRequest {
            max_bytes: 1,
            ..request
        }
        .accepts_any_snapshot()
    );

    let valid = StateSyncResponse {
        offset: 10,
        total_len: 14,
        digest: [1; 32],
        last: true,
        payload: b"abcd",
    };
    let mut bytes = payload_of(&valid);
    bytes[48] = 0;
    assert!(matches!(
        StateSyncResponse::decode(&bytes),
        Err(MessageError::InvalidField { field: "last", .. })
    ));
    let past_end = StateSyncResponse {
        total_len: 13,
        ..valid
    };
    assert!(matches!(
        past_end.encode_into(&mut out),
        Err(MessageError::InvalidField {
            field: "payload",
            ..
        })
    ));
    let overflow = StateSyncResponse {
        offset: u64::MAX,
        total_len: u64::MAX,
        ..valid
    };
    assert!(matches!(
        overflow.encode_into(&mut out),
        Err(MessageError::InvalidField {
            field: "payload",
            ..
        })
    ));
}

#[test]
fn auth_hello_version_range_is_checked() {
    let hello = AuthHello {
        min_version: 2,
        max_version: 1,
        public_key: [0; 32],
        nonce: [0; 32],
        invite: b"i",
    };
    let mut out = vec![0u8; 128];
    assert!(matches!(
        hello.encode_into(&mut out),
        Err(MessageError::InvalidField {
            field: "max_version",
            ..
        })
    ));
    let zero = AuthHello {
        min_version: 0,
        max_version: 1,
        ..hello
    };
    assert!(matches!(
        zero.encode_into(&mut out),
        Err(MessageError::InvalidField {
            field: "min_version",
            ..
        })
    ));
    let no_invite = AuthHello {
        min_version: 1,
        max_version: 1,
        invite: b"",
        ..hello
    };
    assert!(matches!(
        no_invite.encode_into(&mut out),
        Err(MessageError::InvalidField {
            field: "invite",
            ..
        })
    ));
}

#[test]
fn a_frame_of_another_kind_is_refused() {
    let bytes = frame_of(&Message::from(sample_chunk(&[])), FrameFlags::EMPTY);
    let (frame, _) = Frame::parse(&bytes, &FrameLimits::default()).expect("valid");
    assert_eq!(
        AveragedChunk::from_frame(&frame),
        Err(MessageError::KindMismatch {
            expected: FrameKind::AveragedChunk,
            found: FrameKind::TensorPartChunk
        })
    );
    assert!(TensorPartChunk::from_frame(&frame).is_ok());
}

#[test]
fn fuzz_entry_point_accepts_valid_streams_and_garbage() {
    let messages = [
        Message::from(sample_chunk(&[1, 2, 3, 4, 5, 6, 7, 8])),
        Message::from(Reject {
            code: RejectCode::Shutdown,
            text: "bye",
        }),
    ];
    let mut data = vec![5u8];
    for message in &messages {
        data.extend(frame_of(message, FrameFlags::EMPTY));
    }
    murmur_protocol::fuzzing::frames_and_messages(&data);
    murmur_protocol::fuzzing::frames_and_messages(&[]);
    murmur_protocol::fuzzing::frames_and_messages(&[0xFF; 100]);
    data.truncate(data.len() - 1);
    murmur_protocol::fuzzing::frames_and_messages(&data);
}

// Whatever identity encodes must fit the message fields that carry it: an invite in a hello,
// a signed heartbeat body in a heartbeat. Checked when the tests compile.
const _: () = assert!(MAX_HELLO_INVITE_LEN >= murmur_protocol::identity::MAX_INVITE_LEN);
const _: () = assert!(
    MAX_HEARTBEAT_ENVELOPE_LEN
        >= murmur_protocol::identity::SignedEnvelope::encoded_len_for(
            murmur_protocol::message::HeartbeatBody::WIRE_LEN
        )
);

#[test]
fn messages_too_large_for_any_frame_are_refused() {
    let limit = FrameLimits::HARD_MAX_PAYLOAD;
    let payload = vec![0u8; usize::try_from(limit).expect("fits")];
    let total_len = u64::from(limit);
    let state = Message::from(StateSyncResponse {
        offset: 0,
        total_len,
        digest: [0; 32],
        last: true,
        payload: &payload,
    });
    // The size is checked before the buffer is, so a small buffer is enough to learn it.
    let mut out = [0u8; 64];
    assert_eq!(
        state.encode_frame(FrameFlags::EMPTY, &mut out),
        Err(MessageError::Frame(FrameError::PayloadTooLarge {
            len: u64::try_from(state.encoded_len()).expect("fits"),
            limit,
        }))
    );
}
