//! Bytes over relayed connections, counted where they are read and written.
//!
//! The relay client's transport carries every connection this peer makes or accepts
//! through a relay; its multiplexer is wrapped in [`Counted`], so that each stream on such
//! a connection adds what it reads and writes to the network counters
//! (`murmur_net_relayed_bytes_total`). Direct connections pay nothing for it.

use std::io::{self, IoSlice, IoSliceMut};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{AsyncRead, AsyncWrite};
use libp2p::core::muxing::{StreamMuxer, StreamMuxerBox, StreamMuxerEvent, SubstreamBox};

use super::metrics::NetMetrics;

/// A relayed connection's multiplexer whose streams count their bytes.
pub(crate) struct Counted {
    inner: StreamMuxerBox,
    metrics: Arc<NetMetrics>,
}

impl Counted {
    pub(crate) fn new(inner: StreamMuxerBox, metrics: Arc<NetMetrics>) -> Counted {
        Counted { inner, metrics }
    }

    fn wrap(&self, stream: SubstreamBox) -> CountedStream {
        CountedStream {
            inner: stream,
            metrics: Arc::clone(&self.metrics),
        }
    }
}

impl StreamMuxer for Counted {
    type Substream = CountedStream;
    type Error = io::Error;

    fn poll_inbound(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<CountedStream, io::Error>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_inbound(cx) {
            Poll::Ready(Ok(stream)) => Poll::Ready(Ok(this.wrap(stream))),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_outbound(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<CountedStream, io::Error>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_outbound(cx) {
            Poll::Ready(Ok(stream)) => Poll::Ready(Ok(this.wrap(stream))),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Pin::new(&mut self.get_mut().inner).poll_close(cx)
    }

    fn poll(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<StreamMuxerEvent, io::Error>> {
        Pin::new(&mut self.get_mut().inner).poll(cx)
    }
}

/// A stream of a relayed connection; what it moves goes to the counters.
pub(crate) struct CountedStream {
    inner: SubstreamBox,
    metrics: Arc<NetMetrics>,
}

impl CountedStream {
    fn count(&self, result: &Poll<io::Result<usize>>, sent: bool) {
        if let Poll::Ready(Ok(n)) = result {
            self.metrics.relayed(*n as u64, sent);
        }
    }
}

impl AsyncRead for CountedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.count(&result, false);
        result
    }

    fn poll_read_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_read_vectored(cx, bufs);
        this.count(&result, false);
        result
    }
}

impl AsyncWrite for CountedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.count(&result, true);
        result
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.count(&result, true);
        result
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_close(cx)
    }
}
