//! Matchmaking at scale: 1,000 peers with staggered readiness form groups of up to 16, no
//! peer waits past its bound, and no run deadlocks.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::time::Duration;

use murmur_gossip::Time;
use murmur_gossip::butterfly::{
    ButterflyConfig, Group, MatchInput, MatchOutput, Matchmaker, MemberProfile,
};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

const PEERS: usize = 1_000;
const VECTOR_LEN: usize = 100_000;

fn config() -> ButterflyConfig {
    ButterflyConfig {
        min_group: 4,
        target_group: 16,
        max_wait_ms: 2_000,
        begin_margin_ms: 200,
        max_candidates: 32,
        chunk_elements: 1024,
        ..ButterflyConfig::default()
    }
}

#[derive(Debug)]
enum Event {
    Ready(usize),
    Input(usize, MatchInput<u32>),
    Tick(usize, Time),
}

/// What the swarm's gossip has heard about a peer: looking until a deadline, or not.
#[derive(Debug, Clone, Copy)]
struct Board {
    looking: bool,
    deadline: Time,
    visible_at: Time,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    Formed(u64, usize),
    NoGroup,
}

struct Swarm {
    rng: Xoshiro256PlusPlus,
    peers: Vec<Matchmaker<u32>>,
    ready_at: Vec<Time>,
    profiles: Vec<MemberProfile>,
    outcomes: Vec<Option<(Time, Outcome)>>,
    groups: HashMap<u64, Group<u32>>,
    board: BTreeMap<usize, Board>,
    /// Peers whose matchmaker is looking: the listeners of gossip.
    looking: BTreeSet<usize>,
    armed: Vec<Option<Time>>,
    queue: BinaryHeap<Reverse<(Time, u64)>>,
    events: HashMap<u64, Event>,
    next: u64,
    seed: u64,
}

impl Swarm {
    fn new(seed: u64) -> Swarm {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let mut swarm = Swarm {
            peers: (0..PEERS as u32)
                .map(|k| Matchmaker::new(k, VECTOR_LEN, config()).expect("valid config"))
                .collect(),
            ready_at: (0..PEERS)
                .map(|_| Time::from_secs_f64(rng.random_range(0.0..60.0)))
                .collect(),
            profiles: (0..PEERS)
                .map(|_| MemberProfile {
                    bandwidth_bytes_per_s: rng.random_range(1_000_000..100_000_000),
                    accepts_connections: rng.random_bool(0.9),
                    samples: rng.random_range(1..512),
                })
                .collect(),
            rng,
            outcomes: vec![None; PEERS],
            groups: HashMap::new(),
            board: BTreeMap::new(),
            looking: BTreeSet::new(),
            armed: vec![None; PEERS],
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            next: 0,
            seed,
        };
        for i in 0..PEERS {
            let at = swarm.ready_at[i];
            swarm.push(at, Event::Ready(i));
        }
        swarm
    }

    fn push(&mut self, at: Time, event: Event) {
        self.queue.push(Reverse((at, self.next)));
        self.events.insert(self.next, event);
        self.next += 1;
    }

    fn message_delay(&mut self) -> Duration {
        Duration::from_micros(self.rng.random_range(5_000..40_000))
    }

    fn gossip_delay(&mut self) -> Duration {
        Duration::from_micros(self.rng.random_range(50_000..250_000))
    }

    /// Runs to quiescence; returns the number of events processed.
    fn run(&mut self) -> usize {
        // Every peer causes a bounded number of events; this bound only stops a runaway.
        let limit = 2_000 * PEERS;
        for processed in 0..limit {
            let Some(Reverse((now, id))) = self.queue.pop() else {
                return processed;
            };
            let event = self.events.remove(&id).expect("queued event");
            let (peer, input) = match event {
                Event::Ready(i) => {
                    self.snapshot(i, now);
                    let input = MatchInput::Ready {
                        round: 1,
                        group_id: self.seed << 32 | i as u64,
                        profile: self.profiles[i],
                    };
                    (i, input)
                }
                Event::Input(i, input) => (i, input),
                Event::Tick(i, at) => {
                    if self.armed[i] != Some(at) {
                        continue;
                    }
                    self.armed[i] = None;
                    (i, MatchInput::Tick)
                }
            };
            self.peers[peer].handle(now, input);
            self.drain(peer, now);
            if self.peers[peer].is_looking() {
                self.looking.insert(peer);
            } else {
                self.looking.remove(&peer);
            }
        }
        panic!(
            "seed {}: the run did not settle within {limit} events",
            self.seed
        );
    }

    /// A peer that becomes ready learns the earliest looking peers the gossip has spread,
    /// and hears of the announcements still spreading when they reach everyone.
    fn snapshot(&mut self, i: usize, now: Time) {
        let mut known: Vec<(Time, usize, Time)> = self
            .board
            .iter()
            .filter(|(_, b)| b.looking && b.deadline > now)
            .map(|(&p, b)| (b.deadline, p, b.visible_at))
            .collect();
        known.sort_unstable();
        for (deadline, p, visible_at) in known.into_iter().take(config().max_candidates) {
            let input = MatchInput::PeerLooking {
                peer: p as u32,
                round: 1,
                deadline,
            };
            if visible_at <= now {
                self.peers[i].handle(now, input);
            } else {
                self.push(visible_at, Event::Input(i, input));
            }
        }
    }

    fn drain(&mut self, i: usize, now: Time) {
        while let Some(output) = self.peers[i].poll_output() {
            match output {
                MatchOutput::AnnounceLooking { deadline, .. } => {
                    self.announce(i, now, true, deadline);
                }
                MatchOutput::AnnounceNotLooking => {
                    let deadline = self.peers[i].deadline();
                    self.announce(i, now, false, deadline);
                }
                MatchOutput::SendJoin { to, request } => {
                    let at = now + self.message_delay();
                    self.push(
                        at,
                        Event::Input(
                            to as usize,
                            MatchInput::JoinRequest {
                                from: i as u32,
                                request,
                            },
                        ),
                    );
                }
                MatchOutput::SendReject { to, round, reason } => {
                    let at = now + self.message_delay();
                    let input = MatchInput::Rejected {
                        from: i as u32,
                        round,
                        reason,
                    };
                    self.push(at, Event::Input(to as usize, input));
                }
                MatchOutput::SendBegin { to, group } => {
                    let at = now + self.message_delay();
                    let input = MatchInput::GroupBegan {
                        from: i as u32,
                        group,
                    };
                    self.push(at, Event::Input(to as usize, input));
                }
                MatchOutput::Formed(group) => {
                    assert!(self.outcomes[i].is_none(), "peer {i} decided twice");
                    self.outcomes[i] = Some((now, Outcome::Formed(group.group_id, group.len())));
                    if let Some(known) = self.groups.get(&group.group_id) {
                        assert_eq!(known, &group, "members of one group disagree on it");
                    }
                    self.groups.insert(group.group_id, group);
                }
                MatchOutput::NoGroup => {
                    assert!(self.outcomes[i].is_none(), "peer {i} decided twice");
                    self.outcomes[i] = Some((now, Outcome::NoGroup));
                }
            }
        }
        let timeout = self.peers[i].poll_timeout();
        if timeout != self.armed[i] {
            self.armed[i] = timeout;
            if let Some(at) = timeout {
                self.push(at.max(now), Event::Tick(i, at));
            }
        }
    }

    /// Gossip: the news reaches every peer still looking whose deadline is no earlier
    /// (only those can pick the announcer as a leader), each after its own delay.
    fn announce(&mut self, i: usize, now: Time, looking: bool, deadline: Time) {
        let visible_at = now + Duration::from_millis(250);
        if looking {
            let board = Board {
                looking,
                deadline,
                visible_at,
            };
            self.board.insert(i, board);
        } else {
            self.board.remove(&i);
        }
        let listeners: Vec<usize> = self
            .looking
            .iter()
            .copied()
            .filter(|&p| p != i && self.peers[p].deadline() >= deadline)
            .collect();
        for p in listeners {
            let at = now + self.gossip_delay();
            let input = if looking {
                MatchInput::PeerLooking {
                    peer: i as u32,
                    round: 1,
                    deadline,
                }
            } else {
                MatchInput::PeerNotLooking(i as u32)
            };
            self.push(at, Event::Input(p, input));
        }
    }
}

/// 100 seeded runs of 1,000 peers ready at uniformly random times over a minute, with
/// random message latencies (5–40 ms) and gossip delays (50–250 ms), target group 16 and
/// a 2 s bound. In every run every peer decides (a group or none) exactly once, within
/// its bound; the event queue drains (nobody waits forever); members of a group agree on
/// it, every listed member joins it, and groups have `min_group..=target_group` members;
/// and matchmaking is useful: at least 97% of the peers average in a group, and groups
/// average at least 14 members.
#[test]
fn a_thousand_staggered_peers_form_groups_within_the_bound_in_100_seeded_runs() {
    let bound = config().max_wait();
    let (mut grouped_total, mut groups_total, mut events_total) = (0usize, 0usize, 0usize);
    let mut fewest = PEERS;
    for seed in 1..=100u64 {
        let mut swarm = Swarm::new(seed);
        events_total += swarm.run();
        for (i, outcome) in swarm.outcomes.iter().enumerate() {
            let (at, _) = outcome.unwrap_or_else(|| panic!("seed {seed}: peer {i} never decided"));
            let waited = at.saturating_since(swarm.ready_at[i]);
            assert!(waited <= bound, "seed {seed}: peer {i} waited {waited:?}");
        }
        for group in swarm.groups.values() {
            assert!(
                (config().min_group..=config().target_group).contains(&group.len()),
                "seed {seed}: a group of {}",
                group.len()
            );
            // The leader begins a margin before its deadline, which is no later than any
            // follower's: every listed member is still waiting when the news arrives.
            for &member in group.members() {
                assert_eq!(
                    swarm.outcomes[member as usize].map(|(_, o)| o),
                    Some(Outcome::Formed(group.group_id, group.len())),
                    "seed {seed}: member {member} of group {} is elsewhere",
                    group.group_id
                );
            }
        }
        let grouped = swarm
            .outcomes
            .iter()
            .filter(|o| matches!(o, Some((_, Outcome::Formed(..)))))
            .count();
        assert!(
            grouped * 100 >= PEERS * 97,
            "seed {seed}: only {grouped} peers grouped"
        );
        grouped_total += grouped;
        fewest = fewest.min(grouped);
        groups_total += swarm.groups.len();
    }
    let mean_size = grouped_total as f64 / groups_total as f64;
    assert!(
        mean_size >= 14.0,
        "groups average {mean_size} members, target 16"
    );
    eprintln!(
        "100 runs: {:.1}% of peers grouped (fewest {fewest}), mean group size {:.2}, \
         {} events per run",
        grouped_total as f64 / (100 * PEERS) as f64 * 100.0,
        mean_size,
        events_total / 100
    );
}

fn outputs(peer: &mut Matchmaker<u32>) -> Vec<MatchOutput<u32>> {
    std::iter::from_fn(|| peer.poll_output()).collect()
}

/// Settings for groups of two, and the profile every peer declares.
fn pairs() -> (ButterflyConfig, MemberProfile) {
    let config = ButterflyConfig {
        min_group: 2,
        target_group: 2,
        ..config()
    };
    let profile = MemberProfile {
        bandwidth_bytes_per_s: 1_000_000,
        accepts_connections: true,
        samples: 8,
    };
    (config, profile)
}

/// Two peers that are ready together and know of each other: only the later one in the
/// `(deadline, key)` order asks, the earlier one leads, and a peer that is waiting for a
/// leader answers a third peer's request at once with a refusal instead of waiting on it.
#[test]
fn the_order_decides_who_asks_and_waiting_peers_answer_at_once() {
    let (config, profile) = pairs();
    let now = Time::ZERO;
    let deadline = now + config.max_wait();
    let mut a = Matchmaker::new(1u32, 1000, config.clone()).expect("valid");
    let mut b = Matchmaker::new(2u32, 1000, config).expect("valid");
    for (me, other) in [(&mut a, 2u32), (&mut b, 1u32)] {
        let looking = MatchInput::PeerLooking {
            peer: other,
            round: 1,
            deadline,
        };
        me.handle(now, looking);
        let ready = MatchInput::Ready {
            round: 1,
            group_id: u64::from(other),
            profile,
        };
        me.handle(now, ready);
    }
    let from_a = outputs(&mut a);
    let from_b = outputs(&mut b);
    assert!(
        !from_a
            .iter()
            .any(|o| matches!(o, MatchOutput::SendJoin { .. })),
        "the earlier peer asked: {from_a:?}"
    );
    let request = from_b
        .iter()
        .find_map(|o| match o {
            MatchOutput::SendJoin { to: 1, request } => Some(*request),
            _ => None,
        })
        .expect("the later peer asks the earlier one");

    // While it waits for its leader, b refuses a third peer immediately.
    let third = MatchInput::JoinRequest {
        from: 3,
        request: murmur_gossip::butterfly::JoinRequest {
            deadline: deadline + Duration::from_millis(1),
            ..request
        },
    };
    b.handle(now, third);
    assert!(outputs(&mut b).iter().any(|o| matches!(
        o,
        MatchOutput::SendReject {
            to: 3,
            reason: murmur_protocol::message::GroupRejectReason::NotGathering,
            ..
        }
    )));

    a.handle(now, MatchInput::JoinRequest { from: 2, request });
    let from_a = outputs(&mut a);
    let group = from_a
        .iter()
        .find_map(|o| match o {
            MatchOutput::SendBegin { to: 2, group } => Some(group.clone()),
            _ => None,
        })
        .expect("a full group begins at once");
    assert!(from_a.contains(&MatchOutput::Formed(group.clone())));
    assert_eq!(group.members(), &[1, 2]);
    b.handle(
        now,
        MatchInput::GroupBegan {
            from: 1,
            group: group.clone(),
        },
    );
    assert!(outputs(&mut b).contains(&MatchOutput::Formed(group)));
    assert!(!a.is_looking() && !b.is_looking());
}

/// A follower whose leader is gone (crashed after the request) looks on at once: it asks
/// the next earliest peer it knows, who begins with it, long before the dead leader's
/// deadline. Without `PeerGone` it would wait for that deadline and then average alone.
#[test]
fn a_follower_leaves_a_gone_leader_at_once_and_asks_the_next() {
    let (config, profile) = pairs();
    let now = Time::ZERO;
    let deadline = now + config.max_wait();
    // Peer 1 (the earliest) will crash; peer 2 is next in the order; peer 3 asks.
    let mut second = Matchmaker::new(2u32, 1000, config.clone()).expect("valid");
    let mut third = Matchmaker::new(3u32, 1000, config).expect("valid");
    for (me, others) in [(&mut second, [1u32, 3]), (&mut third, [1, 2])] {
        for other in others {
            me.handle(
                now,
                MatchInput::PeerLooking {
                    peer: other,
                    round: 1,
                    deadline,
                },
            );
        }
        me.handle(
            now,
            MatchInput::Ready {
                round: 1,
                group_id: 7,
                profile,
            },
        );
    }
    for me in [&mut second, &mut third] {
        let out = outputs(me);
        assert!(
            out.iter()
                .any(|o| matches!(o, MatchOutput::SendJoin { to: 1, .. })),
            "peer {} asks the earliest peer first: {out:?}",
            me.key()
        );
    }
    assert_eq!(third.leader(), Some(1));

    // Peer 1 is gone 300 ms later: both look on at once; peer 2 gathers, peer 3 asks it.
    let later = now + Duration::from_millis(300);
    second.handle(later, MatchInput::PeerGone(1));
    let from_second = outputs(&mut second);
    assert!(second.gathering_alone(), "peer 2 gathers: {from_second:?}");
    third.handle(later, MatchInput::PeerGone(1));
    let request = outputs(&mut third)
        .into_iter()
        .find_map(|o| match o {
            MatchOutput::SendJoin { to: 2, request } => Some(request),
            _ => None,
        })
        .expect("peer 3 asks the next earliest peer, not waiting for the dead one's deadline");
    second.handle(later, MatchInput::JoinRequest { from: 3, request });
    let group = outputs(&mut second)
        .into_iter()
        .find_map(|o| match o {
            MatchOutput::Formed(group) => Some(group),
            _ => None,
        })
        .expect("peer 2 begins with peer 3 at once");
    assert_eq!(group.members(), &[2, 3]);
}

/// The group a leader begins lists its members by key, whoever leads: the same two peers,
/// led by one in one round and by the other in the next, reduce the same parts both
/// times, so that each sends and reduces the same elements round after round (error
/// feedback's residuals are per element and role: a part that moves writes new ones).
#[test]
fn the_same_members_get_the_same_parts_whoever_leads() {
    let (config, profile) = pairs();
    let now = Time::ZERO;
    let form = |round: u64, leader: u32, follower: u32, bandwidths: (u64, u64)| {
        let mut lead = Matchmaker::new(leader, 100_000, config.clone()).expect("valid");
        let own = MemberProfile {
            bandwidth_bytes_per_s: bandwidths.0,
            ..profile
        };
        lead.handle(
            now,
            MatchInput::Ready {
                round,
                group_id: round,
                profile: own,
            },
        );
        let request = murmur_gossip::butterfly::JoinRequest {
            round,
            deadline: now + config.max_wait() + Duration::from_millis(1),
            bandwidth_bytes_per_s: bandwidths.1,
            accepts_connections: true,
            samples: 8,
        };
        lead.handle(
            now,
            MatchInput::JoinRequest {
                from: follower,
                request,
            },
        );
        outputs(&mut lead)
            .into_iter()
            .find_map(|o| match o {
                MatchOutput::Formed(group) => Some(group),
                _ => None,
            })
            .expect("a full group begins at once")
    };
    // Peer 2 has three times peer 1's bandwidth, and takes three quarters of the vector.
    let led_by_1 = form(1, 1, 2, (1_000_000, 3_000_000));
    let led_by_2 = form(2, 2, 1, (3_000_000, 1_000_000));
    for group in [&led_by_1, &led_by_2] {
        assert_eq!(group.members(), &[1, 2]);
        assert!(group.partition().range(1).len() > 2 * group.partition().range(0).len());
    }
    assert_eq!(led_by_1.partition(), led_by_2.partition());
}
