//! Who is in the swarm, as one peer sees it: the peers whose invites verified, what each
//! last said in its heartbeat, and which of them fell silent.
//!
//! The network layer says when a peer is admitted or gone and hands over every heartbeat
//! it accepted (signed by an invited peer). [`Membership`] keeps the table, says when this
//! peer's own heartbeat is due, and gives up on a peer whose heartbeats stopped for
//! [`SILENCE_INTERVALS`] intervals: a crashed peer's connection can take the transport's
//! idle timeout to close, but its heartbeats stop at once.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::{PeerKey, Time};

/// Heartbeat intervals of silence after which a peer is taken for gone.
pub const SILENCE_INTERVALS: f64 = 1.6;

/// That a peer is looking for a butterfly group, as its heartbeat says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Looking {
    /// The round it is ready for.
    pub round: u64,
    /// When it stops waiting, on the receiver's clock.
    pub until: Time,
}

/// What a peer's heartbeat says, as the engines use it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Beat {
    /// The round (optimizer step or outer step) or SGP step the peer is at.
    pub step: u64,
    /// Samples accumulated towards the swarm's next round (butterfly; 0 elsewhere).
    pub samples_accumulated: u64,
    /// Recent training throughput.
    pub samples_per_s: f32,
    /// Upload bandwidth the peer offers, in bytes per second; 0 = unknown.
    pub upload_bytes_per_s: u64,
    /// Set while the peer looks for a group.
    pub looking: Option<Looking>,
    /// The process that sent the beat, as its heartbeat names it; 0 when unknown, as in a
    /// peer's own beat, which the network layer stamps when it publishes it.
    pub incarnation: u64,
}

impl Beat {
    /// A heartbeat that says nothing yet: step 0, nothing accumulated, not looking.
    pub const EMPTY: Beat = Beat {
        step: 0,
        samples_accumulated: 0,
        samples_per_s: 0.0,
        upload_bytes_per_s: 0,
        looking: None,
        incarnation: 0,
    };
}

/// A membership change, as the network layer reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemberEvent<P> {
    /// The peer's invite verified: it is a member.
    Admitted(P),
    /// The peer's last connection closed, or its invite was refused.
    Left(P),
    /// A heartbeat of the peer arrived (the network layer checked its signer's invite).
    Heartbeat(P, Beat),
}

/// What a [`MemberEvent`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<P> {
    /// A peer the table did not hold is in it now.
    Joined(P),
    /// A peer left the table.
    Left(P),
}

/// One peer's view of the swarm's membership.
#[derive(Debug, Clone)]
pub struct Membership<P> {
    me: P,
    interval: Duration,
    members: BTreeMap<P, Member>,
    own: Beat,
    next_beat: Time,
    next_check: Time,
    /// When [`Membership::silent`] last looked.
    last_check: Time,
    /// Silence counts from here at the earliest: the end of the last spell in which this
    /// peer did not look (it was held by a long computation, or its process stalled).
    listening_since: Time,
}

#[derive(Debug, Clone, Copy)]
struct Member {
    news: Option<Beat>,
    heard: Option<Time>,
}

impl<P: PeerKey> Membership<P> {
    /// The view of `me`, heartbeating every `interval`; the first heartbeat is due at `now`.
    pub fn new(me: P, interval: Duration, now: Time) -> Membership<P> {
        Membership {
            me,
            interval: interval.max(Duration::from_millis(1)),
            members: BTreeMap::new(),
            own: Beat::EMPTY,
            next_beat: now,
            next_check: now,
            last_check: now,
            listening_since: now,
        }
    }

    /// This peer.
    pub fn me(&self) -> P {
        self.me
    }

    /// The heartbeat interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Applies what the network layer saw.
    pub fn note(&mut self, now: Time, event: MemberEvent<P>) -> Option<Change<P>> {
        match event {
            MemberEvent::Admitted(peer) if peer != self.me => {
                let joined = !self.members.contains_key(&peer);
                self.members.entry(peer).or_insert(Member {
                    news: None,
                    heard: None,
                });
                joined.then_some(Change::Joined(peer))
            }
            MemberEvent::Left(peer) => self.members.remove(&peer).map(|_| Change::Left(peer)),
            MemberEvent::Heartbeat(peer, beat) if peer != self.me => {
                let joined = !self.members.contains_key(&peer);
                self.members.insert(
                    peer,
                    Member {
                        news: Some(beat),
                        heard: Some(now),
                    },
                );
                joined.then_some(Change::Joined(peer))
            }
            MemberEvent::Admitted(_) | MemberEvent::Heartbeat(..) => None,
        }
    }

    /// Something other than a heartbeat came from `peer` (a chunk, a group message): it is
    /// alive, whatever its heartbeats say. A member busy in a round, or one whose
    /// heartbeats queue behind its own chunks, is not taken for quiet or gone. Peers not in
    /// the table stay out of it: admission is the network layer's.
    pub fn heard_from(&mut self, peer: &P, now: Time) {
        if let Some(member) = self.members.get_mut(peer) {
            member.heard = Some(member.heard.map_or(now, |h| h.max(now)));
        }
    }

    /// When [`Membership::beat_due`] or [`Membership::silent`] next has work.
    pub fn poll_timeout(&self) -> Time {
        self.next_beat.min(self.next_check)
    }

    /// Whether this peer's heartbeat is due at `now`; if so, the next is scheduled an
    /// interval later and the caller publishes [`Membership::own`].
    pub fn beat_due(&mut self, now: Time) -> bool {
        if now < self.next_beat {
            return false;
        }
        self.next_beat = now + self.interval;
        true
    }

    /// The peers whose heartbeats stopped for [`SILENCE_INTERVALS`] intervals, checked every
    /// quarter interval; they leave the table. Peers never heard from are not given up
    /// here: their connection closing removes them.
    ///
    /// Silence is counted only over time this peer was listening: when it has not looked
    /// for more than an interval (a long engine call held it, or its process stalled),
    /// the heartbeats others sent meanwhile may still be queued behind the stall, so every
    /// member gets a whole silence window again from now.
    pub fn silent(&mut self, now: Time, out: &mut Vec<P>) {
        if now < self.next_check {
            return;
        }
        if now.saturating_since(self.last_check) > self.interval {
            self.listening_since = now;
        }
        self.last_check = now;
        self.next_check = now + self.interval / 4;
        let limit = self.interval.mul_f64(SILENCE_INTERVALS);
        let since = self.listening_since;
        out.extend(
            self.members
                .iter()
                .filter(|(_, m)| {
                    m.heard
                        .is_some_and(|h| now.saturating_since(h.max(since)) > limit)
                })
                .map(|(p, _)| *p),
        );
        for peer in out.iter() {
            self.members.remove(peer);
        }
    }

    /// Says what the next heartbeat carries and makes it due at once.
    pub fn announce(&mut self, now: Time, beat: Beat) {
        self.own = beat;
        self.next_beat = now;
    }

    /// Changes what the next heartbeat carries without making it due.
    pub fn set_own(&mut self, beat: Beat) {
        self.own = beat;
    }

    /// What this peer's heartbeat says.
    pub fn own(&self) -> Beat {
        self.own
    }

    /// The other members, in key order.
    pub fn peers(&self) -> impl Iterator<Item = P> + '_ {
        self.members.keys().copied()
    }

    /// Whether `peer` is a member.
    pub fn contains(&self, peer: &P) -> bool {
        self.members.contains_key(peer)
    }

    /// How many other members there are.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether this peer knows no other member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The latest heartbeat of `peer`, if one arrived.
    pub fn news(&self, peer: &P) -> Option<&Beat> {
        self.members.get(peer).and_then(|m| m.news.as_ref())
    }

    /// Every member heard from at least once, with its latest heartbeat.
    pub fn heard(&self) -> impl Iterator<Item = (P, &Beat)> + '_ {
        self.members
            .iter()
            .filter_map(|(p, m)| m.news.as_ref().map(|n| (*p, n)))
    }

    /// How long ago `peer`'s last heartbeat arrived, if it was heard at all.
    pub fn quiet_for(&self, peer: &P, now: Time) -> Option<Duration> {
        let heard = self.members.get(peer)?.heard?;
        Some(now.saturating_since(heard))
    }

    /// Whether `peer` is a member heard within `intervals` heartbeat intervals.
    pub fn fresh(&self, peer: &P, now: Time, intervals: f64) -> bool {
        self.quiet_for(peer, now)
            .is_some_and(|quiet| quiet <= self.interval.mul_f64(intervals))
    }

    /// Whether every member has been heard from.
    pub fn all_heard(&self) -> bool {
        self.members.values().all(|m| m.news.is_some())
    }

    /// The highest step any member's heartbeat reported.
    pub fn swarm_step(&self) -> u64 {
        self.heard().map(|(_, b)| b.step).max().unwrap_or(0)
    }

    /// Samples the other members accumulated towards round `round`.
    pub fn samples_at(&self, round: u64) -> u64 {
        self.heard()
            .filter(|(_, b)| b.step == round)
            .map(|(_, b)| b.samples_accumulated)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn at(secs: f64) -> Time {
        Time::from_secs_f64(secs)
    }

    fn beat(step: u64, samples: u64) -> Beat {
        Beat {
            step,
            samples_accumulated: samples,
            ..Beat::EMPTY
        }
    }

    #[test]
    fn a_peer_joins_by_admission_or_heartbeat_once() {
        let mut m = Membership::new(0u32, SECOND, Time::ZERO);
        assert_eq!(
            m.note(Time::ZERO, MemberEvent::Admitted(1)),
            Some(Change::Joined(1))
        );
        assert_eq!(m.note(Time::ZERO, MemberEvent::Admitted(1)), None);
        assert_eq!(
            m.note(Time::ZERO, MemberEvent::Heartbeat(2, beat(3, 0))),
            Some(Change::Joined(2))
        );
        assert_eq!(m.note(Time::ZERO, MemberEvent::Admitted(0)), None, "not me");
        assert_eq!(m.len(), 2);
        assert!(!m.all_heard(), "peer 1 has not beaten yet");
        assert_eq!(m.swarm_step(), 3);
        assert_eq!(
            m.note(Time::ZERO, MemberEvent::Left(1)),
            Some(Change::Left(1))
        );
        assert_eq!(m.note(Time::ZERO, MemberEvent::Left(1)), None);
    }

    /// Looks every quarter interval from `from` to `to` (seconds), as an engine's ticks do.
    fn look(m: &mut Membership<u32>, from: f64, to: f64, gone: &mut Vec<u32>) {
        let mut t = from;
        while t <= to + 1e-9 {
            m.silent(at(t), gone);
            t += 0.25;
        }
    }

    #[test]
    fn a_peer_silent_for_more_than_the_bound_is_given_up_and_a_fresh_one_is_not() {
        let mut m = Membership::new(0u32, SECOND, Time::ZERO);
        m.note(at(0.0), MemberEvent::Heartbeat(1, beat(0, 0)));
        m.note(at(0.0), MemberEvent::Admitted(2));
        let mut gone = Vec::new();
        look(&mut m, 0.0, 1.5, &mut gone);
        assert!(gone.is_empty(), "1.5 intervals is within the bound");
        look(&mut m, 1.75, 1.75, &mut gone);
        assert_eq!(gone, [1]);
        assert!(!m.contains(&1));
        assert!(m.contains(&2), "never heard from: left to its connection");
    }

    #[test]
    fn a_peer_heard_through_its_parcels_is_not_silent() {
        let mut m = Membership::new(0u32, SECOND, Time::ZERO);
        m.note(at(0.0), MemberEvent::Heartbeat(1, beat(0, 0)));
        m.heard_from(&1, at(1.0));
        m.heard_from(&9, at(1.0));
        let mut gone = Vec::new();
        look(&mut m, 0.0, 2.5, &mut gone);
        assert!(gone.is_empty(), "a chunk at 1.0 s is a sign of life");
        assert_eq!(m.quiet_for(&1, at(2.0)), Some(SECOND));
        assert!(!m.contains(&9), "a parcel admits nobody");
        look(&mut m, 2.75, 2.75, &mut gone);
        assert_eq!(gone, [1]);
    }

    #[test]
    fn a_spell_in_which_this_peer_did_not_look_is_not_counted_as_others_silence() {
        let mut m = Membership::new(0u32, SECOND, Time::ZERO);
        m.note(at(0.0), MemberEvent::Heartbeat(1, beat(0, 0)));
        let mut gone = Vec::new();
        look(&mut m, 0.0, 1.0, &mut gone);
        // Held for 3 s (a long engine call): the heartbeats peer 1 sent meanwhile are still
        // queued when this peer looks again, so peer 1 keeps a whole window from 4.0 s.
        look(&mut m, 4.0, 5.5, &mut gone);
        assert!(
            gone.is_empty(),
            "given up for this peer's own stall: {gone:?}"
        );
        // Still nothing from it a whole window after the stall: now it is silent.
        look(&mut m, 5.75, 5.75, &mut gone);
        assert_eq!(gone, [1]);
        // Without the stall the same heartbeat would have been over the bound at 1.75 s.
        let mut steady = Membership::new(0u32, SECOND, Time::ZERO);
        steady.note(at(0.0), MemberEvent::Heartbeat(1, beat(0, 0)));
        let mut gone = Vec::new();
        look(&mut steady, 0.0, 1.75, &mut gone);
        assert_eq!(gone, [1]);
    }

    #[test]
    fn samples_count_only_at_the_same_round() {
        let mut m = Membership::new(0u32, SECOND, Time::ZERO);
        m.note(Time::ZERO, MemberEvent::Heartbeat(1, beat(4, 10)));
        m.note(Time::ZERO, MemberEvent::Heartbeat(2, beat(4, 7)));
        m.note(Time::ZERO, MemberEvent::Heartbeat(3, beat(3, 100)));
        assert_eq!(m.samples_at(4), 17);
        assert_eq!(m.samples_at(3), 100);
    }

    #[test]
    fn an_announcement_makes_the_heartbeat_due_at_once() {
        let mut m = Membership::new(0u32, SECOND, Time::ZERO);
        assert!(m.beat_due(at(0.0)));
        assert!(!m.beat_due(at(0.5)));
        m.announce(at(0.5), beat(1, 2));
        assert!(m.beat_due(at(0.5)));
        assert_eq!(m.own().samples_accumulated, 2);
        assert_eq!(m.poll_timeout(), at(0.0), "the silence check is still due");
    }
}
