//! Repeated timing with a median, the statistic that shrugs off a noisy shared machine.

use std::time::{Duration, Instant};

/// Runs `f` once untimed (page faults, lazy initialisation), then `repeats` times, and
/// returns the median duration.
pub(crate) fn median_time(repeats: usize, mut f: impl FnMut()) -> Duration {
    f();
    let mut times: Vec<Duration> = (0..repeats.max(1))
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort_unstable();
    times[times.len() / 2]
}

/// Gigabytes (10⁹ bytes) per second.
pub(crate) fn gbps(bytes: usize, time: Duration) -> f64 {
    bytes as f64 / time.as_secs_f64() / 1e9
}
