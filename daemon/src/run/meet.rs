//! Meeting the swarm before training: who is there, and how far the swarm has trained.

use std::time::Duration;

use murmur_gossip::engine::{Beat, Change, Membership};
use murmur_gossip::net::NetEvent;
use murmur_gossip::net::driver::{EngineClock, member_event, publish_heartbeat};
use murmur_protocol::identity::PeerId;
use tokio::sync::broadcast;

use super::peer::{Peer, Request};

/// How long a peer with bootstrap addresses waits for its first peer before training alone.
const FIRST_PEER_WAIT: Duration = Duration::from_secs(10);
/// How often a meeting peer checks its waits.
const MEET_TICK: Duration = Duration::from_secs(1);
/// Heartbeat intervals a meeting peer waits, past its first interval and a half, for the
/// news that tells it the swarm's step.
const NEWS_WAIT_INTERVALS: u32 = 4;

/// How a meeting ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Met {
    /// Enough is known to start training.
    Ready,
    /// SIGINT or SIGTERM came first: leave without training.
    Stopped,
}

/// Waits (bounded) until the swarm is known well enough to start: `training.min_peers`
/// peers authorized (at most `training.start_timeout_ms`), and, when any peer is known,
/// until the swarm's step is known: a heartbeat interval and a half, then on until a peer
/// announces a step past `resumed_step` (the swarm is ahead: join it) or every known peer
/// has been heard, for at most [`NEWS_WAIT_INTERVALS`] intervals more.
///
/// A peer that decided on too little news would start as a founder with its checkpoint
/// (or the initial parameters) while the swarm is far ahead, and pull every peer back
/// towards them. So the meeting peer heartbeats too (step 0: it trains nothing yet), so
/// that peers meeting at the same time hear each other at once, and so that the swarm
/// notices when it dies before training (it is then given up as silent). SIGINT and SIGTERM
/// end the wait ([`Met::Stopped`]); SIGUSR1 and SIGUSR2 pause and resume as in training.
pub(crate) async fn meet_the_swarm(
    peer: &mut Peer,
    events: &mut broadcast::Receiver<NetEvent>,
    membership: &mut Membership<PeerId>,
    clock: &EngineClock,
    resumed_step: u64,
) -> Met {
    let min_peers = peer.settings.min_peers;
    let discovers = !peer.settings.net.bootstrap.is_empty() || peer.settings.net.mdns;
    if min_peers == 0 && !discovers {
        return Met::Ready;
    }
    let first_wait = if min_peers > 0 {
        peer.settings.start_timeout
    } else {
        FIRST_PEER_WAIT
    };
    let interval = membership.interval();
    let mode = peer.settings.mode();
    let until = tokio::time::Instant::now() + first_wait;
    let mut heard_until: Option<tokio::time::Instant> = None;
    let mut silent = Vec::new();
    membership.set_own(Beat::EMPTY);
    loop {
        let now = tokio::time::Instant::now();
        if let Some(heard) = heard_until {
            let enough_news = membership.swarm_step() > resumed_step || membership.all_heard();
            if (now >= heard && enough_news) || now >= heard + interval * NEWS_WAIT_INTERVALS {
                break;
            }
        } else if now >= until {
            break;
        }
        let engine_now = clock.now();
        if membership.beat_due(engine_now) {
            publish_heartbeat(&peer.net, clock, mode, membership.own());
        }
        membership.silent(engine_now, &mut silent);
        for gone in silent.drain(..) {
            tracing::warn!(peer = %gone, "no heartbeat for 1.6 intervals: treating the peer as gone");
            peer.board.forget_peer(&gone);
        }
        let mut wake = (now + MEET_TICK).min(clock.instant(membership.poll_timeout()));
        let checks = match heard_until {
            Some(heard) => [heard, heard + interval * NEWS_WAIT_INTERVALS],
            None => [until, until],
        };
        for check in checks.into_iter().filter(|&t| t > now) {
            wake = wake.min(check);
        }
        let received = tokio::select! {
            received = tokio::time::timeout_at(wake, events.recv()) => received,
            request = peer.signals.next() => {
                match request {
                    Request::Stop => return Met::Stopped,
                    Request::Pause => peer.set_paused(true),
                    Request::Resume => peer.set_paused(false),
                }
                continue;
            }
        };
        match received {
            Err(_) => {}
            Ok(Err(broadcast::error::RecvError::Closed)) => break,
            Ok(Err(_)) => {}
            Ok(Ok(event)) => {
                note_for_status(peer, &event);
                let change = membership.note(clock.now(), member_event(clock, event));
                if let Some(Change::Left(gone)) = change {
                    peer.board.forget_peer(&gone);
                }
                if heard_until.is_none() && membership.len() >= min_peers.max(1) {
                    heard_until = Some(tokio::time::Instant::now() + interval * 3 / 2);
                }
            }
        }
    }
    if membership.len() < min_peers {
        tracing::warn!(
            known = membership.len(),
            wanted = min_peers,
            "training.start_timeout_ms passed before training.min_peers peers connected; starting anyway"
        );
    } else if membership.heard().next().is_none() && !membership.is_empty() {
        tracing::warn!(
            known = membership.len(),
            "no heartbeat heard from any peer: the swarm's step is unknown, starting as if it had none"
        );
    }
    Met::Ready
}

/// Runs `work` (a state download) while staying in touch with the swarm as the meeting
/// did: heartbeats go out on time and heard ones are noted, so that neither side gives the
/// other up as silent however long the work takes. Without them the servers would drop a
/// joiner 1.6 heartbeat intervals into a download, and the download with it.
pub(crate) async fn keep_in_touch<T>(
    peer: &Peer,
    events: &mut broadcast::Receiver<NetEvent>,
    membership: &mut Membership<PeerId>,
    clock: &EngineClock,
    work: impl Future<Output = T>,
) -> T {
    let mode = peer.settings.mode();
    let mut work = std::pin::pin!(work);
    loop {
        let engine_now = clock.now();
        if membership.beat_due(engine_now) {
            publish_heartbeat(&peer.net, clock, mode, membership.own());
        }
        let wake =
            (tokio::time::Instant::now() + MEET_TICK).min(clock.instant(membership.poll_timeout()));
        tokio::select! {
            done = &mut work => return done,
            received = tokio::time::timeout_at(wake, events.recv()) => {
                if let Ok(Ok(event)) = received {
                    note_for_status(peer, &event);
                    if let Some(Change::Left(gone)) =
                        membership.note(clock.now(), member_event(clock, event))
                    {
                        peer.board.forget_peer(&gone);
                    }
                }
            }
        }
    }
}

/// Keeps `/status`'s list of peers up to date from the network's events.
pub(crate) fn note_for_status(peer: &Peer, event: &NetEvent) {
    match event {
        NetEvent::Heartbeat { peer: from, body } => peer.board.record_heartbeat(*from, body),
        NetEvent::PeerDisconnected { peer: gone } | NetEvent::PeerRejected { peer: gone, .. } => {
            peer.board.forget_peer(gone);
        }
        NetEvent::PeerAuthorized { .. } => {}
    }
}
