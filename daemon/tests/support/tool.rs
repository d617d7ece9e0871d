//! Runs an outside checker (`promtool`, `systemd-analyze`) for a test, bounded in time.
//!
//! Include it with `#[path = "support/tool.rs"] mod tool;`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `program args…` (in `dir`, when given) with `stdin` on its standard input, and
/// waits at most `patience`: whether it succeeded, and everything it printed. Panics naming
/// the command when it cannot start or runs too long (it is killed first).
pub(crate) fn run_bounded(
    program: &Path,
    args: &[&str],
    dir: Option<&Path>,
    stdin: &str,
    patience: Duration,
) -> (bool, String) {
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let shown = format!("{} {}", program.display(), args.join(" "));
    let mut child = command.spawn().unwrap_or_else(|e| {
        panic!("`{shown}` does not start ({e}); scripts/setup.sh installs the checkers")
    });
    let mut input = child.stdin.take().expect("stdin is piped");
    let text = stdin.to_owned();
    // The tool may exit before reading all of stdin; its answer says what went wrong.
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut input, text.as_bytes()));
    let deadline = Instant::now() + patience;
    while child.try_wait().expect("waits for the tool").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`{shown}` still running after {patience:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = writer.join();
    let out = child.wait_with_output().expect("the tool's output");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}
