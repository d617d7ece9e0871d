//! Joins, leaves, crashes and restarts in a simulated ring swarm.

use crate::sim::error::SimError;
use crate::sim::learner;
use crate::sim::queue::Lane;
use crate::sim::scenario::ChurnEvent;
use crate::sim::training_run::crashable;

use super::{Event, Peer, RingSwarm, Status};

impl RingSwarm {
    pub(super) fn on_churn(&mut self, event: ChurnEvent) -> Result<(), SimError> {
        match event {
            ChurnEvent::Join { .. } => {
                let id = self.peers.len() as u32;
                let mut peer = Peer::new(learner::joiner(&self.run.scenario, &mut self.run.rng));
                peer.status = Status::Syncing;
                self.peers.push(peer);
                self.run.network.add_peer();
                self.download(id);
            }
            ChurnEvent::Leave { peer: id, .. } => {
                if let Some(peer) = self.peers.get_mut(id as usize)
                    && peer.status == Status::Live
                {
                    peer.status = Status::Leaving;
                }
            }
            ChurnEvent::Crash { peer: id, .. } => {
                let now = self.run.now;
                let Some(peer) = crashable(&mut self.peers, id) else {
                    return Ok(());
                };
                peer.status = Status::Gone;
                peer.crashed_at = Some(now);
                peer.machine = None;
                let at = now + self.run.detect();
                self.run
                    .queue
                    .push(at, Lane::Normal, Event::CrashNoticed { subject: id });
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

    /// Starts joiner `id`'s download of the parameters from a live peer chosen at random.
    fn download(&mut self, id: u32) {
        if let Some(own) = self.run.download(id, &self.peers) {
            // Nobody to download from: the joiner trains alone from its own parameters.
            self.peers[id as usize].learner.adopt(&own);
            self.begin_training(id);
        }
    }

    pub(super) fn on_synced(&mut self, id: u32, source: u32) -> Result<(), SimError> {
        if self.peers[id as usize].status != Status::Syncing {
            return Ok(());
        }
        let Some(params) = self.parameters(source).map(<[f32]>::to_vec) else {
            // The source died mid-download: start over from another peer.
            self.download(id);
            return Ok(());
        };
        self.peers[id as usize].learner.adopt(&params);
        self.begin_training(id);
        Ok(())
    }

    /// Joiner `id` waits for the next step boundary: it joins the membership and starts
    /// computing the step after the latest one any peer is on when the first peer does.
    fn begin_training(&mut self, id: u32) {
        let latest = (0..self.peers.len() as u32)
            .filter(|p| !self.parked.contains(p))
            .filter_map(|p| self.step(p))
            .max();
        let peer = &mut self.peers[id as usize];
        peer.status = Status::Live;
        match latest {
            Some(latest) => {
                peer.step = latest + 1;
                self.parked.push(id);
            }
            None => {
                self.members.insert(id);
                self.start_step(id);
            }
        }
    }
}
