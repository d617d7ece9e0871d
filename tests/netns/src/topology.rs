//! What the harness builds: one link per peer, each with a rate, a delay and a loss, and the
//! addresses on either end. Pure data and arithmetic; [`crate::Harness`] turns it into
//! namespaces.
//!
//! Peer `i` (counted from 0) sits on subnet `10.77.(i+1).0/24`: it is `.2` and the router's end
//! of its link is `.1`. Every peer's default route points at the router.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::HarnessError;
use crate::delay_line::LinkImpairment;
use crate::packet::Ipv4Subnet;

/// The most peers one harness addresses (`10.77.1.0/24` to `10.77.254.0/24`).
pub const MAX_PEERS: usize = 254;

/// The second octet of every harness address.
const NETWORK_OCTET: u8 = 77;

/// The shape of the link between one peer and the router, the same in both directions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkShape {
    /// Rate in bits per second each way, enforced by `tc` tbf on both ends; `None` for no limit.
    pub rate_bits_per_sec: Option<u64>,
    /// One-way delay of the link. A packet between two peers crosses two links, so its
    /// one-way delay is the sum of both links' delays and the round trip twice that.
    pub delay: Duration,
    /// Probability in `0.0..=1.0` that a packet crossing the link is lost, each way.
    pub loss: f64,
}

impl LinkShape {
    /// A link with no rate limit, delay or loss.
    pub const UNSHAPED: Self = Self {
        rate_bits_per_sec: None,
        delay: Duration::ZERO,
        loss: 0.0,
    };
}

/// The whole network: one link per peer, and the delay stage's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    /// Link `i` joins peer `i` to the router.
    pub links: Vec<LinkShape>,
    /// Seed of the delay stage's loss draws.
    pub seed: u64,
    /// The most packets the delay stage holds at once; more are dropped and counted.
    pub queue_packets: usize,
    /// Threads of the delay stage, each serving one queue of its TUN device (1 to 16).
    /// One thread carries about a Gbit/s of full-size packets.
    pub delay_queues: usize,
    /// Whether the delay stage takes TCP and UDP super-packets from the kernel (TUN segment
    /// offloads) instead of MTU-sized packets, as long as no link is lossy
    /// ([`Topology::stage_offloads`]). On by default: it cuts the stage's reads and writes
    /// by the senders' GSO batch size.
    pub segment_offloads: bool,
}

impl Topology {
    /// `peers` peers, each on a link of shape `link`, with a 4096-packet delay queue.
    pub fn uniform(peers: usize, link: LinkShape) -> Self {
        Self {
            links: vec![link; peers],
            seed: 0x6d75_726d_7572,
            queue_packets: 4096,
            delay_queues: default_delay_queues(),
            segment_offloads: true,
        }
    }

    /// Whether the delay stage runs with segment offloads: when asked for and no link loses
    /// packets, since a loss would strike a super-packet whole, a burst of up to 45 packets.
    pub fn stage_offloads(&self) -> bool {
        self.segment_offloads && self.links.iter().all(|link| link.loss == 0.0)
    }

    /// Checks the peer count, the losses and the queue size.
    pub fn validate(&self) -> Result<(), HarnessError> {
        let invalid = |reason: String| Err(HarnessError::InvalidTopology { reason });
        if self.links.is_empty() || self.links.len() > MAX_PEERS {
            return invalid(format!("{} peers; give 1 to {MAX_PEERS}", self.links.len()));
        }
        if self.queue_packets == 0 {
            return invalid("queue_packets is 0; give at least 1".to_owned());
        }
        if !(1..=MAX_DELAY_QUEUES).contains(&self.delay_queues) {
            return invalid(format!(
                "delay_queues is {}; give 1 to {MAX_DELAY_QUEUES}",
                self.delay_queues
            ));
        }
        for (peer, link) in self.links.iter().enumerate() {
            if !(0.0..=1.0).contains(&link.loss) {
                return invalid(format!(
                    "link {peer} has loss {}; give 0.0 to 1.0",
                    link.loss
                ));
            }
            if link.rate_bits_per_sec == Some(0) {
                return invalid(format!(
                    "link {peer} has rate 0; give a positive rate or None for no limit"
                ));
            }
        }
        Ok(())
    }

    /// What the delay stage applies to each link.
    pub fn impairments(&self) -> Vec<LinkImpairment> {
        self.links
            .iter()
            .enumerate()
            .map(|(peer, link)| LinkImpairment {
                subnet: peer_subnet(peer),
                delay: link.delay,
                loss: link.loss,
            })
            .collect()
    }

    /// The round-trip time the links add between peers `a` and `b`: each crosses both links
    /// twice. Excludes serialization and processing time.
    pub fn round_trip(&self, a: usize, b: usize) -> Duration {
        2 * (self.links[a].delay + self.links[b].delay)
    }
}

/// Subnet of the link of peer `peer`.
///
/// # Panics
/// When `peer >= MAX_PEERS`; [`Topology::validate`] refuses such topologies.
pub fn peer_subnet(peer: usize) -> Ipv4Subnet {
    Ipv4Subnet::new(link_address(peer, 0), 24).expect("a /24 prefix is valid")
}

/// The address of peer `peer`.
pub fn peer_address(peer: usize) -> Ipv4Addr {
    link_address(peer, 2)
}

/// The router's address on the link of peer `peer`; the peer's default gateway.
pub fn router_address(peer: usize) -> Ipv4Addr {
    link_address(peer, 1)
}

fn link_address(peer: usize, host: u8) -> Ipv4Addr {
    assert!(
        peer < MAX_PEERS,
        "peer {peer} is beyond the {MAX_PEERS} a harness addresses"
    );
    // The assertion above keeps `peer + 1` within 1..=254.
    Ipv4Addr::new(10, NETWORK_OCTET, (peer + 1) as u8, host)
}

/// The most threads the delay stage runs.
pub const MAX_DELAY_QUEUES: usize = 16;

/// A quarter of the machine's cores, 1 to 4: the peers and the kernel need the rest, and
/// four threads carry eight links of 200 Mbit/s or more.
fn default_delay_queues() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (cores / 4).clamp(1, 4)
}

/// The `tc qdisc ... tbf` parameters for `rate_bits_per_sec`: a burst of 4 ms at line rate
/// (at least two full frames) and a queue of 100 ms.
pub fn tbf_parameters(rate_bits_per_sec: u64) -> Vec<String> {
    let bytes_per_sec = rate_bits_per_sec / 8;
    let burst = (bytes_per_sec / 250).max(2 * 1514);
    let limit = (bytes_per_sec / 10).max(2 * burst);
    vec![
        "rate".to_owned(),
        format!("{rate_bits_per_sec}bit"),
        "burst".to_owned(),
        burst.to_string(),
        "limit".to_owned(),
        limit.to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_and_router_share_one_subnet_per_link() {
        for peer in [0, 1, MAX_PEERS - 1] {
            let subnet = peer_subnet(peer);
            assert!(subnet.contains(peer_address(peer)));
            assert!(subnet.contains(router_address(peer)));
            assert_ne!(peer_address(peer), router_address(peer));
        }
        assert!(!peer_subnet(0).contains(peer_address(1)));
        assert_eq!(peer_address(0), Ipv4Addr::new(10, 77, 1, 2));
    }

    #[test]
    fn the_round_trip_crosses_both_links_twice() {
        let mut topology = Topology::uniform(2, LinkShape::UNSHAPED);
        topology.links[0].delay = Duration::from_millis(20);
        topology.links[1].delay = Duration::from_millis(5);
        assert_eq!(topology.round_trip(0, 1), Duration::from_millis(50));
    }

    #[test]
    fn invalid_topologies_are_refused() {
        assert!(
            Topology::uniform(0, LinkShape::UNSHAPED)
                .validate()
                .is_err()
        );
        assert!(
            Topology::uniform(MAX_PEERS + 1, LinkShape::UNSHAPED)
                .validate()
                .is_err()
        );
        let mut lossy = Topology::uniform(2, LinkShape::UNSHAPED);
        lossy.links[1].loss = 1.5;
        assert!(lossy.validate().is_err());
        lossy.links[1].loss = 0.01;
        assert!(!lossy.stage_offloads(), "a lossy link turns offloads off");
        lossy.links[1].loss = 0.0;
        assert!(lossy.stage_offloads());
        let mut stalled = Topology::uniform(2, LinkShape::UNSHAPED);
        stalled.links[0].rate_bits_per_sec = Some(0);
        assert!(stalled.validate().is_err());
        assert!(Topology::uniform(2, LinkShape::UNSHAPED).validate().is_ok());
    }

    #[test]
    fn tbf_bursts_cover_two_frames_and_queues_cover_the_burst() {
        assert_eq!(
            tbf_parameters(50_000_000),
            ["rate", "50000000bit", "burst", "25000", "limit", "625000"]
        );
        assert_eq!(
            tbf_parameters(1_000_000),
            ["rate", "1000000bit", "burst", "3028", "limit", "12500"]
        );
    }
}
