//! Heartbeats count by their signer's invite, not by who forwards them.
//!
//! A member can relay gossip, so checking the forwarder is not enough: a member could relay
//! heartbeats signed by a key that holds no invite (a phantom), and every round would wait
//! for a peer that does not exist. A heartbeat counts only if this node has verified its
//! signer's invite, and the invite has not run out, whoever forwards it. A member that
//! proved its invite to us and is only momentarily disconnected still counts.

#[path = "net_support/mod.rs"]
mod support;

use std::io;
use std::time::Duration;

use futures::prelude::*;
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{StreamProtocol, gossipsub, request_response};
use murmur_gossip::net::{self, ControlFrame, NetEvent, NetHandle, NetInbound};
use murmur_protocol::frame::{FrameHeader, FrameLimits, HEADER_LEN, VERSION};
use murmur_protocol::identity::{Keypair, PayloadType, PeerId, SignedEnvelope};
use murmur_protocol::message::{AuthHello, AveragingMode, HeartbeatBody, Message};
use support::{Authority, InviteKind, SWARM, address_of, connect, eventually};
use tokio::sync::broadcast;

fn body(step: u64) -> HeartbeatBody {
    HeartbeatBody {
        step,
        // Now, so that it is fresh; later steps are later, so none is taken for a replay.
        timestamp_ms: support::wall_ms() + step,
        samples_per_s: 100.0,
        upload_bytes_per_s: 1_000_000,
        download_bytes_per_s: 1_000_000,
        mode: AveragingMode::Sgp,
        samples_accumulated: 64,
        looking_round: 0,
        looking_until_ms: 0,
        incarnation: 1,
    }
}

/// The control protocol as raw frames: a 12-byte header, then the payload it announces.
#[derive(Debug, Clone, Default)]
struct RawFrames;

impl RawFrames {
    async fn read<T: AsyncRead + Unpin + Send>(io: &mut T) -> io::Result<Vec<u8>> {
        let mut header = [0u8; HEADER_LEN];
        io.read_exact(&mut header).await?;
        let parsed = FrameHeader::parse(&header, &FrameLimits::default())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let mut frame = header.to_vec();
        frame.resize(parsed.frame_len(), 0);
        io.read_exact(&mut frame[HEADER_LEN..]).await?;
        Ok(frame)
    }

    async fn write<T: AsyncWrite + Unpin + Send>(io: &mut T, frame: Vec<u8>) -> io::Result<()> {
        io.write_all(&frame).await?;
        io.flush().await
    }
}

impl request_response::Codec for RawFrames {
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
        f: Vec<u8>,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        Self::write(io, f).await
    }

    async fn write_response<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        f: Vec<u8>,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        Self::write(io, f).await
    }
}

/// A member that does not run murmur's network layer: it proves its own valid invite with
/// the auth hello, then publishes gossip under another key.
#[derive(NetworkBehaviour)]
struct RogueMember {
    control: request_response::Behaviour<RawFrames>,
    gossipsub: gossipsub::Behaviour,
}

/// Waits for the next event on `events` that `pick` keeps, for at most `within`.
async fn next_event<T>(
    events: &mut broadcast::Receiver<NetEvent>,
    within: Duration,
    mut pick: impl FnMut(NetEvent) -> Option<T>,
) -> Option<T> {
    tokio::time::timeout(within, async {
        loop {
            match events.recv().await {
                Ok(event) => {
                    if let Some(kept) = pick(event) {
                        return Some(kept);
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .await
    .ok()
    .flatten()
}

/// A member with a valid invite relays a heartbeat whose envelope and gossip author are a
/// key the authority never invited. The victim admits the member, takes the message in (the
/// refusal counter proves it arrived and was judged), but never reports the phantom.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_relaying_a_heartbeat_signed_by_an_uninvited_key_is_refused_and_counted() {
    let authority = Authority::new();
    let (victim, _victim_in) = authority.spawn(1, InviteKind::Valid).await;
    let mut events = victim.subscribe();
    let victim_addr: libp2p::Multiaddr = address_of(&victim).await.parse().expect("multiaddr");

    let member_seed = [90u8; 32];
    let member = Keypair::from_seed(member_seed);
    let member_id = member.peer_id();
    let invite = authority.invite(&member_id, InviteKind::Valid);
    let hello = ControlFrame::encode(&Message::AuthHello(AuthHello {
        min_version: VERSION,
        max_version: VERSION,
        public_key: member.public().to_bytes(),
        nonce: [7; 32],
        invite: &invite,
    }))
    .expect("hello")
    .as_bytes()
    .to_vec();

    let phantom_seed = [91u8; 32];
    let phantom = Keypair::from_seed(phantom_seed);
    let phantom_id = phantom.peer_id();
    let phantom_libp2p =
        libp2p::identity::Keypair::ed25519_from_bytes(phantom_seed).expect("phantom key");
    let envelope = SignedEnvelope::seal(
        &phantom,
        PayloadType::HEARTBEAT,
        &body(5).to_bytes().expect("body"),
    )
    .expect("seal")
    .into_bytes();

    let topic = gossipsub::IdentTopic::new(format!("murmur/{SWARM}/heartbeat"));
    let member_libp2p =
        libp2p::identity::Keypair::ed25519_from_bytes(member_seed).expect("member key");
    let mut rogue = libp2p::SwarmBuilder::with_existing_identity(member_libp2p)
        .with_tokio()
        .with_quic()
        .with_behaviour(|_| RogueMember {
            control: request_response::Behaviour::with_codec(
                RawFrames,
                [(
                    StreamProtocol::try_from_owned(format!("/murmur/{SWARM}/control/1"))
                        .expect("protocol"),
                    request_response::ProtocolSupport::Full,
                )],
                request_response::Config::default(),
            ),
            // Gossip authored and signed by the phantom, sent over the member's connection.
            gossipsub: gossipsub::Behaviour::new(
                gossipsub::MessageAuthenticity::Signed(phantom_libp2p),
                gossipsub::Config::default(),
            )
            .expect("gossipsub"),
        })
        .expect("behaviour")
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(30)))
        .build();
    rogue
        .behaviour_mut()
        .gossipsub
        .subscribe(&topic)
        .expect("subscribe");
    rogue.dial(victim_addr).expect("dial");

    // The member, as the dialer, proves its invite first, and answers the victim's hello
    // with its own. Once told to (after the victim
    // admitted it, so that only the signer can be the reason for a refusal), it publishes
    // the phantom's heartbeat, retrying until the victim's subscription has arrived. It
    // keeps running after that so that the connection stays up.
    let (go_tx, mut go_rx) = tokio::sync::mpsc::channel::<()>(1);
    let (published_tx, mut published_rx) = tokio::sync::mpsc::channel::<()>(1);
    let driver = tokio::spawn(async move {
        let (mut go, mut published) = (false, false);
        let mut retry = tokio::time::interval(Duration::from_millis(50));
        loop {
            tokio::select! {
                event = rogue.select_next_some() => {
                    if let SwarmEvent::ConnectionEstablished { peer_id, .. } = &event {
                        rogue.behaviour_mut().control.send_request(peer_id, hello.clone());
                    }
                    if let SwarmEvent::Behaviour(RogueMemberEvent::Control(
                        request_response::Event::Message {
                            message: request_response::Message::Request { channel, .. },
                            ..
                        },
                    )) = event
                    {
                        let _ = rogue
                            .behaviour_mut()
                            .control
                            .send_response(channel, hello.clone());
                    }
                }
                Some(()) = go_rx.recv(), if !go => go = true,
                _ = retry.tick(), if go && !published => {
                    published = rogue
                        .behaviour_mut()
                        .gossipsub
                        .publish(topic.clone(), envelope.clone())
                        .is_ok();
                    if published {
                        let _ = published_tx.try_send(());
                    }
                }
            }
        }
    });

    let admitted = next_event(&mut events, Duration::from_secs(5), |e| match e {
        NetEvent::PeerAuthorized { peer, .. } if peer == member_id => Some(()),
        _ => None,
    })
    .await;
    assert_eq!(admitted, Some(()), "the member's own invite is accepted");
    go_tx.send(()).await.expect("the member runs");
    let published = tokio::time::timeout(Duration::from_secs(5), published_rx.recv()).await;
    assert_eq!(
        published,
        Ok(Some(())),
        "the member published the phantom's heartbeat"
    );

    // Judged either way within the bound: reported (the bug) or refused and counted.
    let verdict = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let refused = victim
                .metrics()
                .snapshot()
                .heartbeats_refused_uninvited_signer;
            if refused >= 1 {
                return "refused and counted";
            }
            match tokio::time::timeout(Duration::from_millis(50), events.recv()).await {
                Ok(Ok(NetEvent::Heartbeat { peer, .. })) if peer == phantom_id => {
                    return "reported as a peer";
                }
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => {}
            }
        }
    })
    .await;
    assert_eq!(
        verdict,
        Ok("refused and counted"),
        "the phantom's heartbeat, relayed by a member"
    );
    let phantom_heard = next_event(&mut events, Duration::from_millis(300), |e| match e {
        NetEvent::Heartbeat { peer, .. } if peer == phantom_id => Some(()),
        _ => None,
    })
    .await;
    assert_eq!(phantom_heard, None, "the phantom's heartbeat was delivered");
    let metrics = victim.metrics().snapshot();
    assert_eq!(metrics.heartbeats_received, 0, "{metrics:?}");
    assert_eq!(
        (
            metrics.gossip_rejected,
            metrics.heartbeats_refused_uninvited_signer
        ),
        (1, 1),
        "one message, refused for its signer alone (and counted as rejected gossip too)"
    );
    driver.abort();
    victim.shutdown().await.expect("shutdown");
}

/// A config for `seed` whose DHT does not refresh during the test, so that nothing dials a
/// peer the test disconnected.
async fn spawn_quiet(authority: &Authority, seed: u8) -> (NetHandle, NetInbound) {
    let (mut config, identity) = authority.config(seed, InviteKind::Valid);
    config.dht_refresh_interval_ms = 3_600_000;
    net::spawn(&config, identity).await.expect("network starts")
}

/// Whether `handle` has verified each of `peers` (and they it).
async fn knows_all(handle: &NetHandle, peers: &[PeerId]) -> bool {
    let known = handle.peers().await.unwrap_or_default();
    peers.iter().all(|p| known.contains(p))
}

/// A and C verified each other's invites, then A dropped its connection to C. C's
/// heartbeats still reach A through B, and count: C proved its invite to A and the invite
/// has not run out. A's events prove the path: after C's disconnection, C's heartbeat comes
/// before any new authorization of C, so C did not hand it over itself (gossip from a peer
/// not yet admitted again is rejected).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_heartbeat_relayed_while_it_is_disconnected_from_us_still_counts() {
    let authority = Authority::new();
    let (a, _a_in) = spawn_quiet(&authority, 1).await;
    let (b, _b_in) = spawn_quiet(&authority, 2).await;
    let (c, _c_in) = spawn_quiet(&authority, 3).await;
    let (a_id, b_id, c_id) = (a.local_peer_id(), b.local_peer_id(), c.local_peer_id());
    connect(&b, &a).await;
    connect(&c, &b).await;
    connect(&c, &a).await;
    eventually(Duration::from_secs(10), "all three meet", || {
        let (a, b, c) = (a.clone(), b.clone(), c.clone());
        async move {
            knows_all(&a, &[b_id, c_id]).await
                && knows_all(&b, &[a_id, c_id]).await
                && knows_all(&c, &[a_id, b_id]).await
        }
    })
    .await;

    // Each new routing-table entry makes the DHT bootstrap (throttled to one per 500 ms),
    // and a bootstrap dials every peer in the table: let those from the meeting run first,
    // so that they do not connect A and C again.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // C keeps publishing (publishing fails while it knows no subscriber).
    let publisher = {
        let c = c.clone();
        tokio::spawn(async move {
            for step in 1.. {
                let _ = c.publish_heartbeat(&body(step)).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    // A drops C, then waits for C's heartbeat. Should a late bootstrap connect them again
    // first, A drops C once more (a few times at most).
    let mut a_events = a.subscribe();
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        a.disconnect(&c_id).await.expect("disconnect");
        let gone = next_event(&mut a_events, Duration::from_secs(5), |e| match e {
            NetEvent::PeerDisconnected { peer } if peer == c_id => Some(()),
            _ => None,
        })
        .await;
        assert_eq!(gone, Some(()), "A drops its connection to C");
        let first = next_event(&mut a_events, Duration::from_secs(5), |e| match e {
            NetEvent::Heartbeat { peer, .. } if peer == c_id => Some("relayed heartbeat"),
            NetEvent::PeerAuthorized { peer, .. } if peer == c_id => Some("direct reconnection"),
            _ => None,
        })
        .await;
        outcomes.push(first);
        if first != Some("direct reconnection") {
            break;
        }
    }
    publisher.abort();
    assert_eq!(
        outcomes.last().copied().flatten(),
        Some("relayed heartbeat"),
        "C's heartbeat reaches A through B while A and C are not connected: {outcomes:?}"
    );
    let metrics = a.metrics().snapshot();
    assert_eq!(
        metrics.heartbeats_refused_uninvited_signer, 0,
        "{metrics:?}"
    );
    for h in [a, b, c] {
        h.shutdown().await.expect("shutdown");
    }
}
