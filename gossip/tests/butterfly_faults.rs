//! The butterfly fault matrix: a member that never joins, dies or stalls while sending or
//! while reducing costs the survivors a bounded delay and exactly its own contribution.

mod butterfly_support;

use std::time::Duration;

use butterfly_support::{
    Fault, MemberSpec, Outcome, optimal_group, run_round, vectors, weighted_mean,
};
use murmur_gossip::Time;
use murmur_gossip::butterfly::{ButterflyConfig, PartOutcome};
use murmur_protocol::codec::CodecSpec;

const MEMBERS: usize = 8;
const LEN: usize = 8192;
const CHUNK: usize = 128;
/// A slow member, whose part is small: the subject of the sender faults.
const SLOW: usize = 0;
/// A fast member, which sends early and reduces a large part: the subject of the reducer
/// faults.
const FAST: usize = 7;

fn config() -> ButterflyConfig {
    ButterflyConfig {
        chunk_elements: CHUNK as u32,
        chunks_in_flight: 4,
        chunk_timeout_ms: 40,
        reducer_timeout_ms: 60,
        // Arbitrary weights, each counted as declared: the exact weighted mean is checked.
        max_weight_ratio: 0.0,
        ..ButterflyConfig::default()
    }
}

fn specs(fault: Option<(usize, Fault)>) -> Vec<MemberSpec> {
    vectors(21, MEMBERS, LEN)
        .into_iter()
        .enumerate()
        .map(|(i, local)| MemberSpec {
            bandwidth: if i == FAST { 4e6 } else { 1e6 },
            accepts_connections: true,
            weight: (i * 7 % 5 + 1) as f32,
            local,
            fault: fault.filter(|(who, _)| *who == i).map(|(_, f)| f),
        })
        .collect()
}

fn run(fault: Option<(usize, Fault)>) -> (Vec<MemberSpec>, Outcome) {
    let specs = specs(fault);
    let group = optimal_group(&specs, LEN, CHUNK);
    let outcome = run_round(
        &specs,
        group,
        CodecSpec::F32,
        &config(),
        Duration::from_millis(1),
    );
    (specs, outcome)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Sent {
    Nothing,
    Some,
    Everything,
}

/// Checks every survivor's result against the law of the round: the faulty member's part
/// keeps the survivor's local values, and the report names its reducer, unless every one
/// of its averaged chunks reached the survivor (a reducer that finished before its fault
/// did its job); every other chunk is the weighted mean of exactly the contributions that
/// reached its reducer, as the report says. With `reducer_fault`, the fault struck before
/// the part was reduced, so every survivor falls back.
fn check(
    case: &str,
    faulty: usize,
    sent: Sent,
    reducer_fault: bool,
    specs: &[MemberSpec],
    outcome: &Outcome,
    bound: Time,
) {
    let partition = outcome.group.partition();
    let chunks = |j: usize| partition.range(j).len().div_ceil(CHUNK) as u32;
    let from_faulty = (0..MEMBERS)
        .filter(|&j| j != faulty)
        .flat_map(|j| (0..chunks(j)).map(move |c| (j as u32, c)))
        .filter(|&(j, c)| outcome.delivered.contains(&(faulty, j, c)))
        .count();
    let owed: usize = (0..MEMBERS)
        .filter(|&j| j != faulty)
        .map(|j| chunks(j) as usize)
        .sum();
    let observed = match from_faulty {
        0 => Sent::Nothing,
        n if n == owed => Sent::Everything,
        _ => Sent::Some,
    };
    assert_eq!(
        observed, sent,
        "{case}: the faulty member sent {from_faulty} of {owed} chunks"
    );
    assert!(
        outcome.round_time <= bound,
        "{case}: survivors finished at {:?}, past the bound {:?}",
        outcome.round_time,
        bound
    );
    for m in (0..MEMBERS).filter(|&m| m != faulty) {
        let (values, report) = outcome.results[m]
            .as_ref()
            .unwrap_or_else(|| panic!("{case}: survivor {m} did not finish"));
        let got_all = (0..chunks(faulty))
            .all(|c| outcome.averaged_delivered[m].contains(&(faulty as u32, c)));
        assert!(
            !(reducer_fault && got_all),
            "{case}: member {m} got the whole part"
        );
        let fallback = if got_all { vec![] } else { vec![faulty as u32] };
        assert_eq!(report.fallback_reducers(), fallback, "{case}: member {m}");
        let dropped_faulty = report.dropped_senders.contains(&(faulty as u32));
        assert_eq!(
            report
                .dropped_senders
                .iter()
                .filter(|&&s| s != faulty as u32)
                .count(),
            0,
            "{case}: member {m} dropped a live sender"
        );
        if m == MEMBERS - 1 || m == 1 {
            // Reducers of non-empty parts drop the faulty sender exactly when it owed them.
            let owed_me =
                (0..chunks(m)).any(|c| !outcome.delivered.contains(&(faulty, m as u32, c)));
            assert_eq!(
                dropped_faulty,
                owed_me && chunks(m) > 0,
                "{case}: member {m}"
            );
        }
        for part in &report.parts {
            let j = part.part;
            if j == faulty && !got_all {
                assert_eq!(
                    part.outcome,
                    PartOutcome::LocalFallback,
                    "{case}: member {m}"
                );
                // The averages that came before the reducer fell silent are kept (the
                // round averages in place); every other chunk keeps local values.
                for (c, chunk) in part.chunks.iter().enumerate() {
                    let arrived = outcome.averaged_delivered[m].contains(&(j as u32, c as u32));
                    assert_eq!(chunk.local, !arrived, "{case}: member {m} chunk {c}");
                    if !arrived {
                        assert_eq!(
                            &values[chunk.elements.clone()],
                            &specs[m].local[chunk.elements.clone()],
                            "{case}: member {m} chunk {c}"
                        );
                    }
                }
                continue;
            }
            assert_ne!(
                part.outcome,
                PartOutcome::LocalFallback,
                "{case}: member {m} part {j}"
            );
            for (c, chunk) in part.chunks.iter().enumerate() {
                let who: Vec<usize> = (0..MEMBERS)
                    .filter(|&s| s == j || outcome.delivered.contains(&(s, j as u32, c as u32)))
                    .collect();
                assert_eq!(
                    chunk.contributors as usize,
                    who.len(),
                    "{case}: member {m} part {j} chunk {c}"
                );
                for e in chunk.elements.clone() {
                    let (mean, scale) = weighted_mean(specs, &who, e);
                    assert!(
                        (f64::from(values[e]) - mean).abs() <= 1e-6 * scale,
                        "{case}: member {m} element {e}: {} vs {mean}",
                        values[e]
                    );
                }
            }
        }
    }
}

/// No-fault round time, when the slow member's contributions and the fast member's
/// averages are done, in the fault-free run.
fn baseline() -> (Time, Time, Time) {
    let (_, outcome) = run(None);
    assert!(outcome.results.iter().all(Option::is_some));
    (
        outcome.round_time,
        outcome.contributions_done[SLOW],
        outcome.contributions_done[FAST],
    )
}

fn mid(a: Time, b: Time) -> Time {
    Time::from_nanos((a.as_nanos() + b.as_nanos()) / 2)
}

/// The whole matrix. For each case: survivors finish within the no-fault round time plus
/// two chunk timeouts, the faulty member's part keeps local values at every survivor and
/// the report names it, and every other element is the weighted mean of exactly the
/// contributions that reached its reducer — none of the faulty member's after a fault
/// before sending, all of them after a fault while reducing.
#[test]
fn survivors_finish_in_bounded_time_with_exactly_the_contributions_that_arrived() {
    let (no_fault, slow_sent, fast_sent) = baseline();
    let (fast_specs, fast_outcome) = run(None);
    let reducing_done = fast_outcome.averages_done[FAST];
    drop(fast_specs);
    assert!(
        fast_sent < reducing_done,
        "the fast member should send before it finishes reducing"
    );
    let bound = no_fault + Duration::from_millis(2 * config().chunk_timeout_ms);
    let while_reducing = mid(fast_sent, reducing_done);
    let cases = [
        (
            "(a) never joins",
            SLOW,
            Fault::NeverJoins,
            Sent::Nothing,
            true,
        ),
        (
            "(b) dies before sending",
            SLOW,
            Fault::DiesAt(Time::ZERO),
            Sent::Nothing,
            true,
        ),
        (
            "(c) dies mid-send",
            SLOW,
            Fault::DiesAt(mid(Time::ZERO, slow_sent)),
            Sent::Some,
            false,
        ),
        (
            "(d) stalls mid-send",
            SLOW,
            Fault::StallsAt(mid(Time::ZERO, slow_sent)),
            Sent::Some,
            false,
        ),
        (
            "(e) dies while reducing",
            FAST,
            Fault::DiesAt(while_reducing),
            Sent::Everything,
            true,
        ),
        (
            "(f) stalls while reducing",
            FAST,
            Fault::StallsAt(while_reducing),
            Sent::Everything,
            true,
        ),
    ];
    for (case, faulty, fault, sent, reducer_fault) in cases {
        let (specs, outcome) = run(Some((faulty, fault)));
        check(case, faulty, sent, reducer_fault, &specs, &outcome, bound);
        eprintln!(
            "{case}: survivors done at {:.1} ms (no fault {:.1} ms, bound {:.1} ms)",
            outcome.round_time.as_secs_f64() * 1e3,
            no_fault.as_secs_f64() * 1e3,
            bound.as_secs_f64() * 1e3
        );
    }
}
