//! The inbound side: every accepted tensor stream read to its end, its messages handed to
//! one bounded queue as owned [`Parcel`]s.

use std::sync::Arc;
use std::time::Duration;

use murmur_protocol::identity::PeerId;
use tokio::sync::{Semaphore, mpsc};
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
    /// Payload bytes queued for the consumer, every stream's together; a reader waits for
    /// room before it queues a parcel, and one whose payload alone is larger waits for the
    /// queue to empty. With parcels of up to a frame each (16 MiB by default), a count alone
    /// would let 256 of them pin 4 GiB.
    pub queued_bytes: usize,
    /// How long a reader waits for room in the queue before it drops its stream (the
    /// consumer is stuck; the sender sees its stream fail and recovers its data).
    pub deliver_timeout: Duration,
    /// Capacity of the idle payload buffers kept for reuse, in bytes.
    pub pooled_bytes: usize,
}

impl Default for MailboxConfig {
    fn default() -> Self {
        MailboxConfig {
            capacity: 256,
            // 4 MiB is 32 ms of a 1 Gbit/s link: the consumer decodes a chunk in far less.
            queued_bytes: 4 << 20,
            deliver_timeout: Duration::from_secs(10),
            pooled_bytes: 4 << 20,
        }
    }
}

/// Reads every inbound tensor stream and queues what arrives.
///
/// One task takes streams from the network layer (already authorized and limited per peer)
/// and starts a reader per stream. A reader turns each message into a [`Parcel`] whose
/// payload buffer comes from the pool, and waits at most `deliver_timeout` for room in the
/// queue, counted in parcels and in payload bytes. A message that does not belong on a tensor stream, or bad bytes, end that stream
/// with a log line; the other streams go on.
#[derive(Debug)]
pub struct Mailbox {
    rx: mpsc::Receiver<Queued>,
    /// Room left in the queue, in payload bytes: readers take it, [`Mailbox::recv`] gives
    /// it back.
    room: Arc<Semaphore>,
    queued_bytes: usize,
    pool: BufferPool,
    acceptor: JoinHandle<()>,
}

/// A delivery in the queue and the room it took there.
#[derive(Debug)]
struct Queued {
    delivery: Delivery,
    bytes: u32,
}

/// What the readers share.
#[derive(Debug, Clone)]
struct Readers {
    tx: mpsc::Sender<Queued>,
    room: Arc<Semaphore>,
    /// The most room one parcel takes: the whole queue.
    most: u32,
    pool: BufferPool,
    deliver_timeout: Duration,
}

impl Mailbox {
    /// Starts reading the streams `streams` yields; must run inside a tokio runtime.
    pub fn spawn(streams: mpsc::Receiver<TensorStreamReader>, config: MailboxConfig) -> Mailbox {
        let (tx, rx) = mpsc::channel(config.capacity.max(1));
        let pool = BufferPool::new(config.pooled_bytes);
        let most = u32::try_from(config.queued_bytes.max(1)).unwrap_or(u32::MAX);
        let room = Arc::new(Semaphore::new(most as usize));
        let readers = Readers {
            tx,
            room: room.clone(),
            most,
            pool: pool.clone(),
            deliver_timeout: config.deliver_timeout,
        };
        let acceptor = tokio::spawn(accept(streams, readers));
        Mailbox {
            rx,
            room,
            queued_bytes: most as usize,
            pool,
            acceptor,
        }
    }

    /// The next delivery; `None` once the network layer stopped and every reader ended.
    pub async fn recv(&mut self) -> Option<Delivery> {
        let queued = self.rx.recv().await?;
        Some(self.taken(queued))
    }

    /// The next delivery if one is queued.
    pub fn try_recv(&mut self) -> Option<Delivery> {
        let queued = self.rx.try_recv().ok()?;
        Some(self.taken(queued))
    }

    fn taken(&self, queued: Queued) -> Delivery {
        self.room.add_permits(queued.bytes as usize);
        queued.delivery
    }

    /// Payload bytes queued and not yet taken.
    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes
            .saturating_sub(self.room.available_permits())
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
        // Readers waiting for room stop waiting.
        self.room.close();
    }
}

async fn accept(mut streams: mpsc::Receiver<TensorStreamReader>, readers: Readers) {
    while let Some(reader) = streams.recv().await {
        tokio::spawn(read_stream(reader, readers.clone()));
    }
}

async fn read_stream(mut reader: TensorStreamReader, readers: Readers) {
    let from = reader.peer();
    let pool = &readers.pool;
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
        if !readers.queue(delivery).await {
            return;
        }
    }
}

impl Readers {
    /// Queues `delivery` once the queue has room for it, within `deliver_timeout`; `false`
    /// if the stream should end (no room in time, or the mailbox is gone).
    async fn queue(&self, delivery: Delivery) -> bool {
        let from = delivery.from;
        let bytes = u32::try_from(delivery.parcel.payload_len())
            .unwrap_or(u32::MAX)
            .min(self.most);
        let deadline = tokio::time::Instant::now() + self.deliver_timeout;
        let room = match tokio::time::timeout_at(deadline, self.room.acquire_many(bytes)).await {
            Ok(Ok(room)) => room,
            Ok(Err(_)) => return false,
            Err(_) => return self.late(from),
        };
        // Given back by `Mailbox::recv` when the consumer takes the parcel.
        room.forget();
        let queued = Queued { delivery, bytes };
        match tokio::time::timeout_at(deadline, self.tx.send(queued)).await {
            Ok(Ok(())) => true,
            Ok(Err(_)) => false,
            Err(_) => {
                self.room.add_permits(bytes as usize);
                self.late(from)
            }
        }
    }

    fn late(&self, from: PeerId) -> bool {
        tracing::warn!(
            peer = %from,
            after = ?self.deliver_timeout,
            "the averaging loop took no message in time; dropping the stream"
        );
        false
    }
}
