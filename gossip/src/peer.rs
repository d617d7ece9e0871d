//! How the averaging state machines name peers.

use std::fmt::Debug;
use std::hash::Hash;

/// A peer's identity as the averaging algorithms see it.
///
/// The only requirements are that keys are cheap to copy and totally ordered: every peer
/// sorts its view of the membership by key, so two peers with the same view agree on every
/// peer's rank in the communication graph without exchanging a message. Any type with these
/// properties is a key; the simulator uses `u32`, the network layer uses libp2p peer ids.
pub trait PeerKey: Copy + Ord + Hash + Debug {}

impl<T: Copy + Ord + Hash + Debug> PeerKey for T {}
