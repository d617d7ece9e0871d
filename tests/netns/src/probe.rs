//! Measurements across a harness: round-trip times and loss with `ping`, throughput with a
//! bulk TCP transfer between two `murmur-netem` processes.

use std::io::Read;
use std::process::Stdio;
use std::time::Duration;

use crate::exec::{KillOnDrop, run_bounded, run_checked};
use crate::{Harness, HarnessError};

/// The TCP port the bulk receiver listens on inside its namespace.
const BULK_PORT: u16 = 5201;
/// Extra time allowed on top of a probe's own duration, for start-up and slow machines.
const SLACK: Duration = Duration::from_secs(15);

/// What `ping` saw.
#[derive(Debug, Clone, PartialEq)]
pub struct PingReport {
    /// Echo requests sent.
    pub transmitted: u32,
    /// Echo replies received.
    pub received: u32,
    /// Round-trip time of each reply, in arrival order.
    pub round_trips: Vec<Duration>,
}

impl PingReport {
    /// The fraction of requests that got no reply.
    pub fn loss(&self) -> f64 {
        if self.transmitted == 0 {
            return 0.0;
        }
        1.0 - f64::from(self.received) / f64::from(self.transmitted)
    }

    /// The median round-trip time, if any reply came.
    pub fn median_round_trip(&self) -> Option<Duration> {
        let mut sorted = self.round_trips.clone();
        sorted.sort_unstable();
        sorted.get(sorted.len() / 2).copied()
    }
}

/// What a bulk transfer achieved, as the receiver measured it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BulkReport {
    /// Bytes received in all.
    pub bytes: u64,
    /// Application-level throughput after the first second (TCP slow start excluded).
    pub steady_bits_per_sec: f64,
}

impl Harness {
    /// Pings peer `to` from peer `from` `count` times, one request every `interval`, waiting
    /// up to two seconds for the last replies.
    pub fn ping(
        &self,
        from: usize,
        to: usize,
        count: u32,
        interval: Duration,
    ) -> Result<PingReport, HarnessError> {
        let mut command = self.command(from, "ping");
        command.args([
            "-n",
            "-c",
            &count.to_string(),
            "-i",
            &format!("{:.3}", interval.as_secs_f64()),
            "-W",
            "2",
        ]);
        command.arg(self.peer_address(to).to_string());
        let line = crate::exec::describe(&command);
        let limit = interval * count + SLACK;
        let output = run_bounded(command, limit)?;
        // ping exits 1 when no reply came at all, 2 on real errors.
        if !matches!(output.status.code(), Some(0 | 1)) {
            return Err(HarnessError::CommandFailed {
                command: line,
                status: output.status,
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        parse_ping(&String::from_utf8_lossy(&output.stdout)).ok_or_else(|| {
            HarnessError::CommandFailed {
                command: line,
                status: output.status,
                stderr: "no summary line in ping's output".to_owned(),
            }
        })
    }

    /// Sends as fast as TCP allows from peer `from` to peer `to` for `duration`, and returns
    /// what the receiver measured.
    pub fn bulk_transfer(
        &self,
        from: usize,
        to: usize,
        duration: Duration,
    ) -> Result<BulkReport, HarnessError> {
        let limit = duration + SLACK;
        let mut receiver = self.command(to, self.netem_program());
        receiver.args([
            "bulk-recv",
            "--listen",
            &format!("0.0.0.0:{BULK_PORT}"),
            "--limit-secs",
            &limit.as_secs().to_string(),
        ]);
        let receiver_line = crate::exec::describe(&receiver);
        receiver.stdin(Stdio::null()).stdout(Stdio::piped());
        let mut receiving = KillOnDrop(receiver.spawn().map_err(|source| HarnessError::Spawn {
            command: receiver_line.clone(),
            source,
        })?);
        let mut sender = self.command(from, self.netem_program());
        sender.args([
            "bulk-send",
            "--to",
            &format!("{}:{BULK_PORT}", self.peer_address(to)),
            "--seconds",
            &format!("{:.3}", duration.as_secs_f64()),
        ]);
        run_checked(sender, limit)?;
        let status = receiving
            .wait_or_kill(SLACK)
            .map_err(|source| HarnessError::Wait {
                command: receiver_line.clone(),
                source,
            })?;
        // The receiver prints one short line, which fits the pipe, so reading after it exited
        // cannot block.
        let mut report = String::new();
        if let Some(mut stdout) = receiving.0.stdout.take() {
            let _ = stdout.read_to_string(&mut report);
        }
        if !status.success() {
            return Err(HarnessError::CommandFailed {
                command: receiver_line,
                status,
                stderr: report,
            });
        }
        parse_bulk(&report).ok_or_else(|| HarnessError::CommandFailed {
            command: receiver_line,
            status,
            stderr: format!("unreadable report {report:?}"),
        })
    }
}

/// Reads the per-reply times and the summary of ping's output.
pub(crate) fn parse_ping(output: &str) -> Option<PingReport> {
    let mut round_trips = Vec::new();
    let mut summary = None;
    for line in output.lines() {
        if let Some(time) = line.split("time=").nth(1) {
            let millis: f64 = time.trim_end_matches(" ms").trim().parse().ok()?;
            round_trips.push(Duration::from_secs_f64(millis / 1000.0));
        } else if line.contains("packets transmitted") {
            // "100 packets transmitted, 91 received, 9% packet loss, time 1000ms"
            let mut fields = line.split(',').map(|field| field.split_whitespace().next());
            let transmitted = fields.next()??.parse().ok()?;
            let received = fields.next()??.parse().ok()?;
            summary = Some((transmitted, received));
        }
    }
    let (transmitted, received) = summary?;
    Some(PingReport {
        transmitted,
        received,
        round_trips,
    })
}

fn parse_bulk(output: &str) -> Option<BulkReport> {
    let value: serde_json::Value = serde_json::from_str(output.lines().last()?).ok()?;
    Some(BulkReport {
        bytes: value["bytes"].as_u64()?,
        steady_bits_per_sec: value["steady_bits_per_sec"].as_f64()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_output_gives_times_and_counts() {
        let output = "PING 10.77.2.2 (10.77.2.2) 56(84) bytes of data.\n\
            64 bytes from 10.77.2.2: icmp_seq=1 ttl=62 time=80.4 ms\n\
            64 bytes from 10.77.2.2: icmp_seq=3 ttl=62 time=81 ms\n\
            \n\
            --- 10.77.2.2 ping statistics ---\n\
            3 packets transmitted, 2 received, 33.3333% packet loss, time 20ms\n\
            rtt min/avg/max/mdev = 80.4/80.7/81.0/0.3 ms\n";
        let report = parse_ping(output).expect("parses");
        assert_eq!(report.transmitted, 3);
        assert_eq!(report.received, 2);
        assert_eq!(
            report.round_trips,
            [Duration::from_micros(80_400), Duration::from_millis(81)]
        );
        assert!((report.loss() - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(report.median_round_trip(), Some(Duration::from_millis(81)));
    }

    #[test]
    fn ping_output_without_summary_is_refused() {
        assert_eq!(parse_ping("ping: connect: Network is unreachable\n"), None);
    }

    #[test]
    fn bulk_reports_are_read_from_the_last_line() {
        let report = parse_bulk("{\"bytes\":100,\"steady_bits_per_sec\":4.5e7}\n").expect("parses");
        assert_eq!(report.bytes, 100);
        assert_eq!(report.steady_bits_per_sec, 4.5e7);
    }
}
