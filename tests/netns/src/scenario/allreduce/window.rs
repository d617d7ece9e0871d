//! `quic-window`: the butterfly's bus bandwidth with QUIC's default receive window (10 MB per
//! stream, 15 MB per connection) and with a small one.
//!
//! A QUIC write returns once the bytes are in the connection's send buffer, and a receiver
//! grants as much credit as its window. With the default window a whole part of a 16 MiB
//! vector is "sent" at once, long before it is on the wire. With a window of
//! [`SMALL_WINDOW`] a write waits until the receiver has read nearly everything before it.
//! The cost of a small window is the rate of one stream: at most about a window per round
//! trip (125 kB over 20 ms is 50 Mbit/s), so the links here are 20 Mbit/s, where that cap
//! does not bind and the peers' CPU is not the limit.

use super::efficiency::{CasePlan, EfficiencyReport, run_cases};
use crate::scenario::ScenarioOptions;

/// The small QUIC receive window compared with the default, bytes.
const SMALL_WINDOW: u32 = 125_000;
/// The links' rate, bits per second.
const RATE: u64 = 20_000_000;

/// `quic-window`: N = 4 and 8, a 16 MiB vector in f32 and in int8, 20 Mbit/s links and
/// 20 ms round trips, 4 rounds with each of the default window and a 125 kB one, for each
/// codec. A benchmark without a bar: it passes
/// when every round averages the whole vector. `--long` runs each case three times.
pub fn quic_window(options: &ScenarioOptions) -> anyhow::Result<EfficiencyReport> {
    let repeats = if options.long { 3 } else { 1 };
    let mut cases = Vec::new();
    for peers in [4, 8] {
        for _ in 0..repeats {
            for codec in ["f32", "int8:64"] {
                let default = CasePlan::new(peers, RATE, codec, None).sized(4 << 20, 4);
                let small = default.window(SMALL_WINDOW);
                cases.push(default);
                cases.push(small);
            }
        }
    }
    run_cases(options, "quic-window", &cases, false)
}
