//! Plain TCP through the harness, the yardstick of what its emulated links can carry on this
//! machine: every peer sends one flow to the next at once, so every link carries one flow
//! each way, as in a butterfly round, and each receiver reports its flow's steady rate.

use std::io::Read as _;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::cpu::{CpuMonitor, CpuUse};
use crate::{Harness, KillOnDrop, run_checked};

/// How long each TCP flow sends.
const TCP_PROBE: Duration = Duration::from_secs(6);
/// The TCP port of the probe's receivers, one per namespace.
const TCP_PORT: u16 = 5202;

/// Plain TCP through the harness: every peer sends one flow to the next at once, so every
/// link carries one flow each way, as in a round.
#[derive(Debug)]
pub(super) struct TcpProbe {
    pub(super) peers: usize,
    pub(super) rate_bits_per_sec: u64,
    /// Whether the delay stage ran with segment offloads.
    pub(super) offloads: bool,
    /// Each flow's steady rate, bits per second.
    pub(super) flows_bits_per_sec: Vec<f64>,
    pub(super) cpu: CpuUse,
}

impl TcpProbe {
    /// The mean flow's rate over the link rate.
    pub(super) fn fraction(&self) -> f64 {
        let n = self.flows_bits_per_sec.len().max(1) as f64;
        self.flows_bits_per_sec.iter().sum::<f64>() / n / self.rate_bits_per_sec as f64
    }
}

/// Runs one TCP flow from every peer to the next at once and measures each.
pub(super) fn tcp_probe(harness: &Harness, rate: u64) -> anyhow::Result<TcpProbe> {
    let peers = harness.peer_count();
    let limit = TCP_PROBE + Duration::from_secs(20);
    let mut receivers = Vec::new();
    for peer in 0..peers {
        let mut command = harness.command(peer, harness.netem_program());
        command
            .args(["bulk-recv", "--listen", &format!("0.0.0.0:{TCP_PORT}")])
            .args(["--limit-secs", &limit.as_secs().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        receivers.push(KillOnDrop(
            command.spawn().context("cannot start a TCP receiver")?,
        ));
    }
    let monitor = CpuMonitor::start(harness);
    let senders: Vec<std::thread::JoinHandle<anyhow::Result<()>>> = (0..peers)
        .map(|peer| {
            let mut command = harness.command(peer, harness.netem_program());
            let to = harness.peer_address((peer + 1) % peers);
            command
                .args(["bulk-send", "--to", &format!("{to}:{TCP_PORT}")])
                .args(["--seconds", &format!("{:.3}", TCP_PROBE.as_secs_f64())]);
            std::thread::spawn(move || {
                run_checked(command, limit)?;
                Ok(())
            })
        })
        .collect();
    for sender in senders {
        sender
            .join()
            .map_err(|_| anyhow::anyhow!("a TCP sender's thread panicked"))??;
    }
    let cpu = monitor.stop();
    let mut flows_bits_per_sec = Vec::new();
    for mut receiver in receivers {
        let status = receiver.wait_or_kill(Duration::from_secs(10))?;
        let mut line = String::new();
        if let Some(mut stdout) = receiver.0.stdout.take() {
            stdout.read_to_string(&mut line)?;
        }
        if !status.success() {
            bail!("a TCP receiver failed with {status}: {line}");
        }
        let value: Value = serde_json::from_str(line.trim())
            .with_context(|| format!("the TCP receiver's report {line:?}"))?;
        flows_bits_per_sec.push(
            value["steady_bits_per_sec"]
                .as_f64()
                .context("no steady_bits_per_sec in the TCP receiver's report")?,
        );
    }
    Ok(TcpProbe {
        peers,
        rate_bits_per_sec: rate,
        offloads: harness.topology().stage_offloads(),
        flows_bits_per_sec,
        cpu,
    })
}

impl TcpProbe {
    /// The probe as a row of the scenarios' Markdown table.
    pub(super) fn table_row(&self) -> String {
        let flows: Vec<String> = self
            .flows_bits_per_sec
            .iter()
            .map(|f| format!("{:.0}", f / 1e6))
            .collect();
        let cpu = self.cpu.under_traffic();
        format!(
            "| {} | {} | {} | {} | {:.3} | {:.2} / {:.2} / {:.2} of {} | {:.2} |\n",
            self.peers,
            self.rate_bits_per_sec / 1_000_000,
            if self.offloads { "on" } else { "off" },
            flows.join(", "),
            self.fraction(),
            cpu.delay_stage,
            cpu.softirq,
            cpu.busy,
            self.cpu.cores(),
            cpu.stage_cores_per_gbit(),
        )
    }

    /// The head of the table [`TcpProbe::table_row`] fills.
    pub(super) const TABLE_HEAD: &'static str = "| TCP probe: N flows at once | B (Mbit/s) | stage offloads | each flow (Mbit/s) | mean / B | CPU (cores): delay stage / softirq / machine | delay stage cores per Gbit/s |\n|---|---|---|---|---|---|---|\n";

    pub(super) fn to_json(&self) -> Value {
        json!({
            "peers": self.peers,
            "rate_bits_per_sec": self.rate_bits_per_sec,
            "stage_offloads": self.offloads,
            "flows_bits_per_sec": self.flows_bits_per_sec,
            "mean_over_rate": self.fraction(),
            "cpu": self.cpu.to_json(),
        })
    }
}
