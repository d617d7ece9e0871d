//! Handing a buffer's memory back to the kernel while its values live elsewhere.
//!
//! A step on the CPU copies the parameters into candle's tensors and builds the gradient in
//! candle's own; the flat vectors they came from and go back to would sit resident beside
//! them, two model-sized buffers doing nothing for the length of the passes. The pages
//! wholly inside such a buffer are released instead (`madvise(MADV_DONTNEED)`): they read
//! as zeros until written, and take memory again only as they are.

/// Releases the whole pages inside `values`; the elements on them read as zero afterwards.
/// The partial pages at either end keep their values. Elsewhere than Linux this does
/// nothing, and the values stay.
pub(crate) fn release(values: &mut [f32]) {
    #[cfg(target_os = "linux")]
    {
        let page = page_size();
        let start = values.as_mut_ptr() as usize;
        let end = start + std::mem::size_of_val(values);
        let first = start.next_multiple_of(page);
        let last = end - end % page;
        if last <= first {
            return;
        }
        // SAFETY: `[first, last)` lies inside `values`, which this function borrows
        // exclusively, and is page-aligned. The vector's memory is private and anonymous (the
        // heap, or a mapping of malloc's own), so `MADV_DONTNEED` only makes those pages read
        // as zeros from now on, which every `f32` may be. A refusal leaves the pages as they
        // were, which is as correct, only larger.
        unsafe {
            libc::madvise(
                first as *mut libc::c_void,
                last - first,
                libc::MADV_DONTNEED,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = values;
}

#[cfg(target_os = "linux")]
fn page_size() -> usize {
    // SAFETY: `sysconf` with a valid name has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Resident bytes of this process (`VmRSS`).
    fn resident() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kib * 1024
    }

    #[test]
    fn released_pages_leave_the_resident_set_and_the_ends_keep_their_values() {
        let len = 16 << 20; // 64 MiB
        let mut values: Vec<f32> = (0..len).map(|i| i as f32).collect();
        let before = resident();
        // An odd start and end: the partial pages there keep their values.
        release(&mut values[3..len - 5]);
        let after = resident();
        assert!(
            before.saturating_sub(after) > 60 << 20,
            "resident {before} → {after} bytes"
        );
        assert_eq!(&values[..3], &[0.0, 1.0, 2.0]);
        assert_eq!(values[3], 3.0, "the first partial page keeps its values");
        assert_eq!(values[len - 1], (len - 1) as f32);
        assert_eq!(values[len / 2], 0.0, "a released page reads as zeros");
        values[len / 2] = 7.0;
        assert_eq!(values[len / 2], 7.0);
    }
}
