//! Receipts between real `murmur run` processes: an SGP share whose bytes the transport
//! wrote, but which its receiver never applied because the connection died first, comes
//! back to its sender, and the two peers' push-sum weights still sum to 1: the founder's
//! weight (a joiner brings none).
//!
//! The receiver is frozen (SIGSTOP) while its neighbour trains. The neighbour's next share
//! (6.4 MB of exact `f32`, within the QUIC flow-control windows the test sets, far beyond a
//! UDP socket's buffer) is written into its connection, which its neighbour then closes as
//! silent: the bytes never reach the frozen process. Counted as delivered when written, that
//! share's mass would be lost; with receipts the sender takes it back.
//!
//! A joiner stopped before any share reached it holds no mass and no parameters of the
//! swarm: it leaves cleanly, as stopped, and takes nothing from the founder.

mod run_support;

use std::time::Duration;

use run_support::{PeerSettings, RunningPeer, Swarm, exclusive};

/// How long the peers may take to start, meet and share.
const PATIENCE: Duration = Duration::from_secs(180);
/// How long the receiver stays frozen: past the sender's silence bound (1.6 heartbeat
/// intervals) and its receipt deadline (`share_timeout_ms`).
const FROZEN: Duration = Duration::from_secs(6);
/// The most freezes tried for a share written whole into the dying connection.
const FREEZES: usize = 4;
/// What the sender logs when it takes back a share its receiver never applied.
const TAKEN_BACK: &str = "a share its receiver never applied, taken back";
/// What the sender logs when the transport gives a share back unwritten.
const GIVEN_BACK: &str = "a share the transport could not write, taken back";
/// How long both wait paused for the last shares to settle: a receipt deadline, a cancel
/// round trip, and two progress lines.
const SETTLE: Duration = Duration::from_secs(6);

/// QUIC flow-control credit each way, a stream's and a connection's: room for a whole
/// share (the default, 4 MB, holds back its last 2.4 MB, so the share is never written
/// whole and always comes back from the transport instead).
const WINDOW: u64 = 10_000_000;

fn settings(bootstrap: Vec<String>) -> PeerSettings {
    PeerSettings {
        bootstrap,
        codec: Some("f32".to_owned()),
        // 1.6M parameters: a 6.4 MB share.
        model_width: Some(256),
        eval_every_steps: 1_000,
        net_keys: vec![
            ("quic_stream_receive_window", WINDOW),
            ("quic_connection_receive_window", WINDOW),
        ],
        ..PeerSettings::default()
    }
}

/// The peer's push-sum weight in its newest progress line.
fn weight(peer: &RunningPeer) -> f64 {
    peer.last_progress()
        .unwrap_or_else(|| peer.fail("no progress line"))
        .f64("push_sum_weight")
}

fn shares_received(peer: &RunningPeer) -> u64 {
    peer.last_progress().map_or(0, |l| l.u64("shares_received"))
}

#[test]
fn a_share_written_into_a_connection_that_died_before_it_was_applied_loses_no_mass() {
    let _serial = exclusive();
    let swarm = Swarm::create();
    let first = swarm.add_peer("sender");
    first.write_config(&settings(Vec::new()));
    let mut sender = first.start();
    let address = sender.ready().listen();
    let second = swarm.add_peer("receiver");
    second.write_config(&settings(vec![address]));
    let mut receiver = second.start();
    receiver.ready();
    for peer in [&mut sender, &mut receiver] {
        peer.wait_for("shares from its neighbour", PATIENCE, |l| {
            l.is("progress") && l.u64("shares_received") >= 3
        });
    }

    // The share must be written whole before the connection dies: one that the receiver's
    // flow control held back (its reader was still waiting for the averaging loop when it
    // froze) comes back from the transport instead, by the other path. A freeze in which
    // that happened is tried again, at most `FREEZES` times.
    let mut freezes = 0;
    while freezes < FREEZES && !sender.log().contains(TAKEN_BACK) {
        freezes += 1;
        receiver.signal("STOP");
        std::thread::sleep(FROZEN);
        receiver.signal("CONT");
        let (before_s, before_r) = (shares_received(&sender), shares_received(&receiver));
        sender.wait_for("shares again after the thaw", PATIENCE, |l| {
            l.is("progress") && l.u64("shares_received") >= before_s + 3
        });
        receiver.wait_for("shares again after the thaw", PATIENCE, |l| {
            l.is("progress") && l.u64("shares_received") >= before_r + 3
        });
    }

    for peer in [&sender, &receiver] {
        peer.signal("USR1");
    }
    std::thread::sleep(SETTLE);
    for peer in [&mut sender, &mut receiver] {
        peer.drain();
    }
    let total = weight(&sender) + weight(&receiver);
    // The path under test was taken: a written share was never applied, and came back.
    let log = sender.log_once(
        &format!("a share taken back after asking, in {freezes} freezes"),
        SETTLE,
        |log| log.contains(TAKEN_BACK),
    );
    eprintln!(
        "taken back after {freezes} freezes; shares the transport gave back: {}",
        log.matches(GIVEN_BACK).count()
    );
    assert!(
        (total - 1.0).abs() < 1e-6,
        "the weights sum to {total} ({} + {}), not 1: mass was lost or made\nsender's log:\n{log}",
        weight(&sender),
        weight(&receiver)
    );
}

#[test]
fn a_joiner_stopped_before_its_first_share_leaves_cleanly_and_takes_no_mass() {
    let _serial = exclusive();
    let swarm = Swarm::create();
    let first = swarm.add_peer("founder");
    first.write_config(&settings(Vec::new()));
    let mut founder = first.start();
    let address = founder.ready().listen();
    founder.wait_for("a few steps alone", PATIENCE, |l| {
        l.is("progress") && l.u64("step") >= 3
    });
    // Paused, the founder takes no step, so it pushes no share to the joiner.
    founder.signal("USR1");
    std::thread::sleep(Duration::from_secs(2));

    let second = swarm.add_peer("joiner");
    second.write_config(&settings(vec![address]));
    let mut joiner = second.start();
    joiner.ready();
    joiner.log_once("the joiner joins the running swarm", PATIENCE, |log| {
        log.contains("the swarm is training already: joining it")
    });
    joiner.signal("INT");
    let status = joiner.wait_exit(PATIENCE);
    joiner.read_to_end(Duration::from_secs(10));
    let done = joiner
        .seen
        .iter()
        .find(|l| l.is("done"))
        .unwrap_or_else(|| joiner.fail("no done line"))
        .clone();
    assert!(
        status.success() && done.str("exit") == "signal",
        "the joiner ended {status} with {}\nits log:\n{}",
        done.json,
        joiner.log()
    );
    joiner.log_once("why it saved nothing", SETTLE, |log| {
        log.contains("stopped before the swarm's first share arrived")
    });

    // The founder, still paused, holds the swarm's whole mass: nothing went to the joiner.
    std::thread::sleep(Duration::from_millis(1_500));
    founder.drain();
    assert!(
        (weight(&founder) - 1.0).abs() < 1e-6,
        "the founder's weight is {}, not 1",
        weight(&founder)
    );
}
