//! Teardown when the process is interrupted: SIGINT or SIGTERM (Ctrl-C, a test runner's
//! timeout) would otherwise end a process that built a [`Harness`](crate::Harness) without
//! running its `Drop`, leaving its namespaces, and the peers running in them, behind.
//!
//! The first harness a process builds installs handlers for both signals. A handler only
//! writes the signal's number into a pipe (all it may safely do); a thread of its own reads
//! it, removes every namespace this process created (killing what runs inside), and then
//! raises the signal again with its default action, so the process still dies of it.
//!
//! Programs the harness starts outside the namespaces (a benchmark's driver, a local
//! swarm's supervisor) are asked to end with their parent through [`end_with_parent`].

use std::os::unix::process::CommandExt as _;
use std::process::Command;
use std::sync::Once;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::harness::remove_namespaces_of;

/// Installs the handlers once per process.
static INSTALL: Once = Once::new();
/// The pipe's writing end, for the handler; -1 until installed.
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);

/// The signals that tear down this process's namespaces.
const SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

/// Makes SIGINT and SIGTERM remove this process's namespaces before it dies. Idempotent.
pub(crate) fn tear_down_on_interrupt() {
    INSTALL.call_once(|| {
        let mut fds = [-1; 2];
        // SAFETY: `fds` has room for the two descriptors `pipe2` writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            eprintln!(
                "murmur-netns: no teardown on interrupt: pipe2 failed: {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        let [read_end, write_end] = fds;
        PIPE_WRITE.store(write_end, Ordering::SeqCst);
        let spawned = std::thread::Builder::new()
            .name("murmur-netns-interrupt".into())
            .spawn(move || wait_and_tear_down(read_end));
        if let Err(error) = spawned {
            eprintln!("murmur-netns: no teardown on interrupt: {error}");
            return;
        }
        for signal in SIGNALS {
            // SAFETY: a zeroed `sigaction` is valid; the handler only stores to and writes
            // from async-signal-safe places.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
    });
}

extern "C" fn on_signal(signal: libc::c_int) {
    let byte = signal as u8;
    let fd = PIPE_WRITE.load(Ordering::SeqCst);
    // SAFETY: `write` is async-signal-safe, and `byte` lives for the call.
    unsafe { libc::write(fd, (&raw const byte).cast(), 1) };
}

/// Blocks until a handler reports a signal, removes the namespaces, and dies of the signal.
fn wait_and_tear_down(read_end: libc::c_int) {
    let mut byte = 0u8;
    loop {
        // SAFETY: `byte` has room for the one byte asked for.
        let read = unsafe { libc::read(read_end, (&raw mut byte).cast(), 1) };
        if read == 1 {
            break;
        }
        if read == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
    let signal = libc::c_int::from(byte);
    eprintln!("murmur-netns: signal {signal}: removing this process's namespaces");
    if let Err(error) = remove_namespaces_of(std::process::id()) {
        eprintln!("murmur-netns: teardown on signal {signal} incomplete: {error}");
    }
    // SAFETY: restoring the default action and raising the signal have no memory
    // preconditions; the process ends as the signal would have ended it.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
}

/// Makes the program `command` starts receive SIGTERM when the thread that starts it ends
/// (with this process, or when interrupted), so that it does not outlive the harness.
pub fn end_with_parent(command: &mut Command) -> &mut Command {
    // SAFETY: the closure runs in the child between fork and exec and only calls `prctl`,
    // which is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        })
    }
}
