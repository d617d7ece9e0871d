//! One averaging round over the network: a butterfly all-reduce or a ring all-reduce of a
//! flat vector among a fixed list of members, driven to its end with every wait bounded.
//!
//! Members agree on a round by its number: the group id in every chunk. Chunks of a later
//! round that arrive early (a faster member already started it) wait in [`Early`]; chunks
//! of an earlier round are dropped.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use murmur_gossip::butterfly::{
    ButterflyRound, Group, Partition, PayloadRef, RoundBuffers, RoundInput, RoundOutput,
};
use murmur_gossip::net::NetEvent;
use murmur_gossip::net::exchange::{Delivery, Parcel, SendReport};
use murmur_gossip::ring::{RingAllReduce, RingInput, RingOutput};
use murmur_protocol::identity::PeerId;
use murmur_protocol::message::{AveragedChunk, ChunkAddress, TensorPartChunk};
use tokio::sync::broadcast::error::RecvError;

use murmur_gossip::Time;
use murmur_gossip::butterfly::ButterflyConfig;
use murmur_gossip::net::NetEvent as Event;
use murmur_gossip::net::exchange::{Mailbox, Outbox};
use murmur_protocol::codec::CodecSpec;
use tokio::sync::broadcast;

use super::peer::{Peer, Request, Signals};

/// The queues a round reads and writes, borrowed together.
pub(crate) struct RoundIo<'a> {
    pub(crate) mailbox: &'a mut Mailbox,
    pub(crate) outbox: &'a mut Outbox,
    pub(crate) events: &'a mut broadcast::Receiver<Event>,
    /// `None` where nobody sends signals (a benchmark peer).
    pub(crate) signals: Option<&'a mut Signals>,
}

/// What a round needs from the process that runs it: a training peer, or a benchmark peer.
pub(crate) trait RoundHost {
    fn me(&self) -> PeerId;
    fn now(&self) -> Time;
    fn instant_of(&self, at: Time) -> tokio::time::Instant;
    fn codec(&self) -> CodecSpec;
    fn butterfly(&self) -> &ButterflyConfig;
    fn ring_timeout(&self) -> Duration;
    fn io(&mut self) -> RoundIo<'_>;
    fn mailbox(&self) -> &Mailbox;
    /// A membership event arrived during the round.
    fn note_event(&mut self, event: &Event);
    /// A parcel that is no chunk (a group message) arrived during the round; by default it
    /// is dropped.
    fn note_parcel(&mut self, delivery: Delivery) {
        self.mailbox().recycle(delivery.parcel.into_payload());
    }
    /// Whether `peer`, a member of the round, is known to be gone (its connections
    /// closed): the round gives up on it at once and sends it nothing, rather than dialing
    /// it again for every chunk.
    fn is_gone(&self, _peer: &PeerId) -> bool {
        false
    }
    /// A pause or resume arrived during the round.
    fn set_paused(&mut self, paused: bool);
    /// `bytes` of raw `f32` went out (encoded).
    fn count_raw(&mut self, bytes: u64);
    /// When [`RoundHost::maintain`] next has work, if ever.
    fn next_maintenance(&self) -> Option<tokio::time::Instant> {
        None
    }
    /// Heartbeats and liveness; returns the peers given up on as silent.
    fn maintain(&mut self) -> Vec<PeerId> {
        Vec::new()
    }
    /// A parcel went out (`sent`) or came in, for the traffic metrics.
    fn record_parcel(&self, _sent: bool, _parcel: &Parcel) {}
    /// Whether a round measures [`RoundOutcome::drift`], one more pass over the vector.
    fn measures_drift(&self) -> bool {
        true
    }
}

impl RoundHost for Peer {
    fn me(&self) -> PeerId {
        self.me
    }
    fn now(&self) -> Time {
        Peer::now(self)
    }
    fn instant_of(&self, at: Time) -> tokio::time::Instant {
        Peer::instant_of(self, at)
    }
    fn codec(&self) -> CodecSpec {
        self.settings.codec
    }
    fn butterfly(&self) -> &ButterflyConfig {
        &self.settings.butterfly
    }
    fn ring_timeout(&self) -> Duration {
        self.settings.ring_timeout
    }
    fn io(&mut self) -> RoundIo<'_> {
        RoundIo {
            mailbox: &mut self.mailbox,
            outbox: &mut self.outbox,
            events: &mut self.events,
            signals: Some(&mut self.signals),
        }
    }
    fn mailbox(&self) -> &Mailbox {
        &self.mailbox
    }
    fn note_event(&mut self, event: &Event) {
        let _ = Peer::note_event(self, event);
    }
    fn next_maintenance(&self) -> Option<tokio::time::Instant> {
        Some(Peer::next_maintenance(self))
    }
    fn maintain(&mut self) -> Vec<PeerId> {
        Peer::maintain(self)
    }
    fn set_paused(&mut self, paused: bool) {
        Peer::set_paused(self, paused);
    }
    fn count_raw(&mut self, bytes: u64) {
        self.counters.raw_bytes += bytes;
    }
    fn record_parcel(&self, sent: bool, parcel: &Parcel) {
        Peer::record_parcel(self, sent, parcel);
    }
}

/// Waits for the next signal, or forever without signals.
async fn next_request(signals: Option<&mut Signals>) -> Request {
    match signals {
        Some(signals) => signals.next().await,
        None => std::future::pending().await,
    }
}

/// Most chunks held for rounds not yet started; the oldest go first.
const EARLY_LIMIT: usize = 4096;

/// Chunks that arrived for a round this peer has not started.
#[derive(Debug, Default)]
pub(crate) struct Early {
    parcels: VecDeque<Delivery>,
}

impl Early {
    /// Keeps a delivery for later (a chunk) or recycles it (anything else).
    pub(crate) fn keep(&mut self, mailbox: &Mailbox, delivery: Delivery) {
        if group_of(&delivery.parcel).is_none() {
            mailbox.recycle(delivery.parcel.into_payload());
            return;
        }
        if self.parcels.len() >= EARLY_LIMIT
            && let Some(old) = self.parcels.pop_front()
        {
            mailbox.recycle(old.parcel.into_payload());
        }
        self.parcels.push_back(delivery);
    }

    /// Takes the chunks of `round`, dropping those of earlier rounds.
    fn take(&mut self, mailbox: &Mailbox, round: u64) -> Vec<Delivery> {
        let mut now = Vec::new();
        let mut later = VecDeque::new();
        for d in self.parcels.drain(..) {
            match group_of(&d.parcel) {
                Some(g) if g == round => now.push(d),
                Some(g) if g > round => later.push_back(d),
                _ => mailbox.recycle(d.parcel.into_payload()),
            }
        }
        self.parcels = later;
        now
    }
}

pub(crate) fn group_of(parcel: &Parcel) -> Option<u64> {
    match parcel {
        Parcel::PartChunk(m, _) => Some(m.address.group_id),
        Parcel::Averaged(m, _) => Some(m.address.group_id),
        _ => None,
    }
}

/// What a round achieved.
#[derive(Debug)]
pub(crate) struct RoundOutcome {
    /// The averaged vector (local values where the round could not average).
    pub(crate) values: Vec<f32>,
    /// The round's memory once `values` was taken, for the next round; for the butterfly,
    /// the contribution too, unchanged.
    pub(crate) spare: RoundBuffers,
    /// Fraction of the vector averaged over every member still alive (senders the round
    /// had to drop are not counted against it).
    pub(crate) coverage: f64,
    /// Fraction of the vector averaged over every member of the group.
    pub(crate) coverage_all: f64,
    /// Senders this member's reduction dropped for silence (butterfly).
    pub(crate) stragglers_dropped: u32,
    /// Parts whose reducer fell silent, kept at local values (butterfly).
    pub(crate) parts_timed_out: u32,
    /// The reducers of those parts (butterfly): members that sent none of their averages
    /// within the reducer timeout, or whose connection closed. A reducer sends the same
    /// averages to every member, so the members of a round see the same reducers fall
    /// silent.
    pub(crate) silent_reducers: Vec<PeerId>,
    /// Relative L2 distance between this member's contribution and the result
    /// (butterfly; `None` for the ring).
    pub(crate) drift: Option<f64>,
    pub(crate) duration: Duration,
    /// When this member's result was complete (its own averages may still be going out).
    pub(crate) finished_after: Duration,
    pub(crate) group: usize,
    /// A stop was requested while the round ran.
    pub(crate) stop_requested: bool,
}

impl RoundOutcome {
    pub(crate) fn outcome(&self) -> &'static str {
        if self.coverage >= 1.0 {
            "complete"
        } else if self.coverage > 0.0 {
            "partial"
        } else {
            "failed"
        }
    }
}

/// What a finished round reported.
#[derive(Debug, Clone)]
struct Finished {
    coverage: f64,
    coverage_all: f64,
    stragglers_dropped: u32,
    parts_timed_out: u32,
    silent_reducers: Vec<PeerId>,
}

impl Finished {
    /// A round whose coverage is the same over every measure, with no faults counted.
    fn whole(coverage: f64) -> Finished {
        Finished {
            coverage,
            coverage_all: coverage,
            stragglers_dropped: 0,
            parts_timed_out: 0,
            silent_reducers: Vec::new(),
        }
    }
}

/// `‖a − b‖ / ‖b‖`, or `None` when `b` is zero.
pub(crate) fn relative_distance(a: &[f32], b: &[f32]) -> Option<f64> {
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        diff += (f64::from(x) - f64::from(y)).powi(2);
        norm += f64::from(y).powi(2);
    }
    (norm > 0.0).then(|| (diff / norm).sqrt())
}

/// What woke a round's loop.
enum Wake {
    Delivery(Delivery),
    Report(SendReport),
    Event(Result<Event, RecvError>),
    Timer,
    Request(Request),
}

/// Which collective a round runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Collective {
    Butterfly,
    Ring,
}

/// Either machine, behind one interface.
enum Machine {
    Butterfly(Box<ButterflyRound<PeerId>>),
    Ring(Box<RingAllReduce<PeerId>>),
}

/// Runs round `round` among `members` (this peer included), averaging `local` (a vector,
/// or [`RoundBuffers`] holding it with an earlier round's memory) with weight `weight`;
/// gives up at `bound` and keeps local values for what is missing.
pub(crate) async fn average<H: RoundHost>(
    peer: &mut H,
    early: &mut Early,
    kind: Collective,
    round: u64,
    mut members: Vec<PeerId>,
    local: impl Into<RoundBuffers>,
    weight: f32,
) -> anyhow::Result<RoundOutcome> {
    let mut buffers = local.into();
    let started = Instant::now();
    members.sort_unstable();
    members.dedup();
    let group = members.len();
    let codec = peer.codec();
    let now = peer.now();
    let bound = match kind {
        Collective::Butterfly => {
            let b = peer.butterfly();
            Duration::from_millis(b.reducer_timeout_ms + 2 * b.chunk_timeout_ms)
        }
        Collective::Ring => peer.ring_timeout(),
    };
    let deadline = tokio::time::Instant::now() + bound;
    let mut machine = match kind {
        Collective::Butterfly => {
            let align = codec.block().map_or(1, |b| b as usize);
            let partition = Partition::equal(buffers.local.len(), group, align)
                .context("cannot split the vector into parts")?;
            let group = Group::new(round, round, members.clone(), partition)?;
            let config = peer.butterfly();
            Machine::Butterfly(Box::new(ButterflyRound::new(
                peer.me(),
                group,
                std::mem::take(&mut buffers),
                weight,
                codec,
                config,
                now,
            )?))
        }
        Collective::Ring => {
            let ring_deadline = now + bound;
            Machine::Ring(Box::new(RingAllReduce::new(
                peer.me(),
                members.clone(),
                round,
                std::mem::take(&mut buffers.local),
                weight,
                codec,
                ring_deadline,
            )?))
        }
    };
    let mut sends: HashMap<u64, (PeerId, PayloadRef)> = HashMap::new();
    // Tags name the round, so that a report of a chunk a round stopped waiting for (sent
    // to a lost member) is not taken for one of a later round's.
    let mut next_tag = (round & u64::from(u32::MAX)) << 32;
    let mut finished: Option<Finished> = None;
    let mut stop_requested = false;
    let mut finished_after = None;

    if let Machine::Butterfly(r) = &mut machine {
        for gone in members.iter().filter(|m| peer.is_gone(m)) {
            r.handle(now, RoundInput::MemberLost(*gone))?;
        }
    }
    for d in early.take(peer.mailbox(), round) {
        feed(peer, &mut machine, d)?;
    }
    loop {
        drain(
            peer,
            &mut machine,
            &mut sends,
            &mut next_tag,
            &mut finished,
            group,
        )?;
        let idle = match &machine {
            Machine::Butterfly(r) => r.is_idle(),
            Machine::Ring(_) => sends.is_empty(),
        };
        if finished.is_some() && finished_after.is_none() {
            finished_after = Some(started.elapsed());
        }
        if finished.is_some() && idle {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                round,
                "averaging round ran past its bound; keeping what it has"
            );
            break;
        }
        let timer = match &machine {
            Machine::Butterfly(r) => r.poll_timeout(),
            Machine::Ring(r) => r.poll_timeout(),
        }
        .map(|t| peer.instant_of(t))
        .unwrap_or(deadline)
        .min(deadline);
        let timer = peer.next_maintenance().map_or(timer, |m| m.min(timer));
        let wake = {
            let io = peer.io();
            tokio::select! {
                Some(d) = io.mailbox.recv() => Wake::Delivery(d),
                Some(report) = io.outbox.next_report() => Wake::Report(report),
                event = io.events.recv() => Wake::Event(event),
                () = tokio::time::sleep_until(timer) => Wake::Timer,
                request = next_request(io.signals) => Wake::Request(request),
            }
        };
        match wake {
            Wake::Delivery(d) => match group_of(&d.parcel) {
                Some(g) if g == round => feed(peer, &mut machine, d)?,
                Some(g) if g > round => early.keep(peer.mailbox(), d),
                Some(_) => peer.mailbox().recycle(d.parcel.into_payload()),
                None => peer.note_parcel(d),
            },
            Wake::Report(report) => {
                match &report.result {
                    Ok(()) => peer.record_parcel(true, &report.parcel),
                    Err(e) => tracing::debug!(peer = %report.to, error = %e, "chunk not sent"),
                }
                let payload = report.parcel.into_payload();
                peer.mailbox().recycle(payload);
                if let Some((to, payload)) = sends.remove(&report.tag) {
                    let now = peer.now();
                    match &mut machine {
                        Machine::Butterfly(r) => r.handle(now, RoundInput::Sent { to, payload })?,
                        Machine::Ring(r) => r.handle(now, RingInput::Sent { payload })?,
                    }
                }
            }
            Wake::Event(Ok(event)) => {
                peer.note_event(&event);
                if let (NetEvent::PeerDisconnected { peer: gone }, Machine::Butterfly(r)) =
                    (&event, &mut machine)
                    && members.contains(gone)
                {
                    let now = peer.now();
                    r.handle(now, RoundInput::MemberLost(*gone))?;
                }
            }
            Wake::Event(Err(RecvError::Lagged(_))) => {}
            Wake::Event(Err(RecvError::Closed)) => anyhow::bail!("the network layer stopped"),
            Wake::Timer => {
                for silent in peer.maintain() {
                    if let Machine::Butterfly(r) = &mut machine
                        && members.contains(&silent)
                    {
                        let now = peer.now();
                        r.handle(now, RoundInput::MemberLost(silent))?;
                    }
                }
                let now = peer.now();
                match &mut machine {
                    Machine::Butterfly(r) => r.handle(now, RoundInput::Tick)?,
                    Machine::Ring(r) => r.handle(now, RingInput::Tick)?,
                }
            }
            Wake::Request(Request::Stop) => stop_requested = true,
            Wake::Request(Request::Pause) => peer.set_paused(true),
            Wake::Request(Request::Resume) => peer.set_paused(false),
        }
    }
    let end = finished.unwrap_or_else(|| Finished::whole(0.0));
    let (values, drift) = match machine {
        Machine::Butterfly(r) => {
            buffers = r.into_buffers();
            let drift = if peer.measures_drift() {
                relative_distance(&buffers.local, &buffers.result)
            } else {
                None
            };
            (std::mem::take(&mut buffers.result), drift)
        }
        // The ring scales its input in place, so there is nothing to compare with.
        Machine::Ring(r) => (r.result().to_vec(), None),
    };
    Ok(RoundOutcome {
        values,
        spare: buffers,
        coverage: end.coverage,
        coverage_all: end.coverage_all,
        stragglers_dropped: end.stragglers_dropped,
        parts_timed_out: end.parts_timed_out,
        silent_reducers: end.silent_reducers,
        drift,
        duration: started.elapsed(),
        finished_after: finished_after.unwrap_or_else(|| started.elapsed()),
        group,
        stop_requested,
    })
}

/// Hands one chunk of the current round to the machine.
fn feed<H: RoundHost>(peer: &mut H, machine: &mut Machine, d: Delivery) -> anyhow::Result<()> {
    peer.record_parcel(false, &d.parcel);
    let now = peer.now();
    let from = d.from;
    let result = match (&d.parcel, &mut *machine) {
        (Parcel::PartChunk(m, payload), Machine::Butterfly(r)) => r
            .handle(
                now,
                RoundInput::PartChunk {
                    from,
                    address: m.address,
                    weight: m.weight,
                    codec: m.codec,
                    payload,
                },
            )
            .map_err(anyhow::Error::from),
        (Parcel::Averaged(m, payload), Machine::Butterfly(r)) => r
            .handle(
                now,
                RoundInput::AveragedChunk {
                    from,
                    address: m.address,
                    contributors: m.contributors,
                    total_weight: m.total_weight,
                    codec: m.codec,
                    payload,
                },
            )
            .map_err(anyhow::Error::from),
        (Parcel::PartChunk(m, payload), Machine::Ring(r)) => r
            .handle(
                now,
                RingInput::Segment {
                    from,
                    address: m.address,
                    weight: m.weight,
                    codec: m.codec,
                    payload,
                },
            )
            .map_err(anyhow::Error::from),
        _ => Ok(()),
    };
    if let Err(e) = result {
        // A bad chunk costs its sender its contribution, never the round.
        tracing::warn!(peer = %from, error = %e, "chunk refused");
    }
    peer.mailbox().recycle(d.parcel.into_payload());
    Ok(())
}

/// Acts on every output the machine has queued.
fn drain<H: RoundHost>(
    peer: &mut H,
    machine: &mut Machine,
    sends: &mut HashMap<u64, (PeerId, PayloadRef)>,
    next_tag: &mut u64,
    finished: &mut Option<Finished>,
    group: usize,
) -> anyhow::Result<()> {
    loop {
        // The parcel's head, with an empty (unallocated) payload until the bytes are copied.
        let (to, head, payload, elements): (PeerId, Parcel, PayloadRef, u32) = match machine {
            Machine::Butterfly(r) => match r.poll_output() {
                None => return Ok(()),
                Some(RoundOutput::SendPartChunk {
                    to,
                    address,
                    weight,
                    payload,
                }) => {
                    let head = part_chunk(address, weight, r.codec_spec());
                    (to, head, payload, address.elements)
                }
                Some(RoundOutput::SendAveragedChunk {
                    to,
                    address,
                    contributors,
                    total_weight,
                    payload,
                }) => {
                    let head = Parcel::Averaged(
                        AveragedChunk {
                            address,
                            contributors,
                            total_weight,
                            codec: r.codec_spec(),
                            payload: &[],
                        },
                        Vec::new(),
                    );
                    (to, head, payload, address.elements)
                }
                Some(RoundOutput::Finished(report)) => {
                    let members = u32::try_from(group).unwrap_or(u32::MAX);
                    let dropped = u32::try_from(report.dropped_senders.len()).unwrap_or(0);
                    let alive = members.saturating_sub(dropped).max(1);
                    let fallbacks = report.fallback_reducers();
                    *finished = Some(Finished {
                        coverage: report.fraction_covered_by(alive),
                        coverage_all: report.fraction_covered_by(members),
                        stragglers_dropped: dropped,
                        parts_timed_out: u32::try_from(fallbacks.len()).unwrap_or(u32::MAX),
                        silent_reducers: fallbacks,
                    });
                    continue;
                }
            },
            Machine::Ring(r) => match r.poll_output() {
                None => return Ok(()),
                Some(RingOutput::Send {
                    to,
                    address,
                    weight,
                    payload,
                }) => {
                    let head = part_chunk(address, weight, peer.codec());
                    (to, head, payload, address.elements)
                }
                Some(RingOutput::Finished) => {
                    *finished = Some(Finished::whole(1.0));
                    continue;
                }
                Some(RingOutput::Failed { steps_received }) => {
                    tracing::warn!(steps_received, "ring round failed; keeping local values");
                    *finished = Some(Finished::whole(0.0));
                    continue;
                }
            },
        };
        if peer.is_gone(&to) {
            let now = peer.now();
            match machine {
                Machine::Butterfly(r) => r.handle(now, RoundInput::Sent { to, payload })?,
                Machine::Ring(r) => r.handle(now, RingInput::Sent { payload })?,
            }
            continue;
        }
        let bytes = match machine {
            Machine::Butterfly(r) => r.payload(payload),
            Machine::Ring(r) => r.payload(payload),
        }
        .context("a send output named no payload")?;
        let mut buf = peer.mailbox().pool().take();
        buf.extend_from_slice(bytes);
        peer.count_raw(u64::from(elements) * 4);
        let tag = *next_tag;
        *next_tag += 1;
        let parcel = match head {
            Parcel::PartChunk(m, _) => Parcel::PartChunk(m, buf),
            Parcel::Averaged(m, _) => Parcel::Averaged(m, buf),
            other => other,
        };
        match peer.io().outbox.send(to, tag, parcel) {
            Ok(()) => {
                sends.insert(tag, (to, payload));
            }
            Err(parcel) => {
                // The destination's queue is full: the chunk is lost to it, as if its
                // connection had failed; the round's timeouts take care of the rest.
                peer.mailbox().recycle(parcel.into_payload());
                let now = peer.now();
                match machine {
                    Machine::Butterfly(r) => r.handle(now, RoundInput::Sent { to, payload })?,
                    Machine::Ring(r) => r.handle(now, RingInput::Sent { payload })?,
                }
            }
        }
    }
}

/// A part chunk's head, its payload still empty.
fn part_chunk(address: ChunkAddress, weight: f32, codec: CodecSpec) -> Parcel {
    Parcel::PartChunk(
        TensorPartChunk {
            address,
            weight,
            codec,
            payload: &[],
        },
        Vec::new(),
    )
}
