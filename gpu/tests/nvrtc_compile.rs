//! Every CUDA kernel source compiles to PTX with NVRTC, defines exactly the kernels the
//! backend loads, and compiles to exact arithmetic (no fused multiply-adds, no
//! flush-to-zero, no approximate division). No GPU is needed: only `libnvrtc.so.12`.
//!
//! Where NVRTC comes from: `scripts/install-nvrtc.sh` installs the PyPI wheel
//! `nvidia-cuda-nvrtc-cu12` and prints its library directory. cudarc opens NVRTC by name
//! through the dynamic loader, which reads `LD_LIBRARY_PATH` only when a process starts, so
//! when NVRTC is not on the loader's path but the wheel is installed (at
//! `$MURMUR_NVRTC_DIR`, default `target/nvrtc`), this test runs itself again in a child
//! process with that directory on `LD_LIBRARY_PATH`. `cargo test` therefore works right
//! after the install script, with nothing exported.
//!
//! Without NVRTC the test fails in CI (`CI` set, as every CI service does) and when
//! `MURMUR_REQUIRE_NVRTC=1`; on a developer machine it prints how to install NVRTC and
//! passes.

use std::path::PathBuf;
use std::process::Command;

use murmur_gpu::cuda::{KERNEL_SOURCES, compile};

const TEST_NAME: &str = "every_source_compiles_to_exact_ptx";
/// Set in the child process, so that a child that still cannot load NVRTC fails instead
/// of starting another child.
const CHILD_MARKER: &str = "MURMUR_NVRTC_CHILD";

/// The architectures the kernels are compiled for: NVRTC's default, the A100's and the
/// H100/H200's.
const ARCHES: [Option<&str>; 3] = [None, Some("compute_80"), Some("compute_90")];

#[cfg(not(feature = "link-cuda"))]
fn nvrtc_loadable() -> bool {
    // SAFETY: only opens and closes the candidate library names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// With `link-cuda` NVRTC is linked: the test would not have started without it.
#[cfg(feature = "link-cuda")]
fn nvrtc_loadable() -> bool {
    true
}

fn flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// The library directory of the NVRTC wheel that `scripts/install-nvrtc.sh` installs.
fn wheel_lib_dir() -> Option<PathBuf> {
    let prefix = std::env::var_os("MURMUR_NVRTC_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/nvrtc"),
        PathBuf::from,
    );
    let dir = prefix.join("nvidia/cuda_nvrtc/lib");
    dir.join("libnvrtc.so.12").is_file().then_some(dir)
}

/// The PTX's `.entry` names, in order.
fn entries(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|line| line.trim().strip_prefix(".visible .entry "))
        .map(|rest| rest.split('(').next().unwrap_or(rest).trim())
        .collect()
}

/// Compiles every source for every architecture here, in this process.
fn compile_everything() {
    for arch in ARCHES {
        for source in KERNEL_SOURCES {
            let label = format!(
                "{}.cu for {}",
                source.name,
                arch.unwrap_or("the default arch")
            );
            let ptx = compile(&source, arch)
                .unwrap_or_else(|e| panic!("{label} failed to compile: {e}"))
                .to_src();
            let mut found = entries(&ptx);
            found.sort_unstable();
            let mut expected = source.kernels.to_vec();
            expected.sort_unstable();
            assert_eq!(found, expected, "{label}: kernels defined vs. listed");
            // Exactness, checked on the compiled instructions themselves.
            for forbidden in [
                "fma.rn.f32",
                "fma.rn.f64",
                ".ftz.",
                "div.approx",
                "div.full",
            ] {
                assert!(
                    !ptx.contains(forbidden),
                    "{label} contains `{forbidden}`, which would change results"
                );
            }
            println!("{label}: {}", found.join(", "));
        }
    }
}

#[test]
fn every_source_compiles_to_exact_ptx() {
    if nvrtc_loadable() {
        compile_everything();
        return;
    }
    assert!(
        !flag(CHILD_MARKER),
        "NVRTC still does not load with LD_LIBRARY_PATH={:?}",
        std::env::var("LD_LIBRARY_PATH")
    );
    if let Some(dir) = wheel_lib_dir() {
        let path = match std::env::var("LD_LIBRARY_PATH") {
            Ok(old) if !old.is_empty() => format!("{}:{old}", dir.display()),
            _ => dir.display().to_string(),
        };
        let exe = std::env::current_exe().expect("the test binary's path");
        let status = Command::new(exe)
            .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
            .env("LD_LIBRARY_PATH", path)
            .env(CHILD_MARKER, "1")
            .status()
            .expect("the test binary runs again");
        assert!(
            status.success(),
            "compiling with NVRTC from {}",
            dir.display()
        );
        return;
    }
    let hint = "NVRTC (libnvrtc.so.12) is not installed: run scripts/install-nvrtc.sh \
                (it installs the nvidia-cuda-nvrtc-cu12 wheel into target/nvrtc)";
    assert!(
        !flag("CI") && !flag("MURMUR_REQUIRE_NVRTC"),
        "{hint}; CI must compile every kernel"
    );
    eprintln!("skipping the NVRTC compile test: {hint}");
}

/// The PTX parser above finds entries as NVRTC writes them, so that the main test cannot
/// pass by finding nothing.
#[test]
fn entries_are_parsed_from_ptx() {
    let ptx = "//\n.visible .entry encode_int8(\n\t.param .u64 p0\n)\n{\n}\n\
               .visible .entry fill(\n)\n.func helper()\n";
    assert_eq!(entries(ptx), ["encode_int8", "fill"]);
}
