//! The `murmur_process_*` metrics, read from `/proc/self` when `/metrics` is scraped.
//!
//! The parsing is separate from the reading so it can be tested on fixed text. Where
//! `/proc` is missing (not Linux) or a file does not parse, that metric is left out of the
//! scrape rather than reported as zero.

use std::path::Path;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{MetricFamily, MetricType};

use super::ObserveError;
use super::registry::{describe, family, sample};

/// Clock ticks per second of the `utime`/`stime` fields of `/proc/<pid>/stat`: the kernel's
/// `USER_HZ`, fixed at 100 by the ABI of every architecture murmur builds for.
const USER_HZ: f64 = 100.0;

/// Resident set size in bytes, from the `VmRSS:` line of `/proc/<pid>/status` (in kB).
pub(super) fn parse_resident_bytes(status: &str) -> Option<u64> {
    status_kib_field(status, "VmRSS:")
}

/// A `NAME:  N kB` line of a `/proc/<pid>/status` text, in bytes.
pub(crate) fn status_kib_field(status: &str, name: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix(name))?;
    let mut fields = line.split_whitespace();
    let kib: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") => kib.checked_mul(1024),
        _ => None,
    }
}

/// This process's `NAME:` field of `/proc/self/status` in bytes (`VmRSS:` now, `VmHWM:` at
/// its peak); `None` where there is no such file (not Linux) or it does not parse.
pub(crate) fn own_status_bytes(name: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status_kib_field(&status, name)
}

/// User plus system CPU seconds, from `/proc/<pid>/stat`. The command name (field 2) is in
/// parentheses and may itself hold spaces and parentheses, so fields are counted from the
/// last `)`: `utime` and `stime` are fields 14 and 15, the 12th and 13th after it.
pub(super) fn parse_cpu_seconds(stat: &str) -> Option<f64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // Tick counts are exact in f64 up to 2^53 (millions of years of CPU at 100 Hz).
    Some(utime.saturating_add(stime) as f64 / USER_HZ)
}

/// Entries of a `/proc/<pid>/fd` folder: the process's open file descriptors (the one used
/// to read the folder included).
fn count_open_fds(fd_dir: &Path) -> Option<u64> {
    let entries = std::fs::read_dir(fd_dir).ok()?;
    Some(entries.filter(Result::is_ok).count() as u64)
}

/// Reads `/proc/self` at every collection.
pub(super) struct ProcessCollector {
    resident: Desc,
    cpu: Desc,
    open_fds: Desc,
}

impl ProcessCollector {
    pub(super) fn new() -> Result<ProcessCollector, ObserveError> {
        Ok(ProcessCollector {
            resident: describe(
                "murmur_process_resident_memory_bytes",
                "Resident set size of the daemon.",
                &[],
            )?,
            cpu: describe(
                "murmur_process_cpu_seconds_total",
                "User and system CPU time of the daemon, all threads.",
                &[],
            )?,
            open_fds: describe(
                "murmur_process_open_fds",
                "Open file descriptors of the daemon.",
                &[],
            )?,
        })
    }
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.resident, &self.cpu, &self.open_fds]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let proc_self = Path::new("/proc/self");
        let read = |file: &str| std::fs::read_to_string(proc_self.join(file)).ok();
        let gauge = MetricType::GAUGE;
        let mut families = Vec::with_capacity(3);
        if let Some(bytes) = read("status").as_deref().and_then(parse_resident_bytes) {
            let value = vec![sample(&[], bytes as f64, gauge)];
            families.push(family(&self.resident, gauge, value));
        }
        if let Some(seconds) = read("stat").as_deref().and_then(parse_cpu_seconds) {
            let value = vec![sample(&[], seconds, MetricType::COUNTER)];
            families.push(family(&self.cpu, MetricType::COUNTER, value));
        }
        if let Some(fds) = count_open_fds(&proc_self.join("fd")) {
            let value = vec![sample(&[], fds as f64, gauge)];
            families.push(family(&self.open_fds, gauge, value));
        }
        families
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_comes_from_vmrss_in_kib() {
        let status = "Name:\tmurmur\nVmPeak:\t  9000 kB\nVmRSS:\t    1536 kB\nThreads:\t4\n";
        assert_eq!(parse_resident_bytes(status), Some(1536 * 1024));
        assert_eq!(parse_resident_bytes("Name:\tmurmur\n"), None);
        assert_eq!(parse_resident_bytes("VmRSS:\tmany kB\n"), None);
        assert_eq!(parse_resident_bytes("VmRSS:\t12 pages\n"), None);
        assert_eq!(parse_resident_bytes("VmRSS:\t-3 kB\n"), None);
        let status = "VmHWM:\t  7168 kB\nVmRSS:\t 5120 kB\n";
        assert_eq!(status_kib_field(status, "VmHWM:"), Some(7168 * 1024));
    }

    #[test]
    fn this_process_has_resident_memory_and_a_peak_at_least_as_high() {
        // Linux only, like the daemon: a running process holds at least a page.
        let rss = own_status_bytes("VmRSS:").expect("/proc/self/status has VmRSS");
        let peak = own_status_bytes("VmHWM:").expect("/proc/self/status has VmHWM");
        assert!(rss >= 4096 && peak >= rss, "{rss} {peak}");
    }

    #[test]
    fn cpu_seconds_count_fields_after_the_last_parenthesis() {
        // A command name with spaces and parentheses must not shift the fields.
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 \
                    12345 1000000 300 18446744073709551615";
        assert_eq!(parse_cpu_seconds(stat), Some(3.0));
        assert_eq!(parse_cpu_seconds("4242 (murmur) S 1 2"), None);
        assert_eq!(parse_cpu_seconds("no parenthesis at all"), None);
    }

    #[test]
    fn this_process_reports_plausible_numbers() {
        if !Path::new("/proc/self/status").exists() {
            // Not Linux: the collector leaves the metrics out, which the next assert checks.
            assert!(
                ProcessCollector::new()
                    .expect("describes")
                    .collect()
                    .is_empty()
            );
            return;
        }
        let families = ProcessCollector::new().expect("describes").collect();
        let value = |name: &str| {
            let family = families.iter().find(|f| f.name() == name).expect(name);
            let metric = &family.get_metric()[0];
            match family.get_field_type() {
                MetricType::COUNTER => metric.get_counter().get_value(),
                _ => metric.get_gauge().get_value(),
            }
        };
        let rss = value("murmur_process_resident_memory_bytes");
        assert!(rss > 1e6 && rss < 1e12, "resident memory {rss}");
        let fds = value("murmur_process_open_fds");
        // The folder being read is open while it is counted.
        assert!(fds >= 1.0, "open fds {fds}");
        let cpu = value("murmur_process_cpu_seconds_total");
        assert!((0.0..1e7).contains(&cpu), "cpu seconds {cpu}");
    }
}
