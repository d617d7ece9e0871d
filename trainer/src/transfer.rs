//! Bytes the trainer copies between host memory and a GPU's memory: on a discrete GPU,
//! what crosses PCIe. Counted for the whole process, because the bus is the process's, not
//! one model's; the daemon turns the totals into `murmur_gpu_transfer_bytes_total`.
//!
//! Every copy the trainer makes is counted where it is made: the parameters uploaded for a
//! step or an eval, the batch's token ids and targets, each gradient tensor downloaded, and
//! the loss. Copies between two tensors on the CPU count nothing.

use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::Device;

static TO_DEVICE: AtomicU64 = AtomicU64::new(0);
static TO_HOST: AtomicU64 = AtomicU64::new(0);

/// The bytes copied so far, each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferTotals {
    /// Host to device.
    pub to_device: u64,
    /// Device to host.
    pub to_host: u64,
}

/// The bytes this process's trainers have copied to and from GPUs since it started.
pub fn transfer_totals() -> TransferTotals {
    TransferTotals {
        to_device: TO_DEVICE.load(Ordering::Relaxed),
        to_host: TO_HOST.load(Ordering::Relaxed),
    }
}

/// Counts `bytes` copied from the host to `device` (nothing when `device` is the CPU).
pub(crate) fn uploaded(device: &Device, bytes: usize) {
    if !device.is_cpu() {
        TO_DEVICE.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// Counts `bytes` copied from `device` to the host (nothing when `device` is the CPU).
pub(crate) fn downloaded(device: &Device, bytes: usize) {
    if !device.is_cpu() {
        TO_HOST.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_on_the_cpu_count_nothing() {
        let before = transfer_totals();
        uploaded(&Device::Cpu, 1 << 20);
        downloaded(&Device::Cpu, 1 << 20);
        assert_eq!(transfer_totals(), before);
    }
}
