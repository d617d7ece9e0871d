//! [`BusyTime`]: the wall time during which at least one averaging round or push-sum share
//! was in flight, for `murmur_averaging_busy_seconds_total`.
//!
//! Summing durations overstates it as soon as they overlap. Overlap SGP sends a share every
//! step without waiting for the last one, so a peer whose upload is capped has several
//! shares queued at once: each one's duration counts the others' time too, and their sum
//! grew faster than the clock (a "time in averaging" over 100 %). Counting the union of the
//! intervals instead keeps the counter's rate at or under one second per second.

use std::collections::VecDeque;

/// Disjoint busy intervals kept to merge later ones into. Older ones are forgotten, and a
/// later interval reaching back past them is cut at their end: it may then count less than
/// it covered, never more.
const KEPT_SPANS: usize = 64;

/// The union of intervals that are reported when they end, in seconds since an origin the
/// caller chooses.
#[derive(Debug, Clone, Default)]
pub(crate) struct BusyTime {
    /// Disjoint `(start, end)` intervals, in order.
    spans: VecDeque<(f64, f64)>,
    /// Time before which everything counts as covered already.
    floor: f64,
}

impl BusyTime {
    /// An interval of length `took` ended at `end`: merges `[end - took, end]` into the
    /// union and returns the seconds it added to it.
    pub(crate) fn add(&mut self, end: f64, took: f64) -> f64 {
        if !end.is_finite() || !took.is_finite() {
            return 0.0;
        }
        let start = (end - took.max(0.0)).max(self.floor);
        if end <= start {
            return 0.0;
        }
        // The spans are sorted and disjoint: those from `first` to `past` touch the new
        // interval, their overlaps with it add up to its overlap with their union, and
        // they merge with it into one span. In place: this runs once per SGP step.
        let first = self.spans.partition_point(|&(_, e)| e < start);
        let past = self.spans.partition_point(|&(s, _)| s <= end);
        let (mut merged_start, mut merged_end) = (start, end);
        let mut covered = 0.0;
        for &(s, e) in self.spans.range(first..past) {
            covered += (e.min(end) - s.max(start)).max(0.0);
            merged_start = merged_start.min(s);
            merged_end = merged_end.max(e);
        }
        self.spans.drain(first..past);
        self.spans.insert(first, (merged_start, merged_end));
        while self.spans.len() > KEPT_SPANS {
            if let Some((_, e)) = self.spans.pop_front() {
                self.floor = self.floor.max(e);
            }
        }
        ((end - start) - covered).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_intervals_count_their_union_once() {
        let mut busy = BusyTime::default();
        // Three 3 s shares sent a second apart, each queued behind the last.
        let added: f64 = [(3.0, 3.0), (4.0, 3.0), (5.0, 3.0)]
            .iter()
            .map(|&(end, took)| busy.add(end, took))
            .sum();
        assert_eq!(added, 5.0, "the union [0, 5], not 9 s of summed durations");
    }

    #[test]
    fn disjoint_intervals_add_up_and_gaps_are_not_counted() {
        let mut busy = BusyTime::default();
        assert_eq!(busy.add(1.0, 1.0), 1.0);
        assert_eq!(busy.add(4.0, 2.0), 2.0);
        // Reaches back over the gap [1, 2]: only the gap is new.
        assert_eq!(busy.add(4.0, 4.0), 1.0);
        assert_eq!(
            busy.add(4.0, 4.0),
            0.0,
            "the same interval twice adds nothing"
        );
    }

    #[test]
    fn an_interval_reported_late_fills_only_what_is_uncovered() {
        let mut busy = BusyTime::default();
        assert_eq!(busy.add(10.0, 1.0), 1.0);
        assert_eq!(busy.add(20.0, 1.0), 1.0);
        // Ended before the last one was reported, and spans both earlier spans.
        assert_eq!(busy.add(19.5, 10.5), 9.0);
        assert_eq!(busy.spans.len(), 1);
    }

    #[test]
    fn forgotten_spans_never_count_twice() {
        let mut busy = BusyTime::default();
        for k in 0..200 {
            let end = f64::from(k) * 2.0 + 1.0;
            assert_eq!(busy.add(end, 1.0), 1.0);
        }
        assert_eq!(busy.spans.len(), KEPT_SPANS);
        // The oldest 136 spans are forgotten: time before the end of the last of them
        // (271 s) counts as covered. After it, the 64 remembered spans cover 64 s of the
        // 129 s to 400 s; only the 65 s of gaps between them are new.
        assert_eq!(busy.add(400.0, 400.0), 65.0);
    }

    /// The length of the union of `intervals`, by sorting them.
    fn union_length(mut intervals: Vec<(f64, f64)>) -> f64 {
        intervals.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut total = 0.0;
        let mut reach = f64::NEG_INFINITY;
        for (s, e) in intervals {
            let from = s.max(reach);
            if e > from {
                total += e - from;
            }
            reach = reach.max(e);
        }
        total
    }

    #[test]
    fn what_is_added_up_is_the_union_of_every_interval() {
        // Intervals reported in order of their ends, of lengths up to 8 s, from a fixed LCG.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % n
        };
        let mut busy = BusyTime::default();
        let (mut end, mut added, mut seen) = (10.0, 0.0, Vec::new());
        for _ in 0..40 {
            end += next(40) as f64 / 10.0;
            let took = next(80) as f64 / 10.0;
            added += busy.add(end, took);
            seen.push((end - took, end));
            let union = union_length(seen.clone());
            assert!((added - union).abs() < 1e-9, "{added} against {union}");
        }
    }

    #[test]
    fn empty_negative_and_non_finite_intervals_add_nothing() {
        let mut busy = BusyTime::default();
        assert_eq!(busy.add(1.0, 0.0), 0.0);
        assert_eq!(busy.add(1.0, -3.0), 0.0);
        assert_eq!(busy.add(f64::NAN, 1.0), 0.0);
        assert_eq!(busy.add(1.0, f64::INFINITY), 0.0);
        assert!(busy.spans.is_empty());
    }
}
