//! A small deterministic driver for butterfly rounds: virtual time, one uplink and one
//! downlink per member, latency, and members that never join, die or stall on cue.
//!
//! Links: a message occupies its sender's uplink (FIFO, in send order), travels one
//! latency, and queues at the receiver's downlink in the order first bytes reach it; it
//! arrives once both pipes are done with it.

#![allow(dead_code, unreachable_pub)] // each test binary uses a different subset

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::time::Duration;

use murmur_gossip::Time;
use murmur_gossip::butterfly::{
    ButterflyConfig, ButterflyRound, CoverageReport, Group, MemberLink, Partition, RoundInput,
    RoundOutput, optimal_fractions,
};
use murmur_protocol::codec::CodecSpec;
use murmur_protocol::message::ChunkAddress;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

/// Bytes a chunk's frame carries besides its payload (address, weight, codec, frame header).
pub const FRAME_OVERHEAD: usize = 48;

/// What happens to a member, and when.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Listed in the group but never starts its round.
    NeverJoins,
    /// Dies at this time: unsent bytes are lost, nothing more is processed.
    DiesAt(Time),
    /// Hangs at this time: bytes already queued still leave, nothing more is processed.
    StallsAt(Time),
}

/// One member of a simulated round.
#[derive(Debug, Clone)]
pub struct MemberSpec {
    pub bandwidth: f64,
    pub accepts_connections: bool,
    pub weight: f32,
    pub local: Vec<f32>,
    pub fault: Option<Fault>,
}

#[derive(Debug, Clone)]
enum Message {
    Part {
        address: ChunkAddress,
        weight: f32,
        payload: Vec<u8>,
    },
    Averaged {
        address: ChunkAddress,
        contributors: u32,
        total_weight: f32,
        payload: Vec<u8>,
    },
}

#[derive(Debug)]
enum Event {
    /// The first byte reaches the receiver's downlink: it queues there behind whatever
    /// reached it earlier.
    Reach {
        from: usize,
        to: usize,
        left_at: Time,
        message: Message,
    },
    Deliver {
        from: usize,
        to: usize,
        left_at: Time,
        message: Message,
    },
    Sent {
        member: usize,
        to: usize,
        payload: murmur_gossip::butterfly::PayloadRef,
    },
    Tick {
        member: usize,
        at: Time,
    },
}

/// A delivered contribution: `from`'s copy of chunk `chunk` of part `part`.
pub type Delivery = (usize, u32, u32);

/// The outcome of one simulated round.
#[derive(Debug)]
pub struct Outcome {
    /// Per member: its result and report, if it finished and was not faulty.
    pub results: Vec<Option<(Vec<f32>, CoverageReport<u32>)>>,
    /// Contributions processed by live reducers.
    pub delivered: BTreeSet<Delivery>,
    /// Averaged chunks (part, chunk) each member processed.
    pub averaged_delivered: Vec<BTreeSet<(u32, u32)>>,
    /// The last finishing time among the members that finished.
    pub round_time: Time,
    /// The group the round ran in.
    pub group: Group<u32>,
    /// Per member: when the last of its contributions reached a live reducer.
    pub contributions_done: Vec<Time>,
    /// Per member: when the last of its averaged chunks reached a live member.
    pub averages_done: Vec<Time>,
}

/// The bandwidth-optimal group for these members.
pub fn optimal_group(members: &[MemberSpec], len: usize, align: usize) -> Group<u32> {
    let links: Vec<MemberLink> = members
        .iter()
        .map(|m| MemberLink {
            bandwidth: m.bandwidth,
            accepts_connections: m.accepts_connections,
        })
        .collect();
    let fractions = optimal_fractions(&links).expect("some member accepts connections");
    let partition = Partition::from_fractions(len, &fractions, align).expect("valid fractions");
    Group::new(1, 7, (0..members.len() as u32).collect(), partition).expect("valid group")
}

/// Runs one round of `group` with these members to the end (bounded by `limit` events).
pub fn run_round(
    members: &[MemberSpec],
    group: Group<u32>,
    codec: CodecSpec,
    config: &ButterflyConfig,
    latency: Duration,
) -> Outcome {
    Driver::new(members, group, codec, config, latency).run()
}

struct Driver<'a> {
    specs: &'a [MemberSpec],
    rounds: Vec<Option<ButterflyRound<u32>>>,
    queue: BinaryHeap<Reverse<(Time, u64, usize)>>,
    events: Vec<Option<Event>>,
    uplink_free: Vec<Time>,
    downlink_free: Vec<Time>,
    latency: Duration,
    finished: Vec<Option<(Vec<f32>, CoverageReport<u32>)>>,
    delivered: BTreeSet<Delivery>,
    averaged_delivered: Vec<BTreeSet<(u32, u32)>>,
    round_time: Time,
    group: Group<u32>,
    armed: Vec<Option<Time>>,
    contributions_done: Vec<Time>,
    averages_done: Vec<Time>,
}

impl<'a> Driver<'a> {
    fn new(
        specs: &'a [MemberSpec],
        group: Group<u32>,
        codec: CodecSpec,
        config: &ButterflyConfig,
        latency: Duration,
    ) -> Driver<'a> {
        let n = specs.len();
        let mut driver = Driver {
            specs,
            rounds: Vec::with_capacity(n),
            queue: BinaryHeap::new(),
            events: Vec::new(),
            uplink_free: vec![Time::ZERO; n],
            downlink_free: vec![Time::ZERO; n],
            latency,
            finished: vec![None; n],
            delivered: BTreeSet::new(),
            averaged_delivered: vec![BTreeSet::new(); n],
            round_time: Time::ZERO,
            group: group.clone(),
            armed: vec![None; n],
            contributions_done: vec![Time::ZERO; n],
            averages_done: vec![Time::ZERO; n],
        };
        for (i, spec) in specs.iter().enumerate() {
            let round = (spec.fault != Some(Fault::NeverJoins)).then(|| {
                ButterflyRound::new(
                    i as u32,
                    group.clone(),
                    spec.local.clone(),
                    spec.weight,
                    codec,
                    config,
                    Time::ZERO,
                )
                .expect("valid round")
            });
            driver.rounds.push(round);
        }
        for i in 0..n {
            driver.drain(i, Time::ZERO);
        }
        driver
    }

    fn push(&mut self, at: Time, event: Event) {
        let id = self.events.len();
        self.events.push(Some(event));
        self.queue.push(Reverse((at, id as u64, id)));
    }

    /// Whether `member` processes input at `now`.
    fn alive(&self, member: usize, now: Time) -> bool {
        match self.specs[member].fault {
            None => true,
            Some(Fault::NeverJoins) => false,
            Some(Fault::DiesAt(at) | Fault::StallsAt(at)) => now < at,
        }
    }

    fn run(mut self) -> Outcome {
        // Each chunk causes a handful of events; this bound only stops a runaway loop.
        let limit = 10_000_000;
        for _ in 0..limit {
            let Some(Reverse((now, _, id))) = self.queue.pop() else {
                break;
            };
            let Some(event) = self.events[id].take() else {
                continue;
            };
            self.step(now, event);
        }
        assert!(self.queue.is_empty(), "the round did not settle");
        Outcome {
            results: self.finished,
            delivered: self.delivered,
            averaged_delivered: self.averaged_delivered,
            round_time: self.round_time,
            group: self.group,
            contributions_done: self.contributions_done,
            averages_done: self.averages_done,
        }
    }

    fn step(&mut self, now: Time, event: Event) {
        if let Event::Reach {
            from,
            to,
            left_at,
            message,
        } = event
        {
            let bytes = message.len() + FRAME_OVERHEAD;
            let down = Duration::from_secs_f64(bytes as f64 / self.specs[to].bandwidth);
            let received = now.max(self.downlink_free[to]) + down;
            self.downlink_free[to] = received;
            let arrives = (left_at + self.latency).max(received);
            self.push(
                arrives,
                Event::Deliver {
                    from,
                    to,
                    left_at,
                    message,
                },
            );
            return;
        }
        let member = match &event {
            Event::Deliver { to, .. } | Event::Reach { to, .. } => *to,
            Event::Sent { member, .. } | Event::Tick { member, .. } => *member,
        };
        if !self.alive(member, now) {
            return;
        }
        if let Event::Tick { at, .. } = event {
            if self.armed[member] != Some(at) {
                return; // superseded by a later arming
            }
            self.armed[member] = None;
        }
        if let Event::Deliver { from, left_at, .. } = &event
            && let Some(Fault::DiesAt(at)) = self.specs[*from].fault
            && *left_at > at
        {
            // The sender died before these bytes left: the connection reset took them.
            return;
        }
        let Some(round) = self.rounds[member].as_mut() else {
            return;
        };
        let result = match event {
            Event::Deliver {
                from,
                message:
                    Message::Part {
                        address,
                        weight,
                        payload,
                    },
                ..
            } => {
                let taken = round.stats().part_chunks_received;
                let result = round.handle(
                    now,
                    RoundInput::PartChunk {
                        from: from as u32,
                        address,
                        weight,
                        codec: round.codec_spec(),
                        payload: &payload,
                    },
                );
                if round.stats().part_chunks_received > taken {
                    self.delivered.insert((from, address.part, address.chunk));
                    self.contributions_done[from] = now;
                }
                result
            }
            Event::Deliver {
                from,
                message:
                    Message::Averaged {
                        address,
                        contributors,
                        total_weight,
                        payload,
                    },
                ..
            } => {
                self.averaged_delivered[member].insert((address.part, address.chunk));
                self.averages_done[from] = now;
                round.handle(
                    now,
                    RoundInput::AveragedChunk {
                        from: from as u32,
                        address,
                        contributors,
                        total_weight,
                        codec: round.codec_spec(),
                        payload: &payload,
                    },
                )
            }
            Event::Sent { to, payload, .. } => round.handle(
                now,
                RoundInput::Sent {
                    to: to as u32,
                    payload,
                },
            ),
            // Handled above, before the receiver is consulted.
            Event::Reach { .. } => Ok(()),
            Event::Tick { .. } => {
                if round.poll_timeout().is_some_and(|at| at <= now) {
                    round.handle(now, RoundInput::Tick)
                } else {
                    Ok(())
                }
            }
        };
        result.expect("honest members send well-formed chunks");
        self.drain(member, now);
    }

    /// Moves a member's outputs onto the links and arms its timer.
    fn drain(&mut self, member: usize, now: Time) {
        let Some(round) = self.rounds[member].as_mut() else {
            return;
        };
        let mut sends = Vec::new();
        while let Some(output) = round.poll_output() {
            match output {
                RoundOutput::SendPartChunk {
                    to,
                    address,
                    weight,
                    payload,
                } => {
                    let bytes = round.payload(payload).expect("current payload").to_vec();
                    let message = Message::Part {
                        address,
                        weight,
                        payload: bytes,
                    };
                    sends.push((to as usize, payload, message));
                }
                RoundOutput::SendAveragedChunk {
                    to,
                    address,
                    contributors,
                    total_weight,
                    payload,
                } => {
                    let bytes = round.payload(payload).expect("current payload").to_vec();
                    let message = Message::Averaged {
                        address,
                        contributors,
                        total_weight,
                        payload: bytes,
                    };
                    sends.push((to as usize, payload, message));
                }
                RoundOutput::Finished(report) => {
                    self.round_time = self.round_time.max(now);
                    self.finished[member] = Some((round.result().to_vec(), report));
                }
            }
        }
        let timeout = round.poll_timeout();
        for (to, payload, message) in sends {
            let bytes = message.len() + FRAME_OVERHEAD;
            let up = Duration::from_secs_f64(bytes as f64 / self.specs[member].bandwidth);
            let departs = now.max(self.uplink_free[member]);
            let left_at = departs + up;
            self.uplink_free[member] = left_at;
            self.push(
                left_at,
                Event::Sent {
                    member,
                    to,
                    payload,
                },
            );
            self.push(
                departs + self.latency,
                Event::Reach {
                    from: member,
                    to,
                    left_at,
                    message,
                },
            );
        }
        if timeout != self.armed[member] {
            self.armed[member] = timeout;
            if let Some(at) = timeout {
                self.push(at.max(now), Event::Tick { member, at });
            }
        }
    }
}

impl Message {
    fn len(&self) -> usize {
        match self {
            Message::Part { payload, .. } | Message::Averaged { payload, .. } => payload.len(),
        }
    }
}

/// `count` vectors of `len` elements: a shared signal plus per-member noise.
pub fn vectors(seed: u64, count: usize, len: usize) -> Vec<Vec<f32>> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let signal: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
    (0..count)
        .map(|_| {
            signal
                .iter()
                .map(|s| s + rng.random_range(-0.5f32..0.5))
                .collect()
        })
        .collect()
}

/// The weighted mean of `(vector, weight)` over the members in `who`, element by element,
/// in f64, and the weighted mean of absolute values (the scale for relative tolerances).
pub fn weighted_mean(specs: &[MemberSpec], who: &[usize], element: usize) -> (f64, f64) {
    let total: f64 = who.iter().map(|&i| f64::from(specs[i].weight)).sum();
    let (sum, abs) = who.iter().fold((0.0, 0.0), |(s, a), &i| {
        let w = f64::from(specs[i].weight);
        let x = f64::from(specs[i].local[element]);
        (s + w * x, a + w * x.abs())
    });
    (sum / total, abs / total)
}
