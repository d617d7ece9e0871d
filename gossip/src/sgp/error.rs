//! What can go wrong when feeding the SGP state machine.

use murmur_protocol::codec::CodecSpec;
use thiserror::Error;

/// Why the SGP state machine refused an input or a configuration.
///
/// Errors caused by a share from the network ([`SgpError::PayloadLength`],
/// [`SgpError::NonFinitePayload`], [`SgpError::BadShareWeight`]) leave the state untouched:
/// drop the share, close the stream, and carry on.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SgpError {
    /// A share's payload does not hold one value per parameter.
    #[error(
        "share payload is {got} bytes but this swarm's parameters need {expected}; the sender runs a different model or codec"
    )]
    PayloadLength {
        /// Bytes a payload must have.
        expected: usize,
        /// Bytes it had.
        got: usize,
    },
    /// A share carried NaN or infinity.
    #[error("share payload contains NaN or infinity; the sender's parameters have diverged")]
    NonFinitePayload,
    /// A share's weight was zero, negative or not finite.
    #[error("share weight {weight} is not a finite positive number; the share was dropped")]
    BadShareWeight {
        /// The weight the share carried.
        weight: f64,
    },
    /// A share was encoded with a codec this swarm does not use for shares.
    #[error(
        "share encoded with {got} but this swarm sends shares as {expected}; check averaging.sgp.share_codec on both peers"
    )]
    UnexpectedCodec {
        /// The codec this peer expects.
        expected: CodecSpec,
        /// The codec the share used.
        got: CodecSpec,
    },
    /// A quantized share refers to an edge reference this peer does not hold (any more).
    ///
    /// Nothing is wrong with the sender: give the share back to it (as the transport's
    /// `ShareReturned`) so that it takes the mass back and resends exactly next time.
    #[error(
        "share is a deviation from the reference of step {version}, which this peer does not hold; return it to its sender"
    )]
    StaleReference {
        /// The reference version the share named.
        version: u64,
    },
    /// A receiver refused a share ([`SgpInput::ShareRefused`](super::SgpInput::ShareRefused))
    /// that this peer cannot take back: another share went out on that edge since, or the
    /// edge was forgotten. The refused share's mass is lost, as a crashed peer's is.
    #[error(
        "the share of step {step} was refused by its receiver but cannot be taken back (a later share went out on that edge, or the edge was forgotten); its mass is lost"
    )]
    NotTakenBack {
        /// The refused share's step.
        step: u64,
    },
    /// A share arrived after its sender asked to cancel it
    /// ([`SgpInput::CancelAsked`](super::SgpInput::CancelAsked)): the sender took its mass
    /// back, so it is dropped.
    #[error(
        "the share of step {step} arrived after its sender cancelled it and took its mass back; it was dropped"
    )]
    Cancelled {
        /// The share's step.
        step: u64,
    },
    /// A share's payload did not decode.
    #[error("share payload does not decode: {0}")]
    BadPayload(String),
    /// A caller buffer had the wrong length.
    #[error("buffer holds {got} elements but the parameter vector has {expected}")]
    LengthMismatch {
        /// Elements the parameter vector has.
        expected: usize,
        /// Elements the buffer had.
        got: usize,
    },
    /// The de-biased parameters were asked for while the peer holds no mass.
    #[error("this peer holds no push-sum mass yet; wait for its first share before training")]
    NoMass,
    /// `LocalStepDone` arrived while no step had been started.
    #[error("a local step finished but none was started; start a step only after `StartStep`")]
    NoStepInProgress,
    /// The parameters were asked for, or a step finished, at the wrong point of a loan:
    /// lent twice, or the step done before they came back.
    #[error(
        "the parameters are lent for a local step; give them back (`return_parameters`) \
         before the step is done, and lend them once a step"
    )]
    Lent,
    /// An input arrived after the peer finished leaving.
    #[error("this peer has left the swarm and handed off its mass; start a new peer to rejoin")]
    Departed,
    /// A configuration value is out of range.
    #[error("averaging.sgp.{key} = {value} is out of range: {allowed}")]
    InvalidConfig {
        /// The configuration key.
        key: &'static str,
        /// The value given.
        value: String,
        /// The allowed range.
        allowed: &'static str,
    },
}

impl SgpError {
    /// Whether the transport should give the share that caused this error back to its
    /// sender instead of dropping it: the share is sound, this peer just cannot use it.
    pub fn returns_share(&self) -> bool {
        matches!(self, SgpError::StaleReference { .. } | SgpError::Departed)
    }
}
