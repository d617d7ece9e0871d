//! The harness emulates what it is asked to: round-trip time measured with `ping`, rate with a
//! bulk TCP transfer (with and without the delay stage's segment offloads), loss with many
//! pings; and it leaves no namespace behind.
//!
//! These tests need root, `ip`/`tc` (iproute2) and `ping` (iputils-ping); without them they
//! fail with a message saying what is missing. They run one at a time, so a measurement is not
//! disturbed by another test's traffic.

use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use murmur_netns::{Harness, LinkShape, NAMESPACE_PREFIX, Topology};

/// One harness at a time: measurements share two CPU cores with everything else.
static SERIAL: Mutex<()> = Mutex::new(());

const RATE_BITS_PER_SEC: u64 = 50_000_000;
const ONE_WAY_DELAY: Duration = Duration::from_millis(20);

fn serial() -> MutexGuard<'static, ()> {
    // A test that failed while holding the lock leaves nothing shared behind.
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn build(topology: Topology) -> Harness {
    Harness::build(topology, env!("CARGO_BIN_EXE_murmur-netem"))
        .unwrap_or_else(|error| panic!("could not build the network harness: {error}"))
}

fn shaped_pair() -> Topology {
    Topology::uniform(
        2,
        LinkShape {
            rate_bits_per_sec: Some(RATE_BITS_PER_SEC),
            delay: ONE_WAY_DELAY,
            loss: 0.0,
        },
    )
}

fn namespaces() -> Vec<String> {
    let output = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap_or_else(|error| panic!("could not run `ip netns list`: {error}"));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// Two links of 20 ms each: a ping crosses both links each way, so the round trip is 80 ms.
#[test]
fn ping_round_trip_matches_the_links_delays() {
    let _serial = serial();
    let harness = build(shaped_pair());
    let expected = harness.topology().round_trip(0, 1);
    assert_eq!(expected, Duration::from_millis(80));
    let report = harness
        .ping(0, 1, 50, Duration::from_millis(20))
        .unwrap_or_else(|error| panic!("ping failed: {error}"));
    assert_eq!(
        report.received, report.transmitted,
        "no loss is configured, yet {report:?}"
    );
    let median = report.median_round_trip().expect("replies arrived");
    let ratio = median.as_secs_f64() / expected.as_secs_f64();
    eprintln!("ping: median round trip {median:?}, configured {expected:?}");
    assert!(
        (0.8..=1.2).contains(&ratio),
        "median round trip {median:?} is not within 20% of the configured {expected:?}"
    );
    // The stage never releases a packet early, so no round trip beats the configured one.
    let fastest = report.round_trips.iter().min().expect("replies arrived");
    assert!(
        *fastest >= expected,
        "a round trip of {fastest:?} is shorter than the configured {expected:?}"
    );
    // The reverse direction sees the same links.
    let back = harness
        .ping(1, 0, 10, Duration::from_millis(20))
        .unwrap_or_else(|error| panic!("ping failed: {error}"));
    let back_median = back.median_round_trip().expect("replies arrived");
    assert!(
        back_median >= expected && back_median.as_secs_f64() <= expected.as_secs_f64() * 1.2,
        "round trip from peer 1 to peer 0 is {back_median:?}, configured {expected:?}"
    );
}

/// A bulk TCP transfer over 50 Mbit/s links with an 80 ms round trip reaches 70% to 105% of
/// the rate after slow start (headers take about 4% of it).
#[test]
fn bulk_transfer_reaches_the_configured_rate() {
    let _serial = serial();
    let mut harness = build(shaped_pair());
    let report = harness
        .bulk_transfer(0, 1, Duration::from_secs(5))
        .unwrap_or_else(|error| panic!("bulk transfer failed: {error}"));
    let ratio = report.steady_bits_per_sec / RATE_BITS_PER_SEC as f64;
    eprintln!(
        "bulk transfer: {:.1} Mbit/s steady, {:.0}% of the configured {} Mbit/s",
        report.steady_bits_per_sec / 1e6,
        ratio * 100.0,
        RATE_BITS_PER_SEC / 1_000_000
    );
    assert!(
        (0.70..=1.05).contains(&ratio),
        "steady throughput {:.1} Mbit/s is {:.0}% of the configured {} Mbit/s; expected 70% to 105%",
        report.steady_bits_per_sec / 1e6,
        ratio * 100.0,
        RATE_BITS_PER_SEC / 1_000_000
    );
    let stats = harness
        .stop_delay_stage()
        .unwrap_or_else(|error| panic!("stopping the delay stage failed: {error}"));
    assert_eq!(
        stats.dropped_queue_full, 0,
        "the delay queue overflowed: {stats:?}"
    );
}

/// With segment offloads (the default on lossless links) the kernel hands the delay stage
/// TCP super-packets, so the mean packet it saw is larger than the links' MTU, which no
/// packet can be without them; the transfer still runs at the rate. Without them every
/// packet fits the MTU, at the same rate.
#[test]
fn segment_offloads_hand_the_stage_super_packets_at_the_same_rate() {
    let _serial = serial();
    for offloads in [true, false] {
        let mut topology = shaped_pair();
        topology.segment_offloads = offloads;
        let mut harness = build(topology);
        let report = harness
            .bulk_transfer(0, 1, Duration::from_secs(3))
            .unwrap_or_else(|error| panic!("bulk transfer failed: {error}"));
        let ratio = report.steady_bits_per_sec / RATE_BITS_PER_SEC as f64;
        let stats = harness
            .stop_delay_stage()
            .unwrap_or_else(|error| panic!("stopping the delay stage failed: {error}"));
        let mean_packet = stats.received_bytes as f64 / stats.received.max(1) as f64;
        eprintln!(
            "offloads {offloads}: {:.1} Mbit/s steady, mean packet {mean_packet:.0} bytes over {} packets",
            report.steady_bits_per_sec / 1e6,
            stats.received
        );
        assert!(
            (0.70..=1.05).contains(&ratio),
            "offloads {offloads}: steady throughput {:.1} Mbit/s is {:.0}% of the configured rate",
            report.steady_bits_per_sec / 1e6,
            ratio * 100.0
        );
        if offloads {
            assert!(
                mean_packet > 1500.0,
                "with offloads the stage saw packets of {mean_packet:.0} bytes on average, \
                 none larger than the MTU: {stats:?}"
            );
        } else {
            assert!(
                mean_packet <= 1500.0,
                "without offloads the stage saw packets of {mean_packet:.0} bytes on average: {stats:?}"
            );
        }
        assert_eq!(
            stats.dropped_queue_full + stats.dropped_oversize,
            0,
            "{stats:?}"
        );
    }
}

/// A delay stage of three threads, one per queue of its TUN device, still holds every flow
/// back by its links' delays (in both directions) and carries a bulk transfer at the rate.
#[test]
fn a_delay_stage_of_several_queues_delays_and_carries_every_flow() {
    let _serial = serial();
    let mut topology = shaped_pair();
    topology.links.extend(topology.links.clone());
    topology.delay_queues = 3;
    let mut harness = build(topology);
    let expected = harness.topology().round_trip(0, 1);
    for (from, to) in [(0, 1), (2, 3), (3, 0), (1, 2)] {
        let report = harness
            .ping(from, to, 10, Duration::from_millis(20))
            .unwrap_or_else(|error| panic!("ping {from} -> {to} failed: {error}"));
        assert_eq!(
            report.received, report.transmitted,
            "{from} -> {to}: {report:?}"
        );
        let median = report.median_round_trip().expect("replies arrived");
        let fastest = report.round_trips.iter().min().expect("replies arrived");
        assert!(
            *fastest >= expected && median.as_secs_f64() <= expected.as_secs_f64() * 1.2,
            "{from} -> {to}: round trips from {fastest:?}, median {median:?}; configured {expected:?}"
        );
    }
    let report = harness
        .bulk_transfer(2, 1, Duration::from_secs(4))
        .unwrap_or_else(|error| panic!("bulk transfer failed: {error}"));
    let ratio = report.steady_bits_per_sec / RATE_BITS_PER_SEC as f64;
    assert!(
        (0.70..=1.05).contains(&ratio),
        "steady throughput {:.1} Mbit/s is {:.0}% of the configured rate",
        report.steady_bits_per_sec / 1e6,
        ratio * 100.0
    );
    let stats = harness
        .stop_delay_stage()
        .unwrap_or_else(|error| panic!("stopping the delay stage failed: {error}"));
    assert_eq!(stats.dropped_queue_full, 0, "{stats:?}");
    assert_eq!(stats.lost, 0, "{stats:?}");
    // A few packets (the connections' last ones) may still be held when the stage stops.
    assert!(stats.received - stats.forwarded <= 8, "{stats:?}");
}

/// Loss of 10% on peer 0's link: a ping's request and its reply each cross that link once,
/// so 1 - 0.9² = 19% of pings go unanswered.
#[test]
fn ping_loss_matches_the_links_loss() {
    let _serial = serial();
    let mut topology = Topology::uniform(
        2,
        LinkShape {
            rate_bits_per_sec: None,
            delay: Duration::from_millis(1),
            loss: 0.0,
        },
    );
    topology.links[0].loss = 0.1;
    let mut harness = build(topology);
    let pings = 1000;
    let report = harness
        .ping(0, 1, pings, Duration::from_millis(2))
        .unwrap_or_else(|error| panic!("ping failed: {error}"));
    assert_eq!(report.transmitted, pings);
    let expected = 1.0 - 0.9 * 0.9;
    eprintln!(
        "ping: {:.1}% of {pings} pings lost, expected {:.1}%",
        report.loss() * 100.0,
        expected * 100.0
    );
    // 1000 pings at p = 0.19: the standard deviation is 1.2 points; 5 points is four of them.
    assert!(
        (report.loss() - expected).abs() <= 0.05,
        "ping loss {:.1}% is not within 5 points of the expected {:.1}%",
        report.loss() * 100.0,
        expected * 100.0
    );
    let stats = harness
        .stop_delay_stage()
        .unwrap_or_else(|error| panic!("stopping the delay stage failed: {error}"));
    // Every packet crosses peer 0's link exactly once, so the stage lost 10% of what it saw.
    let stage_loss = stats.lost as f64 / stats.received as f64;
    assert!(
        (stage_loss - 0.1).abs() <= 0.025,
        "the delay stage lost {:.1}% of the packets it received, configured 10%: {stats:?}",
        stage_loss * 100.0
    );
}

/// Dropping a harness deletes its namespaces; building one deletes those of dead processes.
#[test]
fn namespaces_are_removed_on_drop_and_stale_ones_at_start() {
    let _serial = serial();
    // No process has this id (above the kernel's largest pid_max), so the namespace is stale.
    let stale = format!("{NAMESPACE_PREFIX}4294967295-0-router");
    let created = Command::new("ip")
        .args(["netns", "add", &stale])
        .status()
        .unwrap_or_else(|error| panic!("could not run `ip netns add`: {error}"));
    assert!(created.success(), "could not create namespace {stale}");
    let harness = build(Topology::uniform(3, LinkShape::UNSHAPED));
    let ours: Vec<String> = std::iter::once(harness.router_namespace().to_owned())
        .chain((0..3).map(|peer| harness.peer_namespace(peer).to_owned()))
        .collect();
    let present = namespaces();
    assert!(
        !present.contains(&stale),
        "stale namespace {stale} survived"
    );
    for name in &ours {
        assert!(present.contains(name), "namespace {name} was not created");
    }
    // A process started inside must be reachable across the router, and die with the harness.
    let ping = harness
        .ping(2, 0, 3, Duration::from_millis(10))
        .unwrap_or_else(|error| panic!("ping failed: {error}"));
    assert_eq!(ping.received, 3, "unshaped links lost pings: {ping:?}");
    let mut sleeper = harness.command(1, "sleep");
    sleeper.arg("600");
    let mut sleeper = murmur_netns::KillOnDrop(sleeper.spawn().expect("sleep starts"));
    drop(harness);
    let present = namespaces();
    for name in &ours {
        assert!(
            !present.contains(name),
            "namespace {name} survived the drop"
        );
    }
    let status = sleeper
        .wait_or_kill(Duration::from_secs(5))
        .expect("waiting for sleep");
    assert!(
        !status.success(),
        "the process inside the harness outlived it and exited normally"
    );
}

/// A build that fails half way says why and removes what it had created.
#[test]
fn a_failed_build_reports_why_and_leaves_no_namespace() {
    let _serial = serial();
    let error = Harness::build(
        Topology::uniform(2, LinkShape::UNSHAPED),
        "/nonexistent/murmur-netem",
    )
    .expect_err("the delay stage cannot start from a missing binary");
    assert!(
        matches!(error, murmur_netns::HarnessError::DelayStageNotReady { .. }),
        "unexpected error: {error}"
    );
    let ours = format!("{NAMESPACE_PREFIX}{}-", std::process::id());
    let left: Vec<String> = namespaces()
        .into_iter()
        .filter(|name| name.starts_with(&ours))
        .collect();
    assert!(left.is_empty(), "a failed build left {left:?}");
}
