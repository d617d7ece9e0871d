//! Ring all-reduce, the synchronous baseline: exact weighted mean, textbook round time,
//! and no tolerance for a member that goes silent.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use murmur_gossip::Time;
use murmur_gossip::butterfly::PayloadRef;
use murmur_gossip::ring::{RingAllReduce, RingInput, RingOutput};
use murmur_protocol::codec::CodecSpec;
use murmur_protocol::message::ChunkAddress;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

/// Bytes of framing per message (address, weight, codec, frame header).
const FRAME_OVERHEAD: usize = 48;

#[derive(Debug)]
enum Event {
    Deliver {
        from: usize,
        to: usize,
        address: ChunkAddress,
        weight: f32,
        payload: Vec<u8>,
    },
    Sent {
        member: usize,
        payload: PayloadRef,
    },
    Tick {
        member: usize,
    },
}

struct Outcome {
    finished_at: Vec<Option<Time>>,
    failed: Vec<bool>,
    results: Vec<Vec<f32>>,
}

/// Runs one ring round on a uniform link: `bandwidth` bytes/s each way per member, one-way
/// `latency`. `silent` never processes anything.
fn run(
    locals: &[Vec<f32>],
    weights: &[f32],
    bandwidth: f64,
    latency: Duration,
    deadline: Time,
    silent: Option<usize>,
) -> Outcome {
    let n = locals.len();
    let ring: Vec<u32> = (0..n as u32).collect();
    let mut members: Vec<RingAllReduce<u32>> = (0..n)
        .map(|i| {
            RingAllReduce::new(
                i as u32,
                ring.clone(),
                9,
                locals[i].clone(),
                weights[i],
                CodecSpec::F32,
                deadline,
            )
            .expect("valid ring")
        })
        .collect();
    let mut queue: BinaryHeap<Reverse<(Time, u64)>> = BinaryHeap::new();
    let mut events: Vec<Option<Event>> = Vec::new();
    let mut uplink_free = vec![Time::ZERO; n];
    let mut downlink_free = vec![Time::ZERO; n];
    let mut outcome = Outcome {
        finished_at: vec![None; n],
        failed: vec![false; n],
        results: vec![Vec::new(); n],
    };
    let push = |queue: &mut BinaryHeap<_>, events: &mut Vec<Option<Event>>, at: Time, e| {
        queue.push(Reverse((at, events.len() as u64)));
        events.push(Some(e));
    };
    let mut pending: Vec<usize> = (0..n).collect();
    let mut now = Time::ZERO;
    // Each member sends 2(N − 1) segments; the bound only stops a runaway loop.
    for _ in 0..(100 * n * n + 1000) {
        for i in pending.drain(..) {
            if Some(i) == silent {
                continue;
            }
            while let Some(output) = members[i].poll_output() {
                match output {
                    RingOutput::Send {
                        to,
                        address,
                        weight,
                        payload,
                    } => {
                        let bytes = members[i].payload(payload).expect("current").to_vec();
                        let size = (bytes.len() + FRAME_OVERHEAD) as f64;
                        let transfer = Duration::from_secs_f64(size / bandwidth);
                        let departs = now.max(uplink_free[i]);
                        let left = departs + transfer;
                        uplink_free[i] = left;
                        let to = to as usize;
                        let received = (departs + latency).max(downlink_free[to]) + transfer;
                        downlink_free[to] = received;
                        let arrives = (left + latency).max(received);
                        push(
                            &mut queue,
                            &mut events,
                            left,
                            Event::Sent { member: i, payload },
                        );
                        push(
                            &mut queue,
                            &mut events,
                            arrives,
                            Event::Deliver {
                                from: i,
                                to,
                                address,
                                weight,
                                payload: bytes,
                            },
                        );
                    }
                    RingOutput::Finished => {
                        outcome.finished_at[i] = Some(now);
                        outcome.results[i] = members[i].result().to_vec();
                    }
                    RingOutput::Failed { .. } => {
                        outcome.failed[i] = true;
                        outcome.results[i] = members[i].result().to_vec();
                    }
                }
            }
            if let Some(at) = members[i].poll_timeout() {
                push(&mut queue, &mut events, at, Event::Tick { member: i });
            }
        }
        let Some(Reverse((at, id))) = queue.pop() else {
            return outcome;
        };
        now = at;
        let Some(event) = events[id as usize].take() else {
            continue;
        };
        let member = match &event {
            Event::Deliver { to, .. } => *to,
            Event::Sent { member, .. } | Event::Tick { member } => *member,
        };
        if Some(member) == silent {
            continue;
        }
        let input = match &event {
            Event::Deliver {
                from,
                address,
                weight,
                payload,
                ..
            } => RingInput::Segment {
                from: *from as u32,
                address: *address,
                weight: *weight,
                codec: CodecSpec::F32,
                payload,
            },
            Event::Sent { payload, .. } => RingInput::Sent { payload: *payload },
            Event::Tick { .. } => {
                if members[member].poll_timeout().is_none_or(|t| t > now) {
                    continue;
                }
                RingInput::Tick
            }
        };
        members[member]
            .handle(now, input)
            .expect("well-formed segments");
        pending.push(member);
    }
    panic!("the ring did not settle");
}

fn inputs(seed: u64, n: usize, len: usize) -> (Vec<Vec<f32>>, Vec<f32>) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let locals = (0..n)
        .map(|_| (0..len).map(|_| rng.random_range(-2.0f32..2.0)).collect())
        .collect();
    let weights = (0..n).map(|_| rng.random_range(1..64) as f32).collect();
    (locals, weights)
}

/// Every member ends with the weighted mean (within f32 summation error), for ring sizes
/// from 1 to 16 and lengths that do not divide evenly.
#[test]
fn every_member_gets_the_weighted_mean() {
    for (seed, n, len) in [
        (1, 1, 10),
        (2, 2, 100),
        (3, 5, 1001),
        (4, 16, 4096),
        (5, 7, 3),
    ] {
        let (locals, weights) = inputs(seed, n, len);
        let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
        let outcome = run(
            &locals,
            &weights,
            1e7,
            Duration::from_millis(1),
            Time::from_secs_f64(10.0),
            None,
        );
        for (m, result) in outcome.results.iter().enumerate() {
            assert!(
                outcome.finished_at[m].is_some(),
                "n {n}: member {m} did not finish"
            );
            for e in 0..len {
                let (sum, scale) = (0..n).fold((0.0, 0.0), |(s, a), i| {
                    let x = f64::from(weights[i]) * f64::from(locals[i][e]);
                    (s + x, a + x.abs())
                });
                let mean = sum / total;
                assert!(
                    (f64::from(result[e]) - mean).abs() <= 1e-6 * scale / total + 1e-30,
                    "n {n}: member {m} element {e}: {} vs {mean}",
                    result[e]
                );
            }
        }
    }
}

/// On a uniform link the round takes `2(N − 1)·(S/(N·B) + L)` (S counting each message's
/// framing) within 2%, for N = 4, 8 and 16.
#[test]
fn round_time_matches_the_textbook_formula() {
    let (bandwidth, latency, len) = (1e7, Duration::from_millis(5), 65_536);
    for n in [4usize, 8, 16] {
        let (locals, weights) = inputs(n as u64, n, len);
        let outcome = run(
            &locals,
            &weights,
            bandwidth,
            latency,
            Time::from_secs_f64(100.0),
            None,
        );
        let measured = outcome
            .finished_at
            .iter()
            .map(|t| t.expect("finished").as_secs_f64())
            .fold(0.0, f64::max);
        let segment_bytes = (len * 4 / n + FRAME_OVERHEAD) as f64;
        let steps = 2.0 * (n as f64 - 1.0);
        let model = steps * (segment_bytes / bandwidth + latency.as_secs_f64());
        eprintln!(
            "N = {n}: measured {:.2} ms, model {:.2} ms",
            measured * 1e3,
            model * 1e3
        );
        assert!(
            (measured - model).abs() <= 0.02 * model,
            "N = {n}: {measured} vs {model}"
        );
    }
}

/// Not fault tolerant, by design: one silent member stops the whole ring, and every other
/// member reports failure at the round deadline and none finishes.
#[test]
fn one_silent_member_stops_the_ring_until_the_deadline() {
    let (locals, weights) = inputs(8, 6, 600);
    let deadline = Time::from_secs_f64(1.0);
    let outcome = run(
        &locals,
        &weights,
        1e7,
        Duration::from_millis(1),
        deadline,
        Some(3),
    );
    for m in (0..6).filter(|&m| m != 3) {
        assert!(
            outcome.finished_at[m].is_none(),
            "member {m} finished without member 3"
        );
        assert!(outcome.failed[m], "member {m} did not report the failure");
    }
}

/// What a member of a failed ring applies is no copy of its own values kept aside: each
/// segment is the weighted mean of the contributions that reached it, which are those of
/// the members before it in the ring back to where the chain broke (its own alone when
/// nothing arrived), never a weighted sum.
#[test]
fn a_failed_member_holds_each_segment_s_mean_over_the_contributions_that_reached_it() {
    let n = 6;
    let len = 600;
    let silent = 3;
    let (locals, weights) = inputs(11, n, len);
    let outcome = run(
        &locals,
        &weights,
        1e7,
        Duration::from_millis(1),
        Time::from_secs_f64(1.0),
        Some(silent),
    );
    let segment = len / n;
    // The weighted mean over members `m - k ..= m` (ring order) of elements `range`.
    let mean_back = |m: usize, k: usize, range: std::ops::Range<usize>| -> Vec<f32> {
        let members: Vec<usize> = (0..=k).map(|j| (m + n - j) % n).collect();
        let total: f32 = members.iter().map(|&i| weights[i]).sum();
        range
            .map(|e| {
                members
                    .iter()
                    .map(|&i| weights[i] * locals[i][e])
                    .sum::<f32>()
                    / total
            })
            .collect()
    };
    let close = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-4 * (1.0 + y.abs()))
    };
    let mut reached_more_than_itself = 0;
    for m in (0..n).filter(|&m| m != silent) {
        assert!(outcome.failed[m], "member {m} did not fail");
        let result = &outcome.results[m];
        assert_eq!(result.len(), len);
        for s in 0..n {
            let range = s * segment..(s + 1) * segment;
            let got = &result[range.clone()];
            let k = (0..n).find(|&k| close(got, &mean_back(m, k, range.clone())));
            let k = k.unwrap_or_else(|| {
                panic!("member {m}'s segment {s} is no mean of the members before it")
            });
            if k > 0 {
                reached_more_than_itself += 1;
            }
            if m == (silent + 1) % n {
                assert_eq!(k, 0, "nothing reaches the silent member's successor");
            }
        }
    }
    assert!(reached_more_than_itself > 0, "no partial sum was averaged");
}
