//! Tensor streams between authorized peers: data arrives whole, garbage closes only its own
//! stream, a stream cut mid-frame says where it ended, a receiver that does not read holds
//! the sender back, and stream limits hold.

#[path = "net_support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use murmur_gossip::net::{NetError, NetHandle, NetInbound, TensorStreamReader};
use murmur_protocol::codec::CodecSpec;
use murmur_protocol::frame::{FrameError, FrameFlags, HEADER_LEN};
use murmur_protocol::message::{ChunkAddress, Message, TensorPartChunk};
use support::{Authority, InviteKind, connect, eventually};

const CHUNK: usize = 256 * 1024;

fn chunk(index: u32, payload: &[u8]) -> Message<'_> {
    let elements = (payload.len() / 4) as u32;
    Message::TensorPartChunk(TensorPartChunk {
        address: ChunkAddress {
            group_id: 7,
            part: 1,
            chunk: index,
            offset: u64::from(index) * u64::from(elements),
            elements,
        },
        weight: 2.0,
        codec: CodecSpec::F32,
        payload,
    })
}

/// A payload whose bytes depend on the chunk index, so mixed-up chunks are caught.
fn payload(index: u32) -> Vec<u8> {
    (0..CHUNK)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(index) as u8)
        .collect()
}

async fn next_stream(inbound: &mut NetInbound) -> TensorStreamReader {
    tokio::time::timeout(Duration::from_secs(5), inbound.tensor_streams.recv())
        .await
        .expect("a stream arrives in time")
        .expect("the network task is running")
}

/// Reads a stream to its end, checking every chunk against `payload(index)`.
async fn read_all_chunks(reader: &mut TensorStreamReader) -> Result<u32, NetError> {
    let mut count = 0u32;
    while let Some(ok) = reader
        .recv(|m| match m {
            Message::TensorPartChunk(c) => c.payload == payload(c.address.chunk).as_slice(),
            _ => false,
        })
        .await?
    {
        assert!(ok, "chunk {count} arrived intact");
        count += 1;
    }
    Ok(count)
}

async fn pair(authority: &Authority) -> (NetHandle, NetInbound, NetHandle, NetInbound) {
    let (a, a_in) = authority.spawn(1, InviteKind::Valid).await;
    let (b, b_in) = authority.spawn(2, InviteKind::Valid).await;
    connect(&a, &b).await;
    (a, a_in, b, b_in)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_arrive_whole_and_in_order_and_feed_the_bandwidth_estimate() {
    let authority = Authority::new();
    let (a, _a_in, b, mut b_in) = pair(&authority).await;
    let mut writer = a
        .open_tensor_stream(&b.local_peer_id())
        .await
        .expect("open");
    let send = async {
        for i in 0..32u32 {
            writer.send(&chunk(i, &payload(i))).await.expect("send");
        }
        writer.finish().await.expect("finish")
    };
    let receive = async {
        let mut reader = next_stream(&mut b_in).await;
        assert_eq!(reader.peer(), a.local_peer_id());
        read_all_chunks(&mut reader).await.expect("clean stream")
    };
    let (stats, received) = tokio::join!(send, receive);
    assert_eq!(received, 32);
    assert!(stats.bytes > 32 * CHUNK as u64);

    // Both ends measured the transfer: the estimate comes from real bytes.
    let down = b.bandwidth(&a.local_peer_id()).download_bytes_per_s;
    let up = a.bandwidth(&b.local_peer_id()).upload_bytes_per_s;
    assert!(down.is_some_and(|r| r > 0.0), "receiver measured {down:?}");
    assert!(up.is_some_and(|r| r > 0.0), "sender measured {up:?}");
    let traffic = b.metrics().peer_traffic(&a.local_peer_id());
    assert_eq!(traffic.bytes_received, stats.bytes);
    for h in [a, b] {
        h.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_closes_its_stream_and_the_receiver_keeps_serving_other_peers() {
    let authority = Authority::new();
    let (receiver, mut inbound) = authority.spawn(1, InviteKind::Valid).await;
    let (vandal, _v_in) = authority.spawn(2, InviteKind::Valid).await;
    let (honest, _h_in) = authority.spawn(3, InviteKind::Valid).await;
    connect(&vandal, &receiver).await;
    connect(&honest, &receiver).await;

    // An authorized peer sends bytes that are not a frame.
    let mut bad = vandal
        .open_tensor_stream(&receiver.local_peer_id())
        .await
        .expect("open");
    bad.send_encoded(b"GET / HTTP/1.1\r\nHost: murmur\r\n\r\n")
        .await
        .expect("write");
    let mut reader = next_stream(&mut inbound).await;
    let error = read_all_chunks(&mut reader)
        .await
        .expect_err("garbage is refused");
    assert!(matches!(error, NetError::BadFrame { .. }), "{error}");
    assert_eq!(
        reader.recv(|_| ()).await.expect("closed"),
        None,
        "the stream stays closed"
    );
    assert_eq!(receiver.metrics().snapshot().bad_frames, 1);

    // The receiver still serves the honest peer, and even the vandal's other streams.
    for sender in [&honest, &vandal] {
        let mut writer = sender
            .open_tensor_stream(&receiver.local_peer_id())
            .await
            .expect("open");
        let send = async {
            for i in 0..4u32 {
                writer.send(&chunk(i, &payload(i))).await.expect("send");
            }
            writer.finish().await.expect("finish");
        };
        let receive = async {
            let mut reader = next_stream(&mut inbound).await;
            assert_eq!(reader.peer(), sender.local_peer_id());
            read_all_chunks(&mut reader).await.expect("clean stream")
        };
        let ((), count) = tokio::join!(send, receive);
        assert_eq!(count, 4);
    }
    assert!(
        receiver
            .peers()
            .await
            .expect("peers")
            .contains(&honest.local_peer_id())
    );
    for h in [receiver, vandal, honest] {
        h.shutdown().await.expect("shutdown");
    }
}

/// A stream that ends in the middle of a frame, whether in its header or its payload,
/// delivers every whole frame before the cut, then fails saying how much of the last
/// frame came, and counts it as a bad frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_mid_frame_delivers_the_whole_frames_then_says_where_it_ended() {
    let authority = Authority::new();
    let (sender, _s_in, receiver, mut inbound) = pair(&authority).await;
    // Small chunks lie whole in the reader's buffer; a chunk of `CHUNK` bytes does not.
    let small: Vec<u8> = payload(0)[..1024].to_vec();
    let large = payload(5);
    let cases = [
        (&small, 5usize),
        (&small, 600),
        (&large, 7),
        (&large, CHUNK / 2),
    ];
    for (round, (last, cut)) in cases.into_iter().enumerate() {
        let whole = chunk(0, &small);
        let cut_message = chunk(1, last);
        let mut frame = vec![0u8; cut_message.frame_len()];
        let len = cut_message
            .encode_frame(FrameFlags::EMPTY, &mut frame)
            .expect("encode");
        assert_eq!(len, frame.len());

        let mut writer = sender
            .open_tensor_stream(&receiver.local_peer_id())
            .await
            .expect("open");
        let send = async {
            for _ in 0..3 {
                writer.send(&whole).await.expect("send");
            }
            writer.send_encoded(&frame[..cut]).await.expect("send");
            writer.finish().await.expect("finish");
        };
        let receive = async {
            let mut reader = next_stream(&mut inbound).await;
            let mut whole_frames = 0;
            let error = loop {
                let received = reader
                    .recv(|m| match m {
                        Message::TensorPartChunk(c) => c.payload == small.as_slice(),
                        _ => false,
                    })
                    .await;
                match received {
                    Ok(Some(intact)) => {
                        assert!(intact, "frame {whole_frames} arrived intact");
                        whole_frames += 1;
                    }
                    Ok(None) => panic!("case {round}: the cut stream ended cleanly"),
                    Err(e) => break e,
                }
            };
            (whole_frames, error)
        };
        let ((), (whole_frames, error)) = tokio::join!(send, receive);
        assert_eq!(whole_frames, 3, "case {round}");
        let NetError::BadFrame {
            source: FrameError::Truncated { buffered, expected },
            ..
        } = error
        else {
            panic!("case {round}: {error}");
        };
        assert_eq!(buffered, cut, "case {round}");
        let expected_len = if cut < HEADER_LEN {
            HEADER_LEN
        } else {
            frame.len()
        };
        assert_eq!(expected, expected_len, "case {round}");
        assert_eq!(
            receiver.metrics().snapshot().bad_frames,
            round as u64 + 1,
            "case {round}"
        );
    }
    for h in [sender, receiver] {
        h.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_does_not_read_makes_the_sender_wait_within_its_timeout() {
    let authority = Authority::new();
    let (mut sender_config, sender_identity) = authority.config(1, InviteKind::Valid);
    sender_config.tensor_write_timeout_ms = 1_000;
    let (sender, _s_in) = murmur_gossip::net::spawn(&sender_config, sender_identity)
        .await
        .expect("start");
    let (receiver, mut inbound) = authority.spawn(2, InviteKind::Valid).await;
    connect(&sender, &receiver).await;

    let mut writer = sender
        .open_tensor_stream(&receiver.local_peer_id())
        .await
        .expect("open");
    let big = vec![0u8; 1 << 20];
    writer.send(&chunk(0, &big)).await.expect("first frame");
    // The receiver takes the stream but never reads it.
    let _stalled = next_stream(&mut inbound).await;

    let started = Instant::now();
    let mut frames = 1u32;
    let error = loop {
        match writer.send(&chunk(frames, &big)).await {
            Ok(()) => frames += 1,
            Err(e) => break e,
        }
        assert!(frames < 256, "256 MiB went into a stream nobody reads");
    };
    assert!(matches!(error, NetError::Timeout { .. }), "{error}");
    eprintln!("the sender wrote {frames} MiB before it had to wait");
    // What the sender got rid of is bounded by the flow-control windows (10 MB per stream),
    // not by how much it wanted to send.
    assert!(
        frames <= 16,
        "{frames} MiB were buffered for a receiver that reads nothing"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    for h in [sender, receiver] {
        h.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_beyond_the_per_peer_limit_are_refused() {
    let authority = Authority::new();
    let (mut config, identity) = authority.config(1, InviteKind::Valid);
    config.max_inbound_tensor_streams_per_peer = 2;
    let (receiver, mut inbound) = murmur_gossip::net::spawn(&config, identity)
        .await
        .expect("start");
    let (sender, _s_in) = authority.spawn(2, InviteKind::Valid).await;
    connect(&sender, &receiver).await;

    let mut writers = Vec::new();
    let mut held = Vec::new();
    for i in 0..3u32 {
        let mut writer = sender
            .open_tensor_stream(&receiver.local_peer_id())
            .await
            .expect("open");
        let sent = writer.send(&chunk(i, &payload(i))).await;
        if i < 2 {
            sent.expect("send");
            held.push(next_stream(&mut inbound).await);
        } else if let Err(e) = sent {
            // The receiver dropped the stream unread, and the sender may already know.
            assert!(matches!(e, NetError::Io { .. }), "{e}");
        }
        writers.push(writer);
    }
    eventually(
        Duration::from_secs(5),
        "the third stream is refused",
        || {
            let receiver = receiver.clone();
            async move { receiver.metrics().snapshot().tensor_streams_refused_limit == 1 }
        },
    )
    .await;
    assert!(
        inbound.tensor_streams.try_recv().is_err(),
        "only two streams were handed over"
    );

    // Giving a slot back lets the next stream in.
    drop(held.pop());
    let mut writer = sender
        .open_tensor_stream(&receiver.local_peer_id())
        .await
        .expect("open");
    writer.send(&chunk(9, &payload(9))).await.expect("send");
    let mut reader = next_stream(&mut inbound).await;
    let first = reader
        .recv(|m| matches!(m, Message::TensorPartChunk(_)))
        .await
        .expect("read");
    assert_eq!(first, Some(true));
    for h in [receiver, sender] {
        h.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tcp_fallback_carries_auth_and_tensor_streams_where_udp_is_blocked() {
    let authority = Authority::new();
    let mut spawned = Vec::new();
    for seed in [1u8, 2] {
        let (mut config, identity) = authority.config(seed, InviteKind::Valid);
        config.listen_addrs = vec!["/ip4/127.0.0.1/tcp/0".to_owned()];
        spawned.push(
            murmur_gossip::net::spawn(&config, identity)
                .await
                .expect("start"),
        );
    }
    let (b, mut b_in) = spawned.pop().expect("b");
    let (a, _a_in) = spawned.pop().expect("a");
    let b_addr = b.listen_addrs().await.expect("addrs");
    assert!(b_addr.iter().all(|addr| addr.to_string().contains("/tcp/")));
    connect(&a, &b).await;
    let mut writer = a
        .open_tensor_stream(&b.local_peer_id())
        .await
        .expect("open over tcp");
    let send = async {
        for i in 0..8u32 {
            writer.send(&chunk(i, &payload(i))).await.expect("send");
        }
        writer.finish().await.expect("finish");
    };
    let receive = async {
        let mut reader = next_stream(&mut b_in).await;
        read_all_chunks(&mut reader).await.expect("clean stream")
    };
    let ((), count) = tokio::join!(send, receive);
    assert_eq!(count, 8);
    for h in [a, b] {
        h.shutdown().await.expect("shutdown");
    }
}
