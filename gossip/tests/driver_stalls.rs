//! A driver whose engine call takes several heartbeat intervals (a round's reduction of a
//! large vector, say) neither makes its peer give it up nor gives its peer up itself:
//! meanwhile the heartbeat keeper sends its heartbeats, and the heartbeats that arrived
//! during the call are noted before the next silence check. Before both, a 64M-element
//! `bench allreduce` fell apart into groups of one or two in its first round.
//!
//! Likewise a leaving SGP peer whose last step's turn outlasts the leave bound still hands
//! its mass off: the bound counts time without progress. Before, a 124M-parameter peer
//! spent the whole bound taking in its last step and left without its hand-off.

#[path = "net_support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use murmur_gossip::Time;
use murmur_gossip::engine::{
    Engine, EngineError, EngineEvent, EngineInput, EngineOutput, EngineStatus, MemberEvent,
    Membership, SgpEngine, SoloEngine, Work, WorkDone,
};
use murmur_gossip::net::driver::{
    self, DriverConfig, DriverExit, EngineClock, EngineHandle, EngineIo, FromEngine,
};
use murmur_gossip::net::exchange::{Mailbox, MailboxConfig, Outbox, OutboxConfig};
use murmur_gossip::net::{NetHandle, NetInbound};
use murmur_gossip::sgp::SgpConfig;
use murmur_protocol::identity::PeerId;
use murmur_protocol::message::AveragingMode;
use support::{Authority, InviteKind, connect, eventually};

/// The peers' heartbeat interval: given up after 1.6 of them (800 ms) of silence. The
/// keeper sends by 1.225 intervals, so a heartbeat has 190 ms to arrive and be noted;
/// at 200 ms intervals that was 75 ms, which a loaded two-core host overran.
const INTERVAL: Duration = Duration::from_millis(500);
/// Each engine call that stalls holds its driver this long: five intervals.
const STALL: Duration = Duration::from_millis(2500);
/// Stalls per peer.
const STALLS: u32 = 3;

/// An engine holding its driver for [`STALL`] on its first few finished steps (from its
/// finish on, when `after_finish`), as a large round's work would.
struct Stalling<E> {
    inner: E,
    stalls_left: u32,
    after_finish: bool,
}

impl<E: Engine<PeerId>> Engine<PeerId> for Stalling<E> {
    fn handle(&mut self, now: Time, input: EngineInput<PeerId>) -> Result<(), EngineError> {
        if matches!(input, EngineInput::Finish) {
            self.after_finish = false;
        }
        let stall =
            matches!(input, EngineInput::WorkDone(_)) && self.stalls_left > 0 && !self.after_finish;
        let result = self.inner.handle(now, input);
        if stall {
            self.stalls_left -= 1;
            // Work on the driver's own thread, as an engine's reduction is.
            std::thread::sleep(STALL);
        }
        result
    }

    fn poll_output(&mut self) -> Option<EngineOutput<PeerId>> {
        self.inner.poll_output()
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.inner.poll_timeout()
    }

    fn membership(&self) -> &Membership<PeerId> {
        self.inner.membership()
    }

    fn status(&self) -> EngineStatus {
        self.inner.status()
    }
}

/// Runs `net`'s peer with a stalling solo engine that knows `other`, answering its steps
/// after 100 ms each, until `until`; returns the peers it gave up and its last status.
async fn run_peer(
    net: NetHandle,
    inbound: NetInbound,
    other: PeerId,
    stalls: u32,
    until: Instant,
) -> (Vec<PeerId>, EngineStatus) {
    let clock = EngineClock::start();
    let mut membership = Membership::new(net.local_peer_id(), INTERVAL, clock.now());
    let _ = membership.note(clock.now(), MemberEvent::Admitted(other));
    let engine = Stalling {
        inner: SoloEngine::new(membership, vec![0.0; 16], 0, 1),
        stalls_left: stalls,
        after_finish: false,
    };
    let io = EngineIo {
        net: net.clone(),
        mailbox: Mailbox::spawn(inbound.tensor_streams, MailboxConfig::default()),
        outbox: Outbox::new(net.clone(), OutboxConfig::default()),
        events: net.subscribe(),
    };
    let config = DriverConfig {
        mode: AveragingMode::Solo,
        bootstrap: Vec::new(),
        expected_peers: 1,
        leave_bound: Duration::from_secs(1),
    };
    let mut handle = driver::spawn(engine, io, clock, config, None);
    let mut gone = Vec::new();
    let deadline = tokio::time::Instant::from_std(until);
    loop {
        let next = tokio::select! {
            next = handle.next() => next,
            () = tokio::time::sleep_until(deadline) => break,
        };
        match next {
            Some(FromEngine::Work(Work::Step {
                params, mut update, ..
            })) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                // The parameters stay as they are.
                update.clear();
                update.resize(params.len(), 0.0);
                let done = WorkDone::Stepped {
                    params,
                    update,
                    samples: 1,
                    took: Duration::from_millis(100),
                };
                if handle.work_done(done).await.is_err() {
                    break;
                }
            }
            Some(FromEngine::Event(EngineEvent::PeerGone { peer, .. })) => gone.push(peer),
            Some(_) => {}
            None => break,
        }
    }
    (gone, handle.status())
}

/// Two peers of one swarm, connected, each admitted by the other.
async fn admitted_pair() -> ((NetHandle, NetInbound), (NetHandle, NetInbound)) {
    let authority = Authority::new();
    let (a, a_in) = authority.spawn(1, InviteKind::Valid).await;
    let (b, b_in) = authority.spawn(2, InviteKind::Valid).await;
    connect(&b, &a).await;
    let (a_id, b_id) = (a.local_peer_id(), b.local_peer_id());
    eventually(Duration::from_secs(10), "a and b admit each other", || {
        let (a, b) = (a.clone(), b.clone());
        async move {
            a.peers().await.unwrap_or_default().contains(&b_id)
                && b.peers().await.unwrap_or_default().contains(&a_id)
        }
    })
    .await;
    ((a, a_in), (b, b_in))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn engine_calls_of_five_heartbeat_intervals_give_no_peer_up() {
    let ((a, a_in), (b, b_in)) = admitted_pair().await;
    let (a_id, b_id) = (a.local_peer_id(), b.local_peer_id());
    // a stalls three times, b never: b must keep hearing a (a's keeper), and a must not
    // take its own stalls for b's silence. Then two seconds of plain running.
    let until = Instant::now() + STALL * (STALLS + 1) + Duration::from_secs(2);
    let (at_a, at_b) = tokio::join!(
        run_peer(a.clone(), a_in, b_id, STALLS, until),
        run_peer(b.clone(), b_in, a_id, 0, until)
    );
    for (name, (gone, status)) in [("a", &at_a), ("b", &at_b)] {
        assert!(gone.is_empty(), "{name} gave up {gone:?}");
        assert_eq!(status.peers, 1, "{name}: {status:?}");
        assert!(
            status.step >= u64::from(STALLS),
            "{name} stepped: {status:?}"
        );
    }
    for handle in [a, b] {
        handle.shutdown().await.expect("shutdown");
    }
}

/// The leave bound of the SGP test: shorter than [`STALL`].
const LEAVE_BOUND: Duration = Duration::from_millis(600);

/// Spawns `net`'s driver with an SGP engine (exact shares) that knows `other`, holding
/// `params`; with `stall_last`, its turns after its finish stall for [`STALL`].
fn sgp_driver(
    net: &NetHandle,
    inbound: NetInbound,
    other: PeerId,
    params: Vec<f32>,
    stall_last: bool,
) -> EngineHandle {
    let clock = EngineClock::start();
    let mut membership = Membership::new(net.local_peer_id(), INTERVAL, clock.now());
    let _ = membership.note(clock.now(), MemberEvent::Admitted(other));
    let len = params.len();
    let sgp = SgpEngine::new(
        membership,
        Some(params),
        len,
        (0, 1),
        SgpConfig::default(),
        0,
    )
    .expect("engine");
    let engine = Stalling {
        inner: sgp,
        stalls_left: u32::from(stall_last),
        after_finish: stall_last,
    };
    let io = EngineIo {
        net: net.clone(),
        mailbox: Mailbox::spawn(inbound.tensor_streams, MailboxConfig::default()),
        outbox: Outbox::new(net.clone(), OutboxConfig::default()),
        events: net.subscribe(),
    };
    let config = DriverConfig {
        mode: AveragingMode::Sgp,
        bootstrap: Vec::new(),
        expected_peers: 1,
        leave_bound: LEAVE_BOUND,
    };
    driver::spawn(engine, io, clock, config, None)
}

/// Answers the steps `handle`'s engine asks for (the parameters unchanged) until it stops
/// or `until`; after `finish_after` steps (if any) asks it to finish.
async fn answer_steps(handle: &mut EngineHandle, finish_after: Option<u32>, until: Instant) {
    let deadline = tokio::time::Instant::from_std(until);
    let mut steps = 0;
    loop {
        let next = tokio::select! {
            next = handle.next() => next,
            () = tokio::time::sleep_until(deadline) => return,
        };
        match next {
            Some(FromEngine::Work(Work::Step {
                params, mut update, ..
            })) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                update.clear();
                update.resize(params.len(), 0.0);
                steps += 1;
                if finish_after == Some(steps) {
                    handle.finish().await;
                }
                let done = WorkDone::Stepped {
                    params,
                    update,
                    samples: 1,
                    took: Duration::from_millis(50),
                };
                if handle.work_done(done).await.is_err() {
                    return;
                }
            }
            Some(_) => {}
            None => return,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leaver_whose_last_step_outlasts_the_leave_bound_still_hands_its_mass_off() {
    let ((a, a_in), (b, b_in)) = admitted_pair().await;
    let (a_id, b_id) = (a.local_peer_id(), b.local_peer_id());
    let mut at_a = sgp_driver(&a, a_in, b_id, vec![1.0; 1024], true);
    let mut at_b = sgp_driver(&b, b_in, a_id, vec![3.0; 1024], false);
    // a finishes during its first step, whose turn then holds its driver past the bound:
    // it sends that step's share, then its hand-off (and hands on what b sent meanwhile).
    let until = Instant::now() + STALL + Duration::from_secs(5);
    let leaver = async {
        answer_steps(&mut at_a, Some(1), until).await;
        tokio::time::timeout(Duration::from_secs(10), at_a.stopped()).await
    };
    let (exit, ()) = tokio::join!(leaver, answer_steps(&mut at_b, None, until));
    let exit = exit.expect("a's driver stopped in time");
    assert!(
        matches!(exit, Ok(DriverExit::Departed)),
        "a left without its hand-off confirmed: {exit:?}"
    );
    let received = at_b.status().shares_received;
    assert!(
        received >= 2,
        "b took a's step share and hand-off: {received}"
    );
    for handle in [a, b] {
        handle.shutdown().await.expect("shutdown");
    }
}
