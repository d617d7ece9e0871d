//! The supervisor against fake peers: shell scripts that speak the progress protocol, so the
//! orchestration (bootstrap order, logs, silence, churn, bounds, outputs) is tested without
//! training anything.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::args::{LocalArgs, LocalPlan};
use super::peers::Launcher;
use super::run_swarm;
use super::summary::Summary;
use super::supervisor::Limits;

/// A peer that prints noise, `ready`, five progress lines (peer 0: `PEER0_ROUNDS`), an eval
/// and `done`; a restarted peer (its folder has a marker) runs a shorter course. `peer-N` folders named in
/// `SILENT` go quiet after `ready`; those in `STUBBORN` loop until SIGINT; those in `SLOW`
/// take 0.6 s a step; those in `LATE` 0.5 s a step, and 1.2 s for their fourth.
const FAKE_PEER: &str = r#"
cfg="$2"
dir=$(dirname "$cfg")
name=$(basename "$dir")
rounds=5
if [ "$name" = peer-0 ]; then rounds=${PEER0_ROUNDS:-5}; fi
if [ -e "$dir/started" ]; then rounds=2; fi
touch "$dir/started"
echo "fake peer $name starting" >&2
echo "not json"
echo '{"event":"ready","peer":"p","listen":["/ip4/127.0.0.1/udp/9/quic-v1/p2p/'$name'"],"initial_eval_loss":3.0,"loss_floor":1.0}'
case " $SILENT " in *" $name "*) exec sleep 30 ;; esac
case " $STUBBORN " in *" $name "*)
  trap 'echo "{\"event\":\"done\",\"step\":1,\"samples\":16,\"initial_eval_loss\":3.0,\"final_eval_loss\":2.9,\"bytes_sent\":10,\"exit\":\"signal\"}"; exit 0' INT
  while true; do sleep 0.05; done ;;
esac
pause=0.1
case " $SLOW " in *" $name "*) pause=0.6 ;; esac
late=0
case " $LATE " in *" $name "*) pause=0.5; late=1 ;; esac
i=1
while [ $i -le $rounds ]; do
  sleep $pause
  if [ $late = 1 ] && [ $i = 4 ]; then sleep 0.7; fi
  echo "{\"event\":\"progress\",\"step\":$i,\"samples\":$((i*16)),\"loss\":2.$i,\"samples_per_s\":100.0,\"bytes_sent\":$((i*1000))}"
  i=$((i+1))
done
echo '{"event":"eval","step":5,"eval_loss":1.6}'
echo '{"event":"done","step":5,"samples":80,"initial_eval_loss":3.0,"final_eval_loss":1.5,"loss_floor":1.0,"bytes_sent":5000,"raw_bytes":20000,"exit":"finished"}'
"#;

fn plan(peers: usize, out: &Path, churn: bool) -> LocalPlan {
    LocalPlan::from_args(&LocalArgs {
        steps: Some(5),
        churn,
        json: true,
        out: Some(out.to_owned()),
        ..LocalArgs::with_peers(peers)
    })
    .unwrap()
}

fn limits() -> Limits {
    Limits {
        silence: Duration::from_secs(20),
        grace: Duration::from_secs(5),
        churn_every: (Duration::from_millis(250), Duration::from_millis(350)),
        restart_after: Duration::from_millis(100),
        overall: Duration::from_secs(60),
        stall: Duration::from_secs(20),
    }
}

/// Writes a fake peer with the given prelude (shell assignments) and returns its launcher.
fn launcher(dir: &Path, prelude: &str) -> Launcher {
    let script = dir.join("fake-peer.sh");
    std::fs::write(&script, format!("{prelude}\n{FAKE_PEER}")).unwrap();
    Launcher::new(PathBuf::from("/bin/sh"), vec![script.into_os_string()])
}

fn run(peers: usize, prelude: &str, churn: bool, limits: &Limits) -> (tempfile::TempDir, Summary) {
    let tmp = tempfile::tempdir().unwrap();
    let launcher = launcher(tmp.path(), prelude);
    let plan = plan(peers, &tmp.path().join("swarm"), churn);
    let summary = run_swarm(&plan, &launcher, limits).unwrap();
    (tmp, summary)
}

#[test]
fn a_healthy_swarm_finishes_with_its_outputs() {
    let (tmp, s) = run(3, "", false, &limits());
    let out = tmp.path().join("swarm");
    assert!(s.all_finished(), "{}", s.to_text());
    assert_eq!(s.initial_eval_loss, Some(3.0));
    assert_eq!(s.final_eval_loss, Some(1.5));
    assert_eq!(s.fraction_to_floor, Some(0.75));
    assert_eq!(s.bytes_sent_per_peer, 5_000.0);
    assert_eq!(s.compression_ratio, Some(4.0));
    assert_eq!(s.samples, 240);

    // Peers 1 and 2 bootstrap from the address peer 0 announced.
    for peer in 1..3 {
        let config = std::fs::read_to_string(out.join(format!("peer-{peer}/murmur.toml"))).unwrap();
        let t: toml::Table = toml::from_str(&config).unwrap();
        assert_eq!(
            t["net"]["bootstrap"][0].as_str(),
            Some("/ip4/127.0.0.1/udp/9/quic-v1/p2p/peer-0")
        );
    }
    let log = std::fs::read_to_string(out.join("peer-2/murmur.log")).unwrap();
    assert!(
        log.contains("fake peer peer-2 starting"),
        "stderr goes to the log"
    );

    // ready + 5 progress + eval + done per peer.
    let csv = std::fs::read_to_string(out.join("progress.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 3 * 8, "{csv}");
    let png = std::fs::read(out.join("loss.png")).unwrap();
    assert_eq!(&png[..4], b"\x89PNG");
}

#[test]
fn a_silent_peer_is_killed_and_named() {
    let mut limits = limits();
    limits.silence = Duration::from_millis(700);
    let (tmp, s) = run(3, "SILENT=peer-1", false, &limits);
    assert!(!s.all_finished());
    let failed = &s.peer_results[1];
    assert_eq!(failed.status, "failed");
    assert!(
        failed.error.as_deref().unwrap().contains("silent"),
        "{failed:?}"
    );
    assert!(failed.log.ends_with("peer-1/murmur.log"));
    assert_eq!(s.peer_results[0].status, "finished");
    assert_eq!(s.peer_results[2].status, "finished");
    let text = s.to_text();
    assert!(text.contains("failed: peer 1"), "{text}");
    drop(tmp);
}

#[test]
fn a_peer_0_that_dies_before_ready_fails_the_swarm_fast() {
    let (_tmp, s) = run(3, "echo broken >&2; exit 3", false, &limits());
    assert_eq!(s.finished, 0);
    let zero = s.peer_results[0].error.as_deref().unwrap();
    assert!(zero.contains("exit status: 3"), "{zero}");
    let one = s.peer_results[1].error.as_deref().unwrap();
    assert!(one.contains("not started"), "{one}");
    assert!(s.wall_s < 10.0);
}

#[test]
fn churn_kills_and_restarts_peers_that_then_finish() {
    let (tmp, s) = run(3, "PEER0_ROUNDS=15", true, &limits());
    assert!(s.all_finished(), "{}", s.to_text());
    let restarts: u32 = s.peer_results.iter().map(|p| p.restarts).sum();
    assert!(restarts >= 1, "{}", s.to_text());
    assert_eq!(s.peer_results[0].restarts, 0, "peer 0 is never killed");
    assert!(s.notes.iter().any(|n| n.contains("churn: killed peer")));
    for p in s.peer_results.iter().filter(|p| p.restarts > 0) {
        // A restarted peer's bytes count every run of it.
        assert!(p.bytes_sent >= 5_000, "{p:?}");
        // It rejoins through the peers still training, peer 0 among them.
        let config = tmp
            .path()
            .join(format!("swarm/peer-{}/murmur.toml", p.peer));
        let t: toml::Table = toml::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
        let bootstrap = t["net"]["bootstrap"].as_array().unwrap();
        assert!(
            bootstrap
                .iter()
                .any(|a| a.as_str() == Some("/ip4/127.0.0.1/udp/9/quic-v1/p2p/peer-0")),
            "{bootstrap:?}"
        );
        assert!(
            !bootstrap.iter().any(|a| a
                .as_str()
                .is_some_and(|a| a.ends_with(&format!("peer-{}", p.peer)))),
            "not itself: {bootstrap:?}"
        );
    }
}

/// A 124M-parameter pair on a GPU took 139 s for 20 steps against a planned bound of
/// 130 s, and was stopped one step short of its summary. Past the bound, a run whose peers
/// still take steps goes on; one whose peers stopped stepping is stopped.
#[test]
fn a_run_past_its_bound_goes_on_while_its_peers_take_steps() {
    let mut limits = limits();
    limits.overall = Duration::from_millis(1500);
    limits.stall = Duration::from_secs(2);
    let (_tmp, s) = run(2, "SLOW='peer-0 peer-1'", false, &limits);
    assert!(!s.interrupted, "{:?}", s.notes);
    assert!(s.wall_s > 2.5, "five steps of 0.6 s, past the 1.5 s bound");
    assert!(
        s.peer_results.iter().all(|p| p.status == "finished"),
        "{s:?}"
    );
    assert!(
        s.notes.iter().any(|n| n.contains("still take steps")),
        "{:?}",
        s.notes
    );
}

/// At GPT-2 small's shape on two CPU cores, the step after a butterfly round took over
/// the 60 s a run past its bound waited for a step, and the run was stopped there. A peer
/// counts as stepping for three of its longest steps so far.
#[test]
fn a_run_past_its_bound_waits_for_a_step_longer_than_the_stall_after_long_steps() {
    let mut limits = limits();
    limits.overall = Duration::from_millis(1200);
    limits.stall = Duration::from_millis(800);
    let (_tmp, s) = run(2, "LATE='peer-0 peer-1'", false, &limits);
    assert!(!s.interrupted, "{:?}", s.notes);
    assert!(
        s.peer_results.iter().all(|p| p.status == "finished"),
        "a 1.2 s step after steps of 0.5 s, past a 0.8 s stall: {s:?}"
    );
}

#[test]
fn the_overall_bound_interrupts_peers_that_run_on() {
    let mut limits = limits();
    limits.overall = Duration::from_millis(1500);
    let (_tmp, s) = run(2, "STUBBORN=peer-1", false, &limits);
    assert!(s.interrupted);
    assert_eq!(s.peer_results[0].status, "finished");
    let one = &s.peer_results[1];
    assert_eq!(one.status, "failed");
    assert!(one.error.as_deref().unwrap().contains("bound"), "{one:?}");
    assert!(s.wall_s < 5.0, "SIGINT stopped it, not the grace period");
}
