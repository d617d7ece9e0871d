//! Optimizers against hand-computed scalar references; LAMB trust ratios; state handling.

use murmur_trainer::{Init, Optimizer, OptimizerConfig, ParamLayout, Slot, TrainerError};

fn layout(tensors: &[(&str, usize, bool)]) -> ParamLayout {
    let mut layout = ParamLayout::default();
    for &(name, len, decay) in tensors {
        layout.push(name.into(), &[len], decay, Init::Zeros);
    }
    layout
}

fn close(a: f32, b: f32, tol: f32) -> bool {
    (a - b).abs() <= tol
}

#[test]
fn sgd_nesterov_matches_hand_computation() {
    // μ = 0.9, η = 0.1, p₀ = 1, gradients 1, 0.5, −0.25:
    // b₁ = 1,    p₁ = 1    − 0.1·(1     + 0.9·1)    = 0.81
    // b₂ = 1.4,  p₂ = 0.81 − 0.1·(0.5   + 0.9·1.4)  = 0.634
    // b₃ = 1.01, p₃ = 0.634 − 0.1·(−0.25 + 0.9·1.01) = 0.5681
    let layout = layout(&[("w", 1, true)]);
    let config = OptimizerConfig::SgdNesterov {
        momentum: 0.9,
        weight_decay: 0.0,
    };
    let mut opt = Optimizer::new(config, &layout).unwrap();
    let mut p = [1.0f32];
    for (g, want) in [(1.0, 0.81), (0.5, 0.634), (-0.25, 0.5681)] {
        opt.step(&mut p, &[g], 0.1).unwrap();
        assert!(close(p[0], want, 1e-6), "{} vs {want}", p[0]);
    }
    assert!(close(opt.slots()[0].to_vec()[0], 1.01, 1e-6));
    assert_eq!(opt.steps_taken(), 3);
}

#[test]
fn sgd_weight_decay_applies_only_to_decayed_tensors() {
    // λ = 0.5, μ = 0, η = 0.1, p = 2, g = 0: decayed moves by 0.1·0.5·2 = 0.1; bias stays.
    let layout = layout(&[("w", 1, true), ("b", 1, false)]);
    let config = OptimizerConfig::SgdNesterov {
        momentum: 0.0,
        weight_decay: 0.5,
    };
    let mut opt = Optimizer::new(config, &layout).unwrap();
    let mut p = [2.0f32, 2.0];
    opt.step(&mut p, &[0.0, 0.0], 0.1).unwrap();
    assert!(close(p[0], 1.9, 1e-6));
    assert_eq!(p[1], 2.0);
}

#[test]
fn adamw_matches_hand_computation() {
    // η = 0.1, β = (0.9, 0.999), λ = 0.1, p₀ = 1.
    // t=1, g=0.5: m̂ = 0.5, v̂ = 0.25 → step 1; p₁ = 1·(1 − 0.01) − 0.1·1 = 0.89.
    // t=2, g=−1: m = −0.055, v = 0.00124975, m̂ = −0.055/0.19, v̂ = 0.00124975/0.001999;
    //   m̂/√v̂ = −0.366101…; p₂ = 0.89·0.99 + 0.0366101 = 0.9177101.
    let layout = layout(&[("w", 1, true)]);
    let config = OptimizerConfig::AdamW {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
        moment_bits: 32,
    };
    let mut opt = Optimizer::new(config, &layout).unwrap();
    let mut p = [1.0f32];
    opt.step(&mut p, &[0.5], 0.1).unwrap();
    assert!(close(p[0], 0.89, 1e-6), "{}", p[0]);
    opt.step(&mut p, &[-1.0], 0.1).unwrap();
    assert!(close(p[0], 0.917_710_1, 2e-6), "{}", p[0]);
    assert!(close(opt.slots()[0].to_vec()[0], -0.055, 1e-7));
    // (1 − β₂ rounds to 0.00099998713 in f32, hence the looser tolerance.)
    assert!(close(opt.slots()[1].to_vec()[0], 0.001_249_75, 1e-7));
}

#[test]
fn adamw_first_step_is_lr_times_sign() {
    // Bias correction makes the first step ±η per element whatever the gradient's scale.
    let layout = layout(&[("w", 3, false)]);
    let config = OptimizerConfig::AdamW {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-12,
        weight_decay: 0.0,
        moment_bits: 32,
    };
    let mut opt = Optimizer::new(config, &layout).unwrap();
    let mut p = [0.0f32; 3];
    opt.step(&mut p, &[1e-3, -50.0, 7.0], 0.01).unwrap();
    for (v, want) in p.iter().zip([-0.01, 0.01, -0.01]) {
        assert!(close(*v, want, 1e-7), "{v} vs {want}");
    }
}

#[test]
fn lamb_trust_ratio_matches_hand_computation() {
    // Tensor a = [3, 4] (‖a‖ = 5) with g = [1, 0], λ = 0.1; tensor b = [0] with g = [2], no decay.
    // t=1: m̂ = g, v̂ = g², r = [1, 0]; u_a = r + λa = [1.3, 0.4], ‖u_a‖ = √1.85;
    //   ratio_a = 5/√1.85 = 3.676073; a ← a − 0.1·ratio_a·u_a = [2.522111, 3.852957].
    // ‖b‖ = 0 → ratio_b = 1; u_b = 1; b ← −0.1.
    let layout = layout(&[("a", 2, true), ("b", 1, false)]);
    let config = OptimizerConfig::Lamb {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-6,
        weight_decay: 0.1,
    };
    let mut opt = Optimizer::new(config, &layout).unwrap();
    let mut p = [3.0f32, 4.0, 0.0];
    opt.step(&mut p, &[1.0, 0.0, 2.0], 0.1).unwrap();
    let ratios = opt.trust_ratios();
    assert!(close(ratios[0], 3.676_073, 1e-5), "{ratios:?}");
    assert_eq!(ratios[1], 1.0);
    assert!(close(p[0], 2.522_111, 1e-5), "{p:?}");
    assert!(close(p[1], 3.852_957, 1e-5), "{p:?}");
    assert!(close(p[2], -0.1, 1e-6), "{p:?}");
}

#[test]
fn lamb_step_size_is_invariant_to_gradient_scale() {
    // Per-tensor normalisation: scaling a tensor's gradient by 1000 leaves its update unchanged
    // (up to ε), so each layer moves by lr·‖p‖ relative to its own norm.
    let layout = layout(&[("a", 4, false)]);
    let config = OptimizerConfig::Lamb {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-10,
        weight_decay: 0.0,
    };
    let run = |scale: f32| {
        let mut opt = Optimizer::new(config, &layout).unwrap();
        let mut p = [1.0f32, -2.0, 0.5, 3.0];
        let g: Vec<f32> = [0.3f32, 0.1, -0.7, 0.2].iter().map(|g| g * scale).collect();
        opt.step(&mut p, &g, 0.01).unwrap();
        p
    };
    let (small, large) = (run(1.0), run(1000.0));
    for (a, b) in small.iter().zip(&large) {
        assert!(close(*a, *b, 1e-6), "{small:?} vs {large:?}");
    }
    // And the update's norm is lr·‖p‖.
    let before = [1.0f32, -2.0, 0.5, 3.0];
    let moved: f32 = small
        .iter()
        .zip(before)
        .map(|(a, b)| (a - b) * (a - b))
        .sum::<f32>()
        .sqrt();
    let norm: f32 = before.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!(
        close(moved, 0.01 * norm, 1e-6),
        "{moved} vs {}",
        0.01 * norm
    );
}

#[test]
fn state_round_trips_and_rejects_wrong_lengths() {
    let layout = layout(&[("w", 2, true)]);
    let config = OptimizerConfig::AdamW {
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.0,
        moment_bits: 32,
    };
    let mut a = Optimizer::new(config, &layout).unwrap();
    let mut pa = [1.0f32, 2.0];
    for g in [[0.1, -0.2], [0.3, 0.0], [-0.5, 0.4]] {
        a.step(&mut pa, &g, 0.05).unwrap();
    }
    // A fresh optimizer loaded with a's state continues exactly like a.
    let mut b = Optimizer::new(config, &layout).unwrap();
    let values: Vec<Vec<f32>> = a.slots().iter().map(Slot::to_vec).collect();
    let slots: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
    b.load_state(a.steps_taken(), &slots).unwrap();
    let mut pb = pa;
    a.step(&mut pa, &[0.2, 0.2], 0.05).unwrap();
    b.step(&mut pb, &[0.2, 0.2], 0.05).unwrap();
    assert_eq!(pa, pb);
    assert_eq!(a.slot_names(), ["exp_avg", "exp_avg_sq"]);

    let short = [0.0f32; 1];
    let err = b.load_state(1, &[&short, &short]).unwrap_err();
    assert!(matches!(
        err,
        TrainerError::BufferLength {
            expected: 2,
            actual: 1,
            ..
        }
    ));
    let err = b.step(&mut [0.0; 3], &[0.0; 3], 0.1).unwrap_err();
    assert!(matches!(
        err,
        TrainerError::BufferLength {
            buffer: "params",
            ..
        }
    ));
}

/// State kept outside the optimizer and lent to it for each step steps exactly like state
/// it keeps itself; without it lent, a step is refused rather than taken on no state.
#[test]
fn state_lent_for_each_step_steps_like_state_kept_inside() {
    let layout = layout(&[("w", 2, true)]);
    let config = OptimizerConfig::AdamW {
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
        moment_bits: 32,
    };
    let mut inside = Optimizer::new(config, &layout).unwrap();
    let mut lent = Optimizer::new(config, &layout).unwrap();
    let mut kept: Vec<Slot> = vec![Slot::default(); 2];
    lent.exchange_slots(kept.iter_mut()).unwrap();
    assert!(lent.slots().iter().all(Slot::is_empty));
    let err = lent.step(&mut [1.0, 2.0], &[0.1, 0.1], 0.05).unwrap_err();
    assert!(matches!(err, TrainerError::BufferLength { .. }));

    let (mut p_inside, mut p_lent) = ([1.0f32, 2.0], [1.0f32, 2.0]);
    for g in [[0.1, -0.2], [0.3, 0.0], [-0.5, 0.4]] {
        inside.step(&mut p_inside, &g, 0.05).unwrap();
        lent.exchange_slots(kept.iter_mut()).unwrap();
        lent.step(&mut p_lent, &g, 0.05).unwrap();
        lent.exchange_slots(kept.iter_mut()).unwrap();
    }
    assert_eq!(p_inside, p_lent);
    assert_eq!(kept, inside.slots());

    // A restarted optimizer given the kept state and step count goes on the same way.
    let mut restarted = Optimizer::new(config, &layout).unwrap();
    restarted.set_steps_taken(lent.steps_taken());
    restarted.exchange_slots(kept.iter_mut()).unwrap();
    inside.step(&mut p_inside, &[0.2, 0.2], 0.05).unwrap();
    restarted.step(&mut p_lent, &[0.2, 0.2], 0.05).unwrap();
    assert_eq!(p_inside, p_lent);

    let err = lent.exchange_slots(kept.iter_mut().take(1)).unwrap_err();
    assert!(matches!(
        err,
        TrainerError::BufferLength {
            expected: 2,
            actual: 1,
            ..
        }
    ));
}

/// A step that keeps its update moves the parameters exactly as a plain step does, and
/// leaves in the gradient's place `after − before`, bit for bit, for every optimizer.
#[test]
fn a_step_keeping_its_update_leaves_after_minus_before() {
    let layout = layout(&[("w", 5, true), ("b", 3, false)]);
    let configs = [
        OptimizerConfig::SgdNesterov {
            momentum: 0.9,
            weight_decay: 0.1,
        },
        OptimizerConfig::AdamW {
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.1,
            moment_bits: 32,
        },
        OptimizerConfig::AdamW {
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.1,
            moment_bits: 8,
        },
        OptimizerConfig::Lamb {
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-6,
            weight_decay: 0.1,
        },
    ];
    for config in configs {
        let mut plain = Optimizer::new(config, &layout).unwrap();
        let mut keeping = Optimizer::new(config, &layout).unwrap();
        let mut p_plain: Vec<f32> = (0..8).map(|i| 0.3 * i as f32 - 1.1).collect();
        let mut p_keeping = p_plain.clone();
        for step in 0..4 {
            let grad: Vec<f32> = (0..8)
                .map(|i| ((i * 7 + step) % 5) as f32 * 0.21 - 0.4)
                .collect();
            let before = p_keeping.clone();
            plain.step(&mut p_plain, &grad, 0.05).unwrap();
            let mut slots = grad.clone();
            keeping
                .step_keeping_update(&mut p_keeping, &mut slots, 0.05)
                .unwrap();
            assert_eq!(p_plain, p_keeping, "{config:?} step {step}");
            let moved: Vec<u32> = p_keeping
                .iter()
                .zip(&before)
                .map(|(a, b)| (a - b).to_bits())
                .collect();
            let kept: Vec<u32> = slots.iter().map(|u| u.to_bits()).collect();
            assert_eq!(kept, moved, "{config:?} step {step}");
        }
    }
}

#[test]
fn hyperparameters_out_of_range_name_their_key() {
    let layout = layout(&[("w", 1, true)]);
    let bad = OptimizerConfig::SgdNesterov {
        momentum: 1.0,
        weight_decay: 0.0,
    };
    let err = Optimizer::new(bad, &layout).unwrap_err().to_string();
    assert!(err.contains("optimizer.momentum"), "{err}");
    let bad = OptimizerConfig::Lamb {
        beta1: 0.9,
        beta2: 0.999,
        eps: 0.0,
        weight_decay: 0.0,
    };
    let err = Optimizer::new(bad, &layout).unwrap_err().to_string();
    assert!(err.contains("optimizer.eps"), "{err}");
    let bad = adamw(16);
    let err = Optimizer::new(bad, &layout).unwrap_err().to_string();
    assert!(
        err.contains("optimizer.moment_bits") && err.contains("8 or 32"),
        "{err}"
    );
}

fn adamw(moment_bits: u8) -> OptimizerConfig {
    OptimizerConfig::AdamW {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
        moment_bits,
    }
}

/// Gradients of a few hundred elements that vary in scale across tensors and steps.
fn gradient(len: usize, step: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let t = (i * 31 + step * 17) as f32 * 0.13;
            t.sin() * (1.0 + 3.0 * (i as f32 * 0.01).cos().abs()) * 0.1f32.powi((i % 3) as i32)
        })
        .collect()
}

/// AdamW with its moments in 8 bits steps where AdamW in `f32` does, to within a few
/// percent of the distance moved, through tensors whose ranges start and end inside the
/// codes' blocks; and its state, read out as `f32` and loaded into a fresh optimizer, goes
/// on exactly as the original.
#[test]
fn adamw_in_8_bits_follows_adamw_in_32_and_its_state_round_trips() {
    // 300 + 5 + 500 elements: blocks of 256 straddle every tensor boundary.
    let layout = layout(&[("w", 300, true), ("b", 5, false), ("u", 500, true)]);
    let len = layout.len();
    let mut full = Optimizer::new(adamw(32), &layout).unwrap();
    let mut coded = Optimizer::new(adamw(8), &layout).unwrap();
    assert!(coded.slots().iter().all(|s| s.floats().is_none()));
    // A byte an element and a 4-byte scale for each of the 4 blocks.
    assert!(coded.slots().iter().all(|s| s.bytes() == len + 4 * 4));
    let start: Vec<f32> = (0..len).map(|i| (i as f32 * 0.07).cos()).collect();
    let (mut p_full, mut p_coded) = (start.clone(), start.clone());
    for step in 0..60 {
        let grad = gradient(len, step);
        full.step(&mut p_full, &grad, 1e-2).unwrap();
        coded.step(&mut p_coded, &grad, 1e-2).unwrap();
    }
    let moved: f32 = p_full
        .iter()
        .zip(&start)
        .map(|(a, b)| (a - b).powi(2))
        .sum();
    let apart: f32 = p_full
        .iter()
        .zip(&p_coded)
        .map(|(a, b)| (a - b).powi(2))
        .sum();
    let ratio = (apart / moved).sqrt();
    assert!(
        ratio < 0.05,
        "8-bit moments went {ratio:.4} of the distance apart"
    );
    assert!(ratio > 0.0, "the 8-bit moments changed nothing");

    let values: Vec<Vec<f32>> = coded.slots().iter().map(Slot::to_vec).collect();
    let slots: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
    let mut loaded = Optimizer::new(adamw(8), &layout).unwrap();
    loaded.load_state(coded.steps_taken(), &slots).unwrap();
    assert_eq!(loaded.slots(), coded.slots());
    let fresh = Optimizer::new(adamw(8), &layout).unwrap();
    assert_eq!(
        fresh.slot_from_values(1, values[1].clone()),
        coded.slots()[1]
    );
    let mut p_loaded = p_coded.clone();
    let grad = gradient(len, 99);
    coded.step(&mut p_coded, &grad, 1e-2).unwrap();
    loaded.step(&mut p_loaded, &grad, 1e-2).unwrap();
    assert_eq!(p_coded, p_loaded);
}
