//! A stranger: a libp2p client with no invite that connects to a member, asks its
//! Kademlia for another member and for a random key, and listens for identify and for a
//! hello. Shared by the in-process test (`net_strangers`) and the one against real
//! `murmur run` processes (`daemon/tests/run_strangers.rs`); it needs only libp2p, futures
//! and tokio.

use std::io;
use std::time::{Duration, Instant};

use futures::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, StreamExt as _};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, StreamProtocol, identify, kad, request_response};

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
pub(crate) struct Learned {
    /// Peer ids Kademlia's answers named.
    pub(crate) kad_peers: Vec<PeerId>,
    /// Listen addresses identify reported.
    pub(crate) identify_addrs: usize,
    /// Requests (a hello would be one) that reached it.
    pub(crate) requests: usize,
    /// Its connection to the member closed.
    pub(crate) closed: bool,
}

/// Connects to `member` (of swarm `swarm`, listening on `address`, a QUIC address without
/// its `/p2p` part) with no invite, asks its Kademlia for `other` and for a random key, and
/// listens for `watch`, or until the member closes the connection.
pub(crate) async fn probe(
    swarm: &str,
    member: PeerId,
    address: Multiaddr,
    other: PeerId,
    watch: Duration,
) -> Learned {
    let key = libp2p::identity::Keypair::generate_ed25519();
    let local = key.public().to_peer_id();
    let mut stranger = libp2p::SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_quic()
        .with_behaviour(|key| {
            let mut kad_config = kad::Config::new(
                StreamProtocol::try_from_owned(format!("/murmur/{swarm}/kad/1.0.0"))
                    .expect("protocol"),
            );
            kad_config.set_query_timeout(watch);
            let mut kad =
                kad::Behaviour::with_config(local, kad::store::MemoryStore::new(local), kad_config);
            kad.set_mode(Some(kad::Mode::Client));
            Stranger {
                kad,
                identify: identify::Behaviour::new(identify::Config::new(
                    format!("/murmur/{swarm}/1"),
                    key.public(),
                )),
                control: request_response::Behaviour::with_codec(
                    AnyBytes,
                    [(
                        StreamProtocol::try_from_owned(format!("/murmur/{swarm}/control/1"))
                            .expect("protocol"),
                        request_response::ProtocolSupport::Full,
                    )],
                    request_response::Config::default(),
                ),
            }
        })
        .expect("behaviour")
        .with_swarm_config(|c| c.with_idle_connection_timeout(watch))
        .build();
    stranger.behaviour_mut().kad.add_address(&member, address);
    stranger.behaviour_mut().kad.get_closest_peers(other);
    stranger
        .behaviour_mut()
        .kad
        .get_closest_peers(PeerId::random());

    let mut learned = Learned::default();
    let deadline = Instant::now() + watch;
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
            })) if peer != member => learned.kad_peers.push(peer),
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
            } if peer_id == member => learned.closed = true,
            _ => {}
        }
    }
    learned
}

impl Learned {
    /// Panics unless the stranger learned nothing (no member from Kademlia, no listen
    /// address from identify, no hello) and the member closed its connection.
    pub(crate) fn assert_nothing(&self, other: PeerId) {
        assert!(
            !self.kad_peers.contains(&other),
            "Kademlia handed the stranger a member: {self:?}"
        );
        assert!(
            self.kad_peers.is_empty(),
            "Kademlia answered the stranger: {self:?}"
        );
        assert_eq!(self.identify_addrs, 0, "identify answered: {self:?}");
        assert_eq!(self.requests, 0, "a hello reached the stranger: {self:?}");
        assert!(
            self.closed,
            "the member kept the stranger's connection open past its auth deadline: {self:?}"
        );
    }
}
