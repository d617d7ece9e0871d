//! The libp2p network layer: discovery, membership, authorization and tensor streams.
//!
//! # Design
//!
//! One task owns the libp2p [`Swarm`](libp2p::Swarm) ([`spawn`] starts it). Callers hold a
//! cloneable [`NetHandle`] that talks to the task over a bounded command queue; the task
//! answers each command on a oneshot channel. The task never awaits a peer: it reacts to
//! swarm events, commands, inbound tensor streams and a 200 ms tick, and hands streams to
//! the application, whose own tasks do the slow part (reading and writing tensors).
//!
//! The swarm runs QUIC (libp2p-quic) with TCP + noise + yamux as a fallback, identify,
//! ping, Kademlia under `/murmur/<swarm>/kad/1.0.0`, mDNS when enabled, gossipsub on
//! `murmur/<swarm>/heartbeat`, request-response on `/murmur/<swarm>/control/1`, and
//! tensor streams on `/murmur/<swarm>/tensor/1`: opened through libp2p-stream, taken in by
//! murmur's own behaviour (the `tensor_inbound` module), which drops none of those that
//! arrive together.
//!
//! # Authorization
//!
//! Every connection starts with an [`AuthHello`](murmur_protocol::message::AuthHello)
//! exchange over the control protocol (see the `auth` module), in which the dialer proves
//! its invite first. Until a peer is admitted, its Kademlia, identify and gossip streams
//! wait unanswered (the `gate` module), so a stranger learns no member, no address and no
//! heartbeat. Until a peer's invite has
//! verified against the swarm authority, swarm id, the transport-authenticated peer id and
//! the clock, its tensor streams are dropped unread, its gossip is rejected and it is kept
//! out of the DHT. A peer that fails, or does not finish within `net.auth_timeout_ms`, is
//! disconnected and counted in [`NetMetrics`]; so is a peer whose invite expires while it
//! is connected.
//!
//! Gossip relays, so a heartbeat is judged by its signer, not only by the peer that
//! forwarded it: it counts only if the forwarder is admitted *and* the signer holds an
//! invite this node verified in a hello and that has not run out (the `invites` module).
//! A member's heartbeats relayed by others while it is disconnected from us still count
//! until its invite expires; a key this node never verified counts for nothing, whoever
//! relays it, and is counted in
//! [`heartbeats_refused_uninvited_signer`](NetMetricsSnapshot::heartbeats_refused_uninvited_signer).
//! A heartbeat written further than `net.max_heartbeat_age_ms` from this node's clock, or
//! not after the last one accepted from its signer, is dropped as stale or replayed and
//! counted.
//!
//! The swarm authority can revoke invited peers with a signed, serial-numbered revocation
//! list (the `revocations` module): read from `swarm.revocation_file` whenever it
//! changes, or adopted from a member's gossip, the newest list refuses its peers' hellos,
//! closes their connections and drops their heartbeats.
//!
//! # Bounds
//!
//! Nothing waits without limit and nothing queues without limit:
//!
//! | what | bound |
//! |---|---|
//! | commands to the task | `net.command_capacity`; sending and answering each under `net.command_timeout_ms` |
//! | events to subscribers | broadcast of `net.event_capacity`; laggards lose the oldest |
//! | accepted inbound tensor streams | queue of `net.inbound_stream_capacity`; more are dropped unread |
//! | inbound control requests | queue of `net.control_capacity`; unanswered ones expire after `net.request_timeout_ms` |
//! | transport handshake | `net.handshake_timeout_ms` (QUIC, and TCP with noise and yamux) |
//! | auth exchange | `net.auth_timeout_ms` from connection to verified |
//! | opening a tensor stream | `net.auth_timeout_ms` + `net.stream_open_timeout_ms` |
//! | each tensor read | `net.tensor_read_timeout_ms` of silence |
//! | each inbound tensor frame | `net.frame_timeout_ms` from its first byte to its last |
//! | partial tensor frames held per peer | `net.max_partial_frame_bytes_per_peer`, all its streams together |
//! | each tensor frame write | `net.tensor_write_timeout_ms` of backpressure |
//! | tensor frame size | `net.max_frame_payload`, checked before allocation |
//! | control frame size | `net.max_control_payload`, checked before allocation |
//! | connections | `net.max_connections`, `net.max_connections_per_peer`, `net.max_pending_incoming` |
//! | connections per source IP | `net.max_pending_incoming_per_ip` in their handshake, `net.max_incoming_connections_per_ip` established |
//! | peers refused for their invite | banned after `net.ban_after_refusals` refusals for `net.ban_backoff_ms`, doubling to 64 × |
//! | streams | `net.max_inbound_tensor_streams_per_peer`; `net.max_streams_per_connection` per QUIC connection |
//! | gossip messages | 4 KiB; revocation lists 33 KiB (1,024 peers) |
//! | heartbeat age | `net.max_heartbeat_age_ms` either way from this node's clock; the last time of 4 × `net.max_connections` signers is kept for replays |
//! | verified invites remembered for relayed heartbeats | 4 × `net.max_connections`; expired ones dropped first, then the oldest verification |
//! | warnings about refused gossip | one per 30 s; the rest at debug |
//! | memory per slow receiver | `net.quic_connection_receive_window` (4 MB) and one frame |
//! | messages read and not yet taken by the averaging loop | 256 parcels and 4 MiB of payloads, every stream's together; idle payload buffers kept, 4 MiB |
//!
//! Bad bytes from a peer close that peer's stream (or connection) with a log line and a
//! counter; the task keeps serving everyone else.

mod actor;
mod admission;
mod auth;
mod bandwidth;
mod behaviour;
pub mod bench;
mod bootstrap;
mod config;
mod control;
mod disclosure;
pub mod driver;
mod error;
pub mod exchange;
mod gate;
mod gossip_heartbeats;
mod handle;
mod heartbeat_freshness;
mod heartbeat_keeper;
mod identity;
mod invites;
mod metrics;
mod nat;
mod nat_events;
mod partial_frames;
mod rate_limit;
mod relayed_bytes;
mod revocations;
mod swarm_events;
mod tensor_inbound;
mod tensor_stream;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use libp2p::swarm::SwarmEvent;
use libp2p::{SwarmBuilder, gossipsub, noise, tcp, yamux};
use murmur_protocol::identity::PeerId;
use murmur_protocol::message::HeartbeatBody;
use tokio::sync::{broadcast, mpsc};

pub use bandwidth::{BandwidthEstimator, Direction, PeerBandwidth};
pub use bootstrap::{BootstrapDial, DialResult};
pub use config::{MIN_QUIC_RECEIVE_WINDOW, NetConfig};
pub use control::ControlFrame;
pub use error::NetError;
pub use handle::{InboundControl, NetHandle, NetInbound};
pub use identity::NetIdentity;
pub use metrics::{ConnectionCounts, NetMetrics, NetMetricsSnapshot, PeerTraffic};
pub use nat::{Reachability, RelayConfig, RelayReserve};
pub use tensor_stream::{TensorStreamReader, TensorStreamWriter, TransferStats};

use actor::{NetActor, VERIFIED_INVITES_PER_CONNECTION};
use auth::Authorizer;
use behaviour::MurmurBehaviour;
use bootstrap::BootstrapDials;
use config::ValidConfig;
use heartbeat_freshness::HeartbeatFreshness;
use invites::VerifiedInvites;
use rate_limit::RateLimiter;
use tensor_stream::StreamContext;

/// How long [`spawn`] waits for its listeners to bind.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(5);

/// Something the network layer observed, broadcast to every [`NetHandle::subscribe`]r.
#[derive(Debug, Clone, PartialEq)]
pub enum NetEvent {
    /// A peer's invite verified.
    PeerAuthorized {
        /// The peer.
        peer: PeerId,
        /// When its invite runs out (unix seconds).
        invite_expires_at: u64,
    },
    /// A peer failed authorization (or its invite expired) and is being disconnected.
    PeerRejected {
        /// The peer.
        peer: PeerId,
        /// Why, for the log.
        reason: String,
    },
    /// An authorized peer's last connection closed.
    PeerDisconnected {
        /// The peer.
        peer: PeerId,
    },
    /// A heartbeat arrived by gossip, its signature verified, and its signer holds an invite
    /// this node verified and that is still valid (whoever forwarded it).
    Heartbeat {
        /// The peer that signed it.
        peer: PeerId,
        /// Its content.
        body: HeartbeatBody,
    },
}

/// Starts the network task on the current tokio runtime: listens on every address of the
/// config (waiting up to 5 s for each to bind), dials the bootstrap peers, and returns the
/// handle and the inbound queues.
pub async fn spawn(
    config: &NetConfig,
    identity: NetIdentity,
) -> Result<(NetHandle, NetInbound), NetError> {
    let config = config.validate()?;
    let raw = config.raw.clone();
    let authorizer = Authorizer::new(
        config.authority,
        config.swarm.clone(),
        config.control_limits,
        identity.keypair(),
        &config.invite,
    )?;

    let idle = ValidConfig::ms(raw.idle_connection_timeout_ms);
    let max_streams = raw.max_streams_per_connection;
    let windows = (
        raw.quic_stream_receive_window,
        raw.quic_connection_receive_window,
    );
    let metrics = Arc::new(NetMetrics::default());
    let handshake_timeout = ValidConfig::ms(raw.handshake_timeout_ms);
    let members = nat::Members::default();
    let (relay_transport, relay_client) =
        libp2p::relay::client::new(identity.libp2p().public().to_peer_id());
    let relayed_metrics = Arc::clone(&metrics);
    let mut failure = None;
    let mut swarm = SwarmBuilder::with_existing_identity(identity.libp2p().clone())
        .with_tokio()
        .with_tcp(
            tcp::Config::default().nodelay(true),
            noise::Config::new,
            yamux::Config::default,
        )
        .map_err(|e| NetError::Transport(e.to_string()))?
        .with_quic_config(|mut quic| {
            quic.max_concurrent_stream_limit = max_streams;
            quic.handshake_timeout = handshake_timeout;
            (quic.max_stream_data, quic.max_connection_data) = windows;
            quic
        })
        // The relay client's transport, built here rather than by `with_relay_client` so
        // that its connections count their bytes.
        .with_other_transport(|key| relayed_transport(relay_transport, key, relayed_metrics))
        .map_err(|e| NetError::Transport(error_chain(&e)))?
        .with_behaviour(|key| {
            MurmurBehaviour::new(key, &config, Arc::clone(&metrics), relay_client, &members)
                .map_err(|e| {
                    let text = e.to_string();
                    failure = Some(e);
                    Box::<dyn std::error::Error + Send + Sync>::from(text)
                })
        })
        .map_err(|e| {
            failure
                .take()
                .unwrap_or_else(|| NetError::Transport(e.to_string()))
        })?
        .with_swarm_config(|c| c.with_idle_connection_timeout(idle))
        // The deadline of every transport upgrade (TCP's noise and yamux included; libp2p's
        // default is 10 s): a socket that never finishes its handshake frees its slot then.
        .with_connection_timeout(handshake_timeout)
        .build();

    // Outbound tensor streams only: inbound ones come through `TensorInbound`.
    let streams = swarm.behaviour().streams.new_control();

    let mut listeners = HashMap::new();
    for addr in &config.listen_addrs {
        let id = swarm
            .listen_on(addr.clone())
            .map_err(|e| NetError::Listen {
                addr: addr.to_string(),
                reason: error_chain(&e),
            })?;
        listeners.insert(id, addr.clone());
    }

    let (commands_tx, commands_rx) = mpsc::channel(raw.command_capacity);
    let (events, _) = broadcast::channel(raw.event_capacity);
    let (streams_tx, streams_rx) = mpsc::channel(raw.inbound_stream_capacity);
    let (control_tx, control_rx) = mpsc::channel(raw.control_capacity);
    let ctx = StreamContext {
        metrics,
        bandwidth: Arc::new(BandwidthEstimator::default()),
        frame_limits: config.frame_limits,
        read_timeout: ValidConfig::ms(raw.tensor_read_timeout_ms),
        frame_timeout: ValidConfig::ms(raw.frame_timeout_ms),
        partial_budget: raw.max_partial_frame_bytes_per_peer,
        write_timeout: ValidConfig::ms(raw.tensor_write_timeout_ms),
        upload: RateLimiter::new(raw.max_upload_bytes_per_s).map(Arc::new),
        download: RateLimiter::new(raw.max_download_bytes_per_s).map(Arc::new),
    };
    let topic = gossipsub::IdentTopic::new(config.heartbeat_topic()).hash();
    let mut actor = NetActor {
        swarm,
        config: config.clone(),
        authorizer,
        topic,
        ctx: ctx.clone(),
        events: events.clone(),
        inbound_streams: streams_tx,
        inbound_control: control_tx,
        peers: HashMap::new(),
        waiters: HashMap::new(),
        requests: HashMap::new(),
        responses: HashMap::new(),
        next_response_id: 0,
        listen_addrs: Vec::new(),
        anonymous_dials: HashSet::new(),
        bootstrap: BootstrapDials::new(&config.bootstrap),
        invites: VerifiedInvites::new(
            usize::try_from(raw.max_connections)
                .unwrap_or(usize::MAX)
                .saturating_mul(VERIFIED_INVITES_PER_CONNECTION),
        ),
        freshness: HeartbeatFreshness::new(
            raw.max_heartbeat_age_ms,
            usize::try_from(raw.max_connections)
                .unwrap_or(usize::MAX)
                .saturating_mul(VERIFIED_INVITES_PER_CONNECTION),
        ),
        gossip_refusals_warned_at: None,
        gossip_refusals_unwarned: 0,
        members,
        nat: nat_events::NatState::default(),
        revocation: revocations::RevocationState::new(
            gossipsub::IdentTopic::new(config.revocation_topic()).hash(),
        ),
    };

    // Wait until each listener has bound, so callers can hand out our addresses at once.
    let bound = tokio::time::timeout(LISTEN_TIMEOUT, async {
        while !listeners.is_empty() {
            let event = actor.swarm.select_next_some().await;
            match &event {
                SwarmEvent::NewListenAddr { listener_id, .. } => {
                    listeners.remove(listener_id);
                }
                SwarmEvent::ListenerClosed {
                    listener_id,
                    reason,
                    ..
                } => {
                    if let Some(addr) = listeners.remove(listener_id) {
                        let reason = match reason {
                            Ok(()) => "the listener closed".to_owned(),
                            Err(e) => error_chain(e),
                        };
                        return Err(NetError::Listen {
                            addr: addr.to_string(),
                            reason,
                        });
                    }
                }
                SwarmEvent::ListenerError { listener_id, error } => {
                    if let Some(addr) = listeners.remove(listener_id) {
                        return Err(NetError::Listen {
                            addr: addr.to_string(),
                            reason: error_chain(error),
                        });
                    }
                }
                _ => {}
            }
            actor.on_swarm_event(event);
        }
        Ok(())
    })
    .await;
    match bound {
        Err(_) => {
            return Err(NetError::Timeout {
                what: "binding the listen addresses",
                after: LISTEN_TIMEOUT,
            });
        }
        Ok(result) => result?,
    }

    for addr in &config.bootstrap {
        if let Err(e) = actor.dial_addr(addr.clone()) {
            tracing::warn!(%addr, error = %e, "cannot dial bootstrap peer");
        }
    }

    let bootstrap_dials = actor.bootstrap.shared();
    let handle = NetHandle::new(
        Arc::clone(identity.keypair()),
        commands_tx,
        streams,
        events,
        ctx,
        config,
        bootstrap_dials,
    );
    // A revocation list on disk holds before the first peer is checked.
    actor.revocations_tick(std::time::Instant::now());
    tokio::spawn(actor.run(commands_rx));
    Ok((
        handle,
        NetInbound {
            tensor_streams: streams_rx,
            control_requests: control_rx,
        },
    ))
}

/// The relay client's transport as every other: noise, yamux, and a multiplexer whose
/// streams count their bytes ([`relayed_bytes::Counted`]).
fn relayed_transport(
    relay: libp2p::relay::client::Transport,
    key: &libp2p::identity::Keypair,
    metrics: Arc<NetMetrics>,
) -> Result<
    libp2p::core::transport::Boxed<(libp2p::PeerId, libp2p::core::muxing::StreamMuxerBox)>,
    Box<dyn std::error::Error + Send + Sync>,
> {
    use libp2p::core::Transport as _;
    use libp2p::core::muxing::StreamMuxerBox;
    Ok(relay
        .upgrade(libp2p::core::upgrade::Version::V1Lazy)
        .authenticate(noise::Config::new(key)?)
        .multiplex(yamux::Config::default())
        .map(move |(peer, muxer), _| {
            let counted = relayed_bytes::Counted::new(StreamMuxerBox::new(muxer), metrics);
            (peer, StreamMuxerBox::new(counted))
        })
        .boxed())
}

/// An error and its sources, joined by ": ", leaving out the empty ones (libp2p's transport
/// errors often say nothing themselves and keep the reason, such as the OS error, in a
/// source).
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(e) = next {
        let text = e.to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    if parts.is_empty() {
        "no reason given".to_owned()
    } else {
        parts.join(": ")
    }
}
