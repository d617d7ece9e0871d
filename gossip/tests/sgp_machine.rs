//! The SGP state machine, input by input: hand-offs, joins, overlap, bad shares, returns,
//! refusals.

use std::time::Duration;

use murmur_gossip::Time;
use murmur_gossip::sgp::{
    FRESH_REFERENCE, SgpConfig, SgpError, SgpInput, SgpOutput, SgpPeer, ShareHeader,
};
use murmur_protocol::codec::CodecSpec;
use murmur_protocol::message::ShareOutcome;

const T0: Time = Time::ZERO;

fn outputs(peer: &mut SgpPeer<u32>) -> Vec<SgpOutput<u32>> {
    std::iter::from_fn(|| peer.poll_output()).collect()
}

/// The shares among `outputs`, as (receiver, header, payload).
fn shares(outputs: &[SgpOutput<u32>]) -> Vec<(u32, ShareHeader, Vec<u8>)> {
    outputs
        .iter()
        .filter_map(|output| match output {
            SgpOutput::SendShare {
                to,
                header,
                payload,
            } => Some((*to, *header, payload.clone())),
            _ => None,
        })
        .collect()
}

fn starts(outputs: &[SgpOutput<u32>]) -> Vec<u64> {
    outputs
        .iter()
        .filter_map(|output| match output {
            SgpOutput::StartStep { step } => Some(*step),
            _ => None,
        })
        .collect()
}

fn peer(me: u32, members: u32, values: &[f32], config: SgpConfig) -> SgpPeer<u32> {
    SgpPeer::new(me, 0..members, values.to_vec(), config).expect("valid config")
}

/// Runs one local step of `peer` and returns the share it pushed.
fn step(peer: &mut SgpPeer<u32>) -> (u32, ShareHeader, Vec<u8>) {
    outputs(peer);
    peer.handle(T0, SgpInput::LocalStepDone).expect("step");
    let mut sent = shares(&outputs(peer));
    assert_eq!(sent.len(), 1);
    sent.remove(0)
}

/// Runs one local step of `peer` whose share the transport then reports delivered and its
/// receiver (which this test does not run) acknowledges; returns the receiver.
fn step_delivered(peer: &mut SgpPeer<u32>) -> u32 {
    let (to, header, payload) = step(peer);
    settle(peer, to, header, &payload);
    to
}

/// The transport reports `header`'s share to `to` (sent as `payload`) written, and `to`
/// says it applied it.
fn settle(peer: &mut SgpPeer<u32>, to: u32, header: ShareHeader, payload: &[u8]) {
    written(peer, to, header, payload);
    receipt(peer, to, header.step, ShareOutcome::Applied);
}

/// The transport reports `header`'s share to `to`, sent as `payload`, written.
fn written(peer: &mut SgpPeer<u32>, to: u32, header: ShareHeader, payload: &[u8]) {
    peer.delivered(T0, to, header.seq, payload.to_vec())
        .expect("written");
}

fn receipt(peer: &mut SgpPeer<u32>, from: u32, step: u64, outcome: ShareOutcome) {
    let input = SgpInput::ReceiptReceived {
        from,
        step,
        outcome,
    };
    peer.handle(T0, input).expect("receipt");
}

#[test]
fn a_step_keeps_half_and_pushes_half_to_the_next_power_of_two() {
    let mut a = peer(0, 8, &[2.0, -4.0], SgpConfig::default());
    assert_eq!(starts(&outputs(&mut a)), [0]);
    let targets: Vec<u32> = (0..4).map(|_| step_delivered(&mut a)).collect();
    assert_eq!(targets, [1, 2, 4, 1]);
    assert_eq!(a.state().weight(), 1.0 / 16.0);
    assert_eq!(a.state().numerator(), [2.0 / 16.0, -4.0 / 16.0]);
}

#[test]
fn shares_move_mass_exactly_and_z_is_the_weighted_average() {
    let mut a = peer(0, 2, &[1.0, 3.0], SgpConfig::default());
    let mut b = peer(1, 2, &[5.0, -1.0], SgpConfig::default());
    let (to, header, payload) = step(&mut a);
    assert_eq!(to, 1);
    b.handle(
        T0,
        SgpInput::ShareReceived {
            from: 0,
            header,
            payload: &payload,
        },
    )
    .expect("share");
    assert_eq!(a.state().weight() + b.state().weight(), 2.0);
    let mut z = [0.0; 2];
    b.debiased_into(&mut z).expect("mass");
    // b holds (x_b + x_a / 2) / (1 + 1/2).
    assert_eq!(z, [(5.0 + 0.5) / 1.5, (-1.0 + 1.5) / 1.5]);
}

#[test]
fn overlap_bound_tau_gates_the_next_step_on_own_unconfirmed_shares() {
    let tau0 = SgpConfig {
        staleness: 0,
        ..SgpConfig::default()
    };
    let mut a = peer(0, 4, &[1.0], tau0);
    let (to, header, payload) = step(&mut a);
    assert!(
        starts(&outputs(&mut a)).is_empty(),
        "τ = 0 waits for delivery"
    );
    a.delivered(T0, to, header.seq, payload).expect("written");
    assert_eq!(starts(&outputs(&mut a)), [1]);

    let mut b = peer(0, 4, &[1.0], SgpConfig::default());
    outputs(&mut b);
    b.handle(T0, SgpInput::LocalStepDone).expect("step 0");
    let first = shares(&outputs(&mut b)).remove(0);
    assert_eq!(b.steps_done(), 1);
    assert!(b.is_computing(), "τ = 1 overlaps one step");
    b.handle(T0, SgpInput::LocalStepDone).expect("step 1");
    assert!(!b.is_computing(), "step 2 must wait for step 0's share");
    // The deadline passes: the peer stops waiting and moves on.
    let deadline = b.poll_timeout().expect("a share is in flight");
    assert_eq!(deadline, T0 + Duration::from_millis(30_000));
    assert_eq!(first.1.step, 0);
    b.handle(deadline, SgpInput::Tick).expect("tick");
    assert!(b.is_computing());
    assert_eq!(b.stats().shares_timed_out, 2);
}

#[test]
fn a_joiner_trains_only_once_a_share_gave_it_mass() {
    let mut joiner = SgpPeer::joining(9u32, [0, 1], 2, SgpConfig::default()).expect("config");
    assert!(outputs(&mut joiner).is_empty());
    assert_eq!(joiner.debiased_into(&mut [0.0; 2]), Err(SgpError::NoMass));
    let mut sponsor = peer(0, 2, &[4.0, 8.0], SgpConfig::default());
    let (_, header, payload) = step(&mut sponsor);
    joiner
        .handle(
            T0,
            SgpInput::ShareReceived {
                from: 0,
                header,
                payload: &payload,
            },
        )
        .expect("share");
    assert_eq!(starts(&outputs(&mut joiner)), [0]);
    let mut z = [0.0; 2];
    joiner.debiased_into(&mut z).expect("mass");
    assert_eq!(z, [4.0, 8.0]);
}

#[test]
fn a_graceful_leave_hands_all_mass_to_the_successor_and_forwards_late_shares_one_hand_off_at_a_time()
 {
    let mut leaver = peer(1, 3, &[3.0, 6.0], SgpConfig::default());
    outputs(&mut leaver);
    leaver.handle(T0, SgpInput::Leave).expect("leave");
    let handed = shares(&outputs(&mut leaver));
    assert_eq!(handed.len(), 1);
    let (heir, header, handoff) = handed[0].clone();
    assert_eq!(heir, 2);
    assert_eq!(header.weight, 1.0);
    assert_eq!(leaver.state().weight(), 0.0);
    assert!(leaver.numerator_mut().is_none());

    // A share still on its way to the leaver is passed on, whole.
    let mut other = peer(0, 3, &[1.0, 1.0], SgpConfig::default());
    let (_, late, payload) = step(&mut other);
    leaver
        .handle(
            T0,
            SgpInput::ShareReceived {
                from: 0,
                header: late,
                payload: &payload,
            },
        )
        .expect("late share");
    // Passed on once the transport has written the first hand-off: one at a time.
    assert!(shares(&outputs(&mut leaver)).is_empty());
    written(&mut leaver, heir, header, &handoff);
    let forwarded = shares(&outputs(&mut leaver));
    assert_eq!(forwarded.len(), 1);
    assert_eq!((forwarded[0].0, forwarded[0].1.weight), (2, late.weight));

    assert_ne!(
        header.step, forwarded[0].1.step,
        "each hand-off has its own step"
    );
    receipt(&mut leaver, heir, header.step, ShareOutcome::Applied);
    assert!(!leaver.has_departed());
    settle(&mut leaver, forwarded[0].0, forwarded[0].1, &forwarded[0].2);
    assert_eq!(outputs(&mut leaver), [SgpOutput::Departed]);
    assert!(leaver.has_departed());
}

#[test]
fn a_returned_share_is_taken_back_and_its_receiver_dropped() {
    let mut a = peer(0, 4, &[2.0], SgpConfig::default());
    let (to, header, payload) = step(&mut a);
    a.handle(
        T0,
        SgpInput::ShareReturned {
            to,
            header,
            payload: &payload,
            receiver_gone: true,
        },
    )
    .expect("returned");
    assert_eq!(a.state().weight(), 1.0);
    assert_eq!(a.state().numerator(), [2.0]);
    assert!(!a.view().contains(to));
    assert_eq!(a.shares_in_flight(), 0);
}

#[test]
fn malformed_shares_are_refused_and_change_nothing() {
    let mut a = peer(0, 2, &[1.0, 1.0], SgpConfig::default());
    let before = a.state().clone();
    let header = ShareHeader {
        seq: 0,
        step: 0,
        weight: 0.5,
        reference: None,
        codec: CodecSpec::F32,
    };
    let nan = [f32::NAN.to_le_bytes(), 1.0f32.to_le_bytes()].concat();
    let cases: [(ShareHeader, Vec<u8>); 4] = [
        (header, vec![0; 7]),
        (header, nan),
        (
            ShareHeader {
                weight: -1.0,
                ..header
            },
            vec![0; 8],
        ),
        (
            ShareHeader {
                weight: f64::INFINITY,
                ..header
            },
            vec![0; 8],
        ),
    ];
    for (header, payload) in cases {
        let input = SgpInput::ShareReceived {
            from: 1,
            header,
            payload: &payload,
        };
        let error = a.handle(T0, input).expect_err("malformed share");
        assert!(!error.returns_share(), "{error}");
        assert_eq!(a.state(), &before);
    }
    assert_eq!(a.stats().shares_rejected, 4);
}

#[test]
fn a_quantized_share_without_a_matching_reference_goes_back_to_its_sender() {
    let config = SgpConfig {
        share_codec: CodecSpec::Int8 { block: 64 },
        ..SgpConfig::default()
    };
    let values: Vec<f32> = (0..100).map(|i| i as f32 * 0.1).collect();
    let mut a = peer(0, 2, &values, config.clone());
    let mut b = peer(1, 2, &[0.0; 100], config.clone());

    // The first share on an edge quantizes the parameters themselves (a deviation from the
    // zero reference both ends start from) and sets both ends' reference.
    let (_, first, payload) = step(&mut a);
    assert_eq!(
        (first.reference, first.codec),
        (Some(FRESH_REFERENCE), config.share_codec)
    );
    assert!(payload.len() < 100 * 4 / 2, "not an f32 copy");
    let input = SgpInput::ShareReceived {
        from: 0,
        header: first,
        payload: &payload,
    };
    b.handle(T0, input).expect("first share");
    settle(&mut a, 1, first, &payload);
    // Its quantization error stayed in `a`'s numerator: `a` now stands at `values` plus it.
    let mut settled = vec![0.0; 100];
    a.debiased_into(&mut settled).expect("mass");

    // The next is a quantized deviation from that reference.
    outputs(&mut a);
    let (_, second, payload) = step(&mut a);
    assert_eq!(second.reference, Some(first.step));
    assert_eq!(second.codec, config.share_codec);
    assert!(payload.len() < 100 * 4 / 2);

    // A peer that never saw the first share cannot use it, and says to return it.
    let mut stranger = peer(1, 2, &[0.0; 100], config.clone());
    let before = stranger.state().clone();
    let input = SgpInput::ShareReceived {
        from: 0,
        header: second,
        payload: &payload,
    };
    let error = stranger.handle(T0, input).expect_err("unknown reference");
    assert!(error.returns_share());
    assert_eq!(stranger.state(), &before);

    // Returned, the sender takes back exactly the weight and (to rounding) the numerator.
    let weight_before = a.state().weight();
    let numerator_before: Vec<f32> = a.state().numerator().to_vec();
    let input = SgpInput::ShareReturned {
        to: 1,
        header: second,
        payload: &payload,
        receiver_gone: false,
    };
    a.handle(T0, input).expect("returned");
    assert_eq!(a.state().weight(), weight_before + second.weight);
    let mut z = vec![0.0; 100];
    a.debiased_into(&mut z).expect("mass");
    for ((&z, &x), &v) in z.iter().zip(&numerator_before).zip(&settled) {
        assert!((z - v).abs() < 1e-5, "z {z} x {x} v {v}");
    }
    assert!(
        a.view().contains(1),
        "a refused share does not drop its receiver"
    );
}

/// A quantized peer 0 whose first share (from the zero reference) reached peer 1 and was
/// confirmed, and its de-biased parameters then: what it started from, plus that share's
/// quantization error, which stays with it.
fn quantized_sender() -> (SgpPeer<u32>, Vec<f32>) {
    let values: Vec<f32> = (0..100).map(|i| i as f32 * 0.1).collect();
    let config = int8_config();
    let mut a = peer(0, 2, &values, config.clone());
    let mut b = peer(1, 2, &[0.0; 100], config);
    let (to, first, payload) = step(&mut a);
    assert_eq!(first.reference, Some(FRESH_REFERENCE));
    let input = SgpInput::ShareReceived {
        from: 0,
        header: first,
        payload: &payload,
    };
    b.handle(T0, input).expect("first share");
    settle(&mut a, to, first, &payload);
    let mut settled = vec![0.0; values.len()];
    a.debiased_into(&mut settled).expect("mass");
    (a, settled)
}

/// A refusal of the share of `step` that `a` cannot take back: an error, and no change.
fn assert_not_taken_back(a: &mut SgpPeer<u32>, step: u64) {
    let state = a.state().clone();
    let refused = SgpInput::ShareRefused { by: 1, step };
    let error = a.handle(T0, refused).expect_err("nothing to take back");
    assert_eq!(error, SgpError::NotTakenBack { step });
    assert_eq!(a.state(), &state);
}

#[test]
fn a_share_refused_after_its_delivery_is_taken_back_and_the_next_starts_the_edge_afresh() {
    let (mut a, values) = quantized_sender();

    // A quantized share the transport delivered, to a receiver that restarted meanwhile.
    let (_, second, payload) = step(&mut a);
    assert!(second.reference.is_some());
    a.delivered(T0, 1, second.seq, payload.clone())
        .expect("written");
    let mut restarted = peer(1, 2, &[0.0; 100], int8_config());
    let input = SgpInput::ShareReceived {
        from: 0,
        header: second,
        payload: &payload,
    };
    let error = restarted.handle(T0, input).expect_err("unknown reference");
    assert!(matches!(error, SgpError::StaleReference { .. }), "{error}");

    // Its refusal gives the mass back: the weight exactly, the numerator to rounding.
    let weight_before = a.state().weight();
    let refused = SgpInput::ShareRefused {
        by: 1,
        step: second.step,
    };
    a.handle(T0, refused).expect("taken back");
    assert_eq!(a.state().weight(), weight_before + second.weight);
    let mut z = vec![0.0; 100];
    a.debiased_into(&mut z).expect("mass");
    for (&z, &v) in z.iter().zip(&values) {
        assert!((z - v).abs() < 1e-5, "z {z} v {v}");
    }
    assert_eq!(a.stats().shares_returned, 1);

    // A second notice of the same share finds nothing to take back and changes nothing.
    assert_not_taken_back(&mut a, second.step);

    // The edge was forgotten: the next share starts it again from zero, and the restarted
    // peer takes it.
    let (_, third, payload) = step(&mut a);
    assert_eq!(
        (third.reference, third.codec),
        (Some(FRESH_REFERENCE), int8_config().share_codec)
    );
    let input = SgpInput::ShareReceived {
        from: 0,
        header: third,
        payload: &payload,
    };
    restarted.handle(T0, input).expect("a fresh edge's share");
}

/// A share its receiver applied can no longer be taken back: its payload is folded into
/// the edge's reference then and freed, not kept until the next share, and a refusal of it
/// afterwards takes nothing back.
#[test]
fn an_applied_share_is_folded_into_its_reference_and_its_payload_freed() {
    let (mut a, _) = quantized_sender();
    let reference = a.edge_bytes();
    assert!(reference > 0);
    let (to, second, payload) = step(&mut a);
    assert_eq!(
        a.edge_bytes(),
        reference + payload.len(),
        "an unconfirmed share's payload is kept to take it back"
    );
    settle(&mut a, to, second, &payload);
    assert_eq!(
        a.edge_bytes(),
        reference,
        "the applied share's payload was kept"
    );
    assert_not_taken_back(&mut a, second.step);
}

#[test]
fn a_refusal_before_the_delivery_report_takes_the_share_back_once() {
    let (mut a, _) = quantized_sender();
    let (_, second, _) = step(&mut a);
    assert_eq!(a.shares_in_flight(), 1);
    let weight_before = a.state().weight();
    let refused = SgpInput::ShareRefused {
        by: 1,
        step: second.step,
    };
    a.handle(T0, refused).expect("taken back");
    assert_eq!(a.shares_in_flight(), 0, "no longer waited for");
    assert_eq!(a.state().weight(), weight_before + second.weight);
    // The transport's report comes later and changes nothing.
    let state = a.state().clone();
    a.delivered(T0, 1, second.seq, Vec::new()).expect("written");
    assert_eq!(a.state(), &state);
}

#[test]
fn a_refusal_of_a_share_a_later_one_replaced_is_not_taken_back() {
    let (mut a, _) = quantized_sender();
    let (_, second, payload) = step(&mut a);
    settle(&mut a, 1, second, &payload);
    let (_, third, _) = step(&mut a);
    assert_eq!(third.reference, Some(second.step));
    // The edge's reference is now the third share's: the second's value is gone.
    assert_not_taken_back(&mut a, second.step);
    let state = a.state().clone();
    // The third one's refusal still takes it back.
    let refused = SgpInput::ShareRefused {
        by: 1,
        step: third.step,
    };
    a.handle(T0, refused).expect("taken back");
    assert_eq!(a.state().weight(), state.weight() + third.weight);
}

fn int8_config() -> SgpConfig {
    SgpConfig {
        share_codec: CodecSpec::Int8 { block: 64 },
        ..SgpConfig::default()
    }
}

#[test]
fn a_peer_whose_shares_are_all_lost_keeps_its_parameters_past_f32_underflow() {
    // Every share is delivered to nobody (its receiver crashed with it): each step halves
    // the weight, and 300 halvings take x = w·z far below the smallest f32. Renormalizing
    // keeps z exact.
    let values = [0.75f32, -3.0, 1e-3];
    let mut a = peer(0, 2, &values, SgpConfig::default());
    for _ in 0..300 {
        step_delivered(&mut a);
    }
    assert!(a.state().weight() >= murmur_gossip::sgp::MIN_WEIGHT / 2.0);
    let mut z = [0f32; 3];
    a.debiased_into(&mut z).expect("mass");
    assert_eq!(z, values);
}

/// The cancel requests among `outputs`, as (receiver, step).
fn cancels(outputs: &[SgpOutput<u32>]) -> Vec<(u32, u64)> {
    outputs
        .iter()
        .filter_map(|output| match output {
            SgpOutput::Cancel { to, step } => Some((*to, *step)),
            _ => None,
        })
        .collect()
}

/// The receipts among `outputs`, as (sender, step, outcome).
fn receipts(outputs: &[SgpOutput<u32>]) -> Vec<(u32, u64, ShareOutcome)> {
    outputs
        .iter()
        .filter_map(|output| match output {
            SgpOutput::Receipt { to, step, outcome } => Some((*to, *step, *outcome)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_written_share_its_receiver_never_applied_is_cancelled_then_taken_back_once() {
    let mut a = peer(0, 2, &[1.0, 3.0], SgpConfig::default());
    let mut b = peer(1, 2, &[5.0, -1.0], SgpConfig::default());
    let (to, header, payload) = step(&mut a);
    written(&mut a, to, header, &payload);
    assert_eq!(a.state().weight(), 0.5);
    // No receipt by the deadline: a asks b, again every timeout while b says nothing.
    let deadline = a.poll_timeout().expect("waits for a receipt");
    a.handle(deadline, SgpInput::Tick).expect("tick");
    assert_eq!(cancels(&outputs(&mut a)), [(1, header.step)]);
    let again = a.poll_timeout().expect("still waits");
    assert!(again > deadline);
    a.handle(again, SgpInput::Tick).expect("tick");
    assert_eq!(cancels(&outputs(&mut a)), [(1, header.step)]);
    assert_eq!(a.stats().cancels_sent, 2);

    // b never had the share (its connection closed with the bytes in a buffer): it says
    // so, and will not apply the share if it turns up after all.
    outputs(&mut b);
    let ask = SgpInput::CancelAsked {
        from: 0,
        step: header.step,
    };
    b.handle(T0, ask).expect("cancel");
    assert_eq!(
        receipts(&outputs(&mut b)),
        [(0, header.step, ShareOutcome::Cancelled)]
    );
    let late = SgpInput::ShareReceived {
        from: 0,
        header,
        payload: &payload,
    };
    let error = b.handle(T0, late).expect_err("cancelled");
    assert_eq!(error, SgpError::Cancelled { step: header.step });
    assert_eq!(b.state().weight(), 1.0);

    // a takes the mass back exactly, once; the swarm's mass is whole.
    receipt(&mut a, 1, header.step, ShareOutcome::Cancelled);
    assert_eq!(a.state().weight(), 1.0);
    assert_eq!(a.state().numerator(), [1.0, 3.0]);
    assert_eq!(a.shares_in_flight(), 0);
    assert_eq!(a.stats().shares_cancelled, 1);
    receipt(&mut a, 1, header.step, ShareOutcome::Cancelled);
    assert_eq!(a.state().weight(), 1.0);
}

#[test]
fn a_cancel_for_an_applied_share_is_answered_applied_and_moves_nothing() {
    let mut a = peer(0, 2, &[1.0, 3.0], SgpConfig::default());
    let mut b = peer(1, 2, &[5.0, -1.0], SgpConfig::default());
    let (to, header, payload) = step(&mut a);
    let share = SgpInput::ShareReceived {
        from: 0,
        header,
        payload: &payload,
    };
    b.handle(T0, share).expect("applied");
    // b's receipt is lost with its connection.
    assert_eq!(
        receipts(&outputs(&mut b)),
        [(0, header.step, ShareOutcome::Applied)]
    );
    written(&mut a, to, header, &payload);
    let deadline = a.poll_timeout().expect("waits for a receipt");
    a.handle(deadline, SgpInput::Tick).expect("tick");
    assert_eq!(cancels(&outputs(&mut a)), [(1, header.step)]);
    let ask = SgpInput::CancelAsked {
        from: 0,
        step: header.step,
    };
    b.handle(T0, ask).expect("cancel");
    let answer = receipts(&outputs(&mut b));
    assert_eq!(answer, [(0, header.step, ShareOutcome::Applied)]);
    receipt(&mut a, 1, header.step, ShareOutcome::Applied);
    assert_eq!(a.shares_in_flight(), 0);
    assert_eq!(a.state().weight() + b.state().weight(), 2.0);
    assert_eq!(a.stats().shares_acknowledged, 1);
}

#[test]
fn an_unacknowledged_quantized_share_is_taken_back_from_its_edge_after_a_cancel() {
    let (mut a, values) = quantized_sender();
    let (_, second, payload) = step(&mut a);
    assert!(second.reference.is_some());
    written(&mut a, 1, second, &payload);
    // The edge waits for the receipt: the next step keeps its share.
    outputs(&mut a);
    assert_eq!(a.stats().shares_held, 0);
    a.handle(T0, SgpInput::LocalStepDone).expect("step");
    assert!(shares(&outputs(&mut a)).is_empty());
    assert_eq!(a.stats().shares_held, 1, "the kept share is counted");
    assert_eq!(a.unsettled(), 1);
    let weight_before = a.state().weight();
    receipt(&mut a, 1, second.step, ShareOutcome::Cancelled);
    assert_eq!(a.state().weight(), weight_before + second.weight);
    let mut z = vec![0.0; 100];
    a.debiased_into(&mut z).expect("mass");
    for (&z, &v) in z.iter().zip(&values) {
        assert!((z - v).abs() < 1e-5, "z {z} v {v}");
    }
    // The edge was forgotten with it: the next share starts it again from zero.
    let (_, next, _) = step(&mut a);
    assert_eq!(
        (next.reference, next.codec),
        (Some(FRESH_REFERENCE), int8_config().share_codec)
    );
}

#[test]
fn a_receiver_out_of_the_view_is_asked_once_back_and_never_answered_for() {
    let mut a = peer(0, 2, &[2.0], SgpConfig::default());
    let (to, header, payload) = step(&mut a);
    written(&mut a, to, header, &payload);
    // Given up as silent: it may be frozen with the share applied, so nothing comes back.
    a.handle(T0, SgpInput::PeerCrashed(1)).expect("crashed");
    let deadline = a.poll_timeout().expect("waits");
    a.handle(deadline, SgpInput::Tick).expect("tick");
    assert!(cancels(&outputs(&mut a)).is_empty(), "nobody to ask");
    assert_eq!(a.state().weight(), 0.5);
    assert_eq!(a.shares_in_flight(), 1);
    // Back in the view, it is asked at once, and its answer settles the share.
    let back = deadline + Duration::from_millis(1);
    a.handle(back, SgpInput::PeerJoined(1)).expect("joined");
    assert_eq!(a.poll_timeout(), Some(back));
    a.handle(back, SgpInput::Tick).expect("tick");
    assert_eq!(cancels(&outputs(&mut a)), [(1, header.step)]);
    receipt(&mut a, 1, header.step, ShareOutcome::Cancelled);
    assert_eq!(a.state().weight(), 1.0);
    assert_eq!(a.state().numerator(), [2.0]);
}

#[test]
fn a_share_cancelled_before_the_transport_reports_it_is_taken_back_from_its_payload() {
    let mut a = peer(0, 2, &[2.0], SgpConfig::default());
    let (to, header, payload) = step(&mut a);
    // Its receiver is given up before the transport reports the share: the share counts
    // as written, and is waited for.
    a.handle(T0, SgpInput::PeerCrashed(to)).expect("crashed");
    let deadline = a.poll_timeout().expect("waits");
    a.handle(deadline, SgpInput::Tick).expect("tick");
    // Back, it is asked, and promises never to apply it, before the transport's report.
    let back = deadline + Duration::from_millis(1);
    a.handle(back, SgpInput::PeerJoined(to)).expect("joined");
    a.handle(back, SgpInput::Tick).expect("tick");
    assert_eq!(cancels(&outputs(&mut a)), [(to, header.step)]);
    receipt(&mut a, to, header.step, ShareOutcome::Cancelled);
    assert_eq!(a.state().weight(), 0.5, "nothing to take it back from yet");
    assert_eq!(a.shares_in_flight(), 1);
    // The report brings the payload, and the mass comes back from it, once (after the step
    // that holds the parameters meanwhile gives them back).
    let z = a.lend_parameters().expect("the next step started");
    a.delivered(back, to, header.seq, payload)
        .expect("kept for the parameters' return");
    assert_eq!(a.state().weight(), 0.5, "not while the parameters are lent");
    a.return_parameters(back, z).expect("returned");
    assert_eq!(a.state().weight(), 1.0);
    assert_eq!(a.state().numerator(), [2.0]);
    assert_eq!(a.shares_in_flight(), 0);
    assert_eq!(a.stats().shares_cancelled, 1);
    receipt(&mut a, to, header.step, ShareOutcome::Cancelled);
    assert_eq!(a.state().weight(), 1.0);
}

#[test]
fn a_receiver_that_never_returns_has_its_share_given_up_not_taken_back() {
    let mut a = peer(0, 2, &[2.0], SgpConfig::default());
    let (to, header, payload) = step(&mut a);
    written(&mut a, to, header, &payload);
    a.handle(T0, SgpInput::PeerCrashed(1)).expect("crashed");
    let mut ticks = 0;
    while let Some(at) = a.poll_timeout() {
        a.handle(at, SgpInput::Tick).expect("tick");
        ticks += 1;
        assert!(
            ticks <= murmur_gossip::sgp::GIVE_UP_AFTER + 1,
            "never given up"
        );
    }
    assert_eq!(ticks, murmur_gossip::sgp::GIVE_UP_AFTER + 1);
    assert_eq!(a.stats().shares_abandoned, 1);
    assert_eq!(
        a.state().weight(),
        0.5,
        "lost with the receiver, never doubled"
    );
    assert!(cancels(&outputs(&mut a)).is_empty());
}

#[test]
fn an_exact_edge_carries_at_most_four_unacknowledged_shares() {
    let config = SgpConfig {
        staleness: 0,
        ..SgpConfig::default()
    };
    let mut a = peer(0, 2, &[1.0], config);
    for expected in 0..4 {
        let (to, header, payload) = step(&mut a);
        assert_eq!(header.step, expected);
        written(&mut a, to, header, &payload);
    }
    let weight = a.state().weight();
    outputs(&mut a);
    a.handle(T0, SgpInput::LocalStepDone).expect("step");
    assert!(shares(&outputs(&mut a)).is_empty(), "the fifth waits");
    assert_eq!(a.state().weight(), weight);
    assert_eq!((a.stats().shares_held, a.unsettled()), (1, 4));
    receipt(&mut a, 1, 0, ShareOutcome::Applied);
    assert_eq!(a.unsettled(), 3);
    let (_, header, _) = step(&mut a);
    assert_eq!(header.step, 5);
    assert_eq!(a.stats().shares_held, 1);
}

/// An heir too busy to read its streams made a leaver hand it the whole state hundreds of
/// times a second: each hand-off came back at once and went straight out again. Now the
/// mass waits, longer after each return in a row, and none of it is lost.
#[test]
fn a_hand_off_that_comes_back_goes_out_again_after_a_growing_wait() {
    use murmur_gossip::sgp::{HANDOFF_RETRY_FIRST, HANDOFF_RETRY_MAX};

    let mut leaver = peer(1, 3, &[3.0, 6.0], SgpConfig::default());
    outputs(&mut leaver);
    leaver.handle(T0, SgpInput::Leave).expect("leave");
    let mut now = T0;
    let mut wait = HANDOFF_RETRY_FIRST;
    let mut handed = shares(&outputs(&mut leaver));
    for round in 0..8 {
        assert_eq!(handed.len(), 1, "round {round}: one hand-off");
        let (heir, header, payload) = handed.remove(0);
        assert_eq!((heir, header.weight), (2, 1.0));
        let returned = SgpInput::ShareReturned {
            to: heir,
            header,
            payload: &payload,
            receiver_gone: false,
        };
        leaver.handle(now, returned).expect("returned");
        assert_eq!(
            leaver.state().weight(),
            1.0,
            "round {round}: the mass is back"
        );
        assert_eq!(leaver.state().numerator(), [3.0, 6.0]);
        assert!(shares(&outputs(&mut leaver)).is_empty(), "not at once");
        assert_eq!(leaver.poll_timeout(), Some(now + wait), "round {round}");
        // A tick before the wait is over sends nothing.
        let early = now + wait / 2;
        leaver.handle(early, SgpInput::Tick).expect("tick");
        assert!(shares(&outputs(&mut leaver)).is_empty());
        now = now + wait;
        leaver.handle(now, SgpInput::Tick).expect("tick");
        handed = shares(&outputs(&mut leaver));
        wait = (wait * 2).min(HANDOFF_RETRY_MAX);
    }
    assert_eq!(wait, HANDOFF_RETRY_MAX, "the wait stops growing");

    // This time the heir takes it, and the leaver departs with nothing left.
    let (heir, header, handoff) = handed.remove(0);
    settle(&mut leaver, heir, header, &handoff);
    assert_eq!(leaver.state().weight(), 0.0);
    assert_eq!(outputs(&mut leaver), [SgpOutput::Departed]);
}

/// Spare payload buffers kept at most three shares' worth of bytes, and none larger than
/// one share: an exact first share or a hand-off, four times an int8 share, used to stay
/// in the pool and be reused for int8 shares, up to eight of them.
#[test]
fn spare_buffers_hold_at_most_three_shares_and_none_larger_than_one() {
    let len = 4096;
    let mut a = SgpPeer::new(0, 0..4, vec![1.0; len], int8_config()).expect("valid config");
    let share = murmur_protocol::codec::Codec::new(CodecSpec::Int8 { block: 64 })
        .expect("codec")
        .max_encoded_len(len);
    // An exact share's buffer is freed, not kept.
    a.recycle(Vec::with_capacity(4 * len));
    assert_eq!(
        a.spare_buffer().capacity(),
        0,
        "an f32-sized buffer was kept"
    );
    // Share-sized buffers are kept up to three shares' worth.
    for _ in 0..8 {
        a.recycle(Vec::with_capacity(share));
    }
    let mut kept = 0;
    while a.spare_buffer().capacity() > 0 {
        kept += 1;
        assert!(kept <= 8, "the pool never empties");
    }
    assert_eq!(kept, 3);
}

/// A model whose shares are larger than the pool's byte cap keeps no spare buffer: three
/// int8 shares of 80M parameters would hold 255 MB through every step.
#[test]
fn shares_larger_than_the_pools_cap_are_not_kept() {
    let len = 80_000_000;
    // Zeroed by the allocator, the state costs no memory until it is written.
    let mut a = SgpPeer::new(0, 0..4, vec![0.0; len], int8_config()).expect("valid config");
    let share = murmur_protocol::codec::Codec::new(CodecSpec::Int8 { block: 64 })
        .expect("codec")
        .max_encoded_len(len);
    assert!(share > 64 << 20);
    a.recycle(Vec::with_capacity(share));
    assert_eq!(
        a.spare_buffer().capacity(),
        0,
        "a share-sized buffer was kept"
    );
    // Smaller buffers (pieces) still are.
    a.recycle(Vec::with_capacity(1 << 20));
    assert_eq!(a.spare_buffer().capacity(), 1 << 20);
}

/// Edge references are bounded by bytes as well as by count: a pair of references (16
/// bits an element and a scale per 64) and the out-edge's last share per edge, and one
/// edge each way whatever the budget (every edge in use needs its reference).
#[test]
fn the_reference_budget_bounds_the_edges_by_the_model_s_size() {
    let config = SgpConfig {
        max_edge_references: 8,
        max_reference_bytes: 3 << 20,
        ..int8_config()
    };
    let len = 1 << 17;
    let share = murmur_protocol::codec::Codec::new(CodecSpec::Int8 { block: 64 })
        .expect("codec")
        .max_encoded_len(len);
    let pair = 2 * (2 * len + len / 64 * 4) + share;
    assert_eq!(config.edge_pair_bytes(len), pair as u64);
    // A pair of 2^17 elements is 0.65 MiB: four fit in 3 MiB.
    assert_eq!(config.edge_capacity(len), 4);
    assert_eq!(4, (3 << 20) / pair);
    // A small model: the count bound.
    assert_eq!(config.edge_capacity(1024), 8);
    // A pair of 2^20 elements is over 3 MiB: none fits, one is kept.
    assert_eq!(config.edge_capacity(1 << 20), 1);
    let tiny = SgpConfig {
        max_reference_bytes: 1000,
        ..int8_config()
    };
    assert!(matches!(
        tiny.validate(),
        Err(SgpError::InvalidConfig {
            key: "max_reference_bytes",
            ..
        })
    ));
}

/// A share longer than the pieces it is checked in (65,536 elements) whose last block is
/// bad is refused before any piece moves the receiver's reference: the good share after it
/// still moves exactly the mass its sender gave up.
#[test]
fn a_long_quantized_share_with_a_bad_last_block_is_refused_before_any_piece_applies() {
    const LEN: usize = 2 * 65_536 + 100;
    let config = int8_config();
    let values_a: Vec<f32> = (0..LEN).map(|k| (k as f32 * 0.01).sin()).collect();
    let values_b: Vec<f32> = (0..LEN).map(|k| 2.0 * (k as f32 * 0.013).cos()).collect();
    let mut a = SgpPeer::new(0, 0..2, values_a.clone(), config.clone()).expect("config");
    let mut b = SgpPeer::new(1, 0..2, values_b.clone(), config).expect("config");
    // The first shares each way start their edges from zero; each end takes the other's.
    let (_, a0, a0_payload) = step(&mut a);
    let (_, b0, b0_payload) = step(&mut b);
    fn received(from: u32, header: ShareHeader, payload: &[u8]) -> SgpInput<'_, u32> {
        SgpInput::ShareReceived {
            from,
            header,
            payload,
        }
    }
    b.handle(T0, received(0, a0, &a0_payload)).expect("first");
    a.handle(T0, received(1, b0, &b0_payload)).expect("first");
    settle(&mut a, 1, a0, &a0_payload);
    settle(&mut b, 0, b0, &b0_payload);
    // `a` moved towards `b`: its next share quantizes a deviation from the reference.
    let (_, a1, payload) = step(&mut a);
    assert!(a1.reference.is_some());
    let blocks = LEN.div_ceil(64);
    let mut bad = payload.clone();
    let last_scale = (blocks - 1) * 4;
    bad[last_scale..last_scale + 4].copy_from_slice(&(-1.0f32).to_le_bytes());
    let before = b.state().clone();
    b.handle(T0, received(0, a1, &bad))
        .expect_err("bad last block");
    assert_eq!(b.state(), &before);
    b.handle(T0, received(0, a1, &payload))
        .expect("the good share");
    // Whatever `a` gave up, `b` took: the numerators still sum to the values.
    let (xa, xb) = (a.state().numerator(), b.state().numerator());
    for k in 0..LEN {
        let total = values_a[k] + values_b[k];
        let moved = xa[k] + xb[k];
        assert!(
            (moved - total).abs() <= 1e-5,
            "element {k}: {moved} against {total}"
        );
    }
    assert!((a.state().weight() + b.state().weight() - 2.0).abs() < 1e-12);
}

/// A peer whose parameters are lent for a step acknowledges a share at once and absorbs
/// it once they come back, ending where a peer that absorbed it after its step ends; it
/// keeps at most two shares from one sender meanwhile and refuses a third (its sender
/// takes it back), and a step cannot finish before its parameters are back.
#[test]
fn shares_that_arrive_while_the_parameters_are_lent_are_acknowledged_then_absorbed() {
    let values: Vec<f32> = (0..300).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut a = peer(0, 2, &values, int8_config());
    let start: Vec<f32> = values.iter().map(|v| v * 0.5 + 1.0).collect();
    let mut b = peer(1, 2, &start, int8_config());
    let mut twin = peer(1, 2, &start, int8_config());
    outputs(&mut b);
    outputs(&mut twin);

    let mut z = b.lend_parameters().expect("a step was started");
    assert!(b.parameters_lent());
    assert_eq!(z, start, "z = x / w with w = 1");
    assert_eq!(b.lend_parameters(), Err(SgpError::Lent));
    // Two shares from a while b steps: each acknowledged at once, the mass untouched.
    let mut kept = Vec::new();
    for _ in 0..2 {
        let (to, header, payload) = step(&mut a);
        let input = SgpInput::ShareReceived {
            from: 0,
            header,
            payload: &payload,
        };
        b.handle(T0, input).expect("accepted while lent");
        assert_eq!(
            receipts(&outputs(&mut b)),
            [(0, header.step, ShareOutcome::Applied)]
        );
        assert_eq!(b.state().weight(), 1.0);
        settle(&mut a, to, header, &payload);
        kept.push((header, payload));
    }
    assert_eq!(b.stats().shares_received, 2, "counted once acknowledged");
    // A third is one too many: refused, and its sender takes it back and starts afresh.
    let (_, third, payload) = step(&mut a);
    let input = SgpInput::ShareReceived {
        from: 0,
        header: third,
        payload: &payload,
    };
    let refused = b.handle(T0, input).expect_err("a third share kept");
    assert!(refused.returns_share(), "{refused}");
    assert_eq!(
        b.handle(T0, SgpInput::LocalStepDone),
        Err(SgpError::Lent),
        "a step done before its parameters are back"
    );

    // The step moved every parameter by 0.25; the twin applies it to its numerator (w = 1)
    // and absorbs the same shares after it.
    for z in &mut z {
        *z += 0.25;
    }
    b.return_parameters(T0, z).expect("given back");
    twin.numerator_mut()
        .expect("mass")
        .iter_mut()
        .for_each(|x| *x += 0.25);
    for (header, payload) in &kept {
        let input = SgpInput::ShareReceived {
            from: 0,
            header: *header,
            payload,
        };
        twin.handle(T0, input).expect("absorbed");
    }
    assert!(!b.parameters_lent());
    assert_eq!(
        b.state(),
        twin.state(),
        "the kept shares were absorbed as they came"
    );
    assert_eq!(b.stats().shares_received, 2);
    b.handle(T0, SgpInput::LocalStepDone)
        .expect("the step ends");
}

#[test]
fn a_leaver_computes_its_final_parameters_from_its_hand_off_as_it_would_from_its_numerator() {
    let mut a = peer(0, 2, &[1.0 / 3.0, 7.3, -2.9e-7], SgpConfig::default());
    let (to, header, payload) = step(&mut a);
    settle(&mut a, to, header, &payload);
    assert_eq!(a.state().weight(), 0.5);
    let mut expected = vec![0.0; 3];
    a.debiased_into(&mut expected).expect("mass");
    let z = a
        .leave_with_parameters(T0)
        .expect("leave")
        .expect("it held mass");
    assert_eq!(
        z.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        expected.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let handed = shares(&outputs(&mut a));
    assert_eq!(handed.len(), 1, "the hand-off");
    assert_eq!(handed[0].1.weight, 0.5);
    assert_eq!(a.state().weight(), 0.0);

    // Alone, a peer keeps its mass and gives its parameters all the same.
    let mut alone = peer(0, 1, &[4.0, -1.5], SgpConfig::default());
    outputs(&mut alone);
    let z = alone.leave_with_parameters(T0).expect("leave");
    assert_eq!(z, Some(vec![4.0, -1.5]));
    assert!(shares(&outputs(&mut alone)).is_empty());

    // With no mass (a joiner before its first share), nothing.
    let mut joiner = SgpPeer::joining(1, 0..2, 2, SgpConfig::default()).expect("config");
    assert_eq!(joiner.leave_with_parameters(T0).expect("leave"), None);
}
