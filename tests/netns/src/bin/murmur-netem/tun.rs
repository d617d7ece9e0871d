//! A queue of a TUN device opened by name, read and written one IP packet at a time.
//!
//! With segment offloads the kernel hands the stage whole TCP and UDP super-packets (up to
//! 64 KiB, each led by a `virtio_net_hdr`) instead of MTU-sized ones, and takes them back the
//! same way: the segmentation that the sender's GSO deferred then happens, if at all, at the
//! receiver's end. One read and one write then carry up to 45 full-size packets.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};

/// Set by SIGTERM or SIGINT; the stage finishes its loop and reports.
static TERMINATED: AtomicBool = AtomicBool::new(false);

/// Bytes of the `virtio_net_hdr` that leads every packet of a device opened with offloads
/// (the kernel's default header size for TUN devices).
pub(crate) const VNET_HEADER_BYTES: usize = 10;

/// Offloads asked for: checksums, TCP segmentation (IPv4, IPv6) and UDP segmentation
/// (IPv4, IPv6; Linux 6.2 and later).
const OFFLOADS: libc::c_uint =
    libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_USO4 | libc::TUN_F_USO6;
/// The same without UDP segmentation, for kernels older than 6.2.
const OFFLOADS_WITHOUT_USO: libc::c_uint = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6;

/// One attached queue of a multi-queue TUN device (IFF_TUN | IFF_NO_PI | IFF_MULTI_QUEUE,
/// and IFF_VNET_HDR with offloads), non-blocking.
pub(crate) struct TunDevice {
    file: File,
}

impl TunDevice {
    /// Attaches a queue of the TUN device `name`, creating the device when it does not
    /// exist. Each call attaches one more queue; every queue of a device must agree on
    /// `offloads`. With offloads, every packet read or written is led by a
    /// [`VNET_HEADER_BYTES`]-byte `virtio_net_hdr`.
    pub(crate) fn open(name: &str, offloads: bool) -> anyhow::Result<Self> {
        let mut request = ifreq_named(name)?;
        let mut flags = libc::IFF_TUN | libc::IFF_NO_PI | libc::IFF_MULTI_QUEUE;
        if offloads {
            flags |= libc::IFF_VNET_HDR;
        }
        request.ifr_ifru.ifru_flags = flags as libc::c_short;
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
        if offloads {
            set_offloads(&fd, name)?;
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

/// Asks for [`OFFLOADS`], or for [`OFFLOADS_WITHOUT_USO`] where the kernel has no UDP
/// segmentation offload for TUN devices.
fn set_offloads(fd: &OwnedFd, name: &str) -> anyhow::Result<()> {
    for offloads in [OFFLOADS, OFFLOADS_WITHOUT_USO] {
        // SAFETY: TUNSETOFFLOAD takes its argument by value; `fd` is an open TUN queue.
        let result = unsafe {
            libc::ioctl(
                fd.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                libc::c_ulong::from(offloads),
            )
        };
        if result == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EINVAL) {
            return Err(error)
                .with_context(|| format!("could not set offloads of TUN device {name}"));
        }
    }
    Err(io::Error::last_os_error())
        .with_context(|| format!("TUN device {name} takes no segmentation offload"))
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
