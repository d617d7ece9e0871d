//! How fully the peers' uplinks ran while a benchmark ran.
//!
//! A thread of the scenario's own enters the router's network namespace and reads its
//! `/proc/thread-self/net/dev` every 50 ms: what the router's `linkN` receives is what peer
//! `N` sent, so each window gives every uplink's bytes as a fraction of its rate. On links
//! that are the only limit, a round keeps every uplink near its rate from its start to its
//! end; where the peers' CPU, a peer that fell behind or the wait between rounds holds the
//! swarm up, windows with uplinks below their rate say when and how many.

use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::cpu::device_bytes;
use crate::Harness;

/// How often the uplinks' counters are read: the length of a window.
const PERIOD: Duration = Duration::from_millis(50);
/// An uplink that carried at least this fraction of its rate in a window ran full.
const FULL: f64 = 0.9;
/// An uplink that carried at least this fraction of its rate in a window was busy.
const BUSY: f64 = 0.1;

/// Every uplink's share of its rate, window by window.
#[derive(Debug, Clone, Default)]
pub(super) struct UplinkUse {
    /// Per window, per peer: bytes sent over the window's length times the link's rate.
    windows: Vec<Vec<f64>>,
}

/// [`UplinkUse`] over the span from the first window in which an uplink was busy to the
/// last: the rounds and the waits between them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct UplinkSummary {
    /// The mean fraction of their rate the uplinks carried.
    pub(super) mean: f64,
    /// The share of windows in which every uplink ran full (at least 90% of its rate).
    pub(super) all_full: f64,
    /// The share of windows in which at most one uplink was busy (at least 10%): a peer
    /// sending alone at the end of a round, or the wait between rounds.
    pub(super) at_most_one_busy: f64,
}

impl UplinkUse {
    pub(super) fn summary(&self) -> UplinkSummary {
        let busy = |w: &Vec<f64>| w.iter().filter(|&&u| u >= BUSY).count();
        let (Some(first), Some(last)) = (
            self.windows.iter().position(|w| busy(w) > 0),
            self.windows.iter().rposition(|w| busy(w) > 0),
        ) else {
            return UplinkSummary::default();
        };
        let span = &self.windows[first..=last];
        let n = span.len() as f64;
        let share =
            |keep: &dyn Fn(&Vec<f64>) -> bool| span.iter().filter(|w| keep(w)).count() as f64 / n;
        UplinkSummary {
            mean: span
                .iter()
                .map(|w| w.iter().sum::<f64>() / w.len().max(1) as f64)
                .sum::<f64>()
                / n,
            all_full: share(&|w| w.iter().all(|&u| u >= FULL)),
            at_most_one_busy: share(&|w| busy(w) <= 1),
        }
    }
}

impl UplinkSummary {
    pub(super) fn to_json(self) -> Value {
        json!({
            "mean": self.mean,
            "all_full": self.all_full,
            "at_most_one_busy": self.at_most_one_busy,
        })
    }
}

/// Reads the uplinks' counters on a thread until stopped.
pub(super) struct UplinkMonitor {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<UplinkUse>,
}

impl UplinkMonitor {
    /// Starts reading the uplinks of `harness`. Links without a rate, or a namespace the
    /// thread cannot enter, give no windows.
    pub(super) fn start(harness: &Harness) -> Self {
        let namespace = format!("/run/netns/{}", harness.router_namespace());
        let rates: Option<Vec<f64>> = harness
            .topology()
            .links
            .iter()
            .map(|l| l.rate_bits_per_sec.map(|r| r as f64 / 8.0))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let Some(rates) = rates else {
                return UplinkUse::default();
            };
            if !enter_namespace(&namespace) {
                return UplinkUse::default();
            }
            let mut windows = Vec::new();
            let mut last = (Instant::now(), uplink_bytes(rates.len()));
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(PERIOD);
                let next = (Instant::now(), uplink_bytes(rates.len()));
                if let (Some(before), Some(after)) = (&last.1, &next.1) {
                    let seconds = next.0.duration_since(last.0).as_secs_f64().max(1e-3);
                    let window = before
                        .iter()
                        .zip(after)
                        .zip(&rates)
                        .map(|((b, a), rate)| a.saturating_sub(*b) as f64 / seconds / rate)
                        .collect();
                    windows.push(window);
                }
                last = next;
            }
            UplinkUse { windows }
        });
        Self { stop, thread }
    }

    /// Stops reading and returns what was seen.
    pub(super) fn stop(self) -> UplinkUse {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// Moves the calling thread into the network namespace at `path`; the rest of the process
/// stays where it is.
fn enter_namespace(path: &str) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    // SAFETY: `file` is an open namespace file for the whole call; setns changes only the
    // calling thread's namespace.
    unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) == 0 }
}

/// The bytes received so far by the router's `link0..peers`, as seen from this thread's
/// namespace: what each peer has sent.
fn uplink_bytes(peers: usize) -> Option<Vec<u64>> {
    let table = std::fs::read_to_string("/proc/thread-self/net/dev").ok()?;
    (0..peers)
        .map(|p| device_bytes(&table, &format!("link{p}")).map(|(received, _)| received))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_spans_the_busy_windows_and_counts_full_and_lone_ones() {
        let quiet = vec![0.0, 0.01, 0.0];
        let uses = UplinkUse {
            windows: vec![
                quiet.clone(),
                vec![0.95, 0.97, 0.92],
                vec![0.95, 0.5, 0.97],
                vec![0.0, 0.97, 0.05],
                quiet.clone(),
                vec![0.98, 0.98, 0.98],
                quiet,
            ],
        };
        let s = uses.summary();
        // Five windows from the first busy one to the last, the quiet one between included.
        let mean = (2.84 + 2.42 + 1.02 + 0.01 + 2.94) / 3.0 / 5.0;
        assert!((s.mean - mean).abs() < 1e-12, "{s:?}");
        assert!((s.all_full - 2.0 / 5.0).abs() < 1e-12, "{s:?}");
        assert!((s.at_most_one_busy - 2.0 / 5.0).abs() < 1e-12, "{s:?}");
        assert_eq!(UplinkUse::default().summary(), UplinkSummary::default());
    }

    #[test]
    fn this_threads_own_counters_are_read() {
        let table = std::fs::read_to_string("/proc/thread-self/net/dev").expect("net/dev");
        assert!(device_bytes(&table, "lo").is_some());
        assert!(uplink_bytes(0).is_some_and(|b| b.is_empty()));
    }
}
