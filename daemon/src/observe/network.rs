//! [`NetworkMetrics`]: peers, bytes and refusals of the network layer.
//!
//! The network layer keeps its own counters ([`NetMetrics`](murmur_gossip::net::NetMetrics))
//! and throughput estimates ([`BandwidthEstimator`](murmur_gossip::net::BandwidthEstimator));
//! a custom collector reads them when `/metrics` is scraped, so the network's hot path pays
//! nothing for Prometheus. What only the run loop knows (how many peers are connected, which
//! codec a message used) it records here through [`NetworkMetrics`]' methods.

use std::sync::{Arc, OnceLock};

use murmur_gossip::net::{
    BootstrapDial, NetHandle, NetMetricsSnapshot, PeerBandwidth, Reachability,
};
use murmur_protocol::codec::CodecSpec;
use murmur_protocol::frame::FrameKind;
use murmur_protocol::identity::PeerId;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{MetricFamily, MetricType};
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::ObserveError;
use super::registry::{describe, family, named, register, sample};
use super::training::saturating_i64;

/// Peers exported in `murmur_net_peer_throughput_bytes_per_second`, at most; more would let a
/// large swarm blow up the scrape. The first peers in peer-id order are kept.
pub(crate) const MAX_PEER_SERIES: usize = 256;

/// Where the network layer's counters come from: the [`NetHandle`] in the daemon, a fixed
/// snapshot in tests.
pub(crate) trait NetSource: Send + Sync + 'static {
    /// Every counter, read now.
    fn counters(&self) -> NetMetricsSnapshot;
    /// Every peer's throughput estimate.
    fn bandwidth(&self) -> Vec<(PeerId, PeerBandwidth)>;
    /// What the dials to each bootstrap address gave.
    fn bootstrap(&self) -> Vec<BootstrapDial> {
        Vec::new()
    }
}

impl NetSource for NetHandle {
    fn counters(&self) -> NetMetricsSnapshot {
        self.metrics().snapshot()
    }

    fn bandwidth(&self) -> Vec<(PeerId, PeerBandwidth)> {
        self.bandwidth_estimator().all()
    }

    fn bootstrap(&self) -> Vec<BootstrapDial> {
        self.bootstrap_dials()
    }
}

type SharedSource = Arc<OnceLock<Arc<dyn NetSource>>>;

/// The `murmur_net_*` metrics. Recording is a no-op when made by
/// [`NetworkMetrics::disabled`]; an attached source is kept either way, for `/status`.
#[derive(Clone)]
pub(crate) struct NetworkMetrics {
    source: SharedSource,
    inner: Option<Inner>,
}

impl std::fmt::Debug for NetworkMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetworkMetrics")
            .field("attached", &self.source.get().is_some())
            .field("enabled", &self.inner.is_some())
            .finish()
    }
}

#[derive(Debug, Clone)]
struct Inner {
    connected_peers: IntGauge,
    bandwidth_cap: IntGaugeVec,
    bytes_sent: IntCounterVec,
    bytes_received: IntCounterVec,
}

impl NetworkMetrics {
    pub(super) fn register(registry: &Registry) -> Result<NetworkMetrics, ObserveError> {
        let name = "murmur_net_connected_peers";
        let help = "Connected peers whose invite verified.";
        let connected_peers = named(name, IntGauge::new(name, help))?;
        let by_message = ["codec", "kind"];
        let name = "murmur_net_message_bytes_sent_total";
        let help = "Frame bytes this peer sent, by codec and message kind.";
        let bytes_sent = named(name, IntCounterVec::new(Opts::new(name, help), &by_message))?;
        let name = "murmur_net_message_bytes_received_total";
        let help = "Frame bytes this peer received, by codec and message kind.";
        let bytes_received = named(name, IntCounterVec::new(Opts::new(name, help), &by_message))?;
        let name = "murmur_net_bandwidth_cap_bytes_per_second";
        let help = "The volunteer's cap on tensor bytes per second, by direction; 0 = none.";
        let bandwidth_cap = named(
            name,
            IntGaugeVec::new(Opts::new(name, help), &["direction"]),
        )?;
        let inner = Inner {
            connected_peers,
            bandwidth_cap,
            bytes_sent,
            bytes_received,
        };
        register(registry, inner.connected_peers.clone())?;
        register(registry, inner.bandwidth_cap.clone())?;
        for direction in ["upload", "download"] {
            inner.bandwidth_cap.with_label_values(&[direction]).set(0);
        }
        register(registry, inner.bytes_sent.clone())?;
        register(registry, inner.bytes_received.clone())?;
        let source = SharedSource::default();
        register(registry, NetCollector::new(Arc::clone(&source))?)?;
        Ok(NetworkMetrics {
            source,
            inner: Some(inner),
        })
    }

    pub(super) fn disabled() -> NetworkMetrics {
        NetworkMetrics {
            source: SharedSource::default(),
            inner: None,
        }
    }

    /// From now on, scrapes read the network layer's counters from `source` (the daemon's
    /// [`NetHandle`]). Once per daemon.
    pub(crate) fn attach(&self, source: Arc<dyn NetSource>) -> Result<(), ObserveError> {
        self.source
            .set(source)
            .map_err(|_| ObserveError::NetworkAlreadyAttached)
    }

    /// The network layer's counters now, if a source is attached.
    pub(crate) fn counters(&self) -> Option<NetMetricsSnapshot> {
        self.source.get().map(|s| s.counters())
    }

    /// What the dials to each bootstrap address gave, if a source is attached.
    pub(crate) fn bootstrap(&self) -> Vec<BootstrapDial> {
        self.source.get().map(|s| s.bootstrap()).unwrap_or_default()
    }

    /// Every peer's throughput estimate now, if a source is attached.
    pub(crate) fn bandwidth(&self) -> Vec<(PeerId, PeerBandwidth)> {
        self.source.get().map(|s| s.bandwidth()).unwrap_or_default()
    }

    /// The volunteer's bandwidth caps (bytes per second; 0 = none), as the network layer
    /// enforces them.
    pub(crate) fn set_bandwidth_caps(&self, upload: u64, download: u64) {
        if let Some(m) = &self.inner {
            for (direction, cap) in [("upload", upload), ("download", download)] {
                m.bandwidth_cap
                    .with_label_values(&[direction])
                    .set(saturating_i64(cap));
            }
        }
    }

    /// The number of connected, authorized peers changed.
    pub(crate) fn set_connected_peers(&self, peers: usize) {
        if let Some(m) = &self.inner {
            m.connected_peers
                .set(saturating_i64(u64::try_from(peers).unwrap_or(u64::MAX)));
        }
    }

    /// This peer sent `bytes` of `kind` frames encoded with `codec` (`None`: no tensor).
    /// Call once per transfer, not per chunk: it looks the series up by its labels.
    pub(crate) fn record_sent(&self, codec: Option<CodecSpec>, kind: FrameKind, bytes: u64) {
        if let Some(m) = &self.inner {
            m.bytes_sent
                .with_label_values(&[codec_label(codec), kind.name()])
                .inc_by(bytes);
        }
    }

    /// This peer received `bytes` of `kind` frames encoded with `codec` (`None`: no tensor).
    /// Call once per transfer, not per chunk: it looks the series up by its labels.
    pub(crate) fn record_received(&self, codec: Option<CodecSpec>, kind: FrameKind, bytes: u64) {
        if let Some(m) = &self.inner {
            m.bytes_received
                .with_label_values(&[codec_label(codec), kind.name()])
                .inc_by(bytes);
        }
    }
}

fn codec_label(codec: Option<CodecSpec>) -> &'static str {
    codec.as_ref().map_or("none", CodecSpec::name)
}

/// Reads one counter out of a snapshot.
type ReadCounter = fn(&NetMetricsSnapshot) -> u64;

/// Counters read from the network layer at scrape time.
struct NetCollector {
    source: SharedSource,
    counters: Vec<(Desc, ReadCounter)>,
    streams_refused: Desc,
    connections_refused: Desc,
    heartbeats_refused: Desc,
    throughput: Desc,
    relay_refused: Desc,
    relay_accepted: Desc,
    hole_punches: Desc,
    connections: Desc,
    reachability: Desc,
    relayed_bytes: Desc,
}

impl NetCollector {
    fn new(source: SharedSource) -> Result<NetCollector, ObserveError> {
        let plain: [(&str, &str, ReadCounter); 15] = [
            (
                "murmur_net_tensor_bytes_sent_total",
                "Tensor stream bytes written, all peers.",
                |s| s.tensor_bytes_sent,
            ),
            (
                "murmur_net_tensor_bytes_received_total",
                "Tensor stream bytes read, all peers.",
                |s| s.tensor_bytes_received,
            ),
            (
                "murmur_net_auth_rejections_total",
                "Connections closed because an invite did not verify.",
                |s| s.auth_rejected,
            ),
            (
                "murmur_net_peers_refused_revoked_total",
                "Peers refused or disconnected because the swarm's revocation list names them.",
                |s| s.peers_refused_revoked,
            ),
            (
                "murmur_net_revocation_lists_adopted_total",
                "Revocation lists verified and adopted, each newer than the one before.",
                |s| s.revocation_lists_adopted,
            ),
            (
                "murmur_net_auth_timeouts_total",
                "Connections closed because the invite exchange took too long.",
                |s| s.auth_timeouts,
            ),
            (
                "murmur_net_peers_authorized_total",
                "Peers whose invite verified.",
                |s| s.peers_authorized,
            ),
            (
                "murmur_net_bad_frames_total",
                "Tensor streams closed for a bad frame or message.",
                |s| s.bad_frames,
            ),
            (
                "murmur_net_gossip_rejected_total",
                "Gossip messages rejected (unauthorized forwarder, bad signature, bad body, uninvited signer).",
                |s| s.gossip_rejected,
            ),
            (
                "murmur_net_heartbeats_received_total",
                "Heartbeats accepted from gossip.",
                |s| s.heartbeats_received,
            ),
            (
                "murmur_net_tensor_streams_accepted_total",
                "Inbound tensor streams handed to the run loop.",
                |s| s.tensor_streams_accepted,
            ),
            (
                "murmur_net_handshake_timeouts_total",
                "Incoming connections dropped for not finishing their transport handshake in time.",
                |s| s.handshake_timeouts,
            ),
            (
                "murmur_net_peers_banned_total",
                "Bans started for peers refused for their invite too often.",
                |s| s.peers_banned,
            ),
            (
                "murmur_net_tensor_frames_timed_out_total",
                "Tensor streams closed for a frame that did not arrive whole in time.",
                |s| s.tensor_frames_timed_out,
            ),
            (
                "murmur_net_tensor_streams_over_partial_budget_total",
                "Tensor streams closed because their peer's partial frames would exceed its budget.",
                |s| s.tensor_streams_over_partial_budget,
            ),
        ];
        let mut counters = Vec::with_capacity(plain.len());
        for (name, help, read) in plain {
            counters.push((describe(name, help, &[])?, read));
        }
        Ok(NetCollector {
            source,
            counters,
            streams_refused: describe(
                "murmur_net_tensor_streams_refused_total",
                "Inbound tensor streams dropped unread, by reason.",
                &["reason"],
            )?,
            connections_refused: describe(
                "murmur_net_connections_refused_total",
                "Connections closed before or at their start, by reason.",
                &["reason"],
            )?,
            heartbeats_refused: describe(
                "murmur_net_heartbeats_refused_total",
                "Heartbeats refused by their signer, whoever forwarded them, by reason.",
                &["reason"],
            )?,
            throughput: describe(
                "murmur_net_peer_throughput_bytes_per_second",
                "Measured transfer rate to (upload) or from (download) one peer.",
                &["peer", "direction"],
            )?,
            relay_refused: describe(
                "murmur_net_relay_refused_total",
                "Relay reservations and circuits this peer refused because the requester is not a member, by request.",
                &["request"],
            )?,
            relay_accepted: describe(
                "murmur_net_relay_accepted_total",
                "Relay reservations and circuits this peer granted to members, by request.",
                &["request"],
            )?,
            hole_punches: describe(
                "murmur_net_hole_punches_total",
                "DCUtR attempts to turn a relayed connection into a direct one, by result.",
                &["result"],
            )?,
            connections: describe(
                "murmur_net_connections",
                "Open connections by kind: direct, hole_punched (made direct by DCUtR) or relayed.",
                &["kind"],
            )?,
            relayed_bytes: describe(
                "murmur_net_relayed_bytes_total",
                "Bytes this peer sent and received on connections through a relay, by direction.",
                &["direction"],
            )?,
            reachability: describe(
                "murmur_net_reachability",
                "What AutoNAT found: 1 for the current state (public, private or unknown), 0 for the others.",
                &["state"],
            )?,
        })
    }
}

impl NetCollector {
    /// Relays, hole punches, connection kinds and reachability.
    fn nat_families(&self, snapshot: &NetMetricsSnapshot) -> [MetricFamily; 6] {
        let counter = MetricType::COUNTER;
        let gauge = MetricType::GAUGE;
        let by = |label: &str, values: &[(&str, u64)], kind: MetricType| {
            values
                .iter()
                .map(|(value, n)| sample(&[(label, value)], *n as f64, kind))
                .collect::<Vec<_>>()
        };
        let connections = &snapshot.connections;
        let reachability: Vec<(&str, u64)> = Reachability::ALL
            .iter()
            .map(|state| (state.name(), u64::from(*state == snapshot.reachability)))
            .collect();
        [
            family(
                &self.relay_refused,
                counter,
                by(
                    "request",
                    &[
                        ("reservation", snapshot.relay_reservations_refused),
                        ("circuit", snapshot.relay_circuits_refused),
                    ],
                    counter,
                ),
            ),
            family(
                &self.relay_accepted,
                counter,
                by(
                    "request",
                    &[
                        ("reservation", snapshot.relay_reservations_accepted),
                        ("circuit", snapshot.relay_circuits_accepted),
                    ],
                    counter,
                ),
            ),
            family(
                &self.hole_punches,
                counter,
                by(
                    "result",
                    &[
                        ("succeeded", snapshot.hole_punches_succeeded),
                        ("failed", snapshot.hole_punches_failed),
                    ],
                    counter,
                ),
            ),
            family(
                &self.connections,
                gauge,
                by(
                    "kind",
                    &[
                        ("direct", connections.direct),
                        ("hole_punched", connections.hole_punched),
                        ("relayed", connections.relayed),
                    ],
                    gauge,
                ),
            ),
            family(&self.reachability, gauge, by("state", &reachability, gauge)),
            family(
                &self.relayed_bytes,
                counter,
                by(
                    "direction",
                    &[
                        ("sent", snapshot.relayed_bytes_sent),
                        ("received", snapshot.relayed_bytes_received),
                    ],
                    counter,
                ),
            ),
        ]
    }
}

impl Collector for NetCollector {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs: Vec<&Desc> = self.counters.iter().map(|(d, _)| d).collect();
        descs.push(&self.streams_refused);
        descs.push(&self.connections_refused);
        descs.push(&self.heartbeats_refused);
        descs.push(&self.throughput);
        descs.push(&self.relay_refused);
        descs.push(&self.relay_accepted);
        descs.push(&self.hole_punches);
        descs.push(&self.connections);
        descs.push(&self.reachability);
        descs.push(&self.relayed_bytes);
        descs
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Some(source) = self.source.get() else {
            return Vec::new();
        };
        let snapshot = source.counters();
        let counter = MetricType::COUNTER;
        // Counter values are exported as f64, exact up to 2^53.
        let mut families: Vec<MetricFamily> = self
            .counters
            .iter()
            .map(|(desc, read)| {
                family(
                    desc,
                    counter,
                    vec![sample(&[], read(&snapshot) as f64, counter)],
                )
            })
            .collect();
        let refused = [
            ("unauthorized", snapshot.tensor_streams_refused_unauthorized),
            ("limit", snapshot.tensor_streams_refused_limit),
        ]
        .iter()
        .map(|(reason, n)| sample(&[("reason", reason)], *n as f64, counter))
        .collect();
        families.push(family(&self.streams_refused, counter, refused));
        let connections = [
            (
                "pending_per_ip",
                snapshot.connections_refused_pending_per_ip,
            ),
            ("per_ip", snapshot.connections_refused_per_ip),
            ("limit", snapshot.connections_refused_limit),
            ("banned", snapshot.connections_refused_banned),
        ]
        .iter()
        .map(|(reason, n)| sample(&[("reason", reason)], *n as f64, counter))
        .collect();
        families.push(family(&self.connections_refused, counter, connections));
        let heartbeats_refused = [
            (
                "uninvited_signer",
                snapshot.heartbeats_refused_uninvited_signer,
            ),
            ("stale", snapshot.heartbeats_refused_stale),
            ("replayed", snapshot.heartbeats_refused_replayed),
            ("revoked", snapshot.heartbeats_refused_revoked),
        ]
        .iter()
        .map(|(reason, n)| sample(&[("reason", reason)], *n as f64, counter))
        .collect();
        families.push(family(
            &self.heartbeats_refused,
            counter,
            heartbeats_refused,
        ));

        families.extend(self.nat_families(&snapshot));

        let mut peers = source.bandwidth();
        peers.sort_unstable_by_key(|(peer, _)| *peer);
        let mut rates = Vec::new();
        for (peer, bandwidth) in peers.iter().take(MAX_PEER_SERIES) {
            let peer = peer.to_string();
            let directions = [
                ("upload", bandwidth.upload_bytes_per_s),
                ("download", bandwidth.download_bytes_per_s),
            ];
            for (direction, rate) in directions {
                if let Some(rate) = rate {
                    let labels = [("peer", peer.as_str()), ("direction", direction)];
                    rates.push(sample(&labels, rate, MetricType::GAUGE));
                }
            }
        }
        if !rates.is_empty() {
            families.push(family(&self.throughput, MetricType::GAUGE, rates));
        }
        families
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::time::Duration;

    use murmur_gossip::net::{BandwidthEstimator, ConnectionCounts, Direction};
    use murmur_protocol::identity::Keypair;

    use super::*;

    /// A network layer that reports fixed counters and real bandwidth estimates.
    #[derive(Debug, Default)]
    pub(in crate::observe) struct FixedNet {
        pub(in crate::observe) counters: NetMetricsSnapshot,
        pub(in crate::observe) bandwidth: BandwidthEstimator,
    }

    impl NetSource for FixedNet {
        fn counters(&self) -> NetMetricsSnapshot {
            self.counters
        }

        fn bandwidth(&self) -> Vec<(PeerId, PeerBandwidth)> {
            self.bandwidth.all()
        }
    }

    pub(in crate::observe) fn peer(n: u16) -> PeerId {
        let mut seed = [7; 32];
        seed[..2].copy_from_slice(&n.to_le_bytes());
        Keypair::from_seed(seed).peer_id()
    }

    /// A source with every counter distinct and two peers with estimates.
    pub(in crate::observe) fn busy_net() -> FixedNet {
        let counters = NetMetricsSnapshot {
            auth_rejected: 1,
            auth_timeouts: 2,
            peers_authorized: 3,
            tensor_streams_accepted: 4,
            tensor_streams_refused_unauthorized: 5,
            tensor_streams_refused_limit: 6,
            bad_frames: 7,
            gossip_rejected: 8,
            heartbeats_refused_uninvited_signer: 11,
            heartbeats_received: 9,
            tensor_bytes_sent: 10_000,
            tensor_bytes_received: 20_000,
            connections_refused_pending_per_ip: 12,
            connections_refused_per_ip: 13,
            connections_refused_limit: 14,
            connections_refused_banned: 15,
            peers_banned: 16,
            handshake_timeouts: 17,
            heartbeats_refused_stale: 18,
            heartbeats_refused_replayed: 19,
            heartbeats_refused_revoked: 24,
            tensor_frames_timed_out: 20,
            tensor_streams_over_partial_budget: 21,
            peers_refused_revoked: 22,
            revocation_lists_adopted: 23,
            relay_reservations_refused: 25,
            relay_circuits_refused: 26,
            relay_reservations_accepted: 27,
            relay_circuits_accepted: 28,
            hole_punches_succeeded: 29,
            hole_punches_failed: 30,
            relayed_bytes_sent: 34,
            relayed_bytes_received: 35,
            connections: ConnectionCounts {
                direct: 31,
                hole_punched: 32,
                relayed: 33,
            },
            reachability: Reachability::Private,
        };
        let bandwidth = BandwidthEstimator::new(0.5, 1);
        bandwidth.record(
            peer(1),
            Direction::Upload,
            4_000_000,
            Duration::from_secs(2),
        );
        bandwidth.record(
            peer(2),
            Direction::Download,
            1_000_000,
            Duration::from_secs(1),
        );
        FixedNet {
            counters,
            bandwidth,
        }
    }

    fn text(registry: &Registry) -> String {
        super::super::registry::exposition(registry)
    }

    #[test]
    fn scrapes_read_the_network_layer_once_attached() {
        let registry = Registry::new();
        let m = NetworkMetrics::register(&registry).expect("registers");
        assert!(!text(&registry).contains("murmur_net_bad_frames_total"));
        m.attach(Arc::new(busy_net())).expect("first attach");
        let text = text(&registry);
        let (p1, p2) = (peer(1), peer(2));
        let expect = [
            "murmur_net_auth_rejections_total 1".to_owned(),
            "murmur_net_auth_timeouts_total 2".to_owned(),
            "murmur_net_peers_authorized_total 3".to_owned(),
            "murmur_net_tensor_streams_accepted_total 4".to_owned(),
            r#"murmur_net_tensor_streams_refused_total{reason="unauthorized"} 5"#.to_owned(),
            r#"murmur_net_tensor_streams_refused_total{reason="limit"} 6"#.to_owned(),
            "murmur_net_bad_frames_total 7".to_owned(),
            "murmur_net_gossip_rejected_total 8".to_owned(),
            "murmur_net_heartbeats_received_total 9".to_owned(),
            r#"murmur_net_heartbeats_refused_total{reason="uninvited_signer"} 11"#.to_owned(),
            "murmur_net_tensor_bytes_sent_total 10000".to_owned(),
            "murmur_net_tensor_bytes_received_total 20000".to_owned(),
            r#"murmur_net_connections_refused_total{reason="pending_per_ip"} 12"#.to_owned(),
            r#"murmur_net_connections_refused_total{reason="per_ip"} 13"#.to_owned(),
            r#"murmur_net_connections_refused_total{reason="limit"} 14"#.to_owned(),
            r#"murmur_net_connections_refused_total{reason="banned"} 15"#.to_owned(),
            "murmur_net_peers_banned_total 16".to_owned(),
            "murmur_net_handshake_timeouts_total 17".to_owned(),
            r#"murmur_net_heartbeats_refused_total{reason="stale"} 18"#.to_owned(),
            r#"murmur_net_heartbeats_refused_total{reason="replayed"} 19"#.to_owned(),
            r#"murmur_net_heartbeats_refused_total{reason="revoked"} 24"#.to_owned(),
            "murmur_net_tensor_frames_timed_out_total 20".to_owned(),
            "murmur_net_tensor_streams_over_partial_budget_total 21".to_owned(),
            "murmur_net_peers_refused_revoked_total 22".to_owned(),
            "murmur_net_revocation_lists_adopted_total 23".to_owned(),
            r#"murmur_net_relay_refused_total{request="reservation"} 25"#.to_owned(),
            r#"murmur_net_relay_refused_total{request="circuit"} 26"#.to_owned(),
            r#"murmur_net_relay_accepted_total{request="reservation"} 27"#.to_owned(),
            r#"murmur_net_relay_accepted_total{request="circuit"} 28"#.to_owned(),
            r#"murmur_net_hole_punches_total{result="succeeded"} 29"#.to_owned(),
            r#"murmur_net_hole_punches_total{result="failed"} 30"#.to_owned(),
            r#"murmur_net_connections{kind="direct"} 31"#.to_owned(),
            r#"murmur_net_connections{kind="hole_punched"} 32"#.to_owned(),
            r#"murmur_net_connections{kind="relayed"} 33"#.to_owned(),
            r#"murmur_net_reachability{state="unknown"} 0"#.to_owned(),
            r#"murmur_net_reachability{state="public"} 0"#.to_owned(),
            r#"murmur_net_reachability{state="private"} 1"#.to_owned(),
            r#"murmur_net_relayed_bytes_total{direction="sent"} 34"#.to_owned(),
            r#"murmur_net_relayed_bytes_total{direction="received"} 35"#.to_owned(),
            format!(
                r#"murmur_net_peer_throughput_bytes_per_second{{peer="{p1}",direction="upload"}} 2000000"#
            ),
            format!(
                r#"murmur_net_peer_throughput_bytes_per_second{{peer="{p2}",direction="download"}} 1000000"#
            ),
        ];
        for line in &expect {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(!text.contains(&format!(r#"peer="{p1}",direction="download""#)));
    }

    #[test]
    fn a_second_attach_is_refused() {
        let m = NetworkMetrics::register(&Registry::new()).expect("registers");
        m.attach(Arc::new(FixedNet::default()))
            .expect("first attach");
        let again = m.attach(Arc::new(FixedNet::default()));
        assert!(matches!(again, Err(ObserveError::NetworkAlreadyAttached)));
    }

    #[test]
    fn message_bytes_are_counted_by_codec_and_kind() {
        let registry = Registry::new();
        let m = NetworkMetrics::register(&registry).expect("registers");
        let int8 = Some(CodecSpec::Int8 { block: 64 });
        m.record_sent(int8, FrameKind::TensorPartChunk, 100);
        m.record_sent(int8, FrameKind::TensorPartChunk, 50);
        m.record_received(None, FrameKind::StateSyncResponse, 7);
        m.set_connected_peers(5);
        let text = text(&registry);
        let expect = [
            r#"murmur_net_message_bytes_sent_total{codec="int8",kind="tensor_part_chunk"} 150"#,
            r#"murmur_net_message_bytes_received_total{codec="none",kind="state_sync_response"} 7"#,
            "murmur_net_connected_peers 5",
        ];
        for line in expect {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn throughput_series_are_capped() {
        let registry = Registry::new();
        let m = NetworkMetrics::register(&registry).expect("registers");
        let net = FixedNet::default();
        let peers = u16::try_from(MAX_PEER_SERIES + 10).expect("fits");
        for n in 0..peers {
            net.bandwidth
                .record(peer(n), Direction::Upload, 1 << 20, Duration::from_secs(1));
        }
        m.attach(Arc::new(net)).expect("attach");
        let series = text(&registry)
            .lines()
            .filter(|l| l.starts_with("murmur_net_peer_throughput_bytes_per_second{"))
            .count();
        assert_eq!(series, MAX_PEER_SERIES);
    }
}
