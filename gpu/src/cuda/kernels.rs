//! The CUDA C sources of the kernels, how NVRTC compiles them, and the loaded functions.
//!
//! Each source is one concern (`float.cu`, `blockwise.cu`, `sign1.cu`, `mixing.cu`,
//! `clip.cu`) and is compiled with `prelude.cuh` in front of it. The options make the
//! arithmetic exact: `--fmad=false` so nothing is contracted into a fused multiply-add,
//! `--ftz=false` so subnormals survive, IEEE division and square root. The kernels also
//! spell every float operation as a round-to-nearest intrinsic (`__fadd_rn`, ...), so they
//! stay exact whatever options a future change passes.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx, compile_ptx_with_opts};

use crate::GpuError;

use super::driver_error;

/// Helpers every source starts with.
const PRELUDE: &str = include_str!("kernels/prelude.cuh");

/// One kernel source file and the kernels it defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSource {
    /// The source's name, e.g. `"blockwise"`.
    pub name: &'static str,
    /// The CUDA C text, without the prelude.
    pub body: &'static str,
    /// The `extern "C"` kernels it defines.
    pub kernels: &'static [&'static str],
}

impl KernelSource {
    /// The full text NVRTC compiles: the prelude, then the body.
    pub fn source(&self) -> String {
        format!("{PRELUDE}\n{}", self.body)
    }
}

/// Every kernel source murmur compiles.
pub const KERNEL_SOURCES: [KernelSource; 5] = [
    KernelSource {
        name: "float",
        body: include_str!("kernels/float.cu"),
        kernels: &[
            "encode_f32",
            "validate_f32",
            "decode_f32",
            "encode_f16",
            "validate_halves",
            "decode_f16",
            "encode_bf16",
            "decode_bf16",
        ],
    },
    KernelSource {
        name: "blockwise",
        body: include_str!("kernels/blockwise.cu"),
        kernels: &[
            "encode_int8",
            "encode_int4",
            "validate_scales",
            "decode_int8",
            "decode_int4",
        ],
    },
    KernelSource {
        name: "sign1",
        body: include_str!("kernels/sign1.cu"),
        kernels: &["encode_sign1", "decode_sign1"],
    },
    KernelSource {
        name: "mixing",
        body: include_str!("kernels/mixing.cu"),
        kernels: &[
            "fill",
            "scale",
            "axpy",
            "axpby",
            "feedback_correct",
            "feedback_commit",
        ],
    },
    KernelSource {
        name: "clip",
        body: include_str!("kernels/clip.cu"),
        kernels: &["clip_tile_distances", "clip_step"],
    },
];

/// The NVRTC options every source is compiled with. `arch` is a virtual architecture such
/// as `"compute_90"`; `None` leaves NVRTC's default, whose PTX the driver JIT-compiles for
/// any newer GPU.
pub fn compile_options(arch: Option<&'static str>) -> CompileOptions {
    CompileOptions {
        ftz: Some(false),
        prec_sqrt: Some(true),
        prec_div: Some(true),
        fmad: Some(false),
        arch,
        ..CompileOptions::default()
    }
}

/// Compiles one source to PTX.
///
/// NVRTC must be present: check `cudarc::nvrtc::sys::is_culib_present()` first (as
/// [`detect`](crate::detect) does), because cudarc panics when it cannot load the library.
pub fn compile(source: &KernelSource, arch: Option<&'static str>) -> Result<Ptx, GpuError> {
    let options = CompileOptions {
        name: Some(format!("{}.cu", source.name)),
        ..compile_options(arch)
    };
    compile_ptx_with_opts(source.source(), options).map_err(|e| {
        let (error, log) = match e {
            CompileError::CompileError { nvrtc, log, .. } => {
                (nvrtc.to_string(), log.to_string_lossy().into_owned())
            }
            other => (other.to_string(), String::new()),
        };
        GpuError::KernelCompile {
            source_name: source.name,
            error,
            log,
        }
    })
}

/// The virtual architecture matching a device's compute capability, when murmur knows it;
/// PTX for it lets the compiler use everything the device has.
pub(crate) fn arch_for(compute_capability: (u32, u32)) -> Option<&'static str> {
    Some(match compute_capability {
        (7, 0) => "compute_70",
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        _ => return None,
    })
}

/// Every kernel, loaded into one context.
#[derive(Debug)]
pub(crate) struct Kernels {
    pub(crate) encode_f32: CudaFunction,
    pub(crate) validate_f32: CudaFunction,
    pub(crate) decode_f32: CudaFunction,
    pub(crate) encode_f16: CudaFunction,
    pub(crate) validate_halves: CudaFunction,
    pub(crate) decode_f16: CudaFunction,
    pub(crate) encode_bf16: CudaFunction,
    pub(crate) decode_bf16: CudaFunction,
    pub(crate) encode_int8: CudaFunction,
    pub(crate) encode_int4: CudaFunction,
    pub(crate) validate_scales: CudaFunction,
    pub(crate) decode_int8: CudaFunction,
    pub(crate) decode_int4: CudaFunction,
    pub(crate) encode_sign1: CudaFunction,
    pub(crate) decode_sign1: CudaFunction,
    pub(crate) fill: CudaFunction,
    pub(crate) scale: CudaFunction,
    pub(crate) axpy: CudaFunction,
    pub(crate) axpby: CudaFunction,
    pub(crate) feedback_correct: CudaFunction,
    pub(crate) feedback_commit: CudaFunction,
    pub(crate) clip_tile_distances: CudaFunction,
    pub(crate) clip_step: CudaFunction,
}

impl Kernels {
    /// Compiles every source for `arch` and loads it into `ctx`.
    pub(crate) fn load(
        ctx: &Arc<CudaContext>,
        arch: Option<&'static str>,
    ) -> Result<Self, GpuError> {
        let [float, blockwise, sign1, mixing, clip] = KERNEL_SOURCES;
        let load = |source: &KernelSource| {
            let ptx = compile(source, arch)?;
            ctx.load_module(ptx)
                .map_err(|e| driver_error("loading the kernels", e))
        };
        let function = |module: &Arc<cudarc::driver::CudaModule>, name: &str| {
            module
                .load_function(name)
                .map_err(|e| driver_error("loading the kernels", e))
        };
        let float = load(&float)?;
        let blockwise = load(&blockwise)?;
        let sign1 = load(&sign1)?;
        let mixing = load(&mixing)?;
        let clip = load(&clip)?;
        Ok(Kernels {
            encode_f32: function(&float, "encode_f32")?,
            validate_f32: function(&float, "validate_f32")?,
            decode_f32: function(&float, "decode_f32")?,
            encode_f16: function(&float, "encode_f16")?,
            validate_halves: function(&float, "validate_halves")?,
            decode_f16: function(&float, "decode_f16")?,
            encode_bf16: function(&float, "encode_bf16")?,
            decode_bf16: function(&float, "decode_bf16")?,
            encode_int8: function(&blockwise, "encode_int8")?,
            encode_int4: function(&blockwise, "encode_int4")?,
            validate_scales: function(&blockwise, "validate_scales")?,
            decode_int8: function(&blockwise, "decode_int8")?,
            decode_int4: function(&blockwise, "decode_int4")?,
            encode_sign1: function(&sign1, "encode_sign1")?,
            decode_sign1: function(&sign1, "decode_sign1")?,
            fill: function(&mixing, "fill")?,
            scale: function(&mixing, "scale")?,
            axpy: function(&mixing, "axpy")?,
            axpby: function(&mixing, "axpby")?,
            feedback_correct: function(&mixing, "feedback_correct")?,
            feedback_commit: function(&mixing, "feedback_commit")?,
            clip_tile_distances: function(&clip, "clip_tile_distances")?,
            clip_step: function(&clip, "clip_step")?,
        })
    }
}
