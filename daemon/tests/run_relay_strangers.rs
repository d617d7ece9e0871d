//! A murmur relay serves members only, against a real `murmur run` process with
//! `[net.relay] serve = true`: a libp2p client with no invite connects and asks for a
//! reservation (circuit relay v2, the way any libp2p node asks). The relay refuses it, the
//! client's relayed listener closes with the refusal, and the relay counts it in
//! `murmur_net_relay_refused_total{request="reservation"}`.

mod run_support;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, noise, relay, yamux};
use run_support::{PeerSettings, Swarm, exclusive};

/// How long the stranger waits for the relay's answer.
const WATCH: Duration = Duration::from_secs(20);

#[derive(NetworkBehaviour)]
struct Stranger {
    relay: relay::client::Behaviour,
}

/// Asks `relay` at `address` for a reservation; returns why the relayed listener closed,
/// or `None` if the relay granted it.
async fn ask_for_reservation(relay: PeerId, address: Multiaddr) -> Option<String> {
    let mut stranger = libp2p::SwarmBuilder::with_new_identity()
        .with_tokio()
        .with_quic()
        .with_relay_client(noise::Config::new, yamux::Config::default)
        .expect("the relay transport")
        .with_behaviour(|_, relay| Stranger { relay })
        .expect("the behaviour")
        .build();
    let circuit = address
        .with(Protocol::P2p(relay))
        .with(Protocol::P2pCircuit);
    stranger
        .listen_on(circuit)
        .expect("listening through the relay");
    let deadline = tokio::time::Instant::now() + WATCH;
    loop {
        let event = tokio::time::timeout_at(deadline, stranger.select_next_some())
            .await
            .expect("the relay answers within the watch");
        match event {
            SwarmEvent::ListenerClosed { reason, .. } => {
                return Some(match reason {
                    Ok(()) => "closed".to_owned(),
                    Err(e) => format!("{e:?}"),
                });
            }
            SwarmEvent::Behaviour(StrangerEvent::Relay(
                relay::client::Event::ReservationReqAccepted { .. },
            )) => return None,
            _ => {}
        }
    }
}

fn metrics(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connects");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("a timeout");
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("the request is sent");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("the answer");
    text
}

fn refused_reservations(addr: SocketAddr) -> Option<f64> {
    metrics(addr)
        .lines()
        .find(|l| l.starts_with("murmur_net_relay_refused_total{request=\"reservation\"}"))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
}

#[test]
fn a_stranger_gets_no_reservation_from_a_murmur_relay_and_the_refusal_is_counted() {
    let _serial = exclusive();
    let swarm = Swarm::create();
    let member = swarm.add_peer("relay");
    member.write_config(&PeerSettings {
        metrics: true,
        extra: "\n[net.relay]\nserve = true\n".to_owned(),
        ..PeerSettings::default()
    });
    let mut running = member.start();
    let ready = running.ready();
    let mut address: Multiaddr = ready.listen().parse().expect("a multiaddr");
    address.pop();
    let metrics_addr = ready.metrics_addr();
    assert_eq!(refused_reservations(metrics_addr), Some(0.0));

    let relay: PeerId = member.peer_id.parse().expect("the member's peer id");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let refusal = runtime.block_on(ask_for_reservation(relay, address));
    let refusal = refusal.unwrap_or_else(|| panic!("the relay granted a stranger a reservation"));
    eprintln!("the stranger's listener closed: {refusal}");

    let deadline = Instant::now() + Duration::from_secs(5);
    while refused_reservations(metrics_addr) < Some(1.0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        refused_reservations(metrics_addr) >= Some(1.0),
        "no refusal counted:\n{}",
        metrics(metrics_addr)
    );
}
