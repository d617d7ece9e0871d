//! Tensor streams: framed murmur messages over one libp2p stream, each way bounded in time.
//!
//! A [`TensorStreamWriter`] encodes each message into one reused buffer and writes it;
//! when the receiver does not read, QUIC flow control stops the write, and the write waits
//! at most `net.tensor_write_timeout_ms` before failing. Memory does not grow with a slow
//! receiver: the only buffers are the stream's flow-control window and one frame.
//!
//! A [`TensorStreamReader`] reads into a fixed buffer. A frame that lies whole in it is
//! checked and read in place; the others go through a [`FrameDecoder`], which checks every
//! header against the frame limits before it reserves room for the payload.
//! Every read waits at most `net.tensor_read_timeout_ms`, and each frame must arrive whole
//! within `net.frame_timeout_ms` of its first byte, so a sender trickling a byte now and
//! then cannot keep a stream (and the frame it holds) forever. The decoder's buffer counts
//! against the peer's `net.max_partial_frame_bytes_per_peer`
//! ([`PartialFrameBudget`](super::partial_frames::PartialFrameBudget)), and is let go
//! between frames. Bytes that are not a valid frame
//! or message end the stream: the reader sends a [`Reject`] saying why, closes the stream,
//! logs the reason, counts it in [`NetMetrics`], and returns the error. Other streams and
//! peers are not affected.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use futures::{AsyncReadExt as _, AsyncWriteExt as _};
use murmur_protocol::frame::{
    Frame, FrameDecoder, FrameError, FrameFlags, FrameHeader, FrameLimits, HEADER_LEN,
};
use murmur_protocol::identity::PeerId;
use murmur_protocol::message::{
    AveragedChunk, MAX_REJECT_TEXT_LEN, Message, MessageError, Reject, RejectCode, TensorPartChunk,
};

use super::auth::truncate_utf8;
use super::bandwidth::{BandwidthEstimator, Direction};
use super::error::NetError;
use super::metrics::{NetMetrics, PeerTraffic};
use super::partial_frames::{OverBudget, PartialFrameBudget};
use super::rate_limit::RateLimiter;

/// Bytes read from the stream at a time.
const READ_CHUNK: usize = 256 * 1024;
/// How long a refusal may take to send before the stream is closed anyway.
const REJECT_SEND_TIMEOUT: Duration = Duration::from_millis(500);

/// What both ends of a tensor stream share with the network layer.
#[derive(Debug, Clone)]
pub(crate) struct StreamContext {
    pub(crate) metrics: Arc<NetMetrics>,
    pub(crate) bandwidth: Arc<BandwidthEstimator>,
    pub(crate) frame_limits: FrameLimits,
    pub(crate) read_timeout: Duration,
    /// `net.frame_timeout_ms`: from a frame's first byte to its last.
    pub(crate) frame_timeout: Duration,
    /// `net.max_partial_frame_bytes_per_peer`.
    pub(crate) partial_budget: u64,
    pub(crate) write_timeout: Duration,
    /// The volunteer's upload cap, shared by every stream; `None` = uncapped.
    pub(crate) upload: Option<Arc<RateLimiter>>,
    /// The volunteer's download cap, shared by every stream; `None` = uncapped.
    pub(crate) download: Option<Arc<RateLimiter>>,
}

/// How much a finished transfer moved, and how long it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferStats {
    /// Frame bytes moved, headers included.
    pub bytes: u64,
    /// From the first byte to the end of the stream.
    pub elapsed: Duration,
}

/// The sending end of a tensor stream to one peer.
pub struct TensorStreamWriter {
    peer: PeerId,
    stream: libp2p::Stream,
    buf: Vec<u8>,
    ctx: StreamContext,
    started: Option<Instant>,
    bytes: u64,
}

impl TensorStreamWriter {
    pub(crate) fn new(peer: PeerId, stream: libp2p::Stream, ctx: StreamContext) -> Self {
        TensorStreamWriter {
            peer,
            stream,
            buf: Vec::new(),
            ctx,
            started: None,
            bytes: 0,
        }
    }

    /// The peer at the other end.
    pub fn peer(&self) -> PeerId {
        self.peer
    }

    /// Frames and sends `message`. Each write waits while the receiver's window is full, at
    /// most `net.tensor_write_timeout_ms`. A chunk's payload is written straight from the
    /// message, not copied into a frame buffer first.
    ///
    /// After an error the stream may hold part of a frame: drop the writer and open a new
    /// stream. (The receiver sees the stream end mid-frame and discards the partial frame.)
    pub async fn send(&mut self, message: &Message<'_>) -> Result<(), NetError> {
        self.send_with_flags(message, FrameFlags::EMPTY).await
    }

    /// Frames and sends `message` flagged as the last one on the stream, then closes the
    /// stream and reports the transfer.
    pub async fn send_last(mut self, message: &Message<'_>) -> Result<TransferStats, NetError> {
        self.send_with_flags(message, FrameFlags::END_OF_STREAM)
            .await?;
        self.finish().await
    }

    /// Sends bytes that already hold whole frames (encoded by the caller, for example
    /// straight from a codec's output buffer).
    pub async fn send_encoded(&mut self, frames: &[u8]) -> Result<(), NetError> {
        if let Some(cap) = &self.ctx.upload {
            cap.take(frames.len() as u64).await;
        }
        self.started.get_or_insert_with(Instant::now);
        let write = self.stream.write_all(frames);
        match tokio::time::timeout(self.ctx.write_timeout, write).await {
            Err(_) => Err(NetError::Timeout {
                what: "writing a tensor frame (the receiver is not reading)",
                after: self.ctx.write_timeout,
            }),
            Ok(Err(source)) => Err(NetError::Io {
                peer: self.peer,
                source,
            }),
            Ok(Ok(())) => {
                let n = frames.len() as u64;
                self.bytes += n;
                self.ctx.metrics.tensor_bytes_sent(n);
                Ok(())
            }
        }
    }

    /// Closes the stream (waiting for the close to be sent, bounded), records the upload
    /// rate, and reports the transfer.
    pub async fn finish(mut self) -> Result<TransferStats, NetError> {
        let close = self.stream.close();
        match tokio::time::timeout(self.ctx.write_timeout, close).await {
            Err(_) => {
                return Err(NetError::Timeout {
                    what: "closing a tensor stream",
                    after: self.ctx.write_timeout,
                });
            }
            Ok(Err(source)) => {
                return Err(NetError::Io {
                    peer: self.peer,
                    source,
                });
            }
            Ok(Ok(())) => {}
        }
        let elapsed = self.started.map(|s| s.elapsed()).unwrap_or_default();
        self.ctx
            .bandwidth
            .record(self.peer, Direction::Upload, self.bytes, elapsed);
        Ok(TransferStats {
            bytes: self.bytes,
            elapsed,
        })
    }

    async fn send_with_flags(
        &mut self,
        message: &Message<'_>,
        flags: FrameFlags,
    ) -> Result<(), NetError> {
        let (head, payload) = split_payload(message);
        // The whole message is checked, though only its head is encoded here.
        message.validate().map_err(NetError::Encode)?;
        let head_len = head.encoded_len();
        let header = FrameHeader::new(head.kind(), flags, head_len + payload.len())
            .map_err(|e| NetError::Encode(MessageError::Frame(e)))?;
        // Reused across frames: grows to the largest head sent, then never again.
        self.buf.resize(HEADER_LEN + head_len, 0);
        let (header_bytes, head_bytes) = self.buf.split_at_mut(HEADER_LEN);
        header_bytes.copy_from_slice(&header.encode());
        head.encode_into(head_bytes).map_err(NetError::Encode)?;
        let buf = std::mem::take(&mut self.buf);
        let mut result = self.send_encoded(&buf).await;
        self.buf = buf;
        if result.is_ok() && !payload.is_empty() {
            result = self.send_encoded(payload).await;
        }
        result
    }
}

/// Splits off a chunk's payload, the last field of its frame, so that it is written
/// straight from the caller's buffer instead of being copied into a frame first. Other
/// messages are small and go whole.
fn split_payload<'m>(message: &Message<'m>) -> (Message<'m>, &'m [u8]) {
    match *message {
        Message::TensorPartChunk(chunk) => (
            Message::TensorPartChunk(TensorPartChunk {
                payload: &[],
                ..chunk
            }),
            chunk.payload,
        ),
        Message::AveragedChunk(chunk) => (
            Message::AveragedChunk(AveragedChunk {
                payload: &[],
                ..chunk
            }),
            chunk.payload,
        ),
        ref whole => (whole.clone(), &[]),
    }
}

impl Drop for TensorStreamWriter {
    fn drop(&mut self) {
        self.ctx.metrics.add_peer_traffic(
            self.peer,
            PeerTraffic {
                bytes_sent: self.bytes,
                bytes_received: 0,
            },
        );
    }
}

impl std::fmt::Debug for TensorStreamWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorStreamWriter")
            .field("peer", &self.peer)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

/// Holds one of a peer's inbound-stream slots; gives it back when dropped.
#[derive(Debug)]
pub(crate) struct StreamSlot(Arc<AtomicU32>);

impl StreamSlot {
    /// Takes a slot from `open` if fewer than `limit` are taken.
    pub(crate) fn try_take(open: &Arc<AtomicU32>, limit: u32) -> Option<StreamSlot> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < limit).then_some(n + 1)
        })
        .ok()
        .map(|_| StreamSlot(Arc::clone(open)))
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The receiving end of a tensor stream from one authorized peer.
pub struct TensorStreamReader {
    peer: PeerId,
    stream: libp2p::Stream,
    decoder: FrameDecoder,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    ctx: StreamContext,
    first_byte: Option<Instant>,
    bytes: u64,
    /// The peer closed its side; bytes not yet taken may remain in the buffer.
    eof: bool,
    done: bool,
    /// When the first byte of the frame now arriving came; `None` between frames.
    frame_started: Option<Instant>,
    budget: PartialFrameBudget,
    _slot: StreamSlot,
}

impl TensorStreamReader {
    pub(crate) fn new(
        peer: PeerId,
        stream: libp2p::Stream,
        ctx: StreamContext,
        slot: StreamSlot,
        budget: PartialFrameBudget,
    ) -> Self {
        TensorStreamReader {
            peer,
            stream,
            decoder: FrameDecoder::new(ctx.frame_limits),
            buf: vec![0u8; READ_CHUNK].into_boxed_slice(),
            start: 0,
            end: 0,
            ctx,
            first_byte: None,
            bytes: 0,
            eof: false,
            done: false,
            frame_started: None,
            budget,
            _slot: slot,
        }
    }

    /// The peer at the other end.
    pub fn peer(&self) -> PeerId {
        self.peer
    }

    /// Frame bytes read so far.
    pub fn bytes_received(&self) -> u64 {
        self.bytes
    }

    /// Reads the next message and passes it, borrowed from the stream's buffer, to
    /// `on_message`; returns what it returns. `Ok(None)` when the peer ended the stream
    /// cleanly.
    ///
    /// Each read waits at most `net.tensor_read_timeout_ms`. A bad frame or message closes
    /// the stream with a [`Reject`] and returns [`NetError::BadFrame`] or
    /// [`NetError::BadMessage`]; every later call returns `Ok(None)`.
    pub async fn recv<R>(
        &mut self,
        on_message: impl FnOnce(Message<'_>) -> R,
    ) -> Result<Option<R>, NetError> {
        self.between_frames();
        loop {
            if self.done {
                return Ok(None);
            }
            if self.start == self.end && (self.eof || !self.fill(0).await?) {
                self.end_of_stream().await?;
                return Ok(None);
            }
            // A frame is read in place where it lies whole in the read buffer, or will once
            // the rest of it is read in after it. The decoder (which copies) takes frames
            // larger than the buffer, the stream's last frame, and anything wrong, so that
            // it reports errors and the end of the stream as it always does.
            if self.decoder.pending_len() == 0 && !self.decoder.is_ended() && !self.eof {
                let input = &self.buf[self.start..self.end];
                match Frame::parse(input, &self.ctx.frame_limits) {
                    Ok((frame, len)) if !frame.flags().contains(FrameFlags::END_OF_STREAM) => {
                        self.start += len;
                        let failure = match Message::from_frame(&frame) {
                            Ok(message) => return Ok(Some(on_message(message))),
                            Err(e) => Failure::Message(e),
                        };
                        return Err(self.refuse(failure).await);
                    }
                    Err(FrameError::Truncated { expected, .. }) if expected <= self.buf.len() => {
                        // At the end of the stream the decoder takes what came, and
                        // reports the frame cut short.
                        self.eof = !self.fill(expected).await?;
                        continue;
                    }
                    _ => {}
                }
            }
            let mut input = &self.buf[self.start..self.end];
            let before = input.len();
            let decoded = self.decoder.decode(&mut input);
            self.start += before - input.len();
            let failure = match decoded {
                Ok(None) => {
                    // A frame is partly here: what the decoder holds for it is charged.
                    let held = self.decoder.buffer_capacity() as u64;
                    if let Err(over) = self.budget.set(held) {
                        self.ctx.metrics.tensor_stream_over_partial_budget();
                        return Err(self.refuse(Failure::Budget(over)).await);
                    }
                    continue;
                }
                Ok(Some(frame)) => match Message::from_frame(&frame) {
                    Ok(message) => return Ok(Some(on_message(message))),
                    Err(e) => Failure::Message(e),
                },
                Err(e) => Failure::Frame(e),
            };
            return Err(self.refuse(failure).await);
        }
    }

    /// After a frame: the next one's deadline starts with its first byte, and a decoder
    /// grown for a large frame lets its buffer go (and its charge to the peer's budget).
    fn between_frames(&mut self) {
        if self.decoder.pending_len() > 0 {
            return;
        }
        self.frame_started = None;
        if !self.decoder.is_ended() && self.decoder.buffer_capacity() > READ_CHUNK {
            self.decoder = FrameDecoder::new(self.ctx.frame_limits);
            // Giving back never fails.
            let _ = self.budget.set(0);
        }
    }

    /// How long the next read may wait: the read timeout, or less if the frame partly here
    /// must be whole sooner. `Err` once the frame's deadline has passed.
    fn read_wait(&mut self) -> Result<(Duration, bool), NetError> {
        let partial = self.start < self.end || self.decoder.pending_len() > 0;
        if !partial {
            return Ok((self.ctx.read_timeout, false));
        }
        let started = *self.frame_started.get_or_insert_with(Instant::now);
        let left = (started + self.ctx.frame_timeout).saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.frame_too_slow());
        }
        Ok(if left < self.ctx.read_timeout {
            (left, true)
        } else {
            (self.ctx.read_timeout, false)
        })
    }

    fn frame_too_slow(&mut self) -> NetError {
        self.done = true;
        self.ctx.metrics.tensor_frame_timed_out();
        tracing::warn!(peer = %self.peer, "closing tensor stream: a frame did not arrive whole in time");
        NetError::Timeout {
            what: "a whole tensor frame (the sender is trickling it)",
            after: self.ctx.frame_timeout,
        }
    }

    /// Reads more bytes after those not yet taken, first moving those to the front of the
    /// buffer if fewer than `room` bytes from where they start are left (or none are
    /// left). `false` at the end of the stream.
    async fn fill(&mut self, room: usize) -> Result<bool, NetError> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.buf.len() - self.start < room.max(self.end - self.start + 1) {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        let (wait, frame_deadline) = self.read_wait()?;
        let read = self.stream.read(&mut self.buf[self.end..]);
        let n = match tokio::time::timeout(wait, read).await {
            Err(_) if frame_deadline => return Err(self.frame_too_slow()),
            Err(_) => {
                self.done = true;
                return Err(NetError::Timeout {
                    what: "waiting for tensor bytes (the sender went silent)",
                    after: self.ctx.read_timeout,
                });
            }
            Ok(Err(source)) => {
                self.done = true;
                return Err(NetError::Io {
                    peer: self.peer,
                    source,
                });
            }
            Ok(Ok(n)) => n,
        };
        if let Some(cap) = &self.ctx.download {
            cap.take(n as u64).await;
        }
        self.first_byte.get_or_insert_with(Instant::now);
        self.end += n;
        self.bytes += n as u64;
        self.ctx.metrics.tensor_bytes_received(n as u64);
        Ok(n > 0)
    }

    /// The peer closed its side: a clean end if no frame was cut short.
    async fn end_of_stream(&mut self) -> Result<(), NetError> {
        self.done = true;
        if let Err(e) = self.decoder.finish() {
            return Err(self.refuse(Failure::Frame(e)).await);
        }
        let elapsed = self.first_byte.map(|t| t.elapsed()).unwrap_or_default();
        self.ctx
            .bandwidth
            .record(self.peer, Direction::Download, self.bytes, elapsed);
        Ok(())
    }

    /// Ends the stream over bad input: tells the peer why (best effort, bounded), closes,
    /// logs and counts it, and returns the error for the caller.
    async fn refuse(&mut self, failure: Failure) -> NetError {
        self.done = true;
        if !matches!(failure, Failure::Budget(_)) {
            self.ctx.metrics.bad_frame();
        }
        let (code, error) = match failure {
            Failure::Frame(source) => (
                RejectCode::BadFrame,
                NetError::BadFrame {
                    peer: self.peer,
                    source,
                },
            ),
            Failure::Message(source) => (
                RejectCode::BadMessage,
                NetError::BadMessage {
                    peer: self.peer,
                    source,
                },
            ),
            Failure::Budget(over) => (
                RejectCode::Busy,
                NetError::PartialFrameBudget {
                    peer: self.peer,
                    held: over.held,
                    limit: over.limit,
                },
            ),
        };
        tracing::warn!(peer = %self.peer, reason = %error, "closing tensor stream");
        let text = error.to_string();
        let reject = Message::Reject(Reject {
            code,
            text: truncate_utf8(&text, MAX_REJECT_TEXT_LEN),
        });
        let mut frame = vec![0u8; reject.frame_len()];
        if let Ok(len) = reject.encode_frame(FrameFlags::END_OF_STREAM, &mut frame) {
            let stream = &mut self.stream;
            let _ = tokio::time::timeout(REJECT_SEND_TIMEOUT, async {
                stream.write_all(&frame[..len]).await?;
                stream.close().await
            })
            .await;
        }
        error
    }
}

impl Drop for TensorStreamReader {
    fn drop(&mut self) {
        self.ctx.metrics.add_peer_traffic(
            self.peer,
            PeerTraffic {
                bytes_sent: 0,
                bytes_received: self.bytes,
            },
        );
    }
}

impl std::fmt::Debug for TensorStreamReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorStreamReader")
            .field("peer", &self.peer)
            .field("bytes", &self.bytes)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// Why a stream is being refused.
enum Failure {
    Frame(FrameError),
    Message(MessageError),
    Budget(OverBudget),
}
