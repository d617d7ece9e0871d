//! Joins, leaves and crashes in a simulated ring swarm.

use rand::RngExt;

use crate::sim::error::SimError;
use crate::sim::learner;
use crate::sim::queue::Lane;
use crate::sim::scenario::ChurnEvent;

use super::{Event, Peer, RingSwarm, Status};

/// Bytes per parameter in a state download (`f32`).
const PARAM_BYTES: usize = 4;

impl RingSwarm {
    pub(super) fn on_churn(&mut self, index: usize) -> Result<(), SimError> {
        let Some(event) = self.run.churn.get(index).cloned() else {
            return Ok(());
        };
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
                let Some(peer) = self.peers.get_mut(id as usize) else {
                    return Ok(());
                };
                if peer.status == Status::Gone {
                    return Ok(());
                }
                peer.status = Status::Gone;
                peer.crashed_at = Some(now);
                peer.machine = None;
                let at = now + self.run.detect();
                self.run
                    .queue
                    .push(at, Lane::Normal, Event::CrashNoticed { subject: id });
            }
        }
        Ok(())
    }

    /// Starts joiner `id`'s download of the parameters from a live peer chosen at random.
    fn download(&mut self, id: u32) {
        let sources: Vec<u32> = (0..self.peers.len() as u32)
            .filter(|&p| p != id && self.peers[p as usize].status == Status::Live)
            .collect();
        if sources.is_empty() {
            let own = learner::random_vector(
                &mut self.run.rng,
                &self.run.scenario,
                self.run.scenario.vector_len,
            );
            self.peers[id as usize].learner.adopt(&own);
            self.begin_training(id);
            return;
        }
        let source = sources[self.run.rng.random_range(0..sources.len())];
        let bytes = self.run.scenario.vector_len * PARAM_BYTES;
        let departure = self
            .run
            .network
            .depart(self.run.now, source as usize, bytes);
        let event = Event::StateReach {
            peer: id,
            source,
            departure,
        };
        self.run.queue.push(departure.reaches, Lane::Normal, event);
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
