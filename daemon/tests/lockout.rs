//! One host holding a thousand handshakes open cannot lock an invited joiner out.
//!
//! A real `murmur run` peer listens on QUIC and TCP on 127.0.0.1. From 127.0.0.2 the test
//! opens 500 TCP sockets that send nothing and 500 QUIC connections whose handshake never
//! gets past the server's first flight (a relay forwards what the client sends and drops
//! every answer). Then a second, invited `murmur run` peer starts and bootstraps from the
//! first: it must be connected and authorized within [`JOIN_BOUND`] of its launch.
//!
//! The limits per source address are what let it in: with them raised past the attack
//! (`max_pending_incoming_per_ip` = `max_pending_incoming`), the attacker's sockets fill
//! `net.max_pending_incoming` and the joiner waits for the handshake deadline, which the
//! second test shows.

mod run_support;
#[path = "support/swarm.rs"]
mod swarm;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use run_support::{PeerDir, PeerSettings, RunningPeer, Swarm};
use swarm::{exclusive, metric, scrape};
use tokio::net::{TcpSocket, TcpStream, UdpSocket};

/// The attacker's address: one source, distinct from the joiner's 127.0.0.1.
const ATTACKER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// Idle TCP sockets the attacker holds.
const IDLE_TCP: usize = 500;
/// Half-open QUIC handshakes the attacker holds.
const IDLE_QUIC: usize = 500;
/// From the joiner's launch to its authorization at the victim.
const JOIN_BOUND: Duration = Duration::from_secs(2);
/// How long the attack may take to reach the victim's counters.
const ATTACK_PATIENCE: Duration = Duration::from_secs(20);
/// How often the victim's metrics are read.
const POLL: Duration = Duration::from_millis(25);

/// The victim listens on QUIC and TCP on 127.0.0.1 and serves its metrics; `net_keys`
/// overrides its connection limits.
fn victim_settings(net_keys: Vec<(&'static str, u64)>) -> PeerSettings {
    PeerSettings {
        metrics: true,
        listen_addrs: vec![
            "/ip4/127.0.0.1/udp/0/quic-v1".to_owned(),
            "/ip4/127.0.0.1/tcp/0".to_owned(),
        ],
        net_keys,
        ..PeerSettings::default()
    }
}

/// One counter or gauge from a Prometheus text page (0 when absent).
/// The victim's addresses: metrics, QUIC and TCP.
struct Victim {
    peer: RunningPeer,
    metrics: SocketAddr,
    quic: String,
    quic_socket: SocketAddr,
    tcp_socket: SocketAddr,
}

fn start_victim(dir: &PeerDir) -> Victim {
    let mut peer = dir.start();
    let ready = peer.ready();
    let metrics = ready
        .str("metrics_addr")
        .parse()
        .expect("a metrics address");
    let listen: Vec<String> = ready.json["listen"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let quic = listen
        .iter()
        .find(|a| a.contains("/quic-v1"))
        .unwrap_or_else(|| peer.fail("no QUIC address in the ready line"))
        .clone();
    let tcp = listen
        .iter()
        .find(|a| a.contains("/tcp/"))
        .unwrap_or_else(|| peer.fail("no TCP address in the ready line"))
        .clone();
    Victim {
        quic_socket: socket_of(&quic),
        tcp_socket: socket_of(&tcp),
        peer,
        metrics,
        quic,
    }
}

/// `/ip4/A/udp/P/quic-v1/p2p/…` or `/ip4/A/tcp/P/p2p/…` as a socket address.
fn socket_of(multiaddr: &str) -> SocketAddr {
    let parts: Vec<&str> = multiaddr.split('/').collect();
    let ip: IpAddr = parts[2].parse().expect("an IPv4 address");
    let port: u16 = parts[4].parse().expect("a port");
    SocketAddr::new(ip, port)
}

/// What the attacker holds open; dropped, it lets go.
struct Attack {
    _tcp: Vec<TcpStream>,
    _quic: Vec<quinn::Connecting>,
    _endpoint: quinn::Endpoint,
    _relay: tokio::task::JoinHandle<()>,
}

/// Opens [`IDLE_TCP`] silent TCP sockets and [`IDLE_QUIC`] QUIC handshakes that never
/// finish, all from [`ATTACKER`].
async fn attack(tcp: SocketAddr, quic: SocketAddr) -> Attack {
    let mut sockets = Vec::with_capacity(IDLE_TCP);
    for _ in 0..IDLE_TCP {
        let socket = TcpSocket::new_v4().expect("a TCP socket");
        socket
            .bind(SocketAddr::new(ATTACKER, 0))
            .expect("bind 127.0.0.2");
        // A refused or reset connect is the victim defending itself: keep going.
        if let Ok(Ok(stream)) =
            tokio::time::timeout(Duration::from_secs(2), socket.connect(tcp)).await
        {
            sockets.push(stream);
        }
    }

    // The relay: the client sends to `inbound`, which forwards from `outbound` to the
    // victim; nothing the victim answers is ever read, so no handshake completes.
    let inbound = UdpSocket::bind(SocketAddr::new(ATTACKER, 0))
        .await
        .expect("bind the relay");
    let relay_addr = inbound.local_addr().expect("the relay's address");
    let outbound = UdpSocket::bind(SocketAddr::new(ATTACKER, 0))
        .await
        .expect("bind the relay's far side");
    let relay = tokio::spawn(async move {
        let mut buf = vec![0u8; 2048];
        while let Ok((len, _)) = inbound.recv_from(&mut buf).await {
            let _ = outbound.send_to(&buf[..len], quic).await;
        }
    });
    let endpoint =
        quinn::Endpoint::client(SocketAddr::new(ATTACKER, 0)).expect("a quinn client endpoint");
    let config = half_open_client_config();
    let mut connecting = Vec::with_capacity(IDLE_QUIC);
    for n in 0..IDLE_QUIC {
        let c = endpoint
            .connect_with(config.clone(), relay_addr, "murmur")
            .expect("a QUIC connect");
        connecting.push(c);
        // Spread the Initials so the victim's socket buffer does not drop them.
        if n % 25 == 24 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    Attack {
        _tcp: sockets,
        _quic: connecting,
        _endpoint: endpoint,
        _relay: relay,
    }
}

/// A client that offers libp2p's ALPN, so the server starts the handshake, and keeps
/// retransmitting its Initial for a minute.
fn half_open_client_config() -> quinn::ClientConfig {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"libp2p".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("QUIC TLS");
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(Duration::from_secs(60)).expect("a timeout"),
    ));
    config.transport_config(Arc::new(transport));
    config
}

/// Starts the victim, holds the attack open, launches the joiner and returns how long the
/// joiner took from launch to authorized at the victim (`None`: not within `patience`),
/// with the victim's metrics page at the end.
fn join_under_attack(
    net_keys: Vec<(&'static str, u64)>,
    patience: Duration,
) -> (Option<Duration>, String) {
    let folder = Swarm::create();
    let victim_dir = folder.add_peer("victim");
    victim_dir.write_config(&victim_settings(net_keys));
    let victim = start_victim(&victim_dir);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let held = runtime.block_on(attack(victim.tcp_socket, victim.quic_socket));
    // The attack has reached the victim once its limits have refused some of it (or, with
    // the limits raised, once it fills every pending slot).
    let deadline = Instant::now() + ATTACK_PATIENCE;
    loop {
        let page = scrape(victim.metrics);
        let refused = metric(
            &page,
            r#"murmur_net_connections_refused_total{reason="pending_per_ip"}"#,
        ) + metric(
            &page,
            r#"murmur_net_connections_refused_total{reason="limit"}"#,
        );
        if refused >= 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the attack never reached the victim:\n{page}"
        );
        std::thread::sleep(POLL);
    }

    let joiner_dir = folder.add_peer("joiner");
    joiner_dir.write_config(&PeerSettings {
        bootstrap: vec![victim.quic.clone()],
        ..PeerSettings::default()
    });
    let launched = Instant::now();
    let _joiner = joiner_dir.start();
    let mut joined = None;
    while launched.elapsed() < patience {
        let page = scrape(victim.metrics);
        if metric(&page, "murmur_net_peers_authorized_total") >= 1.0 {
            joined = Some(launched.elapsed());
            break;
        }
        std::thread::sleep(POLL);
    }
    let page = scrape(victim.metrics);
    drop(held);
    drop(victim.peer);
    (joined, page)
}

fn report(label: &str, joined: Option<Duration>, page: &str) {
    let reasons = ["pending_per_ip", "per_ip", "limit", "banned"].map(|r| {
        let series = format!(r#"murmur_net_connections_refused_total{{reason="{r}"}}"#);
        format!("{r}={}", metric(page, &series))
    });
    eprintln!(
        "{label}: joined after {joined:?}; refused {}; handshake timeouts {}",
        reasons.join(" "),
        metric(page, "murmur_net_handshake_timeouts_total"),
    );
}

/// With the default limits, 500 idle TCP sockets and 500 half-open QUIC handshakes from one
/// address leave room for an invited joiner from another: it is in within 2 s.
#[test]
fn an_invited_joiner_gets_in_while_one_address_holds_a_thousand_handshakes() {
    let _serial = exclusive();
    let (joined, page) = join_under_attack(Vec::new(), JOIN_BOUND);
    report("default limits", joined, &page);
    assert!(
        joined.is_some_and(|t| t <= JOIN_BOUND),
        "the joiner was not authorized within {JOIN_BOUND:?}:\n{page}"
    );
    assert!(
        metric(
            &page,
            r#"murmur_net_connections_refused_total{reason="pending_per_ip"}"#
        ) >= 1.0,
        "the attacker was never refused:\n{page}"
    );
}

/// The same attack with the limits per address raised to the limit of all sources (what
/// murmur had before it counted per address) locks the joiner out past the bound: the
/// first test measures the defence, not a quiet host.
#[test]
fn without_limits_per_address_the_same_attack_locks_the_joiner_out() {
    let _serial = exclusive();
    let (joined, page) = join_under_attack(
        vec![
            ("max_pending_incoming_per_ip", 64),
            ("max_incoming_connections_per_ip", 256),
            ("handshake_timeout_ms", 10_000),
        ],
        JOIN_BOUND * 2,
    );
    report("no limits per address", joined, &page);
    assert!(
        joined.is_none(),
        "the joiner got in after {joined:?} though one address held every handshake slot"
    );
    assert!(
        metric(
            &page,
            r#"murmur_net_connections_refused_total{reason="limit"}"#
        ) >= 1.0,
        "the limit of all sources was never reached:\n{page}"
    );
}
