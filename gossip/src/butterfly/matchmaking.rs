//! Forming butterfly groups among peers that are ready at about the same time.
//!
//! # The protocol
//!
//! A peer that is ready for a round starts looking, with a deadline `ready + max_wait`,
//! and says so to the swarm (the membership layer gossips it). Peers are totally ordered
//! by `(deadline, key)`. A looking peer asks the earliest peer it knows to be looking, if
//! that peer precedes it in the order, to take it into its group (`JoinGroup`); if it knows
//! none, it gathers a group itself. A gathering peer — a leader — takes requests from
//! peers that follow it in the order, and begins its group (`GroupBegin`, with members and
//! parts) as soon as it holds `target_group` members, or `begin_margin` before its
//! deadline if it holds at least `min_group`; otherwise it disbands the group, rejecting
//! its followers, who look on until their own deadlines. A leader that hears of a looking
//! peer before it hands its followers back and asks that peer itself: peers that became
//! ready together, but heard of each other in different orders, still end in one group.
//!
//! # Why it cannot deadlock
//!
//! A peer waits for an answer only after asking a peer that precedes it in the order, and
//! a peer that is itself waiting answers every request at once, by rejecting it. So every
//! waiting edge points from a later peer to an earlier one; a cycle would need a peer to
//! precede itself, which a total order forbids. Leaders wait for nobody, and every wait
//! ends by a deadline: a follower waits at most until its leader's deadline, which is no
//! later than its own, and a leader decides `begin_margin` before its deadline. Hence no
//! peer waits past `ready + max_wait`, whatever the others do or however they fail. The
//! same order makes peers agree on a leader without a message when their views agree, so
//! they rarely reject one another (hivemind's matchmaking for Moshpit SGD orders peers by
//! their expiration time in the same spirit).
//!
//! Followers have deadlines no earlier than their leader's, which is why a leader refuses
//! requests from peers that precede it: keeping every request pointed down the order keeps
//! the argument above true even when views disagree.

use std::collections::VecDeque;

use murmur_protocol::message::GroupRejectReason;

use crate::{PeerKey, Time};

use super::config::{ButterflyConfig, MAX_GROUP};
use super::error::ButterflyError;
use super::group::Group;
use super::partition::{MemberLink, Partition, optimal_fractions};

/// What a peer tells its leader about itself when it asks to join (`JoinGroup`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinRequest {
    /// The round the peer is ready for.
    pub round: u64,
    /// When the peer stops waiting.
    pub deadline: Time,
    /// Measured bandwidth in bytes per second, which sizes its part.
    pub bandwidth_bytes_per_s: u64,
    /// Whether other members can connect to it; one that cannot reduces no part.
    pub accepts_connections: bool,
    /// Samples behind its contribution.
    pub samples: u64,
}

/// A peer's own link and contribution, as it will ask to be included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberProfile {
    /// Measured bandwidth in bytes per second.
    pub bandwidth_bytes_per_s: u64,
    /// Whether other peers can open connections to it.
    pub accepts_connections: bool,
    /// Samples behind its contribution.
    pub samples: u64,
}

/// What happened, as told to a [`Matchmaker`].
#[derive(Debug, Clone)]
pub enum MatchInput<P> {
    /// The local peer is ready for `round`: start looking, until `now + max_wait`.
    Ready {
        /// The round to average.
        round: u64,
        /// The group id to use should this peer lead (a random number from the caller).
        group_id: u64,
        /// The peer's link and contribution.
        profile: MemberProfile,
    },
    /// The membership layer heard that `peer` is looking for a group of `round`.
    PeerLooking {
        /// The peer.
        peer: P,
        /// The round it is ready for.
        round: u64,
        /// When it stops waiting.
        deadline: Time,
    },
    /// The membership layer heard that `peer` stopped looking (it follows someone, began
    /// a group, gave up, or left).
    PeerNotLooking(P),
    /// A `JoinGroup` arrived.
    JoinRequest {
        /// The requester.
        from: P,
        /// Its request.
        request: JoinRequest,
    },
    /// A `GroupReject` arrived.
    Rejected {
        /// The peer that refused.
        from: P,
        /// The round of the refused request.
        round: u64,
        /// Why.
        reason: GroupRejectReason,
    },
    /// A `GroupBegin` arrived.
    GroupBegan {
        /// Its sender, the leader.
        from: P,
        /// The group it announces.
        group: Group<P>,
    },
    /// The time returned by [`Matchmaker::poll_timeout`] has come.
    Tick,
    /// This peer stops looking (it is leaving): a leader rejects its followers at once, and
    /// the round ends with [`MatchOutput::NoGroup`].
    Cancel,
    /// `peer` is gone (its heartbeats stopped, or a request to it could not be delivered):
    /// a follower waiting for it as its leader looks on at once instead of until the
    /// leader's deadline, and a leader drops it from its followers.
    PeerGone(P),
}

/// What a [`Matchmaker`] asks its caller to do.
#[derive(Debug, Clone, PartialEq)]
pub enum MatchOutput<P> {
    /// Tell the swarm that this peer is looking for a group of `round` until `deadline`.
    AnnounceLooking {
        /// The round.
        round: u64,
        /// When this peer stops waiting.
        deadline: Time,
    },
    /// Tell the swarm that this peer is no longer looking.
    AnnounceNotLooking,
    /// Send a `JoinGroup` to a prospective leader.
    SendJoin {
        /// The leader.
        to: P,
        /// The request.
        request: JoinRequest,
    },
    /// Send a `GroupReject`.
    SendReject {
        /// The requester.
        to: P,
        /// The round it asked for.
        round: u64,
        /// Why.
        reason: GroupRejectReason,
    },
    /// Send a `GroupBegin` to a follower.
    SendBegin {
        /// The follower.
        to: P,
        /// The group.
        group: Group<P>,
    },
    /// This peer's group began: start a [`ButterflyRound`](super::ButterflyRound) in it.
    Formed(Group<P>),
    /// No group this round: the peer averages with nobody.
    NoGroup,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase<P> {
    Idle,
    /// Looking, and gathering: requests from later peers are taken.
    Gathering,
    /// Waiting for `leader` to answer, until `until`.
    Requesting {
        leader: P,
        until: Time,
    },
    /// Formed a group or gave up for this round.
    Done,
}

/// A looking peer this one knows of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate<P> {
    deadline: Time,
    peer: P,
    round: u64,
}

/// Group formation for one peer, round after round, as a sans-IO state machine.
///
/// See the [module docs](self) for the protocol and why it cannot deadlock.
#[derive(Debug)]
pub struct Matchmaker<P> {
    me: P,
    config: ButterflyConfig,
    vector_len: usize,
    phase: Phase<P>,
    round: u64,
    group_id: u64,
    profile: MemberProfile,
    deadline: Time,
    /// Known looking peers by `(deadline, key)`, at most `max_candidates`, earliest kept.
    candidates: Vec<Candidate<P>>,
    followers: Vec<(P, JoinRequest)>,
    outputs: VecDeque<MatchOutput<P>>,
}

impl<P: PeerKey> Matchmaker<P> {
    /// A matchmaker for `me`, forming groups that average vectors of `vector_len` elements.
    pub fn new(
        me: P,
        vector_len: usize,
        config: ButterflyConfig,
    ) -> Result<Matchmaker<P>, ButterflyError> {
        config.validate()?;
        Ok(Matchmaker {
            me,
            vector_len,
            phase: Phase::Idle,
            round: 0,
            group_id: 0,
            profile: MemberProfile {
                bandwidth_bytes_per_s: 0,
                accepts_connections: false,
                samples: 0,
            },
            deadline: Time::ZERO,
            candidates: Vec::with_capacity(config.max_candidates + 1),
            followers: Vec::new(),
            outputs: VecDeque::new(),
            config,
        })
    }

    /// This peer's key.
    pub fn key(&self) -> P {
        self.me
    }

    /// Sets the group size at which a leader begins without waiting for its deadline,
    /// clamped to `min_group..=256`; it takes effect at once.
    ///
    /// The configured `target_group` is a cap; a caller that knows how many peers the swarm
    /// has (its membership view) lowers it to that count, so that a group holding the whole
    /// swarm begins at once instead of waiting for members that do not exist.
    pub fn set_target_group(&mut self, target: usize) {
        self.config.target_group = target.clamp(self.config.min_group, MAX_GROUP);
    }

    /// When this peer stops looking in the current round.
    pub fn deadline(&self) -> Time {
        self.deadline
    }

    /// Whether `peer` asked this peer, gathering, to take it into its group.
    pub fn has_follower(&self, peer: P) -> bool {
        self.followers.iter().any(|(p, _)| *p == peer)
    }

    /// The leader this peer waits for, if it asked one.
    pub fn leader(&self) -> Option<P> {
        match self.phase {
            Phase::Requesting { leader, .. } => Some(leader),
            _ => None,
        }
    }

    /// Whether this peer gathers a group and nobody joined it yet.
    pub fn gathering_alone(&self) -> bool {
        self.phase == Phase::Gathering && self.followers.is_empty()
    }

    /// Whether the peer is looking for a group (gathering or waiting for a leader).
    pub fn is_looking(&self) -> bool {
        matches!(self.phase, Phase::Gathering | Phase::Requesting { .. })
    }

    /// The next output, if any.
    pub fn poll_output(&mut self) -> Option<MatchOutput<P>> {
        self.outputs.pop_front()
    }

    /// When the peer wants a [`MatchInput::Tick`]: its leader's deadline while it waits for
    /// one, its own decision time while it gathers.
    pub fn poll_timeout(&self) -> Option<Time> {
        match self.phase {
            Phase::Gathering => Some(self.decision_time()),
            Phase::Requesting { until, .. } => Some(until),
            Phase::Idle | Phase::Done => None,
        }
    }

    /// Feeds one input at time `now`.
    pub fn handle(&mut self, now: Time, input: MatchInput<P>) {
        match input {
            MatchInput::Ready {
                round,
                group_id,
                profile,
            } => {
                if self.is_looking() {
                    self.give_up();
                }
                self.round = round;
                self.group_id = group_id;
                self.profile = profile;
                // Whole milliseconds: deadlines cross the network on a millisecond wall clock,
                // and every peer must order them exactly as their owners do.
                self.deadline = (now + self.config.max_wait()).ceil_millis();
                self.followers.clear();
                self.candidates
                    .retain(|c| c.round == round && c.deadline > now);
                self.start_gathering();
            }
            MatchInput::PeerLooking {
                peer,
                round,
                deadline,
            } => {
                if peer != self.me {
                    self.remember(Candidate {
                        deadline,
                        peer,
                        round,
                    });
                }
            }
            MatchInput::PeerNotLooking(peer) => self.forget(peer),
            MatchInput::JoinRequest { from, request } => self.on_join(now, from, request),
            MatchInput::Rejected { from, round, .. } => {
                if round == self.round
                    && matches!(self.phase, Phase::Requesting { leader, .. } if leader == from)
                {
                    self.forget(from);
                    self.start_gathering();
                }
            }
            MatchInput::GroupBegan { from, group } => {
                let waiting_for =
                    matches!(self.phase, Phase::Requesting { leader, .. } if leader == from);
                if waiting_for && group.round == self.round && group.index_of(self.me).is_some() {
                    self.phase = Phase::Done;
                    self.outputs.push_back(MatchOutput::Formed(group));
                }
            }
            MatchInput::PeerGone(peer) => {
                self.forget(peer);
                self.followers.retain(|(follower, _)| *follower != peer);
                if matches!(self.phase, Phase::Requesting { leader, .. } if leader == peer) {
                    self.start_gathering();
                }
            }
            MatchInput::Cancel => {
                if self.phase == Phase::Gathering {
                    self.disband();
                } else if self.is_looking() {
                    self.give_up();
                }
            }
            MatchInput::Tick => match self.phase {
                Phase::Requesting { leader, until } if until <= now => {
                    self.forget(leader);
                    self.start_gathering();
                }
                _ => {}
            },
        }
        // A request may start only while there is time for it to be answered.
        if self.phase == Phase::Gathering {
            if now >= self.decision_time() {
                self.decide();
            } else if self.followers.is_empty() {
                self.request_earliest(now);
            } else if self.earliest_before_me(now).is_some() {
                self.yield_to_earlier(now);
            } else if self.followers.len() + 1 >= self.config.target_group {
                // The target fell to what the leader holds (a member left the swarm).
                self.begin();
            }
        }
    }

    /// A leader that learns of a looking peer before it in the order hands its followers
    /// back (they ask the earliest peer they know next) and asks that peer itself, so that
    /// peers that became ready together end in one group, not in one per early leader.
    /// Rejecting is not waiting, so every wait still points down the order.
    fn yield_to_earlier(&mut self, now: Time) {
        for (follower, _) in std::mem::take(&mut self.followers) {
            self.outputs.push_back(MatchOutput::SendReject {
                to: follower,
                round: self.round,
                reason: GroupRejectReason::NotGathering,
            });
        }
        self.request_earliest(now);
    }

    fn decision_time(&self) -> Time {
        self.deadline - self.config.begin_margin()
    }

    fn start_gathering(&mut self) {
        self.phase = Phase::Gathering;
        self.outputs.push_back(MatchOutput::AnnounceLooking {
            round: self.round,
            deadline: self.deadline,
        });
    }

    fn me_as_candidate(&self) -> Candidate<P> {
        Candidate {
            deadline: self.deadline,
            peer: self.me,
            round: self.round,
        }
    }

    /// The earliest known looking peer of this round that precedes this one and still has
    /// time to answer.
    fn earliest_before_me(&self, now: Time) -> Option<Candidate<P>> {
        let me = self.me_as_candidate();
        self.candidates
            .iter()
            .find(|c| {
                c.round == self.round
                    && c.deadline > now
                    && (c.deadline, c.peer) < (me.deadline, me.peer)
            })
            .copied()
    }

    /// Asks the earliest known looking peer that precedes this one, if any.
    fn request_earliest(&mut self, now: Time) {
        let Some(leader) = self.earliest_before_me(now) else {
            return;
        };
        self.phase = Phase::Requesting {
            leader: leader.peer,
            until: leader.deadline,
        };
        self.outputs.push_back(MatchOutput::AnnounceNotLooking);
        self.outputs.push_back(MatchOutput::SendJoin {
            to: leader.peer,
            request: JoinRequest {
                round: self.round,
                deadline: self.deadline,
                bandwidth_bytes_per_s: self.profile.bandwidth_bytes_per_s,
                accepts_connections: self.profile.accepts_connections,
                samples: self.profile.samples,
            },
        });
    }

    fn on_join(&mut self, now: Time, from: P, request: JoinRequest) {
        let reason = match self.phase {
            Phase::Idle => Some(GroupRejectReason::NotGathering),
            Phase::Done => Some(GroupRejectReason::RoundClosed),
            Phase::Requesting { .. } => Some(GroupRejectReason::NotGathering),
            Phase::Gathering if request.round != self.round => {
                Some(GroupRejectReason::RoundMismatch)
            }
            Phase::Gathering
                if (request.deadline, from) < (self.deadline, self.me) || from == self.me =>
            {
                Some(GroupRejectReason::NotGathering)
            }
            Phase::Gathering if now >= self.decision_time() => Some(GroupRejectReason::RoundClosed),
            Phase::Gathering if self.followers.len() + 1 >= self.config.target_group => {
                Some(GroupRejectReason::GroupFull)
            }
            Phase::Gathering => None,
        };
        if let Some(reason) = reason {
            self.outputs.push_back(MatchOutput::SendReject {
                to: from,
                round: request.round,
                reason,
            });
            return;
        }
        match self.followers.iter_mut().find(|(peer, _)| *peer == from) {
            Some(entry) => entry.1 = request,
            None => self.followers.push((from, request)),
        }
        if self.followers.len() + 1 >= self.config.target_group {
            self.begin();
        }
    }

    /// At the decision time: begin with enough members, or disband.
    fn decide(&mut self) {
        if self.followers.len() + 1 >= self.config.min_group {
            self.begin();
        } else {
            self.disband();
        }
    }

    fn begin(&mut self) {
        let Some(group) = self.build_group() else {
            self.disband();
            return;
        };
        for &(follower, _) in &self.followers {
            self.outputs.push_back(MatchOutput::SendBegin {
                to: follower,
                group: group.clone(),
            });
        }
        self.followers.clear();
        self.phase = Phase::Done;
        self.outputs.push_back(MatchOutput::AnnounceNotLooking);
        self.outputs.push_back(MatchOutput::Formed(group));
    }

    /// The group of this leader and its followers, in the order of their keys: the same
    /// members in a later round, whoever leads it, get the same parts (as far as their
    /// bandwidths stay), so that each sends and reduces the same elements round after
    /// round. Error feedback's residuals are kept per element and per role (a part chunk
    /// sent, an average sent): a part that moved to another member leaves the residuals
    /// of its old roles unused and writes new ones, up to both whole residual vectors,
    /// where a stable partition writes each element in one of the two.
    fn build_group(&self) -> Option<Group<P>> {
        let mut entries = vec![(
            self.me,
            (
                self.profile.bandwidth_bytes_per_s,
                self.profile.accepts_connections,
            ),
        )];
        for (peer, request) in &self.followers {
            entries.push((
                *peer,
                (request.bandwidth_bytes_per_s, request.accepts_connections),
            ));
        }
        entries.sort_unstable_by_key(|(peer, _)| *peer);
        let (members, links): (Vec<P>, Vec<(u64, bool)>) = entries.into_iter().unzip();
        let links = member_links(&links);
        let fractions = optimal_fractions(&links).ok()?;
        let partition = Partition::from_fractions(
            self.vector_len,
            &fractions,
            self.config.chunk_elements as usize,
        )
        .ok()?;
        Group::new(self.round, self.group_id, members, partition).ok()
    }

    fn disband(&mut self) {
        for (follower, _) in std::mem::take(&mut self.followers) {
            self.outputs.push_back(MatchOutput::SendReject {
                to: follower,
                round: self.round,
                reason: GroupRejectReason::RoundClosed,
            });
        }
        self.give_up();
    }

    fn give_up(&mut self) {
        self.phase = Phase::Done;
        self.outputs.push_back(MatchOutput::AnnounceNotLooking);
        self.outputs.push_back(MatchOutput::NoGroup);
    }

    fn remember(&mut self, candidate: Candidate<P>) {
        self.forget(candidate.peer);
        let at = self.candidates.partition_point(|c| c < &candidate);
        if at < self.config.max_candidates {
            self.candidates.insert(at, candidate);
            self.candidates.truncate(self.config.max_candidates);
        }
    }

    fn forget(&mut self, peer: P) {
        self.candidates.retain(|c| c.peer != peer);
    }
}

/// The links the partitioner sizes parts by, from what each member declared (bandwidth in
/// bytes per second, whether it accepts connections). A member that declared no bandwidth
/// (0: nothing measured yet) is taken to have the median of those that did, so it gets an
/// ordinary part rather than none; when nobody declared one, every part is equal.
fn member_links(declared: &[(u64, bool)]) -> Vec<MemberLink> {
    let mut known: Vec<u64> = declared
        .iter()
        .map(|&(b, _)| b)
        .filter(|&b| b > 0)
        .collect();
    known.sort_unstable();
    let fallback = known.get(known.len() / 2).copied().unwrap_or(1);
    declared
        .iter()
        .map(|&(bandwidth, accepts_connections)| MemberLink {
            bandwidth: if bandwidth > 0 { bandwidth } else { fallback } as f64,
            accepts_connections,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::member_links;

    #[test]
    fn an_undeclared_bandwidth_counts_as_the_median_of_the_declared_ones() {
        let links = member_links(&[(0, true), (100, true), (300, false), (200, true)]);
        let bandwidths: Vec<f64> = links.iter().map(|l| l.bandwidth).collect();
        assert_eq!(bandwidths, [200.0, 100.0, 300.0, 200.0]);
        assert!(!links[2].accepts_connections);
        let unknown = member_links(&[(0, true), (0, true)]);
        assert!(unknown.iter().all(|l| l.bandwidth == 1.0));
    }
}
