//! The joiner's side of state sync: ranges of one snapshot from every server that holds
//! it, at once.
//!
//! The most advanced server names the snapshot (its digest and length) with the first
//! range. Every other server is then asked for ranges of that same snapshot; one that holds
//! another answers so (once more a second later, since members publish a round's state
//! moments apart), and is left out of this snapshot's download. Butterfly members publish
//! the same bytes at the same rounds (see `RoundCadence`), so a joiner of such a swarm
//! fetches from all of them. A server that fails hands its ranges back, and the others
//! fetch them; once nothing is left to ask for, a server with room is asked for a range
//! another has not answered yet too (the first answer counts), so that a server killed
//! part way, whose requests fail only when they time out, does not hold the end back. When
//! none that holds the snapshot is left, the download starts over from the snapshot of one
//! that serves another.

use std::io::Seek as _;
use std::ops::Range;
use std::os::unix::fs::FileExt as _;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use murmur_gossip::net::{ControlFrame, NetError, NetHandle};
use murmur_protocol::frame::{Frame, FrameLimits};
use murmur_protocol::identity::PeerId;
use murmur_protocol::message::{
    MAX_STATE_RANGE_BYTES, Message, RejectCode, StateSyncRequest, state_sync_response_limits,
};
use murmur_protocol::snapshot::{SNAPSHOT_HEADER_LEN, Snapshot, SnapshotLimits};
use murmur_protocol::snapshot_file::read_snapshot;

use super::{MAX_SNAPSHOT_BYTES, unnamed_file_in};

/// The smallest range asked for, and the first: it fits a control frame of 64 KiB (the
/// default `net.max_control_payload`), which is all a server that serves no larger ranges
/// sends. Later ranges grow with the rate measured (see [`RangeSizer`]), up to
/// [`MAX_STATE_RANGE_BYTES`].
pub(super) const RANGE_BYTES: u32 = 48 * 1024;
/// Range requests in flight to one server at once.
const WINDOW: usize = 8;
/// [`WINDOW`] ranges in flight are sized to arrive within this share of the request
/// timeout at the rate measured so far, so that each range comes well within it even when
/// the rate drops.
const WINDOW_SHARE_OF_TIMEOUT: f64 = 0.25;
/// A server that does not hold the snapshot is asked once more after this: butterfly
/// members publish a round's state moments apart, so the one that named it may be ahead.
const OTHER_SNAPSHOT_RETRY: Duration = Duration::from_secs(1);
/// A range whose request failed in transit (its connection closed with no other to the
/// server open at that moment) is asked of the same server again after this, at most
/// [`TRANSIT_RETRIES`] times per server. A joiner's connections to both its servers were
/// seen to close 0.3 s into a download and open again 17 ms later, while the net layer
/// resends a control request only over a connection still open.
const TRANSIT_RETRY: Duration = Duration::from_millis(500);
/// See [`TRANSIT_RETRY`].
const TRANSIT_RETRIES: u8 = 3;

/// A downloaded state, and what its download took.
#[derive(Debug)]
pub(crate) struct Downloaded {
    pub(crate) snapshot: Snapshot,
    /// Encoded bytes fetched.
    pub(crate) bytes: u64,
    /// Servers that answered ranges of the snapshot taken.
    pub(crate) servers: usize,
    /// From the first request to the last range, every server tried included.
    pub(crate) fetch: Duration,
    /// Checking the digest and decoding the state from the file.
    pub(crate) decode: Duration,
}

/// Downloads a snapshot from `servers` (the most advanced first, which names it; every
/// other that holds the same one serves ranges of it too) into an unnamed file in `dir`,
/// verifies it and decodes it from there.
pub(crate) async fn download(
    net: &NetHandle,
    servers: &[PeerId],
    dir: &std::path::Path,
    limits: &FrameLimits,
    snapshot_limits: &SnapshotLimits,
) -> anyhow::Result<Downloaded> {
    let started = Instant::now();
    let mut partial = Partial::in_dir(dir)?;
    let mut candidates = servers.to_vec();
    let mut last_error = None;
    // Each try leaves out every server that failed in it: at most one try per server.
    for _ in 0..servers.len() {
        if candidates.is_empty() {
            break;
        }
        let sources = fetch(net, &candidates, limits, &mut partial).await;
        if partial.whole() {
            if partial.header_digest()? != partial.digest {
                anyhow::bail!("the snapshot's digest does not match the one announced");
            }
            let answered = sources.iter().filter(|s| s.ranges > 0).count();
            let per_server: Vec<u64> = sources.iter().map(|s| s.bytes).collect();
            let bytes = partial.received;
            let fetch = started.elapsed();
            let snapshot = partial.decode(*snapshot_limits).await?;
            let decode = started.elapsed() - fetch;
            let (took_s, decode_s) = (started.elapsed().as_secs_f64(), decode.as_secs_f64());
            tracing::info!(
                servers = answered,
                bytes,
                ?per_server,
                took_s,
                decode_s,
                "state downloaded"
            );
            return Ok(Downloaded {
                snapshot,
                bytes,
                servers: answered,
                fetch,
                decode,
            });
        }
        candidates.clear();
        for source in sources {
            match source.failed {
                Some(Fetch::OtherSnapshot) => candidates.push(source.peer),
                Some(Fetch::Failed(e)) => {
                    let server = source.peer;
                    tracing::warn!(%server, error = crate::error_text::describe(&e), "state download from this peer failed");
                    last_error = Some(e);
                }
                None => {}
            }
        }
        if !candidates.is_empty() {
            tracing::info!(
                kept = partial.received,
                "the peers left serve another snapshot; starting over from one of theirs"
            );
            partial.restart()?;
        }
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no peer to download the state from")))
}

/// One server's part in a download.
#[derive(Debug)]
struct Source {
    peer: PeerId,
    sizer: RangeSizer,
    in_flight: usize,
    /// Ranges it answered.
    ranges: u64,
    /// Bytes of the snapshot taken from its answers.
    bytes: u64,
    /// It was asked again after saying it serves another snapshot.
    asked_again: bool,
    /// That second asking is under way: nothing else is asked of it meanwhile.
    waiting: bool,
    /// Ranges asked again after failing in transit (see [`TRANSIT_RETRY`]).
    transit_retries: u8,
    /// Why it was given up on, for this snapshot.
    failed: Option<Fetch>,
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

impl Fetch {
    /// Whether the request failed in transit (its connection closed, or none was open),
    /// rather than timing out or being answered badly: the server may answer once
    /// reconnected.
    fn in_transit(&self) -> bool {
        let Fetch::Failed(error) = self else {
            return false;
        };
        matches!(
            error.downcast_ref::<NetError>(),
            Some(NetError::Request { .. } | NetError::Disconnected { .. })
        )
    }
}

/// Fetches the snapshot in `partial` from `servers` until it is whole or none that holds it
/// is left: when `partial` names none yet, the first server that answers names it, with
/// one range; then every server gets up to [`WINDOW`] requests in flight, each sized by its
/// own [`RangeSizer`]. A range that fails goes back to be asked of another server.
async fn fetch(
    net: &NetHandle,
    servers: &[PeerId],
    limits: &FrameLimits,
    partial: &mut Partial,
) -> Vec<Source> {
    let now = Instant::now();
    let mut sources: Vec<Source> = servers
        .iter()
        .map(|&peer| Source {
            peer,
            sizer: RangeSizer::new(net.request_timeout(), now),
            in_flight: 0,
            ranges: 0,
            bytes: 0,
            asked_again: false,
            waiting: false,
            transit_retries: 0,
            failed: None,
        })
        .collect();
    let limits = state_sync_response_limits(*limits);
    if partial.total.is_none() {
        for source in &mut sources {
            let first = 0..u64::from(RANGE_BYTES);
            let mut answer = request(net, source.peer, first.clone(), partial.digest).await;
            while answer.as_ref().is_err_and(Fetch::in_transit)
                && source.transit_retries < TRANSIT_RETRIES
            {
                source.transit_retries += 1;
                tokio::time::sleep(TRANSIT_RETRY).await;
                answer = request(net, source.peer, first.clone(), partial.digest).await;
            }
            match answer.and_then(|frame| take(&frame, &limits, partial, first)) {
                Ok(got) => {
                    source.ranges += 1;
                    source.bytes += got;
                    source.sizer.took(got, RANGE_BYTES);
                    break;
                }
                Err(e) => source.failed = Some(e),
            }
        }
    }
    let ask = |index: usize, peer: PeerId, range: Range<u64>, digest, wait: Duration| async move {
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let answer = request(net, peer, range.clone(), digest).await;
        (index, range, !wait.is_zero(), answer)
    };
    let mut in_flight = FuturesUnordered::new();
    let mut out = Outstanding::default();
    while !partial.whole() {
        for (index, source) in sources.iter_mut().enumerate() {
            while source.failed.is_none() && !source.waiting && source.in_flight < WINDOW {
                let size = u64::from(source.sizer.next(Instant::now()));
                // Nothing left to ask for: ask for a range another server has not answered
                // yet, so that a dead or slow server does not hold the end back.
                let Some(range) = partial.next_range(size).or_else(|| out.twin_for(index)) else {
                    break;
                };
                out.asked(range.clone(), index);
                source.in_flight += 1;
                let (peer, digest) = (source.peer, partial.digest);
                in_flight.push(ask(index, peer, range, digest, Duration::ZERO));
            }
        }
        // Nothing in flight and the snapshot not whole: every server was given up on.
        let Some((index, range, second, answer)) = in_flight.next().await else {
            break;
        };
        let source = &mut sources[index];
        source.in_flight -= 1;
        source.waiting &= !second;
        if !out.is_out(&range) {
            // Its twin was answered first.
            source.ranges += u64::from(answer.is_ok());
            continue;
        }
        let asked = range.end - range.start;
        match answer.and_then(|frame| take(&frame, &limits, partial, range.clone())) {
            Ok(got) => {
                out.answered(&range);
                source.ranges += 1;
                source.bytes += got;
                source
                    .sizer
                    .took(got, u32::try_from(asked).unwrap_or(u32::MAX));
                if got < asked {
                    // A server that answers less than asked: the rest is asked again.
                    partial.give_back(range.start + got..range.end);
                }
            }
            Err(Fetch::OtherSnapshot) if source.waiting => {
                if out.failed(&range) {
                    partial.give_back(range);
                }
            }
            Err(Fetch::OtherSnapshot) if !source.asked_again && source.failed.is_none() => {
                source.asked_again = true;
                source.waiting = true;
                source.in_flight += 1;
                let (peer, digest) = (source.peer, partial.digest);
                in_flight.push(ask(index, peer, range, digest, OTHER_SNAPSHOT_RETRY));
            }
            Err(e) if e.in_transit() && source.transit_retries < TRANSIT_RETRIES => {
                // Still this server's range: asked again once it may have reconnected.
                source.transit_retries += 1;
                source.in_flight += 1;
                let (peer, digest) = (source.peer, partial.digest);
                tracing::debug!(%peer, error = %e, "a state range failed in transit; asking again");
                in_flight.push(ask(index, peer, range, digest, TRANSIT_RETRY));
            }
            Err(e) => {
                if out.failed(&range) {
                    partial.give_back(range);
                }
                if source.failed.is_none() {
                    if !matches!(e, Fetch::OtherSnapshot) {
                        let (server, fetched) = (source.peer, partial.received);
                        let total = partial.total.unwrap_or(0);
                        tracing::info!(%server, fetched, total, error = %e, "a state range failed; the other servers take this one's ranges");
                    }
                    source.failed = Some(e);
                }
            }
        }
    }
    sources
}

/// The ranges asked for and not yet answered, each of one server or, at the end of a
/// download, of two (its twin asked of another server that had nothing left to do).
#[derive(Debug, Default)]
struct Outstanding {
    ranges: Vec<Out>,
}

#[derive(Debug)]
struct Out {
    range: Range<u64>,
    /// The server first asked.
    source: usize,
    /// Servers asked and not yet answered: 1, or 2 once a twin is out.
    holders: u8,
    twinned: bool,
}

impl Outstanding {
    /// `range` was asked of server `source`: of it alone, or as a twin.
    fn asked(&mut self, range: Range<u64>, source: usize) {
        match self.ranges.iter_mut().find(|o| o.range == range) {
            Some(out) => out.holders += 1,
            None => self.ranges.push(Out {
                range,
                source,
                holders: 1,
                twinned: false,
            }),
        }
    }

    /// The range asked longest ago of another server than `source`, not yet twinned.
    fn twin_for(&mut self, source: usize) -> Option<Range<u64>> {
        let out = self
            .ranges
            .iter_mut()
            .find(|o| !o.twinned && o.source != source)?;
        out.twinned = true;
        Some(out.range.clone())
    }

    /// Whether `range` is still to be answered.
    fn is_out(&self, range: &Range<u64>) -> bool {
        self.ranges.iter().any(|o| o.range == *range)
    }

    /// `range` was answered: its twin's answer, if one comes, is not needed.
    fn answered(&mut self, range: &Range<u64>) {
        self.ranges.retain(|o| o.range != *range);
    }

    /// A server's asking of `range` failed; whether no other is still asked for it.
    fn failed(&mut self, range: &Range<u64>) -> bool {
        let Some(at) = self.ranges.iter().position(|o| o.range == *range) else {
            return false;
        };
        let out = &mut self.ranges[at];
        out.holders = out.holders.saturating_sub(1);
        if out.holders == 0 {
            self.ranges.remove(at);
            return true;
        }
        false
    }
}

/// Asks `server` for the bytes `range` of the snapshot `digest` (any, when zero).
async fn request(
    net: &NetHandle,
    server: PeerId,
    range: Range<u64>,
    digest: [u8; 32],
) -> Result<ControlFrame, Fetch> {
    let request = Message::StateSyncRequest(StateSyncRequest {
        from_offset: range.start,
        // Ranges are sized by a `RangeSizer`: at most MAX_STATE_RANGE_BYTES.
        max_bytes: u32::try_from(range.end - range.start).unwrap_or(MAX_STATE_RANGE_BYTES),
        expected_digest: digest,
    });
    let answer = net.send_control(&server, &request).await;
    Ok(answer.map_err(anyhow::Error::from)?)
}

/// Writes one answered range, asked for as `asked`, into `partial`; the bytes it held.
fn take(
    frame: &ControlFrame,
    limits: &FrameLimits,
    partial: &mut Partial,
    asked: Range<u64>,
) -> Result<u64, Fetch> {
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
    if r.offset != asked.start {
        return Err(anyhow::anyhow!("the server answered a range that was not asked for").into());
    }
    let got = r.payload.len() as u64;
    let end = r.offset + got;
    if got > asked.end - asked.start || end > r.total_len {
        return Err(anyhow::anyhow!("the server answered more bytes than asked for").into());
    }
    if r.last != (end == r.total_len) {
        return Err(anyhow::anyhow!("the snapshot ended at {end} of {} bytes", r.total_len).into());
    }
    if got == 0 && !r.last {
        return Err(anyhow::anyhow!("the server sent an empty range before the end").into());
    }
    if partial.total.is_none() {
        partial.total = Some(r.total_len);
        partial.todo.clear();
        if end < r.total_len {
            partial.todo.push(end..r.total_len);
        }
    }
    partial.write(r.offset, r.payload)?;
    Ok(got)
}

/// The bytes of one snapshot fetched so far, in an unnamed file (gone once closed), and
/// its digest once a server named it.
#[derive(Debug)]
pub(super) struct Partial {
    file: std::fs::File,
    digest: [u8; 32],
    total: Option<u64>,
    /// Bytes fetched.
    received: u64,
    /// Ranges neither fetched nor asked for (one that fails comes back here).
    todo: Vec<Range<u64>>,
}

impl Partial {
    /// Nothing fetched yet, into a file made in `dir` (made if missing).
    pub(super) fn in_dir(dir: &std::path::Path) -> anyhow::Result<Partial> {
        Ok(Partial {
            file: unnamed_file_in(dir, "the downloaded state")?,
            digest: [0; 32],
            total: None,
            received: 0,
            todo: Vec::new(),
        })
    }

    /// Forgets what was fetched, to fetch another snapshot.
    fn restart(&mut self) -> anyhow::Result<()> {
        self.file
            .set_len(0)
            .context("cannot empty the file of the downloaded state")?;
        self.digest = [0; 32];
        self.total = None;
        self.received = 0;
        self.todo.clear();
        Ok(())
    }

    /// Whether every byte of the snapshot is here.
    fn whole(&self) -> bool {
        self.total == Some(self.received)
    }

    /// The next range to ask for, of at most `max` bytes: those given back first.
    fn next_range(&mut self, max: u64) -> Option<Range<u64>> {
        let todo = self.todo.last_mut()?;
        let end = todo.end.min(todo.start + max.max(1));
        let range = todo.start..end;
        todo.start = end;
        if todo.is_empty() {
            self.todo.pop();
        }
        Some(range)
    }

    /// A range asked for and not fetched: it is to be asked for again.
    fn give_back(&mut self, range: Range<u64>) {
        if !range.is_empty() && self.total.is_some() {
            self.todo.push(range);
        }
    }

    /// Writes a range's bytes at `offset`.
    fn write(&mut self, offset: u64, bytes: &[u8]) -> anyhow::Result<()> {
        self.file
            .write_all_at(bytes, offset)
            .context("cannot write the downloaded state to its file")?;
        self.received += bytes.len() as u64;
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
    pub(super) async fn decode(self, limits: SnapshotLimits) -> anyhow::Result<Snapshot> {
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

#[cfg(test)]
mod tests {
    use super::super::tests::{same_bits, view_of};
    use super::super::{LEVEL, StateCell, serve_ranges_of};
    use super::*;
    use crate::observe::process::own_status_bytes;
    use murmur_protocol::message::StateSyncResponse;
    use tokio::sync::mpsc;

    #[test]
    fn only_a_request_lost_with_its_connection_is_asked_again() {
        let peer = murmur_protocol::identity::Keypair::from_seed([7; 32]).peer_id();
        let failed = |error: NetError| Fetch::Failed(anyhow::Error::from(error));
        let closed = failed(NetError::Request {
            peer,
            reason: "Connection was closed before a response was received".into(),
        });
        assert!(closed.in_transit());
        assert!(failed(NetError::Disconnected { peer }).in_transit());
        let timed_out = failed(NetError::Timeout {
            what: "a control request's answer",
            after: Duration::from_secs(10),
        });
        assert!(!timed_out.in_transit());
        assert!(!Fetch::Failed(anyhow::anyhow!("a bad response")).in_transit());
        assert!(!Fetch::OtherSnapshot.in_transit());
    }

    /// Feeds `encoded` to `partial` in ranges, as servers answer them, with one byte of the
    /// body flipped when `corrupt`; whether the last range made it whole.
    fn fetch_ranges(encoded: &[u8], partial: &mut Partial, corrupt: bool) -> bool {
        let digest = Snapshot::digest_of(encoded).expect("a digest");
        let limits = FrameLimits::default();
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
            let asked = offset..offset + u64::from(RANGE_BYTES);
            take(&frame, &limits, partial, asked).expect("a range taken");
        }
        partial.whole()
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

    /// How one server of a test download behaves.
    #[derive(Debug, Clone, Copy)]
    struct TestServer {
        /// Serves the snapshot the first server serves, or another one.
        same: bool,
        /// The most bytes it answers a range with.
        max_range: u32,
        /// Answers this many requests, then shuts its network down.
        leaves_after: Option<usize>,
        /// Answers this many requests, then none, though it stays connected (a process
        /// killed with SIGKILL looks so until its connection times out).
        silent_after: Option<usize>,
    }

    /// A server of the first server's snapshot, in ranges of up to 1 MiB, that stays.
    const SAME: TestServer = TestServer {
        same: true,
        max_range: MAX_STATE_RANGE_BYTES,
        leaves_after: None,
        silent_after: None,
    };

    /// Serves a random state of `elements` parameters from one network stack per server
    /// (another state where `same` is false) and downloads it with another stack, the
    /// first server named first; the download and the ranges each server answered.
    fn download_from(servers: &[TestServer], elements: usize) -> (Downloaded, Vec<u64>) {
        use murmur_gossip::net::bench::Libp2pPair;
        use rand::{RngExt as _, SeedableRng as _};
        let dir = tempfile::tempdir().expect("a folder");
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let params: Vec<f32> = (0..elements).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut other = params.clone();
        other[0] += 1.0;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let (downloaded, served) = runtime.block_on(async {
            let mut pair = Libp2pPair::start().await.expect("two network stacks");
            let limits = FrameLimits::new(64 * 1024).expect("limits");
            let mut stacks = Vec::new();
            let mut serving = Vec::new();
            for (index, server) in servers.iter().enumerate() {
                let (net, mut control) = if index == 0 {
                    let control = pair.take_sender_control().expect("control requests");
                    (pair.sender.clone(), control)
                } else {
                    pair.another_sender().await.expect("another stack")
                };
                let cell = StateCell::in_dir(dir.path().join(format!("served-{index}")));
                let state = if server.same { &params } else { &other };
                cell.publish(&view_of(state)).expect("published");
                let requests = match (server.leaves_after, server.silent_after) {
                    (None, Some(answers)) => {
                        let (forward, requests) = mpsc::channel(WINDOW);
                        tokio::spawn(async move {
                            let mut unanswered = Vec::new();
                            let mut count = 0;
                            while let Some(request) = control.recv().await {
                                count += 1;
                                if count > answers {
                                    unanswered.push(request);
                                } else {
                                    let _ = forward.send(request).await;
                                }
                            }
                        });
                        requests
                    }
                    (None, None) => control,
                    (Some(answers), _) => {
                        let (forward, requests) = mpsc::channel(WINDOW);
                        let leaving = net.clone();
                        tokio::spawn(async move {
                            for _ in 0..answers {
                                let Some(request) = control.recv().await else {
                                    return;
                                };
                                let _ = forward.send(request).await;
                            }
                            let _ = leaving.shutdown().await;
                        });
                        requests
                    }
                };
                let serve = serve_ranges_of(net.clone(), requests, cell, limits, server.max_range);
                serving.push(tokio::spawn(serve));
                stacks.push(net);
            }
            let snapshot_limits = SnapshotLimits {
                max_raw_len: (elements as u64 * 4 + (1 << 20)) * 2,
                max_tensors: 4,
            };
            let ids: Vec<PeerId> = stacks.iter().map(NetHandle::local_peer_id).collect();
            let joiner = dir.path().join("joiner");
            let downloaded = download(&pair.receiver, &ids, &joiner, &limits, &snapshot_limits)
                .await
                .expect("downloaded");
            for net in &stacks {
                let _ = net.shutdown().await;
            }
            let _ = pair.receiver.shutdown().await;
            drop(pair);
            let mut served = Vec::new();
            for task in serving {
                let answered = tokio::time::timeout(Duration::from_secs(10), task)
                    .await
                    .expect("serving ends with the network")
                    .expect("serving did not panic");
                served.push(answered);
            }
            (downloaded, served)
        });
        assert!(same_bits(&downloaded.snapshot.tensors[0].data, &params));
        (downloaded, served)
    }

    /// Ranges grow past a control frame's 64 KiB on loopback (12 MB in 48 KiB ranges would
    /// take 245 of them), and the state arrives whole.
    #[test]
    fn a_state_downloads_whole_in_ranges_larger_than_a_control_frame() {
        let (downloaded, served) = download_from(&[SAME], 3 << 20);
        let small = downloaded.bytes.div_ceil(u64::from(RANGE_BYTES));
        assert!(
            served[0] < small / 4,
            "{served:?} ranges for {} bytes",
            downloaded.bytes
        );
    }

    /// A server that answers no more than 48 KiB a range (as servers did before ranges
    /// grew): the rest of each range asked for is asked for again.
    #[test]
    fn a_server_of_smaller_ranges_is_followed_where_it_stops() {
        let small = TestServer {
            max_range: RANGE_BYTES,
            ..SAME
        };
        let (downloaded, served) = download_from(&[small], 3 << 20);
        let ranges = downloaded.bytes.div_ceil(u64::from(RANGE_BYTES));
        assert!(served[0] >= ranges, "{served:?} ranges");
    }

    /// Two servers of the same snapshot both serve ranges of it, in ranges of their own
    /// sizes (one answers 48 KiB at most).
    #[test]
    fn two_servers_of_the_same_snapshot_both_serve_it() {
        let small = TestServer {
            max_range: RANGE_BYTES,
            ..SAME
        };
        let (downloaded, served) = download_from(&[SAME, small], 3 << 20);
        assert_eq!(downloaded.servers, 2, "{served:?}");
        assert!(served.iter().all(|&n| n > 1), "{served:?}");
    }

    /// The server that named the snapshot leaves after its second range: the other one
    /// serves the rest, and the state arrives whole.
    #[test]
    fn a_server_that_leaves_part_way_leaves_its_ranges_to_the_other() {
        let leaving = TestServer {
            leaves_after: Some(2),
            ..SAME
        };
        let (downloaded, served) = download_from(&[leaving, SAME], 3 << 20);
        assert_eq!(downloaded.servers, 2, "{served:?}");
        assert!(served[0] <= 2 && served[1] > 2, "{served:?}");
    }

    /// A server that falls silent part way, still connected, holds the end of the
    /// download back no longer than the other takes to answer its ranges too: not until
    /// its requests time out (10 s).
    #[test]
    fn a_server_that_falls_silent_does_not_hold_the_end_back() {
        let silent = TestServer {
            silent_after: Some(3),
            ..SAME
        };
        let started = Instant::now();
        let (downloaded, served) = download_from(&[SAME, silent], 3 << 20);
        let took = started.elapsed();
        assert_eq!(downloaded.servers, 2, "{served:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    /// A server of another snapshot is left out of the download, which the first one
    /// serves whole.
    #[test]
    fn a_server_of_another_snapshot_serves_none_of_this_one() {
        let other = TestServer {
            same: false,
            ..SAME
        };
        let (downloaded, served) = download_from(&[SAME, other], 3 << 20);
        assert_eq!((downloaded.servers, served[1]), (1, 0), "{served:?}");
    }
}
