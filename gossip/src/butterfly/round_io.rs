//! What goes into a butterfly round and what comes out: one input per wire message or
//! transport event, one output per wire message to send.

use murmur_protocol::codec::CodecSpec;
use murmur_protocol::message::ChunkAddress;

use super::payload::PayloadRef;
use super::report::CoverageReport;
#[cfg(doc)]
use super::round::ButterflyRound;

/// What happened, as told to a [`ButterflyRound`](super::ButterflyRound).
#[derive(Debug, Clone, Copy)]
pub enum RoundInput<'a, P> {
    /// A member's copy of a chunk of the part this member reduces (`TensorPartChunk`).
    PartChunk {
        /// The sender, as the transport authenticated it.
        from: P,
        /// Which elements the chunk holds.
        address: ChunkAddress,
        /// Samples behind the sender's contribution.
        weight: f32,
        /// How the payload is encoded.
        codec: CodecSpec,
        /// The encoded elements.
        payload: &'a [u8],
    },
    /// A chunk of a part averaged by its reducer (`AveragedChunk`).
    AveragedChunk {
        /// The reducer, as the transport authenticated it.
        from: P,
        /// Which elements the chunk holds.
        address: ChunkAddress,
        /// Members whose contributions the average covers.
        contributors: u32,
        /// Sum of their weights.
        total_weight: f32,
        /// How the payload is encoded.
        codec: CodecSpec,
        /// The encoded elements.
        payload: &'a [u8],
    },
    /// The transport is done with a payload this round asked it to send: written, or
    /// abandoned because the connection failed. Every send must be answered this way.
    Sent {
        /// The receiver the payload was for.
        to: P,
        /// The payload's reference from the send output.
        payload: PayloadRef,
    },
    /// The transport lost its connection to a member: stop waiting for it as a sender and
    /// as a reducer now, without waiting for the timeouts.
    MemberLost(P),
    /// A member went quiet (its heartbeats are late) but is not known to be gone: stop
    /// waiting for it as a sender and as a reducer, and keep sending it what it is owed.
    /// A live member that got nothing would wait out its reducer timeout.
    MemberQuiet(P),
    /// The time returned by [`ButterflyRound::poll_timeout`] has come.
    Tick,
}

#[cfg(test)]
impl<'a, P> RoundInput<'a, P> {
    /// What a chunk `from` sent makes at its receiver: with `contributors`, an average over
    /// that many members of `weight` samples in all; without, a part chunk of a sender's
    /// `weight` samples.
    pub(crate) fn arrived(
        from: P,
        address: ChunkAddress,
        weight: f32,
        contributors: Option<u32>,
        codec: CodecSpec,
        payload: &'a [u8],
    ) -> RoundInput<'a, P> {
        match contributors {
            Some(contributors) => RoundInput::AveragedChunk {
                from,
                address,
                contributors,
                total_weight: weight,
                codec,
                payload,
            },
            None => RoundInput::PartChunk {
                from,
                address,
                weight,
                codec,
                payload,
            },
        }
    }
}

/// What a [`ButterflyRound`](super::ButterflyRound) asks its caller to do.
#[derive(Debug, Clone, PartialEq)]
pub enum RoundOutput<P> {
    /// Send a chunk of this member's copy of part `address.part` to its reducer, as a
    /// `TensorPartChunk` with the round's codec; then answer with [`RoundInput::Sent`].
    SendPartChunk {
        /// The part's reducer.
        to: P,
        /// Which elements the chunk holds.
        address: ChunkAddress,
        /// Samples behind this member's contribution.
        weight: f32,
        /// The encoded elements; read them with [`ButterflyRound::payload`].
        payload: PayloadRef,
    },
    /// Send an averaged chunk of this member's part to another member, as an
    /// `AveragedChunk` with the round's codec; then answer with [`RoundInput::Sent`].
    SendAveragedChunk {
        /// The member it is for.
        to: P,
        /// Which elements the chunk holds.
        address: ChunkAddress,
        /// Members whose contributions the average covers.
        contributors: u32,
        /// Sum of their weights.
        total_weight: f32,
        /// The encoded elements; read them with [`ButterflyRound::payload`].
        payload: PayloadRef,
    },
    /// This member's result is complete: [`ButterflyRound::result`] holds the averaged
    /// vector. Keep feeding [`RoundInput::Sent`] until [`ButterflyRound::is_idle`], so that
    /// the averages of this member's part reach the others.
    Finished(CoverageReport<P>),
}

/// Counters of one round, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundStats {
    /// Chunks of this member's contribution handed to the transport.
    pub part_chunks_sent: u64,
    /// Averaged chunks handed to the transport.
    pub averaged_chunks_sent: u64,
    /// Contributions to this member's part accumulated.
    pub part_chunks_received: u64,
    /// Averaged chunks written into the result.
    pub averaged_chunks_received: u64,
    /// Chunks that arrived too late (part already final or given up) or twice.
    pub chunks_ignored: u64,
    /// Send buffers allocated by the round (bounded by the pipeline depth).
    pub buffers_allocated: u64,
    /// Contributions to this member's part that CenteredClip set aside as outliers, summed
    /// over chunks.
    pub contributions_rejected: u64,
    /// Senders whose declared weight this member's reduction cut to its bound
    /// ([`ButterflyConfig::max_weight_ratio`](super::ButterflyConfig::max_weight_ratio)).
    pub weights_capped: u64,
}
