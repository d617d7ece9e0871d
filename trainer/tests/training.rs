//! Short training runs: the eval loss falls toward the task's floor.

use murmur_trainer::data::{MarkovConfig, TeacherConfig};
use murmur_trainer::{
    Activation, DataConfig, DataSource, GptConfig, MlpConfig, ModelConfig, OptimizerConfig,
    PeerSampling, ScheduleConfig, TaskConfig, TaskPreset,
};

fn sampling(peer_seed: u64) -> PeerSampling {
    PeerSampling {
        swarm_seed: 17,
        peer_seed,
        shard: 0,
        shards: 1,
    }
}

/// Trains `steps` local steps and returns (initial eval, final eval, floor).
fn train(config: &TaskConfig, steps: u64) -> (f32, f32, f32) {
    let mut task = config.build(sampling(1)).unwrap();
    let mut params = task.model.init(17);
    let mut grad = vec![0.0; params.len()];
    let mut batch = task.dataset.empty_batch(task.batch_size);
    let initial = task.evaluate(&mut params).unwrap();
    for step in 0..steps {
        let loss = task
            .local_step(&mut params, &mut batch, &mut grad, step, 1)
            .unwrap();
        assert!(loss.is_finite(), "loss diverged at step {step}");
    }
    let last = task.evaluate(&mut params).unwrap();
    (initial, last, task.dataset.loss_floor().unwrap())
}

/// A one-layer GPT on an 8-state Markov chain, with AdamW keeping its moments in
/// `moment_bits`.
fn markov_gpt(moment_bits: u8) -> TaskConfig {
    TaskConfig {
        model: ModelConfig::Gpt(GptConfig {
            layers: 1,
            heads: 2,
            width: 16,
            context: 8,
            vocab: None,
            mlp_ratio: 2,
        }),
        data: DataConfig {
            shard: 0,
            shards: 1,
            batch_size: 16,
            eval_samples: 64,
            source: DataSource::SyntheticMarkov(MarkovConfig {
                communities: 1,
                states: 8,
                branching: 2,
                skew: 1.0,
            }),
        },
        optimizer: OptimizerConfig::AdamW {
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            moment_bits,
        },
        schedule: ScheduleConfig {
            peak_lr: 1e-2,
            warmup_steps: 10,
            total_steps: 150,
            min_lr_ratio: 0.1,
            reference_batch: None,
        },
    }
}

#[test]
fn gpt_learns_a_markov_chain() {
    let (initial, last, floor) = train(&markov_gpt(32), 150);
    assert!(floor < initial, "floor {floor} vs initial {initial}");
    let progress = (initial - last) / (initial - floor);
    assert!(progress > 0.5, "eval {initial} → {last}, floor {floor}");
}

/// The same run with AdamW's moments in 8-bit codes closes as much of the gap to the
/// chain's entropy rate as with them in `f32`, give or take 5 % of it.
#[test]
fn adamw_with_8_bit_moments_learns_as_far_as_with_32() {
    let (initial, full, floor) = train(&markov_gpt(32), 150);
    let (_, coded, _) = train(&markov_gpt(8), 150);
    let gap = initial - floor;
    let (full_progress, coded_progress) = ((initial - full) / gap, (initial - coded) / gap);
    assert!(
        (coded_progress - full_progress).abs() < 0.05,
        "eval {initial} → {full} with f32 moments, → {coded} with 8-bit ones; floor {floor}"
    );
    assert_ne!(full, coded, "the 8-bit moments changed nothing");
}

#[test]
fn mlp_learns_a_teacher() {
    let config = TaskConfig {
        model: ModelConfig::Mlp(MlpConfig {
            hidden: vec![32],
            activation: Activation::Relu,
        }),
        data: DataConfig {
            shard: 0,
            shards: 1,
            batch_size: 32,
            eval_samples: 256,
            source: DataSource::SyntheticClassification(TeacherConfig {
                features: 8,
                classes: 4,
                hidden: 16,
                sharpness: 4.0,
            }),
        },
        optimizer: OptimizerConfig::SgdNesterov {
            momentum: 0.9,
            weight_decay: 0.0,
        },
        schedule: ScheduleConfig {
            peak_lr: 0.05,
            warmup_steps: 10,
            total_steps: 300,
            min_lr_ratio: 0.1,
            reference_batch: None,
        },
    };
    let (initial, last, floor) = train(&config, 300);
    let progress = (initial - last) / (initial - floor);
    assert!(progress > 0.3, "eval {initial} → {last}, floor {floor}");
}

#[test]
fn every_peer_starts_from_the_same_parameters() {
    let config = murmur_trainer::TaskPreset::TeacherMlp.config();
    let a = config.build(sampling(1)).unwrap();
    let b = config.build(sampling(2)).unwrap();
    assert_eq!(a.model.init(5), b.model.init(5));
    assert_ne!(a.model.init(5), a.model.init(6));
}

#[test]
fn a_task_can_move_to_another_thread() {
    fn assert_send<T: Send>(_: &T) {}
    let task = murmur_trainer::TaskPreset::default_local()
        .build(sampling(1))
        .unwrap();
    assert_send(&task);
    // And it trains there.
    let handle = std::thread::spawn(move || {
        let mut task = task;
        let mut params = task.model.init(1);
        let mut grad = vec![0.0; params.len()];
        let mut batch = task.dataset.empty_batch(task.batch_size);
        task.local_step(&mut params, &mut batch, &mut grad, 0, 1)
    });
    assert!(handle.join().unwrap().unwrap().is_finite());
}

/// Gradient accumulation: four micro-batches of 4 give the gradient and loss of one pass
/// over the same 16 samples (the Markov stream draws row by row, so both see the same rows),
/// on the GPT and on the MLP.
#[test]
fn micro_batches_give_the_whole_batch_gradient() {
    for preset in [TaskPreset::MarkovGpt, TaskPreset::TeacherMlp] {
        let mut config = preset.config();
        config.data.batch_size = 16;
        let mut whole = config.build(sampling(3)).unwrap();
        let mut parts = config.build(sampling(3)).unwrap();
        let mut params = whole.model.init(17);
        let initial = params.clone();
        let mut batch = whole.dataset.empty_batch(16);
        let mut g_whole = vec![0.0; params.len()];
        let mut g_parts = vec![1.0; params.len()];
        let l_whole = whole
            .next_loss_and_grad(&mut params, &mut batch, &mut g_whole)
            .unwrap();
        // The passes borrow the parameters' memory (released on the CPU) and give every
        // value back.
        assert!(
            params
                .iter()
                .zip(&initial)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{preset:?}: the parameters changed across the passes"
        );
        parts.micro_batches = 4;
        let l_parts = parts
            .next_loss_and_grad(&mut params, &mut batch, &mut g_parts)
            .unwrap();
        assert!(
            (l_whole - l_parts).abs() < 1e-5,
            "{preset:?}: {l_whole} vs {l_parts}"
        );
        let norm: f32 = g_whole.iter().map(|g| g * g).sum::<f32>().sqrt();
        let diff: f32 = g_whole
            .iter()
            .zip(&g_parts)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>()
            .sqrt();
        assert!(
            norm > 0.0 && diff < 1e-5 * norm,
            "{preset:?}: {diff} of {norm}"
        );
        parts.micro_batches = 3;
        let error = parts
            .next_loss_and_grad(&mut params, &mut batch, &mut g_parts)
            .unwrap_err();
        assert!(error.to_string().contains("do not divide"), "{error}");
    }
}

/// An eval in passes of a micro-batch's rows gives the loss of whole batches, and leaves
/// the parameters as they were, on the GPT and on the MLP.
#[test]
fn an_eval_in_micro_batches_gives_the_whole_batches_loss() {
    for preset in [TaskPreset::MarkovGpt, TaskPreset::TeacherMlp] {
        let mut config = preset.config();
        config.data.batch_size = 8;
        config.data.eval_samples = 20;
        let mut task = config.build(sampling(3)).unwrap();
        let mut params = task.model.init(17);
        let initial = params.clone();
        let whole = task.evaluate(&mut params).unwrap();
        assert_eq!(params, initial, "{preset:?}: the parameters changed");
        // Passes of 2 rows: the batches of 8, 8 and 4 rows in ten passes.
        task.micro_batches = 4;
        let parts = task.evaluate(&mut params).unwrap();
        assert_eq!(params, initial, "{preset:?}: the parameters changed");
        assert!(
            whole.is_finite() && (whole - parts).abs() < 1e-5 * whole.abs(),
            "{preset:?}: {whole} vs {parts}"
        );
    }
}
