//! A bulk TCP transfer: the sender writes as fast as TCP allows, the receiver measures.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Bytes per write and per read.
const CHUNK: usize = 64 * 1024;
/// Receipts during the first second are left out of the steady rate: TCP is in slow start.
const WARM_UP: Duration = Duration::from_secs(1);
/// How long the sender keeps trying to connect while the receiver starts.
const CONNECT_LIMIT: Duration = Duration::from_secs(10);

/// Accepts one connection on `listen`, reads it to the end (or until `limit`), and prints
/// `{"bytes":N,"steady_bits_per_sec":R}`.
pub(crate) fn receive(listen: &str, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    let listener = TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
    listener.set_nonblocking(true)?;
    let mut stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(error) if error.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    bail!("no sender connected within {limit:?}");
                }
                thread::sleep(Duration::from_millis(5));
            }
            Err(error) => return Err(error).context("accepting the sender"),
        }
    };
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut buffer = vec![0u8; CHUNK];
    let mut bytes = 0u64;
    let mut first_byte_at = None;
    let mut steady_from: Option<(Instant, u64)> = None;
    let mut last_byte_at = Instant::now();
    loop {
        if Instant::now() >= deadline {
            bail!("the transfer did not finish within {limit:?}");
        }
        let read = match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                continue;
            }
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(error) => return Err(error).context("reading the transfer"),
        };
        let now = Instant::now();
        let first = *first_byte_at.get_or_insert(now);
        if steady_from.is_none() && now.duration_since(first) >= WARM_UP {
            // Bytes up to and including this read arrived during the warm-up.
            steady_from = Some((now, bytes + read as u64));
        }
        bytes += read as u64;
        last_byte_at = now;
    }
    let Some((steady_start, steady_base)) = steady_from else {
        bail!("the transfer ended within its {WARM_UP:?} warm-up; send for longer");
    };
    let seconds = last_byte_at.duration_since(steady_start).as_secs_f64();
    let steady_bits_per_sec = if seconds > 0.0 {
        (bytes - steady_base) as f64 * 8.0 / seconds
    } else {
        0.0
    };
    println!(
        "{}",
        serde_json::json!({ "bytes": bytes, "steady_bits_per_sec": steady_bits_per_sec })
    );
    Ok(())
}

/// Connects to `to` (retrying while the receiver starts) and sends for `duration`.
pub(crate) fn send(to: &str, duration: Duration) -> anyhow::Result<()> {
    let connect_deadline = Instant::now() + CONNECT_LIMIT;
    let mut stream = loop {
        match TcpStream::connect(to) {
            Ok(stream) => break stream,
            // Refused or unreachable while the receiver is still starting: try again.
            Err(_) if Instant::now() < connect_deadline => {
                thread::sleep(Duration::from_millis(20));
            }
            Err(error) => return Err(error).with_context(|| format!("connecting to {to}")),
        }
    };
    // A bounded write: a stalled receiver cannot hold the sender past its duration for long.
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let chunk = vec![0x5au8; CHUNK];
    let end = Instant::now() + duration;
    let mut bytes = 0u64;
    while Instant::now() < end {
        bytes += stream.write(&chunk).context("sending")? as u64;
    }
    stream.shutdown(Shutdown::Write)?;
    // Wait for the receiver to close, so everything sent is counted before we exit.
    let mut sink = [0u8; 16];
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let _ = stream.read(&mut sink);
    println!("{}", serde_json::json!({ "bytes": bytes }));
    Ok(())
}
