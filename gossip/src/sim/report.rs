//! What a simulated run reports: one record per round and a summary.

use std::fmt;
use std::io::{self, Write};

use serde::Serialize;

use crate::Time;

use super::metrics::Agreement;

/// The state of the swarm at the end of one round.
///
/// Errors are relative to the *initial disagreement* `D₀`, the root mean square over the
/// founding peers of `‖x_i(0) − x̄(0)‖₂`: an error of 1e-6 means the peers are a million
/// times closer than they started, whatever the values' offset or scale.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoundRecord {
    /// Round index (round `r` ends at `r · compute.step_ms`).
    pub round: u64,
    /// Virtual time at the end of the round, in seconds.
    pub time_s: f64,
    /// Peers alive and holding mass.
    pub live_peers: usize,
    /// `max_i ‖z_i − ȳ‖₂ / D₀` over live peers, where `ȳ = Σ x_i / Σ w_i` is the average
    /// of the mass the live peers hold: how far the peers are from agreeing.
    pub consensus_error: f64,
    /// `max_i ‖z_i − x̄(0)‖₂ / D₀`: how far the peers are from the founding peers'
    /// initial average (the exact answer of a fault-free consensus run).
    pub average_error: f64,
    /// `Σ w_i` over live peers plus the weight of shares in flight.
    pub total_weight: f64,
    /// Smallest weight of a live peer that holds mass.
    pub min_weight: f64,
    /// Local steps completed so far, all peers together.
    pub steps: u64,
    /// Training samples processed so far.
    pub samples: u64,
    /// Bytes put on the wire so far.
    pub bytes_sent: u64,
}

impl RoundRecord {
    /// The record of `round` at `now`: the measured peers' `agreement`, the swarm's
    /// `total_weight` (held and in flight) and its `work` so far.
    pub(crate) fn new(
        round: u64,
        now: Time,
        agreement: &Agreement,
        total_weight: f64,
        work: Work,
    ) -> RoundRecord {
        RoundRecord {
            round,
            time_s: now.as_secs_f64(),
            live_peers: agreement.peers,
            consensus_error: agreement.consensus_error,
            average_error: agreement.reference_error,
            total_weight,
            min_weight: agreement.min_weight,
            steps: work.steps,
            samples: work.samples,
            bytes_sent: work.bytes_sent,
        }
    }
}

/// What a swarm has done by the time of a record, all peers together.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Work {
    /// Local steps completed.
    pub(crate) steps: u64,
    /// Training samples processed.
    pub(crate) samples: u64,
    /// Bytes put on the wire.
    pub(crate) bytes_sent: u64,
}

/// Totals of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimSummary {
    /// Scenario name.
    pub name: String,
    /// Algorithm name.
    pub algorithm: String,
    /// Peers at the start.
    pub peers_start: usize,
    /// Peers alive at the end.
    pub peers_end: usize,
    /// Rounds simulated.
    pub rounds: u64,
    /// Virtual time simulated, in seconds.
    pub virtual_secs: f64,
    /// Training samples per virtual second, all peers together.
    pub samples_per_sec: f64,
    /// Consensus error at the end (see [`RoundRecord::consensus_error`]).
    pub final_consensus_error: f64,
    /// Error against the initial average at the end (see [`RoundRecord::average_error`]).
    pub final_average_error: f64,
    /// Total weight at the start.
    pub initial_total_weight: f64,
    /// Total weight at the end.
    pub final_total_weight: f64,
    /// Weight lost with crashed peers, restarted ones included (a restart loses what the
    /// peer held, and what comes back to the process it replaced).
    pub crashed_weight: f64,
    /// Weight of shares dropped as malformed, or returned or refused to a sender that could
    /// not take them back.
    pub dropped_weight: f64,
    /// Bytes put on the wire.
    pub bytes_sent: u64,
    /// Messages sent.
    pub messages: u64,
    /// Events the simulator processed.
    pub events: u64,
    /// How the averaging rounds of a synchronous training mode went (butterfly and
    /// sync-ring); absent for SGP and the cost models.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub averaging: Option<AveragingSummary>,
    /// What became of the SGP shares refused for a stale reference; absent for the other
    /// modes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_refusals: Option<ShareRefusals>,
}

/// What became of the quantized SGP shares their receivers refused because they did not
/// hold the edge reference the share was built on (the receiver restarted, or dropped the
/// edge): swarm-wide counts, like the daemon's `murmur_averaging_share_refusals_total`.
///
/// Each refusal travels back to the share's sender as a notice; `refused` counts those
/// sent, so `refused − taken_back − lost` are still on their way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ShareRefusals {
    /// Shares refused by their receiver, each answered with a notice to its sender.
    pub refused: u64,
    /// Refused shares whose sender took the mass back.
    pub taken_back: u64,
    /// Refused shares whose mass is lost: a later share on the edge had replaced the
    /// reference it needs, or the sender had crashed, departed or restarted meanwhile.
    pub lost: u64,
}

/// How the averaging rounds of a synchronous training mode went, counted per member: a
/// round of 16 members counts 16 times.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AveragingSummary {
    /// Member-rounds that ended with an averaged result.
    pub rounds_averaged: u64,
    /// Member-rounds that ended with the member's local values: no group formed
    /// (butterfly), or the ring missed its deadline (sync-ring).
    pub rounds_local: u64,
    /// Mean members per averaged round.
    pub mean_group_size: f64,
    /// Mean fraction of the vector averaged over at least two members, per averaged round.
    pub mean_fraction_averaged: f64,
    /// Mean time from a member's round start to its result, in seconds.
    pub mean_round_secs: f64,
    /// Chunks or segments the state machines refused (late, duplicate, or for a round that
    /// was over).
    pub chunks_refused: u64,
}

/// Everything a run reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimReport {
    /// Totals.
    pub summary: SimSummary,
    /// One record every `record_every` rounds, round 0 included.
    pub rounds: Vec<RoundRecord>,
}

impl SimReport {
    /// Writes the per-round records as CSV with a header line.
    pub fn write_csv(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "round,time_s,live_peers,consensus_error,average_error,total_weight,min_weight,steps,samples,bytes_sent"
        )?;
        for r in &self.rounds {
            writeln!(
                out,
                "{},{},{},{:e},{:e},{},{},{},{},{}",
                r.round,
                r.time_s,
                r.live_peers,
                r.consensus_error,
                r.average_error,
                r.total_weight,
                r.min_weight,
                r.steps,
                r.samples,
                r.bytes_sent
            )?;
        }
        Ok(())
    }

    /// The whole report as JSON.
    pub fn to_json(&self) -> String {
        // Serializing plain numbers and strings cannot fail; non-finite floats become null.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

impl fmt::Display for SimSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows: [(&str, String); 14] = [
            ("scenario", self.name.clone()),
            ("algorithm", self.algorithm.clone()),
            (
                "peers (start → end)",
                format!("{} → {}", self.peers_start, self.peers_end),
            ),
            ("rounds", self.rounds.to_string()),
            ("virtual time", format!("{:.3} s", self.virtual_secs)),
            ("samples/s", format!("{:.1}", self.samples_per_sec)),
            (
                "consensus error",
                format!("{:.3e}", self.final_consensus_error),
            ),
            (
                "error vs initial average",
                format!("{:.3e}", self.final_average_error),
            ),
            (
                "total weight (start → end)",
                format!(
                    "{:.9} → {:.9}",
                    self.initial_total_weight, self.final_total_weight
                ),
            ),
            (
                "weight lost (crash/restart)",
                format!("{:.6}", self.crashed_weight),
            ),
            ("weight dropped", format!("{:.6}", self.dropped_weight)),
            ("bytes sent", self.bytes_sent.to_string()),
            ("messages", self.messages.to_string()),
            ("events", self.events.to_string()),
        ];
        for (label, value) in rows {
            writeln!(f, "{label:<28} {value}")?;
        }
        if let Some(refusals) = &self.share_refusals {
            let value = format!(
                "{} ({} taken back, {} lost)",
                refusals.refused, refusals.taken_back, refusals.lost
            );
            writeln!(f, "{:<28} {value}", "shares refused")?;
        }
        if let Some(averaging) = &self.averaging {
            let rows: [(&str, String); 5] = [
                (
                    "member-rounds (avg / local)",
                    format!("{} / {}", averaging.rounds_averaged, averaging.rounds_local),
                ),
                (
                    "mean group size",
                    format!("{:.2}", averaging.mean_group_size),
                ),
                (
                    "mean fraction averaged",
                    format!("{:.4}", averaging.mean_fraction_averaged),
                ),
                (
                    "mean round time",
                    format!("{:.2} ms", averaging.mean_round_secs * 1e3),
                ),
                ("chunks refused", averaging.chunks_refused.to_string()),
            ];
            for (label, value) in rows {
                writeln!(f, "{label:<28} {value}")?;
            }
        }
        Ok(())
    }
}

/// Counts what the averaging rounds of a training run achieved, for [`AveragingSummary`].
#[derive(Debug, Clone, Default)]
pub(crate) struct AveragingTally {
    averaged: u64,
    local: u64,
    members: u64,
    fraction: f64,
    secs: f64,
    refused: u64,
}

impl AveragingTally {
    /// A member's round ended averaged over `members` members, with `fraction` of the
    /// vector averaged over at least two, `secs` after it began.
    pub(crate) fn averaged(&mut self, members: usize, fraction: f64, secs: f64) {
        self.averaged += 1;
        self.members += members as u64;
        self.fraction += fraction;
        self.secs += secs;
    }

    /// A member's round ended with its local values.
    pub(crate) fn local(&mut self) {
        self.local += 1;
    }

    /// A state machine refused a chunk.
    pub(crate) fn refused(&mut self) {
        self.refused += 1;
    }

    pub(crate) fn summary(&self) -> AveragingSummary {
        let per_round = |total: f64| {
            if self.averaged > 0 {
                total / self.averaged as f64
            } else {
                0.0
            }
        };
        AveragingSummary {
            rounds_averaged: self.averaged,
            rounds_local: self.local,
            mean_group_size: per_round(self.members as f64),
            mean_fraction_averaged: per_round(self.fraction),
            mean_round_secs: per_round(self.secs),
            chunks_refused: self.refused,
        }
    }
}
