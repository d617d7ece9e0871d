//! Messages: every message round-trips through a frame and the incremental decoder at
//! every split point, decoding borrows instead of allocating, and each kind of bad input
//! gets its specific error.

use murmur_protocol::codec::CodecSpec;
use murmur_protocol::frame::{Frame, FrameDecoder, FrameFlags, FrameLimits, HEADER_LEN};
use murmur_protocol::message::{
    AveragedChunk, ChunkAddress, HeartbeatBody, Message, PushSumShare, StateSyncResponse,
    TensorPartChunk, WireMessage,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

#[path = "support/allocation_counter.rs"]
mod allocation_counter;
#[path = "message/bad_input.rs"]
mod bad_input;
#[path = "message/rules.rs"]
mod rules;
#[path = "message/strategies.rs"]
mod strategies;

use allocation_counter::allocations_during;
use strategies::{heartbeat_body, message};

pub(crate) fn frame_of(message: &Message<'_>, flags: FrameFlags) -> Vec<u8> {
    let mut out = vec![0u8; message.frame_len()];
    let written = message
        .encode_frame(flags, &mut out)
        .expect("valid message encodes");
    assert_eq!(
        written,
        out.len(),
        "encode_frame wrote other than frame_len bytes"
    );
    out
}

pub(crate) fn payload_of<'a, M: WireMessage<'a>>(message: &M) -> Vec<u8> {
    let mut out = vec![0u8; message.encoded_len()];
    let written = message
        .encode_into(&mut out)
        .expect("valid message encodes");
    assert_eq!(written, out.len());
    out
}

/// Feeds `pieces` to a decoder and checks that the frames decode, in order, to `expected`
/// and re-encode to the bytes they came from.
fn check_stream<'p>(
    expected: &[Message<'_>],
    pieces: impl IntoIterator<Item = &'p [u8]>,
) -> Result<(), TestCaseError> {
    let mut decoder = FrameDecoder::new(FrameLimits::default());
    let mut expected = expected.iter();
    let mut reencoded = Vec::new();
    for piece in pieces {
        let mut input = piece;
        while let Some(frame) = decoder.decode(&mut input)? {
            let message = Message::from_frame(&frame)?;
            prop_assert_eq!(Some(&message), expected.next());
            reencoded.clear();
            reencoded.extend_from_slice(&frame.header().encode());
            reencoded.extend_from_slice(frame.payload());
            prop_assert_eq!(frame_of(&message, frame.flags()), reencoded.as_slice());
        }
    }
    decoder.finish()?;
    prop_assert_eq!(expected.next(), None, "frames missing");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    #[test]
    fn every_message_round_trips_at_every_split_point(message in message()) {
        let bytes = frame_of(&message, FrameFlags::EMPTY);
        prop_assert_eq!(bytes.len(), HEADER_LEN + message.encoded_len());
        let expected = [message];
        for split in 0..=bytes.len() {
            let (head, tail) = bytes.split_at(split);
            check_stream(&expected, [head, tail])?;
        }
        check_stream(&expected, bytes.chunks(1))?;
    }

    #[test]
    fn message_streams_round_trip_at_random_splits(
        messages in prop::collection::vec(message(), 1..6),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..10),
    ) {
        let last = messages.len() - 1;
        let mut stream = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            let flags = if index == last { FrameFlags::END_OF_STREAM } else { FrameFlags::EMPTY };
            stream.extend(frame_of(message, flags));
        }
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
        cuts.extend([0, stream.len()]);
        cuts.sort_unstable();
        check_stream(&messages, cuts.windows(2).map(|w| &stream[w[0]..w[1]]))?;
    }

    #[test]
    fn fuzz_entry_point_survives_mutated_streams(
        messages in prop::collection::vec(message(), 1..4),
        seed in any::<u8>(),
        mutations in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        // Valid frames with a few bytes overwritten reach the message decoders far more
        // often than random bytes do; whatever decodes must re-encode to the same bytes.
        let mut data = vec![seed];
        for message in &messages {
            data.extend(frame_of(message, FrameFlags::EMPTY));
        }
        for (index, byte) in mutations {
            let index = 1 + index.index(data.len() - 1);
            data[index] = byte;
        }
        murmur_protocol::fuzzing::frames_and_messages(&data);
    }

    #[test]
    fn heartbeat_bodies_round_trip(body in heartbeat_body()) {
        let bytes = body.to_bytes()?;
        prop_assert_eq!(HeartbeatBody::decode(&bytes)?, body);
        prop_assert_eq!(body.encoded_len(), HeartbeatBody::WIRE_LEN);
    }
}

pub(crate) fn sample_chunk(payload: &[u8]) -> TensorPartChunk<'_> {
    TensorPartChunk {
        address: ChunkAddress {
            group_id: 7,
            part: 2,
            chunk: 3,
            offset: 4096,
            elements: 2,
        },
        weight: 32.0,
        codec: CodecSpec::F32,
        payload,
    }
}

#[test]
fn tensor_chunk_layout_is_stable() {
    let payload = [1.5f32.to_le_bytes(), (-2.0f32).to_le_bytes()].concat();
    let bytes = payload_of(&sample_chunk(&payload));
    let expected = [
        &7u64.to_le_bytes()[..],
        &2u32.to_le_bytes(),
        &3u32.to_le_bytes(),
        &4096u64.to_le_bytes(),
        &2u32.to_le_bytes(),
        &32f32.to_le_bytes(),
        &CodecSpec::F32.to_wire(),
        &payload,
    ]
    .concat();
    assert_eq!(bytes, expected);
}

#[test]
fn decoded_tensor_messages_borrow_the_frame_and_allocate_nothing() {
    let payload = vec![9u8; 4096];
    let chunk = Message::from(sample_chunk(&payload));
    let averaged = Message::from(AveragedChunk {
        address: ChunkAddress {
            group_id: 1,
            part: 0,
            chunk: 0,
            offset: 0,
            elements: 1024,
        },
        contributors: 5,
        total_weight: 160.0,
        codec: CodecSpec::Int8 { block: 64 },
        payload: &payload,
    });
    let share = Message::from(PushSumShare {
        step: 10,
        chunk: 0,
        chunk_count: 1,
        offset: 0,
        elements: 1024,
        weight: 0.5,
        reference_step: Some(9),
        codec: CodecSpec::Bf16,
        payload: &payload,
    });
    let state = Message::from(StateSyncResponse {
        offset: 0,
        total_len: 4096,
        digest: [3; 32],
        last: true,
        payload: &payload,
    });
    for message in [chunk, averaged, share, state] {
        let bytes = frame_of(&message, FrameFlags::EMPTY);
        let (frame, _) = Frame::parse(&bytes, &FrameLimits::default()).expect("valid frame");
        let (decoded, allocations) = allocations_during(|| Message::from_frame(&frame));
        assert_eq!(allocations, 0, "decoding a {} allocated", message.kind());
        let decoded = decoded.expect("valid message");
        let borrowed = match decoded {
            Message::TensorPartChunk(m) => m.payload,
            Message::AveragedChunk(m) => m.payload,
            Message::PushSumShare(m) => m.payload,
            Message::StateSyncResponse(m) => m.payload,
            other => panic!("decoded as {}", other.kind()),
        };
        assert_eq!(borrowed, &payload[..]);
        assert!(
            std::ptr::eq(borrowed, &bytes[bytes.len() - payload.len()..]),
            "payload copied"
        );
    }
}
