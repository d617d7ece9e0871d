//! Runs an averaging engine ([`crate::engine`]) over the network: the one async shell
//! around the sans-IO engines, used by `murmur run` and `murmur bench allreduce` alike.
//!
//! One task owns the engine, the [`Mailbox`], the [`Outbox`] and a subscription to the
//! network's events. It feeds the engine every parcel, send report, membership event and
//! timer, carries out what the engine asks (parcels onto streams, heartbeats into gossip,
//! silent peers disconnected), and hands the engine's work to the caller, which runs the
//! trainer. The caller holds an [`EngineHandle`]: it receives [`FromEngine`] messages, in
//! the order the engine emitted them, and answers work with [`EngineHandle::work_done`].
//! Both queues are bounded; a caller that falls behind holds the driver back, so it must
//! keep reading (the daemon's loop only counts and logs what it reads).
//!
//! An engine call runs on the driver's task, and one on a large vector takes seconds. So
//! that no peer is given up for it: a heartbeat keeper task sends the last heartbeat again
//! while the driver is held (the `heartbeat_keeper` module), the network events queued
//! meanwhile are fed in before the next timer's silence check, and a turn held for a
//! quarter interval or more is logged.

use std::sync::Arc;
use std::time::{Duration, Instant};

use murmur_protocol::identity::PeerId;
use murmur_protocol::message::{AveragingMode, HeartbeatBody};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;

use crate::Time;
use crate::engine::{
    Beat, Engine, EngineError, EngineEvent, EngineInput, EngineOutput, EngineStatus, Looking,
    MemberEvent, Work, WorkDone,
};
use crate::parcel::Parcel;

use super::bootstrap::DialResult;
use super::exchange::{Mailbox, Outbox};
use super::heartbeat_keeper::HeartbeatKeeper;
use super::{NetEvent, NetHandle};

/// Messages queued for the caller.
const CALLER_QUEUE: usize = 1024;

/// Network events fed to the engine, at most, before a timer's tick.
const MAX_QUEUED_EVENTS_BEFORE_TICK: usize = 256;

/// How often the driver tells the engine the measured upload bandwidth, and redials the
/// bootstrap addresses while it knows too few peers.
const MAINTENANCE_EVERY: Duration = Duration::from_secs(1);

/// Between redials of the bootstrap addresses while the membership is short.
const REDIAL_EVERY: Duration = Duration::from_secs(5);
/// The first wait between "no peers" warnings; it doubles after each, up to
/// [`ALONE_WARNING_MAX`].
const ALONE_WARNING_FIRST: Duration = Duration::from_secs(30);
const ALONE_WARNING_MAX: Duration = Duration::from_secs(600);

/// A leave's whole bound, in [`DriverConfig::leave_bound`]s: a hand-off that keeps making
/// progress (a large model's, on a slow link) may take this long.
pub const LEAVE_BOUNDS_IN_ALL: u32 = 15;

/// What a driver needs to know beside its engine.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// The mode, as heartbeats announce it.
    pub mode: AveragingMode,
    /// Bootstrap addresses, dialed again while fewer than `expected_peers` peers are known.
    pub bootstrap: Vec<String>,
    /// Peers the swarm is expected to have besides this one (at least 1 for redials).
    pub expected_peers: usize,
    /// How long a finishing engine may go without progress on its hand-off (a share
    /// written, or its last step's work taken in) before the driver stops anyway; the whole
    /// leave takes at most [`LEAVE_BOUNDS_IN_ALL`] times this.
    pub leave_bound: Duration,
}

/// The network side of a driver.
#[derive(Debug)]
pub struct EngineIo {
    /// The network handle.
    pub net: NetHandle,
    /// Inbound parcels.
    pub mailbox: Mailbox,
    /// Outbound parcels.
    pub outbox: Outbox,
    /// Network events (subscribed before the engine's membership was built, so nothing
    /// between is missed).
    pub events: broadcast::Receiver<NetEvent>,
}

/// How the engine's [`Time`] maps onto the process's clocks.
#[derive(Debug, Clone, Copy)]
pub struct EngineClock {
    /// The instant of [`Time::ZERO`].
    pub zero: Instant,
    /// The wall clock at [`Time::ZERO`], in milliseconds since the Unix epoch (a whole
    /// number of milliseconds, so that deadlines convert exactly).
    pub wall_ms_at_zero: u64,
}

impl EngineClock {
    /// A clock whose zero is now.
    pub fn start() -> EngineClock {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        // Zero at the last whole millisecond of the wall clock.
        let zero =
            Instant::now() - Duration::from_nanos(u64::from(wall.subsec_nanos() % 1_000_000));
        EngineClock {
            zero,
            wall_ms_at_zero: u64::try_from(wall.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// Now, on the engine's clock.
    pub fn now(&self) -> Time {
        Time::from_nanos(u64::try_from(self.zero.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// The instant a point on the engine's clock stands for.
    pub fn instant(&self, at: Time) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.zero + Duration::from_nanos(at.as_nanos()))
    }

    /// A point on the engine's clock as wall milliseconds.
    pub fn wall_ms(&self, at: Time) -> u64 {
        self.wall_ms_at_zero.saturating_add(at.as_millis())
    }

    /// Wall milliseconds as a point on the engine's clock (the epoch if earlier).
    pub fn time_of_wall(&self, wall_ms: u64) -> Time {
        Time::from_millis(wall_ms.saturating_sub(self.wall_ms_at_zero))
    }
}

/// Sees every parcel the driver moves, for traffic metrics.
pub trait ParcelObserver: Send + Sync + 'static {
    /// A parcel was written to `to`.
    fn sent(&self, to: &PeerId, parcel: &Parcel);
    /// A parcel arrived from `from`.
    fn received(&self, from: &PeerId, parcel: &Parcel);
}

/// What the driver hands the caller.
#[derive(Debug)]
pub enum FromEngine {
    /// Work for the trainer; answer with [`EngineHandle::work_done`].
    Work(Work),
    /// A report for metrics and logs.
    Event(EngineEvent<PeerId>),
    /// Training stopped; the final parameters.
    Finished(Vec<f32>),
}

/// Why a driver stopped.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The engine failed.
    #[error("averaging engine: {0}")]
    Engine(#[from] EngineError),
    /// The network task stopped.
    #[error("the network layer stopped")]
    NetworkStopped,
    /// The caller dropped its handle.
    #[error("the engine's caller went away")]
    CallerGone,
}

/// How a driver ended.
#[derive(Debug)]
pub enum DriverExit {
    /// The engine departed.
    Departed,
    /// The hand-off made no progress for `leave_bound`, or took longer than
    /// [`LEAVE_BOUNDS_IN_ALL`] of them.
    LeaveTimedOut,
}

/// Messages to the driver.
#[derive(Debug)]
enum ToEngine {
    Done(WorkDone),
    Finish,
}

/// The caller's side of a running driver.
#[derive(Debug)]
pub struct EngineHandle {
    from: mpsc::Receiver<FromEngine>,
    to: mpsc::Sender<ToEngine>,
    status: watch::Receiver<EngineStatus>,
    task: Option<JoinHandle<Result<DriverExit, DriverError>>>,
}

impl EngineHandle {
    /// The next message from the engine; `None` once the driver has stopped (then
    /// [`EngineHandle::stopped`] says why).
    pub async fn next(&mut self) -> Option<FromEngine> {
        self.from.recv().await
    }

    /// Answers the engine's last work.
    pub async fn work_done(&self, done: WorkDone) -> Result<(), DriverError> {
        self.to
            .send(ToEngine::Done(done))
            .await
            .map_err(|_| DriverError::CallerGone)
    }

    /// Asks the engine to stop: it finishes its work in flight, hands over its final
    /// parameters ([`FromEngine::Finished`]) and departs.
    pub async fn finish(&self) {
        let _ = self.to.send(ToEngine::Finish).await;
    }

    /// The engine's state as of its last input.
    pub fn status(&self) -> EngineStatus {
        *self.status.borrow()
    }

    /// Waits until the engine's state changes (or the driver stops).
    pub async fn status_changed(&mut self) {
        if self.status.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Waits for the driver to end, and says how.
    pub async fn stopped(&mut self) -> Result<DriverExit, DriverError> {
        match self.task.take() {
            Some(task) => task.await.unwrap_or(Err(DriverError::CallerGone)),
            None => Err(DriverError::CallerGone),
        }
    }
}

/// Starts a driver for `engine` on the current runtime.
pub fn spawn<E>(
    engine: E,
    io: EngineIo,
    clock: EngineClock,
    config: DriverConfig,
    observer: Option<Arc<dyn ParcelObserver>>,
) -> EngineHandle
where
    E: Engine<PeerId> + Send + 'static,
{
    let (from_tx, from_rx) = mpsc::channel(CALLER_QUEUE);
    let (to_tx, to_rx) = mpsc::channel(4);
    let (status_tx, status_rx) = watch::channel(engine.status());
    let keeper = HeartbeatKeeper::spawn(
        io.net.clone(),
        clock,
        config.mode,
        engine.membership().interval(),
    );
    let multi_thread = tokio::runtime::Handle::current().runtime_flavor()
        == tokio::runtime::RuntimeFlavor::MultiThread;
    let driver = Driver {
        keeper,
        multi_thread,
        engine,
        io,
        clock,
        config,
        observer,
        from: from_tx,
        to: to_rx,
        status: status_tx,
        leave_deadline: None,
        next_redial: None,
        alone_warning: None,
    };
    let task = tokio::spawn(driver.run());
    EngineHandle {
        from: from_rx,
        to: to_tx,
        status: status_rx,
        task: Some(task),
    }
}

struct Driver<E> {
    /// Sends the latest heartbeat while the engine holds the driver.
    keeper: HeartbeatKeeper,
    /// Whether the runtime has worker threads to hand tasks to.
    multi_thread: bool,
    engine: E,
    io: EngineIo,
    clock: EngineClock,
    config: DriverConfig,
    observer: Option<Arc<dyn ParcelObserver>>,
    from: mpsc::Sender<FromEngine>,
    to: mpsc::Receiver<ToEngine>,
    status: watch::Sender<EngineStatus>,
    /// While finishing: when to stop waiting for the hand-off, and the latest that may
    /// move to.
    leave_deadline: Option<(tokio::time::Instant, tokio::time::Instant)>,
    next_redial: Option<Instant>,
    /// While this peer knows no peer although it has bootstrap addresses: when to warn
    /// next, and the wait after that.
    alone_warning: Option<(Instant, Duration)>,
}

/// What woke the driver.
enum Wake {
    Parcel(super::exchange::Delivery),
    Report(super::exchange::SendReport),
    Net(Result<NetEvent, broadcast::error::RecvError>),
    Caller(Option<ToEngine>),
    Timer,
    Maintenance,
    LeaveBound,
}

impl Wake {
    /// Whether the engine call it leads to may work on the whole vector: a parcel (the last
    /// chunk of a part) or the trainer's finished work.
    fn may_take_long(&self) -> bool {
        matches!(
            self,
            Wake::Parcel(_) | Wake::Caller(Some(ToEngine::Done(_)))
        )
    }

    /// What woke the driver, for the log.
    fn name(&self) -> &'static str {
        match self {
            Wake::Parcel(_) => "parcel",
            Wake::Report(_) => "send report",
            Wake::Net(_) => "network event",
            Wake::Caller(_) => "trainer",
            Wake::Timer => "timer",
            Wake::Maintenance => "maintenance",
            Wake::LeaveBound => "leave bound",
        }
    }
}

impl<E: Engine<PeerId>> Driver<E> {
    async fn run(mut self) -> Result<DriverExit, DriverError> {
        let mut maintenance = tokio::time::interval(MAINTENANCE_EVERY);
        maintenance.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if self.carry_out().await? {
                return Ok(DriverExit::Departed);
            }
            let status = self.engine.status();
            self.status.send_if_modified(|s| {
                let changed = *s != status;
                *s = status;
                changed
            });
            let timer = self
                .engine
                .poll_timeout()
                .map(|t| self.clock.instant(t))
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            let leave = self.leave_deadline.map(|(at, _)| at);
            let wake = tokio::select! {
                Some(d) = self.io.mailbox.recv() => Wake::Parcel(d),
                Some(r) = self.io.outbox.next_report() => Wake::Report(r),
                event = self.io.events.recv() => Wake::Net(event),
                message = self.to.recv() => Wake::Caller(message),
                () = tokio::time::sleep_until(timer) => Wake::Timer,
                _ = maintenance.tick() => Wake::Maintenance,
                () = sleep_until_some(leave) => Wake::LeaveBound,
            };
            let now = self.clock.now();
            let woke = Instant::now();
            let kind = wake.name();
            let heavy = wake.may_take_long();
            // A share written, or the last step's work taken in (whose turn may itself run
            // for seconds on a large model): the hand-off goes on.
            let progress = matches!(&wake, Wake::Report(r) if r.result.is_ok())
                || matches!(wake, Wake::Caller(Some(ToEngine::Done(_))));
            let input = match wake {
                Wake::Parcel(delivery) => {
                    if let Some(observer) = &self.observer {
                        observer.received(&delivery.from, &delivery.parcel);
                    }
                    EngineInput::Parcel {
                        from: delivery.from,
                        parcel: delivery.parcel,
                    }
                }
                Wake::Report(report) => {
                    let delivered = report.result.is_ok();
                    if let Some(observer) = self.observer.as_ref().filter(|_| delivered) {
                        observer.sent(&report.to, &report.parcel);
                    }
                    if let Err(e) = &report.result {
                        tracing::debug!(peer = %report.to, error = %e, "parcel not sent");
                    }
                    EngineInput::Sent {
                        to: report.to,
                        tag: report.tag,
                        delivered,
                        parcel: report.parcel,
                    }
                }
                Wake::Net(Ok(event)) => EngineInput::Member(member_event(&self.clock, event)),
                Wake::Net(Err(broadcast::error::RecvError::Lagged(n))) => {
                    tracing::warn!(missed = n, "membership events lost");
                    continue;
                }
                Wake::Net(Err(broadcast::error::RecvError::Closed)) => {
                    return Err(DriverError::NetworkStopped);
                }
                Wake::Caller(Some(ToEngine::Done(done))) => EngineInput::WorkDone(done),
                Wake::Caller(Some(ToEngine::Finish)) => {
                    let now = tokio::time::Instant::now();
                    let bound = self.config.leave_bound;
                    self.leave_deadline
                        .get_or_insert((now + bound, now + bound * LEAVE_BOUNDS_IN_ALL));
                    EngineInput::Finish
                }
                Wake::Caller(None) => return Err(DriverError::CallerGone),
                Wake::Timer => {
                    self.note_queued_events()?;
                    EngineInput::Tick
                }
                Wake::Maintenance => {
                    self.maintain();
                    continue;
                }
                Wake::LeaveBound => {
                    tracing::warn!("hand-off not confirmed in time; leaving anyway");
                    return Ok(DriverExit::LeaveTimedOut);
                }
            };
            if heavy && self.multi_thread {
                // May run for seconds on a large vector: hand this worker's queued tasks
                // (the network task, the heartbeat keeper) to another thread meanwhile.
                tokio::task::block_in_place(|| self.engine.handle(now, input))?;
            } else {
                self.engine.handle(now, input)?;
            }
            let done = self.carry_out().await?;
            if progress {
                self.hand_off_progressed();
            }
            self.note_stall(kind, woke.elapsed());
            if done {
                return Ok(DriverExit::Departed);
            }
        }
    }

    /// Moves the leave deadline `leave_bound` past now, within the whole leave's bound.
    fn hand_off_progressed(&mut self) {
        if let Some((at, latest)) = &mut self.leave_deadline {
            *at = (tokio::time::Instant::now() + self.config.leave_bound).min(*latest);
        }
    }

    /// Warns when one turn of the loop (an engine call and carrying out its outputs) held
    /// the driver for a quarter of a heartbeat interval or more: meanwhile no heartbeat
    /// went out and none was noted, so peers may be given up as silent on either side.
    fn note_stall(&self, kind: &'static str, took: Duration) {
        let bound = self.engine.membership().interval() / 4;
        if took >= bound {
            tracing::warn!(
                woke_by = kind,
                took_ms = took.as_millis() as u64,
                "the averaging engine held its driver; heartbeats wait meanwhile"
            );
        }
    }

    /// Carries out every output the engine has queued; returns whether it departed.
    async fn carry_out(&mut self) -> Result<bool, DriverError> {
        while let Some(output) = self.engine.poll_output() {
            match output {
                EngineOutput::Send { to, tag, parcel } => {
                    if let Err(parcel) = self.io.outbox.send(to, tag, parcel) {
                        // The destination's queue is full: the parcel never left.
                        tracing::debug!(peer = %to, "the destination's queue is full; parcel not sent");
                        let now = self.clock.now();
                        let input = EngineInput::Sent {
                            to,
                            tag,
                            delivered: false,
                            parcel,
                        };
                        self.engine.handle(now, input)?;
                    }
                }
                EngineOutput::Work(work) => tell(&self.from, FromEngine::Work(work)).await?,
                EngineOutput::Finished(params) => {
                    tell(&self.from, FromEngine::Finished(params)).await?
                }
                EngineOutput::Event(event) => tell(&self.from, FromEngine::Event(event)).await?,
                EngineOutput::Heartbeat(beat) => self.publish(beat),
                EngineOutput::Disconnect(peer) => {
                    tracing::warn!(%peer, "no heartbeat for 1.6 intervals: treating the peer as gone");
                    // If it crashed and comes back, it must find a fresh connection; if it
                    // is alive, it reconnects and is taken back.
                    let net = self.io.net.clone();
                    tokio::spawn(async move {
                        if let Err(e) = net.disconnect(&peer).await {
                            tracing::debug!(%peer, error = %e, "silent peer not disconnected");
                        }
                    });
                }
                EngineOutput::Recycle(buf) => self.io.mailbox.recycle(buf),
                EngineOutput::Departed => return Ok(true),
            }
        }
        Ok(false)
    }

    fn publish(&self, beat: Beat) {
        publish_heartbeat(&self.io.net, &self.clock, self.config.mode, beat);
        self.keeper.published(beat);
    }

    /// Feeds the engine the network events queued meanwhile (a bounded number), so that a
    /// timer that fires after a long engine call judges silence on the heartbeats that
    /// arrived during it, not before them. (A call longer than an interval also restarts
    /// every member's silence window, [`Membership::silent`](crate::engine::Membership::silent);
    /// this covers the shorter ones.)
    fn note_queued_events(&mut self) -> Result<(), DriverError> {
        for _ in 0..MAX_QUEUED_EVENTS_BEFORE_TICK {
            let event = match self.io.events.try_recv() {
                Ok(event) => event,
                Err(broadcast::error::TryRecvError::Empty) => break,
                Err(broadcast::error::TryRecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "membership events lost");
                    continue;
                }
                Err(broadcast::error::TryRecvError::Closed) => {
                    return Err(DriverError::NetworkStopped);
                }
            };
            let now = self.clock.now();
            let input = EngineInput::Member(member_event(&self.clock, event));
            self.engine.handle(now, input)?;
        }
        Ok(())
    }

    /// Tells the engine the measured bandwidth; redials the bootstrap addresses while the
    /// membership is short (a dial that failed at start is otherwise never retried, and
    /// after a partition heals the two sides would never meet again).
    fn maintain(&mut self) {
        let (upload, _) = mean_bandwidth(&self.io.net);
        self.engine.set_measured_upload(upload);
        let reachability = self.io.net.metrics().reachability();
        self.engine
            .set_unreachable(reachability == super::Reachability::Private);
        let known = self.engine.membership().len();
        let expected = self.config.expected_peers.max(1);
        let now = Instant::now();
        self.warn_while_alone(known, now);
        if self.config.bootstrap.is_empty() || known >= expected {
            self.next_redial = None;
            return;
        }
        if self.next_redial.is_some_and(|next| now < next) {
            return;
        }
        self.next_redial = Some(now + REDIAL_EVERY);
        tracing::debug!(
            known,
            expected,
            "fewer peers than expected: dialing the bootstrap addresses again"
        );
        let net = self.io.net.clone();
        let addresses = self.config.bootstrap.clone();
        tokio::spawn(async move {
            for text in addresses {
                let result = match text.parse() {
                    Ok(address) => net.dial(address).await.map_err(|e| e.to_string()),
                    Err(e) => Err(format!("{e}")),
                };
                if let Err(e) = result {
                    tracing::debug!(address = %text, error = %e, "bootstrap address not dialed");
                }
            }
        });
    }
}

impl<E: Engine<PeerId>> Driver<E> {
    /// Warns, with backoff, while this peer knows no peer although it has bootstrap
    /// addresses, naming each address and what its last dial gave.
    fn warn_while_alone(&mut self, known: usize, now: Instant) {
        if known > 0 || self.config.bootstrap.is_empty() {
            self.alone_warning = None;
            return;
        }
        let (due, wait) = *self
            .alone_warning
            .get_or_insert((now + ALONE_WARNING_FIRST, ALONE_WARNING_FIRST));
        if now < due {
            return;
        }
        let next = (wait * 2).min(ALONE_WARNING_MAX);
        self.alone_warning = Some((now + next, next));
        let dials: Vec<String> = self
            .io
            .net
            .bootstrap_dials()
            .into_iter()
            .map(|dial| match dial.last {
                Some(DialResult::Failed { reason }) => format!(
                    "{} (failed {} times in a row: {reason})",
                    dial.address, dial.failures_in_a_row
                ),
                Some(DialResult::Connected { peer }) => {
                    format!("{} (reached {peer}, who did not join us)", dial.address)
                }
                None => format!("{} (no answer yet)", dial.address),
            })
            .collect();
        tracing::warn!(
            bootstrap = %dials.join("; "),
            "no peers: this peer trains alone until a bootstrap address (net.bootstrap) answers"
        );
    }
}

/// A network event as an engine's membership sees it.
pub fn member_event(clock: &EngineClock, event: NetEvent) -> MemberEvent<PeerId> {
    match event {
        NetEvent::PeerAuthorized { peer, .. } => MemberEvent::Admitted(peer),
        NetEvent::PeerDisconnected { peer } | NetEvent::PeerRejected { peer, .. } => {
            MemberEvent::Left(peer)
        }
        NetEvent::Heartbeat { peer, body } => {
            let looking = (body.looking_until_ms > 0).then(|| Looking {
                round: body.looking_round,
                until: clock.time_of_wall(body.looking_until_ms),
            });
            let beat = Beat {
                step: body.step,
                samples_accumulated: body.samples_accumulated,
                samples_per_s: body.samples_per_s,
                upload_bytes_per_s: body.upload_bytes_per_s,
                looking,
                incarnation: body.incarnation,
            };
            MemberEvent::Heartbeat(peer, beat)
        }
    }
}

/// Publishes `beat` as this peer's signed heartbeat, in the background. The bandwidth it
/// declares is the beat's when it has one, else the mean measured over the peers.
pub fn publish_heartbeat(net: &NetHandle, clock: &EngineClock, mode: AveragingMode, beat: Beat) {
    let (upload, download) = mean_bandwidth(net);
    let (looking_round, looking_until_ms) = match beat.looking {
        // A deadline at the wall clock's epoch would read as "not looking".
        Some(l) => (l.round, clock.wall_ms(l.until).max(1)),
        None => (0, 0),
    };
    let body = HeartbeatBody {
        step: beat.step,
        timestamp_ms: net.heartbeat_timestamp(clock.wall_ms(clock.now())),
        samples_per_s: if beat.samples_per_s.is_finite() {
            beat.samples_per_s.max(0.0)
        } else {
            0.0
        },
        upload_bytes_per_s: if beat.upload_bytes_per_s > 0 {
            beat.upload_bytes_per_s
        } else {
            upload
        },
        download_bytes_per_s: download,
        mode,
        samples_accumulated: beat.samples_accumulated,
        looking_round,
        looking_until_ms,
        incarnation: net.incarnation(),
    };
    let net = net.clone();
    tokio::spawn(async move {
        if let Err(e) = net.publish_heartbeat(&body).await {
            tracing::debug!(error = %e, "heartbeat not published");
        }
    });
}

/// Mean measured upload and download over the peers with an estimate.
fn mean_bandwidth(net: &NetHandle) -> (u64, u64) {
    let all = net.bandwidth_estimator().all();
    let mean = |pick: fn(&super::PeerBandwidth) -> Option<f64>| {
        let rates: Vec<f64> = all.iter().filter_map(|(_, b)| pick(b)).collect();
        if rates.is_empty() {
            0
        } else {
            (rates.iter().sum::<f64>() / rates.len() as f64) as u64
        }
    };
    (
        mean(|b| b.upload_bytes_per_s),
        mean(|b| b.download_bytes_per_s),
    )
}

/// Hands `message` to the caller, waiting while its queue is full.
async fn tell(to: &mpsc::Sender<FromEngine>, message: FromEngine) -> Result<(), DriverError> {
    to.send(message).await.map_err(|_| DriverError::CallerGone)
}

/// Sleeps until `at`, or forever when there is none.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
