//! Properties of the delay line: delays add per link crossed, order within a flow is kept,
//! losses follow the configured probability, and the queue bound holds.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::delay_line::{Admission, DelayLine, DelayLineError, LinkImpairment};

fn link(third_octet: u8, delay_ms: u64, loss: f64) -> LinkImpairment {
    LinkImpairment {
        subnet: format!("10.77.{third_octet}.0/24")
            .parse()
            .expect("valid subnet"),
        delay: Duration::from_millis(delay_ms),
        loss,
    }
}

fn packet(source: Ipv4Addr, destination: Ipv4Addr, tag: u8) -> [u8; 40] {
    let mut bytes = [0u8; 40];
    bytes[0] = 0x45;
    bytes[12..16].copy_from_slice(&source.octets());
    bytes[16..20].copy_from_slice(&destination.octets());
    bytes[39] = tag;
    bytes
}

const A: Ipv4Addr = Ipv4Addr::new(10, 77, 1, 2);
const B: Ipv4Addr = Ipv4Addr::new(10, 77, 2, 2);
const OUTSIDE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

#[test]
fn a_packet_is_held_for_the_delays_of_both_links_it_crosses() {
    let mut line =
        DelayLine::new(vec![link(1, 20, 0.0), link(2, 5, 0.0)], 8, 1500, 1).expect("valid line");
    let start = Instant::now();
    assert_eq!(
        line.admit(&packet(A, B, 1), start),
        Admission::Held {
            release_at: start + Duration::from_millis(25)
        }
    );
    // An address on no link adds no delay.
    assert_eq!(
        line.admit(&packet(OUTSIDE, B, 2), start),
        Admission::Held {
            release_at: start + Duration::from_millis(5)
        }
    );
    assert_eq!(line.next_release(), Some(start + Duration::from_millis(5)));
    assert!(line.release_due(start + Duration::from_millis(4)).is_none());
    let early = line
        .release_due(start + Duration::from_millis(5))
        .expect("due");
    assert_eq!(early[39], 2);
    assert!(
        line.release_due(start + Duration::from_millis(24))
            .is_none()
    );
    let late = line
        .release_due(start + Duration::from_millis(25))
        .expect("due");
    assert_eq!(late[39], 1);
    assert_eq!(line.held(), 0);
    assert_eq!(line.stats().forwarded, 2);
}

#[test]
fn packets_of_one_flow_leave_in_arrival_order() {
    let mut line =
        DelayLine::new(vec![link(1, 10, 0.0), link(2, 10, 0.0)], 64, 1500, 1).expect("valid line");
    let start = Instant::now();
    for tag in 0..50u8 {
        // Arrivals closer together than any clock tick share a release time.
        let at = start + Duration::from_micros(u64::from(tag / 10));
        assert!(matches!(
            line.admit(&packet(A, B, tag), at),
            Admission::Held { .. }
        ));
    }
    let mut released = Vec::new();
    let end = start + Duration::from_secs(1);
    while let Some(bytes) = line.release_due(end) {
        released.push(bytes[39]);
    }
    assert_eq!(released, (0..50u8).collect::<Vec<_>>());
}

#[test]
fn losses_follow_the_configured_probability_per_link_crossed() {
    let mut line =
        DelayLine::new(vec![link(1, 0, 0.1), link(2, 0, 0.0)], 4, 1500, 7).expect("valid line");
    let now = Instant::now();
    let trials = 20_000u32;
    let mut lost = 0u32;
    for _ in 0..trials {
        match line.admit(&packet(A, B, 0), now) {
            Admission::Lost => lost += 1,
            Admission::Held { .. } => {
                line.release_due(now).expect("zero delay is due at once");
            }
            other => panic!("unexpected admission {other:?}"),
        }
    }
    let rate = f64::from(lost) / f64::from(trials);
    // 20 000 draws of p = 0.1: the standard deviation is 0.0021; 0.01 is nearly five of them.
    assert!(
        (rate - 0.1).abs() < 0.01,
        "loss rate {rate}, configured 0.1"
    );
    assert_eq!(line.stats().lost, u64::from(lost));
}

#[test]
fn the_same_seed_loses_the_same_packets() {
    let run = |seed| {
        let mut line = DelayLine::new(vec![link(1, 0, 0.3)], 4, 1500, seed).expect("valid line");
        let now = Instant::now();
        (0..200)
            .map(|_| {
                let lost = line.admit(&packet(A, B, 0), now) == Admission::Lost;
                while line.release_due(now).is_some() {}
                lost
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(run(11), run(11));
    assert_ne!(run(11), run(12));
}

#[test]
fn a_full_queue_drops_and_counts_and_recovers_when_drained() {
    let mut line = DelayLine::new(vec![link(1, 10, 0.0)], 3, 1500, 1).expect("valid line");
    let now = Instant::now();
    for _ in 0..3 {
        assert!(matches!(
            line.admit(&packet(A, B, 0), now),
            Admission::Held { .. }
        ));
    }
    assert_eq!(line.admit(&packet(A, B, 0), now), Admission::QueueFull);
    assert_eq!(line.stats().dropped_queue_full, 1);
    let later = now + Duration::from_millis(10);
    assert!(line.release_due(later).is_some());
    assert!(matches!(
        line.admit(&packet(A, B, 0), later),
        Admission::Held { .. }
    ));
}

#[test]
fn oversize_packets_are_dropped_not_truncated() {
    let mut line = DelayLine::new(vec![], 2, 576, 1).expect("valid line");
    assert_eq!(
        line.admit(&[0x45; 577], Instant::now()),
        Admission::Oversize
    );
    assert_eq!(line.stats().dropped_oversize, 1);
    assert_eq!(line.held(), 0);
}

#[test]
fn link_arguments_round_trip_and_bad_ones_are_refused() {
    let original = link(3, 20, 0.25);
    let text = original.to_string();
    assert_eq!(text, "10.77.3.0/24,20000,0.25");
    assert_eq!(text.parse::<LinkImpairment>(), Ok(original));
    assert!(matches!(
        "10.77.3.0/24,20000".parse::<LinkImpairment>(),
        Err(DelayLineError::LinkFields { .. })
    ));
    assert!(matches!(
        "10.77.3.0/24,20ms,0.1".parse::<LinkImpairment>(),
        Err(DelayLineError::Delay { .. })
    ));
    assert!(matches!(
        "10.77.3.0/24,20000,1.5".parse::<LinkImpairment>(),
        Err(DelayLineError::Loss { .. })
    ));
    assert!(matches!(
        DelayLine::new(vec![], 0, 1500, 1),
        Err(DelayLineError::NoCapacity)
    ));
}
