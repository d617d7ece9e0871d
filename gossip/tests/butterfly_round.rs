//! One butterfly round driven by hand: malformed chunks are refused without harm, send
//! buffers are reused, and a lost member is given up at once, without waiting for the
//! chunks still on their way to it.

use std::collections::VecDeque;

use murmur_gossip::Time;
use murmur_gossip::butterfly::{
    ButterflyConfig, ButterflyError, ButterflyRound, CoverageReport, Group, PartOutcome, Partition,
    PayloadRef, RoundInput, RoundOutput,
};
use murmur_protocol::codec::CodecSpec;
use murmur_protocol::message::ChunkAddress;

const LEN: usize = 1000;
const CHUNK: u32 = 64;

fn config() -> ButterflyConfig {
    ButterflyConfig {
        chunk_elements: CHUNK,
        chunks_in_flight: 2,
        ..ButterflyConfig::default()
    }
}

fn local(member: usize) -> Vec<f32> {
    (0..LEN)
        .map(|e| (member * 1000 + e) as f32 * 0.001)
        .collect()
}

fn rounds(n: usize) -> Vec<ButterflyRound<u32>> {
    let partition = Partition::equal(LEN, n, CHUNK as usize).expect("valid");
    let group = Group::new(1, 42, (0..n as u32).collect(), partition).expect("valid");
    (0..n)
        .map(|i| {
            ButterflyRound::new(
                i as u32,
                group.clone(),
                local(i),
                (i + 1) as f32,
                CodecSpec::F32,
                &config(),
                Time::ZERO,
            )
            .expect("valid round")
        })
        .collect()
}

/// A wire message in flight between two rounds.
struct Wire {
    from: usize,
    to: usize,
    averaged: bool,
    address: ChunkAddress,
    weight: f32,
    contributors: u32,
    payload: Vec<u8>,
}

/// What [`exchange`] saw until nothing moved.
struct Settled {
    /// Chunks delivered.
    moved: usize,
    /// The reports of the members that finished meanwhile.
    reports: Vec<Option<CoverageReport<u32>>>,
    /// Sends to the skipped member, never acknowledged: sender, destination, payload.
    held: Vec<(usize, u32, PayloadRef)>,
    /// What those sends carried, in the same order.
    held_wires: Vec<Wire>,
}

/// Delivers every output at once, acknowledging each send right after taking its bytes,
/// until nothing moves. Nothing reaches `skip`, and sends to it are not acknowledged (as
/// with a dead host, whose sends take a connection timeout to fail).
fn exchange(rounds: &mut [ButterflyRound<u32>], skip: Option<usize>) -> Settled {
    let mut moved = 0;
    let mut reports = vec![None; rounds.len()];
    let mut held = Vec::new();
    let mut held_wires = Vec::new();
    // Every chunk is sent once; the bound only stops a runaway loop.
    for _ in 0..100_000 {
        let mut wires = VecDeque::new();
        for (i, round) in rounds.iter_mut().enumerate() {
            if Some(i) == skip {
                continue;
            }
            while let Some(output) = round.poll_output() {
                let (to, wire_payload, averaged, address, weight, contributors) = match output {
                    RoundOutput::SendPartChunk {
                        to,
                        address,
                        weight,
                        payload,
                    } => (to, payload, false, address, weight, 0),
                    RoundOutput::SendAveragedChunk {
                        to,
                        address,
                        contributors,
                        total_weight,
                        payload,
                    } => (to, payload, true, address, total_weight, contributors),
                    RoundOutput::Finished(report) => {
                        reports[i] = Some(report);
                        continue;
                    }
                };
                let payload = round.payload(wire_payload).expect("current").to_vec();
                let wire = Wire {
                    from: i,
                    to: to as usize,
                    averaged,
                    address,
                    weight,
                    contributors,
                    payload,
                };
                if Some(to as usize) == skip {
                    held.push((i, to, wire_payload));
                    held_wires.push(wire);
                    continue;
                }
                round
                    .handle(
                        Time::ZERO,
                        RoundInput::Sent {
                            to,
                            payload: wire_payload,
                        },
                    )
                    .expect("ack");
                wires.push_back(wire);
            }
        }
        if wires.is_empty() {
            return Settled {
                moved,
                reports,
                held,
                held_wires,
            };
        }
        for wire in wires {
            moved += 1;
            deliver(rounds, &wire);
        }
    }
    panic!("the exchange did not settle");
}

fn deliver(rounds: &mut [ButterflyRound<u32>], wire: &Wire) {
    {
        let input = if wire.averaged {
            RoundInput::AveragedChunk {
                from: wire.from as u32,
                address: wire.address,
                contributors: wire.contributors,
                total_weight: wire.weight,
                codec: CodecSpec::F32,
                payload: &wire.payload,
            }
        } else {
            RoundInput::PartChunk {
                from: wire.from as u32,
                address: wire.address,
                weight: wire.weight,
                codec: CodecSpec::F32,
                payload: &wire.payload,
            }
        };
        rounds[wire.to]
            .handle(Time::ZERO, input)
            .expect("well-formed");
    }
}

fn expected(n: usize, e: usize) -> f64 {
    let total: f64 = (1..=n).map(|w| w as f64).sum();
    (0..n)
        .map(|i| (i + 1) as f64 * f64::from(local(i)[e]))
        .sum::<f64>()
        / total
}

/// Chunks with a wrong group, sender, part, address, codec, weight or payload length are
/// refused with the matching error, and the round still ends with the exact weighted mean.
#[test]
fn malformed_chunks_are_refused_and_change_nothing() {
    let mut rounds = rounds(3);
    let good = ChunkAddress {
        group_id: 42,
        part: 0,
        chunk: 0,
        offset: 0,
        elements: CHUNK,
    };
    let payload = vec![0u8; CHUNK as usize * 4];
    let cases: [(u32, ChunkAddress, f32, CodecSpec, &[u8]); 8] = [
        (
            1,
            ChunkAddress {
                group_id: 41,
                ..good
            },
            1.0,
            CodecSpec::F32,
            &payload,
        ),
        (9, good, 1.0, CodecSpec::F32, &payload),
        (
            1,
            ChunkAddress { part: 1, ..good },
            1.0,
            CodecSpec::F32,
            &payload,
        ),
        (
            1,
            ChunkAddress { chunk: 99, ..good },
            1.0,
            CodecSpec::F32,
            &payload,
        ),
        (
            1,
            ChunkAddress { offset: 3, ..good },
            1.0,
            CodecSpec::F32,
            &payload,
        ),
        (1, good, 1.0, CodecSpec::F16, &payload),
        (1, good, -1.0, CodecSpec::F32, &payload),
        (1, good, 1.0, CodecSpec::F32, &payload[..8]),
    ];
    for (from, address, weight, codec, payload) in cases {
        let input = RoundInput::PartChunk {
            from,
            address,
            weight,
            codec,
            payload,
        };
        let error = rounds[0].handle(Time::ZERO, input).expect_err("refused");
        let expected_kind = match error {
            ButterflyError::WrongGroup { .. } => address.group_id != 42,
            ButterflyError::NotAMember { .. } => from == 9,
            ButterflyError::BadChunk { .. } => true,
            ButterflyError::BadWeight { .. } => weight < 0.0,
            ButterflyError::Codec(_) => payload.len() == 8,
            _ => false,
        };
        assert!(expected_kind, "{address:?} from {from}: unexpected {error}");
    }
    assert_eq!(rounds[0].stats().part_chunks_received, 0);
    exchange(&mut rounds, None);
    for (m, round) in rounds.iter().enumerate() {
        assert!(round.is_finished() && round.is_idle(), "member {m}");
        for (e, value) in round.result().iter().enumerate() {
            assert!(
                (f64::from(*value) - expected(3, e)).abs() < 1e-5,
                "member {m} element {e}"
            );
        }
    }
}

/// A chunk delivered twice is counted once; send buffers are reused, so a round never
/// holds more than `chunks_in_flight` per destination however long the vector.
#[test]
fn duplicates_are_ignored_and_send_buffers_are_bounded() {
    let mut rounds = rounds(4);
    let moved = exchange(&mut rounds, None).moved;
    assert!(moved > 3 * 4 * 2, "{moved} chunks is too few to test reuse");
    for round in &rounds {
        // Each send was acknowledged before the next pass, so buffers were reused.
        assert!(
            round.stats().buffers_allocated <= 2 * 3,
            "{:?}",
            round.stats()
        );
    }
    let payload = vec![0u8; CHUNK as usize * 4];
    let input = RoundInput::PartChunk {
        from: 1,
        address: ChunkAddress {
            group_id: 42,
            part: 0,
            chunk: 0,
            offset: 0,
            elements: CHUNK,
        },
        weight: 1.0,
        codec: CodecSpec::F32,
        payload: &payload,
    };
    let before = rounds[0].result().to_vec();
    rounds[0]
        .handle(Time::ZERO, input)
        .expect("late duplicate is harmless");
    assert_eq!(rounds[0].result(), &before[..]);
    assert_eq!(rounds[0].stats().chunks_ignored, 1);
}

/// When the transport reports a member lost, the others stop waiting for it at once: its
/// part keeps local values, it is dropped as a sender, and no timeout is needed.
#[test]
fn a_lost_member_is_given_up_without_waiting() {
    let mut rounds = rounds(3);
    let before = exchange(&mut rounds, Some(2));
    assert!(!before.held.is_empty(), "chunks were sent to member 2");
    for round in rounds.iter_mut().take(2) {
        assert!(!round.is_finished());
        round
            .handle(Time::ZERO, RoundInput::MemberLost(2))
            .expect("lost member");
    }
    let reports = exchange(&mut rounds, Some(2)).reports;
    for (m, round) in rounds.iter().enumerate().take(2) {
        assert!(round.is_finished(), "member {m}");
        assert!(
            round.is_idle(),
            "member {m} waits for sends to a lost member"
        );
        let report = reports[m].as_ref().expect("finished with a report");
        assert_eq!(report.fallback_reducers(), vec![2]);
        assert_eq!(report.parts[2].outcome, PartOutcome::LocalFallback);
        let part = report.parts[2].elements.clone();
        assert_eq!(&round.result()[part.clone()], &local(m)[part]);
        // The other parts average members 0 and 1 only.
        let total = 3.0;
        for e in report.parts[0].elements.clone() {
            let mean = (f64::from(local(0)[e]) + 2.0 * f64::from(local(1)[e])) / total;
            assert!(
                (f64::from(round.result()[e]) - mean).abs() < 1e-5,
                "member {m} element {e}"
            );
        }
    }
    // Their sends fail long after: harmless to the finished round.
    for (from, to, payload) in before.held {
        rounds[from]
            .handle(Time::ZERO, RoundInput::Sent { to, payload })
            .expect("a late report");
        assert!(rounds[from].is_idle());
    }
}

/// A member that only went quiet (late heartbeats) is not waited for, but it is still sent
/// the averages it is owed: when it turns out alive it finishes with the others' parts
/// averaged, instead of waiting out its reducer timeout.
#[test]
fn a_quiet_member_is_not_waited_for_but_still_served() {
    let mut rounds = rounds(3);
    for round in rounds.iter_mut().take(2) {
        round
            .handle(Time::ZERO, RoundInput::MemberQuiet(2))
            .expect("quiet member");
    }
    let reports = exchange(&mut rounds, None).reports;
    for m in 0..2 {
        let report = reports[m].as_ref().expect("finished");
        assert_eq!(report.fallback_reducers(), vec![2], "member {m}");
        // Member 2's contribution is left out of the parts of members 0 and 1.
        for e in report.parts[m].elements.clone() {
            let mean = (f64::from(local(0)[e]) + 2.0 * f64::from(local(1)[e])) / 3.0;
            assert!((f64::from(rounds[m].result()[e]) - mean).abs() < 1e-5);
        }
    }
    let report = reports[2].as_ref().expect("the quiet member finishes too");
    assert!(report.fallback_reducers().is_empty(), "{report:?}");
    assert_eq!(report.parts[0].outcome, PartOutcome::Averaged);
    assert_eq!(report.parts[1].outcome, PartOutcome::Averaged);
    assert!(rounds.iter().all(ButterflyRound::is_idle));
}

/// The same once the others have finished and taken their vectors out before the quiet
/// member hears anything: what they still owe it was encoded then, and goes out as their
/// windows to it free up.
#[test]
fn a_quiet_member_is_still_served_after_the_others_took_their_vectors() {
    let mut rounds = rounds(3);
    for round in rounds.iter_mut().take(2) {
        round
            .handle(Time::ZERO, RoundInput::MemberQuiet(2))
            .expect("quiet member");
    }
    let first = exchange(&mut rounds, Some(2));
    for (m, round) in rounds.iter_mut().enumerate().take(2) {
        assert!(round.is_finished(), "member {m}");
        round.take_buffers();
        assert!(!round.is_idle(), "member {m} still owes member 2");
    }
    // Member 2 wakes: what was on the wire arrives, and its senders hear it left.
    for ((from, to, payload), wire) in first.held.into_iter().zip(&first.held_wires) {
        deliver(&mut rounds, wire);
        rounds[from]
            .handle(Time::ZERO, RoundInput::Sent { to, payload })
            .expect("ack");
    }
    let reports = exchange(&mut rounds, None).reports;
    let report = reports[2].as_ref().expect("the quiet member finishes");
    assert!(report.fallback_reducers().is_empty(), "{report:?}");
    // Its own part averages all three members: every part chunk reached it.
    for e in report.parts[2].elements.clone() {
        assert!((f64::from(rounds[2].result()[e]) - expected(3, e)).abs() < 1e-5);
    }
    // The others' parts hold their averages of members 0 and 1, sent after they took
    // their vectors out.
    for m in 0..2 {
        for e in report.parts[m].elements.clone() {
            let mean = (f64::from(local(0)[e]) + 2.0 * f64::from(local(1)[e])) / 3.0;
            assert!(
                (f64::from(rounds[2].result()[e]) - mean).abs() < 1e-5,
                "part {m} element {e}"
            );
        }
    }
    assert!(rounds.iter().all(ButterflyRound::is_idle));
}

/// A member whose own part is reduced before it has sent its part chunks still sends them:
/// its averages never run ahead of them, so the other reducers are not left waiting while
/// its uplink carries averages alone.
#[test]
fn averages_do_not_run_ahead_of_the_part_chunks_to_the_same_member() {
    let mut rounds = rounds(2);
    // Member 1 sends everything it can to member 0 before member 0 sends anything: its
    // part chunks for member 0's part complete member 0's reduction.
    let mut fed = 0;
    for _ in 0..1000 {
        let Some(output) = rounds[1].poll_output() else {
            break;
        };
        let RoundOutput::SendPartChunk {
            to,
            address,
            weight,
            payload,
        } = output
        else {
            continue;
        };
        let bytes = rounds[1].payload(payload).expect("current").to_vec();
        rounds[1]
            .handle(Time::ZERO, RoundInput::Sent { to, payload })
            .expect("ack");
        let input = RoundInput::PartChunk {
            from: 1,
            address,
            weight,
            codec: CodecSpec::F32,
            payload: &bytes,
        };
        rounds[0].handle(Time::ZERO, input).expect("well-formed");
        fed += 1;
    }
    assert!(fed >= 4, "member 1 sent {fed} part chunks");
    // Now every average of member 0 is ready; see in which order it sends to member 1.
    let (mut parts, mut averages) = (0usize, 0usize);
    let mut order = Vec::new();
    for _ in 0..1000 {
        let Some(output) = rounds[0].poll_output() else {
            break;
        };
        let (to, payload) = match output {
            RoundOutput::SendPartChunk { to, payload, .. } => {
                parts += 1;
                order.push('P');
                (to, payload)
            }
            RoundOutput::SendAveragedChunk { to, payload, .. } => {
                averages += 1;
                order.push('A');
                (to, payload)
            }
            RoundOutput::Finished(_) => continue,
        };
        rounds[0]
            .handle(Time::ZERO, RoundInput::Sent { to, payload })
            .expect("ack");
        // Averages sent so far, as a fraction of member 0's chunks, stay within one chunk
        // of the part chunks sent, as a fraction of member 1's.
        assert!(averages <= parts + 1, "order {order:?}");
    }
    let order: String = order.into_iter().collect();
    assert!(parts >= 4 && averages >= 4, "order {order}");
    assert!(
        order.ends_with("AP") || order.ends_with("PA"),
        "order {order}"
    );
}

/// A member that declares 1000 times the others' samples counts only `max_weight_ratio`
/// times the median declared weight at every honest reducer: their parts average with its
/// weight at the bound. (Its own part is its own to reduce: a reducer's honesty is not
/// something a weight bound can give.)
#[test]
fn an_inflated_weight_counts_only_up_to_the_bound() {
    let n = 3;
    let weights = [1.0f32, 1.0, 1000.0];
    let partition = Partition::equal(LEN, n, CHUNK as usize).expect("valid");
    let group = Group::new(1, 42, (0..n as u32).collect(), partition).expect("valid");
    let config = config();
    let mut rounds: Vec<ButterflyRound<u32>> = (0..n)
        .map(|i| {
            ButterflyRound::new(
                i as u32,
                group.clone(),
                local(i),
                weights[i],
                CodecSpec::F32,
                &config,
                Time::ZERO,
            )
            .expect("valid round")
        })
        .collect();
    exchange(&mut rounds, None);
    let bound = config.max_weight_ratio;
    assert_eq!(bound, 4.0, "the default bound");
    let counted = [1.0f64, 1.0, f64::from(bound)];
    let total: f64 = counted.iter().sum();
    let honest_parts = 0..group.partition().range(2).start;
    for (m, round) in rounds.iter().enumerate() {
        assert!(round.is_finished(), "member {m}");
        for (e, &got) in round.result()[honest_parts.clone()].iter().enumerate() {
            let want: f64 = (0..n)
                .map(|i| counted[i] * f64::from(local(i)[e]))
                .sum::<f64>()
                / total;
            assert!(
                (f64::from(got) - want).abs() < 1e-4 * want.abs().max(1.0),
                "member {m} element {e}: {got} vs {want}"
            );
        }
    }
    let capped: u64 = rounds.iter().map(|r| r.stats().weights_capped).sum();
    assert_eq!(capped, 2, "both honest reducers cut the inflated weight");
}
