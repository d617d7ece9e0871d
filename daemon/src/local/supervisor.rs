//! Runs the peers of a local swarm to the end: peer 0 first, the others once it is ready and
//! its address is known; churn kills and restarts; every wait bounded (a silent peer, a peer
//! that does not exit after its last line, the whole run); Ctrl-C forwarded to the peers.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::process::Child;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use super::args::LocalPlan;
use super::events::PeerEvent;
use super::live::LiveView;
use super::peers::{Launcher, PeerMessage, PeerOutput, interrupt, spawn_peer};
use super::record::{Outcome, PeerRecord, Reading};
use super::swarm_dir::SwarmDir;

/// How often timers (silence, exits, churn, restarts, redraws) are checked.
const TICK: Duration = Duration::from_millis(100);
/// Messages from peers' stdout readers waiting to be handled.
const MESSAGE_CAPACITY: usize = 256;
/// The churn schedule's seed: the same run kills the same peers at the same times.
pub(crate) const CHURN_SEED: u64 = 0x6d75_726d_7572;
/// How long after a peer exits its output may still arrive: a process it started and left
/// behind could hold the pipe open forever.
const OUTPUT_DRAIN: Duration = Duration::from_secs(1);
/// Malformed lines quoted in the notes per peer; the rest are only counted.
const QUOTED_BAD_LINES: u64 = 3;

/// Every bound the supervisor keeps.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// A peer that prints nothing for this long is killed and reported.
    pub(crate) silence: Duration,
    /// How long a peer may take to exit after its `done`, or after SIGINT.
    pub(crate) grace: Duration,
    /// Churn kills a peer every `churn_every.0..churn_every.1`.
    pub(crate) churn_every: (Duration, Duration),
    /// A churned peer restarts this long after it was killed.
    pub(crate) restart_after: Duration,
    /// The whole run, as planned: past it the run is stopped unless some peer took a step
    /// within the last `stall` (a large model's steps take longer than the plan's guess).
    pub(crate) overall: Duration,
    /// How recent a step must be for a run past `overall` to go on: at least this, or
    /// [`STALL_STEPS`] of the peer's longest step so far.
    pub(crate) stall: Duration,
}

/// Past the planned bound, a peer counts as still stepping until this many of its longest
/// step so far have gone by without one (or [`Limits::stall`], if longer). At GPT-2 small's
/// shape on two CPU cores a step takes 30 s, and the step after a butterfly round over 60 s.
pub(crate) const STALL_STEPS: f64 = 3.0;

impl Limits {
    /// The bounds of a run: generous, scaled with the steps, the synthetic step time, the
    /// slowest straggler, how many peers share each core, and churn.
    pub(crate) fn for_plan(plan: &LocalPlan) -> Limits {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let sharing = (plan.peers as f64 / cores as f64).max(1.0);
        let synthetic_s = plan.synthetic_step_ms as f64 / 1000.0;
        let mut overall_s =
            120.0 + plan.steps as f64 * (0.5 * sharing + synthetic_s) * plan.max_slowdown();
        if plan.churn {
            overall_s *= 1.5;
        }
        Limits {
            silence: Duration::from_secs(60),
            grace: Duration::from_secs(10),
            churn_every: (Duration::from_secs(5), Duration::from_secs(10)),
            restart_after: Duration::from_secs(2),
            overall: Duration::from_secs_f64(overall_s),
            stall: Duration::from_secs(60),
        }
    }
}

/// What a run produced.
#[derive(Debug)]
pub(crate) struct SwarmRun {
    pub(crate) records: Vec<PeerRecord>,
    pub(crate) readings: Vec<Reading>,
    pub(crate) wall_s: f64,
    /// Ctrl-C or the overall bound stopped the run (not `--stop-after`).
    pub(crate) interrupted: bool,
    pub(crate) notes: Vec<String>,
}

/// Where one peer's process is in its life.
#[derive(Debug)]
enum Phase {
    /// Not started yet: waits for peer 0's address.
    Waiting,
    /// A process is running (or exiting).
    Running,
    /// Killed by churn; starts again at the instant.
    Restarting(Instant),
    /// Done for good.
    Ended,
}

#[derive(Debug)]
struct Slot {
    phase: Phase,
    child: Option<Child>,
    /// Which start of the peer this is; messages of earlier ones are dropped.
    generation: u32,
    stdout_closed: bool,
    last_heard: Instant,
    /// Killed when it has not exited by then.
    exit_by: Option<Instant>,
    /// When the process exited, and how; its last lines may still be in the pipe.
    exited: Option<(Instant, ExitStatus)>,
}

/// Why the run is being stopped.
#[derive(Debug)]
struct Stopping {
    kill_at: Instant,
    killed: bool,
    /// By `--stop-after`, as planned, rather than by a signal or the overall bound.
    planned: bool,
}

/// Starts the swarm and supervises it to the end.
pub(crate) async fn supervise(
    plan: &LocalPlan,
    dir: &SwarmDir,
    launcher: &Launcher,
    limits: &Limits,
    view: &mut LiveView,
) -> anyhow::Result<SwarmRun> {
    let start = Instant::now();
    let (tx, mut rx) = mpsc::channel(MESSAGE_CAPACITY);
    let mut s = Supervisor {
        plan,
        dir,
        launcher,
        limits,
        view,
        start,
        slots: (0..plan.peers)
            .map(|_| Slot {
                phase: Phase::Waiting,
                child: None,
                generation: 0,
                stdout_closed: false,
                last_heard: start,
                exit_by: None,
                exited: None,
            })
            .collect(),
        records: (0..plan.peers).map(PeerRecord::new).collect(),
        readings: Vec::new(),
        notes: Vec::new(),
        tx,
        stopping: None,
        reaping: Vec::new(),
        rng: StdRng::seed_from_u64(CHURN_SEED),
        next_churn: None,
        extended: false,
    };
    // SIGINT (Ctrl-C), SIGTERM (a service manager, `kill`) and SIGHUP (a closed terminal)
    // all stop every peer before this process exits.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    dir.write_config(plan, 0, &[])?;
    s.start_peer(0)?;
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !s.all_ended() {
        tokio::select! {
            Some(message) = rx.recv() => s.handle(message)?,
            _ = ticker.tick() => s.tick().await?,
            _ = sigint.recv() => s.interrupted().await,
            _ = sigterm.recv() => s.interrupted().await,
            _ = sighup.recv() => s.interrupted().await,
        }
    }
    s.view.finish();
    for mut child in s.reaping.drain(..) {
        // Already SIGKILLed; reaping takes no time.
        let _ = child.wait().await;
    }
    Ok(SwarmRun {
        wall_s: start.elapsed().as_secs_f64(),
        interrupted: s.stopping.as_ref().is_some_and(|s| !s.planned),
        records: s.records,
        readings: s.readings,
        notes: s.notes,
    })
}

struct Supervisor<'a> {
    plan: &'a LocalPlan,
    dir: &'a SwarmDir,
    launcher: &'a Launcher,
    limits: &'a Limits,
    view: &'a mut LiveView,
    start: Instant,
    slots: Vec<Slot>,
    records: Vec<PeerRecord>,
    readings: Vec<Reading>,
    notes: Vec<String>,
    tx: mpsc::Sender<PeerMessage>,
    stopping: Option<Stopping>,
    /// Processes killed by churn, not yet reaped.
    reaping: Vec<Child>,
    rng: StdRng,
    next_churn: Option<Instant>,
    /// Whether the run went past `overall` with peers still stepping (noted once).
    extended: bool,
}

impl Supervisor<'_> {
    fn wall_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Whether a peer still running took a step within the last `stall`.
    fn still_stepping(&self, now: Instant) -> bool {
        let now_s = now.duration_since(self.start).as_secs_f64();
        let stall = self.limits.stall.as_secs_f64();
        self.records
            .iter()
            .filter(|r| r.outcome.is_none())
            .filter_map(|r| Some((r.stepped_at?, stall.max(STALL_STEPS * r.longest_step_s))))
            .any(|(at, stall)| now_s - at < stall)
    }

    fn all_ended(&self) -> bool {
        self.slots.iter().all(|s| matches!(s.phase, Phase::Ended))
    }

    /// A line for the live view and, when `keep`, for the summary's notes.
    fn note(&mut self, text: String, keep: bool) {
        let wall_s = self.wall_s();
        self.view.note(wall_s, &text);
        if keep {
            self.notes.push(format!("{wall_s:.1} s: {text}"));
        }
    }

    fn start_peer(&mut self, peer: usize) -> anyhow::Result<()> {
        let slot = &mut self.slots[peer];
        let child = spawn_peer(
            self.launcher,
            &self.plan.hosts,
            peer,
            self.plan.fault(peer),
            slot.generation,
            &self.dir.config_path(peer),
            &self.dir.log_path(peer),
            self.tx.clone(),
        )?;
        slot.child = Some(child);
        slot.phase = Phase::Running;
        slot.stdout_closed = false;
        slot.exit_by = None;
        slot.exited = None;
        slot.last_heard = Instant::now();
        Ok(())
    }

    fn handle(&mut self, message: PeerMessage) -> anyhow::Result<()> {
        let peer = message.peer;
        let slot = &mut self.slots[peer];
        if message.generation != slot.generation || !matches!(slot.phase, Phase::Running) {
            return Ok(());
        }
        slot.last_heard = Instant::now();
        match message.output {
            PeerOutput::Event(event) => self.event(peer, &event)?,
            PeerOutput::Malformed(e) => self.bad_line(peer, e.to_string()),
            PeerOutput::Overlong => self.bad_line(peer, "skipped an overlong line".into()),
            PeerOutput::Closed(error) => {
                if let Some(e) = error {
                    self.note(format!("peer {peer}: reading its output failed: {e}"), true);
                }
                let slot = &mut self.slots[peer];
                slot.stdout_closed = true;
                let by = Instant::now() + self.limits.grace;
                slot.exit_by = Some(slot.exit_by.map_or(by, |at| at.min(by)));
            }
        }
        Ok(())
    }

    fn bad_line(&mut self, peer: usize, what: String) {
        let record = &mut self.records[peer];
        record.bad_lines += 1;
        if record.bad_lines <= QUOTED_BAD_LINES {
            self.note(format!("peer {peer}: {what}"), true);
        }
    }

    fn event(&mut self, peer: usize, event: &PeerEvent) -> anyhow::Result<()> {
        let wall_s = self.wall_s();
        let first_ready = peer == 0
            && matches!(event, PeerEvent::Ready(_))
            && self.slots[1..]
                .iter()
                .all(|s| matches!(s.phase, Phase::Waiting));
        if let Some(reading) = self.records[peer].apply(wall_s, event) {
            self.view
                .reading(&reading, &self.records[peer], self.plan.steps);
            self.readings.push(reading);
        }
        match event {
            PeerEvent::Ready(ready) if first_ready && self.stopping.is_none() => {
                if ready.listen.is_empty() {
                    let log = self.dir.log_path(0);
                    anyhow::bail!("peer 0 is ready but listens nowhere; see {}", log.display());
                }
                for other in 1..self.plan.peers {
                    self.dir.write_config(self.plan, other, &ready.listen)?;
                    self.start_peer(other)?;
                }
            }
            PeerEvent::Done(_) => {
                let slot = &mut self.slots[peer];
                let by = Instant::now() + self.limits.grace;
                slot.exit_by = Some(slot.exit_by.map_or(by, |at| at.min(by)));
            }
            _ => {}
        }
        Ok(())
    }

    /// Past the planned bound: goes on while some peer still takes steps (noted once),
    /// else stops every peer still running and fails it.
    async fn past_the_bound(&mut self, now: Instant) {
        let bound = self.limits.overall.as_secs_f64();
        if self.still_stepping(now) {
            if !self.extended {
                self.extended = true;
                let stall = self.limits.stall.as_secs();
                self.note(
                    format!(
                        "the run is past its planned {bound:.0} s, but peers still take steps: \
                         it goes on until none has for {stall} s, or for {STALL_STEPS} of its longest \
                         steps if longer"
                    ),
                    true,
                );
            }
            return;
        }
        if self.records.iter().all(|r| r.outcome.is_some()) {
            return;
        }
        self.note(
            format!("the run is past its bound of {bound:.0} s; stopping every peer"),
            true,
        );
        for record in self.records.iter_mut().filter(|r| r.outcome.is_none()) {
            record.outcome = Some(Outcome::Failed(format!(
                "did not finish within the run's bound of {bound:.0} s"
            )));
        }
        self.stop().await;
    }

    async fn tick(&mut self) -> anyhow::Result<()> {
        let now = Instant::now();
        for peer in 0..self.slots.len() {
            self.check_peer(peer, now)?;
        }
        self.reaping
            .retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
        if self.stopping.is_none() && now >= self.start + self.limits.overall {
            self.past_the_bound(now).await;
        }
        if self.stopping.is_none()
            && let Some(after) = self.plan.stop_after
            && now >= self.start + after
        {
            self.note(
                format!(
                    "--stop-after {:.0}: stopping every peer; each reports its model as it stands",
                    after.as_secs_f64()
                ),
                false,
            );
            self.stop().await;
            if let Some(stopping) = &mut self.stopping {
                stopping.planned = true;
            }
        }
        if let Some(stopping) = &mut self.stopping
            && !stopping.killed
            && now >= stopping.kill_at
        {
            stopping.killed = true;
            for slot in &mut self.slots {
                if let Some(child) = &mut slot.child {
                    let _ = child.start_kill();
                }
            }
        }
        if self.plan.churn && self.stopping.is_none() {
            self.churn(now);
        }
        let wall_s = self.wall_s();
        self.view.refresh(&self.records, wall_s, self.plan.steps);
        Ok(())
    }

    /// Silence, exit and restart checks of one peer.
    fn check_peer(&mut self, peer: usize, now: Instant) -> anyhow::Result<()> {
        let stopping = self.stopping.is_some();
        let slot = &mut self.slots[peer];
        match slot.phase {
            Phase::Waiting | Phase::Ended => return Ok(()),
            Phase::Restarting(at) => {
                if stopping {
                    slot.phase = Phase::Ended;
                    self.records[peer].conclude("killed by churn", true);
                } else if now >= at {
                    let bootstrap = self.live_addresses(peer);
                    self.dir.write_config(self.plan, peer, &bootstrap)?;
                    self.start_peer(peer)?;
                    self.note(format!("churn: peer {peer} restarted"), false);
                }
                return Ok(());
            }
            Phase::Running => {}
        }
        let Some(child) = &mut slot.child else {
            return Ok(());
        };
        if slot.exited.is_none()
            && let Some(status) = child.try_wait()?
        {
            slot.exited = Some((now, status));
        }
        if let Some((at, status)) = slot.exited
            && (slot.stdout_closed || now >= at + OUTPUT_DRAIN)
        {
            slot.child = None;
            slot.phase = Phase::Ended;
            self.records[peer].conclude(&status.to_string(), stopping);
            self.after_exit(peer);
            return Ok(());
        }
        if slot.exit_by.is_some_and(|at| now >= at) {
            slot.exit_by = None;
            let _ = child.start_kill();
            if self.records[peer].outcome.is_none() && self.records[peer].done.is_none() {
                self.records[peer].outcome = Some(Outcome::Failed(format!(
                    "did not exit within {} s after its output ended; killed",
                    self.limits.grace.as_secs()
                )));
            }
        } else if !slot.stdout_closed && now.duration_since(slot.last_heard) > self.limits.silence {
            let _ = child.start_kill();
            let silence = self.limits.silence.as_secs();
            slot.last_heard = now;
            self.records[peer].outcome =
                Some(Outcome::Failed(format!("silent for {silence} s; killed")));
            self.note(
                format!("peer {peer} was silent for {silence} s; killed"),
                true,
            );
        }
        Ok(())
    }

    /// A peer's process ended for good: say how, and stop the swarm if peer 0 ended before
    /// the others could start.
    fn after_exit(&mut self, peer: usize) {
        let text = match &self.records[peer].outcome {
            Some(Outcome::Finished) => format!("peer {peer} finished"),
            Some(Outcome::Stopped) => format!("peer {peer} stopped"),
            Some(Outcome::Failed(why)) => format!(
                "peer {peer} failed: {why} (log: {})",
                self.dir.log_path(peer).display()
            ),
            None => format!("peer {peer} ended"),
        };
        self.note(text, false);
        if peer == 0 {
            for (other, slot) in self.slots.iter_mut().enumerate().skip(1) {
                if matches!(slot.phase, Phase::Waiting) {
                    slot.phase = Phase::Ended;
                    self.records[other].outcome = Some(Outcome::Failed(
                        "not started: peer 0 ended before it was ready".into(),
                    ));
                }
            }
        }
    }

    /// Where a restarting peer finds the swarm: every other peer that is ready and still
    /// training, or peer 0's addresses when there is none.
    fn live_addresses(&self, restarting: usize) -> Vec<String> {
        let live: Vec<String> = (0..self.slots.len())
            .filter(|&p| p != restarting && self.is_training(p))
            .flat_map(|p| self.records[p].listen.iter().cloned())
            .collect();
        if live.is_empty() {
            self.records[0].listen.clone()
        } else {
            live
        }
    }

    /// Whether the peer's process runs, printed `ready`, and has not printed `done`.
    fn is_training(&self, peer: usize) -> bool {
        let slot = &self.slots[peer];
        matches!(slot.phase, Phase::Running)
            && !slot.stdout_closed
            && self.records[peer].ready
            && self.records[peer].done.is_none()
    }

    /// Kills a random training peer other than peer 0 when the schedule says so. Churn ends
    /// when peer 0 stops training: a restarted peer needs a swarm to rejoin.
    fn churn(&mut self, now: Instant) {
        let (lo, hi) = self.limits.churn_every;
        let all_started = self
            .slots
            .iter()
            .all(|s| !matches!(s.phase, Phase::Waiting));
        if !all_started || !self.is_training(0) {
            return;
        }
        let Some(at) = self.next_churn else {
            self.next_churn = Some(now + self.rng.random_range(lo..=hi));
            return;
        };
        if now < at {
            return;
        }
        self.next_churn = Some(now + self.rng.random_range(lo..=hi));
        let candidates: Vec<usize> = (1..self.slots.len())
            .filter(|&p| self.is_training(p))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let victim = candidates[self.rng.random_range(0..candidates.len())];
        let slot = &mut self.slots[victim];
        if let Some(mut child) = slot.child.take() {
            let _ = child.start_kill();
            self.reaping.push(child);
        }
        slot.generation += 1;
        slot.phase = Phase::Restarting(now + self.limits.restart_after);
        self.records[victim].restart();
        let after = self.limits.restart_after.as_secs_f64();
        self.note(
            format!("churn: killed peer {victim} (kill -9); it restarts in {after:.0} s"),
            true,
        );
    }

    /// Ctrl-C: the first forwards SIGINT to every peer, the second kills them.
    async fn interrupted(&mut self) {
        match &mut self.stopping {
            None => {
                self.note(
                    "interrupted: stopping every peer (Ctrl-C again to kill them)".into(),
                    false,
                );
                self.stop().await;
            }
            Some(stopping) => stopping.kill_at = Instant::now(),
        }
    }

    /// Asks every running peer to stop; kills those still running after the grace period.
    async fn stop(&mut self) {
        let now = Instant::now();
        self.stopping = Some(Stopping {
            kill_at: now + self.limits.grace,
            killed: false,
            planned: false,
        });
        for peer in 0..self.slots.len() {
            let slot = &mut self.slots[peer];
            match slot.phase {
                Phase::Waiting => {
                    slot.phase = Phase::Ended;
                    self.records[peer].outcome.get_or_insert(Outcome::Stopped);
                }
                Phase::Running => {
                    let asked = match &slot.child {
                        Some(child) => interrupt(child).await,
                        None => true,
                    };
                    if !asked && let Some(child) = &mut slot.child {
                        let _ = child.start_kill();
                    }
                    slot.exit_by = Some(now + self.limits.grace);
                    // Waiting to exit is bounded by the grace period, not by silence.
                    slot.last_heard = now + self.limits.grace;
                }
                Phase::Restarting(_) | Phase::Ended => {}
            }
        }
    }
}
