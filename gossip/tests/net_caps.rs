//! The volunteer's bandwidth caps hold: a capped sender's bytes, and a capped receiver's,
//! stay within `rate · time + burst`.

#[path = "net_support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use murmur_gossip::net::{self, NetHandle, NetInbound};
use murmur_protocol::codec::CodecSpec;
use murmur_protocol::message::{ChunkAddress, Message, TensorPartChunk};
use support::{Authority, InviteKind, connect, eventually};

const CAP: u64 = 2_000_000;
const CHUNK: usize = 256 * 1024;
const CHUNKS: u32 = 24;

async fn pair(upload_cap: u64, download_cap: u64) -> (NetHandle, NetHandle, NetInbound) {
    let authority = Authority::new();
    let (mut a_config, a_id) = authority.config(41, InviteKind::Valid);
    a_config.max_upload_bytes_per_s = upload_cap;
    let (mut b_config, b_id) = authority.config(42, InviteKind::Valid);
    b_config.max_download_bytes_per_s = download_cap;
    let (a, _a_in) = net::spawn(&a_config, a_id).await.expect("a starts");
    let (b, b_in) = net::spawn(&b_config, b_id).await.expect("b starts");
    connect(&a, &b).await;
    let b_id = b.local_peer_id();
    eventually(
        Duration::from_secs(10),
        "a and b authorize each other",
        || async { a.peers().await.unwrap_or_default().contains(&b_id) },
    )
    .await;
    (a, b, b_in)
}

/// Sends `CHUNKS` chunks from `a` to `b` and reads them all; returns the time it took, and
/// the time the receiver took from its first chunk to its last.
async fn transfer(a: &NetHandle, b: &NetHandle, b_in: &mut NetInbound) -> (Duration, Duration) {
    let payload = vec![7u8; CHUNK];
    let started = Instant::now();
    let mut writer = a
        .open_tensor_stream(&b.local_peer_id())
        .await
        .expect("stream opens");
    let reader = tokio::spawn({
        let mut streams =
            std::mem::replace(&mut b_in.tensor_streams, tokio::sync::mpsc::channel(1).1);
        async move {
            let mut stream = tokio::time::timeout(Duration::from_secs(30), streams.recv())
                .await
                .expect("a stream arrives")
                .expect("the network runs");
            let mut n = 0;
            let mut first = None;
            while let Some(()) = stream.recv(|_| ()).await.expect("clean chunks") {
                first.get_or_insert_with(Instant::now);
                n += 1;
            }
            (n, first.map(|t| t.elapsed()).unwrap_or_default())
        }
    });
    for i in 0..CHUNKS {
        let message = Message::TensorPartChunk(TensorPartChunk {
            address: ChunkAddress {
                group_id: 1,
                part: 0,
                chunk: i,
                offset: u64::from(i) * (CHUNK as u64 / 4),
                elements: (CHUNK / 4) as u32,
            },
            weight: 1.0,
            codec: CodecSpec::F32,
            payload: &payload,
        });
        writer.send(&message).await.expect("chunk written");
    }
    writer.finish().await.expect("stream closed");
    let (received, reading) = tokio::time::timeout(Duration::from_secs(60), reader)
        .await
        .expect("the receiver finishes")
        .expect("the receiver task");
    assert_eq!(received, CHUNKS);
    (started.elapsed(), reading)
}

/// The least time `bytes` can take under a cap of `CAP` with a full bucket to start.
fn least_time(bytes: u64) -> f64 {
    let burst = (CAP as f64 / 10.0).max(64.0 * 1024.0);
    (bytes as f64 - burst) / CAP as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cap_holds() {
    let (a, b, mut b_in) = pair(CAP, 0).await;
    let (took, _) = transfer(&a, &b, &mut b_in).await;
    let took = took.as_secs_f64();
    let bytes = u64::from(CHUNKS) * CHUNK as u64;
    assert!(
        took >= least_time(bytes),
        "{bytes} bytes in {took} s under a {CAP} B/s cap"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_cap_holds() {
    let (a, b, mut b_in) = pair(0, CAP).await;
    // The sender may run a flow-control window ahead, but the capped reader reads at the
    // cap: after its first chunk, the rest take at least (bytes − burst) / CAP. (Uncapped,
    // this transfer takes a few tens of milliseconds on loopback.)
    let (_, reading) = transfer(&a, &b, &mut b_in).await;
    let reading = reading.as_secs_f64();
    // The reads that complete the first chunk may already hold part of the next ones: one
    // read buffer (256 KiB) of them is not timed.
    let after_first = u64::from(CHUNKS - 1) * CHUNK as u64 - 256 * 1024;
    assert!(
        reading >= least_time(after_first),
        "{after_first} bytes read in {reading} s under a {CAP} B/s cap"
    );
}
