//! Mailbox and outbox between two authorized peers: parcels of every averaging kind arrive
//! whole and in order, each is reported sent, buffers are reused, and a parcel for a peer
//! that is gone comes back as failed instead of vanishing, the parcels queued behind it
//! without dialing it again each.

#[path = "net_support/mod.rs"]
mod support;

use std::time::Duration;

use murmur_gossip::net::exchange::{
    Delivery, Mailbox, MailboxConfig, Outbox, OutboxConfig, Parcel,
};
use murmur_gossip::net::{self, NetHandle, NetInbound};
use murmur_protocol::codec::CodecSpec;
use murmur_protocol::identity::PeerId;
use murmur_protocol::message::{
    AveragedChunk, ChunkAddress, GroupReject, GroupRejectReason, JoinGroup, PushSumShare,
    TensorPartChunk,
};
use support::{Authority, InviteKind, connect, eventually};

const WAIT: Duration = Duration::from_secs(10);

fn parcels(peer: PeerId, other: PeerId) -> Vec<Parcel> {
    let address = ChunkAddress {
        group_id: 9,
        part: 1,
        chunk: 2,
        offset: 64,
        elements: 3,
    };
    vec![
        Parcel::Share(
            PushSumShare {
                step: 5,
                chunk: 0,
                chunk_count: 1,
                offset: 0,
                elements: 3,
                weight: 0.25,
                reference_step: Some(4),
                codec: CodecSpec::F32,
                payload: &[],
            },
            [1.0f32, -2.0, 3.5]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        ),
        Parcel::PartChunk(
            TensorPartChunk {
                address,
                weight: 16.0,
                codec: CodecSpec::F32,
                payload: &[],
            },
            vec![7; 12],
        ),
        Parcel::Averaged(
            AveragedChunk {
                address,
                contributors: 3,
                total_weight: 48.0,
                codec: CodecSpec::F32,
                payload: &[],
            },
            vec![9; 12],
        ),
        Parcel::JoinGroup(JoinGroup {
            round: 3,
            deadline_ms: 1_000,
            bandwidth_bytes_per_s: 1 << 20,
            accepts_connections: true,
            samples: 64,
        }),
        Parcel::GroupBegin {
            round: 3,
            group_id: 77,
            members: vec![(peer, 10), (other, 0)],
        },
        Parcel::GroupReject(GroupReject {
            round: 3,
            reason: GroupRejectReason::GroupFull,
        }),
    ]
}

/// Peers `a` and `b` (keys from `seed` and `seed + 1`), connected and authorized to each
/// other; `b`'s inbound side.
async fn authorized_pair(seed: u8) -> (NetHandle, NetHandle, NetInbound) {
    let authority = Authority::new();
    let (a, _a_in) = authority.spawn(seed, InviteKind::Valid).await;
    let (b, b_in) = authority.spawn(seed + 1, InviteKind::Valid).await;
    connect(&a, &b).await;
    let b_id = b.local_peer_id();
    eventually(WAIT, "a and b authorize each other", || async {
        a.peers().await.unwrap_or_default().contains(&b_id)
    })
    .await;
    (a, b, b_in)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parcels_arrive_whole_in_order_and_are_reported() {
    let (a, b, b_in) = authorized_pair(1).await;
    let b_id = b.local_peer_id();

    let mut mailbox = Mailbox::spawn(b_in.tensor_streams, MailboxConfig::default());
    let mut outbox = Outbox::new(a.clone(), OutboxConfig::default());
    let sent = parcels(b_id, a.local_peer_id());
    for round in 0..3u64 {
        for (i, parcel) in sent.iter().enumerate() {
            let tag = round * 100 + i as u64;
            outbox
                .send(b_id, tag, parcel.clone())
                .expect("room in the queue");
        }
        for (i, expected) in sent.iter().enumerate() {
            let delivery = tokio::time::timeout(WAIT, mailbox.recv())
                .await
                .expect("a parcel arrives in time")
                .expect("the mailbox is open");
            assert_eq!(delivery.from, a.local_peer_id());
            assert_eq!(&delivery.parcel, expected, "parcel {i} of round {round}");
            mailbox.recycle(delivery.parcel.into_payload());
        }
        for i in 0..sent.len() {
            let report = tokio::time::timeout(WAIT, outbox.next_report())
                .await
                .expect("a report in time")
                .expect("the outbox is open");
            assert_eq!(report.to, b_id);
            assert_eq!(report.tag, round * 100 + i as u64, "reports come in order");
            assert!(report.result.is_ok(), "{:?}", report.result);
        }
    }
    assert!(
        mailbox.pool().idle() > 0,
        "payload buffers went back to the pool"
    );
}

/// A part chunk of `bytes` payload bytes, numbered `chunk`.
fn chunk_of(chunk: u32, bytes: usize) -> Parcel {
    Parcel::PartChunk(
        TensorPartChunk {
            address: ChunkAddress {
                group_id: 1,
                part: 0,
                chunk,
                offset: 0,
                elements: u32::try_from(bytes / 4).unwrap(),
            },
            weight: 1.0,
            codec: CodecSpec::F32,
            payload: &[],
        },
        vec![chunk as u8; bytes],
    )
}

/// A consumer that takes nothing leaves at most `queued_bytes` of payload in the queue,
/// however many parcels have arrived (the count alone allows 256); a parcel larger than
/// the whole budget still gets through once the queue is empty, and the idle buffers kept
/// stay within `pooled_bytes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_holds_at_most_its_byte_budget_of_payloads() {
    const BUDGET: usize = 1 << 20;
    const CHUNK: usize = 256 << 10;
    let (a, b, b_in) = authorized_pair(60).await;
    let b_id = b.local_peer_id();
    let config = MailboxConfig {
        queued_bytes: BUDGET,
        pooled_bytes: 2 * CHUNK,
        ..MailboxConfig::default()
    };
    let mut mailbox = Mailbox::spawn(b_in.tensor_streams, config);
    let mut outbox = Outbox::new(a.clone(), OutboxConfig::default());
    let mut sent: Vec<Parcel> = (0..12).map(|i| chunk_of(i, CHUNK)).collect();
    sent.push(chunk_of(12, 2 * BUDGET));
    for (tag, parcel) in sent.iter().enumerate() {
        outbox
            .send(b_id, tag as u64, parcel.clone())
            .expect("room in the queue");
    }
    eventually(WAIT, "the queue fills to its budget", || async {
        mailbox.queued_bytes() == BUDGET
    })
    .await;
    // The readers have the rest in hand, and had time to queue it were there room.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(mailbox.queued_bytes(), BUDGET);
    for (i, expected) in sent.iter().enumerate() {
        let delivery = tokio::time::timeout(WAIT, mailbox.recv())
            .await
            .expect("a parcel arrives in time")
            .expect("the mailbox is open");
        assert_eq!(&delivery.parcel, expected, "parcel {i}");
        assert!(mailbox.queued_bytes() <= BUDGET);
        mailbox.recycle(delivery.parcel.into_payload());
    }
    assert_eq!(mailbox.queued_bytes(), 0);
    assert!(mailbox.pool().idle_bytes() <= 2 * CHUNK);
    assert!(mailbox.pool().idle() > 0, "buffers went back to the pool");
}

/// Peer `a` (keys from `seed`) and the id of a peer that connected to it, was authorized
/// and stopped: `a` knows its address but no longer has a connection to it.
async fn peer_and_departed_one(seed: u8) -> (NetHandle, NetInbound, PeerId) {
    let authority = Authority::new();
    let (a, a_in) = authority.spawn(seed, InviteKind::Valid).await;
    let (b, _b_in) = authority.spawn(seed + 1, InviteKind::Valid).await;
    connect(&a, &b).await;
    let b_id = b.local_peer_id();
    eventually(WAIT, "a sees b", || async {
        a.peers().await.unwrap_or_default().contains(&b_id)
    })
    .await;
    b.shutdown().await.expect("b stops");
    eventually(WAIT, "a notices that b is gone", || async {
        !a.peers().await.unwrap_or_default().contains(&b_id)
    })
    .await;
    (a, a_in, b_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parcel_for_a_departed_peer_comes_back_failed() {
    let (a, _a_in, b_id) = peer_and_departed_one(3).await;

    let mut outbox = Outbox::new(a.clone(), OutboxConfig::default());
    let parcel = parcels(b_id, a.local_peer_id()).swap_remove(0);
    outbox
        .send(b_id, 42, parcel.clone())
        .expect("room in the queue");
    let report = tokio::time::timeout(Duration::from_secs(30), outbox.next_report())
        .await
        .expect("the failure is reported within the network layer's bounds")
        .expect("the outbox is open");
    assert_eq!(report.tag, 42);
    assert!(report.result.is_err(), "nobody took it");
    assert_eq!(report.parcel, parcel, "the parcel comes back whole");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parcels_queued_for_an_unreachable_peer_cost_one_failed_dial_not_one_each() {
    let (a, _a_in, b_id) = peer_and_departed_one(5).await;

    // a still knows b's address: the first parcel dials it, and the dial fails only when
    // the handshake times out.
    let mut outbox = Outbox::new(a.clone(), OutboxConfig::default());
    let parcel = parcels(b_id, a.local_peer_id()).swap_remove(0);
    let queued = 4u64;
    for tag in 0..queued {
        outbox
            .send(b_id, tag, parcel.clone())
            .expect("room in the queue");
    }
    let started = std::time::Instant::now();
    let mut first = None;
    for tag in 0..queued {
        let report = tokio::time::timeout(Duration::from_secs(30), outbox.next_report())
            .await
            .expect("the failure is reported within the network layer's bounds")
            .expect("the outbox is open");
        assert_eq!(report.tag, tag, "reports come in order");
        assert!(report.result.is_err(), "nobody took parcel {tag}");
        assert_eq!(report.parcel, parcel, "parcel {tag} comes back whole");
        first.get_or_insert(started.elapsed());
    }
    let first = first.expect("one report at least");
    let all = started.elapsed();
    println!("first failure after {first:?}, all {queued} after {all:?}");
    assert!(
        all <= first + Duration::from_secs(1),
        "the parcels behind the first took {:?} more: each dialed again",
        all - first
    );
}

/// A peer whose network runs on a runtime of one thread of its own, as a benchmark peer's
/// may: its connections' tasks and its network task take turns on that thread. What
/// arrives in its mailbox is passed on; it stops when the receiver is dropped.
fn spawn_on_one_thread(
    authority: &Authority,
    seed: u8,
) -> (NetHandle, tokio::sync::mpsc::Receiver<Delivery>) {
    let (config, identity) = authority.config(seed, InviteKind::Valid);
    let (handle_tx, handle_rx) = std::sync::mpsc::sync_channel(1);
    let (deliveries_tx, deliveries_rx) = tokio::sync::mpsc::channel(256);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let (handle, inbound) = net::spawn(&config, identity).await.expect("network starts");
            let mut mailbox = Mailbox::spawn(inbound.tensor_streams, MailboxConfig::default());
            let _ = handle_tx.send(handle);
            loop {
                tokio::select! {
                    () = deliveries_tx.closed() => break,
                    Some(delivery) = mailbox.recv() => {
                        if deliveries_tx.send(delivery).await.is_err() {
                            break;
                        }
                    }
                }
            }
        });
    });
    let handle = handle_rx
        .recv_timeout(WAIT)
        .expect("the one-thread peer starts");
    (handle, deliveries_rx)
}

/// Seven peers open a stream to one peer at the same moment, round after round (each
/// round's streams close before the next, so every round opens new ones), and each writes
/// one parcel: every parcel arrives. The receiving peer runs on one thread, where the
/// streams of one moment reach it together. Such streams used to be dropped unread but
/// one, and a write that finished before the drop was reported sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_opened_at_the_same_moment_by_many_peers_all_arrive() {
    const SENDERS: u8 = 7;
    const ROUNDS: u64 = 6;
    let authority = Authority::new();
    let (hub, mut mailbox) = spawn_on_one_thread(&authority, 40);
    let hub_id = hub.local_peer_id();
    let mut senders = Vec::new();
    for seed in 41..41 + SENDERS {
        let (sender, _inbound) = authority.spawn(seed, InviteKind::Valid).await;
        connect(&sender, &hub).await;
        senders.push((sender, _inbound));
    }
    for (sender, _) in &senders {
        eventually(
            WAIT,
            "the hub and a sender authorize each other",
            || async {
                let id = sender.local_peer_id();
                sender.peers().await.unwrap_or_default().contains(&hub_id)
                    && hub.peers().await.unwrap_or_default().contains(&id)
            },
        )
        .await;
    }
    let config = OutboxConfig {
        idle_close: Duration::from_millis(50),
        ..OutboxConfig::default()
    };
    let mut outboxes: Vec<Outbox> = senders
        .iter()
        .map(|(sender, _)| Outbox::new(sender.clone(), config))
        .collect();
    let ready = |round| {
        Parcel::JoinGroup(JoinGroup {
            round,
            deadline_ms: 0,
            bandwidth_bytes_per_s: 0,
            accepts_connections: true,
            samples: 1,
        })
    };
    for round in 0..ROUNDS {
        for outbox in &mut outboxes {
            outbox
                .send(hub_id, round, ready(round))
                .expect("room in the queue");
        }
        let mut from = std::collections::BTreeSet::new();
        while from.len() < usize::from(SENDERS) {
            let delivery = tokio::time::timeout(WAIT, mailbox.recv())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "round {round}: only {} of {SENDERS} parcels arrived",
                        from.len()
                    )
                })
                .expect("the mailbox is open");
            assert_eq!(delivery.parcel, ready(round), "round {round}");
            assert!(
                from.insert(delivery.from),
                "round {round}: one parcel per sender"
            );
        }
        for outbox in &mut outboxes {
            let report = tokio::time::timeout(WAIT, outbox.next_report())
                .await
                .expect("a report in time")
                .expect("the outbox is open");
            assert!(report.result.is_ok(), "round {round}: {:?}", report.result);
        }
        // Every writer closes its stream after `idle_close`: the next round opens new ones.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
