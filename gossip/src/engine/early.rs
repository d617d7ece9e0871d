//! Chunks that arrive for a group this peer has not begun, and the payload buffers an
//! engine keeps for its own sends.
//!
//! A member begins its round when its `GroupBegin` arrives; a faster member may already be
//! sending it chunks by then. Those wait here, bounded in count and age, until the group
//! begins. Chunks of groups that ended (a late average, a chunk from a member dropped for
//! silence) are recognised and dropped at once.

use std::collections::VecDeque;
use std::time::Duration;

use crate::Time;
use crate::parcel::Parcel;

/// Most chunks held for groups not begun; the oldest go first.
const EARLY_LIMIT: usize = 4096;

/// Recently ended groups remembered, to drop their late chunks at once.
const ENDED_REMEMBERED: usize = 32;

/// Idle payload buffers an engine keeps for its sends.
const SPARES_LIMIT: usize = 256;

/// The group a chunk belongs to, if the parcel is a chunk.
pub(crate) fn group_of<P>(parcel: &Parcel<P>) -> Option<u64> {
    match parcel {
        Parcel::PartChunk(m, _) => Some(m.address.group_id),
        Parcel::Averaged(m, _) => Some(m.address.group_id),
        _ => None,
    }
}

/// Chunks waiting for their group to begin.
#[derive(Debug)]
pub(crate) struct Early<P> {
    waiting: VecDeque<(Time, P, Parcel<P>)>,
    ended: VecDeque<u64>,
}

impl<P> Default for Early<P> {
    fn default() -> Self {
        Early {
            waiting: VecDeque::new(),
            ended: VecDeque::with_capacity(ENDED_REMEMBERED),
        }
    }
}

impl<P: Copy> Early<P> {
    /// Keeps a chunk of group `group` until the group begins; gives back what must be
    /// recycled instead (a chunk of an ended group, or the oldest kept when full).
    pub(crate) fn keep(
        &mut self,
        now: Time,
        group: u64,
        from: P,
        parcel: Parcel<P>,
    ) -> Option<Parcel<P>> {
        if self.ended.contains(&group) {
            return Some(parcel);
        }
        let evicted = (self.waiting.len() >= EARLY_LIMIT)
            .then(|| self.waiting.pop_front())
            .flatten()
            .map(|(_, _, p)| p);
        self.waiting.push_back((now, from, parcel));
        evicted
    }

    /// Moves the chunks of `group` into `out`, in arrival order.
    pub(crate) fn take(&mut self, group: u64, out: &mut Vec<(P, Parcel<P>)>) {
        let mut i = 0;
        while i < self.waiting.len() {
            if group_of(&self.waiting[i].2) == Some(group) {
                if let Some((_, from, parcel)) = self.waiting.remove(i) {
                    out.push((from, parcel));
                }
            } else {
                i += 1;
            }
        }
    }

    /// Notes that `group` ended: its chunks still waiting, and any that come later, go.
    pub(crate) fn ended(&mut self, group: u64, recycle: &mut impl FnMut(Parcel<P>)) {
        if self.ended.len() >= ENDED_REMEMBERED {
            self.ended.pop_front();
        }
        self.ended.push_back(group);
        let mut kept = Vec::new();
        self.take(group, &mut kept);
        kept.into_iter().for_each(|(_, p)| recycle(p));
    }

    /// Drops chunks `max_age` old or older: their group never began here. At
    /// [`Early::next_expiry`] the oldest goes, so a tick then makes progress (with `>` the
    /// engine asked for a tick at that instant and was asked again, without end, in the
    /// simulator's virtual time).
    pub(crate) fn expire(
        &mut self,
        now: Time,
        max_age: Duration,
        recycle: &mut impl FnMut(Parcel<P>),
    ) {
        while self
            .waiting
            .front()
            .is_some_and(|(at, _, _)| now.saturating_since(*at) >= max_age)
        {
            if let Some((_, _, parcel)) = self.waiting.pop_front() {
                recycle(parcel);
            }
        }
    }

    /// When the oldest chunk expires, if any waits.
    pub(crate) fn next_expiry(&self, max_age: Duration) -> Option<Time> {
        self.waiting.front().map(|(at, _, _)| *at + max_age)
    }

    /// Chunks waiting.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.waiting.len()
    }
}

/// Payload buffers for sends, reused from what arrived and what was sent.
#[derive(Debug, Default)]
pub(crate) struct Spares {
    free: Vec<Vec<u8>>,
}

impl Spares {
    /// An empty buffer, reused when one is idle.
    pub(crate) fn take(&mut self) -> Vec<u8> {
        self.free.pop().unwrap_or_default()
    }

    /// Takes a buffer back; one the stash has no room for is handed to `overflow`.
    pub(crate) fn give(&mut self, mut buf: Vec<u8>, overflow: impl FnOnce(Vec<u8>)) {
        if buf.capacity() == 0 {
            return;
        }
        if self.free.len() < SPARES_LIMIT {
            buf.clear();
            self.free.push(buf);
        } else {
            overflow(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use murmur_protocol::codec::CodecSpec;
    use murmur_protocol::message::{ChunkAddress, TensorPartChunk};

    use super::*;

    fn chunk(group: u64) -> Parcel<u32> {
        Parcel::PartChunk(
            TensorPartChunk {
                address: ChunkAddress {
                    group_id: group,
                    part: 0,
                    chunk: 0,
                    offset: 0,
                    elements: 1,
                },
                weight: 1.0,
                codec: CodecSpec::F32,
                payload: &[],
            },
            vec![0; 4],
        )
    }

    #[test]
    fn chunks_wait_for_their_group_and_late_ones_of_ended_groups_go() {
        let mut early = Early::default();
        assert!(early.keep(Time::ZERO, 7, 1u32, chunk(7)).is_none());
        assert!(early.keep(Time::ZERO, 8, 2u32, chunk(8)).is_none());
        let mut out = Vec::new();
        early.take(7, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, 1);
        assert_eq!(early.len(), 1);
        let mut dropped = 0;
        early.ended(8, &mut |_| dropped += 1);
        assert_eq!(dropped, 1, "the ended group's waiting chunk goes");
        assert!(
            early.keep(Time::ZERO, 8, 2, chunk(8)).is_some(),
            "a late chunk of an ended group is handed back"
        );
    }

    #[test]
    fn old_chunks_expire() {
        let mut early = Early::default();
        early.keep(Time::ZERO, 7, 1u32, chunk(7));
        let mut dropped = 0;
        let age = Duration::from_secs(1);
        early.expire(Time::from_secs_f64(0.5), age, &mut |_| dropped += 1);
        assert_eq!(dropped, 0);
        assert_eq!(early.next_expiry(age), Some(Time::from_secs_f64(1.0)));
        early.expire(Time::from_secs_f64(1.0), age, &mut |_| dropped += 1);
        assert_eq!(dropped, 1, "due at its expiry");
        assert_eq!(early.next_expiry(age), None);
    }
}
