//! Membership gossip and control requests between authorized peers.

#[path = "net_support/mod.rs"]
mod support;

use std::time::Duration;

use futures::StreamExt as _;
use libp2p::gossipsub;
use murmur_gossip::net::NetEvent;
use murmur_protocol::frame::{Frame, FrameLimits};
use murmur_protocol::identity::{Keypair, PayloadType, SignedEnvelope};
use murmur_protocol::message::{
    AveragingMode, HeartbeatBody, Message, Reject, RejectCode, StateSyncRequest,
};
use support::{Authority, InviteKind, SWARM, address_of, connect};

fn body(step: u64) -> HeartbeatBody {
    HeartbeatBody {
        step,
        // Now, so that it is fresh; later steps are later, so none is taken for a replay.
        timestamp_ms: support::wall_ms() + step,
        samples_per_s: 1234.5,
        upload_bytes_per_s: 10_000_000,
        download_bytes_per_s: 20_000_000,
        mode: AveragingMode::Butterfly,
        samples_accumulated: 4096,
        looking_round: 0,
        looking_until_ms: 0,
        incarnation: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_reaches_the_other_peers_with_its_signer_verified() {
    let authority = Authority::new();
    let (a, _a_in) = authority.spawn(1, InviteKind::Valid).await;
    let (b, _b_in) = authority.spawn(2, InviteKind::Valid).await;
    let (c, _c_in) = authority.spawn(3, InviteKind::Valid).await;
    connect(&b, &a).await;
    connect(&c, &a).await;
    // A heartbeat counts only once its signer has proved its invite to the receiver, so c
    // waits until the DHT has introduced it to b. Then b publishes; a hears it directly, c
    // through a or directly: either way the signer, not the forwarder, is reported.
    let b_id = b.local_peer_id();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !c.peers().await.unwrap_or_default().contains(&b_id) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the DHT introduces c to b");
    let mut a_events = a.subscribe();
    let mut c_events = c.subscribe();

    // Publishing fails until the other peers' subscriptions have arrived; keep trying.
    let published = tokio::time::timeout(Duration::from_secs(10), async {
        let mut step = 0;
        loop {
            step += 1;
            if b.publish_heartbeat(&body(step)).await.is_ok() {
                return step;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("a heartbeat is published");

    for events in [&mut a_events, &mut c_events] {
        let heard = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Ok(NetEvent::Heartbeat { peer, body }) = events.recv().await {
                    return (peer, body);
                }
            }
        })
        .await
        .expect("the heartbeat arrives");
        // The timestamp is the wall clock's at publishing, so it is taken as heard.
        let expected = HeartbeatBody {
            timestamp_ms: heard.1.timestamp_ms,
            ..body(published)
        };
        assert_eq!(heard, (b.local_peer_id(), expected));
    }
    for h in [&a, &c] {
        assert!(h.metrics().snapshot().heartbeats_received >= 1);
        assert_eq!(h.metrics().snapshot().gossip_rejected, 0);
    }
    for h in [a, b, c] {
        h.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_request_is_answered_by_the_application() {
    let authority = Authority::new();
    let (a, _a_in) = authority.spawn(1, InviteKind::Valid).await;
    let (b, mut b_in) = authority.spawn(2, InviteKind::Valid).await;
    connect(&a, &b).await;
    tokio::time::timeout(Duration::from_secs(5), async {
        while !a
            .peers()
            .await
            .unwrap_or_default()
            .contains(&b.local_peer_id())
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a and b authorize each other");

    let request = Message::StateSyncRequest(StateSyncRequest {
        from_offset: 64,
        max_bytes: 4096,
        expected_digest: [0; 32],
    });
    let limits = FrameLimits::default();
    let responder = {
        let b = b.clone();
        async move {
            let inbound =
                tokio::time::timeout(Duration::from_secs(5), b_in.control_requests.recv())
                    .await
                    .expect("the request arrives")
                    .expect("running");
            let (frame, _) = Frame::parse(inbound.frame.as_bytes(), &limits).expect("frame");
            let asked = match Message::from_frame(&frame).expect("message") {
                Message::StateSyncRequest(r) => r.from_offset,
                other => panic!("unexpected {other:?}"),
            };
            assert_eq!(asked, 64);
            let answer = Message::Reject(Reject {
                code: RejectCode::Unavailable,
                text: "no snapshot yet",
            });
            b.respond_control(inbound.id, &answer)
                .await
                .expect("respond");
            inbound.peer
        }
    };
    let b_id = b.local_peer_id();
    let (response, asker) = tokio::join!(a.send_control(&b_id, &request), responder);
    assert_eq!(asker, a.local_peer_id());
    let response = response.expect("answered");
    let (frame, _) = Frame::parse(response.as_bytes(), &limits).expect("frame");
    match Message::from_frame(&frame).expect("message") {
        Message::Reject(r) => {
            assert_eq!(r.code, RejectCode::Unavailable);
            assert_eq!(r.text, "no snapshot yet");
        }
        other => panic!("unexpected {other:?}"),
    }
    for h in [a, b] {
        h.shutdown().await.expect("shutdown");
    }
}

/// AutoNAT's dial-backs open a second connection between two members, which the side that
/// dialed closes at once; a control request sent over it while it was open failed with
/// "connection closed" (seen as a state download cut off 15 s into a join). Two members
/// that probe each other every second exchange control requests, eight in flight, through
/// their first dial-backs: every request is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_requests_go_on_through_reachability_dial_backs() {
    let authority = Authority::new();
    let probing = |seed: u8| {
        let (mut config, identity) = authority.config(seed, InviteKind::Valid);
        config.reachability_probe_interval_ms = 1_000;
        (config, identity)
    };
    let (config, identity) = probing(1);
    let (a, _a_in) = murmur_gossip::net::spawn(&config, identity)
        .await
        .expect("a starts");
    let (config, identity) = probing(2);
    let (b, mut b_in) = murmur_gossip::net::spawn(&config, identity)
        .await
        .expect("b starts");
    connect(&a, &b).await;
    let (a_id, b_id) = (a.local_peer_id(), b.local_peer_id());
    a.wait_ready(&b_id)
        .await
        .expect("a and b verified each other");
    b.wait_ready(&a_id)
        .await
        .expect("b and a verified each other");

    let responder = {
        let b = b.clone();
        tokio::spawn(async move {
            let answer = Message::Reject(Reject {
                code: RejectCode::Unavailable,
                text: "no snapshot yet",
            });
            while let Some(inbound) = b_in.control_requests.recv().await {
                let _ = b.respond_control(inbound.id, &answer).await;
            }
        })
    };
    let request = Message::StateSyncRequest(StateSyncRequest {
        from_offset: 0,
        max_bytes: 4096,
        expected_digest: [0; 32],
    });
    let until = tokio::time::Instant::now() + Duration::from_secs(6);
    let mut answered = 0u32;
    let mut in_flight = futures::stream::FuturesUnordered::new();
    while tokio::time::Instant::now() < until && answered < 200_000 {
        while in_flight.len() < 8 {
            in_flight.push(a.send_control(&b_id, &request));
        }
        let answer = in_flight.next().await.expect("eight in flight");
        answer.unwrap_or_else(|e| panic!("request {answered} failed: {e}"));
        answered += 1;
    }
    let public = |h: &murmur_gossip::net::NetHandle| {
        h.metrics().reachability() == murmur_gossip::net::Reachability::Public
    };
    assert!(
        public(&a) && public(&b),
        "each was dialed back by the other ({answered} requests answered)"
    );
    drop(in_flight);
    for h in [a, b] {
        h.shutdown().await.expect("shutdown");
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), responder).await;
}

/// A gossipsub node on the swarm's topic, with a key but no invite, connected to a member
/// of a swarm whose members publish heartbeats. Its own heartbeats are well formed and
/// signed by its key, so only authorization can keep them out. It never learns that the
/// member takes the topic, hears none of the members' heartbeats, none of its own reach the
/// member, and the member closes the connection at its auth deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_on_the_heartbeat_topic_hears_nothing_and_is_not_heard() {
    let authority = Authority::new();
    let (good, _good_in) = authority.spawn(1, InviteKind::Valid).await;
    let (other, _other_in) = authority.spawn(2, InviteKind::Valid).await;
    connect(&other, &good).await;
    assert!(
        heartbeat_arrives(&other, &good, Duration::from_secs(10)).await,
        "members hear each other"
    );
    let mut events = good.subscribe();
    let good_addr: libp2p::Multiaddr = address_of(&good).await.parse().expect("multiaddr");
    let good_id = libp2p::PeerId::from_bytes(&good.local_peer_id().to_bytes()).expect("id");

    let seed = [66u8; 32];
    let key = libp2p::identity::Keypair::ed25519_from_bytes(seed).expect("key");
    let topic = gossipsub::IdentTopic::new(format!("murmur/{SWARM}/heartbeat"));
    let mut intruder = libp2p::SwarmBuilder::with_existing_identity(key.clone())
        .with_tokio()
        .with_quic()
        .with_behaviour(|key| {
            gossipsub::Behaviour::<
                gossipsub::IdentityTransform,
                gossipsub::AllowAllSubscriptionFilter,
            >::new(
                gossipsub::MessageAuthenticity::Signed(key.clone()),
                gossipsub::Config::default(),
            )
            .expect("gossipsub")
        })
        .expect("behaviour")
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(10)))
        .build();
    intruder
        .behaviour_mut()
        .subscribe(&topic)
        .expect("subscribe");
    intruder.dial(good_addr).expect("dial");
    let heartbeat = body(9).to_bytes().expect("body");
    let envelope = SignedEnvelope::seal(
        &Keypair::from_seed(seed),
        PayloadType::HEARTBEAT,
        &heartbeat,
    )
    .expect("seal")
    .into_bytes();

    // Past the members' 3 s auth deadline; the members publish all along.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    let mut publish = tokio::time::interval(Duration::from_millis(200));
    let (mut subscriptions, mut messages, mut closed, mut step) = (0, 0, false, 100);
    while !closed && tokio::time::Instant::now() < deadline {
        tokio::select! {
            _ = publish.tick() => {
                step += 1;
                let _ = other.publish_heartbeat(&body(step)).await;
                let _ = good.publish_heartbeat(&body(step)).await;
                // Fails while the intruder knows no subscriber, as it should.
                let _ = intruder.behaviour_mut().publish(topic.clone(), envelope.clone());
            }
            event = intruder.select_next_some() => match event {
                libp2p::swarm::SwarmEvent::Behaviour(gossipsub::Event::Subscribed { .. }) => {
                    subscriptions += 1;
                }
                libp2p::swarm::SwarmEvent::Behaviour(gossipsub::Event::Message { .. }) => {
                    messages += 1;
                }
                libp2p::swarm::SwarmEvent::ConnectionClosed {
                    peer_id,
                    num_established: 0,
                    ..
                } if peer_id == good_id => closed = true,
                _ => {}
            },
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
    assert_eq!(subscriptions, 0, "the stranger learned the member's topic");
    assert_eq!(messages, 0, "a member's heartbeat reached the stranger");
    assert!(
        closed,
        "the member kept the stranger past its auth deadline"
    );
    let intruder_id = Keypair::from_seed(seed).peer_id();
    while let Ok(event) = events.try_recv() {
        if let NetEvent::Heartbeat { peer, .. } = event {
            assert_ne!(peer, intruder_id, "the stranger's heartbeat was delivered");
        }
    }
    assert_eq!(
        good.metrics().snapshot().gossip_rejected,
        0,
        "a stranger's message was read"
    );
    for h in [good, other] {
        h.shutdown().await.expect("shutdown");
    }
}

/// Publishes heartbeats from `from` until `to` hears one signed by `from` (bounded).
async fn heartbeat_arrives(
    from: &murmur_gossip::net::NetHandle,
    to: &murmur_gossip::net::NetHandle,
    within: Duration,
) -> bool {
    let mut events = to.subscribe();
    let expected = from.local_peer_id();
    tokio::time::timeout(within, async {
        let mut step = 0;
        loop {
            step += 1;
            // Fails while no subscriber is known; the next attempt may succeed.
            let _ = from.publish_heartbeat(&body(step)).await;
            let heard = tokio::time::timeout(Duration::from_millis(200), async {
                loop {
                    match events.recv().await {
                        Ok(NetEvent::Heartbeat { peer, .. }) if peer == expected => return true,
                        Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return false,
                    }
                }
            })
            .await;
            if heard == Ok(true) {
                return;
            }
        }
    })
    .await
    .is_ok()
}

/// A peer that crashed (no close sent: its connection stays open at the other side until
/// the idle timeout) and restarted under the same key: once the survivor has closed the
/// stale connection, as the daemon does with a peer whose heartbeats stopped, the two hear
/// each other's heartbeats again on the fresh connection.
#[test]
fn a_peer_restarted_under_its_key_is_heard_again_once_the_stale_connection_is_closed() {
    let authority = Authority::new();
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let (a, _a_in) = main.block_on(authority.spawn(1, InviteKind::Valid));

    // The first life of peer 2 runs on a runtime of its own, dropped without a goodbye.
    let crashed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let (b, b_in) = crashed.block_on(authority.spawn(2, InviteKind::Valid));
    crashed.block_on(connect(&b, &a));
    assert!(
        main.block_on(heartbeat_arrives(&b, &a, Duration::from_secs(10))),
        "the first life's heartbeat arrives"
    );
    let b_id = b.local_peer_id();
    drop((b, b_in));
    crashed.shutdown_background();

    main.block_on(async {
        a.disconnect(&b_id)
            .await
            .expect("the stale connection is closed");
        let (b2, _b2_in) = authority.spawn(2, InviteKind::Valid).await;
        assert_eq!(b2.local_peer_id(), b_id, "the same key, the same peer");
        connect(&b2, &a).await;
        assert!(
            heartbeat_arrives(&b2, &a, Duration::from_secs(8)).await,
            "the survivor hears the restarted peer"
        );
        assert!(
            heartbeat_arrives(&a, &b2, Duration::from_secs(8)).await,
            "the restarted peer hears the survivor"
        );
        for h in [a, b2] {
            h.shutdown().await.expect("shutdown");
        }
    });
}

/// The same crash, but the restarted peer connects while the survivor still holds the
/// dead connection (a restart quicker than the survivor's silence check). Its hello on the
/// fresh connection tells the survivor it restarted, and the survivor closes the dead one
/// at once (otherwise gossip to the restarted peer would go out on the dead connection
/// until the QUIC idle timeout) and announces its topic again (gossip announces topics
/// only on a first connection, so the restarted peer would never send it heartbeats).
#[test]
fn a_peer_restarted_under_its_key_hears_the_swarm_before_the_stale_connection_times_out() {
    let authority = Authority::new();
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let (a, _a_in) = main.block_on(authority.spawn(1, InviteKind::Valid));

    let crashed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let (b, b_in) = crashed.block_on(authority.spawn(2, InviteKind::Valid));
    crashed.block_on(connect(&b, &a));
    assert!(
        main.block_on(heartbeat_arrives(&b, &a, Duration::from_secs(10))),
        "the first life's heartbeat arrives"
    );
    let b_id = b.local_peer_id();
    drop((b, b_in));
    crashed.shutdown_background();

    main.block_on(async {
        let (b2, _b2_in) = authority.spawn(2, InviteKind::Valid).await;
        assert_eq!(b2.local_peer_id(), b_id, "the same key, the same peer");
        connect(&b2, &a).await;
        assert!(
            heartbeat_arrives(&a, &b2, Duration::from_secs(4)).await,
            "the restarted peer hears the survivor well before the idle timeout"
        );
        assert!(
            heartbeat_arrives(&b2, &a, Duration::from_secs(4)).await,
            "the survivor hears the restarted peer (it was told the survivor's topic again)"
        );
        for h in [a, b2] {
            h.shutdown().await.expect("shutdown");
        }
    });
}

/// A burst of heartbeats all arrive, and the gossip stream that carried them stays up.
/// Several small messages read at once used to be checked as one against the per-message
/// bound: the reader took the buffer for an oversized message and closed the stream, and
/// after five such closes gossipsub gave up on the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_heartbeats_arrives_whole() {
    const BURST: u64 = 64;
    let authority = Authority::new();
    let (a, _a_in) = authority.spawn(1, InviteKind::Valid).await;
    let (b, _b_in) = authority.spawn(2, InviteKind::Valid).await;
    connect(&b, &a).await;
    assert!(
        heartbeat_arrives(&b, &a, Duration::from_secs(10)).await,
        "a first heartbeat arrives"
    );
    let mut events = a.subscribe();
    // Steps (and so timestamps) past those of the first heartbeats, and within the
    // freshness bound.
    let first = 10_000;
    for step in first..first + BURST {
        b.publish_heartbeat(&body(step)).await.expect("published");
    }
    let mut heard = std::collections::BTreeSet::new();
    let all = tokio::time::timeout(Duration::from_secs(10), async {
        while heard.len() < BURST as usize {
            match events.recv().await {
                Ok(NetEvent::Heartbeat { body, .. }) if body.step >= first => {
                    heard.insert(body.step);
                }
                Ok(_) => {}
                Err(e) => panic!("a's events: {e}"),
            }
        }
    })
    .await;
    assert!(all.is_ok(), "{} of {BURST} heartbeats arrived", heard.len());
    for h in [a, b] {
        h.shutdown().await.expect("shutdown");
    }
}
