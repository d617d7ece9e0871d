//! Joins, leaves, crashes and restarts in a simulated butterfly swarm.

use crate::sim::error::SimError;
use crate::sim::learner;
use crate::sim::queue::Lane;
use crate::sim::scenario::ChurnEvent;
use crate::sim::training_run::crashable;

use super::{ButterflySwarm, Change, Event, Peer, Phase, Status};

impl ButterflySwarm {
    pub(super) fn on_churn(&mut self, event: ChurnEvent) -> Result<(), SimError> {
        match event {
            ChurnEvent::Join { .. } => {
                let id = self.peers.len() as u32;
                let learner = learner::joiner(&self.run.scenario, &mut self.run.rng);
                let peer = Peer::new(
                    id,
                    learner,
                    &self.run.scenario,
                    &self.training,
                    Status::Syncing,
                )?;
                self.peers.push(peer);
                self.run.network.add_peer();
                self.download(id);
            }
            ChurnEvent::Leave { peer: id, .. } => {
                let Some(peer) = self.peers.get_mut(id as usize) else {
                    return Ok(());
                };
                if peer.status == Status::Live {
                    peer.status = Status::Leaving;
                    self.maybe_depart(id)?;
                }
            }
            ChurnEvent::Crash { peer: id, .. } => {
                let now = self.run.now;
                let Some(peer) = crashable(&mut self.peers, id) else {
                    return Ok(());
                };
                let counted = peer.status != Status::Syncing;
                peer.status = Status::Gone;
                peer.crashed_at = Some(now);
                peer.rounds.clear();
                if counted {
                    let at = now + self.run.detect();
                    let change = Change::Gone;
                    let event = Event::Detected {
                        subject: id,
                        change,
                    };
                    self.run.queue.push(at, Lane::Normal, event);
                }
            }
            ChurnEvent::Restart { at_ms, peer: id } => {
                // Peers here are known by their place in the membership, not by a key they
                // keep: a restarted process starts over as a joiner, downloading the
                // parameters, while the swarm notices the crash as it would any other.
                if crashable(&mut self.peers, id).is_some() {
                    self.on_churn(ChurnEvent::Crash { at_ms, peer: id })?;
                    self.on_churn(ChurnEvent::Join { at_ms })?;
                }
            }
        }
        Ok(())
    }

    /// A leaving peer goes once it is not in the middle of a batch's averaging.
    pub(super) fn maybe_depart(&mut self, id: u32) -> Result<(), SimError> {
        let peer = &mut self.peers[id as usize];
        if peer.status != Status::Leaving
            || peer.phase != Phase::Training
            || !peer.rounds.is_empty()
        {
            return Ok(());
        }
        peer.status = Status::Gone;
        let at = self.run.now + self.run.detect();
        let event = Event::Detected {
            subject: id,
            change: Change::Gone,
        };
        self.run.queue.push(at, Lane::Normal, event);
        Ok(())
    }

    pub(super) fn on_detected(&mut self, subject: u32, change: Change) -> Result<(), SimError> {
        match change {
            Change::Joined => self.membership += 1,
            Change::Gone => {
                self.membership = self.membership.saturating_sub(1);
                self.peers[subject as usize].known_gone = true;
                self.member_lost(subject)?;
            }
        }
        Ok(())
    }

    /// Starts joiner `id`'s download of the parameters from a live peer chosen at random.
    fn download(&mut self, id: u32) {
        if let Some(own) = self.run.download(id, &self.peers) {
            // Nobody to download from: the joiner trains alone from its own parameters.
            self.peers[id as usize].learner.adopt(&own);
            self.begin_training(id, self.announced + 1);
        }
    }

    /// The download reached joiner `id`: it takes the parameters its source holds now and
    /// trains from the next batch that is not yet due. A source that is averaging has not
    /// applied the current batch's update yet, so the joiner starts one update behind and
    /// catches up in its first round.
    pub(super) fn on_synced(&mut self, id: u32, source: u32) -> Result<(), SimError> {
        if self.peers[id as usize].status != Status::Syncing {
            return Ok(());
        }
        if !self.peers[source as usize].status.trains() {
            // The source died mid-download: start over from another peer.
            self.download(id);
            return Ok(());
        }
        let (joiner, source) = pick_two(&mut self.peers, id as usize, source as usize);
        joiner.learner.adopt(source.learner.params());
        self.begin_training(id, self.announced + 1);
        let at = self.run.now + self.run.detect();
        let event = Event::Detected {
            subject: id,
            change: Change::Joined,
        };
        self.run.queue.push(at, Lane::Normal, event);
        Ok(())
    }

    fn begin_training(&mut self, id: u32, epoch: u64) {
        let peer = &mut self.peers[id as usize];
        peer.status = Status::Live;
        peer.phase = Phase::Training;
        peer.epoch = epoch;
        peer.heard_due = self.announced;
        self.start_step(id);
    }
}

/// Mutable access to two distinct peers.
fn pick_two(peers: &mut [Peer], a: usize, b: usize) -> (&mut Peer, &Peer) {
    if a < b {
        let (low, high) = peers.split_at_mut(b);
        (&mut low[a], &high[0])
    } else {
        let (low, high) = peers.split_at_mut(a);
        (&mut high[0], &low[b])
    }
}
