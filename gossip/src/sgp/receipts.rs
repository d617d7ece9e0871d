//! The receiver's memory of what became of recent shares, to answer a sender that asks.
//!
//! A receipt can be lost with its connection, so a sender that hears none asks to cancel
//! the share. The answer must be true whenever it comes: "applied" if this peer applied it,
//! otherwise "cancelled", after which the share is never applied even if it arrives later.
//! The memory outlives the view (a sender given up and back asks about shares from before),
//! and is bounded: the last [`KEEP_STEPS`] steps of each of [`MAX_SENDERS`] senders.

use std::collections::{HashMap, VecDeque};

use murmur_protocol::message::ShareOutcome;

use crate::PeerKey;

/// Steps remembered per sender and outcome. A sender asks about a share `share_timeout_ms`
/// after sending it, with at most a few shares per edge unsettled, so this reaches far back.
pub(crate) const KEEP_STEPS: usize = 256;

/// Senders remembered; the least recently heard is forgotten beyond it.
pub(crate) const MAX_SENDERS: usize = 1024;

#[derive(Debug, Default)]
struct Sender {
    applied: VecDeque<u64>,
    cancelled: VecDeque<u64>,
    last_heard: u64,
}

/// What this peer did with recent shares, by sender and step.
#[derive(Debug)]
pub(crate) struct Receipts<P> {
    senders: HashMap<P, Sender>,
    clock: u64,
}

impl<P: PeerKey> Receipts<P> {
    pub(crate) fn new() -> Receipts<P> {
        Receipts {
            senders: HashMap::new(),
            clock: 0,
        }
    }

    /// Whether `from` cancelled its share of `step`: it must not be applied.
    pub(crate) fn is_cancelled(&self, from: P, step: u64) -> bool {
        self.senders
            .get(&from)
            .is_some_and(|sender| sender.cancelled.contains(&step))
    }

    /// Notes that the share of `step` from `from` was applied.
    pub(crate) fn applied(&mut self, from: P, step: u64) {
        let sender = self.sender(from);
        remember(&mut sender.applied, step);
    }

    /// Answers `from`'s request to cancel its share of `step`: applied if it was, otherwise
    /// cancelled for good.
    pub(crate) fn cancel(&mut self, from: P, step: u64) -> ShareOutcome {
        let sender = self.sender(from);
        if sender.applied.contains(&step) {
            return ShareOutcome::Applied;
        }
        if !sender.cancelled.contains(&step) {
            remember(&mut sender.cancelled, step);
        }
        ShareOutcome::Cancelled
    }

    fn sender(&mut self, from: P) -> &mut Sender {
        self.clock += 1;
        if !self.senders.contains_key(&from) && self.senders.len() >= MAX_SENDERS {
            let oldest = self
                .senders
                .iter()
                .min_by_key(|(_, sender)| sender.last_heard)
                .map(|(&peer, _)| peer);
            if let Some(oldest) = oldest {
                self.senders.remove(&oldest);
            }
        }
        let sender = self.senders.entry(from).or_default();
        sender.last_heard = self.clock;
        sender
    }
}

fn remember(steps: &mut VecDeque<u64>, step: u64) {
    if steps.len() >= KEEP_STEPS {
        steps.pop_front();
    }
    steps.push_back(step);
}
