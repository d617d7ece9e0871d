//! Agreed round starts: a benchmark peer begins a round once every member is ready for it.
//!
//! Rounds of `murmur bench allreduce` run back to back. A QUIC write returns once its bytes
//! are in the connection's send buffer, so a peer that has every average of a round could
//! begin the next one while its own averages for slower peers are still queued there; the
//! next round's parts would then share its uplink with them, the slowest peer would begin
//! last, and that skew would carry from round to round. In a training swarm a group's
//! leader starts its members together; here each peer tells every member when it is ready
//! for a round (a `JoinGroup` of that round) and begins once every member still connected
//! has said the same, or after a bound. Telling costs one one-way trip per round.
//!
//! A readiness message can be lost without an error: a write is done once QUIC holds its
//! bytes, and the connection may close after that. So a waiting peer tells the members
//! again every second, and a member's chunks of a round count as its readiness for it: a
//! member that has begun is not waited for.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use murmur_gossip::net::exchange::Parcel;
use murmur_protocol::identity::PeerId;
use murmur_protocol::message::JoinGroup;
use tokio::sync::broadcast::error::RecvError;

use super::BenchPeer;
use crate::run::collective::{Early, RoundHost as _, group_of};

/// The outbox tag of readiness messages, which no round's chunk uses (a round numbers its
/// sends from 0).
const READY_TAG: u64 = u64::MAX;

/// How often a waiting peer tells the members again that it is ready: a message per
/// member per second of waiting.
const RETELL_EVERY: Duration = Duration::from_secs(1);

/// The latest round each peer said it is ready for.
#[derive(Debug, Default)]
pub(super) struct Readiness {
    latest: HashMap<PeerId, u64>,
}

impl Readiness {
    /// `from` is ready for `round` (and so past every round before it).
    pub(super) fn note(&mut self, from: PeerId, round: u64) {
        let latest = self.latest.entry(from).or_insert(round);
        *latest = (*latest).max(round);
    }

    /// Notes what `parcel` from `from` says: a `JoinGroup` that `from` is ready for its
    /// round, a chunk of a round that `from` has begun that round, so was ready for it
    /// even if its readiness was lost. Returns whether the parcel was readiness alone, with
    /// nothing else in it to keep.
    pub(super) fn note_parcel(&mut self, from: PeerId, parcel: &Parcel) -> bool {
        if let Parcel::JoinGroup(j) = parcel {
            self.note(from, j.round);
            return true;
        }
        if let Some(began) = group_of(parcel) {
            self.note(from, began);
        }
        false
    }

    /// The members of `others` not yet ready for `round`, leaving out those `gone`.
    pub(super) fn waiting_on<'a>(
        &'a self,
        others: impl IntoIterator<Item = &'a PeerId> + 'a,
        round: u64,
        gone: impl Fn(&PeerId) -> bool + 'a,
    ) -> impl Iterator<Item = &'a PeerId> + 'a {
        others
            .into_iter()
            .filter(move |p| !gone(p) && self.latest.get(p).is_none_or(|&r| r < round))
    }
}

impl BenchPeer {
    /// The members still connected that have not said they are ready for `round`.
    fn not_ready(&self, round: u64) -> impl Iterator<Item = &PeerId> {
        self.ready
            .waiting_on(&self.peers, round, |p| self.disconnected.contains(p))
    }

    /// Tells every member this peer is ready for `round`, then waits until every member
    /// still connected has said the same, at most `bound`. Chunks of the round from members
    /// that begin first wait in `early`. Members still not ready at the bound are taken for
    /// gone in this round (see [`RoundHost::is_gone`]): the round gives up on them at once
    /// rather than waiting out its own timeouts too. Returns how long it waited.
    ///
    /// [`RoundHost::is_gone`]: crate::run::collective::RoundHost::is_gone
    pub(super) async fn agree_to_start(
        &mut self,
        early: &mut Early,
        round: u64,
        samples: u64,
        bound: Duration,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let bound_ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
        let deadline_ms = crate::clock::unix_ms().saturating_add(bound_ms);
        let ready = JoinGroup {
            round,
            deadline_ms,
            bandwidth_bytes_per_s: 0,
            accepts_connections: true,
            samples,
        };
        self.tell_ready(ready);
        let until = tokio::time::Instant::now() + bound;
        let mut retell = tokio::time::Instant::now() + RETELL_EVERY;
        self.unready.clear();
        while self.not_ready(round).next().is_some() {
            tokio::select! {
                Some(d) = self.mailbox.recv() => {
                    if !self.ready.note_parcel(d.from, &d.parcel) {
                        early.keep(&self.mailbox, d);
                    }
                }
                Some(report) = self.outbox.next_report() => {
                    if let Err(e) = &report.result {
                        let readiness = report.tag == READY_TAG;
                        tracing::debug!(
                            peer = %report.to,
                            round,
                            readiness,
                            error = %e,
                            "not sent while waiting for a round's start"
                        );
                    }
                    self.mailbox.recycle(report.parcel.into_payload());
                }
                event = self.events.recv() => match event {
                    Ok(event) => self.note_event(&event),
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => anyhow::bail!("the network layer stopped"),
                },
                () = tokio::time::sleep_until(retell) => {
                    self.tell_ready(ready);
                    retell += RETELL_EVERY;
                }
                () = tokio::time::sleep_until(until) => {
                    let late: Vec<PeerId> = self.not_ready(round).copied().collect();
                    tracing::warn!(
                        round,
                        late = ?late,
                        "members not ready for the round within {bound:?}; beginning without them"
                    );
                    self.unready.extend(late);
                    break;
                }
            }
        }
        Ok(started.elapsed())
    }

    /// Sends `ready` to every member still connected.
    fn tell_ready(&mut self, ready: JoinGroup) {
        for to in self.peers.difference(&self.disconnected) {
            if self
                .outbox
                .send(*to, READY_TAG, Parcel::JoinGroup(ready))
                .is_err()
            {
                tracing::debug!(peer = %to, round = ready.round, "readiness not queued: the queue is full");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(n: usize) -> Vec<PeerId> {
        (0..n)
            .map(|i| murmur_protocol::identity::Keypair::from_seed([i as u8 + 1; 32]).peer_id())
            .collect()
    }

    #[test]
    fn a_round_waits_for_every_member_not_gone() {
        let members = peers(3);
        let mut ready = Readiness::default();
        let none_gone = |_: &PeerId| false;
        let waiting = |ready: &Readiness, round, gone: &dyn Fn(&PeerId) -> bool| {
            ready
                .waiting_on(&members, round, gone)
                .copied()
                .collect::<Vec<_>>()
        };
        assert_eq!(waiting(&ready, 0, &none_gone), members);
        ready.note(members[0], 1);
        ready.note(members[1], 0);
        assert_eq!(waiting(&ready, 0, &none_gone), [members[2]]);
        assert_eq!(waiting(&ready, 1, &none_gone), members[1..]);
        let third_gone = |p: &PeerId| *p == members[2];
        assert_eq!(waiting(&ready, 0, &third_gone), []);
    }

    /// A member whose readiness was lost but whose chunks of the round arrive is not
    /// waited for; its chunks are kept for the round, its readiness is not.
    #[test]
    fn a_chunk_of_a_round_says_its_sender_began_it() {
        use murmur_protocol::codec::CodecSpec;
        use murmur_protocol::message::{ChunkAddress, TensorPartChunk};
        let members = peers(2);
        let mut ready = Readiness::default();
        let address = ChunkAddress {
            group_id: 3,
            part: 1,
            chunk: 0,
            offset: 0,
            elements: 4,
        };
        let chunk = Parcel::PartChunk(
            TensorPartChunk {
                address,
                weight: 1.0,
                codec: CodecSpec::F32,
                payload: &[],
            },
            vec![0; 16],
        );
        assert!(!ready.note_parcel(members[0], &chunk), "a chunk is kept");
        assert_eq!(ready.waiting_on(&members, 3, |_| false).count(), 1);
        assert_eq!(
            ready
                .waiting_on(&members, 4, |_| false)
                .copied()
                .collect::<Vec<_>>(),
            members
        );
        let join = Parcel::JoinGroup(JoinGroup {
            round: 3,
            deadline_ms: 0,
            bandwidth_bytes_per_s: 0,
            accepts_connections: true,
            samples: 1,
        });
        assert!(ready.note_parcel(members[1], &join), "readiness is used up");
        assert_eq!(ready.waiting_on(&members, 3, |_| false).count(), 0);
    }

    #[test]
    fn a_late_message_for_an_earlier_round_does_not_undo_readiness() {
        let members = peers(1);
        let mut ready = Readiness::default();
        ready.note(members[0], 5);
        ready.note(members[0], 4);
        assert_eq!(ready.waiting_on(&members, 5, |_| false).count(), 0);
    }
}
