//! [`StatusBoard`]: what `/status` and `murmur status` show, kept up to date by the run loop.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use murmur_gossip::net::{BootstrapDial, DialResult, NetMetricsSnapshot, PeerBandwidth};
use murmur_protocol::identity::PeerId;
use murmur_protocol::message::{AveragingMode, HeartbeatBody};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::averaging::RoundSummary;
use super::stragglers::{StepTrack, StragglerReading};

/// Rounds kept for `/status`, newest first.
pub(crate) const LAST_ROUNDS: usize = 16;
/// Peers kept for `/status`; heartbeats from further peers are not listed (the metrics and
/// the run loop still see them).
pub(crate) const MAX_LISTED_PEERS: usize = 1024;

/// Who this daemon is, fixed for its lifetime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StatusIdentity {
    /// This peer's id.
    pub(crate) peer_id: String,
    /// The swarm's name or id.
    pub(crate) swarm: String,
    /// The averaging mode (`sgp`, `butterfly`, `local-sgd`, `sync-ring`).
    pub(crate) mode: String,
    /// The tensor codec of averaging messages.
    pub(crate) codec: String,
    /// Where the model's passes run: `cpu` or `cuda:N` (`training.device`, resolved).
    pub(crate) device: String,
}

/// The document `/status` serves. Floats that are not finite (a diverged loss) are `null`,
/// which JSON can represent and NaN it cannot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StatusReport {
    /// This peer's id.
    pub(crate) peer_id: String,
    /// The swarm's name or id.
    pub(crate) swarm: String,
    /// The averaging mode.
    pub(crate) mode: String,
    /// The tensor codec of averaging messages.
    pub(crate) codec: String,
    /// Where the model's passes run: `cpu` or `cuda:N`.
    pub(crate) device: String,
    /// Optimizer step this peer is at.
    pub(crate) step: u64,
    /// Samples trained on since the daemon started.
    pub(crate) samples: u64,
    /// Training loss of the last step; `null` before the first or when not finite.
    pub(crate) loss: Option<f64>,
    /// Loss of the last evaluation; `null` before the first or when not finite.
    pub(crate) eval_loss: Option<f64>,
    /// Recent training throughput.
    pub(crate) samples_per_s: f64,
    /// Whether training is paused (`POST /pause`).
    pub(crate) paused: bool,
    /// Seconds since the daemon started.
    pub(crate) uptime_s: f64,
    /// Tensor bytes sent, all peers.
    pub(crate) bytes_sent: u64,
    /// Tensor bytes received, all peers.
    pub(crate) bytes_received: u64,
    /// Peers heard from, in peer-id order.
    pub(crate) peers: Vec<PeerStatus>,
    /// Each bootstrap address (`net.bootstrap`) and what dialing it gave, in the config's
    /// order. Absent from older daemons' documents.
    #[serde(default)]
    pub(crate) bootstrap: Vec<BootstrapStatus>,
    /// What AutoNAT found: `public` (members dialed this peer back), `private` (they
    /// could not: reached through relays and hole punches) or `unknown`. Absent from
    /// older daemons' documents.
    #[serde(default = "unknown")]
    pub(crate) reachability: String,
    /// Open connections by kind. Absent from older daemons' documents.
    #[serde(default)]
    pub(crate) connections: ConnectionsStatus,
    /// The last averaging rounds, newest first, at most [`LAST_ROUNDS`].
    pub(crate) last_rounds: Vec<RoundStatus>,
}

fn unknown() -> String {
    "unknown".to_owned()
}

/// Open connections by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ConnectionsStatus {
    /// Dialed or accepted directly.
    pub(crate) direct: u64,
    /// Made direct by a hole punch (DCUtR) from a relayed connection.
    pub(crate) hole_punched: u64,
    /// Through a relay.
    pub(crate) relayed: u64,
}

/// One peer, as its last heartbeat and this peer's measurements describe it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct PeerStatus {
    /// The peer's id.
    pub(crate) peer_id: String,
    /// The step its last heartbeat announced.
    pub(crate) last_heartbeat_step: u64,
    /// Seconds since that heartbeat arrived.
    pub(crate) heartbeat_age_s: f64,
    /// The throughput its last heartbeat announced.
    pub(crate) samples_per_s: f64,
    /// The upload bandwidth it announced, bytes per second.
    pub(crate) reported_upload_bytes_per_s: u64,
    /// The download bandwidth it announced, bytes per second.
    pub(crate) reported_download_bytes_per_s: u64,
    /// The rate this peer measured sending to it; `null` until a large transfer completed.
    pub(crate) measured_upload_bytes_per_s: Option<f64>,
    /// The rate this peer measured receiving from it; `null` until a large transfer completed.
    pub(crate) measured_download_bytes_per_s: Option<f64>,
}

/// One bootstrap address and its dials.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct BootstrapStatus {
    /// The address, as configured.
    pub(crate) address: String,
    /// Dials made to it.
    pub(crate) attempts: u64,
    /// Dials that failed in a row, up to the last one.
    pub(crate) failures_in_a_row: u64,
    /// The peer the last dial reached; `null` if it failed or none finished yet.
    pub(crate) reached: Option<String>,
    /// Why the last dial failed; `null` if it reached a peer or none finished yet.
    pub(crate) error: Option<String>,
}

impl From<BootstrapDial> for BootstrapStatus {
    fn from(dial: BootstrapDial) -> Self {
        let (reached, error) = match dial.last {
            Some(DialResult::Connected { peer }) => (Some(peer), None),
            Some(DialResult::Failed { reason }) => (None, Some(reason)),
            None => (None, None),
        };
        BootstrapStatus {
            address: dial.address,
            attempts: dial.attempts,
            failures_in_a_row: dial.failures_in_a_row,
            reached,
            error,
        }
    }
}

/// One finished averaging round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RoundStatus {
    /// The averaging mode it ran in.
    pub(crate) mode: String,
    /// `complete`, `partial` or `failed`.
    pub(crate) outcome: String,
    /// Seconds from its start until its result was applied.
    pub(crate) duration_s: f64,
    /// Fraction of the vector averaged with at least one other peer.
    pub(crate) coverage: f64,
    /// Peers whose contribution entered it, this one included.
    pub(crate) group_size: u32,
    /// The peer pushed to (SGP).
    pub(crate) out_peer: Option<String>,
    /// Members dropped for not sending in time.
    pub(crate) stragglers_dropped: u32,
    /// Parts whose reducer did not answer in time.
    pub(crate) parts_timed_out: u32,
    /// Seconds since it finished.
    pub(crate) age_s: f64,
}

#[derive(Debug)]
struct BoardState {
    identity: StatusIdentity,
    step: u64,
    samples: u64,
    loss: Option<f64>,
    eval_loss: Option<f64>,
    samples_per_s: f64,
    peers: BTreeMap<PeerId, HeardPeer>,
    rounds: VecDeque<(RoundSummary, Instant)>,
    /// Whether step rates are tracked: in SGP, where heartbeats announce local steps.
    sgp: bool,
    /// This peer's own steps, for its step rate (SGP).
    own_steps: StepTrack,
}

#[derive(Debug, Clone)]
struct HeardPeer {
    body: HeartbeatBody,
    at: Instant,
    /// The steps its SGP heartbeats announced.
    steps: StepTrack,
}

/// The daemon's live status and its paused flag. Cheap to clone; every clone is the same
/// board. Updates take a short lock, once per step or round, never per chunk.
#[derive(Debug, Clone)]
pub(crate) struct StatusBoard {
    state: Arc<Mutex<BoardState>>,
    paused: Arc<watch::Sender<bool>>,
    started: Instant,
}

impl StatusBoard {
    /// A board for the daemon `identity`, not paused, started now.
    pub(crate) fn new(identity: StatusIdentity) -> StatusBoard {
        let sgp = identity.mode == AveragingMode::Sgp.name();
        StatusBoard {
            state: Arc::new(Mutex::new(BoardState {
                identity,
                step: 0,
                samples: 0,
                loss: None,
                eval_loss: None,
                samples_per_s: 0.0,
                peers: BTreeMap::new(),
                rounds: VecDeque::with_capacity(LAST_ROUNDS),
                sgp,
                own_steps: StepTrack::default(),
            })),
            paused: Arc::new(watch::Sender::new(false)),
            started: Instant::now(),
        }
    }

    /// One optimizer step done: at `step`, `samples_total` samples trained on since start.
    pub(crate) fn record_step(&self, step: u64, samples_total: u64, loss: f64, samples_per_s: f64) {
        self.record_step_at(step, samples_total, loss, samples_per_s, Instant::now());
    }

    /// [`StatusBoard::record_step`], with the time it happened.
    pub(crate) fn record_step_at(
        &self,
        step: u64,
        samples_total: u64,
        loss: f64,
        samples_per_s: f64,
        at: Instant,
    ) {
        let mut s = self.lock();
        if s.sgp {
            s.own_steps.note(at, step);
        }
        s.step = step;
        s.samples = samples_total;
        s.loss = finite(loss);
        s.samples_per_s = finite(samples_per_s).unwrap_or(0.0);
    }

    /// The evaluation that just finished.
    pub(crate) fn set_eval_loss(&self, loss: f64) {
        self.lock().eval_loss = finite(loss);
    }

    /// A verified heartbeat from `peer` arrived.
    pub(crate) fn record_heartbeat(&self, peer: PeerId, body: &HeartbeatBody) {
        self.record_heartbeat_at(peer, body, Instant::now());
    }

    /// [`StatusBoard::record_heartbeat`], with the time it arrived.
    pub(crate) fn record_heartbeat_at(&self, peer: PeerId, body: &HeartbeatBody, at: Instant) {
        let mut s = self.lock();
        let track = s.sgp && body.mode == AveragingMode::Sgp;
        if !s.peers.contains_key(&peer) && s.peers.len() >= MAX_LISTED_PEERS {
            return;
        }
        let heard = s.peers.entry(peer).or_insert_with(|| HeardPeer {
            body: *body,
            at,
            steps: StepTrack::default(),
        });
        heard.body = *body;
        heard.at = at;
        if track {
            heard.steps.note(at, body.step);
        }
    }

    /// `peer` left (disconnected or rejected): stop listing it.
    pub(crate) fn forget_peer(&self, peer: &PeerId) {
        self.lock().peers.remove(peer);
    }

    /// An averaging round finished; the oldest of [`LAST_ROUNDS`] is dropped.
    pub(crate) fn record_round(&self, round: &RoundSummary) {
        let mut s = self.lock();
        if s.rounds.len() == LAST_ROUNDS {
            s.rounds.pop_front();
        }
        s.rounds.push_back((*round, Instant::now()));
    }

    /// Who this daemon is.
    pub(crate) fn identity(&self) -> StatusIdentity {
        self.lock().identity.clone()
    }

    /// What the step rates of this peer and the peers it hears say about stragglers, at
    /// `now`; `None` outside SGP and until both rates are known (see
    /// [`super::stragglers`]).
    pub(crate) fn stragglers(&self, now: Instant) -> Option<StragglerReading> {
        let s = self.lock();
        if !s.sgp {
            return None;
        }
        let peers: Vec<f64> = s
            .peers
            .values()
            .filter_map(|p| p.steps.heard_rate())
            .collect();
        StragglerReading::from_rates(s.own_steps.own_rate(now), &peers)
    }

    /// Whether training should be paused now.
    pub(crate) fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// Pauses (`true`) or resumes training; returns whether that changed anything.
    pub(crate) fn set_paused(&self, paused: bool) -> bool {
        self.paused.send_replace(paused) != paused
    }

    /// A receiver that wakes when the paused flag changes, for a run loop that waits while
    /// paused instead of polling.
    pub(crate) fn paused_watch(&self) -> watch::Receiver<bool> {
        self.paused.subscribe()
    }

    /// The status now. `net`, `bandwidth` and `bootstrap` are the network layer's
    /// counters, estimates and bootstrap dials, when it is attached.
    pub(crate) fn report(
        &self,
        net: Option<NetMetricsSnapshot>,
        bandwidth: &[(PeerId, PeerBandwidth)],
        bootstrap: Vec<BootstrapDial>,
    ) -> StatusReport {
        let now = Instant::now();
        let paused = self.is_paused();
        let s = self.lock();
        let measured = |peer: &PeerId| {
            bandwidth
                .iter()
                .find(|(p, _)| p == peer)
                .map(|(_, b)| *b)
                .unwrap_or_default()
        };
        let peers = s
            .peers
            .iter()
            .map(|(peer, heard)| {
                let bandwidth = measured(peer);
                PeerStatus {
                    peer_id: peer.to_string(),
                    last_heartbeat_step: heard.body.step,
                    heartbeat_age_s: now.duration_since(heard.at).as_secs_f64(),
                    samples_per_s: finite(f64::from(heard.body.samples_per_s)).unwrap_or(0.0),
                    reported_upload_bytes_per_s: heard.body.upload_bytes_per_s,
                    reported_download_bytes_per_s: heard.body.download_bytes_per_s,
                    measured_upload_bytes_per_s: bandwidth.upload_bytes_per_s.and_then(finite),
                    measured_download_bytes_per_s: bandwidth.download_bytes_per_s.and_then(finite),
                }
            })
            .collect();
        let last_rounds = s
            .rounds
            .iter()
            .rev()
            .map(|(round, at)| RoundStatus {
                mode: round.mode.name().to_owned(),
                outcome: round.outcome.name().to_owned(),
                duration_s: round.duration.as_secs_f64(),
                coverage: round.clamped_coverage(),
                group_size: round.group_size,
                out_peer: round.out_peer.map(|p| p.to_string()),
                stragglers_dropped: round.stragglers_dropped,
                parts_timed_out: round.parts_timed_out,
                age_s: now.duration_since(*at).as_secs_f64(),
            })
            .collect();
        let net = net.unwrap_or_default();
        StatusReport {
            peer_id: s.identity.peer_id.clone(),
            swarm: s.identity.swarm.clone(),
            mode: s.identity.mode.clone(),
            codec: s.identity.codec.clone(),
            device: s.identity.device.clone(),
            step: s.step,
            samples: s.samples,
            loss: s.loss,
            eval_loss: s.eval_loss,
            samples_per_s: s.samples_per_s,
            paused,
            uptime_s: now.duration_since(self.started).as_secs_f64(),
            bytes_sent: net.tensor_bytes_sent,
            bytes_received: net.tensor_bytes_received,
            peers,
            bootstrap: bootstrap.into_iter().map(BootstrapStatus::from).collect(),
            reachability: net.reachability.name().to_owned(),
            connections: ConnectionsStatus {
                direct: net.connections.direct,
                hole_punched: net.connections.hole_punched,
                relayed: net.connections.relayed,
            },
            last_rounds,
        }
    }

    fn lock(&self) -> MutexGuard<'_, BoardState> {
        // The board stays readable even if an updater panicked mid-update.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
