//! Nothing for strangers: a libp2p client that connects to a member without an invite gets
//! no member's peer id or address from Kademlia, no listen address from identify, and no
//! invite (no hello), until the member closes the connection at its auth deadline.

#[path = "net_support/mod.rs"]
mod support;

use std::io;
use std::time::{Duration, Instant};

use futures::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, StreamExt as _};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{PeerId, StreamProtocol, identify, kad, request_response};
use support::{Authority, InviteKind, SWARM, address_of, connect, eventually};

/// Longer than the members' `net.auth_timeout_ms` (3 s) and the refusal grace after it.
const WATCH: Duration = Duration::from_secs(6);

/// What a stranger runs: Kademlia and identify under the swarm's names, and the control
/// protocol to see whether anyone sends it a hello.
#[derive(NetworkBehaviour)]
struct Stranger {
    kad: kad::Behaviour<kad::store::MemoryStore>,
    identify: identify::Behaviour,
    control: request_response::Behaviour<AnyBytes>,
}

/// Reads whatever a request or response holds (up to 64 KiB), so that a hello in any form
/// is seen.
#[derive(Debug, Clone, Default)]
struct AnyBytes;

impl AnyBytes {
    async fn read<T: AsyncRead + Unpin + Send>(io: &mut T) -> io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        io.take(64 * 1024).read_to_end(&mut bytes).await?;
        Ok(bytes)
    }
}

impl request_response::Codec for AnyBytes {
    type Protocol = StreamProtocol;
    type Request = Vec<u8>;
    type Response = Vec<u8>;

    async fn read_request<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Vec<u8>>
    where
        T: AsyncRead + Unpin + Send,
    {
        Self::read(io).await
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Vec<u8>>
    where
        T: AsyncRead + Unpin + Send,
    {
        Self::read(io).await
    }

    async fn write_request<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        bytes: Vec<u8>,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        io.write_all(&bytes).await
    }

    async fn write_response<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        bytes: Vec<u8>,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        io.write_all(&bytes).await
    }
}

/// What the stranger learned.
#[derive(Debug, Default)]
struct Learned {
    /// Peer ids Kademlia's answers named.
    kad_peers: Vec<PeerId>,
    /// Listen addresses identify reported.
    identify_addrs: usize,
    /// Requests (a hello would be one) that reached it.
    requests: usize,
    /// Its connection to the member closed.
    closed: bool,
}

/// Two members that know each other; a stranger connects to one of them, asks its DHT for
/// the other and for a random key, and listens. It learns nothing, and the member closes
/// its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_gets_no_member_address_listen_address_or_invite() {
    let authority = Authority::new();
    let (a, _a_in) = authority.spawn(1, InviteKind::Valid).await;
    let (b, _b_in) = authority.spawn(2, InviteKind::Valid).await;
    connect(&b, &a).await;
    let b_id = b.local_peer_id();
    eventually(Duration::from_secs(10), "a's DHT holds b", || {
        let a = a.clone();
        async move { a.known_peers().await.unwrap_or_default().contains(&b_id) }
    })
    .await;
    let a_id = PeerId::from_bytes(&a.local_peer_id().to_bytes()).expect("peer id");
    let b_libp2p = PeerId::from_bytes(&b_id.to_bytes()).expect("peer id");
    let mut a_addr: libp2p::Multiaddr = address_of(&a).await.parse().expect("multiaddr");
    a_addr.pop();

    let key = libp2p::identity::Keypair::generate_ed25519();
    let local = key.public().to_peer_id();
    let mut stranger = libp2p::SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_quic()
        .with_behaviour(|key| {
            let mut kad_config = kad::Config::new(
                StreamProtocol::try_from_owned(format!("/murmur/{SWARM}/kad/1.0.0"))
                    .expect("protocol"),
            );
            kad_config.set_query_timeout(WATCH);
            let mut kad =
                kad::Behaviour::with_config(local, kad::store::MemoryStore::new(local), kad_config);
            kad.set_mode(Some(kad::Mode::Client));
            Stranger {
                kad,
                identify: identify::Behaviour::new(identify::Config::new(
                    format!("/murmur/{SWARM}/1"),
                    key.public(),
                )),
                control: request_response::Behaviour::with_codec(
                    AnyBytes,
                    [(
                        StreamProtocol::try_from_owned(format!("/murmur/{SWARM}/control/1"))
                            .expect("protocol"),
                        request_response::ProtocolSupport::Full,
                    )],
                    request_response::Config::default(),
                ),
            }
        })
        .expect("behaviour")
        .with_swarm_config(|c| c.with_idle_connection_timeout(WATCH))
        .build();
    stranger
        .behaviour_mut()
        .kad
        .add_address(&a_id, a_addr.clone());
    stranger.behaviour_mut().kad.get_closest_peers(b_libp2p);
    stranger
        .behaviour_mut()
        .kad
        .get_closest_peers(PeerId::random());

    let mut learned = Learned::default();
    let deadline = Instant::now() + WATCH;
    while !learned.closed {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(event) = tokio::time::timeout(left, stranger.select_next_some()).await else {
            break;
        };
        match event {
            SwarmEvent::Behaviour(StrangerEvent::Kad(kad::Event::OutboundQueryProgressed {
                result: kad::QueryResult::GetClosestPeers(result),
                ..
            })) => {
                let peers = match result {
                    Ok(ok) => ok.peers,
                    Err(kad::GetClosestPeersError::Timeout { peers, .. }) => peers,
                };
                learned
                    .kad_peers
                    .extend(peers.into_iter().map(|p| p.peer_id));
            }
            SwarmEvent::Behaviour(StrangerEvent::Kad(kad::Event::RoutingUpdated {
                peer, ..
            })) if peer != a_id => learned.kad_peers.push(peer),
            SwarmEvent::Behaviour(StrangerEvent::Identify(identify::Event::Received {
                info,
                ..
            })) => learned.identify_addrs += info.listen_addrs.len(),
            SwarmEvent::Behaviour(StrangerEvent::Control(
                request_response::Event::Message {
                    message: request_response::Message::Request { .. },
                    ..
                }
                | request_response::Event::InboundFailure { .. },
            )) => learned.requests += 1,
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established: 0,
                ..
            } if peer_id == a_id => learned.closed = true,
            _ => {}
        }
    }
    assert!(
        !learned.kad_peers.contains(&b_libp2p),
        "Kademlia handed the stranger a member: {learned:?}"
    );
    assert!(
        learned.kad_peers.is_empty(),
        "Kademlia answered the stranger: {learned:?}"
    );
    assert_eq!(learned.identify_addrs, 0, "identify answered: {learned:?}");
    assert_eq!(
        learned.requests, 0,
        "a hello reached the stranger: {learned:?}"
    );
    assert!(
        learned.closed,
        "the member kept the stranger's connection open past its auth deadline: {learned:?}"
    );
    for handle in [a, b] {
        handle.shutdown().await.expect("shutdown");
    }
}
