//! Time as the state machines see it: a point on a clock that the caller owns.

use std::ops::{Add, Sub};
use std::time::Duration;

/// A point in time, in nanoseconds since an epoch chosen by the caller.
///
/// The state machines never read a clock; the caller passes `now` with every input. The
/// simulator counts virtual nanoseconds from the start of a run, the network layer counts
/// real ones from the moment it started. Arithmetic saturates instead of wrapping, so a
/// timeout far in the future cannot overflow into the past.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(u64);

impl Time {
    /// The epoch itself.
    pub const ZERO: Time = Time(0);

    /// The point `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Time {
        Time(nanos)
    }

    /// The point `secs` seconds after the epoch, rounded to the nearest nanosecond.
    ///
    /// Negative and non-finite inputs map to the epoch; values past the end of the clock
    /// saturate.
    pub fn from_secs_f64(secs: f64) -> Time {
        if secs.is_nan() || secs <= 0.0 {
            return Time::ZERO;
        }
        // `as` saturates for values beyond u64::MAX, which is the behaviour we want.
        Time((secs * 1e9).round() as u64)
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The point `millis` milliseconds after the epoch.
    pub const fn from_millis(millis: u64) -> Time {
        Time(millis.saturating_mul(1_000_000))
    }

    /// Whole milliseconds since the epoch, rounded down.
    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000_000
    }

    /// This point rounded up to a whole millisecond, so that it converts to a wall clock
    /// counted in milliseconds and back without changing.
    pub const fn ceil_millis(self) -> Time {
        Time(self.0.div_ceil(1_000_000).saturating_mul(1_000_000))
    }

    /// Seconds since the epoch.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 * 1e-9
    }

    /// How long after `earlier` this point lies; zero if it lies before.
    pub fn saturating_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Time {
    type Output = Time;

    fn add(self, span: Duration) -> Time {
        let nanos = u64::try_from(span.as_nanos()).unwrap_or(u64::MAX);
        Time(self.0.saturating_add(nanos))
    }
}

impl Sub<Duration> for Time {
    type Output = Time;

    fn sub(self, span: Duration) -> Time {
        let nanos = u64::try_from(span.as_nanos()).unwrap_or(u64::MAX);
        Time(self.0.saturating_sub(nanos))
    }
}
