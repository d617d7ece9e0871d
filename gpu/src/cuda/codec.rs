//! Encoding and decoding on the device: which kernels run for each codec, where the parts
//! of an encoded tensor lie, and the host path for `topk`.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DriverError, LaunchConfig, PushKernelArg,
};
use murmur_protocol::codec::{Codec, CodecError, CodecSpec};

use super::kernels::Kernels;
use super::transfer::{download_into, upload_from};
use super::{CudaBackend, CudaBuffer, count, driver_error, ensure_len};
use crate::GpuError;

/// Where the pieces of an encoded part lie, in bytes: block scales first, then the packed
/// elements (the float codecs have no scales).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WireLayout {
    pub(crate) scales: usize,
    pub(crate) data: usize,
}

impl WireLayout {
    /// The encoded length: for these codecs exact, and equal to `Codec::max_encoded_len`.
    pub(crate) fn total(&self) -> usize {
        self.scales + self.data
    }
}

/// The layout of `n` elements encoded with `spec`; `None` for `topk`, which the host
/// encodes.
pub(crate) fn wire_layout(spec: CodecSpec, n: usize) -> Option<WireLayout> {
    let scales = |block: u32| n.div_ceil(block as usize) * 4;
    let (scales, data) = match spec {
        CodecSpec::F32 => (0, n * 4),
        CodecSpec::F16 | CodecSpec::Bf16 => (0, n * 2),
        CodecSpec::Int8 { block } => (scales(block), n),
        CodecSpec::Int4 { block } => (scales(block), n.div_ceil(2)),
        CodecSpec::Sign1 { block } => (scales(block), n.div_ceil(8)),
        CodecSpec::TopK { .. } => return None,
    };
    Some(WireLayout { scales, data })
}

/// Whether the unused bits at the end of a packed part are zero, as the reference decoder
/// requires (odd `int4` parts, `sign1` parts not a multiple of 8).
fn padding_is_zero(spec: CodecSpec, src: &[u8], n: usize) -> bool {
    let last = src.last().copied().unwrap_or(0);
    match spec {
        CodecSpec::Int4 { .. } if n % 2 == 1 => last >> 4 == 0,
        CodecSpec::Sign1 { .. } if !n.is_multiple_of(8) => last >> (n % 8) == 0,
        _ => true,
    }
}

impl CudaBackend {
    /// The launch shape of `spec`'s encode and decode kernels for `n` elements: one warp
    /// per block for the blockwise codecs, one thread per element for the others.
    pub(super) fn codec_cfg(&self, spec: CodecSpec, n: usize) -> LaunchConfig {
        match spec.block() {
            Some(block) => self.per_block(n.div_ceil(block as usize)),
            None => self.elementwise(n),
        }
    }

    /// The launch shape of `spec`'s validation kernel for `n` elements: one thread per
    /// scale for the blockwise codecs, one per element for the others.
    pub(super) fn validate_cfg(&self, spec: CodecSpec, n: usize) -> LaunchConfig {
        match spec.block() {
            Some(block) => self.elementwise(n.div_ceil(block as usize)),
            None => self.elementwise(n),
        }
    }
}

/// One codec's kernels, ready to queue on a stream with a launch shape.
#[derive(Debug, Clone, Copy)]
pub(super) struct CodecLaunch<'a> {
    pub(super) kernels: &'a Kernels,
    pub(super) stream: &'a Arc<CudaStream>,
    pub(super) cfg: LaunchConfig,
    pub(super) spec: CodecSpec,
}

impl CodecLaunch<'_> {
    /// Queues the encode kernel: `src` (n elements) into `scales` and `data`, flagging the
    /// first non-finite element in `status[0]`.
    pub(super) fn encode(
        &self,
        src: &CudaView<'_, f32>,
        scales: &mut CudaViewMut<'_, u8>,
        data: &mut CudaViewMut<'_, u8>,
        status: &mut CudaSlice<u64>,
    ) -> Result<(), DriverError> {
        let kernels = self.kernels;
        let (function, block) = match self.spec {
            CodecSpec::F32 => (&kernels.encode_f32, None),
            CodecSpec::F16 => (&kernels.encode_f16, None),
            CodecSpec::Bf16 => (&kernels.encode_bf16, None),
            CodecSpec::Int8 { block } => (&kernels.encode_int8, Some(block)),
            CodecSpec::Int4 { block } => (&kernels.encode_int4, Some(block)),
            CodecSpec::Sign1 { block } => (&kernels.encode_sign1, Some(block)),
            CodecSpec::TopK { .. } => return Ok(()),
        };
        let n = count(src.len());
        let mut launch = self.stream.launch_builder(function);
        launch.arg(src).arg(&n);
        if let Some(block) = &block {
            launch.arg(block).arg(scales);
        }
        launch.arg(data).arg(status);
        // SAFETY: the float encoders are (const float* src, u64 n, u8* dst, u64* status)
        // and the blockwise ones (const float* src, u64 n, u32 block, u8* scales, u8* q,
        // u64* status); the arguments above follow those lists. `scales` and `data` hold
        // the sizes `wire_layout` gives for n elements, which is what the kernels write.
        unsafe { launch.launch(self.cfg) }.map(drop)
    }

    /// Queues the check of a received part of `n` elements: bad scales or non-finite
    /// elements are flagged in `status[1]`.
    pub(super) fn validate(
        &self,
        n: usize,
        scales: &CudaView<'_, u8>,
        data: &CudaView<'_, u8>,
        status: &mut CudaSlice<u64>,
    ) -> Result<(), DriverError> {
        let kernels = self.kernels;
        let (function, mask, max_level) = match self.spec {
            CodecSpec::F32 => (&kernels.validate_f32, None, None),
            CodecSpec::F16 => (&kernels.validate_halves, Some(0x7c00u32), None),
            CodecSpec::Bf16 => (&kernels.validate_halves, Some(0x7f80u32), None),
            CodecSpec::Int8 { .. } => (&kernels.validate_scales, None, Some(127.0f32)),
            // A nibble can hold −8, one level past what the encoder writes.
            CodecSpec::Int4 { .. } => (&kernels.validate_scales, None, Some(8.0f32)),
            CodecSpec::Sign1 { .. } => (&kernels.validate_scales, None, Some(1.0f32)),
            CodecSpec::TopK { .. } => return Ok(()),
        };
        let elements = count(n);
        let blocks = self.spec.block().map(|b| count(n.div_ceil(b as usize)));
        let mut launch = self.stream.launch_builder(function);
        match (&blocks, &max_level) {
            (Some(blocks), Some(level)) => launch.arg(scales).arg(blocks).arg(level),
            _ => launch.arg(data).arg(&elements),
        };
        if let Some(mask) = &mask {
            launch.arg(mask);
        }
        launch.arg(status);
        // SAFETY: validate_f32(const u8*, u64 n, u64* status), validate_halves(const u8*,
        // u64 n, u32 exp_mask, u64* status) and validate_scales(const u8* scales, u64
        // blocks, float max_level, u64* status) read n elements or `blocks` scales, which
        // the views hold.
        unsafe { launch.launch(self.cfg) }.map(drop)
    }

    /// Queues the decode kernel: writes (or, with a weight, accumulates into) `out` unless
    /// an earlier step flagged the operation.
    pub(super) fn decode(
        &self,
        scales: &CudaView<'_, u8>,
        data: &CudaView<'_, u8>,
        weight: Option<f32>,
        out: &mut CudaViewMut<'_, f32>,
        status: &CudaSlice<u64>,
    ) -> Result<(), DriverError> {
        let kernels = self.kernels;
        let (function, block) = match self.spec {
            CodecSpec::F32 => (&kernels.decode_f32, None),
            CodecSpec::F16 => (&kernels.decode_f16, None),
            CodecSpec::Bf16 => (&kernels.decode_bf16, None),
            CodecSpec::Int8 { block } => (&kernels.decode_int8, Some(block)),
            CodecSpec::Int4 { block } => (&kernels.decode_int4, Some(block)),
            CodecSpec::Sign1 { block } => (&kernels.decode_sign1, Some(block)),
            CodecSpec::TopK { .. } => return Ok(()),
        };
        let n = count(out.len());
        let w = weight.unwrap_or(1.0);
        let accumulate = i32::from(weight.is_some());
        let mut launch = self.stream.launch_builder(function);
        match &block {
            Some(block) => launch.arg(scales).arg(data).arg(&n).arg(block),
            None => launch.arg(data).arg(&n),
        };
        launch.arg(&w).arg(&accumulate).arg(out).arg(status);
        // SAFETY: the float decoders are (const u8* src, u64 n, float w, int accumulate,
        // float* out, const u64* status) and the blockwise ones (const u8* scales, const
        // u8* q, u64 n, u32 block, float w, int accumulate, float* out, const u64* status);
        // the views hold what `wire_layout` gives for n elements and `out` n elements.
        unsafe { launch.launch(self.cfg) }.map(drop)
    }
}

impl CudaBackend {
    /// Encodes `src[range]` into `dst` on the device; only the encoded bytes cross PCIe.
    pub(super) fn encode_part(
        &mut self,
        codec: &mut Codec,
        src: &CudaBuffer,
        range: Range<usize>,
        dst: &mut [u8],
    ) -> Result<usize, GpuError> {
        const OP: &str = "encode";
        let spec = codec.spec();
        let n = range.len();
        let Some(layout) = wire_layout(spec, n) else {
            self.download_to_scratch(src, range, OP)?;
            return Ok(codec.encode(&self.host_values[..n], dst)?);
        };
        let needed = layout.total();
        if dst.len() < needed {
            return Err(CodecError::BufferTooSmall {
                needed,
                available: dst.len(),
            }
            .into());
        }
        if n == 0 {
            return Ok(0);
        }
        ensure_len(&self.compute, &mut self.wire, needed, OP)?;
        self.reset_status(OP)?;
        let launch = CodecLaunch {
            kernels: &self.kernels,
            stream: &self.compute,
            cfg: self.codec_cfg(spec, n),
            spec,
        };
        let queued = {
            let values = src.slice.slice(range);
            let (mut scales, mut data) = self.wire.split_at_mut(layout.scales);
            launch.encode(&values, &mut scales, &mut data, &mut self.status)
        };
        queued.map_err(|e| driver_error(OP, e))?;
        self.staging
            .download(&self.copy, &self.wire.slice(..needed), &mut dst[..needed])
            .map_err(|e| driver_error(OP, e))?;
        match self.finish(OP)? {
            [Some(index), _] => Err(CodecError::NonFiniteInput { index }.into()),
            _ => Ok(needed),
        }
    }

    /// Encodes `src[range] + residual[range]` and keeps what the send lost in
    /// `residual[range]`, all on the device, in the steps `ErrorFeedback` takes.
    pub(super) fn encode_part_with_feedback(
        &mut self,
        codec: &mut Codec,
        src: &CudaBuffer,
        residual: &mut CudaBuffer,
        range: Range<usize>,
        dst: &mut [u8],
    ) -> Result<usize, GpuError> {
        const OP: &str = "encode_with_feedback";
        let spec = codec.spec();
        let n = range.len();
        let Some(layout) = wire_layout(spec, n) else {
            return self.feedback_on_host(codec, src, residual, range, dst);
        };
        let needed = layout.total();
        if dst.len() < needed {
            return Err(CodecError::BufferTooSmall {
                needed,
                available: dst.len(),
            }
            .into());
        }
        if n == 0 {
            return Ok(0);
        }
        ensure_len(&self.compute, &mut self.wire, needed, OP)?;
        ensure_len(&self.compute, &mut self.corrected, n, OP)?;
        self.reset_status(OP)?;
        let mix = self.elementwise(n);
        let launch = CodecLaunch {
            kernels: &self.kernels,
            stream: &self.compute,
            cfg: self.codec_cfg(spec, n),
            spec,
        };
        let elements = count(n);
        let queued = (|| {
            let values = src.slice.slice(range.clone());
            let mut corrected = self.corrected.slice_mut(..n);
            {
                let carried = residual.slice.slice(range.clone());
                let mut correct = self.compute.launch_builder(&self.kernels.feedback_correct);
                correct
                    .arg(&values)
                    .arg(&carried)
                    .arg(&mut corrected)
                    .arg(&elements);
                // SAFETY: feedback_correct(const float* x, const float* residual, float*
                // corrected, u64 n); all three views hold n elements.
                unsafe { correct.launch(mix) }?;
            }
            {
                let sent = corrected.as_view();
                let (mut scales, mut data) = self.wire.split_at_mut(layout.scales);
                launch.encode(&sent, &mut scales, &mut data, &mut self.status)?;
            }
            // corrected − decode(sent), in place: the decoder adds −1 × decoded.
            let (scales, data) = self.wire.split_at(layout.scales);
            launch.validate(n, &scales, &data, &mut self.status)?;
            launch.decode(&scales, &data, Some(-1.0), &mut corrected, &self.status)?;
            let lost = corrected.as_view();
            let mut carried = residual.slice.slice_mut(range.clone());
            let mut commit = self.compute.launch_builder(&self.kernels.feedback_commit);
            commit
                .arg(&lost)
                .arg(&mut carried)
                .arg(&elements)
                .arg(&self.status);
            // SAFETY: feedback_commit(const float* corrected, float* residual, u64 n, const
            // u64* status); both views hold n elements.
            unsafe { commit.launch(mix) }.map(drop)
        })();
        queued.map_err(|e| driver_error(OP, e))?;
        self.staging
            .download(&self.copy, &self.wire.slice(..needed), &mut dst[..needed])
            .map_err(|e| driver_error(OP, e))?;
        match self.finish(OP)? {
            [Some(index), _] => Err(CodecError::NonFiniteInput { index }.into()),
            [None, Some(_)] => Err(self.name_rejection(codec, &dst[..needed], n, OP)),
            [None, None] => Ok(needed),
        }
    }

    /// Decodes `src` into `out[range]`, or with a weight adds `weight × decoded` to it. The
    /// encoded bytes cross PCIe; the device validates them before anything is written.
    pub(super) fn decode_part(
        &mut self,
        codec: &mut Codec,
        src: &[u8],
        weight: Option<f32>,
        out: &mut CudaBuffer,
        range: Range<usize>,
    ) -> Result<(), GpuError> {
        let op = if weight.is_some() {
            "decode_accumulate"
        } else {
            "decode"
        };
        if let Some(weight) = weight
            && !weight.is_finite()
        {
            return Err(CodecError::InvalidWeight { weight }.into());
        }
        let spec = codec.spec();
        let n = range.len();
        let Some(layout) = wire_layout(spec, n) else {
            return self.decode_on_host(codec, src, weight, out, range, op);
        };
        let expected = layout.total();
        if src.len() != expected {
            return Err(CodecError::EncodedLength {
                codec: spec.name(),
                elements: n,
                expected,
                got: src.len(),
            }
            .into());
        }
        if n == 0 {
            return Ok(());
        }
        if !padding_is_zero(spec, src, n) {
            return Err(self.name_rejection(codec, src, n, op));
        }
        ensure_len(&self.compute, &mut self.wire, expected, op)?;
        self.reset_status(op)?;
        let validate = CodecLaunch {
            kernels: &self.kernels,
            stream: &self.compute,
            cfg: self.validate_cfg(spec, n),
            spec,
        };
        let launch = CodecLaunch {
            cfg: self.codec_cfg(spec, n),
            ..validate
        };
        let queued = (|| {
            let mut wire = self.wire.slice_mut(..expected);
            self.staging.upload(&self.copy, src, &mut wire)?;
            let (scales, data) = self.wire.split_at(layout.scales);
            validate.validate(n, &scales, &data, &mut self.status)?;
            let mut target = out.slice.slice_mut(range.clone());
            launch.decode(&scales, &data, weight, &mut target, &self.status)
        })();
        queued.map_err(|e| driver_error(op, e))?;
        match self.finish(op)? {
            [_, Some(_)] => Err(self.name_rejection(codec, src, n, op)),
            _ => Ok(()),
        }
    }

    /// The error the reference decoder gives for a part the device (or the padding check)
    /// rejected, so that both backends report the same thing.
    fn name_rejection(
        &mut self,
        codec: &mut Codec,
        src: &[u8],
        n: usize,
        op: &'static str,
    ) -> GpuError {
        let scratch = match Self::host_scratch(&mut self.host_values, n) {
            Ok(scratch) => scratch,
            Err(e) => return e,
        };
        match codec.decode_into(src, scratch) {
            Err(e) => e.into(),
            Ok(()) => GpuError::KernelMismatch {
                op,
                codec: codec.spec().name(),
            },
        }
    }

    /// `topk` with error feedback, through the reference codec on the host.
    fn feedback_on_host(
        &mut self,
        codec: &mut Codec,
        src: &CudaBuffer,
        residual: &mut CudaBuffer,
        range: Range<usize>,
        dst: &mut [u8],
    ) -> Result<usize, GpuError> {
        const OP: &str = "encode_with_feedback";
        let n = range.len();
        self.download_to_scratch(src, range.clone(), OP)?;
        Self::host_scratch(&mut self.host_residual, n)?;
        download_into(
            &mut self.staging,
            &self.copy,
            residual,
            range.clone(),
            &mut self.host_residual[..n],
            OP,
        )?;
        // The same steps as `ErrorFeedback::encode`: t = x + e; send t; e' = t − decode.
        let corrected = &mut self.host_values[..n];
        for (t, e) in corrected.iter_mut().zip(&self.host_residual[..n]) {
            *t += e;
        }
        let written = codec.encode(corrected, dst)?;
        codec.decode_accumulate(&dst[..written], -1.0, corrected)?;
        upload_from(
            &mut self.staging,
            &self.copy,
            &self.host_values[..n],
            residual,
            range,
            OP,
        )?;
        Ok(written)
    }

    /// `topk` decoding through the reference codec on the host: the part's current values
    /// come over when accumulating, and the result goes back.
    fn decode_on_host(
        &mut self,
        codec: &mut Codec,
        src: &[u8],
        weight: Option<f32>,
        out: &mut CudaBuffer,
        range: Range<usize>,
        op: &'static str,
    ) -> Result<(), GpuError> {
        let n = range.len();
        match weight {
            Some(weight) => {
                self.download_to_scratch(out, range.clone(), op)?;
                codec.decode_accumulate(src, weight, &mut self.host_values[..n])?;
            }
            None => {
                let scratch = Self::host_scratch(&mut self.host_values, n)?;
                codec.decode_into(src, scratch)?;
            }
        }
        upload_from(
            &mut self.staging,
            &self.copy,
            &self.host_values[..n],
            out,
            range,
            op,
        )
    }
}

#[cfg(test)]
mod tests {
    use murmur_protocol::codec::{Codec, CodecError, CodecSpec};

    use super::{padding_is_zero, wire_layout};

    fn specs() -> Vec<CodecSpec> {
        let mut specs = vec![CodecSpec::F32, CodecSpec::F16, CodecSpec::Bf16];
        for block in [32, 64, 136, 4096] {
            specs.push(CodecSpec::Int8 { block });
            specs.push(CodecSpec::Int4 { block });
            specs.push(CodecSpec::Sign1 { block });
        }
        specs
    }

    /// The device layout covers exactly the bytes the reference codec writes, for every
    /// codec, block size and length around block and byte boundaries.
    #[test]
    fn layout_matches_the_reference_length() {
        for spec in specs() {
            let codec = Codec::new(spec).unwrap();
            for n in (0..300).chain([4095, 4096, 4097, 100_003]) {
                let layout = wire_layout(spec, n).unwrap();
                assert_eq!(layout.total(), codec.max_encoded_len(n), "{spec} n={n}");
                let blocks = spec.block().map_or(0, |b| n.div_ceil(b as usize));
                assert_eq!(layout.scales, blocks * 4, "{spec} n={n}");
            }
        }
        assert_eq!(wire_layout(CodecSpec::TopK { keep_ppm: 10 }, 100), None);
    }

    /// The host padding check rejects exactly the parts whose padding the reference
    /// decoder rejects: every value of the last byte, for every tail length.
    #[test]
    fn padding_check_agrees_with_the_reference() {
        for spec in [
            CodecSpec::Int4 { block: 32 },
            CodecSpec::Sign1 { block: 32 },
        ] {
            for n in 1..=40 {
                let mut codec = Codec::new(spec).unwrap();
                let values: Vec<f32> = (0..n).map(|i| i as f32 - 20.0).collect();
                let mut wire = vec![0u8; codec.max_encoded_len(n)];
                codec.encode(&values, &mut wire).unwrap();
                for last in 0..=255u8 {
                    *wire.last_mut().unwrap() = last;
                    let mut out = vec![0.0; n];
                    let reference = codec.decode_into(&wire, &mut out);
                    let padding_rejected = matches!(
                        reference,
                        Err(CodecError::Corrupt { reason, .. }) if reason.contains("padding")
                    );
                    assert_eq!(
                        !padding_is_zero(spec, &wire, n),
                        padding_rejected,
                        "{spec} n={n} last={last:#04x}: {reference:?}"
                    );
                }
            }
        }
    }
}
