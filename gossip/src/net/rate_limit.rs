//! Caps on a peer's upload and download rates (the volunteer's bandwidth limits).
//!
//! One limiter per direction is shared by every tensor stream. It is a token bucket that
//! may go into debt: a write of `n` bytes takes `n` tokens at once and, if the bucket is
//! then below zero, waits until the refill has paid the debt back. Over any span the bytes
//! moved are at most `rate · span + burst`, and no wait is longer than `n / rate` plus the
//! debt already owed — finite for every frame, since frames are bounded. The download side
//! waits after a read, which stops the reading, which lets QUIC's flow control slow the
//! sender down: nothing is buffered beyond the stream's window.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bytes the bucket holds when full: a tenth of a second at the capped rate, at least
/// 64 KiB, so that small messages pass without waiting.
fn burst(rate: u64) -> f64 {
    (rate as f64 / 10.0).max(64.0 * 1024.0)
}

/// A shared cap of `rate` bytes per second.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    rate: u64,
    bucket: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    refilled: Instant,
}

impl RateLimiter {
    /// A limiter of `rate` bytes per second; `None` for 0 (no cap).
    pub(crate) fn new(rate: u64) -> Option<RateLimiter> {
        (rate > 0).then(|| RateLimiter {
            rate,
            bucket: Mutex::new(Bucket {
                tokens: burst(rate),
                refilled: Instant::now(),
            }),
        })
    }

    /// Takes `bytes` and says how long to wait before using them.
    fn charge(&self, bytes: u64, now: Instant) -> Duration {
        let rate = self.rate as f64;
        let Ok(mut bucket) = self.bucket.lock() else {
            return Duration::ZERO;
        };
        let elapsed = now.saturating_duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(burst(self.rate));
        bucket.refilled = now;
        bucket.tokens -= bytes as f64;
        if bucket.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-bucket.tokens / rate)
        }
    }

    /// Waits until `bytes` more are within the cap.
    pub(crate) async fn take(&self, bytes: u64) {
        let wait = self.charge(bytes, Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_cap_means_no_limiter() {
        assert!(RateLimiter::new(0).is_none());
    }

    #[test]
    fn a_burst_passes_then_the_rate_holds() {
        let limiter = RateLimiter::new(1_000_000).expect("a cap");
        let t0 = Instant::now();
        // The bucket starts full (100 kB at 1 MB/s).
        assert_eq!(limiter.charge(100_000, t0), Duration::ZERO);
        // The next 500 kB owe half a second.
        let wait = limiter.charge(500_000, t0);
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-6, "{wait:?}");
        // Half a second later the debt is paid; 100 kB more owe 0.1 s.
        let later = t0 + Duration::from_millis(500);
        let wait = limiter.charge(100_000, later);
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
    }

    #[test]
    fn over_a_long_span_the_bytes_stay_under_rate_times_span_plus_burst() {
        let rate = 2_000_000u64;
        let limiter = RateLimiter::new(rate).expect("a cap");
        let t0 = Instant::now();
        let mut now = t0;
        let mut sent = 0u64;
        // A sender that always goes as soon as it is allowed, 1 MB frames, 200 frames.
        for _ in 0..200 {
            now += limiter.charge(1_000_000, now);
            sent += 1_000_000;
        }
        let span = now.duration_since(t0).as_secs_f64();
        let allowed = rate as f64 * span + burst(rate) + 1_000_000.0;
        assert!(sent as f64 <= allowed, "{sent} bytes in {span} s");
        assert!(
            sent as f64 >= rate as f64 * span,
            "the cap is not stricter than asked"
        );
    }
}
