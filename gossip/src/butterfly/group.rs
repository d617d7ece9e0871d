//! A formed group: who averages together, and which part of the vector each member reduces.

use std::ops::Range;

use crate::PeerKey;

use super::config::MAX_GROUP;
use super::error::ButterflyError;
use super::partition::Partition;

/// A group as its `GroupBegin` announces it: the members in part order and the partition.
///
/// Member `j` reduces part `j`. Every member of a group holds the same `Group`, so all of
/// them agree on every chunk's address without further messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group<P> {
    /// The averaging round, as in the members' join requests.
    pub round: u64,
    /// Identifies this all-reduce in its chunks; chosen by the leader.
    pub group_id: u64,
    members: Vec<P>,
    partition: Partition,
}

impl<P: PeerKey> Group<P> {
    /// A group after checking that members are distinct and match the partition's parts.
    pub fn new(
        round: u64,
        group_id: u64,
        members: Vec<P>,
        partition: Partition,
    ) -> Result<Group<P>, ButterflyError> {
        if members.is_empty() || members.len() > MAX_GROUP {
            return Err(ButterflyError::InvalidGroup {
                reason: "a group has 1 to 256 members",
            });
        }
        if partition.parts() != members.len() {
            return Err(ButterflyError::InvalidGroup {
                reason: "the partition must have one part per member",
            });
        }
        let mut sorted = members.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(ButterflyError::InvalidGroup {
                reason: "a peer is listed twice",
            });
        }
        Ok(Group {
            round,
            group_id,
            members,
            partition,
        })
    }

    /// The members in part order.
    pub fn members(&self) -> &[P] {
        &self.members
    }

    /// How the vector is split among the members.
    pub fn partition(&self) -> &Partition {
        &self.partition
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the group has no member (never true for a group built by [`Group::new`]).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The part index (and position) of `peer`, if it is a member.
    pub fn index_of(&self, peer: P) -> Option<usize> {
        self.members.iter().position(|&m| m == peer)
    }
}

/// How one part is cut into chunks: `chunk` elements each, the last one shorter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChunkLayout {
    /// The part's elements in the flat vector.
    pub(crate) range: Range<usize>,
    /// Elements per chunk.
    pub(crate) chunk: usize,
}

impl ChunkLayout {
    pub(crate) fn new(range: Range<usize>, chunk: usize) -> ChunkLayout {
        ChunkLayout { range, chunk }
    }

    pub(crate) fn len(&self) -> usize {
        self.range.len()
    }

    pub(crate) fn chunks(&self) -> usize {
        self.len().div_ceil(self.chunk)
    }

    /// Elements of chunk `index`, relative to the part's start.
    pub(crate) fn local(&self, index: usize) -> Range<usize> {
        let start = (index * self.chunk).min(self.len());
        start..(start + self.chunk).min(self.len())
    }

    /// Elements of chunk `index` in the flat vector.
    pub(crate) fn global(&self, index: usize) -> Range<usize> {
        let local = self.local(index);
        self.range.start + local.start..self.range.start + local.end
    }

    /// Checks that a received address names a real chunk of this part, returning its index.
    pub(crate) fn check(
        &self,
        chunk: u32,
        offset: u64,
        elements: u32,
    ) -> Result<usize, &'static str> {
        let index = chunk as usize;
        if index >= self.chunks() {
            return Err("chunk index past the end of the part");
        }
        let local = self.local(index);
        if offset != local.start as u64 {
            return Err("offset does not match the chunk index");
        }
        if elements as usize != local.len() {
            return Err("element count does not match the chunk");
        }
        Ok(index)
    }
}
