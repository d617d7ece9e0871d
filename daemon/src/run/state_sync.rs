//! Joining from the swarm's state: a peer serves its latest state snapshot over the control
//! protocol, and a joiner downloads one from the most advanced peer, a range at a time.
//!
//! A served snapshot lives in an unnamed file of its own in the checkpoint folder (gone
//! once closed), written from the trainer's vectors as a checkpoint is, and its ranges are
//! read from there: the encoded state, current and previous, is not held in memory (at
//! 124M parameters with AdamW that was about 3 GB of resident memory), and the page cache
//! can give it back under pressure.
//!
//! The snapshot (parameters, step, samples; see `murmur_protocol::snapshot`) is zstd-
//! compressed and named by its SHA-256 digest. The first request takes whatever snapshot
//! the server holds; later ones name its digest, so every range comes from the same
//! snapshot. Up to [`WINDOW`] ranges are in flight at once, so a download moves `WINDOW`
//! ranges per round trip rather than one, and ranges grow from 48 KiB to 1 MiB with the rate
//! measured ([`RangeSizer`]): on loopback a 485 MB state came at 0.88–1.00 of one tensor
//! stream's rate with them, 0.61–0.71 with 48 KiB ranges (`murmur bench state-sync`).
//! The server keeps its previous snapshot as well as the current one, so that a refresh in
//! the middle of a download does not break it; a download that fails part way resumes from
//! the bytes it already has against the next server, or starts over from that server's
//! snapshot when it no longer holds the same one.
//! The joiner writes the ranges into an unnamed file beside the served snapshots and
//! decodes the state from there once its digest checks out, so it never holds the encoded
//! state and the decoded one in memory at once.
//! The download is bounded by progress, not in total: every range must come within the
//! network's request timeout, so a large state on a slow link takes as long as it needs
//! while a stalled server is given up on. A peer that serves state keeps training: the
//! serving task only reads the shared snapshot cell.

use std::io::Seek as _;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use futures::stream::FuturesOrdered;
use murmur_gossip::net::{ControlFrame, InboundControl, NetHandle};
use murmur_protocol::frame::{Frame, FrameLimits};
use murmur_protocol::identity::PeerId;
use murmur_protocol::message::{
    MAX_STATE_RANGE_BYTES, Message, Reject, RejectCode, StateSyncRequest, StateSyncResponse,
    state_sync_response_limits,
};
use murmur_protocol::snapshot::{SNAPSHOT_HEADER_LEN, Snapshot, SnapshotLimits};
use murmur_protocol::snapshot_file::{SnapshotView, read_snapshot};
use tokio::sync::mpsc;

/// The smallest range asked for, and the first: it fits a control frame of 64 KiB (the
/// default `net.max_control_payload`), which is all a server that serves no larger ranges
/// sends. Later ranges grow with the rate measured (see [`RangeSizer`]), up to
/// [`MAX_STATE_RANGE_BYTES`].
const RANGE_BYTES: u32 = 48 * 1024;
/// Range requests in flight to one server at once.
const WINDOW: usize = 8;
/// [`WINDOW`] ranges in flight are sized to arrive within this share of the request
/// timeout at the rate measured so far, so that each range comes well within it even when
/// the rate drops.
const WINDOW_SHARE_OF_TIMEOUT: f64 = 0.25;
/// The most bytes a served snapshot may announce (16 GiB).
const MAX_SNAPSHOT_BYTES: u64 = 1 << 34;
/// zstd level of served snapshots: on a model's f32 state level 1 saves as much as level 3
/// in less time (BENCHMARKS.md, `murmur bench checkpoint`).
const LEVEL: i32 = 1;

/// An encoded snapshot, in an unnamed file, and its digest.
#[derive(Debug)]
struct Served {
    file: std::fs::File,
    len: u64,
    digest: [u8; 32],
}

/// The current snapshot and the one before it.
type Generations = (Option<Arc<Served>>, Option<Arc<Served>>);

/// A refresh of the served state waits this many times as long as the last one took, so
/// that encoding it (which the training loop waits for) takes at most about 1/20 of the
/// wall time: a few milliseconds every 10 steps for a small model, about 3 s every minute
/// or so for GPT-2 small with AdamW.
const REFRESH_WAIT_FACTOR: u32 = 19;

/// The snapshots this peer serves: the current one and the one before it.
#[derive(Debug, Clone)]
pub(crate) struct StateCell {
    /// Where the snapshots' unnamed files are made.
    dir: Arc<PathBuf>,
    inner: Arc<Mutex<Generations>>,
    /// When the last refresh ended, and how long it took.
    last_refresh: Arc<Mutex<Option<(Instant, Duration)>>>,
}

/// Whether a refresh is due at `now`, given when the last one ended and how long it took.
fn refresh_due(last: Option<(Instant, Duration)>, now: Instant) -> bool {
    last.is_none_or(|(ended, took)| now.duration_since(ended) >= took * REFRESH_WAIT_FACTOR)
}

impl StateCell {
    /// A cell with nothing served yet, whose snapshots are written in `dir` (made when the
    /// first is published).
    pub(crate) fn in_dir(dir: PathBuf) -> StateCell {
        StateCell {
            dir: Arc::new(dir),
            inner: Arc::default(),
            last_refresh: Arc::default(),
        }
    }

    /// Whether the served state should be refreshed now (see [`REFRESH_WAIT_FACTOR`]).
    pub(crate) fn refresh_due(&self) -> bool {
        let last = self.last_refresh.lock().ok().and_then(|last| *last);
        refresh_due(last, Instant::now())
    }

    /// Replaces the served snapshot; the previous one stays available for downloads that
    /// started from it.
    pub(crate) fn publish(&self, snapshot: &SnapshotView<'_>) -> anyhow::Result<()> {
        let started = Instant::now();
        let result = self.replace(snapshot);
        if let Ok(mut last) = self.last_refresh.lock() {
            *last = Some((Instant::now(), started.elapsed()));
        }
        result
    }

    fn replace(&self, snapshot: &SnapshotView<'_>) -> anyhow::Result<()> {
        let mut file = unnamed_file_in(&self.dir, "the state snapshot")?;
        let len = snapshot
            .write_to(&mut file, LEVEL)
            .context("cannot write the state snapshot")?;
        let mut header = [0u8; SNAPSHOT_HEADER_LEN];
        file.read_exact_at(&mut header, 0)
            .context("cannot read the state snapshot back")?;
        let mut digest = [0u8; 32];
        digest.copy_from_slice(&header[SNAPSHOT_HEADER_LEN - 32..]);
        let served = Arc::new(Served { file, len, digest });
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

/// A file without a name in `dir` (made if missing), gone once closed; `what` it holds
/// names it in an error.
fn unnamed_file_in(dir: &std::path::Path, what: &str) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot make the folder {}", dir.display()))?;
    tempfile::tempfile_in(dir)
        .with_context(|| format!("cannot make a file for {what} in {}", dir.display()))
}

/// Answers state-sync requests until the network stops. Anything else on the control
/// protocol is refused with a reason.
pub(crate) async fn serve(
    net: NetHandle,
    requests: mpsc::Receiver<InboundControl>,
    cell: StateCell,
    limits: FrameLimits,
) {
    serve_ranges_of(net, requests, cell, limits, MAX_STATE_RANGE_BYTES).await;
}

/// [`serve`], answering with at most `max_range` bytes a range; the ranges answered.
async fn serve_ranges_of(
    net: NetHandle,
    mut requests: mpsc::Receiver<InboundControl>,
    cell: StateCell,
    limits: FrameLimits,
    max_range: u32,
) -> u64 {
    let mut answered = 0;
    let max_range = max_range.min(MAX_STATE_RANGE_BYTES);
    let mut range = vec![0u8; max_range as usize];
    while let Some(request) = requests.recv().await {
        let answer = answer(&request, &cell, &limits);
        let result = match &answer {
            Answer::Range(served, asked) => {
                let start = asked.from_offset;
                let end = start
                    .saturating_add(u64::from(asked.max_bytes.min(max_range)))
                    .min(served.len);
                // At most 1 MiB, from the page cache (the file was written recently) or
                // the disk: short enough to read on this task.
                let payload = &mut range[..(end - start) as usize];
                let message = match served.file.read_exact_at(payload, start) {
                    Ok(()) => Message::StateSyncResponse(StateSyncResponse {
                        offset: start,
                        total_len: served.len,
                        digest: served.digest,
                        last: end == served.len,
                        payload,
                    }),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the served state snapshot");
                        Message::Reject(Reject {
                            code: RejectCode::Unavailable,
                            text: "that snapshot is no longer served",
                        })
                    }
                };
                net.respond_control(request.id, &message).await
            }
            Answer::Refuse(code, text) => {
                let message = Message::Reject(Reject { code: *code, text });
                net.respond_control(request.id, &message).await
            }
        };
        match result {
            Ok(()) => answered += u64::from(matches!(answer, Answer::Range(..))),
            Err(e) => {
                tracing::debug!(peer = %request.peer, error = %e, "state-sync answer not sent");
            }
        }
    }
    answered
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
    if asked.from_offset > served.len {
        return Answer::Refuse(RejectCode::BadMessage, "offset beyond the snapshot");
    }
    Answer::Range(served, asked)
}

/// A downloaded state, and what its download took.
#[derive(Debug)]
pub(crate) struct Downloaded {
    pub(crate) snapshot: Snapshot,
    /// Encoded bytes fetched.
    pub(crate) bytes: u64,
    /// From the first request to the last range, every server tried included.
    pub(crate) fetch: Duration,
    /// Checking the digest and decoding the state from the file.
    pub(crate) decode: Duration,
}

/// Downloads a snapshot from one of `servers` (tried in order; a failure resumes from
/// the bytes already fetched with the next) into an unnamed file in `dir`, verifies it and
/// decodes it from there.
pub(crate) async fn download(
    net: &NetHandle,
    servers: &[PeerId],
    dir: &std::path::Path,
    limits: &FrameLimits,
    snapshot_limits: &SnapshotLimits,
) -> anyhow::Result<Downloaded> {
    let started = std::time::Instant::now();
    let mut partial = Partial::in_dir(dir)?;
    let mut last_error = None;
    for server in servers {
        let mut result = fetch(net, server, limits, &mut partial).await;
        if let Err(Fetch::OtherSnapshot) = result {
            tracing::info!(%server, kept = partial.len, "this peer serves another snapshot; starting over from it");
            partial.restart()?;
            result = fetch(net, server, limits, &mut partial).await;
        }
        match result {
            Ok(()) => {
                let bytes = partial.len;
                let fetch = started.elapsed();
                let snapshot = partial.decode(*snapshot_limits).await?;
                let decode = started.elapsed() - fetch;
                let took_s = started.elapsed().as_secs_f64();
                let decode_s = decode.as_secs_f64();
                tracing::info!(%server, bytes, took_s, decode_s, "state downloaded");
                return Ok(Downloaded {
                    snapshot,
                    bytes,
                    fetch,
                    decode,
                });
            }
            Err(e) => {
                let e = anyhow::Error::from(e);
                tracing::warn!(%server, error = crate::error_text::describe(&e), "state download interrupted; trying the next peer");
                last_error = Some(e);
            }
        }
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no peer to download the state from")))
}

/// The bytes of one snapshot fetched so far, in an unnamed file (gone once closed), and
/// its digest once a server named it.
#[derive(Debug)]
struct Partial {
    file: std::fs::File,
    /// Bytes fetched, from the start of the snapshot.
    len: u64,
    digest: [u8; 32],
    total: Option<u64>,
}

impl Partial {
    /// Nothing fetched yet, into a file made in `dir` (made if missing).
    fn in_dir(dir: &std::path::Path) -> anyhow::Result<Partial> {
        Ok(Partial {
            file: unnamed_file_in(dir, "the downloaded state")?,
            len: 0,
            digest: [0; 32],
            total: None,
        })
    }

    /// Forgets what was fetched, to fetch another snapshot.
    fn restart(&mut self) -> anyhow::Result<()> {
        self.file
            .set_len(0)
            .context("cannot empty the file of the downloaded state")?;
        self.len = 0;
        self.digest = [0; 32];
        self.total = None;
        Ok(())
    }

    /// Appends a range's bytes.
    fn append(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.file
            .write_all_at(bytes, self.len)
            .context("cannot write the downloaded state to its file")?;
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// The digest the whole snapshot's header names.
    fn header_digest(&self) -> anyhow::Result<[u8; 32]> {
        let mut header = [0u8; SNAPSHOT_HEADER_LEN];
        self.file
            .read_exact_at(&mut header, 0)
            .context("cannot read the downloaded state's header back")?;
        Snapshot::digest_of(&header).context("the snapshot header")
    }

    /// Checks the whole snapshot against its digest and decodes it from the file, on a
    /// thread of its own (seconds for a large state, while heartbeats go on).
    async fn decode(self, limits: SnapshotLimits) -> anyhow::Result<Snapshot> {
        let mut file = self.file;
        tokio::task::spawn_blocking(move || {
            file.rewind()?;
            Ok(read_snapshot(&mut file, &limits)?)
        })
        .await
        .context("the state's decoding stopped")?
        .map_err(|e: anyhow::Error| e.context("the downloaded state does not decode"))
    }
}

/// Why fetching from one server stopped.
#[derive(Debug, thiserror::Error)]
enum Fetch {
    /// The server no longer serves (or never served) the snapshot being downloaded.
    #[error("the server serves another snapshot")]
    OtherSnapshot,
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

/// Fetches ranges from `server` until the snapshot in `partial` is whole: one range first
/// (which names the snapshot and its length when `partial` has not yet), then the rest
/// with [`WINDOW`] requests in flight, sized by [`RangeSizer`], appended in order.
async fn fetch(
    net: &NetHandle,
    server: &PeerId,
    limits: &FrameLimits,
    partial: &mut Partial,
) -> Result<(), Fetch> {
    let mut sizer = RangeSizer::new(net.request_timeout(), Instant::now());
    let limits = state_sync_response_limits(*limits);
    let first = request(net, server, partial.len, RANGE_BYTES, partial.digest);
    let (asked, first) = first.await;
    let before = partial.len;
    if take(&first?, &limits, partial)? {
        return Ok(());
    }
    sizer.took(partial.len - before, asked);
    let total = partial.total.unwrap_or(0);
    let digest = partial.digest;
    let mut next = partial.len;
    let mut in_flight = FuturesOrdered::new();
    loop {
        while in_flight.len() < WINDOW && next < total {
            let size = u64::from(sizer.next(Instant::now())).min(total - next);
            // At most MAX_STATE_RANGE_BYTES, so it fits.
            let size = u32::try_from(size).unwrap_or(RANGE_BYTES);
            in_flight.push_back(request(net, server, next, size, digest));
            next += u64::from(size);
        }
        let Some((asked, range)) = in_flight.next().await else {
            break;
        };
        let before = partial.len;
        if take(&range?, &limits, partial)? {
            return Ok(());
        }
        let got = partial.len - before;
        if got < u64::from(asked) {
            // The server sends smaller ranges than asked for: the ranges in flight start
            // at offsets it will not answer; ask again from where it stopped.
            in_flight = FuturesOrdered::new();
            next = partial.len;
        }
        sizer.took(got, asked);
    }
    Err(anyhow::anyhow!("the server's ranges ended before the snapshot did").into())
}

/// How many bytes to ask for in the next range: enough that [`WINDOW`] ranges in flight
/// arrive within [`WINDOW_SHARE_OF_TIMEOUT`] of the request timeout at the rate measured
/// so far, between [`RANGE_BYTES`] and the most the server answers (at most
/// [`MAX_STATE_RANGE_BYTES`]). Small ranges keep a slow link within the timeout; large
/// ones cut the cost per byte of each request and response where the link is fast.
#[derive(Debug)]
struct RangeSizer {
    /// The time [`WINDOW`] ranges in flight should take.
    budget: Duration,
    started: Instant,
    bytes: u64,
    /// The most the server answered with when asked for more.
    served_max: u32,
}

impl RangeSizer {
    fn new(request_timeout: Duration, now: Instant) -> RangeSizer {
        RangeSizer {
            budget: request_timeout.mul_f64(WINDOW_SHARE_OF_TIMEOUT),
            started: now,
            bytes: 0,
            served_max: MAX_STATE_RANGE_BYTES,
        }
    }

    /// A range of `got` bytes arrived, where `asked` were asked for.
    fn took(&mut self, got: u64, asked: u32) {
        self.bytes += got;
        if got < u64::from(asked) {
            let got = u32::try_from(got).unwrap_or(u32::MAX);
            self.served_max = self.served_max.min(got.max(RANGE_BYTES));
        }
    }

    /// The size of the next range asked for at `now`.
    fn next(&self, now: Instant) -> u32 {
        let elapsed = now.duration_since(self.started).as_secs_f64();
        if elapsed <= 0.0 || self.bytes == 0 {
            return RANGE_BYTES;
        }
        let rate = self.bytes as f64 / elapsed;
        let size = rate * self.budget.as_secs_f64() / WINDOW as f64;
        // Float to integer casts saturate.
        // `took` keeps `served_max` at RANGE_BYTES or more.
        (size as u32).clamp(RANGE_BYTES, self.served_max)
    }
}

/// Asks `server` for `max_bytes` of the snapshot `digest` (any, when zero) at `offset`;
/// answers with `max_bytes` too.
async fn request(
    net: &NetHandle,
    server: &PeerId,
    offset: u64,
    max_bytes: u32,
    digest: [u8; 32],
) -> (u32, anyhow::Result<ControlFrame>) {
    let request = Message::StateSyncRequest(StateSyncRequest {
        from_offset: offset,
        max_bytes,
        expected_digest: digest,
    });
    let answer = net.send_control(server, &request).await;
    (max_bytes, answer.map_err(anyhow::Error::from))
}

/// Appends one answered range to `partial`; `true` once the snapshot is whole and its
/// digest checked.
fn take(frame: &ControlFrame, limits: &FrameLimits, partial: &mut Partial) -> Result<bool, Fetch> {
    let (frame, _) = Frame::parse(frame.as_bytes(), limits).context("a bad response frame")?;
    let r = match Message::from_frame(&frame).context("a bad response")? {
        Message::StateSyncResponse(r) => r,
        Message::Reject(r) if r.code == RejectCode::Unavailable && partial.digest != [0; 32] => {
            return Err(Fetch::OtherSnapshot);
        }
        Message::Reject(r) => return Err(anyhow::anyhow!("refused: {}", r.text).into()),
        other => return Err(anyhow::anyhow!("unexpected answer {:?}", other.kind()).into()),
    };
    if partial.digest == [0; 32] {
        partial.digest = r.digest;
    } else if r.digest != partial.digest {
        return Err(Fetch::OtherSnapshot);
    }
    if partial.total.is_some_and(|t| t != r.total_len) || r.total_len > MAX_SNAPSHOT_BYTES {
        return Err(
            anyhow::anyhow!("the server announced another length for the same snapshot").into(),
        );
    }
    partial.total = Some(r.total_len);
    if r.offset != partial.len {
        return Err(anyhow::anyhow!("the server answered a range that was not asked for").into());
    }
    partial.append(r.payload)?;
    if !r.last {
        if r.payload.is_empty() {
            return Err(anyhow::anyhow!("the server sent an empty range before the end").into());
        }
        return Ok(false);
    }
    if partial.len != r.total_len {
        return Err(anyhow::anyhow!(
            "the snapshot ended at {} of {} bytes",
            partial.len,
            r.total_len
        )
        .into());
    }
    let got = partial.header_digest()?;
    if got != partial.digest {
        return Err(
            anyhow::anyhow!("the snapshot's digest does not match the one announced").into(),
        );
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::process::own_status_bytes;

    /// At 124M parameters with AdamW a refresh took seconds every 10 steps, all of it
    /// waited for by training; now the next one waits 19 times as long as the last took.
    #[test]
    fn a_refresh_waits_nineteen_times_as_long_as_the_last_one_took() {
        let ended = Instant::now();
        assert!(refresh_due(None, ended), "the first refresh is due at once");
        let took = Duration::from_millis(100);
        let last = Some((ended, took));
        assert!(!refresh_due(last, ended + Duration::from_millis(1_800)));
        assert!(refresh_due(last, ended + Duration::from_millis(1_900)));
        // A quick refresh (a small model) is due again almost at once.
        let quick = Some((ended, Duration::from_micros(200)));
        assert!(refresh_due(quick, ended + Duration::from_millis(4)));
    }

    /// Whether `a` and `b` hold the same values, bit for bit.
    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// A state of `params` alone.
    fn view_of(params: &[f32]) -> SnapshotView<'_> {
        SnapshotView {
            step: 3,
            samples: 48,
            push_sum_weight: 1.0,
            swarm_id: "s",
            model_fingerprint: [7; 32],
            tensors: vec![murmur_protocol::snapshot_file::TensorView {
                name: "params",
                data: params,
            }],
        }
    }

    /// The encoded state goes to a file, not to memory: publishing 48 MB of parameters that
    /// zstd cannot shrink raises resident memory by less than an eighth of that (holding
    /// the encoded bytes, as before, raised it by all of them), and the file's ranges are
    /// the bytes an encode in memory gives.
    #[test]
    fn a_published_state_is_served_from_a_file_not_from_memory() {
        use rand::{RngExt as _, SeedableRng as _};
        let dir = tempfile::tempdir().expect("a folder");
        let cell = StateCell::in_dir(dir.path().to_owned());
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let params: Vec<f32> = (0..12 << 20).map(|_| rng.random_range(-1.0..1.0)).collect();
        let view = view_of(&params);
        let resident = || own_status_bytes("VmRSS:").expect("/proc/self/status has VmRSS");
        let before = resident();
        cell.publish(&view).expect("publishes");
        let grew = resident().saturating_sub(before);
        let state_bytes = 4 * params.len() as u64;
        assert!(
            grew < state_bytes / 8,
            "publishing raised resident memory by {grew} bytes, for {state_bytes} of state"
        );
        let served = cell.find(&[0; 32]).expect("served");
        let encoded = view.encode(LEVEL).expect("encodes");
        assert_eq!(served.len, encoded.len() as u64);
        assert_eq!(
            served.digest,
            Snapshot::digest_of(&encoded).expect("a digest")
        );
        let mut range = vec![0u8; RANGE_BYTES as usize];
        for (at, want) in encoded.chunks(RANGE_BYTES as usize).enumerate().step_by(97) {
            let got = &mut range[..want.len()];
            served
                .file
                .read_exact_at(got, (at * RANGE_BYTES as usize) as u64)
                .expect("reads");
            assert_eq!(got, want, "range {at}");
        }
    }

    /// Feeds `encoded` to `partial` in ranges, as servers answer them, with one byte of the
    /// body flipped when `corrupt`; whether the last range made it whole.
    fn fetch_ranges(encoded: &[u8], partial: &mut Partial, corrupt: bool) -> bool {
        let digest = Snapshot::digest_of(encoded).expect("a digest");
        let limits = FrameLimits::default();
        let mut whole = false;
        for (at, range) in encoded.chunks(RANGE_BYTES as usize).enumerate() {
            let mut payload = range.to_vec();
            if corrupt && at == 1 {
                payload[7] ^= 1;
            }
            let offset = (at * RANGE_BYTES as usize) as u64;
            let message = Message::StateSyncResponse(StateSyncResponse {
                offset,
                total_len: encoded.len() as u64,
                digest,
                last: offset as usize + range.len() == encoded.len(),
                payload: &payload,
            });
            let frame = ControlFrame::encode(&message).expect("a frame");
            whole = take(&frame, &limits, partial).expect("a range taken");
        }
        whole
    }

    fn decode(partial: Partial) -> anyhow::Result<Snapshot> {
        let limits = SnapshotLimits {
            max_raw_len: 1 << 30,
            max_tensors: 4,
        };
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(partial.decode(limits))
    }

    /// A download goes to a file as it comes: taking 48 MB of state in ranges raises
    /// resident memory by less than an eighth of that (the ranges kept in memory, as
    /// before, raised it by all of them), and the state decoded from the file is the one
    /// served, bit for bit.
    #[test]
    fn a_download_is_written_to_a_file_and_decoded_from_there() {
        use rand::{RngExt as _, SeedableRng as _};
        let dir = tempfile::tempdir().expect("a folder");
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let params: Vec<f32> = (0..12 << 20).map(|_| rng.random_range(-1.0..1.0)).collect();
        let encoded = view_of(&params).encode(LEVEL).expect("encodes");
        let mut partial = Partial::in_dir(&dir.path().join("checkpoints")).expect("a file");
        let resident = || own_status_bytes("VmRSS:").expect("/proc/self/status has VmRSS");
        let before = resident();
        assert!(fetch_ranges(&encoded, &mut partial, false), "whole");
        let grew = resident().saturating_sub(before);
        assert!(
            grew < encoded.len() as u64 / 8,
            "taking the ranges raised resident memory by {grew} bytes, for {} of state",
            encoded.len()
        );
        let snapshot = decode(partial).expect("decodes");
        let tensor = &snapshot.tensors[0];
        assert_eq!((tensor.name.as_str(), snapshot.step), ("params", 3));
        assert!(same_bits(&tensor.data, &params));
    }

    /// A range that came corrupted fails the digest when the file is decoded: no state is
    /// taken from it.
    #[test]
    fn a_corrupted_download_does_not_decode() {
        let dir = tempfile::tempdir().expect("a folder");
        let params: Vec<f32> = (0..100_000).map(|i| (i as f32 * 0.37).sin()).collect();
        let encoded = view_of(&params).encode(LEVEL).expect("encodes");
        assert!(
            encoded.len() > 2 * RANGE_BYTES as usize,
            "more than two ranges"
        );
        let mut partial = Partial::in_dir(dir.path()).expect("a file");
        assert!(fetch_ranges(&encoded, &mut partial, true), "whole");
        let error = decode(partial).expect_err("a corrupted state");
        assert!(format!("{error:#}").contains("digest"), "{error:#}");
    }

    #[test]
    fn publishing_records_when_the_refresh_ended() {
        let dir = tempfile::tempdir().expect("a folder");
        let cell = StateCell::in_dir(dir.path().join("checkpoints"));
        assert!(cell.refresh_due());
        let params = [1.0_f32; 16];
        cell.publish(&view_of(&params)).expect("publishes");
        let last = cell.last_refresh.lock().unwrap().expect("recorded");
        assert!(last.0 <= Instant::now());
        assert!(cell.find(&[0; 32]).is_some(), "served");
    }

    /// The first range is the small one; later ones take as long, in flight, as a quarter
    /// of the request timeout at the rate measured: 48 KiB on a 1 Mbit/s link, about 390 KB
    /// on a 10 Mbit/s one, 1 MiB on loopback; and never more than a server answered with.
    #[test]
    fn ranges_grow_with_the_rate_measured_up_to_what_the_server_answers() {
        let start = Instant::now();
        let timeout = Duration::from_secs(10);
        let after = |bytes: u64, secs: f64| {
            let mut sizer = RangeSizer::new(timeout, start);
            sizer.took(bytes, MAX_STATE_RANGE_BYTES);
            sizer.next(start + Duration::from_secs_f64(secs))
        };
        assert_eq!(RangeSizer::new(timeout, start).next(start), RANGE_BYTES);
        assert_eq!(after(125_000, 1.0), RANGE_BYTES, "1 Mbit/s");
        let ten_mbit = after(1_250_000, 1.0);
        assert!((380_000..400_000).contains(&ten_mbit), "{ten_mbit}");
        assert_eq!(after(200_000_000, 1.0), MAX_STATE_RANGE_BYTES, "loopback");
        // A server that answers 48 KiB when asked for 1 MiB is asked for 48 KiB from then on.
        let mut sizer = RangeSizer::new(timeout, start);
        sizer.took(u64::from(RANGE_BYTES), MAX_STATE_RANGE_BYTES);
        sizer.took(200_000_000, 200_000_000);
        assert_eq!(sizer.next(start + Duration::from_secs(1)), RANGE_BYTES);
    }

    /// Serves a random state of `elements` parameters from one network stack with ranges
    /// of at most `max_range` bytes and downloads it with the other; the state's encoded
    /// bytes and the ranges served.
    fn download_between_two_stacks(max_range: u32, elements: usize) -> (u64, u64) {
        use murmur_gossip::net::bench::Libp2pPair;
        use rand::{RngExt as _, SeedableRng as _};
        let dir = tempfile::tempdir().expect("a folder");
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let params: Vec<f32> = (0..elements).map(|_| rng.random_range(-1.0..1.0)).collect();
        let cell = StateCell::in_dir(dir.path().join("served"));
        cell.publish(&view_of(&params)).expect("published");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let downloaded = runtime.block_on(async {
            let mut pair = Libp2pPair::start().await.expect("two network stacks");
            let control = pair.take_sender_control().expect("control requests");
            let limits = FrameLimits::new(64 * 1024).expect("limits");
            let server = pair.sender.local_peer_id();
            let serving = tokio::spawn(serve_ranges_of(
                pair.sender.clone(),
                control,
                cell,
                limits,
                max_range,
            ));
            let snapshot_limits = SnapshotLimits {
                max_raw_len: (elements as u64 * 4 + (1 << 20)) * 2,
                max_tensors: 4,
            };
            let joiner = dir.path().join("joiner");
            let downloaded = download(
                &pair.receiver,
                &[server],
                &joiner,
                &limits,
                &snapshot_limits,
            )
            .await;
            let _ = pair.sender.shutdown().await;
            let _ = pair.receiver.shutdown().await;
            drop(pair);
            let served = tokio::time::timeout(Duration::from_secs(10), serving)
                .await
                .expect("serving ends with the network")
                .expect("serving did not panic");
            (downloaded.expect("downloaded"), served)
        });
        let (downloaded, served) = downloaded;
        assert!(same_bits(&downloaded.snapshot.tensors[0].data, &params));
        (downloaded.bytes, served)
    }

    /// Ranges grow past a control frame's 64 KiB on loopback (12 MB in 48 KiB ranges would
    /// take 245 of them), and the state arrives whole.
    #[test]
    fn a_state_downloads_whole_in_ranges_larger_than_a_control_frame() {
        let (bytes, served) = download_between_two_stacks(MAX_STATE_RANGE_BYTES, 3 << 20);
        let small = bytes.div_ceil(u64::from(RANGE_BYTES));
        assert!(served < small / 4, "{served} ranges for {bytes} bytes");
    }

    /// A server that answers no more than 48 KiB a range (as servers did before ranges
    /// grew): the ranges asked for past it are asked for again from where it stopped.
    #[test]
    fn a_server_of_smaller_ranges_is_followed_where_it_stops() {
        let (bytes, served) = download_between_two_stacks(RANGE_BYTES, 3 << 20);
        assert!(
            served >= bytes.div_ceil(u64::from(RANGE_BYTES)),
            "{served} ranges"
        );
    }
}
