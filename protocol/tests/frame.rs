//! Frames: the header's wire layout, the incremental decoder at every split point, and one
//! test per kind of bad input, each asserting the specific error.

use murmur_protocol::frame::{
    Frame, FrameDecoder, FrameError, FrameFlags, FrameHeader, FrameKind, FrameLimits,
    FrameLimitsError, HEADER_LEN, MAGIC, VERSION, encode_header,
};
use proptest::prelude::*;

#[path = "support/allocation_counter.rs"]
mod allocation_counter;

use allocation_counter::allocations_during;

fn frame_bytes(kind: FrameKind, flags: FrameFlags, payload: &[u8]) -> Vec<u8> {
    let mut header = [0u8; HEADER_LEN];
    encode_header(kind, flags, payload.len(), &mut header).expect("payload within hard max");
    let mut bytes = header.to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

/// A header with arbitrary fields, checked or not.
fn raw_header(magic: [u8; 4], version: u8, kind: u8, flags: u16, len: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&magic);
    h[4] = version;
    h[5] = kind;
    h[6..8].copy_from_slice(&flags.to_le_bytes());
    h[8..].copy_from_slice(&len.to_le_bytes());
    h
}

type Decoded = (FrameKind, FrameFlags, Vec<u8>);

/// Feeds `pieces` in order and collects every frame, checking that the decoder's buffer
/// never exceeds its limit.
fn decode_pieces<'p>(
    decoder: &mut FrameDecoder,
    pieces: impl IntoIterator<Item = &'p [u8]>,
) -> Result<Vec<Decoded>, FrameError> {
    let max = decoder.limits().max_frame_len();
    let mut frames = Vec::new();
    for piece in pieces {
        let mut input = piece;
        while let Some(frame) = decoder.decode(&mut input)? {
            frames.push((frame.kind(), frame.flags(), frame.payload().to_vec()));
        }
        assert!(input.is_empty(), "Ok(None) left input unconsumed");
        assert!(
            decoder.buffer_capacity() <= max,
            "buffer grew past the limit"
        );
    }
    decoder.finish()?;
    Ok(frames)
}

fn limits(max_payload: u32) -> FrameLimits {
    FrameLimits::new(max_payload).expect("limit in range")
}

fn kind_strategy() -> impl Strategy<Value = FrameKind> {
    prop::sample::select(FrameKind::ALL.to_vec())
}

fn flags_strategy() -> impl Strategy<Value = FrameFlags> {
    prop_oneof![Just(FrameFlags::EMPTY), Just(FrameFlags::END_OF_STREAM)]
}

/// Frames without end-of-stream, so that any number of them can follow each other.
fn stream_strategy() -> impl Strategy<Value = Vec<(FrameKind, Vec<u8>)>> {
    prop::collection::vec(
        (kind_strategy(), prop::collection::vec(any::<u8>(), 0..300)),
        1..8,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn a_frame_round_trips_at_every_split_point(
        kind in kind_strategy(),
        flags in flags_strategy(),
        payload in prop::collection::vec(any::<u8>(), 0..400),
    ) {
        let bytes = frame_bytes(kind, flags, &payload);
        let expected = vec![(kind, flags, payload.clone())];
        for split in 0..=bytes.len() {
            let (head, tail) = bytes.split_at(split);
            let mut decoder = FrameDecoder::new(limits(1024));
            prop_assert_eq!(&decode_pieces(&mut decoder, [head, tail])?, &expected, "split {}", split);
        }
        let mut decoder = FrameDecoder::new(limits(1024));
        prop_assert_eq!(&decode_pieces(&mut decoder, bytes.chunks(1))?, &expected);
        prop_assert_eq!(decoder.is_ended(), flags.contains(FrameFlags::END_OF_STREAM));

        let (frame, used) = Frame::parse(&bytes, &limits(1024))?;
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!((frame.kind(), frame.flags(), frame.payload()), (kind, flags, &payload[..]));
    }

    #[test]
    fn a_stream_of_frames_round_trips_at_random_splits(
        frames in stream_strategy(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let mut stream = Vec::new();
        for (kind, payload) in &frames {
            stream.extend(frame_bytes(*kind, FrameFlags::EMPTY, payload));
        }
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
        cuts.push(0);
        cuts.push(stream.len());
        cuts.sort_unstable();
        let pieces = cuts.windows(2).map(|w| &stream[w[0]..w[1]]);

        let mut decoder = FrameDecoder::new(limits(1024));
        let decoded = decode_pieces(&mut decoder, pieces)?;
        let expected: Vec<Decoded> =
            frames.iter().map(|(k, p)| (*k, FrameFlags::EMPTY, p.clone())).collect();
        prop_assert_eq!(decoded, expected);
    }

    #[test]
    fn a_stream_cut_short_anywhere_is_reported_truncated(
        kind in kind_strategy(),
        payload in prop::collection::vec(any::<u8>(), 0..200),
        cut in any::<prop::sample::Index>(),
    ) {
        let bytes = frame_bytes(kind, FrameFlags::EMPTY, &payload);
        // Any proper, non-empty prefix.
        let len = 1 + cut.index(bytes.len() - 1);
        let mut decoder = FrameDecoder::new(limits(1024));
        let expected = if len < HEADER_LEN { HEADER_LEN } else { bytes.len() };
        prop_assert_eq!(
            decode_pieces(&mut decoder, [&bytes[..len]]),
            Err(FrameError::Truncated { buffered: len, expected })
        );
        prop_assert!(decoder.is_poisoned());
        prop_assert_eq!(
            Frame::parse(&bytes[..len], &limits(1024)),
            Err(FrameError::Truncated { buffered: len, expected })
        );
    }
}

#[test]
fn header_layout_is_magic_version_kind_flags_length_little_endian() {
    let header = FrameHeader::new(
        FrameKind::PushSumShare,
        FrameFlags::END_OF_STREAM,
        0x0102_0304,
    )
    .expect("within hard max");
    assert_eq!(
        header.encode(),
        [
            b'M', b'R', b'M', b'R', 1, 8, 0x01, 0x00, 0x04, 0x03, 0x02, 0x01
        ]
    );
    assert_eq!(MAGIC, *b"MRMR");
    assert_eq!(VERSION, 1);
    assert_eq!(header.frame_len(), HEADER_LEN + 0x0102_0304);
}

#[test]
fn kind_bytes_are_distinct_and_round_trip() {
    for (index, kind) in FrameKind::ALL.into_iter().enumerate() {
        assert_eq!(usize::from(kind.to_byte()), index + 1);
        assert_eq!(FrameKind::from_byte(kind.to_byte()), Some(kind));
    }
    assert_eq!(FrameKind::from_byte(0), None);
    assert_eq!(FrameKind::from_byte(15), None);
}

#[test]
fn stream_ending_mid_header_is_truncated() {
    let bytes = frame_bytes(FrameKind::Heartbeat, FrameFlags::EMPTY, b"payload");
    let mut decoder = FrameDecoder::new(FrameLimits::default());
    let mut input = &bytes[..5];
    assert_eq!(decoder.decode(&mut input), Ok(None));
    assert_eq!(decoder.pending_len(), 5);
    assert_eq!(
        decoder.finish(),
        Err(FrameError::Truncated {
            buffered: 5,
            expected: HEADER_LEN
        })
    );
    assert!(decoder.is_poisoned());
}

#[test]
fn stream_ending_mid_payload_is_truncated() {
    let bytes = frame_bytes(FrameKind::Heartbeat, FrameFlags::EMPTY, b"payload");
    let mut decoder = FrameDecoder::new(FrameLimits::default());
    let mut input = &bytes[..bytes.len() - 1];
    assert_eq!(decoder.decode(&mut input), Ok(None));
    assert_eq!(
        decoder.finish(),
        Err(FrameError::Truncated {
            buffered: bytes.len() - 1,
            expected: bytes.len()
        })
    );
}

#[test]
fn stream_ending_between_frames_is_clean() {
    let mut decoder = FrameDecoder::new(FrameLimits::default());
    assert_eq!(decoder.finish(), Ok(()));
    let bytes = frame_bytes(FrameKind::Reject, FrameFlags::EMPTY, b"x");
    assert_eq!(
        decode_pieces(&mut decoder, [&bytes[..]]).map(|f| f.len()),
        Ok(1)
    );
    assert_eq!(decoder.pending_len(), 0);
}

#[test]
fn frame_over_the_limit_is_rejected_before_any_payload_allocation() {
    let limits = limits(1 << 20);
    let mut stream = raw_header(MAGIC, VERSION, 6, 0, (1 << 20) + 1).to_vec();
    stream.extend(std::iter::repeat_n(0xAA, 4096));
    let mut decoder = FrameDecoder::new(limits);
    let mut input = &stream[..];
    let (result, allocations) =
        allocations_during(|| decoder.decode(&mut input).map(|f| f.is_some()));
    assert_eq!(
        result,
        Err(FrameError::PayloadTooLarge {
            len: (1 << 20) + 1,
            limit: 1 << 20
        })
    );
    // One allocation: the 12-byte header buffer. Nothing was reserved for the payload.
    assert!(allocations <= 1, "{allocations} allocations");
    assert!(
        decoder.buffer_capacity() <= HEADER_LEN,
        "capacity {}",
        decoder.buffer_capacity()
    );
    // The decoder consumed the header and not a byte of the announced payload.
    assert_eq!(input.len(), 4096);
    assert!(decoder.is_poisoned());
}

#[test]
fn largest_possible_length_is_rejected_by_every_limit() {
    let header = raw_header(MAGIC, VERSION, 6, 0, u32::MAX);
    let hard = limits(FrameLimits::HARD_MAX_PAYLOAD);
    let error = FrameError::PayloadTooLarge {
        len: u64::from(u32::MAX),
        limit: FrameLimits::HARD_MAX_PAYLOAD,
    };
    assert_eq!(FrameHeader::parse(&header, &hard), Err(error));
    let mut decoder = FrameDecoder::new(hard);
    assert_eq!(decoder.decode(&mut &header[..]), Err(error));
    assert!(decoder.buffer_capacity() <= HEADER_LEN);
}

#[test]
fn frame_exactly_at_the_limit_is_accepted() {
    let payload = vec![7u8; 256];
    let bytes = frame_bytes(FrameKind::StateSyncResponse, FrameFlags::EMPTY, &payload);
    let mut decoder = FrameDecoder::new(limits(256));
    let frames = decode_pieces(&mut decoder, bytes.chunks(100)).expect("at the limit");
    assert_eq!(
        frames,
        [(FrameKind::StateSyncResponse, FrameFlags::EMPTY, payload)]
    );
    assert!(decoder.buffer_capacity() <= HEADER_LEN + 256);
}

#[test]
fn wrong_version_is_rejected() {
    for version in [0, 2, 255] {
        let header = raw_header(MAGIC, version, 1, 0, 0);
        let mut decoder = FrameDecoder::new(FrameLimits::default());
        assert_eq!(
            decoder.decode(&mut &header[..]),
            Err(FrameError::UnsupportedVersion {
                found: version,
                supported: VERSION
            })
        );
        assert!(decoder.is_poisoned());
    }
}

#[test]
fn unknown_kind_is_rejected_naming_the_byte() {
    for kind in [0, 15, 200, 255] {
        let header = raw_header(MAGIC, VERSION, kind, 0, 0);
        let mut decoder = FrameDecoder::new(FrameLimits::default());
        assert_eq!(
            decoder.decode(&mut &header[..]),
            Err(FrameError::UnknownKind { found: kind })
        );
    }
}

#[test]
fn wrong_magic_is_rejected() {
    let header = raw_header(*b"HTTP", VERSION, 1, 0, 0);
    let mut decoder = FrameDecoder::new(FrameLimits::default());
    assert_eq!(
        decode_pieces(&mut decoder, header.chunks(1)),
        Err(FrameError::BadMagic { found: *b"HTTP" })
    );
}

#[test]
fn unknown_flag_bits_are_rejected() {
    let header = raw_header(MAGIC, VERSION, 1, 0x8001, 0);
    let mut decoder = FrameDecoder::new(FrameLimits::default());
    assert_eq!(
        decoder.decode(&mut &header[..]),
        Err(FrameError::UnknownFlags {
            found: 0x8001,
            unknown: 0x8000
        })
    );
    assert_eq!(FrameFlags::from_bits(0x0002), None);
    assert_eq!(
        FrameFlags::from_bits(0x0001),
        Some(FrameFlags::END_OF_STREAM)
    );
}

#[test]
fn header_checks_run_in_wire_order() {
    // Everything is wrong; the magic is reported, then the version, then the kind.
    let limits = limits(64);
    let all_wrong = raw_header(*b"XXXX", 9, 99, 0xFFFF, u32::MAX);
    assert!(matches!(
        FrameHeader::parse(&all_wrong, &limits),
        Err(FrameError::BadMagic { .. })
    ));
    let from_version = raw_header(MAGIC, 9, 99, 0xFFFF, u32::MAX);
    assert!(matches!(
        FrameHeader::parse(&from_version, &limits),
        Err(FrameError::UnsupportedVersion { .. })
    ));
    let from_kind = raw_header(MAGIC, VERSION, 99, 0xFFFF, u32::MAX);
    assert!(matches!(
        FrameHeader::parse(&from_kind, &limits),
        Err(FrameError::UnknownKind { .. })
    ));
    let from_flags = raw_header(MAGIC, VERSION, 1, 0xFFFF, u32::MAX);
    assert!(matches!(
        FrameHeader::parse(&from_flags, &limits),
        Err(FrameError::UnknownFlags { .. })
    ));
}

#[test]
fn an_error_poisons_the_decoder_for_good() {
    let mut decoder = FrameDecoder::new(FrameLimits::default());
    let bad = raw_header(MAGIC, 2, 1, 0, 0);
    assert!(decoder.decode(&mut &bad[..]).is_err());
    let good = frame_bytes(FrameKind::Heartbeat, FrameFlags::EMPTY, b"ok");
    let mut input = &good[..];
    assert_eq!(decoder.decode(&mut input), Err(FrameError::Poisoned));
    assert_eq!(
        input.len(),
        good.len(),
        "a poisoned decoder consumes nothing"
    );
    assert_eq!(decoder.finish(), Err(FrameError::Poisoned));
    assert!(decoder.is_poisoned());
}

#[test]
fn bytes_after_end_of_stream_are_rejected() {
    let mut stream = frame_bytes(
        FrameKind::StateSyncResponse,
        FrameFlags::END_OF_STREAM,
        b"end",
    );
    let mut decoder = FrameDecoder::new(FrameLimits::default());
    assert_eq!(
        decode_pieces(&mut decoder, [&stream[..], &[][..]]).map(|f| f.len()),
        Ok(1)
    );
    assert!(decoder.is_ended());

    stream.extend(frame_bytes(
        FrameKind::Heartbeat,
        FrameFlags::EMPTY,
        b"more",
    ));
    let mut decoder = FrameDecoder::new(FrameLimits::default());
    assert_eq!(
        decode_pieces(&mut decoder, [&stream[..]]),
        Err(FrameError::DataAfterEnd {
            extra: HEADER_LEN + 4
        })
    );
    assert!(decoder.is_poisoned());
}

#[test]
fn decode_stops_at_the_end_of_each_frame() {
    let first = frame_bytes(FrameKind::JoinGroup, FrameFlags::EMPTY, b"first");
    let second = frame_bytes(FrameKind::GroupReject, FrameFlags::EMPTY, b"second!");
    let stream = [first.clone(), second.clone()].concat();
    let mut decoder = FrameDecoder::new(FrameLimits::default());
    let mut input = &stream[..];
    let frame = decoder
        .decode(&mut input)
        .expect("valid")
        .expect("complete");
    assert_eq!(
        (frame.kind(), frame.payload()),
        (FrameKind::JoinGroup, &b"first"[..])
    );
    assert_eq!(input, &second[..]);
    let frame = decoder
        .decode(&mut input)
        .expect("valid")
        .expect("complete");
    assert_eq!(
        (frame.kind(), frame.payload()),
        (FrameKind::GroupReject, &b"second!"[..])
    );
    assert!(input.is_empty());
    assert_eq!(decoder.decode(&mut input), Ok(None));
}

#[test]
fn a_warm_decoder_allocates_nothing() {
    let mut stream = Vec::new();
    for i in 0..200u32 {
        let len = usize::try_from(i * 37 % 1000).expect("small");
        stream.extend(frame_bytes(
            FrameKind::TensorPartChunk,
            FrameFlags::EMPTY,
            &vec![1; len],
        ));
    }
    let mut decoder = FrameDecoder::new(limits(1000));
    // Warm up with the largest frame the stream holds.
    let warm_up = frame_bytes(FrameKind::TensorPartChunk, FrameFlags::EMPTY, &[0; 999]);
    assert!(decoder.decode(&mut &warm_up[..]).expect("valid").is_some());
    let capacity = decoder.buffer_capacity();

    let (frames, allocations) = allocations_during(|| {
        let mut frames = 0;
        for piece in stream.chunks(333) {
            let mut input = piece;
            while decoder.decode(&mut input).expect("valid").is_some() {
                frames += 1;
            }
        }
        frames
    });
    assert_eq!(frames, 200);
    assert_eq!(allocations, 0);
    assert_eq!(decoder.buffer_capacity(), capacity);
}

#[test]
fn a_slow_large_frame_reserves_memory_as_bytes_arrive() {
    let payload = vec![3u8; 1 << 20];
    let bytes = frame_bytes(FrameKind::StateSyncResponse, FrameFlags::EMPTY, &payload);
    let mut decoder = FrameDecoder::new(limits(1 << 20));
    let mut input = &bytes[..HEADER_LEN + 100];
    assert_eq!(decoder.decode(&mut input), Ok(None));
    // 100 payload bytes arrived; the decoder has not reserved the announced megabyte.
    assert!(
        decoder.buffer_capacity() < 1024,
        "capacity {}",
        decoder.buffer_capacity()
    );
    let mut rest = &bytes[HEADER_LEN + 100..];
    let frame = decoder.decode(&mut rest).expect("valid").expect("complete");
    assert_eq!(frame.payload(), &payload[..]);
    assert!(decoder.buffer_capacity() <= HEADER_LEN + (1 << 20));
}

#[test]
fn limits_outside_the_allowed_range_are_refused() {
    for requested in [
        0,
        FrameLimits::MIN_MAX_PAYLOAD - 1,
        FrameLimits::HARD_MAX_PAYLOAD + 1,
    ] {
        assert_eq!(
            FrameLimits::new(requested),
            Err(FrameLimitsError {
                requested,
                min: FrameLimits::MIN_MAX_PAYLOAD,
                max: FrameLimits::HARD_MAX_PAYLOAD,
            })
        );
    }
    assert!(FrameLimits::new(FrameLimits::MIN_MAX_PAYLOAD).is_ok());
    assert!(FrameLimits::new(FrameLimits::HARD_MAX_PAYLOAD).is_ok());
    assert_eq!(FrameLimits::default().max_payload(), 16 << 20);
}

#[test]
fn encoder_refuses_payloads_no_receiver_accepts() {
    let hard = FrameLimits::HARD_MAX_PAYLOAD;
    let too_large = usize::try_from(hard).expect("fits") + 1;
    let error = FrameError::PayloadTooLarge {
        len: u64::from(hard) + 1,
        limit: hard,
    };
    assert_eq!(
        FrameHeader::new(FrameKind::TensorPartChunk, FrameFlags::EMPTY, too_large),
        Err(error)
    );
    let mut out = [0u8; HEADER_LEN];
    assert_eq!(
        encode_header(
            FrameKind::TensorPartChunk,
            FrameFlags::EMPTY,
            too_large,
            &mut out
        ),
        Err(error)
    );
    assert_eq!(out, [0u8; HEADER_LEN], "nothing written on error");
    assert_eq!(
        FrameHeader::new(FrameKind::TensorPartChunk, FrameFlags::EMPTY, usize::MAX),
        Err(FrameError::PayloadTooLarge {
            len: u64::MAX,
            limit: hard
        })
    );
}
