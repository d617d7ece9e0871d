//! Heartbeats: the small signed status every peer gossips to the swarm.

use super::fields::{U16_PREFIX_LEN, check_len, check_weight, decode_with, encode_with};
use super::fields::{read_bytes_u16, write_bytes_u16};
use super::{MessageError, WireMessage};
use crate::frame::FrameKind;
use crate::wire::Reader;

/// Largest signed heartbeat envelope accepted, in bytes.
pub const MAX_HEARTBEAT_ENVELOPE_LEN: usize = 1024;

/// A peer's heartbeat as gossiped: a signed envelope whose content is an encoded
/// [`HeartbeatBody`]. The envelope is opaque here; [`identity`](crate::identity) checks its
/// signature, and only then is the body decoded.
///
/// Wire form: `envelope_len u16 | envelope`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat<'a> {
    /// The signed envelope, 1 to [`MAX_HEARTBEAT_ENVELOPE_LEN`] bytes.
    pub envelope: &'a [u8],
}

impl<'a> WireMessage<'a> for Heartbeat<'a> {
    const KIND: FrameKind = FrameKind::Heartbeat;

    fn encoded_len(&self) -> usize {
        U16_PREFIX_LEN + self.envelope.len()
    }

    fn validate(&self) -> Result<(), MessageError> {
        if self.envelope.is_empty() {
            return Err(MessageError::InvalidField {
                field: "envelope",
                reason: "must not be empty",
            });
        }
        check_len("envelope", self.envelope.len(), MAX_HEARTBEAT_ENVELOPE_LEN)
    }

    fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError> {
        self.validate()?;
        encode_with(out, self.encoded_len(), |w| {
            write_bytes_u16(w, "envelope", self.envelope)
        })
    }

    fn decode(payload: &'a [u8]) -> Result<Self, MessageError> {
        let heartbeat = decode_with(Self::KIND, payload, |r| {
            Ok(Heartbeat {
                envelope: read_bytes_u16(r, "envelope", MAX_HEARTBEAT_ENVELOPE_LEN)?,
            })
        })?;
        heartbeat.validate()?;
        Ok(heartbeat)
    }
}

/// How a peer averages, as set by the swarm config's `averaging.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AveragingMode {
    /// Stochastic Gradient Push every step.
    Sgp = 1,
    /// Butterfly all-reduce of gradients once the swarm reaches the target batch.
    Butterfly = 2,
    /// Several local steps, then an average of parameters or pseudo-gradients.
    LocalSgd = 3,
    /// Synchronous ring all-reduce, the baseline.
    SyncRing = 4,
    /// No averaging: each peer trains alone (`none`), the control that averaging is
    /// measured against.
    Solo = 5,
}

impl AveragingMode {
    /// Every mode, in byte order.
    pub const ALL: [AveragingMode; 5] = [
        AveragingMode::Sgp,
        AveragingMode::Butterfly,
        AveragingMode::LocalSgd,
        AveragingMode::SyncRing,
        AveragingMode::Solo,
    ];

    /// The mode with this byte value, if any.
    pub fn from_byte(byte: u8) -> Option<AveragingMode> {
        AveragingMode::ALL
            .into_iter()
            .find(|mode| *mode as u8 == byte)
    }

    /// The mode's byte value on the wire.
    pub fn to_byte(self) -> u8 {
        self as u8
    }

    /// The mode's name, as written in configs.
    pub fn name(self) -> &'static str {
        match self {
            AveragingMode::Sgp => "sgp",
            AveragingMode::Butterfly => "butterfly",
            AveragingMode::LocalSgd => "local-sgd",
            AveragingMode::SyncRing => "sync-ring",
            AveragingMode::Solo => "none",
        }
    }
}

impl std::fmt::Display for AveragingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no [`AveragingMode`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown averaging mode {0:?}: expected sgp, butterfly, local-sgd, sync-ring or none")]
pub struct UnknownMode(pub String);

impl std::str::FromStr for AveragingMode {
    type Err = UnknownMode;

    fn from_str(name: &str) -> Result<AveragingMode, UnknownMode> {
        AveragingMode::ALL
            .into_iter()
            .find(|mode| mode.name() == name)
            .ok_or_else(|| UnknownMode(name.to_owned()))
    }
}

/// What a heartbeat says: a peer's progress and capacity, which the matchmaking and the
/// push-sum graph use to choose partners. This is the content the envelope signs.
///
/// Wire form, [`HeartbeatBody::WIRE_LEN`] bytes: `step u64 | timestamp_ms u64 |
/// samples_per_s f32 | upload_bytes_per_s u64 | download_bytes_per_s u64 | mode u8 |
/// samples_accumulated u64 | looking_round u64 | looking_until_ms u64 | incarnation u64`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeartbeatBody {
    /// The optimizer step the peer is at.
    pub step: u64,
    /// When the peer wrote the heartbeat, in milliseconds since the Unix epoch; receivers
    /// use it to drop stale or replayed heartbeats.
    pub timestamp_ms: u64,
    /// The peer's recent training throughput in samples per second; finite, not negative.
    pub samples_per_s: f32,
    /// The peer's estimated upload bandwidth in bytes per second.
    pub upload_bytes_per_s: u64,
    /// The peer's estimated download bandwidth in bytes per second.
    pub download_bytes_per_s: u64,
    /// How the peer averages.
    pub mode: AveragingMode,
    /// Samples the peer has accumulated towards the swarm's target batch since the last
    /// average (butterfly mode; 0 in the others).
    pub samples_accumulated: u64,
    /// The round the peer looks for a group of (round modes), while it looks.
    pub looking_round: u64,
    /// Until when the peer looks for a group, in milliseconds since the Unix epoch; 0 when
    /// it does not look. Peers order prospective leaders by it (see
    /// `murmur_gossip::butterfly::matchmaking`).
    pub looking_until_ms: u64,
    /// A number the peer's process drew when it started, the same in all its heartbeats.
    /// Another number under the same key means another process: the peer was restarted,
    /// and holds nothing of the rounds its old process was in.
    pub incarnation: u64,
}

impl HeartbeatBody {
    /// Size of the encoded body in bytes.
    pub const WIRE_LEN: usize = 8 + 8 + 4 + 8 + 8 + 1 + 8 + 8 + 8 + 8;

    /// Bytes [`encode_into`](Self::encode_into) writes: always [`Self::WIRE_LEN`].
    pub fn encoded_len(&self) -> usize {
        Self::WIRE_LEN
    }

    /// Checks that the throughput is a finite, non-negative number.
    pub fn validate(&self) -> Result<(), MessageError> {
        check_weight("samples_per_s", f64::from(self.samples_per_s))
    }

    /// Validates the body and writes it to the start of `out`; returns the bytes written.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError> {
        self.validate()?;
        encode_with(out, Self::WIRE_LEN, |w| {
            w.u64(self.step)?;
            w.u64(self.timestamp_ms)?;
            w.f32(self.samples_per_s)?;
            w.u64(self.upload_bytes_per_s)?;
            w.u64(self.download_bytes_per_s)?;
            w.u8(self.mode.to_byte())?;
            w.u64(self.samples_accumulated)?;
            w.u64(self.looking_round)?;
            w.u64(self.looking_until_ms)?;
            Ok(w.u64(self.incarnation)?)
        })
    }

    /// The encoded body, for signing.
    pub fn to_bytes(&self) -> Result<[u8; Self::WIRE_LEN], MessageError> {
        let mut out = [0u8; Self::WIRE_LEN];
        self.encode_into(&mut out)?;
        Ok(out)
    }

    /// Decodes and validates a body, such as the content of a verified envelope.
    pub fn decode(bytes: &[u8]) -> Result<HeartbeatBody, MessageError> {
        let body = decode_with(FrameKind::Heartbeat, bytes, |r| {
            Ok(HeartbeatBody {
                step: r.u64("step")?,
                timestamp_ms: r.u64("timestamp_ms")?,
                samples_per_s: r.f32("samples_per_s")?,
                upload_bytes_per_s: r.u64("upload_bytes_per_s")?,
                download_bytes_per_s: r.u64("download_bytes_per_s")?,
                mode: read_mode(r)?,
                samples_accumulated: r.u64("samples_accumulated")?,
                looking_round: r.u64("looking_round")?,
                looking_until_ms: r.u64("looking_until_ms")?,
                incarnation: r.u64("incarnation")?,
            })
        })?;
        body.validate()?;
        Ok(body)
    }
}

fn read_mode(r: &mut Reader<'_>) -> Result<AveragingMode, MessageError> {
    let value = r.u8("mode")?;
    AveragingMode::from_byte(value).ok_or(MessageError::InvalidEnum {
        field: "mode",
        value,
    })
}
