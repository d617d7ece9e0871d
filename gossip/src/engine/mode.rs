//! The training mode with its settings, and the engine it runs: the one place where a mode
//! is matched to its algorithm.

use std::time::Duration;

use murmur_protocol::codec::CodecSpec;
pub use murmur_protocol::message::AveragingMode;

use crate::butterfly::{ButterflyConfig, Residuals, RoundBuffers};
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

    /// The memory this mode's rounds of a `len`-element vector work in, made now
    /// ([`RoundBuffers::resident`]) for [`Start::round_memory`], with an own part sized
    /// for groups of `target_group`, or of `peers` when fewer are expected. A ring reduces
    /// in its contribution's memory, so it is given only error feedback's residuals; SGP
    /// and `none` form no rounds: empty buffers.
    pub fn round_memory(
        &self,
        len: usize,
        setup: &EngineSetup,
        peers: usize,
    ) -> Result<RoundBuffers, EngineError> {
        let butterfly = match self {
            ModeSettings::Sgp(_) | ModeSettings::Solo => return Ok(RoundBuffers::default()),
            ModeSettings::SyncRing { .. } => {
                return Ok(RoundBuffers {
                    feedback: setup.error_feedback.then(|| Residuals::zeros(len)),
                    ..RoundBuffers::default()
                });
            }
            ModeSettings::Butterfly { butterfly, .. }
            | ModeSettings::LocalSgd { butterfly, .. } => butterfly,
        };
        let group = butterfly.target_group.min(peers).max(1);
        RoundBuffers::resident(
            len,
            len.div_ceil(group),
            butterfly.chunk_elements as usize,
            setup.codec,
            setup.error_feedback,
        )
        .map_err(|e| EngineError::Butterfly(e.into()))
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
    /// The round modes' memory, made before the peer met the swarm
    /// ([`RoundBuffers::resident`]); empty buffers are filled as the first round needs
    /// them. SGP and `none` leave it unused.
    pub round_memory: RoundBuffers,
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
    let engine = RoundEngine::new(
        membership,
        params,
        (start.round, start.local_steps),
        start.round_memory,
        settings,
    )?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(error_feedback: bool) -> EngineSetup {
        EngineSetup {
            codec: CodecSpec::Int8 { block: 64 },
            error_feedback,
            size_parts_by_bandwidth: true,
            batch_size: 8,
            upload_cap: 0,
            accepts_connections: true,
            wall_ms_at_zero: 0,
            seed: 1,
            max_share_piece: 0,
        }
    }

    /// Each mode is given the memory its rounds work in, and no more: a butterfly member
    /// its part's sums and averages (for a full group, or the peers expected) and
    /// residuals; a ring member only residuals; SGP and `none` nothing.
    #[test]
    fn each_mode_is_given_the_round_memory_it_works_in() {
        const LEN: usize = 100_000;
        let butterfly = ButterflyConfig {
            target_group: 4,
            chunk_elements: 1024,
            ..ButterflyConfig::default()
        };
        let modes = [
            ModeSettings::Butterfly {
                target_batch: 8,
                butterfly: butterfly.clone(),
            },
            ModeSettings::LocalSgd {
                local: LocalSgdSettings::default(),
                butterfly: butterfly.clone(),
            },
        ];
        for mode in &modes {
            let memory = mode
                .round_memory(LEN, &setup(true), usize::MAX)
                .expect("made");
            assert_eq!(memory.result.capacity(), 0, "results are written in place");
            // A quarter, rounded up to whole chunks.
            assert_eq!(memory.sum.len(), 25 * 1024, "{mode:?}");
            assert_eq!(memory.averages.len(), 25 * (1024 + 16 * 4), "{mode:?}");
            assert!(memory.feedback.is_some() && memory.local.is_empty());
            let two = mode.round_memory(LEN, &setup(false), 2).expect("made");
            assert_eq!(two.sum.len(), 49 * 1024, "two peers: half, in whole chunks");
            assert!(two.feedback.is_none(), "no error feedback, no residuals");
        }
        let ring = ModeSettings::SyncRing {
            timeout: Duration::from_secs(1),
            butterfly,
        };
        let memory = ring.round_memory(LEN, &setup(true), 4).expect("made");
        let residuals = memory.feedback.as_ref().expect("residuals");
        assert_eq!(
            (residuals.parts.len(), residuals.averages.len()),
            (LEN, LEN)
        );
        assert_eq!(
            (
                memory.result.capacity(),
                memory.sum.capacity(),
                memory.averages.capacity()
            ),
            (0, 0, 0)
        );
        for mode in [ModeSettings::Sgp(SgpConfig::default()), ModeSettings::Solo] {
            let memory = mode.round_memory(LEN, &setup(true), 4).expect("made");
            assert!(memory.feedback.is_none() && memory.result.capacity() == 0);
        }
    }
}
