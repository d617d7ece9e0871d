//! The inbound side: every accepted tensor stream read to its end, its messages handed to
//! one bounded queue as owned [`Parcel`]s.

use std::time::Duration;

use murmur_protocol::identity::PeerId;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::pool::BufferPool;
use crate::net::{NetError, TensorStreamReader};
use crate::parcel::Parcel;

/// A parcel and the authenticated peer that sent it.
#[derive(Debug)]
pub struct Delivery {
    /// The sender, as the transport authenticated it.
    pub from: PeerId,
    /// What it sent.
    pub parcel: Parcel,
}

/// Bounds of a [`Mailbox`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MailboxConfig {
    /// Parcels queued for the consumer; readers wait when it is full.
    pub capacity: usize,
    /// How long a reader waits for room in the queue before it drops its stream (the
    /// consumer is stuck; the sender sees its stream fail and recovers its data).
    pub deliver_timeout: Duration,
    /// Idle payload buffers kept for reuse.
    pub pooled_buffers: usize,
}

impl Default for MailboxConfig {
    fn default() -> Self {
        MailboxConfig {
            capacity: 256,
            deliver_timeout: Duration::from_secs(10),
            pooled_buffers: 256,
        }
    }
}

/// Reads every inbound tensor stream and queues what arrives.
///
/// One task takes streams from the network layer (already authorized and limited per peer)
/// and starts a reader per stream. A reader turns each message into a [`Parcel`] whose
/// payload buffer comes from the pool, and waits at most `deliver_timeout` for room in the
/// queue. A message that does not belong on a tensor stream, or bad bytes, end that stream
/// with a log line; the other streams go on.
#[derive(Debug)]
pub struct Mailbox {
    rx: mpsc::Receiver<Delivery>,
    pool: BufferPool,
    acceptor: JoinHandle<()>,
}

impl Mailbox {
    /// Starts reading the streams `streams` yields; must run inside a tokio runtime.
    pub fn spawn(streams: mpsc::Receiver<TensorStreamReader>, config: MailboxConfig) -> Mailbox {
        let (tx, rx) = mpsc::channel(config.capacity.max(1));
        let pool = BufferPool::new(config.pooled_buffers);
        let acceptor = tokio::spawn(accept(streams, tx, pool.clone(), config.deliver_timeout));
        Mailbox { rx, pool, acceptor }
    }

    /// The next delivery; `None` once the network layer stopped and every reader ended.
    pub async fn recv(&mut self) -> Option<Delivery> {
        self.rx.recv().await
    }

    /// The next delivery if one is queued.
    pub fn try_recv(&mut self) -> Option<Delivery> {
        self.rx.try_recv().ok()
    }

    /// Gives a payload buffer back for reuse.
    pub fn recycle(&self, buf: Vec<u8>) {
        self.pool.give(buf);
    }

    /// The pool payload buffers come from (senders may draw from it too).
    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

async fn accept(
    mut streams: mpsc::Receiver<TensorStreamReader>,
    tx: mpsc::Sender<Delivery>,
    pool: BufferPool,
    deliver_timeout: Duration,
) {
    while let Some(reader) = streams.recv().await {
        tokio::spawn(read_stream(
            reader,
            tx.clone(),
            pool.clone(),
            deliver_timeout,
        ));
    }
}

async fn read_stream(
    mut reader: TensorStreamReader,
    tx: mpsc::Sender<Delivery>,
    pool: BufferPool,
    deliver_timeout: Duration,
) {
    let from = reader.peer();
    loop {
        let parcel = match reader
            .recv(|message| Parcel::from_message(&message, || pool.take()))
            .await
        {
            Ok(None) => return,
            Ok(Some(Ok(parcel))) => parcel,
            Ok(Some(Err(e))) => {
                tracing::warn!(peer = %from, reason = %e, "closing tensor stream");
                return;
            }
            Err(NetError::Timeout { .. }) => {
                tracing::debug!(peer = %from, "tensor stream went silent; closing it");
                return;
            }
            // The reader has logged and counted bad bytes already.
            Err(e) => {
                tracing::debug!(peer = %from, error = %e, "tensor stream ended");
                return;
            }
        };
        let delivery = Delivery { from, parcel };
        match tokio::time::timeout(deliver_timeout, tx.send(delivery)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return,
            Err(_) => {
                tracing::warn!(
                    peer = %from,
                    after = ?deliver_timeout,
                    "the averaging loop took no message in time; dropping the stream"
                );
                return;
            }
        }
    }
}
