//! Timing the device kernels for [`crate::bench`].

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, DriverError};
use murmur_protocol::codec::{CodecError, CodecSpec};

use super::codec::{CodecLaunch, wire_layout};
use super::{CudaBackend, driver_error, ensure_len};
use crate::bench::{CodecThroughput, bench_values, median};
use crate::{Backend, GpuError};

impl CudaBackend {
    pub(crate) fn codec_throughput(
        &mut self,
        spec: CodecSpec,
        elements: usize,
        repeats: usize,
    ) -> Result<CodecThroughput, GpuError> {
        const OP: &str = "bench";
        let Some(layout) = wire_layout(spec, elements) else {
            return Err(CodecError::InvalidSpec {
                reason: "topk runs through the reference codec on the host in the CUDA \
                         backend; benchmark it with --device cpu"
                    .to_owned(),
            }
            .into());
        };
        spec.validate()?;
        let err = |e| driver_error(OP, e);
        let values = bench_values(elements);
        let mut src = self.alloc(elements)?;
        self.upload(&values, &mut src, 0..elements)?;
        let mut acc = self.alloc(elements)?;
        let total = layout.total();
        ensure_len(&self.compute, &mut self.wire, total.max(1), OP)?;
        let encode_cfg = self.codec_cfg(spec, elements);
        let validate_cfg = self.validate_cfg(spec, elements);
        let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let events = (
            self.ctx.new_event(timing).map_err(err)?,
            self.ctx.new_event(timing).map_err(err)?,
        );
        let encode_ms = self.median_ms(&events, repeats, &mut |b| {
            b.compute.memset_zeros(&mut b.status)?;
            let values = src.slice.slice(..elements);
            let launch = CodecLaunch {
                kernels: &b.kernels,
                stream: &b.compute,
                cfg: encode_cfg,
                spec,
            };
            let (mut scales, mut data) = b.wire.split_at_mut(layout.scales);
            launch.encode(&values, &mut scales, &mut data, &mut b.status)
        })?;
        let decode_ms = self.median_ms(&events, repeats, &mut |b| {
            b.compute.memset_zeros(&mut b.status)?;
            let validate = CodecLaunch {
                kernels: &b.kernels,
                stream: &b.compute,
                cfg: validate_cfg,
                spec,
            };
            let launch = CodecLaunch {
                cfg: encode_cfg,
                ..validate
            };
            let (scales, data) = b.wire.split_at(layout.scales);
            validate.validate(elements, &scales, &data, &mut b.status)?;
            let mut out = acc.slice.slice_mut(..elements);
            launch.decode(&scales, &data, Some(0.5), &mut out, &b.status)
        })?;
        // The last decode-accumulate must have passed validation, or the bench measured
        // kernels that did nothing.
        if self.finish(OP)? != [None, None] {
            return Err(GpuError::KernelMismatch {
                op: OP,
                codec: spec.name(),
            });
        }
        let copy_ms = self.median_ms(&events, repeats, &mut |b| {
            let from = src.slice.slice(..elements);
            let mut to = acc.slice.slice_mut(..elements);
            b.compute.memcpy_dtod(&from, &mut to)
        })?;
        let gbps = |ms: f32| (elements * 4) as f64 / (f64::from(ms) * 1e-3) / 1e9;
        Ok(CodecThroughput {
            spec,
            elements,
            encoded_bytes: total,
            repeats,
            encode_gbps: gbps(encode_ms),
            decode_accumulate_gbps: gbps(decode_ms),
            copy_gbps: gbps(copy_ms),
            device: self.device.to_string(),
        })
    }

    /// The median time of `repeats` runs of `op` on the compute stream, after one untimed
    /// run that warms caches and clocks.
    fn median_ms(
        &mut self,
        (start, end): &(CudaEvent, CudaEvent),
        repeats: usize,
        op: &mut dyn FnMut(&mut CudaBackend) -> Result<(), DriverError>,
    ) -> Result<f32, GpuError> {
        let err = |e| driver_error("bench", e);
        op(self).map_err(err)?;
        let mut times = Vec::with_capacity(repeats);
        for _ in 0..repeats {
            start.record(&self.compute).map_err(err)?;
            op(self).map_err(err)?;
            end.record(&self.compute).map_err(err)?;
            times.push(start.elapsed_ms(end).map_err(err)?);
        }
        Ok(median(&mut times))
    }
}
