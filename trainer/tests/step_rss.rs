//! A step on the CPU holds the parameters and the gradient once: the flat vectors' memory
//! goes back to the kernel while candle holds their values, and no gradient is held twice.
//!
//! Measured as the rise of this process's peak resident memory (`VmHWM`, reset through
//! `/proc/self/clear_refs`) over a step's passes. The measurement is process-wide, so the
//! tests of this binary take turns.

#![cfg(target_os = "linux")]

use std::sync::Mutex;

use murmur_trainer::{GptConfig, MlpConfig, ModelConfig, PeerSampling, TaskConfig, TaskPreset};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn status_kib(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(key)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// `config`'s task for one peer, with malloc set as the daemon sets it (its `allocator`
/// module): every tensor-sized buffer is a mapping of its own, given back when freed, so
/// that resident memory follows what is live.
fn build(config: TaskConfig) -> murmur_trainer::Task {
    // SAFETY: `mallopt` only changes malloc's tunables; the value is in its valid range.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
    let sampling = PeerSampling {
        swarm_seed: 3,
        peer_seed: 1,
        shard: 0,
        shards: 1,
    };
    config.build(sampling).unwrap()
}

/// The rise of the peak resident memory over one step of `config`'s task in
/// `micro_batches` passes, after a first step, as a multiple of the parameters' bytes.
fn step_rise(config: TaskConfig, micro_batches: usize) -> f64 {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut task = build(config);
    task.micro_batches = micro_batches;
    let mut params = task.model.init(3);
    let bytes = std::mem::size_of_val(params.as_slice()) as u64;
    let mut grad = vec![1.0f32; params.len()];
    let mut batch = task.dataset.empty_batch(task.batch_size);
    // A first step, so that every lazily built buffer exists before the measured one.
    task.next_loss_and_grad(&mut params, &mut batch, &mut grad)
        .unwrap();
    grad.fill(1.0);
    let before = params.clone();

    std::fs::write("/proc/self/clear_refs", "5")
        .expect("resetting the peak resident memory through /proc/self/clear_refs");
    let start = status_kib("VmRSS:") * 1024;
    let loss = task
        .next_loss_and_grad(&mut params, &mut batch, &mut grad)
        .unwrap();
    let rise = (status_kib("VmHWM:") * 1024).saturating_sub(start);

    assert!(loss.is_finite());
    assert_eq!(params, before, "the parameters came back as they were lent");
    assert!(grad.iter().any(|&g| g != 1.0 && g != 0.0));
    let ratio = rise as f64 / bytes as f64;
    eprintln!(
        "peak resident memory rose {rise} bytes over the passes; the parameters are {bytes} \
         bytes ({ratio:.2}×)"
    );
    ratio
}

/// Sixteen 512-wide hidden layers: 4.2M parameters (17 MB) in tensors of 1 MB, and a batch
/// of 8 rows whose activations are a few hundred KB. (candle's backward briefly holds two
/// gradients of a tensor while it sums them, so a model of one large tensor would rise by
/// twice that tensor whatever the flat vectors do.)
fn deep_mlp() -> TaskConfig {
    let mut config = TaskPreset::TeacherMlp.config();
    config.model = ModelConfig::Mlp(MlpConfig {
        hidden: vec![512; 16],
        ..match config.model {
            ModelConfig::Mlp(mlp) => mlp,
            ModelConfig::Gpt(_) => unreachable!("the teacher preset is an MLP"),
        }
    });
    config.data.batch_size = 8;
    config.data.eval_samples = 8;
    config
}

#[test]
fn a_steps_passes_hold_the_parameters_and_the_gradient_once() {
    let config = deep_mlp();
    // With the flat vectors kept resident beside candle's copies the peak rose 3.0 times
    // the parameters' bytes; with their pages handed back, 1.06 times, of which candle's own
    // matmul kept about one vector alive (each weight's raw gradient, recorded by its sum);
    // with the trainer's `linear` op as well, 0.08 times.
    let rise = step_rise(config, 1);
    assert!(
        rise < 0.5,
        "the passes raised the peak by {rise:.2}× the parameters"
    );
}

#[test]
fn micro_batches_sum_their_gradients_without_a_second_copy() {
    // The MLP above in two micro-batches of 4 rows: the second pass adds its gradient to the
    // first's, in the flat buffer.
    let config = deep_mlp();
    // Through candle's gradient store the second pass held its whole gradient beside the
    // flat sum before adding it in: a rise of about 1× the parameters. The linear op adds
    // each weight's part into the sum as it computes it.
    let rise = step_rise(config, 2);
    assert!(
        rise < 0.5,
        "the passes raised the peak by {rise:.2}× the parameters"
    );
}

#[test]
fn a_gpt_step_keeps_no_copy_of_its_token_embedding_beside_its_gradient() {
    // A 20,000-token vocabulary at width 64: the embedding (tied to the output head) is
    // 1.28M of the 1.34M parameters. A batch of one sequence of 8 tokens, whose logits are
    // an eighth of the embedding.
    let mut config = TaskPreset::MarkovGpt.config();
    config.model = ModelConfig::Gpt(GptConfig {
        layers: 1,
        heads: 2,
        width: 64,
        context: 8,
        vocab: Some(20_000),
        mlp_ratio: 4,
    });
    config.data.batch_size = 1;
    config.data.eval_samples = 8;
    // The lent parameters go back to the flat vector a tensor at a time, each copied before
    // candle's is freed: the embedding, most of the parameters here, is briefly held twice
    // then, a rise of about 0.96×. The gradients add nothing to that: the output head's is
    // accumulated into the flat gradient and the looked-up rows' added there. Through
    // candle's gradient store the two were summed into a zeroed copy of the embedding, and
    // the sum then copied into the flat gradient: a rise of 1.86×.
    let rise = step_rise(config, 1);
    assert!(
        rise < 1.3,
        "the passes raised the peak by {rise:.2}× the parameters"
    );
}

#[test]
fn an_eval_holds_the_parameters_once() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut task = build(deep_mlp());
    let mut params = task.model.init(3);
    let bytes = std::mem::size_of_val(params.as_slice()) as u64;
    // A first eval, so that every lazily built buffer exists before the measured one.
    let first = task.evaluate(&mut params).unwrap();
    let before = params.clone();

    std::fs::write("/proc/self/clear_refs", "5")
        .expect("resetting the peak resident memory through /proc/self/clear_refs");
    let start = status_kib("VmRSS:") * 1024;
    let loss = task.evaluate(&mut params).unwrap();
    let rise = (status_kib("VmHWM:") * 1024).saturating_sub(start);

    assert_eq!(
        loss.to_bits(),
        first.to_bits(),
        "the same eval, the same loss"
    );
    assert_eq!(params, before, "the parameters came back as they were lent");
    let ratio = rise as f64 / bytes as f64;
    eprintln!(
        "peak resident memory rose {rise} bytes over the eval; the parameters are {bytes} bytes ({ratio:.2}×)"
    );
    // Copied into candle's tensors beside the flat vector, the eval rose 1.0× or more.
    assert!(
        ratio < 0.5,
        "the eval raised the peak by {ratio:.2}× the parameters"
    );
}
