//! murmur's bytes on the wire.
//!
//! Everything two murmur peers exchange is defined here, and nothing here does I/O:
//!
//! - [`frame`]: the versioned, length-limited envelope every message travels in, and an
//!   incremental decoder that accepts input split at any byte;
//! - [`message`]: the messages the averaging algorithms exchange, encoded without allocation
//!   and decoded as views that borrow the frame's bytes;
//! - [`codec`]: tensor codecs (`f32`, `f16`, `bf16`, blockwise `int8`/`int4`, `sign1`, `topk`)
//!   that encode into caller-provided buffers and decode-accumulate in one fused pass, plus
//!   error feedback;
//! - [`identity`]: ed25519 peer identities compatible with libp2p peer ids, invite
//!   certificates signed by a swarm authority, and signed envelopes;
//! - [`snapshot`]: a model's whole training state in one checksummed, compressed blob, the
//!   form of both checkpoint files and the state a joining peer downloads.
//!
//! The crate is strict: every decoder checks lengths before it allocates, rejects non-finite
//! floats, and returns a typed error that says what was wrong. No input can make it panic;
//! the fuzz targets in `fuzz/` hold it to that.

pub mod codec;
pub mod frame;
#[doc(hidden)]
pub mod fuzzing;
pub mod identity;
pub mod message;
pub mod snapshot;
pub mod snapshot_file;

mod wire;

pub use wire::{BufferTooSmall, Truncated};
