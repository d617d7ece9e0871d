//! Butterfly: when a round is nearly gathered. Two judgements made from the members'
//! heartbeats: which members a gathering leader still counts on, and whether a round short
//! of `target_batch` should begin anyway.

use std::time::Duration;

use crate::{PeerKey, Time};

use super::membership::{Beat, Membership};
use super::rounds::QUIET_INTERVALS;

/// A member whose heartbeat says it is taking a step towards this round announces again
/// when the step ends; silent for this many of its steps it is not counted on (it crashed,
/// or it joins the next round with what it gathered).
const MISSED_STEPS: u32 = 3;
/// Nobody misses a step sooner than this: gossip relays heartbeats with some jitter.
const MISSED_FLOOR: Duration = Duration::from_millis(300);

/// What a peer knows of the swarm's gathering towards its round.
pub(crate) struct Gathering<'a, P> {
    pub(crate) membership: &'a Membership<P>,
    /// This peer's round.
    pub(crate) round: u64,
    pub(crate) now: Time,
    /// This peer's samples per step.
    pub(crate) batch_size: u64,
    /// How long this peer's last round took, from its start to its update applied.
    pub(crate) round_took: Duration,
    /// Whether members step, and announce each step, while they gather and average
    /// (`averaging.butterfly.overlap`, a swarm-wide setting): only then does a silent
    /// member say it has crashed. Without overlap a member waiting for its group or its
    /// round says nothing between heartbeats.
    pub(crate) steps_announced: bool,
}

impl<P: PeerKey> Gathering<'_, P> {
    /// Whether `peer`, whose last heartbeat `beat` says it trains towards this round (at a
    /// known rate; looking for a group or not), has been silent for
    /// [`MISSED_STEPS`] of its steps, at least [`MISSED_FLOOR`]: with `overlap` a peer steps
    /// while it gathers, looks for a group and averages, and announces at the end of every
    /// step, so it has most likely crashed. Its step's length is taken as this peer's
    /// `batch_size` at its reported rate. One whose heartbeat says it is at the round before
    /// may be finishing that round (having begun it with nothing gathered, it says nothing
    /// until its update is applied), so it is given this peer's last round's length on
    /// top. A peer that has stopped
    /// stepping (it is finishing) reports no rate and is never judged so. A crashed member
    /// would otherwise hold a gathering leader, the followers of a crashed leader, or a
    /// running round for [`QUIET_INTERVALS`] heartbeat intervals, several steps of training
    /// that then go into one update; one that is merely slow joins the next round.
    pub(crate) fn missed_a_step(&self, peer: &P, beat: &Beat) -> bool {
        let in_round_before = beat.step + 1 == self.round;
        if !self.steps_announced
            || (beat.step != self.round && !in_round_before)
            || beat.samples_per_s <= 0.0
        {
            return false;
        }
        let step = self.batch_size as f64 / f64::from(beat.samples_per_s);
        let mut limit = Duration::try_from_secs_f64(step * f64::from(MISSED_STEPS))
            .unwrap_or(Duration::MAX)
            .max(MISSED_FLOOR);
        if in_round_before {
            limit = limit.saturating_add(self.round_took);
        }
        self.membership
            .quiet_for(peer, self.now)
            .is_some_and(|quiet| quiet > limit)
    }

    /// Short of `target` with `gathered` samples: whether the round is nearer its target
    /// now than a step later. That is asked only once every member near this round (heard
    /// within [`QUIET_INTERVALS`], at this round or the one before, not looking at a later
    /// one) has reported samples towards it: their next steps then add about `batch_size`
    /// each, and the round begins now when that would overshoot the target by as much as it
    /// falls short or more. Without it a swarm one member short of `target_batch / batch_size`
    /// (five peers of batch 16 and a target of 96, after a crash) waits for a second step
    /// from everyone, holds 160 samples a round, and takes half the updates.
    pub(crate) fn nearer_now(&self, gathered: u64, target: u64) -> bool {
        let round = self.round;
        let mut near: u64 = 1;
        for (peer, beat) in self.membership.heard() {
            if !self.membership.fresh(&peer, self.now, QUIET_INTERVALS)
                || self.missed_a_step(&peer, beat)
                || beat.looking.is_some_and(|l| l.round > round)
            {
                continue;
            }
            if beat.step + 1 == round || (beat.step == round && beat.samples_accumulated == 0) {
                // Its step towards this round is still to come.
                return false;
            }
            if beat.step == round {
                near += 1;
            }
        }
        let next_step = self.batch_size.saturating_mul(near);
        // Short by `target − gathered` now; over by `gathered + next_step − target` later. A
        // tie begins now: as near the target either way, and an update every step instead
        // of every second one (two of six members down, say: 64 samples of 96 now or 128).
        gathered.saturating_mul(2).saturating_add(next_step) >= target.saturating_mul(2)
    }
}
