//! Field encodings shared by the messages: the encode/decode frame around a message body,
//! booleans, optional values, codec specs, bounded byte strings and checked floats.
//!
//! Every encoding here is canonical: a value has exactly one byte form and the decoder
//! rejects every other, so a decoded message re-encodes to the bytes it came from.

use super::MessageError;
use crate::codec::{CODEC_SPEC_WIRE_LEN, CodecSpec};
use crate::frame::FrameKind;
use crate::wire::{Reader, Writer};

/// Runs `write` over the first `len` bytes of `out` and returns `len`.
pub(crate) fn encode_with(
    out: &mut [u8],
    len: usize,
    write: impl FnOnce(&mut Writer<'_>) -> Result<(), MessageError>,
) -> Result<usize, MessageError> {
    let available = out.len();
    let dst = out.get_mut(..len).ok_or(MessageError::BufferTooSmall {
        needed: len,
        available,
    })?;
    let mut writer = Writer::new(dst);
    write(&mut writer)?;
    debug_assert_eq!(
        writer.position(),
        len,
        "encoded_len disagrees with the encoder"
    );
    Ok(writer.position())
}

/// Runs `read` over `payload` and rejects bytes it leaves.
pub(crate) fn decode_with<'a, T>(
    kind: FrameKind,
    payload: &'a [u8],
    read: impl FnOnce(&mut Reader<'a>) -> Result<T, MessageError>,
) -> Result<T, MessageError> {
    let mut reader = Reader::new(payload);
    let message = read(&mut reader)?;
    match reader.remaining() {
        0 => Ok(message),
        extra => Err(MessageError::TrailingBytes { kind, extra }),
    }
}

/// A boolean: one byte, 0 or 1.
pub(crate) fn read_bool(r: &mut Reader<'_>, field: &'static str) -> Result<bool, MessageError> {
    match r.u8(field)? {
        0 => Ok(false),
        1 => Ok(true),
        value => Err(MessageError::InvalidEnum { field, value }),
    }
}

pub(crate) fn write_bool(w: &mut Writer<'_>, value: bool) -> Result<(), MessageError> {
    Ok(w.u8(u8::from(value))?)
}

/// Size of an optional `u64` on the wire: a presence byte and the value (zero if absent).
pub(crate) const OPTION_U64_LEN: usize = 9;

pub(crate) fn read_option_u64(
    r: &mut Reader<'_>,
    field: &'static str,
) -> Result<Option<u64>, MessageError> {
    let present = read_bool(r, field)?;
    let value = r.u64(field)?;
    match (present, value) {
        (true, value) => Ok(Some(value)),
        (false, 0) => Ok(None),
        (false, _) => Err(MessageError::InvalidField {
            field,
            reason: "absent but not zero",
        }),
    }
}

pub(crate) fn write_option_u64(w: &mut Writer<'_>, value: Option<u64>) -> Result<(), MessageError> {
    write_bool(w, value.is_some())?;
    Ok(w.u64(value.unwrap_or(0))?)
}

pub(crate) fn read_codec(r: &mut Reader<'_>) -> Result<CodecSpec, MessageError> {
    CodecSpec::from_wire(r.array::<CODEC_SPEC_WIRE_LEN>("codec")?).map_err(MessageError::Codec)
}

pub(crate) fn write_codec(w: &mut Writer<'_>, codec: CodecSpec) -> Result<(), MessageError> {
    Ok(w.bytes(&codec.to_wire())?)
}

pub(crate) fn check_codec(codec: CodecSpec) -> Result<(), MessageError> {
    codec.validate().map_err(MessageError::Codec)
}

/// Size of a `u16` length prefix.
pub(crate) const U16_PREFIX_LEN: usize = 2;

/// Bytes behind a `u16` length prefix. The length is checked against `max` before the
/// bytes are taken.
pub(crate) fn read_bytes_u16<'a>(
    r: &mut Reader<'a>,
    field: &'static str,
    max: usize,
) -> Result<&'a [u8], MessageError> {
    let len = usize::from(r.u16(field)?);
    check_len(field, len, max)?;
    Ok(r.bytes(len, field)?)
}

pub(crate) fn write_bytes_u16(
    w: &mut Writer<'_>,
    field: &'static str,
    bytes: &[u8],
) -> Result<(), MessageError> {
    let len = u16::try_from(bytes.len()).map_err(|_| MessageError::TooLong {
        field,
        len: bytes.len(),
        max: usize::from(u16::MAX),
    })?;
    w.u16(len)?;
    Ok(w.bytes(bytes)?)
}

pub(crate) fn check_len(field: &'static str, len: usize, max: usize) -> Result<(), MessageError> {
    if len > max {
        return Err(MessageError::TooLong { field, len, max });
    }
    Ok(())
}

/// A weight: finite and not negative.
pub(crate) fn check_weight(field: &'static str, value: f64) -> Result<(), MessageError> {
    check_finite(field, value)?;
    if value < 0.0 {
        return Err(MessageError::InvalidField {
            field,
            reason: "must not be negative",
        });
    }
    Ok(())
}

pub(crate) fn check_finite(field: &'static str, value: f64) -> Result<(), MessageError> {
    if !value.is_finite() {
        return Err(MessageError::NonFinite { field, value });
    }
    Ok(())
}
