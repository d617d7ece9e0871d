//! Joining from the swarm's state: a peer serves its latest state snapshot over the control
//! protocol, and a joiner downloads one from the most advanced peer, a range at a time.
//!
//! The snapshot (parameters, step, samples; see `murmur_protocol::snapshot`) is zstd-
//! compressed and named by its SHA-256 digest. The first request takes whatever snapshot
//! the server holds; later ones name its digest, so every range comes from the same
//! snapshot. The server keeps its previous snapshot as well as the current one, so that a
//! refresh in the middle of a download does not break it; a download that fails part way
//! resumes from the bytes it already has, against another server if need be. The whole
//! download is bounded in time, and a peer that serves state keeps training: the serving
//! task only reads the shared snapshot cell.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use murmur_gossip::net::{ControlFrame, InboundControl, NetHandle};
use murmur_protocol::frame::{Frame, FrameLimits};
use murmur_protocol::identity::PeerId;
use murmur_protocol::message::{Message, Reject, RejectCode, StateSyncRequest, StateSyncResponse};
use murmur_protocol::snapshot::{Snapshot, SnapshotLimits};
use tokio::sync::mpsc;

/// Payload bytes per response: a control frame holds at most 64 KiB.
const RANGE_BYTES: u32 = 48 * 1024;
/// How long a whole download may take.
const DOWNLOAD_BOUND: Duration = Duration::from_secs(60);
/// zstd level of served snapshots.
const LEVEL: i32 = 3;

/// An encoded snapshot and its digest.
#[derive(Debug)]
struct Served {
    bytes: Vec<u8>,
    digest: [u8; 32],
}

/// The current snapshot and the one before it.
type Generations = (Option<Arc<Served>>, Option<Arc<Served>>);

/// The snapshots this peer serves: the current one and the one before it.
#[derive(Debug, Clone, Default)]
pub(crate) struct StateCell {
    inner: Arc<Mutex<Generations>>,
}

impl StateCell {
    /// Replaces the served snapshot; the previous one stays available for downloads that
    /// started from it.
    pub(crate) fn publish(&self, snapshot: &Snapshot) -> anyhow::Result<()> {
        let bytes = snapshot
            .encode(LEVEL)
            .context("cannot encode the state snapshot")?;
        let digest = Snapshot::digest_of(&bytes).context("cannot read the snapshot digest")?;
        let served = Arc::new(Served { bytes, digest });
        if let Ok(mut cell) = self.inner.lock() {
            let current = cell.0.take();
            *cell = (Some(served), current);
        }
        Ok(())
    }

    fn find(&self, digest: &[u8; 32]) -> Option<Arc<Served>> {
        let cell = self.inner.lock().ok()?;
        let any = *digest == [0; 32];
        [&cell.0, &cell.1]
            .into_iter()
            .flatten()
            .find(|s| any || s.digest == *digest)
            .cloned()
    }
}

/// Answers state-sync requests until the network stops. Anything else on the control
/// protocol is refused with a reason.
pub(crate) async fn serve(
    net: NetHandle,
    mut requests: mpsc::Receiver<InboundControl>,
    cell: StateCell,
    limits: FrameLimits,
) {
    while let Some(request) = requests.recv().await {
        let answer = answer(&request, &cell, &limits);
        let result = match &answer {
            Answer::Range(served, asked) => {
                let start = usize::try_from(asked.from_offset).unwrap_or(usize::MAX);
                let len = served.bytes.len();
                let end = start
                    .saturating_add(asked.max_bytes.min(RANGE_BYTES) as usize)
                    .min(len);
                let message = Message::StateSyncResponse(StateSyncResponse {
                    offset: asked.from_offset,
                    total_len: len as u64,
                    digest: served.digest,
                    last: end == len,
                    payload: &served.bytes[start..end],
                });
                net.respond_control(request.id, &message).await
            }
            Answer::Refuse(code, text) => {
                let message = Message::Reject(Reject { code: *code, text });
                net.respond_control(request.id, &message).await
            }
        };
        if let Err(e) = result {
            tracing::debug!(peer = %request.peer, error = %e, "state-sync answer not sent");
        }
    }
}

enum Answer {
    Range(Arc<Served>, StateSyncRequest),
    Refuse(RejectCode, &'static str),
}

fn answer(request: &InboundControl, cell: &StateCell, limits: &FrameLimits) -> Answer {
    let Ok((frame, _)) = Frame::parse(request.frame.as_bytes(), limits) else {
        return Answer::Refuse(RejectCode::BadFrame, "not a valid frame");
    };
    let Ok(Message::StateSyncRequest(asked)) = Message::from_frame(&frame) else {
        return Answer::Refuse(
            RejectCode::BadMessage,
            "only state-sync requests are served",
        );
    };
    let Some(served) = cell.find(&asked.expected_digest) else {
        return if asked.accepts_any_snapshot() {
            Answer::Refuse(RejectCode::Unavailable, "no state snapshot yet")
        } else {
            Answer::Refuse(RejectCode::Unavailable, "that snapshot is no longer served")
        };
    };
    if asked.from_offset > served.bytes.len() as u64 {
        return Answer::Refuse(RejectCode::BadMessage, "offset beyond the snapshot");
    }
    Answer::Range(served, asked)
}

/// Downloads a snapshot from one of `servers` (tried in order; a failure resumes from
/// the bytes already fetched with the next), verifies it and decodes it.
pub(crate) async fn download(
    net: &NetHandle,
    servers: &[PeerId],
    limits: &FrameLimits,
    snapshot_limits: &SnapshotLimits,
) -> anyhow::Result<Snapshot> {
    let work = async {
        let mut bytes: Vec<u8> = Vec::new();
        let mut digest = [0u8; 32];
        let mut last_error = None;
        for server in servers {
            match fetch(net, server, limits, &mut bytes, &mut digest).await {
                Ok(()) => {
                    let snapshot = Snapshot::decode(&bytes, snapshot_limits)
                        .context("the downloaded state does not decode")?;
                    tracing::info!(%server, bytes = bytes.len(), "state downloaded");
                    return Ok(snapshot);
                }
                Err(e) => {
                    tracing::warn!(%server, error = format!("{e:#}"), "state download interrupted; trying the next peer");
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no peer to download the state from")))
    };
    tokio::time::timeout(DOWNLOAD_BOUND, work)
        .await
        .map_err(|_| anyhow::anyhow!("the state download took longer than {DOWNLOAD_BOUND:?}"))?
}

/// Fetches ranges from `server` until the snapshot named by `digest` is whole.
async fn fetch(
    net: &NetHandle,
    server: &PeerId,
    limits: &FrameLimits,
    bytes: &mut Vec<u8>,
    digest: &mut [u8; 32],
) -> anyhow::Result<()> {
    loop {
        let request = Message::StateSyncRequest(StateSyncRequest {
            from_offset: bytes.len() as u64,
            max_bytes: RANGE_BYTES,
            expected_digest: *digest,
        });
        let frame: ControlFrame = net.send_control(server, &request).await?;
        let (frame, _) = Frame::parse(frame.as_bytes(), limits).context("a bad response frame")?;
        match Message::from_frame(&frame).context("a bad response")? {
            Message::StateSyncResponse(r) => {
                if *digest == [0; 32] {
                    *digest = r.digest;
                } else if r.digest != *digest {
                    bail!("the server answered from another snapshot");
                }
                if r.offset != bytes.len() as u64 || r.total_len > 1 << 34 {
                    bail!("the server answered a range that was not asked for");
                }
                bytes.extend_from_slice(r.payload);
                if r.last {
                    if bytes.len() as u64 != r.total_len {
                        bail!(
                            "the snapshot ended at {} of {} bytes",
                            bytes.len(),
                            r.total_len
                        );
                    }
                    let got = Snapshot::digest_of(bytes).context("the snapshot header")?;
                    if got != *digest {
                        bail!("the snapshot's digest does not match the one announced");
                    }
                    return Ok(());
                }
                if r.payload.is_empty() {
                    bail!("the server sent an empty range before the end");
                }
            }
            Message::Reject(r) => bail!("refused: {}", r.text),
            other => bail!("unexpected answer {:?}", other.kind()),
        }
    }
}
