//! [`Parcel`]: a message of the averaging protocols, owned, so that it can cross from the
//! stream that read it to the engine that acts on it.
//!
//! Parcels are plain data: the engines produce and consume them without any I/O, the
//! simulator carries them over its virtual links (with `u32` peer keys), and the network
//! layer turns them into frames on tensor streams (with libp2p peer ids).

use murmur_protocol::identity::PeerId;
use murmur_protocol::message::{
    AveragedChunk, GroupBegin, GroupMember, GroupReject, JoinGroup, MAX_GROUP_MEMBERS, Message,
    PushSumShare, ShareCancel, ShareReceipt, ShareRefused, StateSyncRequest, StateSyncResponse,
    TensorPartChunk,
};

/// An averaging-protocol message with its payload in an owned buffer.
///
/// The scalar fields travel as the wire struct itself with an empty payload slice; the
/// payload bytes sit beside it ([`Parcel::into_payload`] takes them out). Buffers come from
/// a pool and go back to it (the network layer's is
/// [`Mailbox::recycle`](crate::net::exchange::Mailbox::recycle)).
///
/// `P` names peers (in a group start's member list): [`PeerId`] on the network, any
/// [`PeerKey`](crate::PeerKey) in the simulator.
#[derive(Debug, Clone, PartialEq)]
pub enum Parcel<P = PeerId> {
    /// A push-sum share (SGP).
    Share(PushSumShare<'static>, Vec<u8>),
    /// A push-sum share its receiver could not use, for the sender to take back (SGP).
    ShareRefused(ShareRefused),
    /// What became of a push-sum share at its receiver (SGP).
    ShareReceipt(ShareReceipt),
    /// A sender's request for the receipt of a share it has not had one for (SGP).
    ShareCancel(ShareCancel),
    /// A member's copy of a chunk of the part its receiver reduces (butterfly, ring).
    PartChunk(TensorPartChunk<'static>, Vec<u8>),
    /// A chunk of an averaged part (butterfly).
    Averaged(AveragedChunk<'static>, Vec<u8>),
    /// A request to join a butterfly group.
    JoinGroup(JoinGroup),
    /// A butterfly group's start: round, group id, and the members in part order with the
    /// elements each reduces.
    GroupBegin {
        /// The round the group averages.
        round: u64,
        /// The group's id in its chunks.
        group_id: u64,
        /// Members and their part sizes, in part order.
        members: Vec<(P, u64)>,
    },
    /// A refused join.
    GroupReject(GroupReject),
    /// A request for a range of the swarm state.
    StateSyncRequest(StateSyncRequest),
    /// A range of the swarm state.
    StateSyncResponse(StateSyncResponse<'static>, Vec<u8>),
}

/// Why a received message could not become a [`Parcel`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParcelError {
    /// The message kind does not belong on a tensor stream.
    #[error("a {0} message does not belong on a tensor stream")]
    WrongStream(&'static str),
    /// A group member's peer id is not a valid peer id.
    #[error("group member {index} has an invalid peer id")]
    BadMember {
        /// The member's position.
        index: usize,
    },
}

impl Parcel<PeerId> {
    /// Copies `message` into a parcel. A payload goes into a buffer from `buffer` (called
    /// only for kinds that carry one; the buffer is cleared first and grown only if too
    /// small).
    pub fn from_message(
        message: &Message<'_>,
        buffer: impl FnOnce() -> Vec<u8>,
    ) -> Result<Parcel, ParcelError> {
        let own = |bytes: &[u8]| {
            let mut buf = buffer();
            buf.clear();
            buf.extend_from_slice(bytes);
            buf
        };
        Ok(match message {
            Message::PushSumShare(m) => {
                Parcel::Share(PushSumShare { payload: &[], ..*m }, own(m.payload))
            }
            Message::TensorPartChunk(m) => {
                Parcel::PartChunk(TensorPartChunk { payload: &[], ..*m }, own(m.payload))
            }
            Message::AveragedChunk(m) => {
                Parcel::Averaged(AveragedChunk { payload: &[], ..*m }, own(m.payload))
            }
            Message::StateSyncResponse(m) => {
                Parcel::StateSyncResponse(StateSyncResponse { payload: &[], ..*m }, own(m.payload))
            }
            Message::JoinGroup(m) => Parcel::JoinGroup(*m),
            Message::GroupReject(m) => Parcel::GroupReject(*m),
            Message::StateSyncRequest(m) => Parcel::StateSyncRequest(*m),
            Message::ShareRefused(m) => Parcel::ShareRefused(*m),
            Message::ShareReceipt(m) => Parcel::ShareReceipt(*m),
            Message::ShareCancel(m) => Parcel::ShareCancel(*m),
            Message::GroupBegin(m) => {
                let mut members = Vec::with_capacity(m.members.len().min(MAX_GROUP_MEMBERS));
                for (index, member) in m.members.iter().enumerate() {
                    let peer = PeerId::from_bytes(member.peer_id)
                        .map_err(|_| ParcelError::BadMember { index })?;
                    members.push((peer, member.part_elements));
                }
                Parcel::GroupBegin {
                    round: m.round,
                    group_id: m.group_id,
                    members,
                }
            }
            Message::AuthHello(_) => return Err(ParcelError::WrongStream("auth hello")),
            Message::Heartbeat(_) => return Err(ParcelError::WrongStream("heartbeat")),
            Message::Reject(_) => return Err(ParcelError::WrongStream("reject")),
        })
    }

    /// The parcel as a wire message borrowing its payload. A group start's member ids are
    /// written into `ids` (left empty for every other kind, so nothing is allocated).
    pub fn as_message<'a>(&'a self, ids: &'a mut Vec<[u8; PeerId::ENCODED_LEN]>) -> Message<'a> {
        match self {
            Parcel::Share(m, payload) => Message::PushSumShare(PushSumShare { payload, ..*m }),
            Parcel::PartChunk(m, payload) => {
                Message::TensorPartChunk(TensorPartChunk { payload, ..*m })
            }
            Parcel::Averaged(m, payload) => Message::AveragedChunk(AveragedChunk { payload, ..*m }),
            Parcel::StateSyncResponse(m, payload) => {
                Message::StateSyncResponse(StateSyncResponse { payload, ..*m })
            }
            Parcel::JoinGroup(m) => Message::JoinGroup(*m),
            Parcel::GroupReject(m) => Message::GroupReject(*m),
            Parcel::StateSyncRequest(m) => Message::StateSyncRequest(*m),
            Parcel::ShareRefused(m) => Message::ShareRefused(*m),
            Parcel::ShareReceipt(m) => Message::ShareReceipt(*m),
            Parcel::ShareCancel(m) => Message::ShareCancel(*m),
            Parcel::GroupBegin {
                round,
                group_id,
                members,
            } => {
                ids.clear();
                ids.extend(members.iter().map(|(p, _)| p.to_bytes()));
                let members = ids
                    .iter()
                    .zip(members)
                    .map(|(id, &(_, part_elements))| GroupMember {
                        peer_id: id,
                        part_elements,
                    })
                    .collect();
                Message::GroupBegin(GroupBegin {
                    round: *round,
                    group_id: *group_id,
                    members,
                })
            }
        }
    }
}

impl<P> Parcel<P> {
    /// Takes the payload buffer out (empty for parcels without one), to recycle it.
    pub fn into_payload(self) -> Vec<u8> {
        match self {
            Parcel::Share(_, p)
            | Parcel::PartChunk(_, p)
            | Parcel::Averaged(_, p)
            | Parcel::StateSyncResponse(_, p) => p,
            _ => Vec::new(),
        }
    }

    /// Payload bytes carried.
    pub fn payload_len(&self) -> usize {
        match self {
            Parcel::Share(_, p)
            | Parcel::PartChunk(_, p)
            | Parcel::Averaged(_, p)
            | Parcel::StateSyncResponse(_, p) => p.len(),
            _ => 0,
        }
    }
}
