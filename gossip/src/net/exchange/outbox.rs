//! The outbound side: one writer task per destination keeps one tensor stream open while
//! there is traffic, writes parcels in order, and reports each as sent or failed.

use std::collections::HashMap;
use std::time::Duration;

use murmur_protocol::identity::PeerId;
use tokio::sync::mpsc;

use crate::net::{NetError, NetHandle, TensorStreamWriter};
use crate::parcel::Parcel;

/// Bounds of an [`Outbox`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboxConfig {
    /// Parcels queued per destination; [`Outbox::send`] refuses more.
    pub queue_per_peer: usize,
    /// A destination's stream is closed after this long without a parcel.
    pub idle_close: Duration,
    /// Reports queued for the owner; writers wait when it is full.
    pub reports: usize,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            queue_per_peer: 64,
            idle_close: Duration::from_secs(2),
            reports: 1024,
        }
    }
}

/// What became of one parcel given to [`Outbox::send`].
#[derive(Debug)]
pub struct SendReport {
    /// Its destination.
    pub to: PeerId,
    /// The caller's tag, as given to `send`.
    pub tag: u64,
    /// The parcel, handed back (to recycle its buffer, or to take its mass back).
    pub parcel: Parcel,
    /// Written to the stream, or why not.
    pub result: Result<(), NetError>,
}

struct Outgoing {
    tag: u64,
    parcel: Parcel,
}

/// Sends parcels to peers over tensor streams, in order per destination.
///
/// Each destination gets a writer task with a bounded queue. The writer opens a stream on
/// its first parcel (every open and write is bounded by the network layer's timeouts),
/// keeps it while parcels keep coming, and closes it after `idle_close` of quiet. A failed
/// open or write is tried once more on a new stream; a second failure fails that parcel,
/// and the next parcel opens a new stream.
/// Every parcel comes back in a [`SendReport`].
#[derive(Debug)]
pub struct Outbox {
    net: NetHandle,
    config: OutboxConfig,
    writers: HashMap<PeerId, mpsc::Sender<Outgoing>>,
    reports_tx: mpsc::Sender<SendReport>,
    reports_rx: mpsc::Receiver<SendReport>,
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outgoing").field("tag", &self.tag).finish()
    }
}

impl Outbox {
    /// An outbox sending through `net`.
    pub fn new(net: NetHandle, config: OutboxConfig) -> Outbox {
        let (reports_tx, reports_rx) = mpsc::channel(config.reports.max(1));
        Outbox {
            net,
            config,
            writers: HashMap::new(),
            reports_tx,
            reports_rx,
        }
    }

    /// Queues `parcel` for `to`. When that destination's queue is full the parcel comes
    /// straight back as `Err`, and nothing is reported for it.
    pub fn send(&mut self, to: PeerId, tag: u64, parcel: Parcel) -> Result<(), Parcel> {
        let mut outgoing = Outgoing { tag, parcel };
        for _ in 0..2 {
            let writer = self.writers.entry(to).or_insert_with(|| {
                let (tx, rx) = mpsc::channel(self.config.queue_per_peer.max(1));
                tokio::spawn(write_to(
                    self.net.clone(),
                    to,
                    rx,
                    self.reports_tx.clone(),
                    self.config.idle_close,
                ));
                tx
            });
            match writer.try_send(outgoing) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::TrySendError::Full(o)) => return Err(o.parcel),
                // The writer retired after a quiet spell: start a fresh one.
                Err(mpsc::error::TrySendError::Closed(o)) => {
                    self.writers.remove(&to);
                    outgoing = o;
                }
            }
        }
        Err(outgoing.parcel)
    }

    /// The next report; waits until a writer has one.
    pub async fn next_report(&mut self) -> Option<SendReport> {
        self.reports_rx.recv().await
    }

    /// A report if one is ready.
    pub fn try_next_report(&mut self) -> Option<SendReport> {
        self.reports_rx.try_recv().ok()
    }

    /// Parcels queued or being written, all destinations together (approximate).
    pub fn queued(&self) -> usize {
        self.writers
            .values()
            .map(|w| w.max_capacity() - w.capacity())
            .sum()
    }
}

/// One destination's writer: runs until its queue closes or stays quiet for `idle_close`.
async fn write_to(
    net: NetHandle,
    to: PeerId,
    mut queue: mpsc::Receiver<Outgoing>,
    reports: mpsc::Sender<SendReport>,
    idle_close: Duration,
) {
    let mut stream: Option<TensorStreamWriter> = None;
    loop {
        let next = match tokio::time::timeout(idle_close, queue.recv()).await {
            Ok(Some(next)) => next,
            Ok(None) | Err(_) => break,
        };
        let mut result = write_one(&net, &to, &mut stream, &next.parcel).await;
        if result.is_err() && stream.is_some() {
            // The write failed: once more on a fresh stream. libp2p may have opened the
            // first on a connection that was closing while another one to the same peer
            // lives. A frame cut short on the old stream is discarded by the receiver, so
            // nothing arrives twice.
            stream = None;
            result = write_one(&net, &to, &mut stream, &next.parcel).await;
        }
        // No stream left after an error: opening one failed, so the peer cannot be reached
        // now (a dial to a dead peer fails only at the handshake timeout).
        let unreachable = result.is_err() && stream.is_none();
        if result.is_err() {
            stream = None;
        }
        let report = SendReport {
            to,
            tag: next.tag,
            parcel: next.parcel,
            result,
        };
        if reports.send(report).await.is_err() {
            return;
        }
        if unreachable {
            // Each parcel already queued behind it would dial again and wait as long:
            // report them failed now. Parcels queued later try again.
            while let Ok(late) = queue.try_recv() {
                let report = SendReport {
                    to,
                    tag: late.tag,
                    parcel: late.parcel,
                    result: Err(NetError::OpenStream {
                        peer: to,
                        reason: "opening a stream to it has just failed".to_owned(),
                    }),
                };
                if reports.send(report).await.is_err() {
                    return;
                }
            }
        }
    }
    // Stop taking parcels before the close, then report any that raced in as failed so
    // that none is lost silently.
    queue.close();
    if let Some(stream) = stream.take() {
        let _ = stream.finish().await;
    }
    while let Some(late) = queue.recv().await {
        let report = SendReport {
            to,
            tag: late.tag,
            parcel: late.parcel,
            result: Err(NetError::Stopped),
        };
        if reports.send(report).await.is_err() {
            return;
        }
    }
}

async fn write_one(
    net: &NetHandle,
    to: &PeerId,
    stream: &mut Option<TensorStreamWriter>,
    parcel: &Parcel,
) -> Result<(), NetError> {
    if stream.is_none() {
        *stream = Some(net.open_tensor_stream(to).await?);
    }
    let Some(writer) = stream.as_mut() else {
        return Err(NetError::Stopped);
    };
    let mut ids = Vec::new();
    let message = parcel.as_message(&mut ids);
    writer.send(&message).await
}
