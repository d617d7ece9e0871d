//! Signed envelopes: small payloads, such as membership heartbeats, signed by the peer that
//! sent them.
//!
//! Gossip relays a heartbeat through peers that did not write it, so the heartbeat carries its
//! author's key and signature: any receiver can check who wrote it and that nobody changed it
//! on the way.
//!
//! # Wire format
//!
//! Integers are little-endian.
//!
//! ```text
//! "murmur/envelope/v1\0"  19 bytes  format tag; doubles as the signature's domain separator
//! payload type             2 bytes  what the payload is, e.g. PayloadType::HEARTBEAT
//! signer key              32 bytes  ed25519 key of the author (its peer id is derived)
//! payload length           4 bytes  at most MAX_ENVELOPE_PAYLOAD_LEN
//! payload                  n bytes
//! signature               64 bytes  author's ed25519 signature over all preceding bytes
//! ```
//!
//! The signature covers the payload type, so a payload signed as one type cannot be
//! replayed as another, and the format tag, so it cannot pass for an invite or any other
//! signed murmur message. The signed bytes are a prefix of the encoding, so sealing and
//! opening need no copy and decoding borrows the payload from the input.

use std::fmt;

use thiserror::Error;

use super::keypair::{Keypair, PUBLIC_KEY_LEN, PublicKey, SIGNATURE_LEN, Signature};
use super::peer_id::PeerId;
use crate::wire::{BufferTooSmall, Reader, Truncated, Writer};

/// The format tag every envelope starts with, and the domain separator of its signature.
pub const ENVELOPE_DOMAIN: &[u8; 19] = b"murmur/envelope/v1\0";
/// The largest payload an envelope carries: 64 KiB. Envelopes are for small control data;
/// tensors travel in frames.
pub const MAX_ENVELOPE_PAYLOAD_LEN: usize = 64 * 1024;
/// Bytes before the payload.
const HEADER_LEN: usize = ENVELOPE_DOMAIN.len() + 2 + PUBLIC_KEY_LEN + 4;

/// What an envelope's payload is. Part of the signed bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PayloadType(pub u16);

impl PayloadType {
    /// A membership heartbeat on the swarm's gossip topic.
    pub const HEARTBEAT: PayloadType = PayloadType(1);
}

impl fmt::Display for PayloadType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PayloadType::HEARTBEAT => write!(f, "heartbeat ({})", self.0),
            PayloadType(other) => write!(f, "{other}"),
        }
    }
}

/// Why an envelope could not be sealed, decoded or opened.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EnvelopeError {
    /// The bytes do not start with [`ENVELOPE_DOMAIN`].
    #[error("not a murmur signed envelope: bytes do not start with the `murmur/envelope/v1` tag")]
    UnknownFormat,
    /// The bytes end inside a field.
    #[error("signed envelope is truncated: {0}")]
    Truncated(#[from] Truncated),
    /// The signer key is not an ed25519 public key.
    #[error("signed envelope's signer key is not an ed25519 public key")]
    InvalidSignerKey,
    /// The payload is longer than [`MAX_ENVELOPE_PAYLOAD_LEN`].
    #[error("signed envelope payload is {len} bytes; the limit is {max}")]
    PayloadTooLong {
        /// Declared or given payload length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Bytes follow the signature.
    #[error("signed envelope is followed by {count} unexpected bytes")]
    TrailingBytes {
        /// How many bytes follow.
        count: usize,
    },
    /// The payload is of another type than the receiver expects.
    #[error("signed envelope holds payload type {found}, expected {expected}")]
    WrongPayloadType {
        /// The type the receiver expects.
        expected: PayloadType,
        /// The type in the envelope.
        found: PayloadType,
    },
    /// The signature does not cover these contents: the envelope was forged or altered.
    #[error("signed envelope signature does not verify: it was altered or forged")]
    BadSignature,
    /// The output buffer of [`SignedEnvelope::seal_into`] is too small.
    #[error(transparent)]
    BufferTooSmall(#[from] BufferTooSmall),
}

/// A sealed envelope, owning its wire form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedEnvelope {
    bytes: Vec<u8>,
    payload_type: PayloadType,
    signer: PublicKey,
}

impl SignedEnvelope {
    /// Signs `payload` as `payload_type` with `keypair`.
    pub fn seal(
        keypair: &Keypair,
        payload_type: PayloadType,
        payload: &[u8],
    ) -> Result<SignedEnvelope, EnvelopeError> {
        check_payload_len(payload.len())?;
        let mut bytes = vec![0u8; SignedEnvelope::encoded_len_for(payload.len())];
        let written = SignedEnvelope::seal_into(keypair, payload_type, payload, &mut bytes)?;
        bytes.truncate(written);
        Ok(SignedEnvelope {
            bytes,
            payload_type,
            signer: keypair.public(),
        })
    }

    /// Signs `payload` as `payload_type` with `keypair`, writing the envelope into `out`
    /// without allocating. Returns the number of bytes written.
    pub fn seal_into(
        keypair: &Keypair,
        payload_type: PayloadType,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<usize, EnvelopeError> {
        let payload_len = check_payload_len(payload.len())?;
        let needed = SignedEnvelope::encoded_len_for(payload.len());
        if out.len() < needed {
            return Err(BufferTooSmall {
                needed,
                available: out.len(),
            }
            .into());
        }
        let mut writer = Writer::new(out);
        writer.bytes(ENVELOPE_DOMAIN)?;
        writer.u16(payload_type.0)?;
        writer.bytes(keypair.public().as_bytes())?;
        writer.u32(payload_len)?;
        writer.bytes(payload)?;
        let signed_len = writer.position();
        let Some((signed, signature)) = out.split_at_mut_checked(signed_len) else {
            return Err(BufferTooSmall {
                needed: signed_len,
                available: out.len(),
            }
            .into());
        };
        let mut writer = Writer::new(signature);
        writer.bytes(&keypair.sign(signed).to_bytes())?;
        Ok(signed_len + writer.position())
    }

    /// Length of an envelope carrying `payload_len` bytes of payload.
    pub const fn encoded_len_for(payload_len: usize) -> usize {
        HEADER_LEN + payload_len + SIGNATURE_LEN
    }

    /// Parses an envelope, borrowing its payload from `bytes`. Strict: every length is
    /// checked, the payload length is bounded before it is used, and nothing may follow.
    ///
    /// The signature is not checked here; see [`SignedEnvelopeView::open`].
    pub fn decode(bytes: &[u8]) -> Result<SignedEnvelopeView<'_>, EnvelopeError> {
        let mut reader = Reader::new(bytes);
        if reader.bytes(ENVELOPE_DOMAIN.len(), "envelope format tag")? != ENVELOPE_DOMAIN {
            return Err(EnvelopeError::UnknownFormat);
        }
        let payload_type = PayloadType(reader.u16("payload type")?);
        let signer = PublicKey::from_bytes(&reader.array("signer key")?)
            .map_err(|_| EnvelopeError::InvalidSignerKey)?;
        let payload_len = reader.u32("payload length")? as usize;
        check_payload_len(payload_len)?;
        let payload = reader.bytes(payload_len, "payload")?;
        // The signed bytes are everything read so far; `remaining` never exceeds the input.
        let (signed, _) = bytes.split_at(bytes.len() - reader.remaining());
        let signature = Signature::from_bytes(&reader.array("signature")?);
        if reader.remaining() != 0 {
            return Err(EnvelopeError::TrailingBytes {
                count: reader.remaining(),
            });
        }
        Ok(SignedEnvelopeView {
            signed,
            payload_type,
            signer,
            payload,
            signature,
        })
    }

    /// The wire form.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The wire form, by value.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Length of the wire form.
    pub fn encoded_len(&self) -> usize {
        self.bytes.len()
    }

    /// Copies the wire form into `out` and returns its length.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize, BufferTooSmall> {
        let mut writer = Writer::new(out);
        writer.bytes(&self.bytes)?;
        Ok(writer.position())
    }

    /// The payload's type.
    pub fn payload_type(&self) -> PayloadType {
        self.payload_type
    }

    /// The peer that sealed the envelope.
    pub fn signer(&self) -> PeerId {
        self.signer.peer_id()
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        let end = self.bytes.len().saturating_sub(SIGNATURE_LEN);
        self.bytes.get(HEADER_LEN..end).unwrap_or_default()
    }

    /// Checks the envelope as a receiver would; see [`SignedEnvelopeView::open`].
    pub fn open(&self, expected_type: PayloadType) -> Result<(PeerId, &[u8]), EnvelopeError> {
        SignedEnvelope::decode(&self.bytes)?.open(expected_type)
    }
}

/// A decoded envelope whose signature has not been checked yet, borrowing the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignedEnvelopeView<'a> {
    signed: &'a [u8],
    payload_type: PayloadType,
    signer: PublicKey,
    payload: &'a [u8],
    signature: Signature,
}

impl<'a> SignedEnvelopeView<'a> {
    /// Checks that the envelope holds a payload of `expected_type` signed by the key it
    /// names, and returns the signer's peer id and the payload.
    ///
    /// The type is compared first, as it costs nothing; then the signature is verified.
    pub fn open(&self, expected_type: PayloadType) -> Result<(PeerId, &'a [u8]), EnvelopeError> {
        if self.payload_type != expected_type {
            return Err(EnvelopeError::WrongPayloadType {
                expected: expected_type,
                found: self.payload_type,
            });
        }
        self.signer
            .verify(self.signed, &self.signature)
            .map_err(|_| EnvelopeError::BadSignature)?;
        Ok((self.signer.peer_id(), self.payload))
    }

    /// The payload's type, as claimed by the unverified envelope.
    pub fn payload_type(&self) -> PayloadType {
        self.payload_type
    }

    /// The peer the unverified envelope claims as its signer.
    pub fn claimed_signer(&self) -> PeerId {
        self.signer.peer_id()
    }

    /// The payload, before its signature is checked. Use [`SignedEnvelopeView::open`] unless
    /// you only need to route or count the envelope.
    pub fn unverified_payload(&self) -> &'a [u8] {
        self.payload
    }

    /// Length of the envelope's wire form.
    pub fn encoded_len(&self) -> usize {
        self.signed.len() + SIGNATURE_LEN
    }
}

/// Bounds a payload length and converts it to its wire width.
fn check_payload_len(len: usize) -> Result<u32, EnvelopeError> {
    match u32::try_from(len) {
        Ok(wire_len) if len <= MAX_ENVELOPE_PAYLOAD_LEN => Ok(wire_len),
        _ => Err(EnvelopeError::PayloadTooLong {
            len,
            max: MAX_ENVELOPE_PAYLOAD_LEN,
        }),
    }
}
