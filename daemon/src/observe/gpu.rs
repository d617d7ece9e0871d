//! [`GpuMetrics`]: device memory and device time, registered only when a GPU does work.

use prometheus::{CounterVec, IntCounterVec, IntGauge, Opts, Registry};

use super::ObserveError;
use super::registry::{named, register};
use super::training::saturating_i64;

/// The `murmur_gpu_*` metrics. A no-op on hosts without a GPU at work (see
/// [`MetricsOptions::gpu`](super::MetricsOptions::gpu)) and when disabled.
#[derive(Debug, Clone)]
pub(crate) struct GpuMetrics {
    inner: Option<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    memory_used: IntGauge,
    memory_total: IntGauge,
    kernel_seconds: CounterVec,
    transfer_bytes: IntCounterVec,
}

impl GpuMetrics {
    pub(super) fn register(registry: &Registry) -> Result<GpuMetrics, ObserveError> {
        let name = "murmur_gpu_memory_used_bytes";
        let memory_used = named(name, IntGauge::new(name, "Device memory in use."))?;
        let name = "murmur_gpu_memory_total_bytes";
        let memory_total = named(name, IntGauge::new(name, "Device memory in all."))?;
        let name = "murmur_gpu_kernel_seconds_total";
        let help = "Seconds of device work, by kind: forward_backward (a training step's \
                    passes, with the parameter upload, gradient download and the batch's draw) or \
                    a communication kernel.";
        let kernel_seconds = named(name, CounterVec::new(Opts::new(name, help), &["kernel"]))?;
        let name = "murmur_gpu_transfer_bytes_total";
        let help = "Bytes the trainer copied between host and device memory (over PCIe on a \
                    discrete GPU), by direction: to_device or to_host.";
        let transfer_bytes = named(
            name,
            IntCounterVec::new(Opts::new(name, help), &["direction"]),
        )?;
        // Both series from the start, at 0, so that a rate over them is defined at once.
        for direction in ["to_device", "to_host"] {
            transfer_bytes.with_label_values(&[direction]);
        }
        let inner = Inner {
            memory_used,
            memory_total,
            kernel_seconds,
            transfer_bytes,
        };
        register(registry, inner.memory_used.clone())?;
        register(registry, inner.memory_total.clone())?;
        register(registry, inner.kernel_seconds.clone())?;
        register(registry, inner.transfer_bytes.clone())?;
        Ok(GpuMetrics { inner: Some(inner) })
    }

    pub(super) fn disabled() -> GpuMetrics {
        GpuMetrics { inner: None }
    }

    /// Device memory now: `used` of `total` bytes.
    pub(crate) fn set_memory(&self, used: u64, total: u64) {
        if let Some(m) = &self.inner {
            m.memory_used.set(saturating_i64(used));
            m.memory_total.set(saturating_i64(total));
        }
    }

    /// The trainer copied `to_device` more bytes to the device and `to_host` more back.
    pub(crate) fn record_transfer(&self, to_device: u64, to_host: u64) {
        if let Some(m) = &self.inner {
            m.transfer_bytes
                .with_label_values(&["to_device"])
                .inc_by(to_device);
            m.transfer_bytes
                .with_label_values(&["to_host"])
                .inc_by(to_host);
        }
    }

    /// `kernel` (a fixed name such as `forward_backward` or `encode`) ran on the device for
    /// `seconds`. Call once per batch of launches, not per launch: it looks the series up by
    /// its label.
    pub(crate) fn record_kernel_time(&self, kernel: &'static str, seconds: f64) {
        if let Some(m) = &self.inner
            && seconds.is_finite()
            && seconds > 0.0
        {
            m.kernel_seconds
                .with_label_values(&[kernel])
                .inc_by(seconds);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_kernel_time_and_transfers_are_exported_and_bad_durations_ignored() {
        let registry = Registry::new();
        let m = GpuMetrics::register(&registry).expect("registers");
        m.set_memory(3 << 30, 80 << 30);
        m.record_kernel_time("encode", 0.25);
        m.record_kernel_time("encode", 0.5);
        // A negative or NaN duration would make the counter go down or poison it.
        m.record_kernel_time("encode", -1.0);
        m.record_kernel_time("encode", f64::NAN);
        m.record_transfer(1000, 10);
        m.record_transfer(500, 0);
        let mut out = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut out,
        )
        .expect("encodes");
        let text = String::from_utf8(out).expect("utf-8");
        let expect = [
            "murmur_gpu_memory_used_bytes 3221225472",
            "murmur_gpu_memory_total_bytes 85899345920",
            r#"murmur_gpu_kernel_seconds_total{kernel="encode"} 0.75"#,
            r#"murmur_gpu_transfer_bytes_total{direction="to_device"} 1500"#,
            r#"murmur_gpu_transfer_bytes_total{direction="to_host"} 10"#,
        ];
        for line in expect {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
