//! `stage-offloads`: what the harness's delay stage costs, and what that leaves of the
//! machine, with and without TUN segment offloads.
//!
//! Without offloads the kernel hands the stage every packet at the links' MTU, one read and
//! one write each; with them it hands over the super-packets the senders' GSO built (up to
//! 64 KiB), so the same bytes take far fewer system calls and copies in the stage, and the
//! packets stay whole through the router to the receiver. On a machine of few cores the
//! stage competes with the peers it carries, so what it costs shows in how close plain TCP
//! and the butterfly come to the links' rate. Both versions run the same cases, each on a
//! harness without offloads and then on one with them: plain TCP through the harness, then
//! butterfly rounds of a 16 MiB f32 vector, N = 4 and 8, 200 Mbit/s links, 20 ms round
//! trips. A benchmark without a bar: it passes when every round averages the whole vector.

use super::efficiency::{CasePlan, EfficiencyReport, run_cases};
use crate::scenario::ScenarioOptions;

/// The links' rate, bits per second: the butterfly-efficiency bars' rate.
const RATE: u64 = 200_000_000;

/// `stage-offloads`: the cases above; `--long` adds N = 8 and runs more rounds.
pub fn stage_offloads(options: &ScenarioOptions) -> anyhow::Result<EfficiencyReport> {
    let (sizes, rounds): (&[usize], u32) = if options.long {
        (&[4, 8], 5)
    } else {
        (&[4], 3)
    };
    let mut cases = Vec::new();
    for &peers in sizes {
        let with = CasePlan::new(peers, RATE, "f32", None).sized(4 << 20, rounds);
        cases.push(with.without_offloads());
        cases.push(with);
    }
    run_cases(options, "stage-offloads", &cases, true)
}
