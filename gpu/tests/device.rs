//! Device detection never panics and reports what this host really has.
//!
//! These tests hold on hosts with and without a GPU, so they run everywhere. With
//! `MURMUR_REQUIRE_GPU=1` (set by `scripts/gpu-check.sh`) a report of "no GPU" fails them
//! instead: on a GPU host, that report would be a fallback.

use murmur_gpu::{CudaUnavailable, DeviceReport, detect, detect_ordinal};

/// Whether the CUDA driver library can be loaded here, asked the way detection asks it.
#[cfg(not(feature = "link-cuda"))]
fn driver_library_present() -> bool {
    // SAFETY: only opens and closes the candidate library names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// With `link-cuda` the loader resolved the driver library before the test started.
#[cfg(feature = "link-cuda")]
fn driver_library_present() -> bool {
    true
}

/// Whether this run must find a GPU (`MURMUR_REQUIRE_GPU=1`).
fn gpu_required() -> bool {
    std::env::var("MURMUR_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// Without a driver library the report is CPU with that reason; with one, it is whatever
/// the driver says, and either way nothing panics and the answer is stable.
#[test]
fn report_matches_the_driver_library() {
    let report = detect();
    assert!(
        report.is_cuda() || !gpu_required(),
        "MURMUR_REQUIRE_GPU=1 but detection reports {report}"
    );
    if driver_library_present() {
        assert!(
            !matches!(
                report,
                DeviceReport::Cpu {
                    reason: CudaUnavailable::NoDriverLibrary
                }
            ),
            "the driver library loads but detection says it is missing: {report}"
        );
    } else {
        assert_eq!(
            report,
            DeviceReport::Cpu {
                reason: CudaUnavailable::NoDriverLibrary
            }
        );
        assert!(!report.is_cuda());
        let line = report.to_string();
        assert!(
            line.contains("CPU") && line.contains("libcuda.so"),
            "log line: {line}"
        );
    }
    assert_eq!(detect(), report, "a second probe must agree with the first");
}

/// An ordinal no host has is reported, not a panic; on a host with a driver it names the
/// device count.
#[test]
fn absent_ordinal_is_a_cpu_report() {
    let report = detect_ordinal(usize::MAX);
    match report {
        DeviceReport::Cpu {
            reason: CudaUnavailable::NoSuchOrdinal { ordinal, count },
        } => {
            assert!(driver_library_present());
            assert_eq!(ordinal, usize::MAX);
            assert!(count > 0);
        }
        DeviceReport::Cpu { reason } => assert!(
            !gpu_required(),
            "MURMUR_REQUIRE_GPU=1 but detection found no GPU at all: {reason}"
        ),
        DeviceReport::Cuda(device) => panic!("ordinal usize::MAX reported as {device}"),
    }
}
