//! A driver whose engine call takes several heartbeat intervals (a round's reduction of a
//! large vector, say) neither makes its peer give it up nor gives its peer up itself:
//! meanwhile the heartbeat keeper sends its heartbeats, and the heartbeats that arrived
//! during the call are noted before the next silence check. Before both, a 64M-element
//! `bench allreduce` fell apart into groups of one or two in its first round.

#[path = "net_support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use murmur_gossip::Time;
use murmur_gossip::engine::{
    Engine, EngineError, EngineEvent, EngineInput, EngineOutput, EngineStatus, MemberEvent,
    Membership, SoloEngine, Work, WorkDone,
};
use murmur_gossip::net::driver::{self, DriverConfig, EngineClock, EngineIo, FromEngine};
use murmur_gossip::net::exchange::{Mailbox, MailboxConfig, Outbox, OutboxConfig};
use murmur_gossip::net::{NetHandle, NetInbound};
use murmur_protocol::identity::PeerId;
use murmur_protocol::message::AveragingMode;
use support::{Authority, InviteKind, connect, eventually};

/// The peers' heartbeat interval: given up after 1.6 of them (320 ms) of silence.
const INTERVAL: Duration = Duration::from_millis(200);
/// Each engine call that stalls holds its driver this long: five intervals.
const STALL: Duration = Duration::from_millis(1000);
/// Stalls per peer.
const STALLS: u32 = 3;

/// The solo engine, holding its driver for [`STALL`] on its first few finished steps, as a
/// large round's work would.
struct Stalling {
    inner: SoloEngine<PeerId>,
    stalls_left: u32,
}

impl Engine<PeerId> for Stalling {
    fn handle(&mut self, now: Time, input: EngineInput<PeerId>) -> Result<(), EngineError> {
        let stall = matches!(input, EngineInput::WorkDone(_)) && self.stalls_left > 0;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn engine_calls_of_five_heartbeat_intervals_give_no_peer_up() {
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
