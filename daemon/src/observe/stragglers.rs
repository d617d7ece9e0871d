//! Stragglers in SGP: how fast this peer steps against the peers it hears.
//!
//! The round modes drop a member that does not send in time and count it
//! (`murmur_averaging_stragglers_dropped_total`). SGP drops no one: every peer steps at its
//! own pace and pushes when it has stepped, so a peer at a third of the others' speed
//! never shows there. Its heartbeats carry its local step, though, so each peer can tell
//! every peer's step rate: the steps it announced over the last [`WINDOW`], over the time
//! between those heartbeats. This peer's own rate counts its own steps over the same
//! window up to now, so that a stalled peer reads zero rather than its last rate.
//!
//! From these rates, [`StragglerReading`] gives this peer's rate as a fraction of the
//! median of its peers' (`murmur_averaging_step_rate_ratio`) and the number of peers, this
//! one included, stepping at under [`SLOW_FRACTION`] of the median of all
//! (`murmur_averaging_slow_peers`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The span step rates are measured over.
pub(crate) const WINDOW: Duration = Duration::from_secs(30);
/// A rate needs samples at least this far apart (a few default heartbeat intervals).
pub(crate) const MIN_SPAN: Duration = Duration::from_secs(3);
/// A peer stepping at under this fraction of the median step rate counts as slow.
pub(crate) const SLOW_FRACTION: f64 = 0.5;
/// Samples kept per peer: one per [`WINDOW`]` / SAMPLES` at most, so that a peer stepping
/// (or heartbeating) fast costs no more memory than a slow one.
const SAMPLES: u32 = 16;

/// The steps one peer announced (or this peer took), sampled over the last [`WINDOW`].
#[derive(Debug, Clone, Default)]
pub(crate) struct StepTrack {
    /// `(when, step)`, oldest first, at least `WINDOW / SAMPLES` apart.
    samples: VecDeque<(Instant, u64)>,
    /// The newest step, and when it was noted.
    latest: Option<(Instant, u64)>,
}

impl StepTrack {
    /// The peer was at `step` at `at`. A step lower than the last (a peer restarted from an
    /// older checkpoint) starts the track over.
    pub(crate) fn note(&mut self, at: Instant, step: u64) {
        if self.latest.is_some_and(|(_, last)| step < last) {
            self.samples.clear();
        }
        self.latest = Some((at, step));
        let gap = WINDOW / SAMPLES;
        if self
            .samples
            .back()
            .is_none_or(|&(last, _)| at.saturating_duration_since(last) >= gap)
        {
            self.samples.push_back((at, step));
        }
        // Keep one sample at or before the window's start, so that the window is spanned.
        while self.samples.len() > 1
            && self
                .samples
                .get(1)
                .is_some_and(|&(next, _)| at.saturating_duration_since(next) >= WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// Steps per second from the oldest sample in the window ending at `end` (the newest
    /// sample before it when none is inside) to `(end, end_step)`; `None` when they are
    /// less than [`MIN_SPAN`] apart.
    fn rate_to(&self, end: Instant, end_step: u64) -> Option<f64> {
        let since = end.checked_sub(WINDOW);
        let anchor = self
            .samples
            .iter()
            .find(|&&(at, _)| since.is_none_or(|since| at >= since))
            .or_else(|| self.samples.back())?;
        let span = end.saturating_duration_since(anchor.0);
        (span >= MIN_SPAN).then(|| end_step.saturating_sub(anchor.1) as f64 / span.as_secs_f64())
    }

    /// A heard peer's step rate, between its heartbeats in the window ending at its last.
    pub(crate) fn heard_rate(&self) -> Option<f64> {
        let (at, step) = self.latest?;
        self.rate_to(at, step)
    }

    /// This peer's own step rate over the window ending `now`: a peer that stopped
    /// stepping slows down in it, down to zero once its last step leaves the window.
    pub(crate) fn own_rate(&self, now: Instant) -> Option<f64> {
        let (_, step) = self.latest?;
        self.rate_to(now, step)
    }
}

/// What the step rates say about stragglers, from this peer's point of view.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StragglerReading {
    /// This peer's step rate over the median of the rates of the peers it hears; `None`
    /// while either is unknown or the peers' median is zero.
    pub(crate) ratio: Option<f64>,
    /// Peers, this one included, stepping at under [`SLOW_FRACTION`] of the median rate of
    /// all of them.
    pub(crate) slow_peers: usize,
}

impl StragglerReading {
    /// The reading from this peer's rate and its peers'; `None` until this peer's and at
    /// least one other's rate are known.
    pub(crate) fn from_rates(own: Option<f64>, peers: &[f64]) -> Option<StragglerReading> {
        let own = own.filter(|r| r.is_finite())?;
        let mut peers: Vec<f64> = peers.iter().copied().filter(|r| r.is_finite()).collect();
        let peers_median = median(&mut peers)?;
        peers.push(own);
        let all_median = median(&mut peers)?;
        let slow_peers = peers
            .iter()
            .filter(|&&rate| rate < SLOW_FRACTION * all_median)
            .count();
        Some(StragglerReading {
            ratio: (peers_median > 0.0).then(|| own / peers_median),
            slow_peers,
        })
    }
}

/// The median of `values` (sorted in place); `None` when there are none.
fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_unstable_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n.is_multiple_of(2) => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
        _ => Some(values[n / 2]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    /// A track of a peer heard every second for `seconds`, stepping `per_second`.
    fn heard(start: Instant, seconds: u32, per_second: u64) -> StepTrack {
        let mut track = StepTrack::default();
        for s in 0..=seconds {
            track.note(start + SECOND * s, u64::from(s) * per_second);
        }
        track
    }

    #[test]
    fn a_heard_peer_s_rate_is_its_steps_over_the_window() {
        let start = Instant::now();
        let track = heard(start, 60, 6);
        let rate = track.heard_rate().expect("known after a minute");
        assert!((rate - 6.0).abs() < 1e-9, "{rate}");
        assert!(track.samples.len() <= SAMPLES as usize + 1, "bounded");
    }

    #[test]
    fn rates_need_the_minimum_span() {
        let start = Instant::now();
        assert_eq!(heard(start, 2, 5).heard_rate(), None);
        assert!(heard(start, 4, 5).heard_rate().is_some());
        assert_eq!(StepTrack::default().own_rate(start), None);
    }

    #[test]
    fn a_stalled_peer_s_own_rate_falls_to_zero() {
        let start = Instant::now();
        let track = heard(start, 60, 6);
        let end = start + SECOND * 60;
        let fresh = track.own_rate(end).expect("known");
        let later = track.own_rate(end + SECOND * 15).expect("known");
        assert!(later < fresh * 0.6, "{later} vs {fresh}");
        assert_eq!(track.own_rate(end + SECOND * 40), Some(0.0));
    }

    #[test]
    fn a_restart_at_a_lower_step_starts_the_track_over() {
        let start = Instant::now();
        let mut track = heard(start, 40, 3);
        track.note(start + SECOND * 41, 10);
        assert_eq!(track.heard_rate(), None, "one sample since the restart");
    }

    #[test]
    fn a_peer_at_a_third_of_the_others_speed_reads_as_a_straggler() {
        let start = Instant::now();
        let (fast, slow) = (heard(start, 60, 9), heard(start, 60, 3));
        let now = start + SECOND * 60;
        let fast_rate = fast.heard_rate();
        let slow_rate = slow.heard_rate();
        let rates = |r: [Option<f64>; 2]| r.into_iter().flatten().collect::<Vec<f64>>();

        // Seen from the slow peer: it steps at a third of its peers' median.
        let mine = StragglerReading::from_rates(slow.own_rate(now), &rates([fast_rate, fast_rate]))
            .expect("known");
        let ratio = mine.ratio.expect("known");
        assert!((ratio - 1.0 / 3.0).abs() < 1e-9, "{ratio}");
        assert_eq!(mine.slow_peers, 1);

        // Seen from a fast peer: itself above its peers' median, one slow peer among three.
        let theirs =
            StragglerReading::from_rates(fast.own_rate(now), &rates([fast_rate, slow_rate]))
                .expect("known");
        assert!(theirs.ratio.expect("known") > 1.0);
        assert_eq!(theirs.slow_peers, 1);

        // Peers at the same speed: no straggler.
        let even = StragglerReading::from_rates(fast.own_rate(now), &rates([fast_rate, fast_rate]))
            .expect("known");
        assert_eq!(even.slow_peers, 0);
        assert!((even.ratio.expect("known") - 1.0).abs() < 1e-9);
    }

    #[test]
    fn nothing_is_read_without_rates_on_both_sides() {
        assert_eq!(StragglerReading::from_rates(None, &[1.0]), None);
        assert_eq!(StragglerReading::from_rates(Some(1.0), &[]), None);
        let stalled = StragglerReading::from_rates(Some(1.0), &[0.0]).expect("known");
        assert_eq!(stalled.ratio, None, "no ratio to a median of zero");
        assert_eq!(stalled.slow_peers, 1, "the stalled peer");
    }
}
