//! Joining from the swarm's state: a peer serves its latest state snapshot over the control
//! protocol, and a joiner downloads one in ranges, from every peer that serves the snapshot
//! the most advanced one names ([`download()`]).
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
//! snapshot. Up to 8 ranges are in flight to each server at once, so a download moves 8
//! ranges per round trip rather than one, and ranges grow from 48 KiB to 1 MiB with the rate
//! measured: on loopback a 485 MB state came at 0.88–1.00 of one tensor
//! stream's rate with them, 0.61–0.71 with 48 KiB ranges (`murmur bench state-sync`).
//! The server keeps its previous snapshot as well as the current one, so that a refresh in
//! the middle of a download does not break it; the ranges of a server that fails part way
//! go to the others that serve the same snapshot, and when none is left the download starts
//! over from the snapshot of one that serves another.
//! The joiner writes the ranges into an unnamed file beside the served snapshots and
//! decodes the state from there once its digest checks out, so it never holds the encoded
//! state and the decoded one in memory at once.
//! The download is bounded by progress, not in total: every range must come within the
//! network's request timeout, so a large state on a slow link takes as long as it needs
//! while a stalled server is given up on. A peer that serves state keeps training: the
//! serving task only reads the shared snapshot cell.

use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use murmur_gossip::net::{InboundControl, NetHandle};
use murmur_protocol::frame::{Frame, FrameLimits};
use murmur_protocol::message::{
    MAX_STATE_RANGE_BYTES, Message, Reject, RejectCode, StateSyncRequest, StateSyncResponse,
};
use murmur_protocol::snapshot::SNAPSHOT_HEADER_LEN;
use murmur_protocol::snapshot_file::SnapshotView;
use tokio::sync::mpsc;

mod download;

pub(crate) use download::download;

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
    /// started from it. How long encoding and writing it took.
    pub(crate) fn publish(&self, snapshot: &SnapshotView<'_>) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let result = self.replace(snapshot);
        let took = started.elapsed();
        if let Ok(mut last) = self.last_refresh.lock() {
            *last = Some((Instant::now(), took));
        }
        result.map(|()| took)
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

/// A butterfly member publishes at optimizer step counts that are multiples of this times
/// a power of two ([`RoundCadence`]).
const PUBLISH_UNIT: u64 = 10;

/// When a butterfly member publishes its state: after the update of its first round, then
/// after every update that brings the optimizer's step count to a multiple of
/// `PUBLISH_UNIT × 2^k`, the power chosen so that encoding takes about 1/20 of the
/// wall time, as [`REFRESH_WAIT_FACTOR`] has it for the other modes. Members of a round hold
/// the same parameters and optimizer state after its update (the learning rate follows the
/// round, not the member's own steps), and a multiple of a larger power is a multiple of
/// every smaller one: members publish the same bytes at the same rounds, however their
/// encoding times differ, and a joiner fetches from all of them at once.
#[derive(Debug)]
pub(crate) struct RoundCadence {
    /// Publish at optimizer step counts that are multiples of this.
    every: u64,
    /// The step count of the last publication, and when it ended.
    last: Option<(u64, Instant)>,
}

impl Default for RoundCadence {
    fn default() -> Self {
        RoundCadence {
            every: PUBLISH_UNIT,
            last: None,
        }
    }
}

impl RoundCadence {
    /// Whether the state after the update that made `steps` optimizer steps is to be
    /// published.
    pub(crate) fn due(&self, steps: u64) -> bool {
        match self.last {
            None => steps == 1 || steps.is_multiple_of(self.every),
            Some((last, _)) => steps > last && steps.is_multiple_of(self.every),
        }
    }

    /// The state at `steps` was published at `now`, which took `took`.
    pub(crate) fn published(&mut self, steps: u64, now: Instant, took: Duration) {
        if let Some((last, at)) = self.last
            && steps > last
        {
            let per_step = now.duration_since(at).as_secs_f64() / (steps - last) as f64;
            let wanted = took.as_secs_f64() * f64::from(REFRESH_WAIT_FACTOR) / per_step.max(1e-9);
            let units = (wanted / PUBLISH_UNIT as f64).ceil().clamp(1.0, 1e9) as u64;
            self.every = PUBLISH_UNIT * units.next_power_of_two();
        }
        self.last = Some((steps, now));
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

#[cfg(test)]
mod tests {
    use super::download::RANGE_BYTES;
    use super::*;
    use crate::observe::process::own_status_bytes;
    use murmur_protocol::snapshot::Snapshot;

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
    pub(super) fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// A state of `params` alone.
    pub(super) fn view_of(params: &[f32]) -> SnapshotView<'_> {
        SnapshotView {
            step: 3,
            samples: 48,
            push_sum_weight: 1.0,
            swarm_id: "s",
            model_fingerprint: [7; 32],
            tensors: vec![murmur_protocol::snapshot_file::TensorView::floats(
                "params", params,
            )],
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

    /// Members publish after their first update, then at multiples of 10 optimizer steps
    /// times the power of two that keeps encoding near 1/20 of the wall time; a member
    /// that encodes slower publishes at a subset of a faster one's rounds, never between.
    #[test]
    fn round_publications_of_slow_and_fast_encoders_meet_at_the_same_rounds() {
        let start = Instant::now();
        let second = Duration::from_secs(1);
        let rounds_of = |took: Duration| {
            let mut cadence = RoundCadence::default();
            let mut published = Vec::new();
            for steps in 1..=400u64 {
                if cadence.due(steps) {
                    published.push(steps);
                    cadence.published(steps, start + second * steps as u32, took);
                }
            }
            published
        };
        // One step a second: 0.1 s of encoding wants 1.9 s between publications, 2 s wants
        // 38 s: every 10 and every 40 steps.
        let fast = rounds_of(Duration::from_millis(100));
        let slow = rounds_of(Duration::from_secs(2));
        assert_eq!(&fast[..4], &[1, 10, 20, 30]);
        assert_eq!(&slow[..4], &[1, 10, 40, 80]);
        assert!(slow.iter().all(|s| fast.contains(s)), "{slow:?} {fast:?}");
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
}
