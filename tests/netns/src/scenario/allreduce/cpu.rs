//! Where the CPU goes while a benchmark runs on the harness, from `/proc`: the delay stage
//! (every process in the router's namespace), the peers (every process in a peer's
//! namespace), the kernel's soft interrupts (where most of the veth, tbf and TUN forwarding
//! runs) and the whole machine, sampled once a second, beside the bytes that went through the
//! delay stage (its TUN device's counters, read in the router's namespace).
//!
//! The emulated links and the peers share this machine's cores, so a benchmark that keeps
//! them all busy measures the machine, not the links; these figures say when that happened.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Harness;

/// How often the monitor samples.
const PERIOD: Duration = Duration::from_secs(1);
/// A window that carried at least this share of the busiest window's bytes carried traffic.
const TRAFFIC_SHARE: f64 = 0.25;
/// The delay stage's TUN device.
const DELAY_DEVICE: &str = "delay0";

/// CPU use over one window, in cores (1.0 = one core busy the whole window).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct CpuWindow {
    /// The delay stage.
    pub(super) delay_stage: f64,
    /// All peer processes together.
    pub(super) peers: f64,
    /// Soft interrupts, machine-wide.
    pub(super) softirq: f64,
    /// Everything but idle and I/O wait, machine-wide.
    pub(super) busy: f64,
    /// Bits per second into the delay stage, every link together.
    pub(super) stage_bits_per_sec: f64,
}

impl CpuWindow {
    fn to_json(self) -> Value {
        json!({
            "delay_stage": self.delay_stage,
            "peers": self.peers,
            "softirq": self.softirq,
            "machine_busy": self.busy,
            "stage_bits_per_sec": self.stage_bits_per_sec,
        })
    }

    /// Cores of the delay stage per Gbit/s it carried.
    pub(super) fn stage_cores_per_gbit(&self) -> f64 {
        self.delay_stage / (self.stage_bits_per_sec / 1e9).max(1e-9)
    }
}

/// What the monitor saw over a run.
#[derive(Debug, Clone, Default)]
pub(super) struct CpuUse {
    windows: Vec<CpuWindow>,
    cores: usize,
}

impl CpuUse {
    /// The windows that carried traffic: at least [`TRAFFIC_SHARE`] of the busiest one's
    /// bytes (the rounds, not start-up or the waits between runs).
    fn traffic_windows(&self) -> impl Iterator<Item = &CpuWindow> {
        let busiest = self
            .windows
            .iter()
            .map(|w| w.stage_bits_per_sec)
            .fold(0.0, f64::max);
        self.windows
            .iter()
            .filter(move |w| busiest > 0.0 && w.stage_bits_per_sec >= TRAFFIC_SHARE * busiest)
    }

    /// The mean over the windows that carried traffic.
    pub(super) fn under_traffic(&self) -> CpuWindow {
        let busy: Vec<&CpuWindow> = self.traffic_windows().collect();
        let n = busy.len().max(1) as f64;
        let sum = |f: fn(&CpuWindow) -> f64| busy.iter().map(|w| f(w)).fold(0.0, |a, b| a + b) / n;
        CpuWindow {
            delay_stage: sum(|w| w.delay_stage),
            peers: sum(|w| w.peers),
            softirq: sum(|w| w.softirq),
            busy: sum(|w| w.busy),
            stage_bits_per_sec: sum(|w| w.stage_bits_per_sec),
        }
    }

    /// The machine's cores.
    pub(super) fn cores(&self) -> usize {
        self.cores
    }

    pub(super) fn to_json(&self) -> Value {
        json!({
            "cores": self.cores,
            "windows_with_traffic": self.traffic_windows().count(),
            "mean_under_traffic_cores": self.under_traffic().to_json(),
        })
    }
}

/// Samples on a thread until stopped.
pub(super) struct CpuMonitor {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<CpuUse>,
}

impl CpuMonitor {
    /// Starts sampling the processes of `harness`'s namespaces and the machine.
    pub(super) fn start(harness: &Harness) -> Self {
        let inode = |name: &str| {
            std::fs::metadata(format!("/run/netns/{name}"))
                .map(|m| m.ino())
                .unwrap_or(0)
        };
        let router = inode(harness.router_namespace());
        let peers: Vec<u64> = (0..harness.peer_count())
            .map(|p| inode(harness.peer_namespace(p)))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut last = Sample::take(router, &peers);
            let mut windows = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                if last.at.elapsed() >= PERIOD {
                    let next = Sample::take(router, &peers);
                    windows.push(last.window_to(&next));
                    last = next;
                }
            }
            CpuUse {
                windows,
                cores: std::thread::available_parallelism().map_or(1, usize::from),
            }
        });
        Self { stop, thread }
    }

    /// Stops sampling and returns what was seen.
    pub(super) fn stop(self) -> CpuUse {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// Which namespace a process is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Stage,
    Peer,
}

/// Counters at one instant.
struct Sample {
    at: Instant,
    /// Clock ticks of each process of the harness.
    processes: HashMap<u32, (Side, u64)>,
    /// Machine-wide ticks: busy, soft interrupts, total.
    machine: (u64, u64, u64),
    /// Bytes the kernel has handed the delay stage so far.
    stage_bytes: u64,
}

impl Sample {
    fn take(router: u64, peers: &[u64]) -> Self {
        let mut processes = HashMap::new();
        let mut stage_bytes = None;
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let Some(pid) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                let Some(ns) = net_namespace(pid) else {
                    continue;
                };
                let side = if ns == router {
                    Side::Stage
                } else if peers.contains(&ns) {
                    Side::Peer
                } else {
                    continue;
                };
                if let Some(ticks) = process_ticks(pid) {
                    processes.insert(pid, (side, ticks));
                }
                if side == Side::Stage && stage_bytes.is_none() {
                    stage_bytes = device_transmit_bytes(pid, DELAY_DEVICE);
                }
            }
        }
        Self {
            at: Instant::now(),
            processes,
            machine: machine_ticks().unwrap_or_default(),
            stage_bytes: stage_bytes.unwrap_or(0),
        }
    }

    fn window_to(&self, next: &Sample) -> CpuWindow {
        // SAFETY: sysconf has no memory preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let seconds = next.at.duration_since(self.at).as_secs_f64().max(1e-3);
        let cores = |side: Side| {
            let ticks: u64 = next
                .processes
                .iter()
                .filter(|(_, (s, _))| *s == side)
                .filter_map(|(pid, (_, t))| Some(t.saturating_sub(self.processes.get(pid)?.1)))
                .sum();
            ticks as f64 / hz / seconds
        };
        let delay_stage = cores(Side::Stage);
        let peers = cores(Side::Peer);
        let (busy0, soft0, total0) = self.machine;
        let (busy1, soft1, total1) = next.machine;
        let all = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        let share = |a: u64, b: u64| {
            b.saturating_sub(a) as f64 / total1.saturating_sub(total0).max(1) as f64 * all
        };
        CpuWindow {
            delay_stage,
            peers,
            softirq: share(soft0, soft1),
            busy: share(busy0, busy1),
            stage_bits_per_sec: next.stage_bytes.saturating_sub(self.stage_bytes) as f64 * 8.0
                / seconds,
        }
    }
}

/// Bytes the kernel has sent out of `device` in the network namespace of process `pid`: for
/// a TUN device, what its reader was handed.
fn device_transmit_bytes(pid: u32, device: &str) -> Option<u64> {
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
    device_bytes(&table, device).map(|(_, transmitted)| transmitted)
}

/// The received and transmitted bytes of `device` in a `/proc/net/dev` table.
pub(super) fn device_bytes(table: &str, device: &str) -> Option<(u64, u64)> {
    table.lines().find_map(|line| {
        let (name, counters) = line.split_once(':')?;
        if name.trim() != device {
            return None;
        }
        // Eight receive counters, bytes first, then the transmit ones, bytes first.
        let mut counters = counters.split_whitespace();
        let received = counters.next()?.parse().ok()?;
        let transmitted = counters.nth(7)?.parse().ok()?;
        Some((received, transmitted))
    })
}

/// The inode of a process's network namespace.
fn net_namespace(pid: u32) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()?;
    let text = link.to_str()?;
    text.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

/// utime + stime of a process, in clock ticks.
fn process_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after its closing parenthesis do not.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 of the file (state) is the first after the name; utime is 14, stime 15.
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(field(14)? + field(15)?)
}

/// The machine's busy, soft-interrupt and total clock ticks over all cores.
fn machine_ticks() -> Option<(u64, u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let total: u64 = ticks.iter().sum();
    let idle = ticks.get(3)? + ticks.get(4)?;
    Some((total.saturating_sub(idle), *ticks.get(6)?, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_cpu_time_and_namespace_are_read_from_proc() {
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let me = std::process::id();
        assert!(process_ticks(me).is_some_and(|t| t > 0));
        assert!(net_namespace(me).is_some());
        let (busy, _, total) = machine_ticks().expect("/proc/stat");
        assert!(busy > 0 && total >= busy);
    }

    #[test]
    fn traffic_windows_are_those_that_carried_a_quarter_of_the_busiest_ones_bytes() {
        let window = |delay_stage, peers, mbit: f64| CpuWindow {
            delay_stage,
            peers,
            softirq: 0.0,
            busy: 1.0,
            stage_bits_per_sec: mbit * 1e6,
        };
        let cpu = CpuUse {
            windows: vec![
                window(0.0, 1.9, 0.1),
                window(0.4, 1.0, 800.0),
                window(0.6, 0.8, 1000.0),
                window(0.1, 0.8, 200.0),
            ],
            cores: 2,
        };
        let mean = cpu.under_traffic();
        assert!((mean.delay_stage - 0.5).abs() < 1e-12);
        assert!((mean.peers - 0.9).abs() < 1e-12);
        assert!((mean.stage_cores_per_gbit() - 0.5 / 0.9).abs() < 1e-9);
        assert_eq!(CpuUse::default().under_traffic(), CpuWindow::default());
    }

    #[test]
    fn a_devices_bytes_are_read_from_its_line() {
        let table = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     100       2    0    0    0     0          0         0      100       2    0    0    0     0       0          0
delay0: 5000000    4000    0    0    0     0          0         0  6000000    4100    0    0    0     0       0          0
";
        assert_eq!(device_bytes(table, "delay0"), Some((5_000_000, 6_000_000)));
        assert_eq!(device_bytes(table, "lo"), Some((100, 100)));
        assert_eq!(device_bytes(table, "link0"), None);
    }
}
