//! Partition and heal, short version: eight `murmur run` peers training with local SGD in
//! network namespaces are split into halves for 30 s, then the network heals.
//!
//! Both halves must keep training through the split (every peer steps and averages with its
//! own half, never across), and within 20 averaging rounds after the heal every peer must
//! average with the whole swarm again with its consensus drift back within 1.5 times its
//! level before the split.
//!
//! Needs root, iproute2 and the `murmur` binary of the same profile (`cargo build -p
//! murmur`). `murmur-scenario partition --long` runs the long version.

use murmur_netns::scenario::partition;

mod common;

#[test]
fn both_halves_train_through_a_partition_and_reconverge_after_the_heal() {
    let options = common::options("partition");
    let out = &options.out;
    let report = partition::run(&options).unwrap_or_else(|error| panic!("{error:#}"));
    let json = common::passing_json(&report, &options);
    // The split was real: after the heal the halves' distance showed above the bound.
    assert!(
        report
            .peers
            .iter()
            .any(|p| p.peak_drift_after.is_some_and(|d| d > report.bound)),
        "no peer saw the halves' distance after the heal: {json}"
    );
    assert!(out.join("partition-drift.png").is_file());
    let _ = std::fs::remove_dir_all(out);
}
