//! The learning-rate schedule's values.

use murmur_trainer::{LrSchedule, ScheduleConfig};

fn config() -> ScheduleConfig {
    ScheduleConfig {
        peak_lr: 1.0,
        warmup_steps: 10,
        total_steps: 110,
        min_lr_ratio: 0.1,
        reference_batch: None,
    }
}

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() < 1e-6
}

#[test]
fn warmup_is_linear_then_cosine_reaches_the_floor() {
    let s = LrSchedule::new(config()).unwrap();
    assert!(close(s.base_lr(0), 0.1));
    assert!(close(s.base_lr(4), 0.5));
    assert!(close(s.base_lr(9), 1.0));
    assert!(close(s.base_lr(10), 1.0));
    // Halfway through the decay: floor + (peak − floor)/2.
    assert!(close(s.base_lr(60), 0.55));
    // A quarter of the way: floor + (peak − floor)·(1 + cos(π/4))/2.
    let quarter = 0.1 + 0.9 * 0.5 * (1.0 + std::f32::consts::FRAC_1_SQRT_2);
    assert!(close(s.base_lr(35), quarter));
    assert!(close(s.base_lr(110), 0.1));
    assert!(close(s.base_lr(10_000), 0.1));
    // Non-increasing after warm-up.
    for step in 10..200 {
        assert!(s.base_lr(step + 1) <= s.base_lr(step) + 1e-7);
    }
}

#[test]
fn no_warmup_starts_at_peak() {
    let s = LrSchedule::new(ScheduleConfig {
        warmup_steps: 0,
        ..config()
    })
    .unwrap();
    assert!(close(s.base_lr(0), 1.0));
}

#[test]
fn linear_scaling_rule_multiplies_by_batch_ratio() {
    let plain = LrSchedule::new(config()).unwrap();
    assert!(close(plain.lr(60, 512), plain.base_lr(60)));
    let scaled = LrSchedule::new(ScheduleConfig {
        reference_batch: Some(32),
        ..config()
    })
    .unwrap();
    assert!(close(scaled.lr(60, 128), 4.0 * scaled.base_lr(60)));
    assert!(close(scaled.lr(60, 16), 0.5 * scaled.base_lr(60)));
}

#[test]
fn invalid_values_name_their_key() {
    let cases = [
        (
            ScheduleConfig {
                peak_lr: 0.0,
                ..config()
            },
            "schedule.peak_lr",
        ),
        (
            ScheduleConfig {
                total_steps: 0,
                ..config()
            },
            "schedule.total_steps",
        ),
        (
            ScheduleConfig {
                warmup_steps: 111,
                ..config()
            },
            "schedule.warmup_steps",
        ),
        (
            ScheduleConfig {
                min_lr_ratio: 1.5,
                ..config()
            },
            "schedule.min_lr_ratio",
        ),
        (
            ScheduleConfig {
                reference_batch: Some(0),
                ..config()
            },
            "schedule.reference_batch",
        ),
    ];
    for (bad, key) in cases {
        let err = LrSchedule::new(bad).unwrap_err().to_string();
        assert!(err.contains(key), "{err} should name {key}");
    }
}
