//! The wall clock, as the daemon reads it for invites, progress lines and the benchmark's
//! round periods: time since the Unix epoch, 0 on a clock set before 1970.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch, as invites count them.
pub(crate) fn unix_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

/// Milliseconds since the Unix epoch.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}
