//! The request-response codec of the control protocol: one murmur frame each way.
//!
//! Requests and responses are whole frames ([`murmur_protocol::frame`]): the 12-byte header
//! is read and checked against the control [`FrameLimits`] before a byte of payload is
//! reserved, so a peer cannot make us buffer more than the limit. Responses may be larger,
//! up to a state-sync range of 1 MiB: they answer only this peer's own requests, so what
//! they can make it buffer is bounded by the requests it has in flight. The frame is kept as bytes
//! here; the network task decodes the message it holds.
//!
//! The reads here await network input without a timeout of their own: request-response
//! runs every inbound and outbound exchange under `net.request_timeout_ms` and drops the
//! stream (and this future) when it runs out.

use std::io;

use futures::prelude::*;
use libp2p::StreamProtocol;
use libp2p::request_response;
use murmur_protocol::frame::{FrameFlags, FrameHeader, FrameLimits, HEADER_LEN};
use murmur_protocol::message::{Message, state_sync_response_limits};

use super::error::NetError;

/// One encoded frame (header and payload) on the control protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlFrame(Vec<u8>);

impl ControlFrame {
    /// Encodes `message` as a frame.
    pub fn encode(message: &Message<'_>) -> Result<ControlFrame, NetError> {
        let mut bytes = vec![0u8; message.frame_len()];
        let written = message
            .encode_frame(FrameFlags::EMPTY, &mut bytes)
            .map_err(NetError::Encode)?;
        bytes.truncate(written);
        Ok(ControlFrame(bytes))
    }

    /// The frame's bytes, header included.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Wraps bytes read from the wire; they hold one whole frame whose header was checked.
    fn from_wire(bytes: Vec<u8>) -> ControlFrame {
        ControlFrame(bytes)
    }
}

/// Reads and writes [`ControlFrame`]s within a payload limit.
#[derive(Debug, Clone)]
pub(crate) struct ControlCodec {
    /// What requests are read within.
    limits: FrameLimits,
    /// What responses are read within: the same, raised to fit a state-sync range (see
    /// [`state_sync_response_limits`]).
    response_limits: FrameLimits,
}

impl ControlCodec {
    pub(crate) fn new(limits: FrameLimits) -> ControlCodec {
        ControlCodec {
            limits,
            response_limits: state_sync_response_limits(limits),
        }
    }

    async fn read_frame<T>(limits: &FrameLimits, io: &mut T) -> io::Result<ControlFrame>
    where
        T: AsyncRead + Unpin + Send,
    {
        let mut header = [0u8; HEADER_LEN];
        io.read_exact(&mut header).await?;
        let parsed = FrameHeader::parse(&header, limits)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let frame_len = parsed.frame_len();
        let mut bytes = Vec::with_capacity(frame_len);
        bytes.extend_from_slice(&header);
        bytes.resize(frame_len, 0);
        // The header check bounded frame_len by the control limit.
        io.read_exact(&mut bytes[HEADER_LEN..]).await?;
        Ok(ControlFrame::from_wire(bytes))
    }

    async fn write_frame<T>(io: &mut T, frame: ControlFrame) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        io.write_all(frame.as_bytes()).await?;
        io.flush().await
    }
}

impl request_response::Codec for ControlCodec {
    type Protocol = StreamProtocol;
    type Request = ControlFrame;
    type Response = ControlFrame;

    async fn read_request<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<ControlFrame>
    where
        T: AsyncRead + Unpin + Send,
    {
        Self::read_frame(&self.limits, io).await
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<ControlFrame>
    where
        T: AsyncRead + Unpin + Send,
    {
        Self::read_frame(&self.response_limits, io).await
    }

    async fn write_request<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        frame: ControlFrame,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        Self::write_frame(io, frame).await
    }

    async fn write_response<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        frame: ControlFrame,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        Self::write_frame(io, frame).await
    }
}

#[cfg(test)]
mod tests {
    use libp2p::request_response::Codec as _;
    use murmur_protocol::message::{MAX_STATE_RANGE_BYTES, StateSyncResponse};

    use super::*;

    fn range_of(len: usize) -> Vec<u8> {
        let payload = vec![7u8; len];
        let message = Message::StateSyncResponse(StateSyncResponse {
            offset: 0,
            total_len: len as u64,
            digest: [1; 32],
            last: true,
            payload: &payload,
        });
        ControlFrame::encode(&message)
            .expect("a range")
            .as_bytes()
            .to_vec()
    }

    /// A state-sync range of 1 MiB is read as a response past a 64 KiB control limit, and
    /// still refused as a request; one byte more is refused as a response too.
    #[tokio::test]
    async fn responses_are_read_up_to_a_state_range_and_requests_within_the_control_limit() {
        let mut codec = ControlCodec::new(FrameLimits::new(64 * 1024).expect("limits"));
        let protocol = StreamProtocol::new("/murmur/test/1");
        let range = range_of(MAX_STATE_RANGE_BYTES as usize);
        let read = codec
            .read_response(&protocol, &mut futures::io::Cursor::new(range.clone()))
            .await
            .expect("a whole range read as a response");
        assert_eq!(read.as_bytes(), &range[..]);
        let refused = codec
            .read_request(&protocol, &mut futures::io::Cursor::new(range))
            .await
            .expect_err("a request past the control limit");
        assert_eq!(refused.kind(), io::ErrorKind::InvalidData);
        let over = range_of(MAX_STATE_RANGE_BYTES as usize + 1);
        let refused = codec
            .read_response(&protocol, &mut futures::io::Cursor::new(over))
            .await
            .expect_err("a response past a state range");
        assert_eq!(refused.kind(), io::ErrorKind::InvalidData);
    }
}
