//! [`NetHandle`]: how the rest of murmur talks to the network task.
//!
//! A handle is cheap to clone. Every method sends one command over the bounded command
//! queue and waits for the answer, both under `net.command_timeout_ms` (or the longer
//! bound of the operation), so a stuck network task shows up as [`NetError::Timeout`],
//! never as a hang. Tensor streams are opened from the calling task, not the network task,
//! so a slow peer slows only the caller that writes to it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use libp2p::{Multiaddr, StreamProtocol};
use murmur_protocol::identity::{
    Keypair, PayloadType, PeerId, RevocationError, Revocations, SignedEnvelope,
};
use murmur_protocol::message::{HeartbeatBody, Message};
use tokio::sync::{broadcast, mpsc, oneshot};

use super::NetEvent;
use super::bandwidth::{BandwidthEstimator, PeerBandwidth};
use super::bootstrap::BootstrapDial;
use super::config::ValidConfig;
use super::control::ControlFrame;
use super::error::NetError;
use super::identity::to_libp2p;
use super::metrics::NetMetrics;
use super::tensor_stream::{StreamContext, TensorStreamWriter};

/// A request from a handle to the network task; each carries the channel its answer
/// goes back on.
pub(crate) enum Command {
    ListenAddrs(oneshot::Sender<Vec<Multiaddr>>),
    Peers(oneshot::Sender<Vec<PeerId>>),
    KnownPeers(oneshot::Sender<Vec<PeerId>>),
    Dial(Multiaddr, oneshot::Sender<Result<(), NetError>>),
    Disconnect(libp2p::PeerId, oneshot::Sender<()>),
    Publish(Vec<u8>, oneshot::Sender<Result<(), NetError>>),
    WaitReady(libp2p::PeerId, oneshot::Sender<Result<(), NetError>>),
    SendControl(
        libp2p::PeerId,
        ControlFrame,
        oneshot::Sender<Result<ControlFrame, NetError>>,
    ),
    RespondControl(u64, ControlFrame, oneshot::Sender<Result<(), NetError>>),
    Revoke(
        Box<Revocations>,
        oneshot::Sender<Result<bool, RevocationError>>,
    ),
    Shutdown(oneshot::Sender<()>),
}

/// A control request from an authorized peer, waiting for the application's answer
/// ([`NetHandle::respond_control`]). Unanswered requests expire after
/// `net.request_timeout_ms`.
#[derive(Debug)]
pub struct InboundControl {
    /// The peer that asked.
    pub peer: PeerId,
    /// Names the request in [`NetHandle::respond_control`].
    pub id: u64,
    /// The request: one whole frame, header checked against the control limits.
    pub frame: ControlFrame,
}

/// What the network task hands to the application: accepted tensor streams and control
/// requests from authorized peers. Both queues are bounded; what arrives while one is
/// full is refused.
#[derive(Debug)]
pub struct NetInbound {
    /// Tensor streams from authorized peers, not yet read.
    pub tensor_streams: mpsc::Receiver<super::TensorStreamReader>,
    /// Control requests from authorized peers.
    pub control_requests: mpsc::Receiver<InboundControl>,
}

/// A cloneable handle on the network task.
#[derive(Clone)]
pub struct NetHandle {
    inner: Arc<HandleInner>,
}

struct HandleInner {
    local: PeerId,
    keypair: Arc<Keypair>,
    commands: mpsc::Sender<Command>,
    streams: libp2p_stream::Control,
    tensor_protocol: StreamProtocol,
    events: broadcast::Sender<NetEvent>,
    ctx: StreamContext,
    config: ValidConfig,
    bootstrap: Arc<Mutex<Vec<BootstrapDial>>>,
    /// The timestamp of this node's last heartbeat, in wall milliseconds.
    last_heartbeat_ms: AtomicU64,
    /// What this process's heartbeats name it by: drawn at start, never 0.
    incarnation: u64,
}

impl NetHandle {
    pub(crate) fn new(
        keypair: Arc<Keypair>,
        commands: mpsc::Sender<Command>,
        streams: libp2p_stream::Control,
        events: broadcast::Sender<NetEvent>,
        ctx: StreamContext,
        config: ValidConfig,
        bootstrap: Arc<Mutex<Vec<BootstrapDial>>>,
    ) -> NetHandle {
        NetHandle {
            inner: Arc::new(HandleInner {
                local: keypair.peer_id(),
                keypair,
                commands,
                streams,
                tensor_protocol: config.tensor_protocol(),
                events,
                ctx,
                config,
                bootstrap,
                last_heartbeat_ms: AtomicU64::new(0),
                incarnation: draw_incarnation(),
            }),
        }
    }

    /// The last result of the dials to each bootstrap address (`net.bootstrap`), in the
    /// config's order.
    pub fn bootstrap_dials(&self) -> Vec<BootstrapDial> {
        self.inner
            .bootstrap
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// This peer's id.
    pub fn local_peer_id(&self) -> PeerId {
        self.inner.local
    }

    /// The addresses this peer listens on (with concrete ports).
    pub async fn listen_addrs(&self) -> Result<Vec<Multiaddr>, NetError> {
        self.ask(Command::ListenAddrs).await
    }

    /// Connected peers whose invite has verified.
    pub async fn peers(&self) -> Result<Vec<PeerId>, NetError> {
        self.ask(Command::Peers).await
    }

    /// Authorized peers in the DHT routing table, connected or not.
    pub async fn known_peers(&self) -> Result<Vec<PeerId>, NetError> {
        self.ask(Command::KnownPeers).await
    }

    /// Dials `addr` (a peer found out of band).
    pub async fn dial(&self, addr: Multiaddr) -> Result<(), NetError> {
        self.ask(|reply| Command::Dial(addr, reply)).await?
    }

    /// Closes every connection to `peer`. A peer that crashed and came back under the same
    /// id must meet this one on a fresh connection: gossipsub announces its subscriptions
    /// only on a peer's first connection, so a stale one left open (until the QUIC idle
    /// timeout) would leave the two deaf to each other's heartbeats.
    pub async fn disconnect(&self, peer: &PeerId) -> Result<(), NetError> {
        let remote = to_libp2p(peer);
        self.ask(|reply| Command::Disconnect(remote, reply)).await
    }

    /// The timestamp for this node's next heartbeat at wall time `wall_ms`: `wall_ms`, or
    /// one past the last one given if that is not earlier. Members refuse a heartbeat whose
    /// timestamp is not after its signer's last as replayed, so two heartbeats stamped in
    /// one millisecond would lose the second, and with it the newer state.
    pub fn heartbeat_timestamp(&self, wall_ms: u64) -> u64 {
        let next = |last: u64| last.saturating_add(1).max(wall_ms);
        let last = self
            .inner
            .last_heartbeat_ms
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
                Some(next(last))
            })
            .unwrap_or_else(|last| last);
        next(last)
    }

    /// The number this process's heartbeats carry as
    /// [`HeartbeatBody::incarnation`]: drawn when the node started, so that members tell a
    /// restarted peer from the process they knew under its key.
    pub fn incarnation(&self) -> u64 {
        self.inner.incarnation
    }

    /// Signs `body` and gossips it to the swarm. Its timestamp should come from
    /// [`NetHandle::heartbeat_timestamp`].
    pub async fn publish_heartbeat(&self, body: &HeartbeatBody) -> Result<(), NetError> {
        let bytes = body.to_bytes().map_err(NetError::Encode)?;
        let envelope = SignedEnvelope::seal(&self.inner.keypair, PayloadType::HEARTBEAT, &bytes)
            .map_err(NetError::Seal)?;
        self.ask(|reply| Command::Publish(envelope.into_bytes(), reply))
            .await?
    }

    /// Adopts `list` as the swarm's revocation list if it is the authority's, for this
    /// swarm, and newer than the one held (`Ok(false)` when it is not newer): revoked peers
    /// are disconnected and refused from now on, and the list is gossiped to the swarm.
    pub async fn adopt_revocations(&self, list: Revocations) -> Result<bool, NetError> {
        self.ask(|reply| Command::Revoke(Box::new(list), reply))
            .await?
            .map_err(|e| NetError::Revocation(e.to_string()))
    }

    /// Events (peers authorized, rejected, gone; heartbeats) from now on. A subscriber more
    /// than `net.event_capacity` events behind loses the oldest.
    pub fn subscribe(&self) -> broadcast::Receiver<NetEvent> {
        self.inner.events.subscribe()
    }

    /// Waits (bounded) until both this peer and `peer` have verified each other's invite,
    /// dialing it if needed.
    pub async fn wait_ready(&self, peer: &PeerId) -> Result<(), NetError> {
        let remote = to_libp2p(peer);
        let raw = &self.inner.config.raw;
        let wait = ValidConfig::ms(
            raw.auth_timeout_ms
                .saturating_add(raw.stream_open_timeout_ms),
        );
        self.ask_within(|reply| Command::WaitReady(remote, reply), wait)
            .await?
    }

    /// Opens a tensor stream to `peer`, dialing it if needed and waiting (bounded) until
    /// both sides have verified each other's invite.
    pub async fn open_tensor_stream(&self, peer: &PeerId) -> Result<TensorStreamWriter, NetError> {
        self.wait_ready(peer).await?;
        let remote = to_libp2p(peer);
        let raw = &self.inner.config.raw;
        let open_timeout = ValidConfig::ms(raw.stream_open_timeout_ms);
        let mut control = self.inner.streams.clone();
        let open = control.open_stream(remote, self.inner.tensor_protocol.clone());
        let stream = match tokio::time::timeout(open_timeout, open).await {
            Err(_) => {
                return Err(NetError::Timeout {
                    what: "opening a tensor stream",
                    after: open_timeout,
                });
            }
            Ok(Err(e)) => {
                return Err(NetError::OpenStream {
                    peer: *peer,
                    reason: e.to_string(),
                });
            }
            Ok(Ok(stream)) => stream,
        };
        Ok(TensorStreamWriter::new(
            *peer,
            stream,
            self.inner.ctx.clone(),
        ))
    }

    /// Sends a control message to an authorized peer and waits (at most
    /// `net.request_timeout_ms`) for its answer, one whole frame. A request whose connection
    /// closes under it is sent again (at most twice) while the peer is still connected, so
    /// the peer must answer a repeated request as it answered the first.
    pub async fn send_control(
        &self,
        peer: &PeerId,
        message: &Message<'_>,
    ) -> Result<ControlFrame, NetError> {
        let frame = ControlFrame::encode(message)?;
        let raw = &self.inner.config.raw;
        let wait = ValidConfig::ms(
            raw.request_timeout_ms
                .saturating_add(raw.command_timeout_ms),
        );
        self.ask_within(
            |reply| Command::SendControl(to_libp2p(peer), frame, reply),
            wait,
        )
        .await?
    }

    /// How long a control request waits for its answer (`net.request_timeout_ms`).
    pub fn request_timeout(&self) -> std::time::Duration {
        ValidConfig::ms(self.inner.config.raw.request_timeout_ms)
    }

    /// Answers the control request `id` (from [`NetInbound::control_requests`]).
    pub async fn respond_control(&self, id: u64, message: &Message<'_>) -> Result<(), NetError> {
        let frame = ControlFrame::encode(message)?;
        self.ask(|reply| Command::RespondControl(id, frame, reply))
            .await?
    }

    /// The network layer's counters.
    pub fn metrics(&self) -> &NetMetrics {
        &self.inner.ctx.metrics
    }

    /// The network layer's counters, shared.
    pub fn metrics_arc(&self) -> Arc<NetMetrics> {
        Arc::clone(&self.inner.ctx.metrics)
    }

    /// The measured throughput to and from `peer`.
    pub fn bandwidth(&self, peer: &PeerId) -> PeerBandwidth {
        self.inner.ctx.bandwidth.get(peer)
    }

    /// The estimator every tensor stream reports to.
    pub fn bandwidth_estimator(&self) -> &BandwidthEstimator {
        &self.inner.ctx.bandwidth
    }

    /// Stops the network task: every connection is closed. Later calls on any handle
    /// return [`NetError::Stopped`].
    pub async fn shutdown(&self) -> Result<(), NetError> {
        self.ask(Command::Shutdown).await
    }

    async fn ask<T>(
        &self,
        command: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, NetError> {
        let wait = ValidConfig::ms(self.inner.config.raw.command_timeout_ms);
        self.ask_within(command, wait).await
    }

    /// Sends a command and waits for its answer, each step bounded.
    async fn ask_within<T>(
        &self,
        command: impl FnOnce(oneshot::Sender<T>) -> Command,
        answer_within: std::time::Duration,
    ) -> Result<T, NetError> {
        let (reply, answer) = oneshot::channel();
        let send_within = ValidConfig::ms(self.inner.config.raw.command_timeout_ms);
        match tokio::time::timeout(send_within, self.inner.commands.send(command(reply))).await {
            Err(_) => {
                return Err(NetError::Timeout {
                    what: "queueing a command for the network task",
                    after: send_within,
                });
            }
            Ok(Err(_)) => return Err(NetError::Stopped),
            Ok(Ok(())) => {}
        }
        match tokio::time::timeout(answer_within, answer).await {
            Err(_) => Err(NetError::Timeout {
                what: "waiting for the network task",
                after: answer_within,
            }),
            Ok(Err(_)) => Err(NetError::Stopped),
            Ok(Ok(value)) => Ok(value),
        }
    }
}

impl std::fmt::Debug for NetHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetHandle")
            .field("local", &self.inner.local)
            .finish_non_exhaustive()
    }
}

/// Seconds since the unix epoch, as invites count them; 0 if the clock is before 1970.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A fresh incarnation number: random, or the wall clock's nanoseconds where the OS gives
/// no randomness (two starts of one key are seconds apart); never 0, which means unknown.
fn draw_incarnation() -> u64 {
    let drawn = getrandom::u64().unwrap_or_else(|_| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |since| since.as_nanos() as u64)
    });
    drawn.max(1)
}
