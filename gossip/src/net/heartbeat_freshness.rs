//! [`HeartbeatFreshness`]: stale and replayed heartbeats are dropped.
//!
//! A heartbeat's signature proves who wrote it, not when. Gossipsub forgets the ids of the
//! messages it has seen after a couple of minutes, so an old heartbeat sent again later, by
//! anyone who kept it, would pass every other check and tell the swarm that its signer is
//! at an old step, alive, or looking for a round. Each heartbeat therefore counts only if
//!
//! - its `timestamp_ms` is within `net.max_heartbeat_age_ms` of this node's clock, either
//!   way (a heartbeat that old is stale; one that far ahead comes from a clock too wrong to
//!   trust, and would otherwise shut out its signer's real heartbeats as "replays"), and
//! - it is newer than the last heartbeat accepted from the same signer (not a replay).
//!
//! The last timestamp of at most a bounded number of signers is kept; past that, the signer
//! heard from longest ago is forgotten. Its replays older than the age bound stay refused.

use std::collections::HashMap;

use murmur_protocol::identity::PeerId;
use thiserror::Error;

/// Why a heartbeat was not fresh.
#[derive(Debug, Clone, Copy, Error, PartialEq, Eq)]
pub(crate) enum Staleness {
    /// Older than `net.max_heartbeat_age_ms`, or that far in the future.
    #[error(
        "its timestamp {timestamp_ms} is {off_ms} ms from this node's clock, over net.max_heartbeat_age_ms"
    )]
    OutOfWindow {
        /// The heartbeat's timestamp.
        timestamp_ms: u64,
        /// How far it is from now, either way.
        off_ms: u64,
    },
    /// Not newer than the last heartbeat accepted from its signer.
    #[error("replayed: its timestamp {timestamp_ms} is not after {last_ms}, its signer's last")]
    Replayed {
        /// The heartbeat's timestamp.
        timestamp_ms: u64,
        /// The signer's last accepted timestamp.
        last_ms: u64,
    },
}

/// The last accepted heartbeat time of each signer, and the age bound.
#[derive(Debug)]
pub(crate) struct HeartbeatFreshness {
    max_age_ms: u64,
    capacity: usize,
    last: HashMap<PeerId, u64>,
}

impl HeartbeatFreshness {
    /// Heartbeats up to `max_age_ms` from now count; at most `capacity` signers are
    /// remembered (at least one).
    pub(crate) fn new(max_age_ms: u64, capacity: usize) -> HeartbeatFreshness {
        HeartbeatFreshness {
            max_age_ms,
            capacity: capacity.max(1),
            last: HashMap::new(),
        }
    }

    /// Whether a heartbeat of `signer` written at `timestamp_ms` is fresh at `now_ms`.
    pub(crate) fn check(
        &self,
        signer: &PeerId,
        timestamp_ms: u64,
        now_ms: u64,
    ) -> Result<(), Staleness> {
        let off_ms = timestamp_ms.abs_diff(now_ms);
        if off_ms > self.max_age_ms {
            return Err(Staleness::OutOfWindow {
                timestamp_ms,
                off_ms,
            });
        }
        match self.last.get(signer) {
            Some(&last_ms) if timestamp_ms <= last_ms => Err(Staleness::Replayed {
                timestamp_ms,
                last_ms,
            }),
            _ => Ok(()),
        }
    }

    /// Records an accepted heartbeat (one that passed [`HeartbeatFreshness::check`]).
    pub(crate) fn accepted(&mut self, signer: PeerId, timestamp_ms: u64) {
        if !self.last.contains_key(&signer) && self.last.len() >= self.capacity {
            let oldest = self
                .last
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(peer, _)| *peer);
            if let Some(peer) = oldest {
                self.last.remove(&peer);
            }
        }
        let entry = self.last.entry(signer).or_insert(timestamp_ms);
        *entry = (*entry).max(timestamp_ms);
    }
}

#[cfg(test)]
mod tests {
    use murmur_protocol::identity::Keypair;

    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    fn peer(n: u8) -> PeerId {
        Keypair::from_seed([n; 32]).peer_id()
    }

    /// Heartbeats within the bound count once each and in order; older, far-future and
    /// replayed ones do not.
    #[test]
    fn only_fresh_heartbeats_newer_than_the_last_count() {
        let mut f = HeartbeatFreshness::new(60_000, 8);
        let a = peer(1);
        assert!(f.check(&a, NOW - 60_000, NOW).is_ok());
        assert!(matches!(
            f.check(&a, NOW - 60_001, NOW),
            Err(Staleness::OutOfWindow { off_ms: 60_001, .. })
        ));
        assert!(matches!(
            f.check(&a, NOW + 60_001, NOW),
            Err(Staleness::OutOfWindow { .. })
        ));
        f.accepted(a, NOW - 10);
        assert!(matches!(
            f.check(&a, NOW - 10, NOW),
            Err(Staleness::Replayed { .. })
        ));
        assert!(matches!(
            f.check(&a, NOW - 11, NOW),
            Err(Staleness::Replayed { .. })
        ));
        assert!(f.check(&a, NOW - 9, NOW).is_ok());
        // Another signer's record is its own.
        assert!(f.check(&peer(2), NOW - 10, NOW).is_ok());
    }

    /// At capacity, the signer heard from longest ago is forgotten, not the newest.
    #[test]
    fn the_record_is_bounded_and_forgets_the_longest_silent_signer() {
        let mut f = HeartbeatFreshness::new(60_000, 2);
        f.accepted(peer(1), NOW - 30);
        f.accepted(peer(2), NOW - 20);
        f.accepted(peer(3), NOW - 10);
        assert!(f.check(&peer(1), NOW - 30, NOW).is_ok(), "forgotten");
        assert!(f.check(&peer(2), NOW - 20, NOW).is_err());
        assert!(f.check(&peer(3), NOW - 10, NOW).is_err());
    }
}
