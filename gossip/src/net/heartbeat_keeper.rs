//! Heartbeats that keep going while the averaging engine holds its driver.
//!
//! The driver publishes the engine's heartbeats on the engine's timer. A long engine call
//! (a round's reduction of a 64M-element vector, say) holds the driver for seconds, and
//! without a heartbeat for 1.6 intervals the other peers give this one up, though it is
//! alive and about to answer. The keeper, a task of its own, republishes the latest
//! heartbeat (freshly stamped) whenever the driver has published none for
//! [`LATE_AFTER`] intervals; while the driver keeps time it publishes nothing. It needs a
//! runtime with a worker thread free while the driver's is busy: `murmur run` has two.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use murmur_protocol::message::AveragingMode;
use tokio::sync::watch;

use crate::engine::Beat;

use super::NetHandle;
use super::driver::{EngineClock, publish_heartbeat};

/// Intervals without a heartbeat from the driver after which the keeper sends one: late
/// enough not to double the driver's own, early enough (with the check every eighth of an
/// interval, by 1.225 intervals) to land well before peers give this one up at 1.6.
const LATE_AFTER: f64 = 1.1;

/// The driver's side of the keeper: tells it each heartbeat the driver published.
#[derive(Debug)]
pub(crate) struct HeartbeatKeeper {
    latest: watch::Sender<Option<Beat>>,
    published_ms: Arc<AtomicU64>,
    clock: EngineClock,
}

impl HeartbeatKeeper {
    /// Starts the keeper task; it stops when this is dropped.
    pub(crate) fn spawn(
        net: NetHandle,
        clock: EngineClock,
        mode: AveragingMode,
        interval: Duration,
    ) -> HeartbeatKeeper {
        let (latest, beats) = watch::channel(None);
        let published_ms = Arc::new(AtomicU64::new(0));
        tokio::spawn(keep(
            net,
            clock,
            mode,
            interval,
            beats,
            Arc::clone(&published_ms),
        ));
        HeartbeatKeeper {
            latest,
            published_ms,
            clock,
        }
    }

    /// The driver published `beat` just now.
    pub(crate) fn published(&self, beat: Beat) {
        self.published_ms
            .store(self.clock.now().as_millis(), Ordering::Relaxed);
        self.latest.send_replace(Some(beat));
    }
}

async fn keep(
    net: NetHandle,
    clock: EngineClock,
    mode: AveragingMode,
    interval: Duration,
    beats: watch::Receiver<Option<Beat>>,
    published_ms: Arc<AtomicU64>,
) {
    let late_ms = (interval.as_secs_f64() * 1000.0 * LATE_AFTER) as u64;
    let mut check = tokio::time::interval((interval / 8).max(Duration::from_millis(1)));
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        check.tick().await;
        if beats.has_changed().is_err() {
            // The driver is gone.
            return;
        }
        let Some(beat) = *beats.borrow() else {
            continue;
        };
        let now_ms = clock.now().as_millis();
        let last = published_ms.load(Ordering::Relaxed);
        if now_ms.saturating_sub(last) >= late_ms {
            published_ms.store(now_ms, Ordering::Relaxed);
            tracing::debug!(
                silent_ms = now_ms.saturating_sub(last),
                "the driver is held: heartbeat sent by the keeper"
            );
            publish_heartbeat(&net, &clock, mode, beat);
        }
    }
}
