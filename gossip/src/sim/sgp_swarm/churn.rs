//! Joins, leaves and crashes in a simulated SGP swarm, and how the swarm hears of them.

use std::time::Duration;

use rand::RngExt;
use rand::rngs::Xoshiro256PlusPlus;

use crate::sgp::{SgpInput, SgpPeer};
use crate::sim::error::SimError;
use crate::sim::queue::Lane;
use crate::sim::scenario::{ChurnEvent, Scenario, Workload};

use super::{Change, Event, SgpSwarm, SimPeer, Status, random_vector};

impl SgpSwarm {
    pub(super) fn on_churn(&mut self, index: usize) -> Result<(), SimError> {
        let Some(event) = self.churn.get(index).cloned() else {
            return Ok(());
        };
        let detect = Duration::from_secs_f64(self.scenario.link.detect_ms * 1e-3);
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
                let gradient = vec![0.0; target.len()];
                self.peers.push(SimPeer {
                    machine: Some(machine),
                    status: Status::Live,
                    slowdown: 1.0,
                    sign_flip_scale: None,
                    armed: None,
                    target,
                    gradient,
                });
                self.network.add_peer();
                self.live.insert(id);
                let at = self.now + detect;
                let change = Change::Joined;
                self.queue.push(
                    at,
                    Lane::Normal,
                    Event::Announce {
                        subject: id,
                        change,
                    },
                );
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
                let at = self.now + detect;
                let change = Change::Left;
                self.queue.push(
                    at,
                    Lane::Normal,
                    Event::Announce {
                        subject: id,
                        change,
                    },
                );
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
                let at = self.now + detect;
                let change = Change::Crashed;
                self.queue.push(
                    at,
                    Lane::Normal,
                    Event::Announce {
                        subject: id,
                        change,
                    },
                );
            }
        }
        Ok(())
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

/// The scenario's explicit churn plus its random churn, drawn from `rng`.
pub(super) fn expand_churn(scenario: &Scenario, rng: &mut Xoshiro256PlusPlus) -> Vec<ChurnEvent> {
    let mut churn = scenario.churn.clone();
    if let Some(random) = &scenario.random_churn {
        let when = |rng: &mut Xoshiro256PlusPlus| {
            if random.to_ms > random.from_ms {
                rng.random_range(random.from_ms..random.to_ms)
            } else {
                random.from_ms
            }
        };
        // Distinct victims: a partial Fisher–Yates shuffle of the founders.
        let mut founders: Vec<u32> = (0..scenario.peers as u32).collect();
        let victims = random.leaves + random.crashes;
        for i in 0..victims {
            let j = rng.random_range(i..founders.len());
            founders.swap(i, j);
        }
        for (i, &peer) in founders[..victims].iter().enumerate() {
            let at_ms = when(rng);
            churn.push(if i < random.leaves {
                ChurnEvent::Leave { at_ms, peer }
            } else {
                ChurnEvent::Crash { at_ms, peer }
            });
        }
        for _ in 0..random.joins {
            let at_ms = when(rng);
            churn.push(ChurnEvent::Join { at_ms });
        }
    }
    churn.sort_by(|a, b| a.at_ms().total_cmp(&b.at_ms()));
    churn
}
