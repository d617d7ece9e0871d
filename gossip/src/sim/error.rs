//! What can go wrong in a simulated run.

use thiserror::Error;

use crate::butterfly::ButterflyError;
use crate::engine::EngineError;
use crate::ring::RingError;
use crate::sgp::SgpError;

/// Why a simulation could not run.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SimError {
    /// A scenario value is out of range.
    #[error("scenario key `{key}` = {value} is out of range: {allowed}")]
    InvalidScenario {
        /// The scenario key.
        key: &'static str,
        /// The value given.
        value: String,
        /// The allowed range.
        allowed: &'static str,
    },
    /// The SGP state machine refused an input the simulator considers valid.
    #[error("SGP state machine refused a simulated input: {0}")]
    Sgp(#[from] SgpError),
    /// The butterfly settings are invalid, or a butterfly state machine refused an input
    /// the simulator considers valid.
    #[error("butterfly all-reduce: {0}")]
    Butterfly(#[from] ButterflyError),
    /// The ring all-reduce state machine refused a setup the simulator considers valid.
    #[error("ring all-reduce: {0}")]
    Ring(#[from] RingError),
    /// An averaging engine failed on an input the simulator considers valid.
    #[error("averaging engine: {0}")]
    Engine(#[from] EngineError),
}
