//! SGP shares larger than a frame between real `murmur run` processes: with frames of
//! 1 MiB, a 1.6M-parameter model's shares (6.4 MB exact, 1.7 MB in `int8:64`) travel in
//! pieces, are put back together and folded in, and the two peers' push-sum weights still
//! sum to the founders' (1 each; a joiner brings none): no piece lost or doubled a share's
//! mass.

mod run_support;

use std::time::Duration;

use run_support::{PeerSettings, RunningPeer, Swarm, exclusive};

/// How long the peers may take to start, meet and share.
const PATIENCE: Duration = Duration::from_secs(180);
/// How long both wait paused for the last shares to settle.
const SETTLE: Duration = Duration::from_secs(4);

fn settings(bootstrap: Vec<String>) -> PeerSettings {
    PeerSettings {
        bootstrap,
        codec: Some("int8:64".to_owned()),
        // 1.6M parameters: a share of 6.4 MB in f32, 1.7 MB in int8.
        model_width: Some(256),
        eval_every_steps: 1_000,
        net_keys: vec![("max_frame_payload", 1 << 20)],
        ..PeerSettings::default()
    }
}

fn weight(peer: &RunningPeer) -> f64 {
    peer.last_progress()
        .unwrap_or_else(|| peer.fail("no progress line"))
        .f64("push_sum_weight")
}

#[test]
fn shares_larger_than_a_frame_travel_in_pieces_and_keep_the_mass() {
    let _serial = exclusive();
    let swarm = Swarm::create();
    let first = swarm.add_peer("first");
    first.write_config(&settings(Vec::new()));
    let mut a = first.start();
    let address = a.ready().listen();
    let second = swarm.add_peer("second");
    second.write_config(&settings(vec![address]));
    let mut b = second.start();
    b.ready();
    for peer in [&mut a, &mut b] {
        peer.wait_for("shares from its neighbour", PATIENCE, |l| {
            l.is("progress") && l.u64("shares_received") >= 6
        });
    }
    for peer in [&a, &b] {
        peer.signal("USR1");
    }
    std::thread::sleep(SETTLE);
    for peer in [&mut a, &mut b] {
        peer.drain();
    }
    let total = weight(&a) + weight(&b);
    let logs = [a.log(), b.log()];
    for log in &logs {
        assert!(
            !log.contains("share piece") && !log.contains("wrong shape"),
            "a piece was refused:\n{log}"
        );
    }
    // A founder brings a weight of 1, a joiner none. The second peer joins the first as a
    // rule; on a starved host it may not hear it in time and found a swarm of its own, which
    // the two then merge.
    let founders = logs
        .iter()
        .filter(|log| !log.contains("the swarm is training already: joining it"))
        .count() as f64;
    assert!(
        (total - founders).abs() < 1e-6,
        "the weights sum to {total} ({} + {}), not {founders}, the founders' weight\n\
         first peer's log:\n{}",
        weight(&a),
        weight(&b),
        logs[0]
    );
}
