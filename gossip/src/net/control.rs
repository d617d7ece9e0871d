//! The request-response codec of the control protocol: one murmur frame each way.
//!
//! Requests and responses are whole frames ([`murmur_protocol::frame`]): the 12-byte header
//! is read and checked against the control [`FrameLimits`] before a byte of payload is
//! reserved, so a peer cannot make us buffer more than the limit. The frame is kept as bytes
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
use murmur_protocol::message::Message;

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
    limits: FrameLimits,
}

impl ControlCodec {
    pub(crate) fn new(limits: FrameLimits) -> ControlCodec {
        ControlCodec { limits }
    }

    async fn read_frame<T>(&self, io: &mut T) -> io::Result<ControlFrame>
    where
        T: AsyncRead + Unpin + Send,
    {
        let mut header = [0u8; HEADER_LEN];
        io.read_exact(&mut header).await?;
        let parsed = FrameHeader::parse(&header, &self.limits)
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
        self.read_frame(io).await
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<ControlFrame>
    where
        T: AsyncRead + Unpin + Send,
    {
        self.read_frame(io).await
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
