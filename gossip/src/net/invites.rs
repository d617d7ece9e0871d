//! [`VerifiedInvites`]: whose invite this node has checked, so that a heartbeat counts by
//! its signer and not by whoever forwarded it.
//!
//! Gossip relays messages, so the peer that hands us a heartbeat is not, in general, the
//! peer that signed it. Checking only the forwarder let an admitted member relay heartbeats
//! signed by a key that holds no invite: a phantom peer that every round would wait for.
//! The network layer learns invites only from the auth hello (the `auth` module), so it
//! remembers each peer whose hello it accepted, with the invite's expiry, and a heartbeat
//! counts only if its signer is remembered with an invite that has not run out.
//!
//! A peer stays remembered after it disconnects, until its invite expires: a member that is
//! momentarily cut off from us but still reaches the swarm through others proved its invite
//! before, so its relayed heartbeats still count. A peer that fails a later check (its
//! hello is refused, or it refuses ours) is forgotten at once. A signer this node never
//! verified is refused, even if another member vouches for it by relaying: this node could
//! not open a verified tensor stream to it either.
//!
//! The record is bounded: at capacity it first drops expired invites, then the one verified
//! longest ago. A peer dropped that way that is still connected and admitted keeps counting
//! through its live connection state; one that is neither must connect again to be heard.
//! No I/O here: the time is an argument.

use std::collections::HashMap;

use murmur_protocol::identity::PeerId;
use thiserror::Error;

/// Why a heartbeat's signer does not count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub(crate) enum SignerRefusal {
    /// This node never verified the signer's invite, or forgot it (refused later, or
    /// evicted at capacity).
    #[error("its invite was never verified by this node (or no longer counts)")]
    NotVerified,
    /// The signer's invite ran out.
    #[error("its invite expired at {expires_at} (unix seconds)")]
    Expired {
        /// When it ran out (unix seconds).
        expires_at: u64,
    },
}

/// One remembered invite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Verified {
    /// When the invite runs out (unix seconds).
    expires_at: u64,
    /// Order of the latest verification; the smallest is evicted first at capacity.
    verified_seq: u64,
}

/// Peers whose invite this node verified, with each invite's expiry; at most `capacity`.
#[derive(Debug)]
pub(crate) struct VerifiedInvites {
    entries: HashMap<PeerId, Verified>,
    capacity: usize,
    next_seq: u64,
}

impl VerifiedInvites {
    /// An empty record of at most `capacity` peers (at least one).
    pub(crate) fn new(capacity: usize) -> VerifiedInvites {
        VerifiedInvites {
            entries: HashMap::new(),
            capacity: capacity.max(1),
            next_seq: 0,
        }
    }

    /// `peer`'s hello was accepted at `now_unix_s`, its invite running out at `expires_at`:
    /// remembers it, or refreshes it. At capacity, first drops every expired invite, then
    /// the one verified longest ago.
    pub(crate) fn verified(&mut self, peer: PeerId, expires_at: u64, now_unix_s: u64) {
        if !self.entries.contains_key(&peer) && self.entries.len() >= self.capacity {
            self.entries.retain(|_, v| v.expires_at > now_unix_s);
            if self.entries.len() >= self.capacity {
                let oldest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, v)| v.verified_seq)
                    .map(|(p, _)| *p);
                if let Some(oldest) = oldest {
                    self.entries.remove(&oldest);
                }
            }
        }
        let verified_seq = self.next_seq;
        self.next_seq += 1;
        self.entries.insert(
            peer,
            Verified {
                expires_at,
                verified_seq,
            },
        );
    }

    /// `peer` failed a check (or stopped accepting us): its earlier verification no longer
    /// counts.
    pub(crate) fn forget(&mut self, peer: &PeerId) {
        self.entries.remove(peer);
    }

    /// Whether a heartbeat signed by `signer` counts at `now_unix_s`.
    pub(crate) fn check(&self, signer: &PeerId, now_unix_s: u64) -> Result<(), SignerRefusal> {
        match self.entries.get(signer) {
            None => Err(SignerRefusal::NotVerified),
            Some(v) if v.expires_at <= now_unix_s => Err(SignerRefusal::Expired {
                expires_at: v.expires_at,
            }),
            Some(_) => Ok(()),
        }
    }

    /// Peers remembered now, expired ones included until they are dropped.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use murmur_protocol::identity::Keypair;

    use super::*;

    const NOW: u64 = 1_700_000_000;

    fn peer(n: u8) -> PeerId {
        Keypair::from_seed([n; 32]).peer_id()
    }

    #[test]
    fn a_signer_counts_only_while_its_verified_invite_is_valid() {
        let mut invites = VerifiedInvites::new(8);
        assert_eq!(
            invites.check(&peer(1), NOW),
            Err(SignerRefusal::NotVerified)
        );
        invites.verified(peer(1), NOW + 10, NOW);
        assert_eq!(invites.check(&peer(1), NOW), Ok(()));
        assert_eq!(invites.check(&peer(1), NOW + 9), Ok(()));
        assert_eq!(
            invites.check(&peer(1), NOW + 10),
            Err(SignerRefusal::Expired {
                expires_at: NOW + 10
            })
        );
        assert_eq!(
            invites.check(&peer(2), NOW),
            Err(SignerRefusal::NotVerified),
            "one peer's verification does not vouch for another"
        );
    }

    #[test]
    fn a_new_hello_refreshes_and_a_refusal_forgets() {
        let mut invites = VerifiedInvites::new(8);
        invites.verified(peer(1), NOW + 10, NOW);
        invites.verified(peer(1), NOW + 100, NOW + 5);
        assert_eq!(
            invites.check(&peer(1), NOW + 50),
            Ok(()),
            "the renewed invite"
        );
        assert_eq!(invites.len(), 1);
        invites.forget(&peer(1));
        assert_eq!(
            invites.check(&peer(1), NOW + 50),
            Err(SignerRefusal::NotVerified)
        );
    }

    #[test]
    fn at_capacity_expired_invites_go_first_then_the_oldest_verification() {
        let mut invites = VerifiedInvites::new(3);
        invites.verified(peer(1), NOW + 100, NOW);
        invites.verified(peer(2), NOW + 5, NOW);
        invites.verified(peer(3), NOW + 100, NOW);
        // Peer 2's invite has run out: it makes room, peer 1 stays though verified earlier.
        invites.verified(peer(4), NOW + 100, NOW + 10);
        assert_eq!(invites.len(), 3);
        assert_eq!(
            invites.check(&peer(2), NOW + 10),
            Err(SignerRefusal::NotVerified)
        );
        for p in [1, 3, 4] {
            assert_eq!(invites.check(&peer(p), NOW + 10), Ok(()), "peer {p}");
        }
        // None expired: the one verified longest ago (peer 1) goes, unless refreshed.
        invites.verified(peer(1), NOW + 100, NOW + 11);
        invites.verified(peer(5), NOW + 100, NOW + 12);
        assert_eq!(invites.len(), 3);
        assert_eq!(
            invites.check(&peer(3), NOW + 12),
            Err(SignerRefusal::NotVerified)
        );
        for p in [1, 4, 5] {
            assert_eq!(invites.check(&peer(p), NOW + 12), Ok(()), "peer {p}");
        }
    }

    #[test]
    fn the_record_never_grows_past_its_capacity() {
        let mut invites = VerifiedInvites::new(16);
        for n in 0..=255u8 {
            invites.verified(peer(n), NOW + 100, NOW);
            assert!(invites.len() <= 16);
        }
        assert_eq!(invites.check(&peer(255), NOW), Ok(()), "the newest is kept");
    }
}
