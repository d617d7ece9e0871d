//! Running programs with a time limit, and children that are killed when dropped.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::HarnessError;

/// How often a bounded wait checks whether the child has exited.
const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// The command line of `command`, for messages.
pub(crate) fn describe(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|part| part.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `command` to completion, capturing its output; kills it when it runs past `limit`.
///
/// A non-zero exit is returned as output, not as an error; see [`run_checked`].
pub fn run_bounded(mut command: Command, limit: Duration) -> Result<Output, HarnessError> {
    let line = describe(&command);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = command.spawn().map_err(|source| HarnessError::Spawn {
        command: line.clone(),
        source,
    })?;
    let mut child = KillOnDrop(child);
    // Drain both pipes while waiting, so a chatty child cannot block on a full pipe.
    let stdout = drain(child.0.stdout.take());
    let stderr = drain(child.0.stderr.take());
    let status = wait_bounded(&mut child.0, limit).map_err(|source| HarnessError::Wait {
        command: line.clone(),
        source,
    })?;
    let Some(status) = status else {
        return Err(HarnessError::Timeout {
            command: line,
            limit,
        });
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// Runs `command` like [`run_bounded`] and fails unless it exits successfully.
pub fn run_checked(command: Command, limit: Duration) -> Result<Output, HarnessError> {
    let line = describe(&command);
    let output = run_bounded(command, limit)?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(HarnessError::CommandFailed {
            command: line,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// Waits for `child` to exit for at most `limit`; `None` when it is still running.
pub(crate) fn wait_bounded(
    child: &mut Child,
    limit: Duration,
) -> std::io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        thread::sleep(POLL_INTERVAL);
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            // A read error ends the capture; what was read so far is kept.
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}

/// A child process that is killed and reaped when dropped, so no test leaves one behind.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// Waits for the child to exit for at most `limit`; kills it when it does not.
    pub fn wait_or_kill(&mut self, limit: Duration) -> std::io::Result<ExitStatus> {
        if let Some(status) = wait_bounded(&mut self.0, limit)? {
            return Ok(status);
        }
        self.0.kill()?;
        self.0.wait()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Fails only when the child has already exited, which is what we want anyway.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
