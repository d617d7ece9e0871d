//! Links between simulated peers: per-direction bandwidth, latency and loss.

use std::time::Duration;

use rand::RngExt;
use rand::rngs::Xoshiro256PlusPlus;

use crate::Time;

use super::scenario::LinkSpec;

/// Retransmissions a message may need before the simulated transport gives up retrying.
const MAX_RETRANSMISSIONS: u32 = 16;

/// The network of a run: when does a message of `n` bytes sent now arrive?
///
/// Each peer has one uplink and one downlink, each a FIFO pipe of fixed bandwidth, plus a
/// one-way latency. Sending is two steps, as a message crosses two pipes:
///
/// 1. [`Network::depart`], when the sender hands the message over: it waits for the
///    sender's uplink, occupies it for `bytes / uplink`, and its first byte reaches the
///    receiver one latency after it left.
/// 2. [`Network::arrive`], called when that first byte reaches the receiver: the message
///    queues at the receiver's downlink behind whatever reached it earlier, occupies it for
///    `bytes / downlink`, and has arrived once both pipes are done with it.
///
/// Queueing at the downlink only when the first byte gets there keeps a burst that one
/// sender has queued on its own uplink from holding up bytes that other senders deliver
/// before the burst's later messages have even left. Loss follows QUIC: each transmission
/// is lost with probability `loss` and resent after a retransmission timeout (two
/// latencies plus the message's own serialization time).
#[derive(Debug)]
pub(crate) struct Network {
    latency: Duration,
    loss: f64,
    overhead_bytes: u64,
    /// Seconds per byte; zero for an unlimited link.
    uplink_secs_per_byte: f64,
    downlink_secs_per_byte: f64,
    uplink_free: Vec<Time>,
    downlink_free: Vec<Time>,
    bytes_sent: u64,
    messages_sent: u64,
}

/// A message on its way: what [`Network::depart`] decided and [`Network::arrive`] needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Departure {
    /// When its first byte left the sender.
    pub(crate) departs: Time,
    /// When its last byte left the sender: the transport is done with the payload.
    pub(crate) sent: Time,
    /// When its first byte reaches the receiver: call [`Network::arrive`] then.
    pub(crate) reaches: Time,
    bytes: u64,
}

impl Network {
    pub(crate) fn new(spec: &LinkSpec, peers: usize) -> Network {
        let secs_per_byte = |mbps: Option<f64>| mbps.map_or(0.0, |mbps| 8.0 / (mbps * 1e6));
        Network {
            latency: Duration::from_secs_f64(spec.latency_ms * 1e-3),
            loss: spec.loss,
            overhead_bytes: spec.overhead_bytes,
            uplink_secs_per_byte: secs_per_byte(spec.uplink_mbps),
            downlink_secs_per_byte: secs_per_byte(spec.downlink_mbps),
            uplink_free: vec![Time::ZERO; peers],
            downlink_free: vec![Time::ZERO; peers],
            bytes_sent: 0,
            messages_sent: 0,
        }
    }

    /// Makes room for a peer that joined.
    pub(crate) fn add_peer(&mut self) {
        self.uplink_free.push(Time::ZERO);
        self.downlink_free.push(Time::ZERO);
    }

    /// One-way latency.
    pub(crate) fn latency(&self) -> Duration {
        self.latency
    }

    /// Hands `payload_bytes` to `from`'s uplink at `now`.
    pub(crate) fn depart(&mut self, now: Time, from: usize, payload_bytes: usize) -> Departure {
        let bytes = payload_bytes as u64 + self.overhead_bytes;
        self.bytes_sent += bytes;
        self.messages_sent += 1;
        let up = Duration::from_secs_f64(bytes as f64 * self.uplink_secs_per_byte);
        let departs = now.max(self.uplink_free[from]);
        let sent = departs + up;
        self.uplink_free[from] = sent;
        Departure {
            departs,
            sent,
            reaches: departs + self.latency,
            bytes,
        }
    }

    /// Queues a message whose first byte reaches `to` now (at `departure.reaches`) at the
    /// receiver's downlink; returns its arrival time.
    pub(crate) fn arrive(
        &mut self,
        departure: &Departure,
        to: usize,
        rng: &mut Xoshiro256PlusPlus,
    ) -> Time {
        let down = Duration::from_secs_f64(departure.bytes as f64 * self.downlink_secs_per_byte);
        let received = departure.reaches.max(self.downlink_free[to]) + down;
        self.downlink_free[to] = received;
        let mut arrival = (departure.sent + self.latency).max(received);
        if self.loss > 0.0 {
            let up = departure.sent.saturating_since(departure.departs);
            let timeout = self.latency * 2 + up.max(down);
            let mut resent = 0;
            while resent < MAX_RETRANSMISSIONS && rng.random_bool(self.loss) {
                arrival = arrival + timeout;
                resent += 1;
            }
        }
        arrival
    }

    /// Bytes put on the wire so far, overhead included.
    pub(crate) fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    /// Messages sent so far.
    pub(crate) fn messages_sent(&self) -> u64 {
        self.messages_sent
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::Xoshiro256PlusPlus;

    use super::Network;
    use crate::Time;
    use crate::sim::scenario::LinkSpec;

    /// A burst that peer 0 queues on its own uplink holds up at peer 2's downlink only the
    /// bytes that reach it: a message from peer 1 whose first byte gets there before the
    /// burst's last messages have left arrives behind what reached it earlier, not behind
    /// the whole burst.
    #[test]
    fn a_burst_queued_on_one_uplink_does_not_hold_up_other_senders() {
        let spec = LinkSpec {
            latency_ms: 1.0,
            uplink_mbps: Some(8.0),
            downlink_mbps: Some(8.0),
            overhead_bytes: 0,
            ..LinkSpec::default()
        };
        let mut network = Network::new(&spec, 3);
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
        // 1 MB/s: 10 kB take 10 ms on either pipe.
        let burst: Vec<_> = (0..10)
            .map(|_| network.depart(Time::ZERO, 0, 10_000))
            .collect();
        let late = network.depart(Time::from_secs_f64(0.005), 1, 10_000);
        let mut arrivals = Vec::new();
        let mut pending: Vec<_> = burst.iter().map(|d| (d.reaches, 0, *d)).collect();
        pending.push((late.reaches, 1, late));
        pending.sort_by_key(|&(reaches, from, _)| (reaches, from));
        for (_, from, departure) in pending {
            arrivals.push((from, network.arrive(&departure, 2, &mut rng)));
        }
        let from_peer_1 = arrivals.iter().find(|(from, _)| *from == 1).map(|a| a.1);
        // Its first byte reaches peer 2 at 6 ms, while the burst's first message is on the
        // downlink until 11 ms: it queues behind that one only and is done at 21 ms.
        assert_eq!(from_peer_1, Some(Time::from_secs_f64(0.021)));
        // The burst's last message left at 100 ms and still arrives one latency later.
        let last = arrivals
            .iter()
            .filter(|(from, _)| *from == 0)
            .map(|a| a.1)
            .max();
        assert_eq!(last, Some(Time::from_secs_f64(0.111)));
    }
}
