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
//! | AutoNAT (v1) | `/libp2p/autonat/1.0.0` | asks members to dial this peer back: is it reachable? |
//! | relay client | `/libp2p/circuit/relay/0.2.0/{hop,stop}` | reservations on a relaying member; relayed dials |
//! | relay server (optional) | `/libp2p/circuit/relay/0.2.0/hop` | relays for members only (`[net.relay] serve`) |
//! | DCUtR | `/libp2p/dcutr` | turns a relayed connection into a direct one (hole punching) |
//!
//! Kademlia inserts peers into its routing table only when told: the network task adds a
//! peer once its invite has verified, so an unauthorized peer is never handed out to others.
//! Kademlia, identify, gossipsub, AutoNAT and DCUtR are [`Gated`]: on each connection their streams wait
//! until the peer has proven its invite, so a stranger gets neither members' ids and
//! addresses, nor this peer's listen addresses, nor the topic it takes and the heartbeats
//! relayed on it, nor a dial-back, nor this peer's observed addresses. The relay server
//! serves members only ([`MembersOnly`]).

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use libp2p::swarm::NetworkBehaviour;
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::{autonat, dcutr, gossipsub, identify, kad, mdns, ping, relay, request_response};
use libp2p_connection_limits::ConnectionLimits;
use murmur_protocol::identity::MAX_REVOCATIONS_LEN;

use super::admission::{Admission, AdmissionLimits};
use super::config::ValidConfig;
use super::control::ControlCodec;
use super::error::NetError;
use super::gate::Gated;
use super::metrics::NetMetrics;
use super::nat::{Members, MembersOnly, RelayRequest};
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
    pub(crate) autonat: Gated<autonat::Behaviour>,
    pub(crate) relay_client: relay::client::Behaviour,
    pub(crate) relay: Toggle<relay::Behaviour>,
    pub(crate) dcutr: Gated<dcutr::Behaviour>,
}

impl MurmurBehaviour {
    /// Builds the behaviours for `key` from a validated config.
    pub(crate) fn new(
        key: &libp2p::identity::Keypair,
        config: &ValidConfig,
        metrics: Arc<NetMetrics>,
        relay_client: relay::client::Behaviour,
        members: &Members,
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
            Arc::clone(&metrics),
        );
        let limits = libp2p_connection_limits::Behaviour::new(
            ConnectionLimits::default()
                .with_max_established(Some(raw.max_connections))
                .with_max_established_per_peer(Some(raw.max_connections_per_peer))
                .with_max_pending_incoming(Some(raw.max_pending_incoming)),
        );

        let identify = identify::Behaviour::new(
            identify::Config::new(config.identify_version(), key.public())
                .with_agent_version(format!("murmur/{}", env!("CARGO_PKG_VERSION")))
                // A reservation on a relay adds a listen address: members hear of it at once.
                .with_push_listen_addr_updates(true),
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
            autonat: Gated::new(autonat::Behaviour::new(local, autonat_config(config))),
            relay_client,
            relay: Toggle::from(
                raw.relay
                    .serve
                    .then(|| relay::Behaviour::new(local, relay_config(config, members, metrics))),
            ),
            dcutr: Gated::new(dcutr::Behaviour::new(local)),
        })
    }
}

/// AutoNAT: the first probe half an interval after start (at most 15 s: a process that
/// lives shorter never asks), then every `net.reachability_probe_interval_ms` until
/// settled, then ten times as seldom; any address may be probed (swarms run on LANs and
/// loopback too); only members are asked and answered (the behaviour is gated). Each
/// dial-back opens a socket of its own, so a peer dials back at most
/// [`DIAL_BACKS_PER_INTERVAL`] times an interval, and twice for one peer.
fn autonat_config(config: &ValidConfig) -> autonat::Config {
    let interval = ValidConfig::ms(config.raw.reachability_probe_interval_ms);
    autonat::Config {
        boot_delay: (interval / 2).min(Duration::from_secs(15)),
        retry_interval: interval,
        refresh_interval: interval.saturating_mul(10),
        throttle_server_period: interval / 2,
        throttle_clients_global_max: DIAL_BACKS_PER_INTERVAL,
        throttle_clients_peer_max: 2,
        throttle_clients_period: interval,
        only_global_ips: false,
        ..autonat::Config::default()
    }
}

/// Dial-backs this peer makes for others' AutoNAT probes per probe interval, at most.
const DIAL_BACKS_PER_INTERVAL: usize = 8;

/// The relay's limits from `[net.relay]`, and its rule that members only are served.
fn relay_config(
    config: &ValidConfig,
    members: &Members,
    metrics: Arc<NetMetrics>,
) -> relay::Config {
    let relay = &config.raw.relay;
    let count = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
    relay::Config {
        max_reservations: count(relay.max_reservations),
        max_reservations_per_peer: 1,
        reservation_duration: Duration::from_secs(3600),
        reservation_rate_limiters: vec![Box::new(MembersOnly::new(
            members.clone(),
            RelayRequest::Reservation,
            Arc::clone(&metrics),
        ))],
        max_circuits: count(relay.max_circuits),
        max_circuits_per_peer: count(relay.max_circuits_per_peer),
        max_circuit_duration: ValidConfig::ms(relay.max_circuit_duration_ms),
        max_circuit_bytes: relay.max_circuit_bytes,
        circuit_src_rate_limiters: vec![Box::new(MembersOnly::new(
            members.clone(),
            RelayRequest::Circuit,
            metrics,
        ))],
    }
}

#[cfg(test)]
mod tests {
    use murmur_protocol::identity::Keypair;

    use super::*;
    use crate::net::config::NetConfig;

    /// Every `[net.relay]` limit reaches libp2p's relay as configured; the relay enforces
    /// them (`daemon/tests/run_nat*.rs` show `max_reservations`, `max_circuit_bytes` and
    /// `max_circuit_duration_ms` acting on real processes).
    #[test]
    fn the_relay_is_built_with_the_configured_limits() {
        let mut raw = NetConfig {
            swarm_id: "demo".to_owned(),
            authority: Keypair::from_seed([1; 32]).peer_id().to_string(),
            invite: vec![1, 2, 3],
            ..NetConfig::default()
        };
        raw.relay.serve = true;
        raw.relay.max_reservations = 5;
        raw.relay.max_circuits = 7;
        raw.relay.max_circuits_per_peer = 3;
        raw.relay.max_circuit_bytes = 1 << 20;
        raw.relay.max_circuit_duration_ms = 4_000;
        let config = raw.validate().unwrap_or_else(|e| panic!("{e}"));
        let relay = relay_config(&config, &Members::default(), Arc::default());
        assert_eq!(relay.max_reservations, 5);
        assert_eq!(relay.max_circuits, 7);
        assert_eq!(relay.max_circuits_per_peer, 3);
        assert_eq!(relay.max_circuit_bytes, 1 << 20);
        assert_eq!(relay.max_circuit_duration, Duration::from_secs(4));
        assert_eq!(relay.reservation_rate_limiters.len(), 1, "members only");
        assert_eq!(relay.circuit_src_rate_limiters.len(), 1, "members only");
    }
}
