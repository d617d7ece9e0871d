//! A queue of a TUN device opened by name, read and written one IP packet at a time.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};

/// Set by SIGTERM or SIGINT; the stage finishes its loop and reports.
static TERMINATED: AtomicBool = AtomicBool::new(false);

/// One attached queue of a multi-queue TUN device (IFF_TUN | IFF_NO_PI | IFF_MULTI_QUEUE),
/// non-blocking.
pub(crate) struct TunDevice {
    file: File,
}

impl TunDevice {
    /// Attaches a queue of the TUN device `name`, creating the device when it does not
    /// exist. Each call attaches one more queue.
    pub(crate) fn open(name: &str) -> anyhow::Result<Self> {
        let mut request = ifreq_named(name)?;
        request.ifr_ifru.ifru_flags =
            (libc::IFF_TUN | libc::IFF_NO_PI | libc::IFF_MULTI_QUEUE) as libc::c_short;
        // SAFETY: the path is a valid NUL-terminated string; `open` has no other preconditions.
        let fd = unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error()).context("could not open /dev/net/tun");
        }
        // SAFETY: `fd` was just returned by `open` and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: TUNSETIFF reads and writes one `ifreq`, which `request` is, alive for the call.
        let result = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut request) };
        if result < 0 {
            return Err(io::Error::last_os_error())
                .with_context(|| format!("could not attach to TUN device {name} (TUNSETIFF)"));
        }
        Ok(Self {
            file: File::from(fd),
        })
    }

    /// Waits until a packet can be read, for at most `timeout`; `false` on timeout or signal.
    pub(crate) fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        let mut poll = libc::pollfd {
            fd: self.file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let timeout = libc::timespec {
            tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
            // Below 10⁹, so it fits a `c_long` on every target.
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `poll` and `timeout` are valid for the call; a null signal mask keeps the
        // thread's own.
        let ready = unsafe { libc::ppoll(&mut poll, 1, &timeout, std::ptr::null()) };
        if ready < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(error);
        }
        Ok(ready > 0 && poll.revents & libc::POLLIN != 0)
    }

    /// Reads one packet into `buffer`; `WouldBlock` when none is waiting.
    pub(crate) fn read_packet(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        self.file.read(buffer)
    }

    /// Writes one packet, which the kernel then receives on the device.
    pub(crate) fn write_packet(&mut self, packet: &[u8]) -> io::Result<usize> {
        self.file.write(packet)
    }
}

fn ifreq_named(name: &str) -> anyhow::Result<libc::ifreq> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        bail!(
            "TUN device name `{name}` must be 1 to {} bytes",
            libc::IFNAMSIZ - 1
        );
    }
    // SAFETY: `ifreq` is plain data (a name array and a union of plain data); all zeroes is
    // a valid value of it.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(name.bytes()) {
        *slot = byte as libc::c_char;
    }
    Ok(request)
}

/// Makes SIGTERM and SIGINT set [`terminated`] instead of killing the process, and interrupt
/// a wait in progress.
pub(crate) fn catch_termination() -> anyhow::Result<()> {
    extern "C" fn on_signal(_: libc::c_int) {
        // Storing to an atomic is async-signal-safe.
        TERMINATED.store(true, Ordering::SeqCst);
    }
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: all zeroes is a valid `sigaction` (empty mask, no flags); the handler is
        // set below, and without SA_RESTART a blocked `ppoll` returns EINTR.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: `action` is a valid, initialized `sigaction`; the old action is not wanted.
        if unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error()).context("could not install a signal handler");
        }
    }
    Ok(())
}

/// Whether SIGTERM or SIGINT has arrived.
pub(crate) fn terminated() -> bool {
    TERMINATED.load(Ordering::SeqCst)
}
