//! [`NetConfig`]: everything the network layer needs to know, as plain data.
//!
//! The struct is meant to be embedded in the daemon's config file (`[net]`), so it derives
//! serde with `deny_unknown_fields` and every field has a default. Addresses and keys are
//! kept as text here and parsed once by [`NetConfig::validate`], which names the key that
//! is wrong.

use std::str::FromStr;
use std::time::Duration;

use libp2p::{Multiaddr, StreamProtocol};
use murmur_protocol::frame::{FrameLimits, HEADER_LEN};
use murmur_protocol::identity::{PeerId, PublicKey, SwarmId};
use serde::{Deserialize, Serialize};

use super::error::NetError;
use super::nat::RelayConfig;

/// How a peer joins the swarm's network, and every bound the network layer keeps.
///
/// Durations are in milliseconds, sizes in bytes. The defaults suit a swarm of tens to
/// hundreds of peers on the internet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetConfig {
    /// The swarm's id (see [`SwarmId`]); names the Kademlia, control and tensor protocols
    /// and the heartbeat topic, so peers of different swarms never mix. Not read from the
    /// `[net]` table: the daemon sets it from its `[swarm]` section.
    #[serde(skip)]
    pub swarm_id: String,
    /// The swarm authority's peer id (`12D3KooW…`): the key that signs invites. Not read
    /// from the `[net]` table: the daemon sets it from its `[swarm]` section.
    #[serde(skip)]
    pub authority: String,
    /// This peer's invite, as issued by the authority
    /// ([`Invite::encode`](murmur_protocol::identity::Invite::encode)). Not read from the
    /// config file: the daemon loads it from the invite file and sets it here.
    #[serde(skip)]
    pub invite: Vec<u8>,
    /// A revocation list file (`murmur swarm revoke` writes one), read at start and again
    /// whenever its size or modification time changes. Not read from the `[net]` table:
    /// the daemon sets it from `swarm.revocation_file`.
    #[serde(skip)]
    pub revocation_file: Option<std::path::PathBuf>,
    /// Addresses to listen on, as multiaddrs. QUIC (`/udp/<port>/quic-v1`) is the main
    /// transport; TCP (`/tcp/<port>`, with noise and yamux) is the fallback where UDP is
    /// blocked.
    pub listen_addrs: Vec<String>,
    /// Peers to dial at start, as multiaddrs ending in `/p2p/<peer id>`. One reachable
    /// bootstrap peer is enough: the rest of the swarm is found through the DHT.
    pub bootstrap: Vec<String>,
    /// Discover peers on the local network with mDNS.
    pub mdns: bool,
    /// Most established connections, all peers together.
    pub max_connections: u32,
    /// Most established connections to one peer.
    pub max_connections_per_peer: u32,
    /// Most incoming connections still in their handshake.
    pub max_pending_incoming: u32,
    /// Most incoming connections from one IP address still in their handshake; more are
    /// closed at once, so one host cannot fill `max_pending_incoming`.
    pub max_pending_incoming_per_ip: u32,
    /// Most established incoming connections from one IP address, authorized or not.
    pub max_incoming_connections_per_ip: u32,
    /// How long a connection's transport handshake (QUIC, or TCP with noise and yamux) may
    /// take before it is dropped and its slot freed.
    pub handshake_timeout_ms: u64,
    /// A peer refused this many times for its invite is banned.
    pub ban_after_refusals: u32,
    /// How long the first ban lasts; each later refusal doubles it, up to 64 times this.
    pub ban_backoff_ms: u64,
    /// A heartbeat whose timestamp is further than this from this node's clock (older, or
    /// ahead) is dropped as stale; so is one not newer than its signer's last.
    pub max_heartbeat_age_ms: u64,
    /// Most tensor streams one peer may have open towards this peer at once; more are
    /// refused before any byte of them is read.
    pub max_inbound_tensor_streams_per_peer: u32,
    /// Most concurrent streams (all protocols) a peer may open on one QUIC connection.
    pub max_streams_per_connection: u32,
    /// How long a new connection may take to prove its invite before it is closed.
    pub auth_timeout_ms: u64,
    /// How long a control request may wait for its response.
    pub request_timeout_ms: u64,
    /// How long opening a tensor stream may take.
    pub stream_open_timeout_ms: u64,
    /// How long a tensor stream may stay silent while a frame is awaited.
    pub tensor_read_timeout_ms: u64,
    /// How long a tensor frame may take to arrive whole, from its first byte to its last;
    /// a slower one closes its stream.
    pub frame_timeout_ms: u64,
    /// Most bytes one peer's incomplete tensor frames may hold here, all its streams
    /// together; a stream that would take it past this is closed.
    pub max_partial_frame_bytes_per_peer: u64,
    /// How long one frame write may wait for the receiver to make room (backpressure).
    pub tensor_write_timeout_ms: u64,
    /// How long a caller waits for the network task to take and answer a command.
    pub command_timeout_ms: u64,
    /// A connection with no open stream is closed after this long.
    pub idle_connection_timeout_ms: u64,
    /// How often to refresh the DHT routing table (a Kademlia bootstrap query).
    pub dht_refresh_interval_ms: u64,
    /// Interval of gossipsub's own heartbeat (mesh maintenance), not of murmur heartbeats.
    pub gossip_mesh_interval_ms: u64,
    /// Capacity of the queue of commands from handles to the network task.
    pub command_capacity: usize,
    /// Capacity of the broadcast of [`NetEvent`](super::NetEvent)s; a subscriber that falls
    /// further behind loses the oldest events.
    pub event_capacity: usize,
    /// Capacity of the queue of accepted inbound tensor streams; streams arriving while it
    /// is full are refused.
    pub inbound_stream_capacity: usize,
    /// Capacity of the queue of inbound control requests.
    pub control_capacity: usize,
    /// Largest tensor frame payload accepted (see [`FrameLimits`]).
    pub max_frame_payload: u32,
    /// Largest control frame payload accepted (control messages are small).
    pub max_control_payload: u32,
    /// QUIC flow-control credit this peer grants per stream: the most bytes a sender may
    /// have written to one stream that this peer has not yet read. A sender's write waits
    /// once it is used up, so it also bounds how far a sender's "written" runs ahead of
    /// what has arrived, and one stream's throughput at about this over the round trip.
    pub quic_stream_receive_window: u32,
    /// QUIC flow-control credit per connection, all its streams together; at least
    /// `quic_stream_receive_window`.
    pub quic_connection_receive_window: u32,
    /// Cap on tensor bytes sent per second, all streams together; 0 = none. Not read from
    /// the `[net]` table: the daemon sets it from `[volunteer]`.
    #[serde(skip)]
    pub max_upload_bytes_per_s: u64,
    /// Cap on tensor bytes received per second, all streams together; 0 = none. Not read
    /// from the `[net]` table: the daemon sets it from `[volunteer]`.
    #[serde(skip)]
    pub max_download_bytes_per_s: u64,
    /// How often AutoNAT asks members to dial this peer back while its reachability is
    /// unknown or unsettled; once settled, every ten times this.
    pub reachability_probe_interval_ms: u64,
    /// Serving as a circuit relay for members behind NATs, and using one (`[net.relay]`).
    pub relay: RelayConfig,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            swarm_id: String::new(),
            authority: String::new(),
            invite: Vec::new(),
            revocation_file: None,
            listen_addrs: vec![
                "/ip4/0.0.0.0/udp/0/quic-v1".to_owned(),
                "/ip4/0.0.0.0/tcp/0".to_owned(),
            ],
            bootstrap: Vec::new(),
            mdns: false,
            max_connections: 256,
            max_connections_per_peer: 4,
            max_pending_incoming: 64,
            max_pending_incoming_per_ip: 16,
            max_incoming_connections_per_ip: 32,
            handshake_timeout_ms: 3_000,
            ban_after_refusals: 3,
            ban_backoff_ms: 60_000,
            max_heartbeat_age_ms: 60_000,
            max_inbound_tensor_streams_per_peer: 8,
            max_streams_per_connection: 64,
            auth_timeout_ms: 5_000,
            request_timeout_ms: 10_000,
            stream_open_timeout_ms: 5_000,
            tensor_read_timeout_ms: 10_000,
            frame_timeout_ms: 60_000,
            max_partial_frame_bytes_per_peer: 2 * u64::from(FrameLimits::DEFAULT_MAX_PAYLOAD),
            tensor_write_timeout_ms: 10_000,
            command_timeout_ms: 5_000,
            idle_connection_timeout_ms: 60_000,
            dht_refresh_interval_ms: 30_000,
            gossip_mesh_interval_ms: 1_000,
            command_capacity: 64,
            event_capacity: 256,
            inbound_stream_capacity: 16,
            control_capacity: 64,
            max_frame_payload: FrameLimits::DEFAULT_MAX_PAYLOAD,
            max_control_payload: 64 * 1024,
            // 320 Mbit/s per connection over a 100 ms round trip (libp2p-quic's own
            // defaults, 10 and 15 MB, allow 1 Gbit/s): see `docs/config.md`.
            quic_stream_receive_window: 4_000_000,
            quic_connection_receive_window: 4_000_000,
            max_upload_bytes_per_s: 0,
            max_download_bytes_per_s: 0,
            reachability_probe_interval_ms: 30_000,
            relay: RelayConfig::default(),
        }
    }
}

/// The least `quic_stream_receive_window`: about ten full-size packets.
pub const MIN_QUIC_RECEIVE_WINDOW: u32 = 16 * 1024;
/// The most of any connection count (`max_connections`, `…_per_peer`, `max_pending_incoming`).
const MAX_COUNT: u64 = 65_536;
/// The most streams per peer or per connection.
const MAX_STREAMS: u64 = 4_096;
/// The longest queue (`command_capacity`, `event_capacity`, `inbound_stream_capacity`,
/// `control_capacity`): each is allocated up front, and a queue this long already holds
/// minutes of work.
const MAX_QUEUE: u64 = 65_536;
/// The largest QUIC receive window, per stream or per connection: 1 GiB.
const MAX_RECEIVE_WINDOW: u64 = 1 << 30;
/// The longest timeout or interval, in milliseconds: a day.
const MAX_MS: u64 = 86_400_000;
/// The fewest bytes a relay circuit may carry: enough for the auth exchange and a hole
/// punch, with room to spare.
const MIN_CIRCUIT_BYTES: u64 = 64 * 1024;
/// The most bytes a relay circuit may carry: 1 TiB.
const MAX_CIRCUIT_BYTES: u64 = 1 << 40;

/// A [`NetConfig`] whose text has been parsed and whose bounds have been checked.
#[derive(Debug, Clone)]
pub(crate) struct ValidConfig {
    pub(crate) swarm: SwarmId,
    pub(crate) authority: PublicKey,
    pub(crate) invite: Vec<u8>,
    pub(crate) listen_addrs: Vec<Multiaddr>,
    pub(crate) bootstrap: Vec<Multiaddr>,
    pub(crate) frame_limits: FrameLimits,
    pub(crate) control_limits: FrameLimits,
    pub(crate) raw: NetConfig,
}

impl NetConfig {
    /// Parses the text fields and checks every bound; the error names the key at fault.
    pub(crate) fn validate(&self) -> Result<ValidConfig, NetError> {
        let swarm = SwarmId::new(self.swarm_id.clone())
            .map_err(|e| config_error("net.swarm_id", e.to_string()))?;
        let authority = PeerId::from_str(&self.authority)
            .map_err(|e| config_error("net.authority", e.to_string()))?
            .public_key();
        if self.invite.is_empty() {
            return Err(config_error(
                "invite",
                "no invite is set; ask the swarm organizer for one and point the config at it"
                    .to_owned(),
            ));
        }
        self.check_settings()?;
        let listen_addrs = parse_addrs("net.listen_addrs", &self.listen_addrs)?;
        let bootstrap = parse_addrs("net.bootstrap", &self.bootstrap)?;
        let frame_limits = FrameLimits::new(self.max_frame_payload)
            .map_err(|e| config_error("net.max_frame_payload", e.to_string()))?;
        let control_limits = FrameLimits::new(self.max_control_payload)
            .map_err(|e| config_error("net.max_control_payload", e.to_string()))?;
        Ok(ValidConfig {
            swarm,
            authority,
            invite: self.invite.clone(),
            listen_addrs,
            bootstrap,
            frame_limits,
            control_limits,
            raw: self.clone(),
        })
    }

    /// Checks every key of the `[net]` table (what `NetConfig::validate` checks but the
    /// swarm, authority and invite, which the daemon fills in from elsewhere): addresses
    /// parse and listen addresses are a transport this layer runs, and every number is
    /// within its bounds. The error names the key at fault. A config this accepts does not
    /// fail the network's start for its values (a port taken by another process still can).
    pub fn check_settings(&self) -> Result<(), NetError> {
        let listen_addrs = parse_addrs("net.listen_addrs", &self.listen_addrs)?;
        if listen_addrs.is_empty() {
            return Err(config_error(
                "net.listen_addrs",
                "at least one address is needed".to_owned(),
            ));
        }
        for addr in &listen_addrs {
            check_listen_addr(addr)?;
        }
        parse_addrs("net.bootstrap", &self.bootstrap)?;
        for (key, value, min, max) in [
            (
                "net.max_connections",
                u64::from(self.max_connections),
                1,
                MAX_COUNT,
            ),
            (
                "net.max_connections_per_peer",
                u64::from(self.max_connections_per_peer),
                1,
                MAX_COUNT,
            ),
            (
                "net.max_pending_incoming",
                u64::from(self.max_pending_incoming),
                1,
                MAX_COUNT,
            ),
            (
                "net.max_pending_incoming_per_ip",
                u64::from(self.max_pending_incoming_per_ip),
                1,
                MAX_COUNT,
            ),
            (
                "net.max_incoming_connections_per_ip",
                u64::from(self.max_incoming_connections_per_ip),
                1,
                MAX_COUNT,
            ),
            (
                "net.handshake_timeout_ms",
                self.handshake_timeout_ms,
                100,
                MAX_MS,
            ),
            (
                "net.ban_after_refusals",
                u64::from(self.ban_after_refusals),
                1,
                MAX_COUNT,
            ),
            ("net.ban_backoff_ms", self.ban_backoff_ms, 10, MAX_MS),
            (
                "net.max_heartbeat_age_ms",
                self.max_heartbeat_age_ms,
                100,
                MAX_MS,
            ),
            ("net.frame_timeout_ms", self.frame_timeout_ms, 10, MAX_MS),
            (
                "net.max_inbound_tensor_streams_per_peer",
                u64::from(self.max_inbound_tensor_streams_per_peer),
                1,
                MAX_STREAMS,
            ),
            (
                "net.max_streams_per_connection",
                u64::from(self.max_streams_per_connection),
                4,
                MAX_STREAMS,
            ),
            ("net.auth_timeout_ms", self.auth_timeout_ms, 10, MAX_MS),
            (
                "net.request_timeout_ms",
                self.request_timeout_ms,
                10,
                MAX_MS,
            ),
            (
                "net.stream_open_timeout_ms",
                self.stream_open_timeout_ms,
                10,
                MAX_MS,
            ),
            (
                "net.tensor_read_timeout_ms",
                self.tensor_read_timeout_ms,
                10,
                MAX_MS,
            ),
            (
                "net.tensor_write_timeout_ms",
                self.tensor_write_timeout_ms,
                10,
                MAX_MS,
            ),
            (
                "net.command_timeout_ms",
                self.command_timeout_ms,
                10,
                MAX_MS,
            ),
            (
                "net.idle_connection_timeout_ms",
                self.idle_connection_timeout_ms,
                100,
                MAX_MS,
            ),
            (
                "net.dht_refresh_interval_ms",
                self.dht_refresh_interval_ms,
                100,
                MAX_MS,
            ),
            (
                "net.gossip_mesh_interval_ms",
                self.gossip_mesh_interval_ms,
                10,
                MAX_MS,
            ),
            (
                "net.command_capacity",
                self.command_capacity as u64,
                1,
                MAX_QUEUE,
            ),
            (
                "net.event_capacity",
                self.event_capacity as u64,
                1,
                MAX_QUEUE,
            ),
            (
                "net.inbound_stream_capacity",
                self.inbound_stream_capacity as u64,
                1,
                MAX_QUEUE,
            ),
            (
                "net.control_capacity",
                self.control_capacity as u64,
                1,
                MAX_QUEUE,
            ),
            (
                "net.quic_stream_receive_window",
                u64::from(self.quic_stream_receive_window),
                u64::from(MIN_QUIC_RECEIVE_WINDOW),
                MAX_RECEIVE_WINDOW,
            ),
            (
                "net.quic_connection_receive_window",
                u64::from(self.quic_connection_receive_window),
                u64::from(self.quic_stream_receive_window),
                MAX_RECEIVE_WINDOW,
            ),
            (
                "net.reachability_probe_interval_ms",
                self.reachability_probe_interval_ms,
                1_000,
                MAX_MS,
            ),
            (
                "net.relay.max_reservations",
                u64::from(self.relay.max_reservations),
                1,
                MAX_COUNT,
            ),
            (
                "net.relay.max_circuits",
                u64::from(self.relay.max_circuits),
                1,
                MAX_COUNT,
            ),
            (
                "net.relay.max_circuits_per_peer",
                u64::from(self.relay.max_circuits_per_peer),
                1,
                u64::from(self.relay.max_circuits),
            ),
            (
                "net.relay.max_circuit_bytes",
                self.relay.max_circuit_bytes,
                MIN_CIRCUIT_BYTES,
                MAX_CIRCUIT_BYTES,
            ),
            (
                "net.relay.max_circuit_duration_ms",
                self.relay.max_circuit_duration_ms,
                1_000,
                MAX_MS,
            ),
        ] {
            if !(min..=max).contains(&value) {
                return Err(config_error(
                    key,
                    format!("is {value}; it must be {min} to {max}"),
                ));
            }
        }
        FrameLimits::new(self.max_frame_payload)
            .map_err(|e| config_error("net.max_frame_payload", e.to_string()))?;
        FrameLimits::new(self.max_control_payload)
            .map_err(|e| config_error("net.max_control_payload", e.to_string()))?;
        // Room for one whole frame, header included, or no large frame could ever arrive.
        let one_frame = u64::from(self.max_frame_payload) + HEADER_LEN as u64;
        if self.max_partial_frame_bytes_per_peer < one_frame {
            return Err(config_error(
                "net.max_partial_frame_bytes_per_peer",
                format!(
                    "is {}; it must hold one whole frame: at least net.max_frame_payload + {HEADER_LEN} ({one_frame})",
                    self.max_partial_frame_bytes_per_peer
                ),
            ));
        }
        Ok(())
    }
}

impl ValidConfig {
    /// The Kademlia protocol of this swarm: peers of other swarms do not answer it.
    pub(crate) fn kad_protocol(&self) -> StreamProtocol {
        self.protocol("kad/1.0.0")
    }

    /// The request-response protocol for the auth hello and control messages.
    pub(crate) fn control_protocol(&self) -> StreamProtocol {
        self.protocol("control/1")
    }

    /// The stream protocol tensors travel on.
    pub(crate) fn tensor_protocol(&self) -> StreamProtocol {
        self.protocol("tensor/1")
    }

    /// The gossipsub topic of this swarm's heartbeats.
    pub(crate) fn heartbeat_topic(&self) -> String {
        format!("murmur/{}/heartbeat", self.swarm)
    }

    /// The gossipsub topic of this swarm's revocation lists.
    pub(crate) fn revocation_topic(&self) -> String {
        format!("murmur/{}/revocations", self.swarm)
    }

    /// The identify protocol version string.
    pub(crate) fn identify_version(&self) -> String {
        format!("/murmur/{}/1", self.swarm)
    }

    fn protocol(&self, tail: &str) -> StreamProtocol {
        // A SwarmId is 1..=64 characters of [a-z0-9._-], so the name always starts with `/`
        // and is a valid protocol name.
        StreamProtocol::try_from_owned(format!("/murmur/{}/{tail}", self.swarm))
            .unwrap_or_else(|_| StreamProtocol::new("/murmur/invalid/1"))
    }

    pub(crate) fn ms(value: u64) -> Duration {
        Duration::from_millis(value)
    }
}

fn parse_addrs(key: &'static str, addrs: &[String]) -> Result<Vec<Multiaddr>, NetError> {
    addrs
        .iter()
        .map(|text| {
            Multiaddr::from_str(text)
                .map_err(|e| config_error(key, format!("`{text}` is not a multiaddr: {e}")))
        })
        .collect()
}

/// Refuses a listen address no transport of this layer can listen on: QUIC is
/// `/ip4|ip6/<address>/udp/<port>/quic-v1`, TCP `/ip4|ip6/<address>/tcp/<port>`.
fn check_listen_addr(addr: &Multiaddr) -> Result<(), NetError> {
    use libp2p::multiaddr::Protocol;
    let parts: Vec<Protocol<'_>> = addr.iter().collect();
    let ip_first = matches!(parts.first(), Some(Protocol::Ip4(_) | Protocol::Ip6(_)));
    let transport = matches!(
        parts.get(1..),
        Some([Protocol::Tcp(_)] | [Protocol::Udp(_), Protocol::QuicV1])
    );
    if ip_first && transport {
        Ok(())
    } else {
        Err(config_error(
            "net.listen_addrs",
            format!(
                "`{addr}` is not an address this peer can listen on; use \
                 /ip4/<address>/udp/<port>/quic-v1 or /ip4/<address>/tcp/<port> (or /ip6/…)"
            ),
        ))
    }
}

fn config_error(key: &'static str, reason: String) -> NetError {
    NetError::Config { key, reason }
}

#[cfg(test)]
mod tests {
    use murmur_protocol::identity::Keypair;

    use super::*;

    fn valid() -> NetConfig {
        NetConfig {
            swarm_id: "demo".to_owned(),
            authority: Keypair::from_seed([1; 32]).peer_id().to_string(),
            invite: vec![1, 2, 3],
            ..NetConfig::default()
        }
    }

    fn key_of(config: &NetConfig) -> Option<&'static str> {
        match config.validate() {
            Err(NetError::Config { key, .. }) => Some(key),
            _ => None,
        }
    }

    #[test]
    fn the_defaults_with_a_swarm_authority_and_invite_are_valid() {
        let config = valid().validate().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(config.kad_protocol().as_ref(), "/murmur/demo/kad/1.0.0");
        assert_eq!(config.tensor_protocol().as_ref(), "/murmur/demo/tensor/1");
        assert_eq!(config.heartbeat_topic(), "murmur/demo/heartbeat");
    }

    #[test]
    fn errors_name_the_key_at_fault() {
        let mut c = valid();
        c.swarm_id = "Bad Swarm".to_owned();
        assert_eq!(key_of(&c), Some("net.swarm_id"));
        let mut c = valid();
        c.authority = "not-a-peer-id".to_owned();
        assert_eq!(key_of(&c), Some("net.authority"));
        let mut c = valid();
        c.invite.clear();
        assert_eq!(key_of(&c), Some("invite"));
        let mut c = valid();
        c.bootstrap = vec!["127.0.0.1:4000".to_owned()];
        assert_eq!(key_of(&c), Some("net.bootstrap"));
        let mut c = valid();
        c.command_capacity = 0;
        assert_eq!(key_of(&c), Some("net.command_capacity"));
        let mut c = valid();
        c.max_frame_payload = u32::MAX;
        assert_eq!(key_of(&c), Some("net.max_frame_payload"));
        let mut c = valid();
        c.max_partial_frame_bytes_per_peer = u64::from(c.max_frame_payload) + 11;
        assert_eq!(key_of(&c), Some("net.max_partial_frame_bytes_per_peer"));
        let mut c = valid();
        c.max_pending_incoming_per_ip = 0;
        assert_eq!(key_of(&c), Some("net.max_pending_incoming_per_ip"));
        let mut c = valid();
        c.quic_stream_receive_window = 1000;
        assert_eq!(key_of(&c), Some("net.quic_stream_receive_window"));
        let mut c = valid();
        c.quic_connection_receive_window = c.quic_stream_receive_window - 1;
        assert_eq!(key_of(&c), Some("net.quic_connection_receive_window"));
    }

    #[test]
    fn queues_and_waits_have_upper_bounds_and_listen_addresses_a_transport() {
        let mut c = valid();
        c.command_capacity = usize::MAX;
        assert_eq!(key_of(&c), Some("net.command_capacity"));
        let mut c = valid();
        c.event_capacity = 4_000_000_000;
        assert_eq!(key_of(&c), Some("net.event_capacity"));
        let mut c = valid();
        c.idle_connection_timeout_ms = u64::MAX;
        assert_eq!(key_of(&c), Some("net.idle_connection_timeout_ms"));
        for bad in [
            "/ip4/127.0.0.1/udp/0/quic",
            "/ip4/127.0.0.1/udp/0",
            "/dns4/example.com/tcp/1",
            "/ip4/127.0.0.1/tcp/1/p2p-circuit",
        ] {
            let mut c = valid();
            c.listen_addrs = vec![bad.to_owned()];
            assert_eq!(key_of(&c), Some("net.listen_addrs"), "{bad}");
            assert!(c.check_settings().is_err(), "{bad}");
        }
        let mut c = valid();
        c.listen_addrs = vec!["/ip6/::1/udp/0/quic-v1".into(), "/ip4/0.0.0.0/tcp/0".into()];
        c.validate().unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn the_config_reads_from_text_with_defaults_and_refuses_unknown_keys() {
        let parsed: NetConfig = serde_json::from_str(r#"{"mdns": true, "auth_timeout_ms": 750}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(parsed.mdns);
        assert_eq!(parsed.auth_timeout_ms, 750);
        assert_eq!(parsed.max_connections, NetConfig::default().max_connections);
        assert!(serde_json::from_str::<NetConfig>(r#"{"mdsn": true}"#).is_err());
        // The swarm, the invite and the bandwidth caps come from the daemon's own
        // sections, never from the network table.
        for key in ["swarm_id", "authority", "invite", "max_upload_bytes_per_s"] {
            let text = format!(r#"{{"{key}": 1}}"#);
            assert!(serde_json::from_str::<NetConfig>(&text).is_err(), "{key}");
        }
    }
}
