//! A peer's view of who is in the swarm, ranked the same way on every peer.

use crate::PeerKey;

/// The live peers one peer knows of, itself included, sorted by key.
///
/// Sorting by key is what makes the communication graph consistent without coordination:
/// two peers whose views hold the same members agree on every rank, so the exponential
/// graph they derive is the same graph. Views that differ for a while (a join or a crash not
/// yet heard of everywhere) only make some shares go to an unexpected peer; push-sum stays
/// correct under any graph, so the only cost is slower mixing until the views agree again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipView<P> {
    members: Vec<P>,
}

impl<P: PeerKey> MembershipView<P> {
    /// A view holding `members` (duplicates are dropped).
    pub fn new(members: impl IntoIterator<Item = P>) -> MembershipView<P> {
        let mut members: Vec<P> = members.into_iter().collect();
        members.sort_unstable();
        members.dedup();
        MembershipView { members }
    }

    /// Number of live peers in the view.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The members in rank order.
    pub fn members(&self) -> &[P] {
        &self.members
    }

    /// The rank of `peer` (its index in key order), if it is in the view.
    pub fn rank_of(&self, peer: P) -> Option<usize> {
        self.members.binary_search(&peer).ok()
    }

    /// The peer at `rank`, counted modulo the view's size; `None` for an empty view.
    pub fn at_rank(&self, rank: usize) -> Option<P> {
        let n = self.members.len();
        if n == 0 {
            None
        } else {
            Some(self.members[rank % n])
        }
    }

    /// Whether `peer` is in the view.
    pub fn contains(&self, peer: P) -> bool {
        self.rank_of(peer).is_some()
    }

    /// Adds `peer`; returns whether it was new.
    pub fn insert(&mut self, peer: P) -> bool {
        match self.members.binary_search(&peer) {
            Ok(_) => false,
            Err(at) => {
                self.members.insert(at, peer);
                true
            }
        }
    }

    /// Removes `peer`; returns whether it was present.
    pub fn remove(&mut self, peer: P) -> bool {
        match self.members.binary_search(&peer) {
            Ok(at) => {
                self.members.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    /// The next peer after `peer` in rank order (wrapping), other than `peer` itself.
    ///
    /// `peer` need not be in the view: the successor of an absent key is the first member
    /// with a larger key. `None` when no other peer is known.
    pub fn successor(&self, peer: P) -> Option<P> {
        let at = match self.members.binary_search(&peer) {
            Ok(at) => at + 1,
            Err(at) => at,
        };
        let n = self.members.len();
        (0..n)
            .map(|offset| self.members[(at + offset) % n])
            .find(|&candidate| candidate != peer)
    }
}
