//! Moving averaging-protocol messages between peers: a [`Mailbox`] for what arrives and an
//! [`Outbox`] for what leaves, both over tensor streams and both bounded.
//!
//! The state machines (`sgp`, `butterfly`, `ring`) speak in [`Parcel`]s: owned messages
//! whose payload buffers are pooled, so steady-state traffic reuses its memory. The
//! mailbox reads every inbound stream concurrently and queues parcels for one consumer,
//! the peer's averaging loop; the outbox keeps one stream per destination and reports
//! what became of every parcel, so that a loop can confirm a push-sum share or take its
//! mass back, and tell a butterfly round that its chunk left.

mod mailbox;
mod outbox;
mod pool;

pub use crate::parcel::{Parcel, ParcelError};
pub use mailbox::{Delivery, Mailbox, MailboxConfig};
pub use outbox::{Outbox, OutboxConfig, SendReport};
pub use pool::BufferPool;
