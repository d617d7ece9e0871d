//! Properties of the delay line: delays add per link crossed, order within a flow is kept,
//! losses follow the configured probability, and the queue bound holds.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::delay_line::{Admission, DelayLine, DelayLineError, LinkImpairment, SlotClass};

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

fn class(count: usize, bytes: usize) -> SlotClass {
    SlotClass { count, bytes }
}

/// `packet(A, B, tag)` led by a 10-byte header and padded to `len` bytes in all.
fn framed(len: usize, tag: u8) -> Vec<u8> {
    let mut bytes = vec![0xEE; 10];
    bytes.extend_from_slice(&packet(A, B, tag));
    bytes.resize(len, 0);
    bytes
}

#[test]
fn a_header_before_the_ip_packet_is_held_with_it_and_skipped_when_classifying() {
    let mut line = DelayLine::with_slots(
        vec![link(1, 20, 0.0), link(2, 5, 0.0)],
        &[class(4, 2048)],
        10,
        1,
    )
    .expect("valid line");
    let start = Instant::now();
    let sent = framed(100, 9);
    assert_eq!(
        line.admit(&sent, start),
        Admission::Held {
            release_at: start + Duration::from_millis(25)
        }
    );
    let released = line
        .release_due(start + Duration::from_millis(25))
        .expect("due");
    assert_eq!(released, &sent[..]);
    // The header is not counted as the packet's bytes.
    assert_eq!(line.stats().received_bytes, 90);
}

#[test]
fn packets_take_the_smallest_free_slot_they_fit() {
    let mut line = DelayLine::with_slots(
        vec![link(1, 10, 0.0), link(2, 10, 0.0)],
        &[class(1, 65_545), class(2, 2048)],
        10,
        1,
    )
    .expect("valid line");
    let now = Instant::now();
    // Two small packets fill the small slots; a third small one takes the large slot, so a
    // super-packet then finds no room.
    for tag in 0..3 {
        assert!(matches!(
            line.admit(&framed(1510, tag), now),
            Admission::Held { .. }
        ));
    }
    assert_eq!(line.admit(&framed(60_000, 3), now), Admission::QueueFull);
    let later = now + Duration::from_millis(20);
    let mut released = Vec::new();
    while let Some(bytes) = line.release_due(later) {
        released.push(bytes[10 + 39]);
    }
    assert_eq!(released, [0, 1, 2]);
    // With every slot free again, a super-packet fits the large slot and a packet larger
    // than any slot is refused.
    assert!(matches!(
        line.admit(&framed(65_545, 4), later),
        Admission::Held { .. }
    ));
    assert_eq!(line.admit(&framed(65_546, 5), later), Admission::Oversize);
    let super_packet = line
        .release_due(later + Duration::from_millis(20))
        .expect("due");
    assert_eq!((super_packet.len(), super_packet[10 + 39]), (65_545, 4));
}

#[test]
fn slot_sizes_and_headers_outside_their_ranges_are_refused() {
    assert!(matches!(
        DelayLine::with_slots(vec![], &[class(1, 580)], 10, 1),
        Err(DelayLineError::SlotSize {
            bytes: 580,
            header_bytes: 10
        })
    ));
    assert!(matches!(
        DelayLine::with_slots(vec![], &[class(1, 2048), class(1, 65_546)], 10, 1),
        Err(DelayLineError::SlotSize { bytes: 65_546, .. })
    ));
    assert!(matches!(
        DelayLine::with_slots(vec![], &[class(1, 2048)], 65, 1),
        Err(DelayLineError::HeaderSize { bytes: 65 })
    ));
    assert!(matches!(
        DelayLine::with_slots(vec![], &[class(0, 2048), class(0, 4096)], 0, 1),
        Err(DelayLineError::NoCapacity)
    ));
}
