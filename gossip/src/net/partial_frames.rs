//! [`PartialFrameBudget`]: the bytes one peer may have this node hold in frames that have
//! not arrived whole.
//!
//! A frame larger than a reader's fixed buffer is copied into its decoder, which grows
//! with the bytes that arrive, up to `net.max_frame_payload`. Each of a peer's streams has
//! its own decoder, so without a shared bound a member could open
//! `net.max_inbound_tensor_streams_per_peer` streams, send each all but the last byte of a
//! full-size frame, and pin that many frames of memory. Every reader of a peer's streams
//! charges its decoder's buffer to one counter of that peer; a reader whose charge would
//! take the peer past `net.max_partial_frame_bytes_per_peer` ends its stream. What a peer
//! can pin is then that budget plus one decoder growth step (the charge is made once the
//! decoder has grown), plus each stream's fixed read buffer and QUIC's receive windows.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// One reader's share of its peer's partial-frame budget; gives it back when dropped.
#[derive(Debug)]
pub(crate) struct PartialFrameBudget {
    peer_held: Arc<AtomicU64>,
    limit: u64,
    charged: u64,
}

/// The peer already holds this many bytes in partial frames, over the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the peer's frames in flight would hold {held} bytes, over net.max_partial_frame_bytes_per_peer ({limit})"
)]
pub(crate) struct OverBudget {
    /// What the peer would hold.
    pub(crate) held: u64,
    /// The budget.
    pub(crate) limit: u64,
}

impl PartialFrameBudget {
    /// A reader's share of `peer_held`, which all of one peer's readers share.
    pub(crate) fn new(peer_held: Arc<AtomicU64>, limit: u64) -> PartialFrameBudget {
        PartialFrameBudget {
            peer_held,
            limit,
            charged: 0,
        }
    }

    /// This reader now holds `bytes` (its decoder's buffer): charges or refunds the
    /// difference. A charge that takes the peer past the limit is refused and not made.
    pub(crate) fn set(&mut self, bytes: u64) -> Result<(), OverBudget> {
        if bytes <= self.charged {
            self.peer_held
                .fetch_sub(self.charged - bytes, Ordering::AcqRel);
            self.charged = bytes;
            return Ok(());
        }
        let more = bytes - self.charged;
        let limit = self.limit;
        let result = self
            .peer_held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                let after = held.saturating_add(more);
                (after <= limit).then_some(after)
            });
        match result {
            Ok(_) => {
                self.charged = bytes;
                Ok(())
            }
            Err(held) => Err(OverBudget {
                held: held.saturating_add(more),
                limit,
            }),
        }
    }
}

impl Drop for PartialFrameBudget {
    fn drop(&mut self) {
        self.peer_held.fetch_sub(self.charged, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two readers of one peer share its budget: the second cannot take what the first
    /// holds, gets it once the first gives it back, and a dropped reader frees its share.
    #[test]
    fn a_peers_readers_share_one_budget() {
        let held = Arc::new(AtomicU64::new(0));
        let mut a = PartialFrameBudget::new(Arc::clone(&held), 100);
        let mut b = PartialFrameBudget::new(Arc::clone(&held), 100);
        assert_eq!(a.set(60), Ok(()));
        assert_eq!(
            b.set(50),
            Err(OverBudget {
                held: 110,
                limit: 100
            })
        );
        assert_eq!(b.set(40), Ok(()));
        assert_eq!(held.load(Ordering::Acquire), 100);
        assert_eq!(a.set(10), Ok(()));
        assert_eq!(b.set(90), Ok(()));
        drop(b);
        drop(a);
        assert_eq!(held.load(Ordering::Acquire), 0);
    }
}
