//! Entry points shared by the cargo-fuzz targets in `fuzz/` and by the test that replays
//! their corpora in CI. Each takes arbitrary bytes and panics only when it finds a bug: a
//! crash in a decoder, an encode/decode asymmetry, or a broken invariant.

use crate::codec::{Codec, CodecSpec};

/// Decodes `data` as a part of the codec named `codec` (`"f32"`, `"int8"`, ...).
///
/// The first two bytes choose the element count and, for blockwise codecs, the block size;
/// the rest is the encoded part. Checks that a successful decode yields only finite values,
/// that `decode_accumulate` agrees with `decode_into`, and that a rejected part leaves the
/// accumulator untouched.
pub fn codec_decoder(codec: &str, data: &[u8]) {
    let [elements_byte, param_byte, payload @ ..] = data else {
        return;
    };
    let (spec, elements) = codec_shape(codec, *elements_byte, *param_byte);
    let Ok(mut codec) = Codec::new(spec) else {
        return;
    };

    let mut decoded = vec![0f32; elements];
    let decode = codec.decode_into(payload, &mut decoded);
    let mut acc: Vec<f32> = (0..elements).map(|i| i as f32 * 0.25).collect();
    let before = acc.clone();
    let accumulate = codec.decode_accumulate(payload, 2.0, &mut acc);
    match (decode, accumulate) {
        (Ok(()), Ok(())) => {
            assert!(
                decoded.iter().all(|x| x.is_finite()),
                "{spec}: decoded a non-finite value"
            );
            for ((a, b), d) in acc.iter().zip(&before).zip(&decoded) {
                assert_eq!(
                    a.to_bits(),
                    (b + 2.0 * d).to_bits(),
                    "{spec}: accumulate disagrees"
                );
            }
        }
        (Err(e1), Err(e2)) => {
            assert_eq!(e1, e2, "{spec}: decode_into and decode_accumulate disagree");
            assert_eq!(
                acc, before,
                "{spec}: a rejected part changed the accumulator"
            );
        }
        (d, a) => panic!("{spec}: decode_into gave {d:?} but decode_accumulate gave {a:?}"),
    }
}

/// Feeds `data` to a [`FrameDecoder`](crate::frame::FrameDecoder) with a small limit, in
/// pieces whose sizes the data itself chooses, and decodes every frame as a message.
///
/// The first byte seeds the piece sizes; the rest is the stream. Checks that the incremental
/// decoder and [`Frame::parse`](crate::frame::Frame::parse) agree on every frame, that an
/// error poisons the decoder for good, and that every message that decodes re-encodes to
/// exactly the bytes it came from, header included.
pub fn frames_and_messages(data: &[u8]) {
    use crate::frame::{Frame, FrameDecoder, FrameError, FrameLimits, HEADER_LEN};
    use crate::message::Message;

    // Small enough that over-limit headers are common, large enough for every message kind.
    const LIMITS: FrameLimits = match FrameLimits::new(4096) {
        Ok(limits) => limits,
        Err(_) => panic!("4096 is within the frame limit range"),
    };

    let Some((&seed, mut stream)) = data.split_first() else {
        return;
    };
    let mut decoder = FrameDecoder::new(LIMITS);
    let mut reencoded = Vec::with_capacity(LIMITS.max_frame_len());
    let mut piece_size = seed;
    while !stream.is_empty() {
        // Piece sizes 1..=64, varying along the stream.
        let size = usize::from(piece_size % 64) + 1;
        piece_size = piece_size.wrapping_mul(167).wrapping_add(13);
        let (piece, rest) = stream.split_at(size.min(stream.len()));
        stream = rest;
        let mut input = piece;
        loop {
            let frame = match decoder.decode(&mut input) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(_) => {
                    assert!(decoder.is_poisoned(), "a failed decoder must be poisoned");
                    assert_eq!(decoder.decode(&mut input), Err(FrameError::Poisoned));
                    return;
                }
            };
            let mut whole = frame.header().encode().to_vec();
            whole.extend_from_slice(frame.payload());
            assert_eq!(Frame::parse(&whole, &LIMITS), Ok((frame, whole.len())));

            let Ok(message) = Message::from_frame(&frame) else {
                continue;
            };
            assert_eq!(message.kind(), frame.kind());
            assert_eq!(message.frame_len(), HEADER_LEN + frame.payload().len());
            reencoded.clear();
            reencoded.resize(message.frame_len(), 0);
            let written = message.encode_frame(frame.flags(), &mut reencoded);
            assert_eq!(
                written,
                Ok(whole.len()),
                "{message:?} decoded but does not re-encode"
            );
            assert_eq!(
                reencoded, whole,
                "{message:?} re-encodes to different bytes"
            );
        }
    }
    if decoder.finish().is_err() {
        assert!(
            decoder.is_poisoned(),
            "a decoder that reports truncation must be poisoned"
        );
    }
}

/// A valid input for [`codec_decoder`]: a real encoded part, so that fuzzing starts from
/// the format rather than from noise.
pub fn codec_seed(codec: &str, elements_byte: u8, param_byte: u8) -> Vec<u8> {
    let (spec, elements) = codec_shape(codec, elements_byte, param_byte);
    let x: Vec<f32> = (0..elements)
        .map(|i| ((i * 7919 % 211) as f32 - 105.0) / 13.0)
        .collect();
    let Ok(mut codec) = Codec::new(spec) else {
        return vec![elements_byte, param_byte];
    };
    let mut out = vec![0u8; 2 + codec.max_encoded_len(elements)];
    out[0] = elements_byte;
    out[1] = param_byte;
    let written = codec
        .encode(&x, &mut out[2..])
        .expect("finite sample encodes");
    out.truncate(2 + written);
    out
}

/// The codec and element count that the first two bytes of a codec fuzz input select:
/// up to 772 elements, blocks of 32 to 280, keep fractions of 0.1% to 25.5%.
fn codec_shape(codec: &str, elements_byte: u8, param_byte: u8) -> (CodecSpec, usize) {
    let Some(base) = CodecSpec::ALL_DEFAULT
        .into_iter()
        .find(|s| s.name() == codec)
    else {
        panic!("no codec named {codec:?}");
    };
    let elements = usize::from(elements_byte) * 3 + usize::from(param_byte & 7);
    let block = 32 + 8 * u32::from(param_byte >> 3);
    let keep_ppm = 1_000 * u32::from(param_byte).max(1);
    let spec = match base {
        CodecSpec::Int8 { .. } => CodecSpec::Int8 { block },
        CodecSpec::Int4 { .. } => CodecSpec::Int4 { block },
        CodecSpec::Sign1 { .. } => CodecSpec::Sign1 { block },
        CodecSpec::TopK { .. } => CodecSpec::TopK { keep_ppm },
        other => other,
    };
    (spec, elements)
}
