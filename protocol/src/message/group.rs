//! Matchmaking for butterfly all-reduce: asking to join a group, the group's start with
//! its members and partition, and refusals.

use super::fields::{check_len, decode_with, encode_with, read_bool, write_bool};
use super::{MessageError, WireMessage};
use crate::frame::FrameKind;
use crate::wire::{Reader, Writer};

/// Largest group a [`GroupBegin`] may announce.
pub const MAX_GROUP_MEMBERS: usize = 256;

/// Longest peer id accepted, in bytes (a libp2p ed25519 peer id takes 38).
pub const MAX_PEER_ID_LEN: usize = 64;

/// Asks a group leader to be included in the next all-reduce of `round`.
///
/// Wire form, 33 bytes: `round u64 | deadline_ms u64 | bandwidth_bytes_per_s u64 |
/// accepts_connections u8 (0 or 1) | samples u64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinGroup {
    /// The averaging round the sender is ready for.
    pub round: u64,
    /// When the sender stops waiting, in milliseconds since the Unix epoch: a group that has
    /// not begun by then proceeds without it.
    pub deadline_ms: u64,
    /// The sender's measured bandwidth in bytes per second, which sizes the part it reduces.
    pub bandwidth_bytes_per_s: u64,
    /// Whether other members can open connections to the sender. One that cannot (behind
    /// NAT, no relay) is given no part to reduce.
    pub accepts_connections: bool,
    /// Samples behind the sender's contribution: its weight in the average.
    pub samples: u64,
}

impl<'a> WireMessage<'a> for JoinGroup {
    const KIND: FrameKind = FrameKind::JoinGroup;

    fn encoded_len(&self) -> usize {
        8 + 8 + 8 + 1 + 8
    }

    fn validate(&self) -> Result<(), MessageError> {
        Ok(())
    }

    fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError> {
        encode_with(out, WireMessage::encoded_len(self), |w| {
            w.u64(self.round)?;
            w.u64(self.deadline_ms)?;
            w.u64(self.bandwidth_bytes_per_s)?;
            write_bool(w, self.accepts_connections)?;
            Ok(w.u64(self.samples)?)
        })
    }

    fn decode(payload: &'a [u8]) -> Result<Self, MessageError> {
        decode_with(<Self as WireMessage<'a>>::KIND, payload, |r| {
            Ok(JoinGroup {
                round: r.u64("round")?,
                deadline_ms: r.u64("deadline_ms")?,
                bandwidth_bytes_per_s: r.u64("bandwidth_bytes_per_s")?,
                accepts_connections: read_bool(r, "accepts_connections")?,
                samples: r.u64("samples")?,
            })
        })
    }
}

/// One member of a group and the part of the flat vector it reduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupMember<'a> {
    /// The member's peer id in its binary (multihash) form, 1 to [`MAX_PEER_ID_LEN`] bytes.
    pub peer_id: &'a [u8],
    /// Elements of the flat vector in the member's part; 0 for a member that reduces none.
    pub part_elements: u64,
}

/// Wire size of a member with a one-byte peer id: the least a member takes.
const MIN_MEMBER_LEN: usize = 1 + 1 + 8;

impl GroupMember<'_> {
    fn encoded_len(&self) -> usize {
        1 + self.peer_id.len() + 8
    }
}

/// The leader's announcement that a group has formed: who is in it and which part each
/// member reduces.
///
/// Member `j` reduces part `j`, which starts where part `j - 1` ends; the parts together
/// cover the flat vector from element 0. Every member streams its copy of part `j` to
/// member `j` as [`TensorPartChunk`](super::TensorPartChunk)s tagged with `group_id`.
///
/// Wire form: `round u64 | group_id u64 | member_count u16 | member_count × (peer_id_len u8
/// | peer_id | part_elements u64)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupBegin<'a> {
    /// The round the group averages, as in the members' [`JoinGroup`]s.
    pub round: u64,
    /// Identifies the group's all-reduce in its tensor chunks; chosen by the leader.
    pub group_id: u64,
    /// The members in part order: 1 to [`MAX_GROUP_MEMBERS`], no peer id twice, part sizes
    /// summing to at most `u64::MAX` elements.
    pub members: Vec<GroupMember<'a>>,
}

impl GroupBegin<'_> {
    /// Elements the group averages: the sum of the part sizes.
    pub fn total_elements(&self) -> Option<u64> {
        self.members
            .iter()
            .try_fold(0u64, |sum, m| sum.checked_add(m.part_elements))
    }
}

impl<'a> WireMessage<'a> for GroupBegin<'a> {
    const KIND: FrameKind = FrameKind::GroupBegin;

    fn encoded_len(&self) -> usize {
        8 + 8
            + 2
            + self
                .members
                .iter()
                .map(GroupMember::encoded_len)
                .sum::<usize>()
    }

    fn validate(&self) -> Result<(), MessageError> {
        if self.members.is_empty() {
            return Err(MessageError::InvalidField {
                field: "members",
                reason: "a group has at least one member",
            });
        }
        check_len("members", self.members.len(), MAX_GROUP_MEMBERS)?;
        for (index, member) in self.members.iter().enumerate() {
            if member.peer_id.is_empty() {
                return Err(MessageError::InvalidField {
                    field: "peer_id",
                    reason: "must not be empty",
                });
            }
            check_len("peer_id", member.peer_id.len(), MAX_PEER_ID_LEN)?;
            // Quadratic, but over at most MAX_GROUP_MEMBERS short ids.
            if self.members[..index]
                .iter()
                .any(|earlier| earlier.peer_id == member.peer_id)
            {
                return Err(MessageError::InvalidField {
                    field: "peer_id",
                    reason: "the same peer is listed twice",
                });
            }
        }
        if self.total_elements().is_none() {
            return Err(MessageError::InvalidField {
                field: "part_elements",
                reason: "part sizes sum past u64::MAX",
            });
        }
        Ok(())
    }

    fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError> {
        self.validate()?;
        encode_with(out, self.encoded_len(), |w| {
            w.u64(self.round)?;
            w.u64(self.group_id)?;
            let count = u16::try_from(self.members.len()).map_err(|_| MessageError::TooLong {
                field: "members",
                len: self.members.len(),
                max: MAX_GROUP_MEMBERS,
            })?;
            w.u16(count)?;
            self.members
                .iter()
                .try_for_each(|member| write_member(w, member))
        })
    }

    fn decode(payload: &'a [u8]) -> Result<Self, MessageError> {
        let begin = decode_with(Self::KIND, payload, |r| {
            let round = r.u64("round")?;
            let group_id = r.u64("group_id")?;
            let count = usize::from(r.u16("member_count")?);
            check_len("members", count, MAX_GROUP_MEMBERS)?;
            // The count is bounded; also make sure the bytes for that many members are
            // there before reserving room for them.
            let needed = count * MIN_MEMBER_LEN;
            if r.remaining() < needed {
                return Err(MessageError::Truncated {
                    field: "members",
                    needed,
                    remaining: r.remaining(),
                });
            }
            let mut members = Vec::with_capacity(count);
            for _ in 0..count {
                members.push(read_member(r)?);
            }
            Ok(GroupBegin {
                round,
                group_id,
                members,
            })
        })?;
        begin.validate()?;
        Ok(begin)
    }
}

fn write_member(w: &mut Writer<'_>, member: &GroupMember<'_>) -> Result<(), MessageError> {
    let len = u8::try_from(member.peer_id.len()).map_err(|_| MessageError::TooLong {
        field: "peer_id",
        len: member.peer_id.len(),
        max: MAX_PEER_ID_LEN,
    })?;
    w.u8(len)?;
    w.bytes(member.peer_id)?;
    Ok(w.u64(member.part_elements)?)
}

fn read_member<'a>(r: &mut Reader<'a>) -> Result<GroupMember<'a>, MessageError> {
    let len = usize::from(r.u8("peer_id_len")?);
    check_len("peer_id", len, MAX_PEER_ID_LEN)?;
    Ok(GroupMember {
        peer_id: r.bytes(len, "peer_id")?,
        part_elements: r.u64("part_elements")?,
    })
}

/// Why a leader refused a [`JoinGroup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum GroupRejectReason {
    /// The round's group has already begun or its deadline passed; try the next round.
    RoundClosed = 1,
    /// The group has reached its size limit; try another leader.
    GroupFull = 2,
    /// The leader is gathering a different round; the sender is ahead or behind.
    RoundMismatch = 3,
    /// The peer is not gathering a group at all.
    NotGathering = 4,
}

impl GroupRejectReason {
    /// Every reason, in byte order.
    pub const ALL: [GroupRejectReason; 4] = [
        GroupRejectReason::RoundClosed,
        GroupRejectReason::GroupFull,
        GroupRejectReason::RoundMismatch,
        GroupRejectReason::NotGathering,
    ];

    /// The reason with this byte value, if any.
    pub fn from_byte(byte: u8) -> Option<GroupRejectReason> {
        GroupRejectReason::ALL
            .into_iter()
            .find(|reason| *reason as u8 == byte)
    }

    /// The reason's byte value on the wire.
    pub fn to_byte(self) -> u8 {
        self as u8
    }
}

/// A leader's refusal of a [`JoinGroup`].
///
/// Wire form, 9 bytes: `round u64 | reason u8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupReject {
    /// The round of the refused request.
    pub round: u64,
    /// Why it was refused.
    pub reason: GroupRejectReason,
}

impl<'a> WireMessage<'a> for GroupReject {
    const KIND: FrameKind = FrameKind::GroupReject;

    fn encoded_len(&self) -> usize {
        8 + 1
    }

    fn validate(&self) -> Result<(), MessageError> {
        Ok(())
    }

    fn encode_into(&self, out: &mut [u8]) -> Result<usize, MessageError> {
        encode_with(out, WireMessage::encoded_len(self), |w| {
            w.u64(self.round)?;
            Ok(w.u8(self.reason.to_byte())?)
        })
    }

    fn decode(payload: &'a [u8]) -> Result<Self, MessageError> {
        decode_with(<Self as WireMessage<'a>>::KIND, payload, |r| {
            let round = r.u64("round")?;
            let value = r.u8("reason")?;
            let reason = GroupRejectReason::from_byte(value).ok_or(MessageError::InvalidEnum {
                field: "reason",
                value,
            })?;
            Ok(GroupReject { round, reason })
        })
    }
}
