//! The engine of `averaging.mode = "none"`: each peer trains alone on its own samples.
//!
//! This is the control every quality claim is measured against: the same peers, the same
//! data and the same steps, with nothing averaged. The peer still heartbeats and keeps its
//! membership view, so the swarm sees it and `/status` lists its peers, but it sends no
//! parcel and drops any that arrives.

use std::collections::VecDeque;

use crate::{PeerKey, Time};

use super::membership::{Beat, Change, Membership};
use super::{
    Engine, EngineError, EngineEvent, EngineInput, EngineOutput, EngineStatus, Work, WorkDone,
};

/// The solo engine. See the [module docs](self).
#[derive(Debug)]
pub struct SoloEngine<P> {
    membership: Membership<P>,
    /// The parameters; with the trainer during a step (empty meanwhile).
    params: Vec<f32>,
    /// The buffer lent with each step for its gradient (its update is not needed here).
    update: Vec<f32>,
    len: usize,
    /// Local steps taken, this run's and those before it.
    steps: u64,
    batch_size: u64,
    working: bool,
    finishing: bool,
    finished: bool,
    outputs: VecDeque<EngineOutput<P>>,
    silent: Vec<P>,
}

impl<P: PeerKey> SoloEngine<P> {
    /// The engine of `membership.me()`, holding `params`, after `steps` local steps;
    /// `batch_size` samples make one step.
    pub fn new(
        membership: Membership<P>,
        params: Vec<f32>,
        steps: u64,
        batch_size: u64,
    ) -> SoloEngine<P> {
        let mut engine = SoloEngine {
            membership,
            len: params.len(),
            update: vec![0.0; params.len()],
            params,
            steps,
            batch_size,
            working: false,
            finishing: false,
            finished: false,
            outputs: VecDeque::new(),
            silent: Vec::new(),
        };
        engine.start_step();
        engine
    }

    fn beat(&self) -> Beat {
        Beat {
            step: self.steps,
            ..self.membership.own()
        }
    }

    fn start_step(&mut self) {
        if self.finishing || self.working {
            return;
        }
        self.working = true;
        self.outputs.push_back(EngineOutput::Work(Work::Step {
            params: std::mem::take(&mut self.params),
            update: std::mem::take(&mut self.update),
            step: self.steps,
            // Alone: the swarm's batch is this peer's.
            swarm_batch: self.batch_size,
        }));
    }

    fn on_work_done(&mut self, done: WorkDone) -> Result<(), EngineError> {
        let (params, update) = done.into_stepped(self.len)?;
        self.params = params;
        self.update = update;
        self.working = false;
        self.steps += 1;
        let beat = self.beat();
        self.membership.set_own(beat);
        self.start_step();
        Ok(())
    }

    fn on_tick(&mut self, now: Time) {
        if self.membership.beat_due(now) {
            let beat = self.beat();
            self.membership.set_own(beat);
            self.outputs.push_back(EngineOutput::Heartbeat(beat));
        }
        let mut silent = std::mem::take(&mut self.silent);
        self.membership.silent(now, &mut silent);
        for peer in silent.drain(..) {
            self.outputs.push_back(EngineOutput::Disconnect(peer));
            self.gone(peer);
        }
        self.silent = silent;
    }

    fn gone(&mut self, peer: P) {
        self.outputs
            .push_back(EngineOutput::Event(EngineEvent::PeerGone {
                peer,
                remaining: self.membership.len(),
            }));
    }

    /// Once no step is in flight: the final parameters, and nothing to hand off.
    fn maybe_leave(&mut self) {
        if !self.finishing || self.finished || self.working {
            return;
        }
        self.finished = true;
        self.outputs
            .push_back(EngineOutput::Finished(std::mem::take(&mut self.params)));
        self.outputs.push_back(EngineOutput::Departed);
    }
}

impl<P: PeerKey> Engine<P> for SoloEngine<P> {
    fn handle(&mut self, now: Time, input: EngineInput<P>) -> Result<(), EngineError> {
        match input {
            EngineInput::WorkDone(done) => self.on_work_done(done)?,
            EngineInput::Parcel { from, parcel } => {
                // Nothing is averaged: a parcel is only a sign of life.
                self.membership.heard_from(&from, now);
                self.outputs
                    .push_back(EngineOutput::Recycle(parcel.into_payload()));
            }
            EngineInput::Sent { parcel, .. } => {
                self.outputs
                    .push_back(EngineOutput::Recycle(parcel.into_payload()));
            }
            EngineInput::Member(event) => {
                if let Some(Change::Left(peer)) = self.membership.note(now, event) {
                    self.gone(peer);
                }
            }
            EngineInput::Tick => self.on_tick(now),
            EngineInput::Finish => self.finishing = true,
        }
        self.maybe_leave();
        Ok(())
    }

    fn poll_output(&mut self) -> Option<EngineOutput<P>> {
        self.outputs.pop_front()
    }

    fn poll_timeout(&self) -> Option<Time> {
        Some(self.membership.poll_timeout())
    }

    fn membership(&self) -> &Membership<P> {
        &self.membership
    }

    fn status(&self) -> EngineStatus {
        EngineStatus {
            step: self.steps,
            peers: self.membership.len(),
            ..EngineStatus::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::engine::MemberEvent;

    const SECOND: Duration = Duration::from_secs(1);

    fn step_done(params: Vec<f32>) -> EngineInput<u32> {
        EngineInput::WorkDone(WorkDone::Stepped {
            update: vec![0.0; params.len()],
            params,
            samples: 8,
            took: Duration::from_millis(5),
        })
    }

    /// Every output queued now, in order.
    fn drain(engine: &mut SoloEngine<u32>) -> Vec<EngineOutput<u32>> {
        std::iter::from_fn(|| engine.poll_output()).collect()
    }

    #[test]
    fn a_solo_peer_steps_on_its_own_parameters_and_sends_nothing() {
        let mut membership = Membership::new(0u32, SECOND, Time::ZERO);
        membership.note(Time::ZERO, MemberEvent::Admitted(1));
        let mut engine = SoloEngine::new(membership, vec![1.0; 4], 10, 8);
        for step in 10..13u64 {
            let outputs = drain(&mut engine);
            let params = match outputs.as_slice() {
                [
                    EngineOutput::Work(Work::Step {
                        params,
                        step: s,
                        swarm_batch,
                        ..
                    }),
                ] => {
                    assert_eq!(
                        (*s, *swarm_batch),
                        (step, 8),
                        "alone, its batch is the swarm's"
                    );
                    params.clone()
                }
                other => panic!("expected one step, got {other:?}"),
            };
            // The trainer's update is all that moves the parameters.
            let stepped: Vec<f32> = params.iter().map(|p| p - 0.5).collect();
            engine.handle(Time::ZERO, step_done(stepped)).unwrap();
        }
        // A heartbeat is due at the first tick.
        engine
            .handle(Time::ZERO + SECOND, EngineInput::Tick)
            .unwrap();
        let outputs = drain(&mut engine);
        assert!(
            outputs
                .iter()
                .all(|o| matches!(o, EngineOutput::Heartbeat(_) | EngineOutput::Work(_))),
            "{outputs:?}"
        );
        assert!(
            outputs
                .iter()
                .any(|o| matches!(o, EngineOutput::Heartbeat(b) if b.step == 13))
        );
        assert_eq!(engine.status().step, 13);
        assert_eq!(engine.status().peers, 1);

        // Finishing waits for the step in flight, then hands back its result.
        engine
            .handle(Time::ZERO + SECOND, EngineInput::Finish)
            .unwrap();
        assert!(
            drain(&mut engine).is_empty(),
            "nothing before the step returns"
        );
        engine
            .handle(Time::ZERO + SECOND, step_done(vec![-1.0; 4]))
            .unwrap();
        match drain(&mut engine).as_slice() {
            [EngineOutput::Finished(params), EngineOutput::Departed] => {
                assert_eq!(params, &vec![-1.0; 4]);
            }
            other => panic!("expected the final parameters and departure, got {other:?}"),
        }
    }
}
