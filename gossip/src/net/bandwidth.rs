//! Per-peer throughput, estimated from real tensor transfers.
//!
//! Butterfly all-reduce sizes each member's part by its bandwidth, so the estimate must come
//! from transfers that actually happened, not from a configured number. Every tensor stream
//! that ends reports `bytes / elapsed` for its direction; the estimate is an exponentially
//! weighted moving average of those rates. Transfers too small to say anything about
//! bandwidth (a few round trips of latency dominate them) are ignored.
//!
//! The receiving side's measurement (first byte to last byte) is the accurate one; the
//! sending side's includes the time the last window spends in flight, which makes short
//! uploads look slower than they are. Both are kept, one per direction.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use murmur_protocol::identity::PeerId;

/// Which way bytes moved, seen from this peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// This peer sent to the remote.
    Upload,
    /// This peer received from the remote.
    Download,
}

/// The current estimate for one peer. `None` until a large enough transfer has completed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PeerBandwidth {
    /// Estimated rate from this peer to the remote, bytes per second.
    pub upload_bytes_per_s: Option<f64>,
    /// Estimated rate from the remote to this peer, bytes per second.
    pub download_bytes_per_s: Option<f64>,
    /// Transfers the estimate is based on.
    pub samples: u64,
}

/// Per-peer EWMA of transfer rates. Shared by every stream; each ended transfer takes the
/// lock once.
#[derive(Debug)]
pub struct BandwidthEstimator {
    alpha: f64,
    min_transfer_bytes: u64,
    peers: Mutex<HashMap<PeerId, PeerBandwidth>>,
}

impl BandwidthEstimator {
    /// Weight of the newest transfer in the average.
    pub const DEFAULT_ALPHA: f64 = 0.3;
    /// Transfers smaller than this are latency-bound and not counted.
    pub const DEFAULT_MIN_TRANSFER_BYTES: u64 = 256 * 1024;

    /// An estimator giving the newest transfer weight `alpha` (clamped to `(0, 1]`), ignoring
    /// transfers under `min_transfer_bytes`.
    pub fn new(alpha: f64, min_transfer_bytes: u64) -> BandwidthEstimator {
        let alpha = if alpha.is_finite() && alpha > 0.0 {
            alpha.min(1.0)
        } else {
            Self::DEFAULT_ALPHA
        };
        BandwidthEstimator {
            alpha,
            min_transfer_bytes,
            peers: Mutex::new(HashMap::new()),
        }
    }

    /// Folds a completed transfer of `bytes` in `elapsed` into `peer`'s estimate. Returns
    /// whether it counted.
    pub fn record(
        &self,
        peer: PeerId,
        direction: Direction,
        bytes: u64,
        elapsed: Duration,
    ) -> bool {
        let seconds = elapsed.as_secs_f64();
        if bytes < self.min_transfer_bytes || seconds <= 0.0 {
            return false;
        }
        // u64 → f64 loses precision only beyond 2^53 bytes, far past any transfer.
        let rate = bytes as f64 / seconds;
        let mut peers = self.lock();
        let estimate = peers.entry(peer).or_default();
        let slot = match direction {
            Direction::Upload => &mut estimate.upload_bytes_per_s,
            Direction::Download => &mut estimate.download_bytes_per_s,
        };
        *slot = Some(match *slot {
            Some(previous) => previous + self.alpha * (rate - previous),
            None => rate,
        });
        estimate.samples = estimate.samples.saturating_add(1);
        true
    }

    /// The estimate for `peer`.
    pub fn get(&self, peer: &PeerId) -> PeerBandwidth {
        self.lock().get(peer).copied().unwrap_or_default()
    }

    /// Every peer's estimate.
    pub fn all(&self) -> Vec<(PeerId, PeerBandwidth)> {
        self.lock().iter().map(|(p, b)| (*p, *b)).collect()
    }

    /// Forgets `peer` (it left the swarm).
    pub fn forget(&self, peer: &PeerId) {
        self.lock().remove(peer);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PeerId, PeerBandwidth>> {
        // Estimates stay usable even if a holder panicked mid-update.
        self.peers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for BandwidthEstimator {
    fn default() -> Self {
        BandwidthEstimator::new(Self::DEFAULT_ALPHA, Self::DEFAULT_MIN_TRANSFER_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use murmur_protocol::identity::Keypair;

    use super::*;

    fn peer() -> PeerId {
        Keypair::from_seed([7; 32]).peer_id()
    }

    #[test]
    fn first_transfer_sets_the_rate_and_later_ones_move_it_by_alpha() {
        let est = BandwidthEstimator::new(0.5, 1000);
        assert!(est.record(peer(), Direction::Download, 10_000, Duration::from_secs(1)));
        assert_eq!(est.get(&peer()).download_bytes_per_s, Some(10_000.0));
        assert!(est.record(peer(), Direction::Download, 20_000, Duration::from_secs(1)));
        assert_eq!(est.get(&peer()).download_bytes_per_s, Some(15_000.0));
        assert_eq!(est.get(&peer()).upload_bytes_per_s, None);
        assert_eq!(est.get(&peer()).samples, 2);
    }

    #[test]
    fn small_or_instant_transfers_are_ignored() {
        let est = BandwidthEstimator::new(0.5, 1000);
        assert!(!est.record(peer(), Direction::Upload, 999, Duration::from_secs(1)));
        assert!(!est.record(peer(), Direction::Upload, 10_000, Duration::ZERO));
        assert_eq!(est.get(&peer()), PeerBandwidth::default());
    }
}
