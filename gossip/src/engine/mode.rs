//! The training mode with its settings, and the engine it runs: the one place where a mode
//! is matched to its algorithm.

use std::time::Duration;

use murmur_protocol::codec::CodecSpec;
pub use murmur_protocol::message::AveragingMode;

use crate::butterfly::ButterflyConfig;
use crate::sgp::SgpConfig;
use crate::{PeerKey, Time};

use super::local_sgd::LocalSgdSettings;
use super::membership::Membership;
use super::rounds::{RoundEngine, RoundPolicy, RoundSettings};
use super::sgp::SgpEngine;
use super::solo::SoloEngine;
use super::{Engine, EngineError, EngineInput, EngineOutput, EngineStatus};

/// A training mode and the settings only it reads.
#[derive(Debug, Clone, PartialEq)]
pub enum ModeSettings {
    /// `sgp`: push-sum every step.
    Sgp(SgpConfig),
    /// `butterfly`: gradients averaged once the swarm reaches `target_batch` samples.
    Butterfly {
        /// Samples the swarm gathers before it averages.
        target_batch: u64,
        /// Matchmaking, chunks, timeouts and clipping.
        butterfly: ButterflyConfig,
    },
    /// `local-sgd`: H local steps, then the parameters averaged in a butterfly round and an
    /// outer step.
    LocalSgd {
        /// H and the outer optimizer.
        local: LocalSgdSettings,
        /// Matchmaking, chunks, timeouts and clipping.
        butterfly: ButterflyConfig,
    },
    /// `none`: each peer trains alone, the control averaging is measured against.
    Solo,
    /// `sync-ring`: gradients averaged every step in a ring over the whole swarm.
    SyncRing {
        /// The longest a ring round may take.
        timeout: Duration,
        /// Matchmaking, which forms the ring.
        butterfly: ButterflyConfig,
    },
}

impl ModeSettings {
    /// The mode's name.
    pub fn mode(&self) -> AveragingMode {
        match self {
            ModeSettings::Sgp(_) => AveragingMode::Sgp,
            ModeSettings::Butterfly { .. } => AveragingMode::Butterfly,
            ModeSettings::LocalSgd { .. } => AveragingMode::LocalSgd,
            ModeSettings::SyncRing { .. } => AveragingMode::SyncRing,
            ModeSettings::Solo => AveragingMode::Solo,
        }
    }

    /// The matchmaking, chunk and timeout settings of the modes that form groups.
    pub fn butterfly(&self) -> Option<&ButterflyConfig> {
        match self {
            ModeSettings::Butterfly { butterfly, .. }
            | ModeSettings::LocalSgd { butterfly, .. }
            | ModeSettings::SyncRing { butterfly, .. } => Some(butterfly),
            ModeSettings::Sgp(_) | ModeSettings::Solo => None,
        }
    }
}

/// What every engine is built from besides its mode.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSetup {
    /// The codec of every tensor on the wire.
    pub codec: CodecSpec,
    /// Carry each round's quantization error into the next (round modes; SGP keeps its own
    /// exact-mass scheme).
    pub error_feedback: bool,
    /// Size butterfly parts by each member's bandwidth; off, every part is equal
    /// ([`RoundSettings::size_parts_by_bandwidth`]).
    pub size_parts_by_bandwidth: bool,
    /// Samples in one local step's batch.
    pub batch_size: u64,
    /// Upload bandwidth this peer declares (bytes per second); 0 = none.
    pub upload_cap: u64,
    /// Whether other peers can open connections to this one.
    pub accepts_connections: bool,
    /// The wall clock at [`Time::ZERO`], in milliseconds since the Unix epoch.
    pub wall_ms_at_zero: u64,
    /// Seeds this peer's random choices (group ids).
    pub seed: u64,
    /// SGP: the most bytes of a share's payload in one parcel; a larger share travels in
    /// pieces. The daemon sets it from `net.max_frame_payload`; 0 sends every share whole.
    pub max_share_piece: usize,
}

/// Where a peer starts.
#[derive(Debug)]
pub struct Start {
    /// The parameters, or `None` for an SGP joiner that starts with no mass.
    pub params: Option<Vec<f32>>,
    /// The model's length.
    pub len: usize,
    /// The round (or SGP step) the swarm is at.
    pub round: u64,
    /// Local steps this peer took before.
    pub local_steps: u64,
}

/// The engine of whichever mode a peer runs.
#[derive(Debug)]
pub enum ModeEngine<P> {
    /// `sgp`.
    Sgp(Box<SgpEngine<P>>),
    /// `butterfly`, `local-sgd` and `sync-ring`.
    Rounds(Box<RoundEngine<P>>),
    /// `none`.
    Solo(Box<SoloEngine<P>>),
}

impl<P: PeerKey> ModeEngine<P> {
    /// The engine of `mode`, for `membership.me()`, starting at `start`.
    pub fn new(
        mode: &ModeSettings,
        setup: &EngineSetup,
        membership: Membership<P>,
        start: Start,
    ) -> Result<ModeEngine<P>, EngineError> {
        match mode {
            ModeSettings::Sgp(config) => {
                let config = SgpConfig {
                    share_codec: setup.codec,
                    ..config.clone()
                };
                let offset = start.round.max(start.local_steps);
                SgpEngine::new(
                    membership,
                    start.params,
                    start.len,
                    (offset, setup.batch_size),
                    config,
                    setup.max_share_piece,
                )
                .map(|e| ModeEngine::Sgp(Box::new(e)))
            }
            ModeSettings::Butterfly {
                target_batch,
                butterfly,
            } => round_engine(
                RoundPolicy::Butterfly {
                    target_batch: *target_batch,
                },
                butterfly,
                Duration::ZERO,
                setup,
                membership,
                start,
            ),
            ModeSettings::LocalSgd { local, butterfly } => round_engine(
                RoundPolicy::LocalSgd(*local),
                butterfly,
                Duration::ZERO,
                setup,
                membership,
                start,
            ),
            ModeSettings::SyncRing { timeout, butterfly } => round_engine(
                RoundPolicy::SyncRing,
                butterfly,
                *timeout,
                setup,
                membership,
                start,
            ),
            ModeSettings::Solo => {
                let params = start.params.unwrap_or_else(|| vec![0.0; start.len]);
                let steps = start.round.max(start.local_steps);
                Ok(ModeEngine::Solo(Box::new(SoloEngine::new(
                    membership,
                    params,
                    steps,
                    setup.batch_size,
                ))))
            }
        }
    }
}

/// The engine of a round mode.
fn round_engine<P: PeerKey>(
    policy: RoundPolicy,
    butterfly: &ButterflyConfig,
    ring_timeout: Duration,
    setup: &EngineSetup,
    membership: Membership<P>,
    start: Start,
) -> Result<ModeEngine<P>, EngineError> {
    let params = start.params.unwrap_or_else(|| vec![0.0; start.len]);
    let settings = RoundSettings {
        policy,
        codec: setup.codec,
        butterfly: butterfly.clone(),
        ring_timeout,
        error_feedback: setup.error_feedback,
        overlap: butterfly.overlap,
        size_parts_by_bandwidth: setup.size_parts_by_bandwidth,
        batch_size: setup.batch_size,
        upload_cap: setup.upload_cap,
        accepts_connections: setup.accepts_connections,
        wall_ms_at_zero: setup.wall_ms_at_zero,
        seed: setup.seed,
    };
    let engine = RoundEngine::new(membership, params, start.round, start.local_steps, settings)?;
    Ok(ModeEngine::Rounds(Box::new(engine)))
}

impl<P: PeerKey> Engine<P> for ModeEngine<P> {
    fn handle(&mut self, now: Time, input: EngineInput<P>) -> Result<(), EngineError> {
        match self {
            ModeEngine::Sgp(e) => e.handle(now, input),
            ModeEngine::Rounds(e) => e.handle(now, input),
            ModeEngine::Solo(e) => e.handle(now, input),
        }
    }

    fn poll_output(&mut self) -> Option<EngineOutput<P>> {
        match self {
            ModeEngine::Sgp(e) => e.poll_output(),
            ModeEngine::Rounds(e) => e.poll_output(),
            ModeEngine::Solo(e) => e.poll_output(),
        }
    }

    fn poll_timeout(&self) -> Option<Time> {
        match self {
            ModeEngine::Sgp(e) => e.poll_timeout(),
            ModeEngine::Rounds(e) => e.poll_timeout(),
            ModeEngine::Solo(e) => e.poll_timeout(),
        }
    }

    fn membership(&self) -> &Membership<P> {
        match self {
            ModeEngine::Sgp(e) => e.membership(),
            ModeEngine::Rounds(e) => e.membership(),
            ModeEngine::Solo(e) => e.membership(),
        }
    }

    fn status(&self) -> EngineStatus {
        match self {
            ModeEngine::Sgp(e) => e.status(),
            ModeEngine::Rounds(e) => e.status(),
            ModeEngine::Solo(e) => e.status(),
        }
    }

    fn set_measured_upload(&mut self, bytes_per_s: u64) {
        if let ModeEngine::Rounds(e) = self {
            e.set_measured_upload(bytes_per_s);
        }
    }

    fn set_unreachable(&mut self, unreachable: bool) {
        if let ModeEngine::Rounds(e) = self {
            e.set_unreachable(unreachable);
        }
    }
}
