//! The libp2p behaviours murmur runs, combined into one [`MurmurBehaviour`].
//!
//! | behaviour | protocol | why |
//! |---|---|---|
//! | [`Admission`] | — | caps pending and established connections per source address; bans peers refused for their invite |
//! | connection limits | — | caps established and pending connections, per peer and in all |
//! | identify | `/ipfs/id/1.0.0` | learns a peer's listen addresses for the DHT |
//! | ping | `/ipfs/ping/1.0.0` | liveness and round-trip time |
//! | Kademlia | `/murmur/<swarm>/kad/1.0.0` | discovery; the name keeps swarms apart |
//! | gossipsub | topics `murmur/<swarm>/heartbeat`, `murmur/<swarm>/revocations` | signed heartbeats and the authority's revocation lists, validated before relay |
//! | mDNS (optional) | — | discovery on a LAN |
//! | request-response | `/murmur/<swarm>/control/1` | the auth hello and control messages |
//! | libp2p-stream | `/murmur/<swarm>/tensor/1` (outbound) | opens tensor streams, backpressured by QUIC flow control |
//! | [`TensorInbound`] | `/murmur/<swarm>/tensor/1` (inbound) | takes tensor streams without dropping any |
//!
//! Kademlia inserts peers into its routing table only when told: the network task adds a
//! peer once its invite has verified, so an unauthorized peer is never handed out to others.
//! Kademlia, identify and gossipsub are [`Gated`]: on each connection their streams wait
//! until the peer has proven its invite, so a stranger gets neither members' ids and
//! addresses, nor this peer's listen addresses, nor the topic it takes and the heartbeats
//! relayed on it.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use libp2p::swarm::NetworkBehaviour;
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::{gossipsub, identify, kad, mdns, ping, request_response};
use libp2p_connection_limits::ConnectionLimits;
use murmur_protocol::identity::MAX_REVOCATIONS_LEN;

use super::admission::{Admission, AdmissionLimits};
use super::config::ValidConfig;
use super::control::ControlCodec;
use super::error::NetError;
use super::gate::Gated;
use super::metrics::NetMetrics;
use super::tensor_inbound::TensorInbound;

/// Gossip messages are heartbeats of well under a kilobyte; anything larger is refused at the
/// transport.
const MAX_GOSSIP_MESSAGE: usize = 4096;

/// What gossipsub adds to a message's data (its source key and id, sequence number,
/// topic and signature) within the size it checks against a topic's bound: a revocation
/// list of the largest size must still fit.
const GOSSIP_MESSAGE_OVERHEAD: usize = 1024;

/// The most bytes one gossipsub read may hold. libp2p-gossipsub checks its whole read
/// buffer, which can hold several small messages at once, against this bound, and closes
/// the stream when it is over: at `MAX_GOSSIP_MESSAGE` a burst of heartbeats read together
/// (8 KiB) closed the stream, and after five closes gossipsub gave up on the connection.
/// Each message is still held to `MAX_GOSSIP_MESSAGE`, per topic, and control messages to
/// gossipsub's own bound.
const MAX_GOSSIP_READ: usize = 65536;

/// Every behaviour of a murmur peer.
#[derive(NetworkBehaviour)]
pub(crate) struct MurmurBehaviour {
    // First, so that a source over its own limits is refused before it takes a place in
    // the limits of all sources together.
    pub(crate) admission: Admission,
    pub(crate) limits: libp2p_connection_limits::Behaviour,
    pub(crate) identify: Gated<identify::Behaviour>,
    pub(crate) ping: ping::Behaviour,
    pub(crate) kad: Gated<kad::Behaviour<kad::store::MemoryStore>>,
    pub(crate) gossipsub: Gated<gossipsub::Behaviour>,
    pub(crate) mdns: Toggle<mdns::tokio::Behaviour>,
    pub(crate) control: request_response::Behaviour<ControlCodec>,
    pub(crate) streams: libp2p_stream::Behaviour,
    pub(crate) tensor: TensorInbound,
}

impl MurmurBehaviour {
    /// Builds the behaviours for `key` from a validated config.
    pub(crate) fn new(
        key: &libp2p::identity::Keypair,
        config: &ValidConfig,
        metrics: Arc<NetMetrics>,
    ) -> Result<MurmurBehaviour, NetError> {
        let raw = &config.raw;
        let local = key.public().to_peer_id();

        let admission = Admission::new(
            AdmissionLimits {
                pending_per_ip: raw.max_pending_incoming_per_ip,
                established_per_ip: raw.max_incoming_connections_per_ip,
                ban_after_refusals: raw.ban_after_refusals,
                ban_backoff: ValidConfig::ms(raw.ban_backoff_ms),
            },
            metrics,
        );
        let limits = libp2p_connection_limits::Behaviour::new(
            ConnectionLimits::default()
                .with_max_established(Some(raw.max_connections))
                .with_max_established_per_peer(Some(raw.max_connections_per_peer))
                .with_max_pending_incoming(Some(raw.max_pending_incoming)),
        );

        let identify = identify::Behaviour::new(
            identify::Config::new(config.identify_version(), key.public())
                .with_agent_version(format!("murmur/{}", env!("CARGO_PKG_VERSION"))),
        );

        let mut kad_config = kad::Config::new(config.kad_protocol());
        kad_config
            .set_kbucket_inserts(kad::BucketInserts::Manual)
            .set_periodic_bootstrap_interval(Some(ValidConfig::ms(raw.dht_refresh_interval_ms)))
            .set_query_timeout(Duration::from_secs(30))
            .set_record_ttl(None)
            .set_provider_record_ttl(None);
        if let Some(parallelism) = NonZeroUsize::new(3) {
            kad_config.set_parallelism(parallelism);
        }
        let mut kad =
            kad::Behaviour::with_config(local, kad::store::MemoryStore::new(local), kad_config);
        // Loopback and LAN peers never confirm an external address, so the automatic mode
        // would stay a client and answer nobody: every murmur peer serves the DHT.
        kad.set_mode(Some(kad::Mode::Server));

        let heartbeats = gossipsub::IdentTopic::new(config.heartbeat_topic());
        let revocations = gossipsub::IdentTopic::new(config.revocation_topic());
        let gossip_config = gossipsub::ConfigBuilder::default()
            .heartbeat_interval(ValidConfig::ms(raw.gossip_mesh_interval_ms))
            .validation_mode(gossipsub::ValidationMode::Strict)
            .validate_messages()
            .max_transmit_size(MAX_GOSSIP_READ)
            .max_transmit_size_for_topic(MAX_GOSSIP_MESSAGE, heartbeats.hash())
            .max_transmit_size_for_topic(
                MAX_REVOCATIONS_LEN + GOSSIP_MESSAGE_OVERHEAD,
                revocations.hash(),
            )
            .build()
            .map_err(|e| NetError::Transport(format!("gossipsub config: {e}")))?;
        let mut gossipsub = gossipsub::Behaviour::new(
            gossipsub::MessageAuthenticity::Signed(key.clone()),
            gossip_config,
        )
        .map_err(|e| NetError::Transport(format!("gossipsub: {e}")))?;
        for topic in [&heartbeats, &revocations] {
            gossipsub
                .subscribe(topic)
                .map_err(|e| NetError::Transport(format!("gossipsub subscribe: {e}")))?;
        }

        let mdns = if raw.mdns {
            let behaviour = mdns::tokio::Behaviour::new(mdns::Config::default(), local)
                .map_err(|e| NetError::Transport(format!("mdns: {e}")))?;
            Some(behaviour)
        } else {
            None
        };

        let control = request_response::Behaviour::with_codec(
            ControlCodec::new(config.control_limits),
            [(
                config.control_protocol(),
                request_response::ProtocolSupport::Full,
            )],
            request_response::Config::default()
                .with_request_timeout(ValidConfig::ms(raw.request_timeout_ms))
                .with_max_concurrent_streams(raw.max_streams_per_connection as usize),
        );

        Ok(MurmurBehaviour {
            admission,
            limits,
            identify: Gated::new(identify),
            ping: ping::Behaviour::default(),
            kad: Gated::new(kad),
            gossipsub: Gated::new(gossipsub),
            mdns: Toggle::from(mdns),
            control,
            streams: libp2p_stream::Behaviour::new(),
            tensor: TensorInbound::new(config.tensor_protocol()),
        })
    }
}
