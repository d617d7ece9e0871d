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
/// Each peer has one uplink and one downlink, each a FIFO pipe of fixed bandwidth. A
/// message occupies its sender's uplink for `bytes / uplink` and its receiver's downlink for
/// `bytes / downlink`, after waiting for whatever those pipes carry already, and arrives
/// one latency after it left, once both pipes are done with it. Loss follows QUIC: each
/// transmission is lost with probability `loss` and resent after a retransmission timeout
/// (two latencies plus the message's own serialization time).
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

    /// Sends `payload_bytes` from `from` to `to` at `now`; returns the arrival time.
    pub(crate) fn transfer(
        &mut self,
        now: Time,
        from: usize,
        to: usize,
        payload_bytes: usize,
        rng: &mut Xoshiro256PlusPlus,
    ) -> Time {
        let bytes = payload_bytes as u64 + self.overhead_bytes;
        self.bytes_sent += bytes;
        self.messages_sent += 1;
        let up = Duration::from_secs_f64(bytes as f64 * self.uplink_secs_per_byte);
        let down = Duration::from_secs_f64(bytes as f64 * self.downlink_secs_per_byte);

        let departs = now.max(self.uplink_free[from]);
        let sent = departs + up;
        self.uplink_free[from] = sent;
        let receives = (departs + self.latency).max(self.downlink_free[to]);
        let received = receives + down;
        self.downlink_free[to] = received;
        let mut arrival = (sent + self.latency).max(received);

        if self.loss > 0.0 {
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
