//! Device detection never panics and reports what this host really has.

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

/// Without a driver library the report is CPU with that reason; with one, it is whatever
/// the driver says, and either way nothing panics and the answer is stable.
#[test]
fn report_matches_the_driver_library() {
    let report = detect();
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
        DeviceReport::Cpu { .. } => {}
        DeviceReport::Cuda(device) => panic!("ordinal usize::MAX reported as {device}"),
    }
}
