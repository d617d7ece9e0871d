//! The event queue: events ordered by virtual time, ties broken by insertion order.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::Time;

/// Events at the same time run in insertion order, except that `Late` ones run after every
/// `Normal` one: records are taken once everything due at that instant has happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Lane {
    Normal,
    Late,
}

#[derive(Debug)]
struct Entry<E> {
    at: Time,
    lane: Lane,
    seq: u64,
    event: E,
}

impl<E> Entry<E> {
    fn key(&self) -> (Time, Lane, u64) {
        (self.at, self.lane, self.seq)
    }
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl<E> Eq for Entry<E> {}

impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Entry<E> {
    // Reversed: `BinaryHeap` is a max-heap and we want the earliest event first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.key().cmp(&self.key())
    }
}

/// A deterministic priority queue of events.
#[derive(Debug)]
pub(crate) struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    next_seq: u64,
}

impl<E> EventQueue<E> {
    pub(crate) fn new() -> EventQueue<E> {
        EventQueue {
            heap: BinaryHeap::new(),
            next_seq: 0,
        }
    }

    pub(crate) fn push(&mut self, at: Time, lane: Lane, event: E) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Entry {
            at,
            lane,
            seq,
            event,
        });
    }

    /// The next event if it is due at or before `until`.
    pub(crate) fn pop_until(&mut self, until: Time) -> Option<(Time, E)> {
        if self.heap.peek()?.at > until {
            return None;
        }
        self.heap.pop().map(|entry| (entry.at, entry.event))
    }

    /// Events processed so far plus those pending.
    pub(crate) fn pushed(&self) -> u64 {
        self.next_seq
    }
}

#[cfg(test)]
mod tests {
    use super::{EventQueue, Lane};
    use crate::Time;

    #[test]
    fn events_come_out_by_time_then_lane_then_insertion() {
        let mut queue = EventQueue::new();
        let t = |n| Time::from_nanos(n);
        queue.push(t(5), Lane::Late, "late at 5");
        queue.push(t(5), Lane::Normal, "first at 5");
        queue.push(t(1), Lane::Normal, "at 1");
        queue.push(t(5), Lane::Normal, "second at 5");
        queue.push(t(9), Lane::Normal, "at 9");
        let mut order = Vec::new();
        while let Some((_, event)) = queue.pop_until(t(5)) {
            order.push(event);
        }
        assert_eq!(order, ["at 1", "first at 5", "second at 5", "late at 5"]);
        assert_eq!(queue.pop_until(t(10)).map(|(_, e)| e), Some("at 9"));
    }
}
