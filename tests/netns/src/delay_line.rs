//! The delay stage's core: which packets are lost, and when each held packet is released.
//!
//! A packet from peer `a` to peer `b` crosses link `a` into the router and link `b` out of it,
//! so it is held for `delay(a) + delay(b)` and lost with probability
//! `1 - (1 - loss(a)) * (1 - loss(b))` (one independent draw per link crossed). The core is
//! sans-IO: it is fed packets and the time, and says which packets are due; the `murmur-netem`
//! binary moves them between the TUN device and this queue.
//!
//! Held packets live in slabs of fixed-size slots allocated once, ordered by a min-heap keyed
//! by release time (ties broken by arrival order, so one flow is never reordered). There may be
//! several slot sizes ([`SlotClass`]): many small slots for full-size packets and a few large
//! ones for the super-packets of a TUN device with segment offloads. A packet takes a free
//! slot of the smallest size it fits; when none is free the packet is dropped and counted, as
//! a full router queue would.
//!
//! A packet may be led by a fixed number of bytes that are not IP (`header_bytes`, the
//! `virtio_net_hdr` of an offloading TUN device); they are held and released with it, and the
//! addresses are read after them.

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
    /// The slot size cannot hold an IPv4 packet, or is larger than any packet can be.
    #[error(
        "packet slots of {bytes} bytes cannot hold a packet and its {header_bytes}-byte header; \
         give 576 + {header_bytes} to 65535 + {header_bytes} bytes"
    )]
    SlotSize {
        /// The slot size as given.
        bytes: usize,
        /// The bytes that lead each packet.
        header_bytes: usize,
    },
    /// The bytes before each IP packet are more than any device puts there.
    #[error("packets led by {bytes} bytes of header; give at most {MAX_HEADER_BYTES}")]
    HeaderSize {
        /// The header size as given.
        bytes: usize,
    },
}

/// The most bytes that may lead each IP packet (a `virtio_net_hdr` is 10 or 12).
pub const MAX_HEADER_BYTES: usize = 64;

/// The largest IPv4 packet.
const MAX_IPV4_PACKET: usize = 65_535;

/// One size of the delay line's slots, and how many there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotClass {
    /// How many packets of this size the line holds at once.
    pub count: usize,
    /// The most bytes a slot holds, any header included.
    pub bytes: usize,
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
    /// Bytes of the packets offered to the line, their IP headers included and any leading
    /// non-IP header not: with segment offloads, many times `received` × the MTU.
    pub received_bytes: u64,
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
    /// Bytes before each IP packet, held with it.
    header_bytes: usize,
    /// Slot sizes, smallest first.
    slabs: Vec<Slab>,
    /// Held packets by release time and arrival: (release, arrival, slab, slot).
    due: BinaryHeap<Reverse<(Instant, u64, usize, usize)>>,
    arrivals: u64,
    rng: StdRng,
    stats: DelayLineStats,
}

/// The slots of one [`SlotClass`].
#[derive(Debug)]
struct Slab {
    slot_bytes: usize,
    /// `count * slot_bytes` bytes: slot `i` is `bytes[i * slot_bytes..][..slot_bytes]`.
    bytes: Vec<u8>,
    lengths: Vec<usize>,
    free: Vec<usize>,
}

impl Slab {
    fn new(class: SlotClass) -> Self {
        Self {
            slot_bytes: class.bytes,
            bytes: vec![0; class.count * class.bytes],
            lengths: vec![0; class.count],
            // Popped from the end: slot 0 is used first.
            free: (0..class.count).rev().collect(),
        }
    }

    fn packet(&self, slot: usize) -> &[u8] {
        &self.bytes[slot * self.slot_bytes..][..self.lengths[slot]]
    }
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
        let class = SlotClass {
            count: capacity,
            bytes: slot_bytes,
        };
        Self::with_slots(links, &[class], 0, seed)
    }

    /// A line for `links` with slots of each of `classes`, for packets each led by
    /// `header_bytes` bytes that are not IP, drawing losses from a generator seeded with
    /// `seed`. Allocates everything it will use (pages the kernel maps on first touch).
    pub fn with_slots(
        links: Vec<LinkImpairment>,
        classes: &[SlotClass],
        header_bytes: usize,
        seed: u64,
    ) -> Result<Self, DelayLineError> {
        for link in &links {
            link.validate()?;
        }
        if header_bytes > MAX_HEADER_BYTES {
            return Err(DelayLineError::HeaderSize {
                bytes: header_bytes,
            });
        }
        let sizes = 576 + header_bytes..=MAX_IPV4_PACKET + header_bytes;
        if let Some(class) = classes.iter().find(|class| !sizes.contains(&class.bytes)) {
            return Err(DelayLineError::SlotSize {
                bytes: class.bytes,
                header_bytes,
            });
        }
        let capacity: usize = classes.iter().map(|class| class.count).sum();
        if capacity == 0 {
            return Err(DelayLineError::NoCapacity);
        }
        let mut classes = classes.to_vec();
        classes.sort_by_key(|class| class.bytes);
        Ok(Self {
            links,
            header_bytes,
            slabs: classes.into_iter().map(Slab::new).collect(),
            due: BinaryHeap::with_capacity(capacity),
            arrivals: 0,
            rng: StdRng::seed_from_u64(seed),
            stats: DelayLineStats::default(),
        })
    }

    /// Offers `packet` (its header, then the IP packet), arrived at `now`, to the line; copies
    /// it into a slot when it is held.
    pub fn admit(&mut self, packet: &[u8], now: Instant) -> Admission {
        self.stats.received += 1;
        self.stats.received_bytes += packet.len().saturating_sub(self.header_bytes) as u64;
        let largest = self.slabs.last().map_or(0, |slab| slab.slot_bytes);
        if packet.len() > largest {
            self.stats.dropped_oversize += 1;
            return Admission::Oversize;
        }
        let ip = packet.get(self.header_bytes..).unwrap_or_default();
        let (ingress, egress) = match ipv4_endpoints(ip) {
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
        // The smallest slot the packet fits that is free.
        let Some((slab_index, slot)) = self
            .slabs
            .iter_mut()
            .enumerate()
            .filter(|(_, slab)| slab.slot_bytes >= packet.len())
            .find_map(|(index, slab)| slab.free.pop().map(|slot| (index, slot)))
        else {
            self.stats.dropped_queue_full += 1;
            return Admission::QueueFull;
        };
        let slab = &mut self.slabs[slab_index];
        slab.bytes[slot * slab.slot_bytes..][..packet.len()].copy_from_slice(packet);
        slab.lengths[slot] = packet.len();
        let release_at = now + delay;
        self.arrivals += 1;
        self.due
            .push(Reverse((release_at, self.arrivals, slab_index, slot)));
        Admission::Held { release_at }
    }

    /// When the next held packet is due, if any is held.
    pub fn next_release(&self) -> Option<Instant> {
        self.due.peek().map(|Reverse((at, _, _, _))| *at)
    }

    /// The next packet due at or before `now`, removed from the line.
    ///
    /// The returned bytes stay valid until the line is used again.
    pub fn release_due(&mut self, now: Instant) -> Option<&[u8]> {
        let Reverse((at, _, slab, slot)) = *self.due.peek()?;
        if at > now {
            return None;
        }
        self.due.pop();
        self.slabs[slab].free.push(slot);
        self.stats.forwarded += 1;
        Some(self.slabs[slab].packet(slot))
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
