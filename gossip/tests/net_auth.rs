//! Authorization: a peer without a valid invite cannot take part. Its connection is closed,
//! the rejection is counted, and none of its tensor bytes reach the application.

#[path = "net_support/mod.rs"]
mod support;

use std::time::Duration;

use futures::{AsyncWriteExt as _, StreamExt as _};
use libp2p::StreamProtocol;
use murmur_gossip::net::{NetEvent, NetHandle, NetInbound};
use murmur_protocol::frame::FrameFlags;
use murmur_protocol::message::{Message, StateSyncRequest};
use support::{Authority, InviteKind, SWARM, address_of, connect, eventually};

/// Nothing may arrive on the inbound tensor queue within `quiet`.
async fn assert_no_tensor_stream(inbound: &mut NetInbound, quiet: Duration) {
    let got = tokio::time::timeout(quiet, inbound.tensor_streams.recv()).await;
    assert!(
        got.is_err(),
        "an unauthorized peer's tensor stream reached the application"
    );
}

async fn rejected_peer_is_disconnected_and_counted(kind: InviteKind) {
    let authority = Authority::new();
    let (good, mut good_inbound) = authority.spawn(1, InviteKind::Valid).await;
    let mut events = good.subscribe();
    let (bad, _bad_inbound) = authority.spawn(2, kind).await;
    let bad_id = bad.local_peer_id();
    connect(&bad, &good).await;

    eventually(Duration::from_secs(5), "the rejection is counted", || {
        let good = good.clone();
        async move { good.metrics().snapshot().auth_rejected >= 1 }
    })
    .await;
    let rejected = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match events.recv().await {
                Ok(NetEvent::PeerRejected { peer, .. }) if peer == bad_id => return true,
                Ok(NetEvent::PeerAuthorized { peer, .. }) if peer == bad_id => return false,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    })
    .await;
    assert_eq!(
        rejected,
        Ok(true),
        "{kind:?}: the peer is reported rejected, never authorized"
    );

    // The bad peer cannot open a tensor stream, and nothing reaches the good peer.
    // It learns so at once, not after its own timeouts.
    let opened = tokio::time::timeout(
        Duration::from_secs(2),
        bad.open_tensor_stream(&good.local_peer_id()),
    )
    .await
    .expect("the refusal is prompt");
    assert!(
        opened.is_err(),
        "{kind:?}: an unauthorized peer opened a tensor stream"
    );
    assert!(!good.peers().await.expect("peers").contains(&bad_id));
    assert!(!good.known_peers().await.expect("known").contains(&bad_id));
    assert_no_tensor_stream(&mut good_inbound, Duration::from_millis(500)).await;

    // It is not only a refusal: the connection goes.
    eventually(
        Duration::from_secs(5),
        "the bad peer is disconnected",
        || {
            let bad = bad.clone();
            let good_id = good.local_peer_id();
            async move { !bad.peers().await.unwrap_or_default().contains(&good_id) }
        },
    )
    .await;
    assert_eq!(good.metrics().snapshot().peers_authorized, 0);
    shutdown(&[good, bad]).await;
}

async fn shutdown(handles: &[NetHandle]) {
    for handle in handles {
        handle.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_invite_is_rejected() {
    rejected_peer_is_disconnected_and_counted(InviteKind::Expired).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invite_for_another_swarm_is_rejected() {
    rejected_peer_is_disconnected_and_counted(InviteKind::OtherSwarm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invite_from_another_authority_is_rejected() {
    rejected_peer_is_disconnected_and_counted(InviteKind::WrongAuthority).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_an_invite_has_its_tensor_bytes_dropped_unread_and_is_disconnected() {
    let authority = Authority::new();
    let (good, mut good_inbound) = authority.spawn(1, InviteKind::Valid).await;
    let good_id = libp2p::PeerId::from_bytes(&good.local_peer_id().to_bytes()).expect("peer id");
    let good_addr: libp2p::Multiaddr = address_of(&good).await.parse().expect("multiaddr");

    // A bare libp2p node: it speaks the tensor protocol but has no invite and no auth.
    let key = libp2p::identity::Keypair::ed25519_from_bytes([77u8; 32]).expect("key");
    let mut intruder = libp2p::SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_quic()
        .with_behaviour(|_| libp2p_stream::Behaviour::new())
        .expect("behaviour")
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(30)))
        .build();
    let mut control = intruder.behaviour().new_control();
    intruder.dial(good_addr).expect("dial");
    let (closed_tx, mut closed_rx) = tokio::sync::mpsc::channel(4);
    let driver = tokio::spawn(async move {
        loop {
            if let libp2p::swarm::SwarmEvent::ConnectionClosed { .. } =
                intruder.select_next_some().await
            {
                let _ = closed_tx.try_send(());
            }
        }
    });

    // Valid frames, so that only authorization can keep them out.
    let protocol =
        StreamProtocol::try_from_owned(format!("/murmur/{SWARM}/tensor/1")).expect("protocol");
    let request = Message::StateSyncRequest(StateSyncRequest {
        from_offset: 0,
        max_bytes: 1024,
        expected_digest: [0; 32],
    });
    let mut frame = vec![0u8; request.frame_len()];
    let len = request
        .encode_frame(FrameFlags::EMPTY, &mut frame)
        .expect("encode");
    let sent = tokio::time::timeout(Duration::from_secs(5), async {
        let mut stream = control.open_stream(good_id, protocol).await.ok()?;
        for _ in 0..100 {
            stream.write_all(&frame[..len]).await.ok()?;
        }
        stream.flush().await.ok()
    })
    .await;

    // The intruder is disconnected (it cannot answer the hello) and counted.
    let closed = tokio::time::timeout(Duration::from_secs(5), closed_rx.recv()).await;
    assert!(closed.is_ok(), "the intruder's connection was closed");
    let metrics = good.metrics().snapshot();
    assert!(
        metrics.auth_rejected + metrics.auth_timeouts >= 1,
        "{metrics:?}"
    );
    if matches!(sent, Ok(Some(()))) {
        // Its stream got as far as the network task, which dropped it unread.
        assert!(
            metrics.tensor_streams_refused_unauthorized >= 1,
            "{metrics:?}"
        );
    }
    assert_eq!(metrics.tensor_streams_accepted, 0, "{metrics:?}");
    assert_eq!(metrics.tensor_bytes_received, 0, "{metrics:?}");
    assert_no_tensor_stream(&mut good_inbound, Duration::from_millis(500)).await;
    driver.abort();
    shutdown(&[good]).await;
}
