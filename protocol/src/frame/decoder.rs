//! Reading frames: limits, the borrowed [`Frame`] view, and the incremental decoder.

use super::{FrameError, FrameFlags, FrameHeader, FrameKind, FrameLimitsError, HEADER_LEN};

/// How large a frame a receiver accepts. Checked against every header before any memory is
/// reserved for its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameLimits {
    max_payload: u32,
}

impl FrameLimits {
    /// The default payload limit: 16 MiB, room for a 4 Mi-element `f32` chunk.
    pub const DEFAULT_MAX_PAYLOAD: u32 = 16 << 20;
    /// The largest payload limit a receiver may choose, and the largest payload a sender may
    /// frame: 64 MiB. Larger transfers are split into chunks.
    pub const HARD_MAX_PAYLOAD: u32 = 64 << 20;
    /// The smallest payload limit a receiver may choose: 64 bytes, below which not even the
    /// fixed fields of a tensor chunk fit.
    pub const MIN_MAX_PAYLOAD: u32 = 64;

    /// Limits accepting payloads of up to `max_payload` bytes, which must lie in
    /// [`MIN_MAX_PAYLOAD`](Self::MIN_MAX_PAYLOAD)`..=`[`HARD_MAX_PAYLOAD`](Self::HARD_MAX_PAYLOAD).
    pub const fn new(max_payload: u32) -> Result<FrameLimits, FrameLimitsError> {
        if max_payload < Self::MIN_MAX_PAYLOAD || max_payload > Self::HARD_MAX_PAYLOAD {
            return Err(FrameLimitsError {
                requested: max_payload,
                min: Self::MIN_MAX_PAYLOAD,
                max: Self::HARD_MAX_PAYLOAD,
            });
        }
        Ok(FrameLimits { max_payload })
    }

    /// The largest payload accepted, in bytes.
    pub fn max_payload(&self) -> u32 {
        self.max_payload
    }

    /// The largest frame accepted, header included, in bytes: the most a
    /// [`FrameDecoder`] with these limits ever buffers.
    pub fn max_frame_len(&self) -> usize {
        HEADER_LEN + super::usize_from(self.max_payload)
    }
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits {
            max_payload: Self::DEFAULT_MAX_PAYLOAD,
        }
    }
}

/// A complete, checked frame whose payload borrows the bytes it was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    header: FrameHeader,
    payload: &'a [u8],
}

impl<'a> Frame<'a> {
    /// Reads the frame at the start of `bytes` without copying it, and returns it with the
    /// number of bytes it took. Bytes after the frame are left alone. If `bytes` ends before
    /// the frame does, the error is [`FrameError::Truncated`].
    pub fn parse(bytes: &'a [u8], limits: &FrameLimits) -> Result<(Frame<'a>, usize), FrameError> {
        let Some(header) = bytes.first_chunk::<HEADER_LEN>() else {
            return Err(FrameError::Truncated {
                buffered: bytes.len(),
                expected: HEADER_LEN,
            });
        };
        let header = FrameHeader::parse(header, limits)?;
        let frame_len = header.frame_len();
        let Some(payload) = bytes.get(HEADER_LEN..frame_len) else {
            return Err(FrameError::Truncated {
                buffered: bytes.len(),
                expected: frame_len,
            });
        };
        Ok((Frame { header, payload }, frame_len))
    }

    /// The frame's header.
    pub fn header(&self) -> FrameHeader {
        self.header
    }

    /// Which message the payload holds.
    pub fn kind(&self) -> FrameKind {
        self.header.kind()
    }

    /// The frame's flags.
    pub fn flags(&self) -> FrameFlags {
        self.header.flags()
    }

    /// The payload bytes.
    pub fn payload(&self) -> &'a [u8] {
        self.payload
    }
}

/// Cuts a byte stream into frames, whatever sizes the stream arrives in.
///
/// Feed it each piece the transport delivers with [`decode`](Self::decode) and call it
/// again until it returns `Ok(None)`; when the stream closes, call
/// [`finish`](Self::finish) to learn whether it closed mid-frame.
///
/// ```
/// use murmur_protocol::frame::{
///     FrameDecoder, FrameFlags, FrameKind, FrameLimits, HEADER_LEN, encode_header,
/// };
///
/// let mut header = [0u8; HEADER_LEN];
/// encode_header(FrameKind::Heartbeat, FrameFlags::EMPTY, 3, &mut header)?;
/// let stream = [&header[..], b"abc"].concat();
///
/// let mut decoder = FrameDecoder::new(FrameLimits::default());
/// let mut kinds = Vec::new();
/// for piece in stream.chunks(5) {
///     let mut input = piece;
///     while let Some(frame) = decoder.decode(&mut input)? {
///         kinds.push((frame.kind(), frame.payload().to_vec()));
///     }
/// }
/// decoder.finish()?;
/// assert_eq!(kinds, [(FrameKind::Heartbeat, b"abc".to_vec())]);
/// # Ok::<(), murmur_protocol::frame::FrameError>(())
/// ```
///
/// Memory: one buffer holds the frame being read, header included, and is reused for the
/// next one. It grows with the bytes that actually arrive, never past
/// [`FrameLimits::max_frame_len`], and once it has reached the size of the largest frame
/// seen, decoding allocates nothing more. Each payload byte is copied once, from `input`
/// into that buffer.
#[derive(Debug)]
pub struct FrameDecoder {
    limits: FrameLimits,
    /// The current frame's bytes: header, then as much payload as has arrived.
    buf: Vec<u8>,
    /// The current frame's header, once all of its bytes have arrived and passed the checks.
    header: Option<FrameHeader>,
    /// `buf` holds a frame that was handed out; the next call starts a new one.
    holds_frame: bool,
    /// The peer sent a frame flagged end-of-stream.
    ended: bool,
    /// A call failed; the stream cannot be resynchronised.
    poisoned: bool,
}

impl FrameDecoder {
    /// A decoder that accepts frames within `limits`. Allocates nothing until bytes arrive.
    pub fn new(limits: FrameLimits) -> FrameDecoder {
        FrameDecoder {
            limits,
            buf: Vec::new(),
            header: None,
            holds_frame: false,
            ended: false,
            poisoned: false,
        }
    }

    /// Consumes bytes from the front of `input` until a frame is complete, and returns it.
    ///
    /// Returns `Ok(None)` once `input` is used up without completing a frame; the bytes are
    /// kept and the next call continues where this one stopped. Never consumes bytes past
    /// the end of the frame it returns, so call again with the same `input` to get the next
    /// frame. The returned frame borrows the decoder and is discarded by the next call.
    ///
    /// Errors are final: the decoder is [poisoned](Self::is_poisoned) and every later call
    /// returns [`FrameError::Poisoned`].
    pub fn decode(&mut self, input: &mut &[u8]) -> Result<Option<Frame<'_>>, FrameError> {
        if self.poisoned {
            return Err(FrameError::Poisoned);
        }
        if self.holds_frame {
            self.buf.clear();
            self.header = None;
            self.holds_frame = false;
        }
        if self.ended {
            if input.is_empty() {
                return Ok(None);
            }
            return Err(self.fail(FrameError::DataAfterEnd { extra: input.len() }));
        }
        let header = match self.header {
            Some(header) => header,
            None => {
                self.fill(input, HEADER_LEN);
                let Some(bytes) = self.buf.first_chunk::<HEADER_LEN>() else {
                    return Ok(None);
                };
                match FrameHeader::parse(bytes, &self.limits) {
                    Ok(header) => {
                        self.header = Some(header);
                        header
                    }
                    Err(error) => return Err(self.fail(error)),
                }
            }
        };
        let frame_len = header.frame_len();
        self.fill(input, frame_len);
        let Some(payload) = self.buf.get(HEADER_LEN..frame_len) else {
            return Ok(None);
        };
        self.holds_frame = true;
        self.ended = header.flags().contains(FrameFlags::END_OF_STREAM);
        Ok(Some(Frame { header, payload }))
    }

    /// Tells the decoder the stream has ended. Fails with [`FrameError::Truncated`] (and
    /// poisons the decoder) if it ended in the middle of a frame.
    pub fn finish(&mut self) -> Result<(), FrameError> {
        if self.poisoned {
            return Err(FrameError::Poisoned);
        }
        if self.holds_frame || self.buf.is_empty() {
            return Ok(());
        }
        let expected = self.header.map_or(HEADER_LEN, |header| header.frame_len());
        Err(self.fail(FrameError::Truncated {
            buffered: self.buf.len(),
            expected,
        }))
    }

    /// The limits frames are checked against.
    pub fn limits(&self) -> FrameLimits {
        self.limits
    }

    /// Whether a call failed; the stream must then be closed.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Whether the peer sent a frame flagged [`FrameFlags::END_OF_STREAM`].
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// Bytes of an incomplete frame held, waiting for the rest (0 between frames).
    pub fn pending_len(&self) -> usize {
        if self.holds_frame { 0 } else { self.buf.len() }
    }

    /// Bytes of memory the decoder's buffer holds, for metrics and memory accounting.
    /// Never more than [`FrameLimits::max_frame_len`].
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Moves bytes from `input` into the buffer until it holds `target` bytes or `input`
    /// is empty.
    fn fill(&mut self, input: &mut &[u8], target: usize) {
        let take = target.saturating_sub(self.buf.len()).min(input.len());
        let (head, tail) = input.split_at(take);
        self.reserve(take, target);
        self.buf.extend_from_slice(head);
        *input = tail;
    }

    /// Makes room for `additional` more bytes of a frame that is `target` bytes long.
    /// Grows geometrically with the bytes that arrive (a peer announcing a large frame and
    /// sending it slowly does not get the whole limit reserved at once), but never past
    /// `target`, which the header check has bounded by the limit.
    fn reserve(&mut self, additional: usize, target: usize) {
        let needed = self.buf.len() + additional;
        if needed <= self.buf.capacity() {
            return;
        }
        let doubled = self.buf.capacity().saturating_mul(2).max(HEADER_LEN);
        let capacity = needed.max(doubled.min(target));
        self.buf.reserve_exact(capacity - self.buf.len());
    }

    fn fail(&mut self, error: FrameError) -> FrameError {
        self.poisoned = true;
        self.buf.clear();
        self.header = None;
        self.holds_frame = false;
        error
    }
}
