//! Builds the namespaces of a [`Topology`], runs programs inside them and tears it all down.
//!
//! ```text
//!   peer 0 ns            router ns                      peer 1 ns
//!  eth0 10.77.1.2 ─veth─ link0 10.77.1.1   link1 10.77.2.1 ─veth─ eth0 10.77.2.2
//!   (tbf: uplink)        (tbf: downlink)   (tbf: downlink)        (tbf: uplink)
//!                            │   ▲ policy rule: from linkN → table 100 → delay0
//!                            ▼   │
//!                        delay0 (TUN) ⇄ murmur-netem: hold for the delays, drop by the losses,
//!                                       write back; re-injected packets route by the main table
//! ```
//!
//! Rates are `tc` tbf qdiscs on both ends of each veth pair. Delay and loss happen in the
//! `murmur-netem` process, because this kernel has no `sch_netem`: a policy rule sends every
//! packet that enters the router from a peer's link to the TUN device `delay0`; the process
//! reads it, holds it, and writes it back into `delay0`, where it arrives as a packet received
//! on `delay0` and is routed by the main table out of the destination's link. Packets to the
//! router's own addresses are delivered locally (the local table is consulted first) and are
//! neither delayed nor lost.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::thread;
use std::time::{Duration, Instant};

use crate::HarnessError;
use crate::delay_line::DelayLineStats;
use crate::exec::{KillOnDrop, describe, run_bounded, run_checked};
use crate::partition::{Cut, cuts};
use crate::topology::{Topology, peer_address, router_address, tbf_parameters};

/// Every namespace a harness creates starts with this, followed by the creating process's id.
pub const NAMESPACE_PREFIX: &str = "murmur-nt-";

/// Time limit of each `ip`/`tc` call.
pub(crate) const TOOL_LIMIT: Duration = Duration::from_secs(10);
/// How long the delay stage may take to open its TUN device, and to report when stopped.
const DELAY_STAGE_LIMIT: Duration = Duration::from_secs(10);
/// The TUN device in the router namespace.
const DELAY_DEVICE: &str = "delay0";
/// The routing table that sends forwarded packets into the delay device.
const DELAY_TABLE: &str = "100";
/// Interface name of a peer's end of its link.
const PEER_DEVICE: &str = "eth0";
/// Priority of the partition's blackhole rules: before the rules that send packets into the
/// delay stage, so a cut packet never enters it, and one already held there is dropped when
/// it comes back out.
const PARTITION_PREF: &str = "50";

/// Harnesses created by this process so far; part of each harness's namespace names.
static HARNESS_COUNT: AtomicU32 = AtomicU32::new(0);

/// A running network of namespaces; dropping it kills every process in them and deletes them.
#[derive(Debug)]
pub struct Harness {
    topology: Topology,
    netem_program: PathBuf,
    router: String,
    peers: Vec<String>,
    /// Namespaces created so far, deleted on drop even when building stopped half way.
    created: Vec<String>,
    delay_stage: Option<DelayStage>,
    /// The directions of traffic the current partition drops.
    cuts: Vec<Cut>,
}

/// The running `murmur-netem delay` process and the lines it prints.
#[derive(Debug)]
struct DelayStage {
    child: KillOnDrop,
    lines: Receiver<String>,
}

impl Harness {
    /// Builds `topology`: checks root and the tools, deletes namespaces left by dead harnesses,
    /// creates the router and peer namespaces, links, shaping and the delay stage, running
    /// `netem_program` (the `murmur-netem` binary) in the router namespace. From then on,
    /// SIGINT or SIGTERM removes this process's namespaces before the process dies of it.
    pub fn build(
        topology: Topology,
        netem_program: impl Into<PathBuf>,
    ) -> Result<Self, HarnessError> {
        check_root()?;
        check_tool("ip", "iproute2")?;
        check_tool("tc", "iproute2")?;
        topology.validate()?;
        let prefix = claim_prefix()?;
        let peers = (0..topology.links.len())
            .map(|peer| format!("{prefix}-peer{peer}"))
            .collect();
        let mut harness = Self {
            topology,
            netem_program: netem_program.into(),
            router: format!("{prefix}-router"),
            peers,
            created: Vec::new(),
            delay_stage: None,
            cuts: Vec::new(),
        };
        // On any error below, dropping `harness` removes what was created.
        harness.create_namespaces()?;
        for peer in 0..harness.peers.len() {
            harness.create_link(peer)?;
        }
        harness.start_delay_stage()?;
        Ok(harness)
    }

    /// The topology this harness was built from.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// How many peers the network has.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// The network namespace of peer `peer`.
    ///
    /// # Panics
    /// When `peer` is not below [`Harness::peer_count`].
    pub fn peer_namespace(&self, peer: usize) -> &str {
        &self.peers[peer]
    }

    /// The router's network namespace.
    pub fn router_namespace(&self) -> &str {
        &self.router
    }

    /// The address of peer `peer`, reachable from every other peer through the router.
    pub fn peer_address(&self, peer: usize) -> std::net::Ipv4Addr {
        peer_address(peer)
    }

    /// The `murmur-netem` binary this harness runs.
    pub fn netem_program(&self) -> &std::path::Path {
        &self.netem_program
    }

    /// A command that runs `program` inside peer `peer`'s namespace; add arguments and spawn
    /// it as usual (it converts into `tokio::process::Command` too). The program is `exec`ed
    /// by `ip netns exec`, so the child's id is the program's.
    ///
    /// # Panics
    /// When `peer` is not below [`Harness::peer_count`].
    pub fn command(&self, peer: usize, program: impl AsRef<OsStr>) -> Command {
        in_namespace(&self.peers[peer], program)
    }

    /// A command that runs `program` inside the router's namespace.
    pub fn router_command(&self, program: impl AsRef<OsStr>) -> Command {
        in_namespace(&self.router, program)
    }

    /// Stops the delay stage and returns its counters. Afterwards packets between peers are
    /// no longer forwarded.
    pub fn stop_delay_stage(&mut self) -> Result<DelayLineStats, HarnessError> {
        let Some(mut stage) = self.delay_stage.take() else {
            return Err(HarnessError::DelayStageReport {
                detail: "the delay stage was already stopped".to_owned(),
            });
        };
        let pid = libc::pid_t::try_from(stage.child.id()).map_err(|_| {
            HarnessError::DelayStageReport {
                detail: "process id out of range".to_owned(),
            }
        })?;
        // SAFETY: `kill` has no memory preconditions; `pid` is our own child, not yet reaped
        // (KillOnDrop reaps it only after this), so the id cannot have been reused.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let report = wait_for_line(&stage.lines, DELAY_STAGE_LIMIT, |line| {
            line.contains("\"stats\"")
        });
        let _ = stage.child.wait_or_kill(DELAY_STAGE_LIMIT);
        let line = report.map_err(|last| HarnessError::DelayStageReport {
            detail: format!("no stats line; last output {last:?}"),
        })?;
        parse_stats(&line)
    }

    /// Splits the network into `groups`: from now on, packets between peers of different
    /// groups are dropped silently, both ways, including those the delay stage holds. Traffic
    /// within a group, and to or from a peer in no group, passes. Replaces any earlier
    /// partition.
    ///
    /// Fails when a group names a peer the network does not have, or a peer twice; then the
    /// network is left as it was.
    pub fn partition(&mut self, groups: &[&[usize]]) -> Result<(), HarnessError> {
        let wanted = cuts(groups, self.peers.len())?;
        self.heal()?;
        for cut in wanted {
            self.cut_rule("add", cut)?;
            self.cuts.push(cut);
        }
        Ok(())
    }

    /// Ends the partition, if any: every peer reaches every other again.
    pub fn heal(&mut self) -> Result<(), HarnessError> {
        while let Some(&cut) = self.cuts.last() {
            self.cut_rule("del", cut)?;
            self.cuts.pop();
        }
        Ok(())
    }

    /// Whether a partition is in force.
    pub fn is_partitioned(&self) -> bool {
        !self.cuts.is_empty()
    }

    /// Adds or deletes the router's blackhole rule of one direction of a cut.
    fn cut_rule(&self, verb: &str, cut: Cut) -> Result<(), HarnessError> {
        let from = peer_address(cut.from).to_string();
        let to = peer_address(cut.to).to_string();
        ip_in(
            &self.router,
            &[
                "rule",
                verb,
                "from",
                &from,
                "to",
                &to,
                "blackhole",
                "pref",
                PARTITION_PREF,
            ],
        )
    }

    fn create_namespaces(&mut self) -> Result<(), HarnessError> {
        let names: Vec<String> = std::iter::once(self.router.clone())
            .chain(self.peers.iter().cloned())
            .collect();
        for name in names {
            tool("ip", &["netns", "add", &name])?;
            self.created.push(name.clone());
            tool("ip", &["-n", &name, "link", "set", "lo", "up"])?;
        }
        // Before any device exists, so every device inherits the defaults.
        let router_settings = [
            ("net/ipv4/ip_forward", "1", true),
            ("net/ipv4/conf/all/rp_filter", "0", true),
            ("net/ipv4/conf/default/rp_filter", "0", true),
            ("net/ipv4/conf/all/send_redirects", "0", true),
            ("net/ipv4/conf/default/send_redirects", "0", true),
            // Keeps IPv6 neighbour discovery out of the delay stage; absent without IPv6.
            ("net/ipv6/conf/default/disable_ipv6", "1", false),
        ];
        write_sysctls(&self.router, &router_settings)
    }

    fn create_link(&self, peer: usize) -> Result<(), HarnessError> {
        let namespace = &self.peers[peer];
        let router_device = format!("link{peer}");
        let shape = self.topology.links[peer];
        tool(
            "ip",
            &[
                "link",
                "add",
                PEER_DEVICE,
                "netns",
                namespace,
                "type",
                "veth",
                "peer",
                "name",
                &router_device,
                "netns",
                &self.router,
            ],
        )?;
        let peer_cidr = format!("{}/24", peer_address(peer));
        let router_cidr = format!("{}/24", router_address(peer));
        let gateway = router_address(peer).to_string();
        ip_in(namespace, &["addr", "add", &peer_cidr, "dev", PEER_DEVICE])?;
        ip_in(namespace, &["link", "set", PEER_DEVICE, "up"])?;
        ip_in(namespace, &["route", "add", "default", "via", &gateway])?;
        ip_in(
            &self.router,
            &["addr", "add", &router_cidr, "dev", &router_device],
        )?;
        ip_in(&self.router, &["link", "set", &router_device, "up"])?;
        ip_in(
            &self.router,
            &[
                "rule",
                "add",
                "iif",
                &router_device,
                "lookup",
                DELAY_TABLE,
                "pref",
                "100",
            ],
        )?;
        if let Some(rate) = shape.rate_bits_per_sec {
            let parameters = tbf_parameters(rate);
            for (ns, device) in [
                (namespace.as_str(), PEER_DEVICE),
                (&self.router, &router_device),
            ] {
                let mut args = vec!["-n", ns, "qdisc", "add", "dev", device, "root", "tbf"];
                args.extend(parameters.iter().map(String::as_str));
                tool("tc", &args)?;
            }
        }
        Ok(())
    }

    fn start_delay_stage(&mut self) -> Result<(), HarnessError> {
        // Created persistent so it can be configured before and regardless of the process;
        // `ip tuntap ... multi_queue [vnet_hdr]` makes it IFF_TUN | IFF_NO_PI |
        // IFF_MULTI_QUEUE [| IFF_VNET_HDR], the flags murmur-netem attaches each of its queues
        // with.
        let offloads = self.topology.stage_offloads();
        let mut tuntap = vec![
            "tuntap",
            "add",
            "dev",
            DELAY_DEVICE,
            "mode",
            "tun",
            "multi_queue",
        ];
        if offloads {
            tuntap.push("vnet_hdr");
        }
        ip_in(&self.router, &tuntap)?;
        // Each queue's ring holds this many packets while its thread is busy: as many as the
        // stage itself may hold, instead of the default 500 (3 ms at 1.6 Gbit/s).
        let ring = self.topology.queue_packets.to_string();
        ip_in(
            &self.router,
            &["link", "set", DELAY_DEVICE, "txqueuelen", &ring],
        )?;
        let mut command = self.router_command(&self.netem_program);
        command.args([
            "delay",
            "--tun",
            DELAY_DEVICE,
            "--seed",
            &self.topology.seed.to_string(),
            "--queue-packets",
            &self.topology.queue_packets.to_string(),
            "--queues",
            &self.topology.delay_queues.to_string(),
            "--offloads",
            if offloads { "on" } else { "off" },
        ]);
        for link in self.topology.impairments() {
            command.arg("--link").arg(link.to_string());
        }
        let line = describe(&command);
        command.stdin(Stdio::null()).stdout(Stdio::piped());
        let mut child = KillOnDrop(command.spawn().map_err(|source| HarnessError::Spawn {
            command: line,
            source,
        })?);
        let lines = forward_lines(child.0.stdout.take());
        let ready = wait_for_line(&lines, DELAY_STAGE_LIMIT, |line| line.contains("\"ready\""));
        self.delay_stage = Some(DelayStage { child, lines });
        ready.map_err(|output| HarnessError::DelayStageNotReady {
            limit: DELAY_STAGE_LIMIT,
            output,
        })?;
        ip_in(&self.router, &["link", "set", DELAY_DEVICE, "up"])?;
        ip_in(
            &self.router,
            &[
                "route",
                "add",
                "default",
                "dev",
                DELAY_DEVICE,
                "table",
                DELAY_TABLE,
            ],
        )
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // The delay stage first: its namespace cannot go while it holds the TUN device.
        drop(self.delay_stage.take());
        for namespace in self.created.drain(..).rev() {
            if let Err(error) = remove_namespace(&namespace) {
                eprintln!("murmur-netns: could not remove namespace {namespace}: {error}");
            }
        }
    }
}

/// Readies this process for a new network of namespaces: deletes those left by dead
/// processes, makes SIGINT and SIGTERM remove this process's, and returns the prefix of the
/// new network's namespace names (`murmur-nt-<pid>-<n>`).
pub(crate) fn claim_prefix() -> Result<String, HarnessError> {
    remove_stale_namespaces()?;
    crate::interrupt::tear_down_on_interrupt();
    Ok(format!(
        "{NAMESPACE_PREFIX}{}-{}",
        std::process::id(),
        HARNESS_COUNT.fetch_add(1, Ordering::Relaxed)
    ))
}

pub(crate) fn in_namespace(namespace: &str, program: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", namespace])
        .arg(program.as_ref());
    command
}

pub(crate) fn tool(program: &str, args: &[&str]) -> Result<(), HarnessError> {
    let mut command = Command::new(program);
    command.args(args);
    run_checked(command, TOOL_LIMIT).map(drop)
}

pub(crate) fn ip_in(namespace: &str, args: &[&str]) -> Result<(), HarnessError> {
    let mut full = vec!["-n", namespace];
    full.extend_from_slice(args);
    tool("ip", &full)
}

/// Writes `/proc/sys` settings inside `namespace`; optional ones are skipped when absent.
pub(crate) fn write_sysctls(
    namespace: &str,
    settings: &[(&str, &str, bool)],
) -> Result<(), HarnessError> {
    // The paths and values are constants of this file, never input, so the script is fixed.
    let script: Vec<String> = settings
        .iter()
        .map(|(key, value, required)| {
            let path = format!("/proc/sys/{key}");
            if *required {
                format!("echo {value} > {path}")
            } else {
                format!("if [ -e {path} ]; then echo {value} > {path}; fi")
            }
        })
        .collect();
    let mut command = in_namespace(namespace, "sh");
    command.args(["-e", "-c", &script.join("\n")]);
    run_checked(command, TOOL_LIMIT).map(drop)
}

pub(crate) fn check_root() -> Result<(), HarnessError> {
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid == 0 {
        Ok(())
    } else {
        Err(HarnessError::NotRoot { euid })
    }
}

pub(crate) fn check_tool(program: &'static str, package: &'static str) -> Result<(), HarnessError> {
    let mut command = Command::new(program);
    command.arg("-V");
    match run_bounded(command, TOOL_LIMIT) {
        Err(HarnessError::Spawn { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Err(HarnessError::ToolMissing {
                tool: program,
                package,
            })
        }
        other => other.map(drop),
    }
}

/// Deletes namespaces named by harnesses of processes that no longer run (a test killed
/// before its harness could drop), with everything still running in them.
fn remove_stale_namespaces() -> Result<(), HarnessError> {
    for (name, owner) in harness_namespaces()? {
        if !std::path::Path::new(&format!("/proc/{owner}")).exists() {
            // Harnesses of other test processes may be removing the same one right now.
            match remove_namespace(&name) {
                Err(_) if !namespace_exists(&name) => {}
                other => other?,
            }
        }
    }
    Ok(())
}

/// Removes every namespace the harnesses of process `owner` created, and what runs in them;
/// goes on past a failure and returns the first.
pub(crate) fn remove_namespaces_of(owner: u32) -> Result<(), HarnessError> {
    let mut first_error = None;
    for (name, _) in harness_namespaces()?
        .into_iter()
        .filter(|(_, pid)| *pid == owner)
    {
        if let Err(error) = remove_namespace(&name) {
            first_error.get_or_insert(error);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The namespaces of harnesses, this process's or others', with the process id that
/// created each.
fn harness_namespaces() -> Result<Vec<(String, u32)>, HarnessError> {
    let mut command = Command::new("ip");
    command.args(["netns", "list"]);
    let listing = run_checked(command, TOOL_LIMIT)?;
    Ok(String::from_utf8_lossy(&listing.stdout)
        .lines()
        .filter_map(|line| {
            let name = line.split_whitespace().next()?;
            let owner = name
                .strip_prefix(NAMESPACE_PREFIX)?
                .split('-')
                .next()?
                .parse::<u32>()
                .ok()?;
            Some((name.to_owned(), owner))
        })
        .collect())
}

/// Whether `ip netns` still knows `namespace`.
fn namespace_exists(namespace: &str) -> bool {
    std::path::Path::new("/run/netns").join(namespace).exists()
}

/// Kills every process inside `namespace`, then deletes it.
pub(crate) fn remove_namespace(namespace: &str) -> Result<(), HarnessError> {
    let mut command = Command::new("ip");
    command.args(["netns", "pids", namespace]);
    let pids = run_checked(command, TOOL_LIMIT)?;
    for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
        if let Ok(pid) = pid.parse::<libc::pid_t>() {
            // SAFETY: `kill` has no memory preconditions. `ip netns pids` just listed this
            // process inside our own namespace, so it belongs to this harness.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    tool("ip", &["netns", "del", namespace])
}

/// Forwards the lines `pipe` prints over a bounded channel, from a thread of their own.
fn forward_lines(pipe: Option<std::process::ChildStdout>) -> Receiver<String> {
    // The delay stage prints two lines; the bound only guards against a runaway child, which
    // then blocks on its own output.
    let (sender, receiver) = sync_channel(16);
    thread::spawn(move || {
        let Some(pipe) = pipe else { return };
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    receiver
}

/// Waits at most `limit` for a line that `wanted` accepts; on failure returns the last line.
fn wait_for_line(
    lines: &Receiver<String>,
    limit: Duration,
    wanted: impl Fn(&str) -> bool,
) -> Result<String, Option<String>> {
    let deadline = Instant::now() + limit;
    let mut last = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if wanted(&line) => return Ok(line),
            Ok(line) => last = Some(line),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return Err(last),
        }
    }
}

fn parse_stats(line: &str) -> Result<DelayLineStats, HarnessError> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|error| HarnessError::DelayStageReport {
            detail: format!("{error} in {line:?}"),
        })?;
    let field = |name: &str| {
        value[name]
            .as_u64()
            .ok_or_else(|| HarnessError::DelayStageReport {
                detail: format!("no counter `{name}` in {line:?}"),
            })
    };
    Ok(DelayLineStats {
        received: field("received")?,
        received_bytes: field("received_bytes")?,
        forwarded: field("forwarded")?,
        lost: field("lost")?,
        dropped_queue_full: field("dropped_queue_full")?,
        dropped_oversize: field("dropped_oversize")?,
    })
}
