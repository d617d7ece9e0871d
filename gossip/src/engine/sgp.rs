//! The engine of `averaging.mode = "sgp"`: Stochastic Gradient Push ([`crate::sgp`]) with
//! the trainer in the loop.
//!
//! A step runs on the trainer at the de-biased parameters `z = x / w`: the numerator itself,
//! turned into `z` and lent ([`SgpPeer::lend_parameters`]), so that the peer holds its
//! parameters once through the step; they come back as the step left them, `x = w·z'`.
//! Shares go out as parcels; the transport's reports pace the steps or hand a share's mass
//! back, and the receiver's receipt settles it. Shares that arrive are folded in at once
//! and acknowledged; while the parameters are lent they are checked and acknowledged at
//! once and folded in when the step ends ([`crate::sgp`]'s `lent` module).

use std::collections::{HashMap, VecDeque};

use murmur_protocol::message::{PushSumShare, ShareCancel, ShareReceipt, ShareRefused};

use crate::parcel::Parcel;
use crate::sgp::{Replayed, SgpConfig, SgpError, SgpInput, SgpOutput, SgpPeer, ShareHeader};
use crate::{PeerKey, Time};

use super::membership::{Beat, Change, MemberEvent, Membership};
use super::sgp_pieces::{MAX_PIECES, PiecesIn, PiecesOut};
use super::{
    Engine, EngineError, EngineEvent, EngineInput, EngineOutput, EngineStatus, RefusalFate, Work,
    WorkDone,
};

/// The tag of notices (refusals, receipts, cancels); shares are tagged with their sequence
/// numbers, which never reach it.
const NOTICE_TAG: u64 = u64::MAX;

/// The SGP engine. See the [module docs](self).
#[derive(Debug)]
pub struct SgpEngine<P> {
    machine: SgpPeer<P>,
    membership: Membership<P>,
    len: usize,
    /// The buffer lent with each step, which comes back holding the step's `Δz`; with the
    /// trainer during a step (empty meanwhile).
    update: Vec<f32>,
    /// Steps taken before this run (a resumed or joining peer's schedule goes on from it).
    step_offset: u64,
    batch_size: u64,
    /// A step the machine allowed while the engine was finishing.
    working: bool,
    finishing: bool,
    finished: bool,
    departed: bool,
    /// When each share was sent, by sequence number.
    sent_at: HashMap<u64, Time>,
    /// The most payload bytes of a share in one parcel; larger shares go in pieces
    /// ([`super::sgp_pieces`]). 0: no bound.
    max_piece: usize,
    pieces_out: PiecesOut<P>,
    pieces_in: PiecesIn<P>,
    outputs: VecDeque<EngineOutput<P>>,
    silent: Vec<P>,
}

impl<P: PeerKey> SgpEngine<P> {
    /// The engine of `membership.me()`: a founder holding `params`, or a joiner (`None`)
    /// that starts with no mass and trains once the first share arrives. `step_offset`
    /// local steps were taken before; `batch_size` samples make one local step. A share
    /// whose payload is longer than `max_piece` bytes travels in pieces (0: never).
    pub fn new(
        membership: Membership<P>,
        params: Option<Vec<f32>>,
        len: usize,
        (step_offset, batch_size): (u64, u64),
        config: SgpConfig,
        max_piece: usize,
    ) -> Result<SgpEngine<P>, EngineError> {
        let me = membership.me();
        let members: Vec<P> = membership.peers().collect();
        let machine = match params {
            Some(params) => SgpPeer::new(me, members, params, config)?,
            None => SgpPeer::joining(me, members, len, config)?,
        };
        let mut engine = SgpEngine {
            machine,
            membership,
            len,
            update: vec![0.0; len],
            step_offset,
            batch_size,
            working: false,
            finishing: false,
            finished: false,
            departed: false,
            sent_at: HashMap::new(),
            max_piece,
            pieces_out: PiecesOut::default(),
            pieces_in: PiecesIn::default(),
            outputs: VecDeque::new(),
            silent: Vec::new(),
        };
        engine.drain(Time::ZERO)?;
        Ok(engine)
    }

    /// The SGP state machine, for tests and metrics.
    pub fn machine(&self) -> &SgpPeer<P> {
        &self.machine
    }

    fn beat(&self) -> Beat {
        Beat {
            step: self.step_offset + self.machine.steps_done(),
            ..self.membership.own()
        }
    }

    /// Acts on every output the machine has queued.
    fn drain(&mut self, now: Time) -> Result<(), EngineError> {
        while let Some(output) = self.machine.poll_output() {
            match output {
                SgpOutput::SendShare {
                    to,
                    header,
                    payload,
                } => {
                    let Ok(elements) = u32::try_from(self.len) else {
                        return Err(EngineError::LengthMismatch {
                            expected: u32::MAX as usize,
                            got: self.len,
                        });
                    };
                    self.sent_at.insert(header.seq, now);
                    self.send_share(to, header, elements, payload);
                }
                SgpOutput::Receipt { to, step, outcome } => {
                    let parcel = Parcel::ShareReceipt(ShareReceipt { step, outcome });
                    self.notice(to, parcel);
                }
                SgpOutput::Cancel { to, step } => {
                    self.notice(to, Parcel::ShareCancel(ShareCancel { step }));
                }
                SgpOutput::StartStep { step } => {
                    if !self.finishing {
                        self.start_step(step)?;
                    }
                }
                SgpOutput::Departed => {
                    if !self.departed {
                        self.departed = true;
                        self.outputs.push_back(EngineOutput::Departed);
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends a share in one parcel, or in pieces of at most `max_piece` bytes.
    fn send_share(&mut self, to: P, header: ShareHeader, elements: u32, payload: Vec<u8>) {
        if self.max_piece == 0 || payload.len() <= self.max_piece {
            let parcel = Parcel::Share(header.to_wire(elements), payload);
            self.outputs.push_back(EngineOutput::Send {
                to,
                tag: header.seq,
                parcel,
            });
            return;
        }
        // `config check` keeps shares within MAX_PIECES pieces of a frame; past that the
        // pieces grow (and a transport bounded by the frame limit refuses them).
        let size = self
            .max_piece
            .max(payload.len().div_ceil(MAX_PIECES as usize));
        self.pieces_out.sent(to, (header, elements), payload, size);
        self.cut_pieces(to);
    }

    /// Sends the pieces of shares to `to` that may go now ([`PiecesOut::cut`]).
    fn cut_pieces(&mut self, to: P) {
        let (machine, outputs) = (&mut self.machine, &mut self.outputs);
        self.pieces_out.cut(to, |seq, wire, bytes| {
            let mut piece = machine.spare_buffer();
            piece.extend_from_slice(bytes);
            outputs.push_back(EngineOutput::Send {
                to,
                tag: seq,
                parcel: Parcel::Share(wire, piece),
            });
        });
    }

    fn notice(&mut self, to: P, parcel: Parcel<P>) {
        self.outputs.push_back(EngineOutput::Send {
            to,
            tag: NOTICE_TAG,
            parcel,
        });
    }

    fn start_step(&mut self, step: u64) -> Result<(), EngineError> {
        let params = self.machine.lend_parameters()?;
        let peers = self.membership.len() as u64 + 1;
        self.working = true;
        self.outputs.push_back(EngineOutput::Work(Work::Step {
            params,
            update: std::mem::take(&mut self.update),
            step: self.step_offset + step,
            swarm_batch: self.batch_size * peers,
        }));
        Ok(())
    }

    fn on_work_done(&mut self, now: Time, done: WorkDone) -> Result<(), EngineError> {
        let (params, update) = done.into_stepped(self.len)?;
        self.working = false;
        self.update = update;
        // What the machine kept while the parameters were lent, and the fates it reports
        // as those of the inputs it handles at once are reported.
        for replayed in self.machine.return_parameters(now, params)? {
            let (peer, fate) = match replayed {
                Replayed::Cancelled(peer) => (peer, RefusalFate::Cancelled),
                Replayed::TakenBack(peer) => (peer, RefusalFate::TakenBack),
                Replayed::Lost(peer) => (peer, RefusalFate::Lost),
            };
            self.event(EngineEvent::Refusal { peer, fate });
        }
        self.machine.handle(now, SgpInput::LocalStepDone)?;
        let beat = self.beat();
        self.membership.set_own(beat);
        Ok(())
    }

    /// Once no step is in flight: the final parameters, then the hand-off. A joiner asked
    /// to stop before its first share holds no mass, so it has no parameters to give and
    /// nothing to hand off: it departs without [`EngineOutput::Finished`].
    fn maybe_leave(&mut self, now: Time) -> Result<(), EngineError> {
        if !self.finishing || self.finished || self.working {
            return Ok(());
        }
        self.finished = true;
        // No step follows: the update buffer goes before the hand-off is made, and the final
        // parameters are computed from the hand-off once the numerator is gone, so that the
        // peer holds two vectors of the model's size while it leaves, not four.
        self.update = Vec::new();
        if let Some(z) = self.machine.leave_with_parameters(now)? {
            self.outputs.push_back(EngineOutput::Finished(z));
        }
        Ok(())
    }

    fn on_parcel(&mut self, now: Time, from: P, parcel: Parcel<P>) -> Result<(), EngineError> {
        match parcel {
            Parcel::Share(share, payload) => {
                if share.elements as usize != self.len {
                    self.bad(from, "a share of the wrong shape".to_owned());
                } else if share.chunk_count == 1 {
                    self.take_share(now, from, &share, payload);
                    return Ok(());
                } else {
                    let machine = &mut self.machine;
                    let whole = self
                        .pieces_in
                        .piece(from, &share, &payload, self.len, || machine.spare_buffer());
                    match whole {
                        Ok(Some(whole)) => self.take_share(now, from, &share, whole),
                        Ok(None) => {}
                        Err(reason) => self.bad(from, reason),
                    }
                }
                self.machine.recycle(payload);
            }
            Parcel::ShareRefused(refused) => {
                let input = SgpInput::ShareRefused {
                    by: from,
                    step: refused.step,
                };
                // Kept while the parameters are lent; its fate is reported when they return.
                let kept = self.machine.parameters_lent();
                let fate = match self.machine.handle(now, input) {
                    Ok(()) => RefusalFate::TakenBack,
                    Err(_) => RefusalFate::Lost,
                };
                if !kept {
                    self.event(EngineEvent::Refusal { peer: from, fate });
                }
            }
            Parcel::ShareReceipt(receipt) => {
                let input = SgpInput::ReceiptReceived {
                    from,
                    step: receipt.step,
                    outcome: receipt.outcome,
                };
                let cancelled = self.machine.stats().shares_cancelled;
                let result = self.machine.handle(now, input);
                if self.machine.stats().shares_cancelled > cancelled {
                    self.event(EngineEvent::Refusal {
                        peer: from,
                        fate: RefusalFate::Cancelled,
                    });
                }
                if let Err(e) = result {
                    // A cancelled share this peer can no longer take back: lost.
                    self.bad(from, format!("receipt not acted on: {e}"));
                    self.event(EngineEvent::Refusal {
                        peer: from,
                        fate: RefusalFate::Lost,
                    });
                }
            }
            Parcel::ShareCancel(cancel) => {
                let input = SgpInput::CancelAsked {
                    from,
                    step: cancel.step,
                };
                self.machine.handle(now, input)?;
            }
            other => {
                // Chunks and group messages belong to the other modes.
                self.machine.recycle(other.into_payload());
            }
        }
        Ok(())
    }

    /// Takes a whole share `payload` from `from`, whose header (of any of its pieces) is
    /// `share`: folded in now, or, while the parameters are lent for a step, checked,
    /// acknowledged and kept until they come back.
    fn take_share(&mut self, now: Time, from: P, share: &PushSumShare<'_>, payload: Vec<u8>) {
        if !self.machine.parameters_lent() {
            self.fold_in(now, from, share, &payload);
            self.machine.recycle(payload);
            return;
        }
        let header = ShareHeader::from_wire(share, 0);
        if let Err((error, payload)) = self.machine.accept_while_lent(from, header, payload) {
            self.refuse(from, share.step, &error);
            self.machine.recycle(payload);
        }
    }

    /// Folds in a whole share `payload` from `from`, whose header (of any of its pieces) is
    /// `share`.
    fn fold_in(&mut self, now: Time, from: P, share: &PushSumShare<'_>, payload: &[u8]) {
        let header = ShareHeader::from_wire(share, 0);
        if header.reference.is_none() && share.weight > 0.0 {
            self.drift_against(payload, share.weight);
        }
        let input = SgpInput::ShareReceived {
            from,
            header,
            payload,
        };
        if let Err(e) = self.machine.handle(now, input) {
            self.refuse(from, share.step, &e);
        }
    }

    /// A share the machine would not take: logged, and its sender told when it can take
    /// the share back (a quantized share built on a reference this peer does not hold: it
    /// restarted since, or dropped that edge). The sender then takes the mass back and
    /// starts the edge again from zero, instead of losing half its mass on every share until the
    /// membership layer notices the restart.
    fn refuse(&mut self, from: P, step: u64, error: &SgpError) {
        if let SgpError::Cancelled { .. } = error {
            // Its sender asked for it back before it arrived, and has taken the mass back.
            return;
        }
        self.bad(from, format!("share refused: {error}"));
        let &SgpError::StaleReference {
            version: reference_step,
        } = error
        else {
            return;
        };
        self.event(EngineEvent::Refusal {
            peer: from,
            fate: RefusalFate::Refused,
        });
        let refusal = ShareRefused {
            step,
            reference_step,
        };
        self.notice(from, Parcel::ShareRefused(refusal));
    }

    /// Reports the relative distance between this peer's `z = x / w` and an exact (`f32`)
    /// share's `share / weight`. Quantized shares carry a deviation from a reference
    /// instead, and are not used.
    fn drift_against(&mut self, payload: &[u8], weight: f64) {
        let state = self.machine.state();
        if state.weight() <= 0.0 || payload.len() != state.numerator().len() * 4 {
            return;
        }
        let (mine, theirs) = (1.0 / state.weight(), 1.0 / weight);
        let (mut diff, mut norm) = (0f64, 0f64);
        for (&x, bytes) in state.numerator().iter().zip(payload.chunks_exact(4)) {
            let other =
                f64::from(f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])) * theirs;
            diff += (f64::from(x) * mine - other).powi(2);
            norm += other * other;
        }
        if norm > 0.0 {
            self.event(EngineEvent::Drift((diff / norm).sqrt()));
        }
    }

    fn on_sent(
        &mut self,
        now: Time,
        to: P,
        tag: u64,
        delivered: bool,
        parcel: Parcel<P>,
    ) -> Result<(), EngineError> {
        let Parcel::Share(share, payload) = parcel else {
            self.machine.recycle(parcel.into_payload());
            return Ok(());
        };
        if self.pieces_out.contains(tag) {
            self.machine.recycle(payload);
            let whole = self.pieces_out.reported(tag, delivered);
            // A piece less ahead for `to`: the next may be cut.
            self.cut_pieces(to);
            let Some(whole) = whole else {
                return Ok(());
            };
            let share = whole.header.to_wire(share.elements);
            return self.on_share_sent(now, (to, tag), whole.written, share, whole.payload);
        }
        self.on_share_sent(now, (to, tag), delivered, share, payload)
    }

    /// What became of a whole share `tag` to `to`: written, or given back by the transport.
    fn on_share_sent(
        &mut self,
        now: Time,
        (to, tag): (P, u64),
        delivered: bool,
        share: PushSumShare<'static>,
        payload: Vec<u8>,
    ) -> Result<(), EngineError> {
        let took = self
            .sent_at
            .remove(&tag)
            .map_or(std::time::Duration::ZERO, |at| now.saturating_since(at));
        self.event(EngineEvent::Share {
            to,
            delivered,
            took,
        });
        if delivered {
            // An exact share's payload is kept to take it back; any other is recycled. A
            // share cancelled meanwhile is taken back from it now.
            if self.machine.delivered(now, to, tag, payload).is_err() {
                self.event(EngineEvent::Refusal {
                    peer: to,
                    fate: RefusalFate::Lost,
                });
            }
        } else {
            let header = ShareHeader::from_wire(&share, tag);
            let taken_back = self.machine.handle(
                now,
                SgpInput::ShareReturned {
                    to,
                    header,
                    payload: &payload,
                    // A failed stream is not a departed peer: the membership says when its
                    // last connection closes.
                    receiver_gone: !self.membership.contains(&to),
                },
            );
            // A quantized share whose edge was forgotten meanwhile (its receiver was given
            // up as crashed) cannot be taken back: its mass is lost, as the mass in flight
            // to any crashed peer is, and training goes on.
            if taken_back.is_err() {
                self.event(EngineEvent::Refusal {
                    peer: to,
                    fate: RefusalFate::Lost,
                });
            }
            self.machine.recycle(payload);
        }
        Ok(())
    }

    fn on_member(&mut self, now: Time, event: MemberEvent<P>) -> Result<(), EngineError> {
        match self.membership.note(now, event) {
            Some(Change::Joined(peer)) => self.machine.handle(now, SgpInput::PeerJoined(peer))?,
            Some(Change::Left(peer)) => self.crashed(now, peer)?,
            None => {}
        }
        Ok(())
    }

    fn crashed(&mut self, now: Time, peer: P) -> Result<(), EngineError> {
        if let Some(incomplete) = self.pieces_in.forget(&peer) {
            self.machine.recycle(incomplete);
        }
        self.event(EngineEvent::PeerGone {
            peer,
            remaining: self.membership.len(),
        });
        self.machine.handle(now, SgpInput::PeerCrashed(peer))?;
        Ok(())
    }

    fn on_tick(&mut self, now: Time) -> Result<(), EngineError> {
        if self.membership.beat_due(now) {
            let beat = self.beat();
            self.membership.set_own(beat);
            self.outputs.push_back(EngineOutput::Heartbeat(beat));
        }
        let mut silent = std::mem::take(&mut self.silent);
        self.membership.silent(now, &mut silent);
        for peer in silent.drain(..) {
            self.outputs.push_back(EngineOutput::Disconnect(peer));
            // Its mass in flight is lost, as with a crash the network sees.
            self.crashed(now, peer)?;
        }
        self.silent = silent;
        if self.machine.poll_timeout().is_some_and(|t| t <= now) {
            self.machine.handle(now, SgpInput::Tick)?;
        }
        Ok(())
    }

    fn bad(&mut self, from: P, reason: String) {
        self.event(EngineEvent::BadParcel { from, reason });
    }

    fn event(&mut self, event: EngineEvent<P>) {
        self.outputs.push_back(EngineOutput::Event(event));
    }
}

impl<P: PeerKey> Engine<P> for SgpEngine<P> {
    fn handle(&mut self, now: Time, input: EngineInput<P>) -> Result<(), EngineError> {
        match input {
            EngineInput::WorkDone(done) => self.on_work_done(now, done)?,
            EngineInput::Parcel { from, parcel } => {
                self.membership.heard_from(&from, now);
                self.on_parcel(now, from, parcel)?
            }
            EngineInput::Sent {
                to,
                tag,
                delivered,
                parcel,
            } => self.on_sent(now, to, tag, delivered, parcel)?,
            EngineInput::Member(event) => self.on_member(now, event)?,
            EngineInput::Tick => self.on_tick(now)?,
            EngineInput::Finish => self.finishing = true,
        }
        self.maybe_leave(now)?;
        self.drain(now)
    }

    fn poll_output(&mut self) -> Option<EngineOutput<P>> {
        self.outputs.pop_front()
    }

    fn poll_timeout(&self) -> Option<Time> {
        let membership = self.membership.poll_timeout();
        Some(
            self.machine
                .poll_timeout()
                .map_or(membership, |t| t.min(membership)),
        )
    }

    fn membership(&self) -> &Membership<P> {
        &self.membership
    }

    fn status(&self) -> EngineStatus {
        let stats = self.machine.stats();
        EngineStatus {
            step: self.step_offset + self.machine.steps_done(),
            peers: self.membership.len(),
            push_sum_weight: Some(self.machine.held_weight()),
            shares_sent: stats.shares_sent,
            shares_received: stats.shares_received,
            shares_returned: stats.shares_returned,
            shares_held: stats.shares_held,
            edges_started: stats.edges_started,
            shares_unsettled: self.machine.unsettled() as u64,
            rounds: stats.shares_sent,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn engine(params: Option<Vec<f32>>) -> SgpEngine<u32> {
        let mut membership = Membership::new(0u32, SECOND, Time::ZERO);
        membership.note(Time::ZERO, MemberEvent::Admitted(1));
        SgpEngine::new(membership, params, 4, (0, 8), SgpConfig::default(), 0).expect("engine")
    }

    /// Every output queued now, in order.
    fn drain(engine: &mut SgpEngine<u32>) -> Vec<EngineOutput<u32>> {
        std::iter::from_fn(|| engine.poll_output()).collect()
    }

    #[test]
    fn a_joiner_stopped_before_its_first_share_departs_with_no_parameters() {
        let mut joiner = engine(None);
        assert!(drain(&mut joiner).is_empty(), "no mass: no step");
        joiner
            .handle(Time::ZERO + SECOND, EngineInput::Finish)
            .expect("a joiner with no mass stops cleanly");
        match drain(&mut joiner).as_slice() {
            [EngineOutput::Departed] => {}
            other => panic!("expected departure alone, got {other:?}"),
        }
    }

    #[test]
    fn a_founder_stopped_gives_its_parameters_and_hands_its_mass_off() {
        let mut founder = engine(Some(vec![1.0; 4]));
        let step = drain(&mut founder);
        assert!(
            matches!(step.as_slice(), [EngineOutput::Work(Work::Step { .. })]),
            "{step:?}"
        );
        founder
            .handle(Time::ZERO + SECOND, EngineInput::Finish)
            .expect("finish");
        assert!(drain(&mut founder).is_empty(), "the step in flight first");
        let done = WorkDone::Stepped {
            params: vec![0.5; 4],
            update: vec![-0.5; 4],
            samples: 8,
            took: Duration::from_millis(5),
        };
        founder
            .handle(Time::ZERO + SECOND, EngineInput::WorkDone(done))
            .expect("step done");
        let outputs = drain(&mut founder);
        assert!(
            matches!(outputs.first(), Some(EngineOutput::Finished(p)) if p == &vec![0.5; 4]),
            "{outputs:?}"
        );
        assert!(
            outputs.iter().any(|o| matches!(
                o,
                EngineOutput::Send {
                    to: 1,
                    parcel: Parcel::Share(..),
                    ..
                }
            )),
            "the mass goes to the successor: {outputs:?}"
        );
    }
}
