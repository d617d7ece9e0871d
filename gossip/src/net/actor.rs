//! The network task: the one owner of the libp2p [`Swarm`].
//!
//! It waits on three things at once — swarm events (inbound tensor streams among them),
//! commands from handles, and a periodic tick — and handles each without awaiting anything
//! else, so a slow peer can never stall it. Work that waits on a peer (writing or reading a
//! tensor stream) happens in the caller's task, on a stream the network task handed over.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use libp2p::multiaddr::Protocol;
use libp2p::request_response::{OutboundRequestId, ResponseChannel};
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{ConnectionId, DialError};
use libp2p::{Multiaddr, Swarm, gossipsub};
use murmur_protocol::identity::PeerId;
use tokio::sync::{broadcast, mpsc, oneshot};

use super::NetEvent;
use super::auth::{Admitted, Authorizer};
use super::behaviour::MurmurBehaviour;
use super::bootstrap::BootstrapDials;
use super::config::ValidConfig;
use super::control::ControlFrame;
use super::error::NetError;
use super::handle::{Command, InboundControl, unix_now};
use super::heartbeat_freshness::HeartbeatFreshness;
use super::identity::from_libp2p;
use super::invites::VerifiedInvites;
use super::partial_frames::PartialFrameBudget;
use super::revocations::{Origin, RevocationState};
use super::tensor_stream::{StreamContext, StreamSlot, TensorStreamReader};

/// How often deadlines (auth, invite expiry, expired requests) are checked.
const TICK: Duration = Duration::from_millis(200);
/// How long a refused peer keeps its connection for our refusal to reach it.
const REFUSAL_GRACE: Duration = Duration::from_millis(500);
/// Most addresses kept per peer for the DHT.
const MAX_ADDRS_PER_PEER: usize = 8;
/// Verified invites remembered per allowed connection: room for the peers connected now
/// and for three times as many that have gone but may still be heard through others.
pub(crate) const VERIFIED_INVITES_PER_CONNECTION: usize = 4;

/// Which counter a refusal goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The peer's invite (in its hello, or in its answer to ours) did not verify; counts
    /// towards its ban.
    Rejected,
    /// The exchange failed without the peer's invite being at fault (it refused ours, or
    /// the stream broke): counted as a rejection, not towards a ban.
    Failed,
    /// The peer did not finish the auth exchange in time.
    TimedOut,
}

/// What the network task knows about one connected peer.
#[derive(Debug)]
pub(crate) struct PeerState {
    /// The murmur id; `None` for a peer whose key is not ed25519 (never authorized).
    pub(crate) id: Option<PeerId>,
    pub(crate) connected_at: Instant,
    /// Our check of the peer's invite passed.
    pub(crate) admitted: Option<Admitted>,
    /// The peer answered our hello with its own: it accepted us.
    pub(crate) accepted_us: bool,
    /// The hello request we sent, until it is answered.
    pub(crate) hello_request: Option<OutboundRequestId>,
    /// The peer failed auth; it is disconnected once our refusal has gone out.
    pub(crate) refused_at: Option<Instant>,
    /// Addresses the peer can be dialed at.
    pub(crate) addrs: Vec<Multiaddr>,
    pub(crate) in_dht: bool,
    /// Inbound tensor streams the peer has open now.
    pub(crate) inbound_open: Arc<AtomicU32>,
    /// Bytes its inbound streams hold in incomplete frames, all together.
    pub(crate) partial_bytes: Arc<AtomicU64>,
    /// Its open connections, oldest first.
    pub(crate) connections: Vec<ConnectionId>,
    /// The connections it had when it was admitted: the admitted process's own, so a
    /// hello on one of them is not a restart
    /// ([`hello_means_restart`](super::swarm_events::hello_means_restart)).
    pub(crate) admitted_on: Vec<ConnectionId>,
    /// It restarted while its old connections were open: announce our topics again once
    /// only its fresh connection is left.
    pub(crate) reannounce_when_alone: bool,
}

impl PeerState {
    pub(crate) fn new(id: Option<PeerId>) -> PeerState {
        PeerState {
            id,
            connected_at: Instant::now(),
            admitted: None,
            accepted_us: false,
            hello_request: None,
            refused_at: None,
            addrs: Vec::new(),
            in_dht: false,
            inbound_open: Arc::new(AtomicU32::new(0)),
            partial_bytes: Arc::new(AtomicU64::new(0)),
            connections: Vec::new(),
            admitted_on: Vec::new(),
            reannounce_when_alone: false,
        }
    }

    /// Both sides have verified each other: tensor streams may flow.
    pub(crate) fn is_ready(&self) -> bool {
        self.admitted.is_some() && self.accepted_us && self.refused_at.is_none()
    }

    /// Adds a dialable address (without its `/p2p` suffix), keeping at most a few; returns
    /// it when it is new.
    pub(crate) fn add_addr(&mut self, addr: &Multiaddr) -> Option<Multiaddr> {
        let mut addr = addr.clone();
        if matches!(addr.iter().last(), Some(Protocol::P2p(_))) {
            addr.pop();
        }
        let unspecified = addr.iter().any(|p| match p {
            Protocol::Ip4(ip) => ip.is_unspecified(),
            Protocol::Ip6(ip) => ip.is_unspecified(),
            _ => false,
        });
        if !unspecified && !self.addrs.contains(&addr) && self.addrs.len() < MAX_ADDRS_PER_PEER {
            self.addrs.push(addr.clone());
            return Some(addr);
        }
        None
    }
}

/// How often a control request whose connection closed under it (or whose stream failed)
/// is sent again to the same peer while it is still connected. AutoNAT's dial-backs open a
/// second connection that the dialing side closes at once, and request-response spreads
/// requests over every connection to a peer, so a request may go out on one just before
/// it closes. Control requests are therefore answered the same however often they come.
pub(crate) const CONTROL_RESENDS: u8 = 2;

/// A control request sent, until its answer comes.
#[derive(Debug)]
pub(crate) struct PendingControl {
    /// Kept to send again (control requests are small).
    pub(crate) frame: ControlFrame,
    pub(crate) reply: oneshot::Sender<Result<ControlFrame, NetError>>,
    /// Times it was sent again (at most [`CONTROL_RESENDS`]).
    pub(crate) resends: u8,
}

/// The network task's state.
pub(crate) struct NetActor {
    pub(crate) swarm: Swarm<MurmurBehaviour>,
    pub(crate) config: ValidConfig,
    pub(crate) authorizer: Authorizer,
    pub(crate) topic: gossipsub::TopicHash,
    pub(crate) ctx: StreamContext,
    pub(crate) events: broadcast::Sender<NetEvent>,
    pub(crate) inbound_streams: mpsc::Sender<TensorStreamReader>,
    pub(crate) inbound_control: mpsc::Sender<InboundControl>,
    pub(crate) peers: HashMap<libp2p::PeerId, PeerState>,
    pub(crate) waiters: HashMap<libp2p::PeerId, Vec<oneshot::Sender<Result<(), NetError>>>>,
    pub(crate) requests: HashMap<OutboundRequestId, PendingControl>,
    pub(crate) responses: HashMap<u64, ResponseChannel<ControlFrame>>,
    pub(crate) next_response_id: u64,
    pub(crate) listen_addrs: Vec<Multiaddr>,
    /// Dials to addresses without a peer id, until they connect or fail: a peer being waited
    /// for may be at the end of one of them.
    pub(crate) anonymous_dials: HashSet<ConnectionId>,
    /// The dials to the bootstrap addresses, followed to their end.
    pub(crate) bootstrap: BootstrapDials,
    /// Peers whose invite this node verified, connected or not: whose heartbeats count.
    pub(crate) invites: VerifiedInvites,
    /// The last heartbeat time of each signer, for dropping stale and replayed ones.
    pub(crate) freshness: HeartbeatFreshness,
    /// When refused gossip was last logged at warn.
    pub(crate) gossip_refusals_warned_at: Option<Instant>,
    /// Refused gossip messages logged at debug since then.
    pub(crate) gossip_refusals_unwarned: u64,
    /// The swarm's revocation list: its file, topic and gossip schedule.
    pub(crate) revocation: RevocationState,
    /// The peers this node admitted, shared with its relay (which serves only them).
    pub(crate) members: super::nat::Members,
    /// Reachability, relays and connection kinds.
    pub(crate) nat: super::nat_events::NatState,
}

impl NetActor {
    /// Runs until shutdown or until every handle is dropped.
    pub(crate) async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut shutdown_reply = None;
        loop {
            tokio::select! {
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
                command = commands.recv() => match command {
                    None => break,
                    Some(Command::Shutdown(reply)) => {
                        shutdown_reply = Some(reply);
                        break;
                    }
                    Some(command) => self.on_command(command),
                },
                _ = tick.tick() => self.on_tick(),
            }
        }
        let connected: Vec<_> = self.swarm.connected_peers().copied().collect();
        for peer in connected {
            let _ = self.swarm.disconnect_peer_id(peer);
        }
        for (_, waiters) in self.waiters.drain() {
            for waiter in waiters {
                let _ = waiter.send(Err(NetError::Stopped));
            }
        }
        tracing::info!("network task stopped");
        if let Some(reply) = shutdown_reply {
            let _ = reply.send(());
        }
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::ListenAddrs(reply) => {
                let _ = reply.send(self.listen_addrs.clone());
            }
            Command::Peers(reply) => {
                let peers = self
                    .peers
                    .values()
                    .filter(|p| p.is_ready())
                    .filter_map(|p| p.id)
                    .collect();
                let _ = reply.send(peers);
            }
            Command::KnownPeers(reply) => {
                let mut known = Vec::new();
                for bucket in self.swarm.behaviour_mut().kad.kbuckets() {
                    for entry in bucket.iter() {
                        if let Ok(id) = from_libp2p(entry.node.key.preimage()) {
                            known.push(id);
                        }
                    }
                }
                let _ = reply.send(known);
            }
            Command::Dial(addr, reply) => {
                let result = self.dial_addr(addr.clone()).map_err(|e| NetError::Dial {
                    addr: addr.to_string(),
                    reason: e.to_string(),
                });
                let _ = reply.send(result);
            }
            Command::Disconnect(peer, reply) => {
                // Not connected is fine: there is nothing to close.
                let _ = self.swarm.disconnect_peer_id(peer);
                let _ = reply.send(());
            }
            Command::Publish(envelope, reply) => {
                let result = self
                    .swarm
                    .behaviour_mut()
                    .gossipsub
                    .publish(self.topic.clone(), envelope)
                    .map(|_| ())
                    .map_err(|e| NetError::Publish(e.to_string()));
                let _ = reply.send(result);
            }
            Command::WaitReady(peer, reply) => self.wait_ready(peer, reply),
            Command::SendControl(peer, frame, reply) => {
                let ready = self.peers.get(&peer).is_some_and(PeerState::is_ready);
                if !ready {
                    let _ = reply.send(Err(for_peer(&peer, |id| NetError::NotAuthorized {
                        peer: id,
                        reason: "no verified connection to it".to_owned(),
                    })));
                    return;
                }
                let pending = PendingControl {
                    frame,
                    reply,
                    resends: 0,
                };
                self.send_control(peer, pending);
            }
            Command::RespondControl(id, frame, reply) => {
                let result = match self.responses.remove(&id) {
                    None => Err(NetError::UnknownRequest { id }),
                    Some(channel) => self
                        .swarm
                        .behaviour_mut()
                        .control
                        .send_response(channel, frame)
                        .map_err(|_| NetError::UnknownRequest { id }),
                };
                let _ = reply.send(result);
            }
            Command::Revoke(list, reply) => {
                let _ = reply.send(self.adopt_revocations(*list, Origin::Handle));
            }
            // Handled by the loop.
            Command::Shutdown(_) => {}
        }
    }

    /// Sends `pending`'s request to `peer` and keeps it until its answer or failure.
    pub(crate) fn send_control(&mut self, peer: libp2p::PeerId, pending: PendingControl) {
        let frame = pending.frame.clone();
        let id = self
            .swarm
            .behaviour_mut()
            .control
            .send_request(&peer, frame);
        self.requests.insert(id, pending);
    }

    /// Answers when `peer` is ready for tensor streams, dialing it if needed.
    fn wait_ready(&mut self, peer: libp2p::PeerId, reply: oneshot::Sender<Result<(), NetError>>) {
        if let Some(state) = self.peers.get(&peer) {
            if state.is_ready() {
                let _ = reply.send(Ok(()));
                return;
            }
            if state.refused_at.is_some() {
                let _ = reply.send(Err(for_peer(&peer, |id| NetError::NotAuthorized {
                    peer: id,
                    reason: "it failed authorization on this connection".to_owned(),
                })));
                return;
            }
        }
        if !self.swarm.is_connected(&peer) {
            let opts = DialOpts::peer_id(peer)
                .condition(PeerCondition::DisconnectedAndNotDialing)
                .build();
            match self.swarm.dial(opts) {
                // Dialing now, or already: the connection (or its failure) wakes the waiter.
                Ok(()) | Err(DialError::DialPeerConditionFalse(_)) => {}
                // No address known; only a dial to an address without a peer id may still
                // turn out to reach it.
                Err(DialError::NoAddresses) if !self.anonymous_dials.is_empty() => {}
                Err(e) => {
                    let reason = format!("not connected, and the dial failed: {e}");
                    let _ = reply.send(Err(for_peer(&peer, |id| NetError::OpenStream {
                        peer: id,
                        reason,
                    })));
                    return;
                }
            }
        }
        let waiters = self.waiters.entry(peer).or_default();
        // Callers give up after their own timeout; drop their closed slots first.
        waiters.retain(|w| !w.is_closed());
        waiters.push(reply);
    }

    /// Hands an inbound tensor stream to the application, or drops it unread.
    pub(crate) fn on_inbound_stream(&mut self, peer: libp2p::PeerId, stream: libp2p::Stream) {
        let metrics = &self.ctx.metrics;
        let Some(state) = self.peers.get(&peer) else {
            metrics.tensor_stream_refused_unauthorized();
            tracing::debug!(%peer, "tensor stream from an unknown peer dropped unread");
            return;
        };
        let (Some(id), Some(_)) = (state.id, state.admitted) else {
            metrics.tensor_stream_refused_unauthorized();
            tracing::warn!(%peer, "tensor stream from a peer not authorized dropped unread");
            return;
        };
        if state.refused_at.is_some() {
            metrics.tensor_stream_refused_unauthorized();
            return;
        }
        let limit = self.config.raw.max_inbound_tensor_streams_per_peer;
        let Some(slot) = StreamSlot::try_take(&state.inbound_open, limit) else {
            metrics.tensor_stream_refused_limit();
            tracing::warn!(%peer, limit, "too many tensor streams from one peer; dropped unread");
            return;
        };
        let budget =
            PartialFrameBudget::new(Arc::clone(&state.partial_bytes), self.ctx.partial_budget);
        let reader = TensorStreamReader::new(id, stream, self.ctx.clone(), slot, budget);
        match self.inbound_streams.try_send(reader) {
            Ok(()) => metrics.tensor_stream_accepted(),
            Err(_) => {
                metrics.tensor_stream_refused_limit();
                tracing::warn!(%peer, "inbound tensor stream queue full; stream dropped unread");
            }
        }
    }

    /// Enforces every deadline.
    fn on_tick(&mut self) {
        let now = Instant::now();
        self.revocations_tick(now);
        self.nat_tick(now);
        let now_unix = unix_now();
        let auth_timeout = ValidConfig::ms(self.config.raw.auth_timeout_ms);
        let mut timed_out = Vec::new();
        let mut expired = Vec::new();
        let mut past_grace = Vec::new();
        for (peer, state) in &self.peers {
            if let Some(at) = state.refused_at {
                if now.duration_since(at) >= REFUSAL_GRACE {
                    past_grace.push(*peer);
                }
            } else if !state.is_ready() && now.duration_since(state.connected_at) >= auth_timeout {
                timed_out.push(*peer);
            } else if state.admitted.is_some_and(|a| a.expires_at <= now_unix) {
                expired.push(*peer);
            }
        }
        for peer in timed_out {
            self.refuse(
                &peer,
                Refusal::TimedOut,
                "did not finish the auth exchange in time".to_owned(),
            );
        }
        for peer in expired {
            self.refuse(&peer, Refusal::Rejected, "its invite expired".to_owned());
        }
        for peer in past_grace {
            let _ = self.swarm.disconnect_peer_id(peer);
        }
        for waiters in self.waiters.values_mut() {
            waiters.retain(|w| !w.is_closed());
        }
        self.waiters.retain(|_, w| !w.is_empty());
        self.responses.retain(|_, channel| channel.is_open());
        self.requests
            .retain(|_, pending| !pending.reply.is_closed());
    }

    /// Dials `addr`; by peer id when it ends in `/p2p/<id>`, so that the dial is known to be
    /// for that peer.
    pub(crate) fn dial_addr(&mut self, mut addr: Multiaddr) -> Result<(), DialError> {
        let original = addr.clone();
        if let Some(Protocol::P2p(peer)) = addr.iter().last() {
            addr.pop();
            // A peer's bootstrap addresses (its QUIC and TCP ones, say) are each dialed,
            // so that each gets its own answer: the first unreachable one must not hide
            // the others.
            let condition = if self.bootstrap.is_bootstrap(&original) {
                PeerCondition::Disconnected
            } else {
                PeerCondition::DisconnectedAndNotDialing
            };
            let opts = DialOpts::peer_id(peer)
                .addresses(vec![addr])
                .condition(condition)
                .build();
            let id = opts.connection_id();
            return match self.swarm.dial(opts) {
                Err(DialError::DialPeerConditionFalse(_)) => Ok(()),
                Ok(()) => {
                    self.bootstrap.dialing(id, &original);
                    Ok(())
                }
                Err(e) => Err(e),
            };
        }
        let opts = DialOpts::unknown_peer_id().address(addr).build();
        let id = opts.connection_id();
        self.swarm.dial(opts)?;
        self.anonymous_dials.insert(id);
        self.bootstrap.dialing(id, &original);
        Ok(())
    }

    /// Marks `peer` refused: counted (a refusal for its invite also towards its ban), logged, reported, forgotten by the record of verified
    /// invites, out of the DHT, and disconnected after a short grace so that our refusal can
    /// reach it. Idempotent.
    pub(crate) fn refuse(&mut self, peer: &libp2p::PeerId, kind: Refusal, reason: String) {
        let Some(state) = self.peers.get_mut(peer) else {
            return;
        };
        if state.refused_at.is_some() {
            return;
        }
        state.refused_at = Some(Instant::now());
        match kind {
            Refusal::Rejected => {
                self.ctx.metrics.auth_rejected();
                if let Some(ban) = self
                    .swarm
                    .behaviour_mut()
                    .admission
                    .refused_for_invite(*peer)
                {
                    tracing::warn!(%peer, ?ban, "peer refused for its invite too often; banned");
                }
            }
            Refusal::Failed => self.ctx.metrics.auth_rejected(),
            Refusal::TimedOut => self.ctx.metrics.auth_timeout(),
        }
        tracing::warn!(%peer, %reason, "peer not authorized; disconnecting");
        if let Ok(id) = from_libp2p(peer) {
            // What it proved before no longer counts, not even for heartbeats relayed by
            // others.
            self.invites.forget(&id);
            let _ = self.events.send(NetEvent::PeerRejected {
                peer: id,
                reason: reason.clone(),
            });
        }
        self.fail_waiters(peer, |id| NetError::NotAuthorized {
            peer: id,
            reason: reason.clone(),
        });
        self.remove_from_dht(peer);
    }

    pub(crate) fn fail_waiters(
        &mut self,
        peer: &libp2p::PeerId,
        error: impl Fn(PeerId) -> NetError,
    ) {
        if let Some(waiters) = self.waiters.remove(peer) {
            for waiter in waiters {
                let _ = waiter.send(Err(for_peer(peer, &error)));
            }
        }
    }

    /// Wakes everyone waiting for `peer` if it became ready.
    pub(crate) fn wake_if_ready(&mut self, peer: &libp2p::PeerId) {
        if !self.peers.get(peer).is_some_and(PeerState::is_ready) {
            return;
        }
        if let Some(waiters) = self.waiters.remove(peer) {
            for waiter in waiters {
                let _ = waiter.send(Ok(()));
            }
        }
    }

    /// Puts an admitted peer with known addresses into the DHT routing table.
    pub(crate) fn add_to_dht(&mut self, peer: &libp2p::PeerId) {
        let Some(state) = self.peers.get_mut(peer) else {
            return;
        };
        if state.in_dht || state.admitted.is_none() || state.addrs.is_empty() {
            return;
        }
        state.in_dht = true;
        let addrs = state.addrs.clone();
        let kad = &mut self.swarm.behaviour_mut().kad;
        for addr in addrs {
            kad.add_address(peer, addr);
        }
    }

    fn remove_from_dht(&mut self, peer: &libp2p::PeerId) {
        self.swarm.behaviour_mut().kad.remove_peer(peer);
        if let Some(state) = self.peers.get_mut(peer) {
            state.in_dht = false;
        }
    }
}

/// The error `make` builds for `peer`, or [`NetError::ForeignPeerId`] if it has no murmur id.
pub(crate) fn for_peer(peer: &libp2p::PeerId, make: impl FnOnce(PeerId) -> NetError) -> NetError {
    match from_libp2p(peer) {
        Ok(id) => make(id),
        Err(e) => e,
    }
}
