//! A partition cuts exactly the traffic between its groups, and healing restores it.
//!
//! Needs root, iproute2 and `ping` (iputils-ping), like `shaping.rs`; without them the test
//! fails with a message saying what is missing.

use std::time::Duration;

use murmur_netns::{Harness, LinkShape, PingReport, Topology};

const INTERVAL: Duration = Duration::from_millis(50);

fn ping(harness: &Harness, from: usize, to: usize) -> PingReport {
    harness
        .ping(from, to, 5, INTERVAL)
        .unwrap_or_else(|error| panic!("ping {from} -> {to} could not run: {error}"))
}

fn assert_reaches(harness: &Harness, from: usize, to: usize, when: &str) {
    let report = ping(harness, from, to);
    assert_eq!(
        report.received, report.transmitted,
        "{when}: peer {from} should reach peer {to}, yet {report:?}"
    );
}

fn assert_cut(harness: &Harness, from: usize, to: usize, when: &str) {
    let report = ping(harness, from, to);
    assert_eq!(
        report.received, 0,
        "{when}: peer {from} should not reach peer {to}, yet {report:?}"
    );
}

#[test]
fn a_partition_cuts_across_groups_only_until_healed() {
    let topology = Topology::uniform(
        4,
        LinkShape {
            rate_bits_per_sec: None,
            delay: Duration::from_millis(5),
            loss: 0.0,
        },
    );
    let mut harness = Harness::build(topology, env!("CARGO_BIN_EXE_murmur-netem"))
        .unwrap_or_else(|error| panic!("could not build the network harness: {error}"));
    assert_reaches(&harness, 0, 3, "before the partition");

    harness
        .partition(&[&[0, 1], &[2, 3]])
        .unwrap_or_else(|error| panic!("could not partition: {error}"));
    assert!(harness.is_partitioned());
    for (from, to) in [(0, 1), (1, 0), (2, 3), (3, 2)] {
        assert_reaches(&harness, from, to, "within a group while partitioned");
    }
    for (from, to) in [(0, 2), (3, 1), (1, 3), (2, 0)] {
        assert_cut(&harness, from, to, "across groups while partitioned");
    }

    // A bad partition is refused and leaves the one in force alone.
    let error = harness.partition(&[&[0], &[7]]).unwrap_err().to_string();
    assert!(error.contains("peer 7"), "{error}");
    assert!(harness.is_partitioned());
    assert_cut(&harness, 0, 2, "after a refused partition");

    harness
        .heal()
        .unwrap_or_else(|error| panic!("could not heal: {error}"));
    assert!(!harness.is_partitioned());
    for (from, to) in [(0, 2), (3, 1), (0, 1), (2, 3)] {
        assert_reaches(&harness, from, to, "after the heal");
    }

    // A new partition replaces the old one rather than adding to it.
    harness
        .partition(&[&[0, 2], &[1, 3]])
        .unwrap_or_else(|error| panic!("could not partition again: {error}"));
    assert_reaches(&harness, 0, 2, "within the new group");
    assert_cut(&harness, 0, 1, "across the new groups");
    assert_cut(&harness, 3, 2, "across the new groups");
}
