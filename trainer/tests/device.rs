//! A model gives the same loss and gradient on every device this build and host can open,
//! and a device that cannot be opened is an error with a reason, never a panic.
//!
//! The GPU comparison is ignored unless asked for, so a run without a GPU reports it as
//! skipped. On a GPU host: `cargo test --release -p murmur-trainer --features cuda --test
//! device -- --include-ignored` (docs/gpu.md), or `scripts/gpu-check.sh` from a prebuilt
//! binary.

use murmur_trainer::{
    Activation, DeviceError, MlpConfig, ModelConfig, PeerSampling, TaskConfig, TaskPreset,
    TrainerDevice,
};

fn sampling() -> PeerSampling {
    PeerSampling {
        swarm_seed: 11,
        peer_seed: 3,
        shard: 0,
        shards: 1,
    }
}

/// The GPT preset and an MLP with GELU: between them every op the models use.
fn configs() -> Vec<TaskConfig> {
    let mut gpt = TaskPreset::MarkovGpt.config();
    gpt.data.eval_samples = 16;
    let mut mlp = TaskPreset::TeacherMlp.config();
    mlp.data.eval_samples = 16;
    mlp.model = ModelConfig::Mlp(MlpConfig {
        hidden: vec![48, 32],
        activation: Activation::Gelu,
    });
    vec![gpt, mlp]
}

/// Loss and gradient of one training batch on `device`.
fn loss_and_grad(config: &TaskConfig, device: Option<candle_core::Device>) -> (f32, Vec<f32>) {
    let mut task = config.build(sampling()).unwrap();
    if let Some(device) = device {
        task.model.set_device(device).unwrap();
    }
    let params = task.model.init(11);
    let mut batch = task.dataset.empty_batch(task.batch_size);
    task.dataset.fill_train_batch(task.batch_size, &mut batch);
    let mut grad = vec![0.0; params.len()];
    let loss = task
        .model
        .loss_and_grad(&params, &batch, &mut grad)
        .unwrap();
    (loss, grad)
}

#[test]
fn setting_the_cpu_explicitly_changes_nothing() {
    for config in configs() {
        let (loss, grad) = loss_and_grad(&config, None);
        let cpu = TrainerDevice::Cpu.open().unwrap();
        let (loss_cpu, grad_cpu) = loss_and_grad(&config, Some(cpu));
        assert_eq!(loss.to_bits(), loss_cpu.to_bits());
        assert_eq!(grad, grad_cpu);
        assert!(
            grad.iter().any(|g| g.abs() > 1e-3),
            "gradient is all but zero"
        );
    }
}

/// GPU 0 gives the CPU's loss and gradient within float tolerance on the GPT and the MLP.
/// Fails, with the reason, on a build without CUDA or a host without a usable GPU.
#[test]
#[ignore = "needs a CUDA GPU and the cuda build: scripts/gpu-check.sh runs it"]
fn gpu_zero_matches_the_cpu() {
    let gpu = TrainerDevice::Cuda(0)
        .open()
        .unwrap_or_else(|e| panic!("this test trains on GPU 0 and cannot open it: {e}"));
    assert!(gpu.is_cuda());
    for config in configs() {
        let (loss, grad) = loss_and_grad(&config, None);
        let (loss_gpu, grad_gpu) = loss_and_grad(&config, Some(gpu.clone()));
        assert!(
            (loss - loss_gpu).abs() <= 1e-4 * loss.abs(),
            "{loss} vs {loss_gpu}"
        );
        let scale = grad.iter().fold(0.0f32, |m, g| m.max(g.abs()));
        for (i, (a, b)) in grad.iter().zip(&grad_gpu).enumerate() {
            assert!(
                (a - b).abs() <= 1e-3 * scale,
                "grad[{i}]: cpu {a} vs gpu {b}"
            );
        }
    }
}

/// GPU 0's memory is readable, and a model's parameters on it show in what is used.
#[test]
#[ignore = "needs a CUDA GPU and the cuda build: scripts/gpu-check.sh runs it"]
fn gpu_memory_is_reported_and_moves_with_allocations() {
    let gpu = TrainerDevice::Cuda(0)
        .open()
        .unwrap_or_else(|e| panic!("this test reads GPU 0's memory and cannot open it: {e}"));
    let before = murmur_trainer::device_memory(&gpu).expect("GPU 0 reports its memory");
    assert!(
        before.total > 0 && before.used <= before.total,
        "{before:?}"
    );
    // 256 MiB of f32 on the device.
    let held = candle_core::Tensor::zeros(64 << 20, candle_core::DType::F32, &gpu)
        .expect("allocates 256 MiB on GPU 0");
    gpu.synchronize().expect("GPU 0 finishes its work");
    let after = murmur_trainer::device_memory(&gpu).expect("GPU 0 reports its memory");
    assert_eq!(after.total, before.total);
    assert!(
        after.used >= before.used + (200 << 20),
        "256 MiB allocated, used went from {} to {} bytes",
        before.used,
        after.used
    );
    drop(held);
}

/// The CPU build refuses a GPU with an error that says how to get a GPU build.
#[cfg(not(feature = "cuda"))]
#[test]
fn a_cpu_build_refuses_the_gpu_and_says_how() {
    const { assert!(!TrainerDevice::CUDA_BUILT) };
    match TrainerDevice::Cuda(0).open() {
        Err(error @ DeviceError::NotBuilt { ordinal: 0 }) => {
            assert!(error.to_string().contains("--features cuda"), "{error}");
        }
        other => panic!("a CPU build opened GPU 0 as {other:?}"),
    }
}

/// In the CUDA build, a GPU the host does not have is an error with the driver's reason,
/// not a panic. (The CUDA build starts only where the NVIDIA driver is installed.)
#[cfg(feature = "cuda")]
#[test]
fn an_absent_gpu_is_an_error_with_a_reason() {
    const { assert!(TrainerDevice::CUDA_BUILT) };
    match TrainerDevice::Cuda(4096).open() {
        Err(DeviceError::Open {
            ordinal: 4096,
            message,
        }) => assert!(!message.is_empty()),
        other => panic!("opening GPU 4096 gave {other:?}"),
    }
}
