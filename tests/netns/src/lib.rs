#![doc = include_str!("../README.md")]

pub mod delay_line;
mod error;
mod exec;
mod harness;
mod interrupt;
pub mod nat;
pub mod packet;
mod partition;
mod probe;
pub mod scenario;
pub mod topology;

#[cfg(test)]
mod delay_line_tests;

pub use delay_line::{DelayLine, DelayLineStats, LinkImpairment};
pub use error::HarnessError;
pub use exec::{KillOnDrop, run_bounded, run_checked};
pub use harness::{Harness, NAMESPACE_PREFIX};
pub use interrupt::end_with_parent;
pub use probe::{BulkReport, PingReport};
pub use topology::{LinkShape, Topology};
