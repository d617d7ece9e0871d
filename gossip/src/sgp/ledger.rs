//! The sender's ledger: every share from the moment it goes to the transport until its
//! receiver says what became of it.
//!
//! A transport that reports a share written only knows its bytes left this process; the
//! connection may close before the receiver reads them. So a written share stays in the
//! ledger, with what it takes to take it back, until a receipt says it was applied. Without
//! a receipt by its deadline the sender asks its receiver to cancel it, and takes the mass
//! back only when the receiver promises never to apply it.

use crate::Time;

/// Shares an exact edge may carry before its receiver acknowledges the oldest. Quantized
/// edges carry one (their reference moves with every share).
pub(crate) const MAX_UNACKNOWLEDGED_EXACT: usize = 4;

/// One share the sender has not settled.
#[derive(Debug)]
pub(crate) struct Entry<P> {
    pub(crate) seq: u64,
    pub(crate) to: P,
    pub(crate) step: u64,
    pub(crate) weight: f64,
    /// Whether the share carries its numerator exactly (`f32`), so that only its payload
    /// can take it back; a quantized edge's share is taken back by the edge's reference.
    pub(crate) exact: bool,
    /// An exact share's payload, kept from the transport's report that it was written
    /// until the share is settled, to take it back.
    pub(crate) kept: Option<Vec<u8>>,
    /// Whether the transport reported every byte written.
    pub(crate) written: bool,
    /// When to stop waiting for the transport's report (not yet written), or for a receipt.
    pub(crate) deadline: Time,
    /// Cancel requests sent for it so far.
    pub(crate) cancels: u32,
    /// Its receiver promised never to apply it before the transport reported its payload
    /// (an exact share marked written when its receiver was given up as crashed): it is
    /// taken back from the payload the transport reports, written or returned.
    pub(crate) cancelled: bool,
}

/// The unsettled shares of one sender, in the order they were sent.
#[derive(Debug)]
pub(crate) struct Ledger<P> {
    entries: Vec<Entry<P>>,
}

impl<P: Copy + PartialEq> Ledger<P> {
    pub(crate) fn new() -> Ledger<P> {
        Ledger {
            entries: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, entry: Entry<P>) {
        self.entries.push(entry);
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Shares to `to` not settled yet.
    pub(crate) fn unsettled_to(&self, to: P) -> usize {
        self.entries.iter().filter(|entry| entry.to == to).count()
    }

    /// The share `seq` to `to`.
    pub(crate) fn by_seq(&mut self, to: P, seq: u64) -> Option<&mut Entry<P>> {
        self.entries
            .iter_mut()
            .find(|entry| entry.to == to && entry.seq == seq)
    }

    /// Marks the share of `step` to `to` cancelled by its receiver if it is exact and its
    /// payload is still with the transport, and says so; it then waits for that payload, at
    /// most one share timeout from `now` (the transport reports every share, written or
    /// returned, within its own bounds).
    pub(crate) fn await_payload(&mut self, to: P, step: u64, deadline: Time) -> bool {
        let Some(entry) = self
            .entries
            .iter_mut()
            .find(|entry| entry.to == to && entry.step == step)
        else {
            return false;
        };
        if !entry.exact || entry.kept.is_some() {
            return false;
        }
        if !entry.cancelled {
            entry.cancelled = true;
            entry.deadline = deadline;
        }
        true
    }

    /// Takes the share `seq` to `to` out of the ledger.
    pub(crate) fn remove_seq(&mut self, to: P, seq: u64) -> Option<Entry<P>> {
        self.remove_first(|entry| entry.to == to && entry.seq == seq)
    }

    /// Takes the oldest share of `step` to `to` out of the ledger (one share per step and
    /// edge, so the step names it).
    pub(crate) fn remove_step(&mut self, to: P, step: u64) -> Option<Entry<P>> {
        self.remove_first(|entry| entry.to == to && entry.step == step)
    }

    /// Takes the first share whose deadline has come out of the ledger.
    pub(crate) fn remove_due(&mut self, now: Time) -> Option<Entry<P>> {
        self.remove_first(|entry| entry.deadline <= now)
    }

    fn remove_first(&mut self, matches: impl Fn(&Entry<P>) -> bool) -> Option<Entry<P>> {
        let at = self.entries.iter().position(matches)?;
        Some(self.entries.remove(at))
    }

    /// The earliest deadline.
    pub(crate) fn next_deadline(&self) -> Option<Time> {
        self.entries.iter().map(|entry| entry.deadline).min()
    }

    /// Stops pacing on shares to `to`, which will never report: marks them written.
    pub(crate) fn stop_pacing_on(&mut self, to: P) {
        for entry in self.entries.iter_mut().filter(|entry| entry.to == to) {
            entry.written = true;
        }
    }

    /// Makes the overdue written shares to `to` (asked about before) due at `now`.
    pub(crate) fn overdue_now(&mut self, to: P, now: Time) {
        for entry in self.entries.iter_mut() {
            if entry.to == to && entry.written && entry.cancels > 0 {
                entry.deadline = entry.deadline.min(now);
            }
        }
    }

    /// Whether the transport reported every share written (or the peer stopped waiting).
    pub(crate) fn all_written(&self) -> bool {
        self.entries.iter().all(|entry| entry.written)
    }

    /// Whether a share of a step before `before` still waits for the transport.
    pub(crate) fn unwritten_before(&self, before: u64) -> bool {
        self.entries
            .iter()
            .any(|entry| !entry.written && entry.step < before)
    }
}
