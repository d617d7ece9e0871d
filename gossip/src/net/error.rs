//! [`NetError`]: what can go wrong in the network layer.

use std::time::Duration;

use murmur_protocol::frame::FrameError;
use murmur_protocol::identity::{EnvelopeError, PeerId};
use murmur_protocol::message::{MessageError, RejectCode};
use thiserror::Error;

/// Why a network operation failed.
///
/// Errors caused by a remote peer ([`NetError::BadFrame`], [`NetError::BadMessage`],
/// [`NetError::Rejected`], [`NetError::Timeout`] on a read) concern that peer's stream only:
/// the stream is closed, and the network layer keeps serving every other peer.
#[derive(Debug, Error)]
pub enum NetError {
    /// A [`NetConfig`](super::NetConfig) field is invalid.
    #[error("config key `{key}` is invalid: {reason}")]
    Config {
        /// The key at fault, as written in the daemon's config file.
        key: &'static str,
        /// What is wrong with it and what is allowed.
        reason: String,
    },
    /// A revocation list was refused.
    #[error("revocation list refused: {0}")]
    Revocation(String),
    /// The libp2p transport could not be built.
    #[error("cannot build the network transport: {0}")]
    Transport(String),
    /// Listening on an address failed.
    #[error(
        "cannot listen on {addr} (net.listen_addrs): {reason}; check that the address is local and the port is free"
    )]
    Listen {
        /// The address from `net.listen_addrs`.
        addr: String,
        /// Why the transport refused it.
        reason: String,
    },
    /// The network task has stopped (after [`NetHandle::shutdown`](super::NetHandle::shutdown)
    /// or a crash); nothing more can be done through this handle.
    #[error("the network task has stopped; restart the network layer")]
    Stopped,
    /// A bounded wait ran out.
    #[error("{what} took longer than {after:?}; the peer is slow or gone (see the net.*_ms keys)")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// The bound that ran out.
        after: Duration,
    },
    /// The peer is not (or not yet, or no longer) authorized in this swarm.
    #[error("peer {peer} is not authorized in this swarm: {reason}")]
    NotAuthorized {
        /// The peer.
        peer: PeerId,
        /// Why.
        reason: String,
    },
    /// The peer was disconnected while the operation waited for it.
    #[error("peer {peer} disconnected")]
    Disconnected {
        /// The peer.
        peer: PeerId,
    },
    /// A peer id from libp2p is not an ed25519 peer id, so it cannot be a murmur peer.
    #[error("libp2p peer id {0} is not an ed25519 peer id; murmur peers use ed25519 keys")]
    ForeignPeerId(String),
    /// Opening a tensor stream failed.
    #[error("cannot open a tensor stream to {peer}: {reason}")]
    OpenStream {
        /// The peer.
        peer: PeerId,
        /// Why.
        reason: String,
    },
    /// Reading or writing a stream failed.
    #[error("i/o error on a stream with {peer}: {source}")]
    Io {
        /// The peer at the other end.
        peer: PeerId,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The peer sent bytes that are not a valid frame; the stream was closed.
    #[error("peer {peer} sent a bad frame, stream closed: {source}")]
    BadFrame {
        /// The peer.
        peer: PeerId,
        /// What was wrong.
        #[source]
        source: FrameError,
    },
    /// The peer sent a frame whose message does not decode; the stream was closed.
    #[error("peer {peer} sent a bad message, stream closed: {source}")]
    BadMessage {
        /// The peer.
        peer: PeerId,
        /// What was wrong.
        #[source]
        source: MessageError,
    },
    /// The peer's frames in flight, all its streams together, would hold more than
    /// `net.max_partial_frame_bytes_per_peer`; the stream was closed.
    #[error(
        "peer {peer} would have {held} bytes held in partial frames, over net.max_partial_frame_bytes_per_peer ({limit}); stream closed"
    )]
    PartialFrameBudget {
        /// The peer.
        peer: PeerId,
        /// What its partial frames would hold.
        held: u64,
        /// The budget.
        limit: u64,
    },
    /// A message could not be encoded (a local bug or an out-of-range value).
    #[error("cannot encode a message: {0}")]
    Encode(#[source] MessageError),
    /// A heartbeat could not be sealed.
    #[error("cannot seal a heartbeat: {0}")]
    Seal(#[source] EnvelopeError),
    /// The peer refused the request or stream.
    #[error("peer {peer} refused: {} ({text})", code.name())]
    Rejected {
        /// The peer.
        peer: PeerId,
        /// The peer's reason code.
        code: RejectCode,
        /// The peer's explanation (untrusted text).
        text: String,
    },
    /// A control request failed in transit.
    #[error("control request to {peer} failed: {reason}")]
    Request {
        /// The peer.
        peer: PeerId,
        /// Why.
        reason: String,
    },
    /// Dialing an address failed at once.
    #[error("cannot dial {addr}: {reason}")]
    Dial {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// [`NetHandle::respond_control`](super::NetHandle::respond_control) named a request
    /// that is not pending.
    #[error(
        "no pending control request {id}: it was answered already, or it expired \
         (net.request_timeout_ms)"
    )]
    UnknownRequest {
        /// The request id.
        id: u64,
    },
    /// Publishing a heartbeat failed.
    #[error(
        "cannot publish the heartbeat: {0}; with no connected peer in the swarm this is expected"
    )]
    Publish(String),
    /// A bounded queue was full, so the work was refused rather than queued without limit.
    #[error("the {queue} queue is full; the consumer is not keeping up")]
    QueueFull {
        /// Which queue.
        queue: &'static str,
    },
}
