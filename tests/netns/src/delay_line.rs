//! The delay stage's core: which packets are lost, and when each held packet is released.
//!
//! A packet from peer `a` to peer `b` crosses link `a` into the router and link `b` out of it,
//! so it is held for `delay(a) + delay(b)` and lost with probability
//! `1 - (1 - loss(a)) * (1 - loss(b))` (one independent draw per link crossed). The core is
//! sans-IO: it is fed packets and the time, and says which packets are due; the `murmur-netem`
//! binary moves them between the TUN device and this queue.
//!
//! Held packets live in a slab of fixed-size slots allocated once, ordered by a min-heap keyed
//! by release time (ties broken by arrival order, so one flow is never reordered). When every
//! slot is taken the packet is dropped and counted, as a full router queue would.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::packet::{Ipv4Subnet, SubnetError, ipv4_endpoints};

/// The delay and loss of one link, applied to every packet that crosses it, either way.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkImpairment {
    /// The addresses reached over this link.
    pub subnet: Ipv4Subnet,
    /// One-way delay added to each packet crossing the link.
    pub delay: Duration,
    /// Probability in `0.0..=1.0` that a packet crossing the link is lost.
    pub loss: f64,
}

/// Why a `--link` argument or a delay line's settings were refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DelayLineError {
    /// A `--link` argument does not have the three comma-separated fields.
    #[error("link `{text}` is not SUBNET,DELAY_MICROS,LOSS (e.g. 10.77.1.0/24,20000,0.1)")]
    LinkFields {
        /// The argument as given.
        text: String,
    },
    /// The subnet of a link is malformed.
    #[error(transparent)]
    Subnet(#[from] SubnetError),
    /// The delay of a link is not a whole number of microseconds.
    #[error("link `{text}` has a delay that is not a whole number of microseconds")]
    Delay {
        /// The argument as given.
        text: String,
    },
    /// The loss of a link is not a probability.
    #[error("link {subnet} has loss {loss}; give a probability from 0.0 to 1.0")]
    Loss {
        /// The link's subnet.
        subnet: Ipv4Subnet,
        /// The loss as given.
        loss: f64,
    },
    /// The queue can hold no packet.
    #[error("the delay queue must hold at least one packet; raise --queue-packets")]
    NoCapacity,
    /// The slot size cannot hold an IPv4 packet.
    #[error("packet slots of {bytes} bytes cannot hold a packet; give 576 to 65535 bytes")]
    SlotSize {
        /// The slot size as given.
        bytes: usize,
    },
}

impl LinkImpairment {
    /// Checks that the loss is a probability.
    pub fn validate(&self) -> Result<(), DelayLineError> {
        if (0.0..=1.0).contains(&self.loss) {
            Ok(())
        } else {
            Err(DelayLineError::Loss {
                subnet: self.subnet,
                loss: self.loss,
            })
        }
    }
}

/// The `--link` argument form: `SUBNET,DELAY_MICROS,LOSS`.
impl fmt::Display for LinkImpairment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{},{},{}",
            self.subnet,
            self.delay.as_micros(),
            self.loss
        )
    }
}

impl FromStr for LinkImpairment {
    type Err = DelayLineError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let fields = || DelayLineError::LinkFields {
            text: text.to_owned(),
        };
        let mut parts = text.split(',');
        let (Some(subnet), Some(delay), Some(loss), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(fields());
        };
        let delay_micros: u64 = delay.parse().map_err(|_| DelayLineError::Delay {
            text: text.to_owned(),
        })?;
        let subnet: Ipv4Subnet = subnet.parse()?;
        let loss: f64 = loss.parse().map_err(|_| fields())?;
        let link = Self {
            subnet,
            delay: Duration::from_micros(delay_micros),
            loss,
        };
        link.validate()?;
        Ok(link)
    }
}

/// What became of a packet offered to the delay line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The packet is held until the given time.
    Held {
        /// When the packet is due to be forwarded.
        release_at: Instant,
    },
    /// The packet was lost on a link, by the configured probability.
    Lost,
    /// Every slot was taken; the packet was dropped.
    QueueFull,
    /// The packet is larger than a slot; it was dropped.
    Oversize,
}

/// Counters of what the delay line did, for the stage's report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DelayLineStats {
    /// Packets offered to the line.
    pub received: u64,
    /// Packets released after their delay.
    pub forwarded: u64,
    /// Packets lost by the configured loss probability.
    pub lost: u64,
    /// Packets dropped because the queue was full.
    pub dropped_queue_full: u64,
    /// Packets dropped because they did not fit a slot.
    pub dropped_oversize: u64,
}

/// Packets held back by their links' delays, with random loss; see the module docs.
#[derive(Debug)]
pub struct DelayLine {
    links: Vec<LinkImpairment>,
    slot_bytes: usize,
    /// `capacity * slot_bytes` bytes: slot `i` is `slots[i * slot_bytes..][..slot_bytes]`.
    slots: Vec<u8>,
    lengths: Vec<usize>,
    free: Vec<usize>,
    due: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    arrivals: u64,
    rng: StdRng,
    stats: DelayLineStats,
}

impl DelayLine {
    /// A line for `links` holding at most `capacity` packets of at most `slot_bytes` bytes each,
    /// drawing losses from a generator seeded with `seed`. Allocates everything it will use.
    pub fn new(
        links: Vec<LinkImpairment>,
        capacity: usize,
        slot_bytes: usize,
        seed: u64,
    ) -> Result<Self, DelayLineError> {
        for link in &links {
            link.validate()?;
        }
        if capacity == 0 {
            return Err(DelayLineError::NoCapacity);
        }
        if !(576..=65535).contains(&slot_bytes) {
            return Err(DelayLineError::SlotSize { bytes: slot_bytes });
        }
        Ok(Self {
            links,
            slot_bytes,
            slots: vec![0; capacity * slot_bytes],
            lengths: vec![0; capacity],
            // Popped from the end: slot 0 is used first.
            free: (0..capacity).rev().collect(),
            due: BinaryHeap::with_capacity(capacity),
            arrivals: 0,
            rng: StdRng::seed_from_u64(seed),
            stats: DelayLineStats::default(),
        })
    }

    /// Offers `packet`, arrived at `now`, to the line; copies it into a slot when it is held.
    pub fn admit(&mut self, packet: &[u8], now: Instant) -> Admission {
        self.stats.received += 1;
        if packet.len() > self.slot_bytes {
            self.stats.dropped_oversize += 1;
            return Admission::Oversize;
        }
        let (ingress, egress) = match ipv4_endpoints(packet) {
            Some((source, destination)) => (self.link_of(source), self.link_of(destination)),
            None => (None, None),
        };
        let mut delay = Duration::ZERO;
        for link in [ingress, egress].into_iter().flatten() {
            let LinkImpairment {
                delay: link_delay,
                loss,
                ..
            } = self.links[link];
            // No draw on lossless links, so adding one leaves the others' drops unchanged.
            if loss > 0.0 && self.rng.random_bool(loss) {
                self.stats.lost += 1;
                return Admission::Lost;
            }
            delay += link_delay;
        }
        let Some(slot) = self.free.pop() else {
            self.stats.dropped_queue_full += 1;
            return Admission::QueueFull;
        };
        self.slots[slot * self.slot_bytes..][..packet.len()].copy_from_slice(packet);
        self.lengths[slot] = packet.len();
        let release_at = now + delay;
        self.arrivals += 1;
        self.due.push(Reverse((release_at, self.arrivals, slot)));
        Admission::Held { release_at }
    }

    /// When the next held packet is due, if any is held.
    pub fn next_release(&self) -> Option<Instant> {
        self.due.peek().map(|Reverse((at, _, _))| *at)
    }

    /// The next packet due at or before `now`, removed from the line.
    ///
    /// The returned bytes stay valid until the line is used again.
    pub fn release_due(&mut self, now: Instant) -> Option<&[u8]> {
        let Reverse((at, _, slot)) = *self.due.peek()?;
        if at > now {
            return None;
        }
        self.due.pop();
        self.free.push(slot);
        self.stats.forwarded += 1;
        Some(&self.slots[slot * self.slot_bytes..][..self.lengths[slot]])
    }

    /// How many packets are held.
    pub fn held(&self) -> usize {
        self.due.len()
    }

    /// The counters so far.
    pub fn stats(&self) -> DelayLineStats {
        self.stats
    }

    fn link_of(&self, address: Ipv4Addr) -> Option<usize> {
        self.links
            .iter()
            .position(|link| link.subnet.contains(address))
    }
}
