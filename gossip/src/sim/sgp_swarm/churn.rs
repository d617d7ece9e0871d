//! Joins, leaves, crashes and restarts in a simulated SGP swarm, and how the swarm hears of
//! them.

use std::time::Duration;

use crate::sgp::{SgpInput, SgpPeer};
use crate::sim::error::SimError;
use crate::sim::learner::random_vector;
use crate::sim::queue::Lane;
use crate::sim::scenario::{ChurnEvent, Workload};

use super::{Change, Event, SgpSwarm, SimPeer, Status};

impl SgpSwarm {
    pub(super) fn on_churn(&mut self, index: usize) -> Result<(), SimError> {
        let Some(event) = self.churn.get(index).cloned() else {
            return Ok(());
        };
        match event {
            ChurnEvent::Join { .. } => {
                let id = self.peers.len() as u32;
                let len = self.scenario.vector_len;
                let machine = SgpPeer::joining(
                    id,
                    self.live.members().iter().copied(),
                    len,
                    self.config.clone(),
                )?;
                let target = match self.scenario.workload {
                    Workload::Consensus => Vec::new(),
                    Workload::Quadratic { .. } => random_vector(&mut self.rng, &self.scenario, len),
                };
                self.peers.push(SimPeer::live(machine, target));
                self.network.add_peer();
                self.live.insert(id);
                self.announce_later(id, Change::Joined);
            }
            ChurnEvent::Leave { peer: id, .. } => {
                let Some(peer) = self.peers.get_mut(id as usize) else {
                    return Ok(());
                };
                if peer.status != Status::Live {
                    return Ok(());
                }
                peer.status = Status::Leaving;
                self.live.remove(id);
                self.feed(id, SgpInput::Leave)?;
                self.announce_later(id, Change::Left);
            }
            ChurnEvent::Crash { peer: id, .. } => {
                let Some(peer) = self.peers.get_mut(id as usize) else {
                    return Ok(());
                };
                let Some(machine) = peer.machine.take() else {
                    return Ok(());
                };
                self.crashed_weight += machine.state().weight();
                peer.status = Status::Gone;
                self.live.remove(id);
                self.announce_later(id, Change::Crashed);
            }
            ChurnEvent::Restart { peer: id, .. } => self.restart(id)?,
        }
        Ok(())
    }

    /// Peer `id` crashes and is back at once under the same index, holding nothing, like a
    /// joiner; nobody is told. Messages in flight to it reach the new process, and reports
    /// meant for the old one (the delivery of a share it sent, the end of its step) find
    /// a peer of another incarnation and are dropped.
    fn restart(&mut self, id: u32) -> Result<(), SimError> {
        let Some(peer) = self.peers.get_mut(id as usize) else {
            return Ok(());
        };
        if peer.status != Status::Live {
            return Ok(());
        }
        let Some(old) = peer.machine.take() else {
            return Ok(());
        };
        self.crashed_weight += old.state().weight();
        let members = self.live.members().iter().copied();
        let machine = SgpPeer::joining(id, members, self.scenario.vector_len, self.config.clone())?;
        peer.machine = Some(machine);
        peer.incarnation += 1;
        // The old process's timer is not the new one's.
        peer.armed = None;
        self.pump(id)
    }

    /// The swarm hears of `subject`'s `change` once it notices, `link.detect_ms` from now.
    fn announce_later(&mut self, subject: u32, change: Change) {
        let at = self.now + Duration::from_secs_f64(self.scenario.link.detect_ms * 1e-3);
        let event = Event::Announce { subject, change };
        self.queue.push(at, Lane::Normal, event);
    }

    pub(super) fn announce(&mut self, subject: u32, change: Change) -> Result<(), SimError> {
        let input = match change {
            Change::Joined => SgpInput::PeerJoined(subject),
            Change::Left => SgpInput::PeerLeft(subject),
            Change::Crashed => SgpInput::PeerCrashed(subject),
        };
        for id in 0..self.peers.len() as u32 {
            if id != subject && self.peers[id as usize].machine.is_some() {
                self.feed(id, input)?;
            }
        }
        Ok(())
    }
}
