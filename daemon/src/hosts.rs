//! Where `murmur local` and `murmur bench allreduce` start their peers.
//!
//! By default every peer is a child process on this machine listening on loopback. With
//! `--hosts FILE`, each peer's command line is prefixed with a launcher (for example
//! `ip netns exec NAME`, which runs it inside a network namespace) and the peer listens on
//! the address the file gives it:
//!
//! ```toml
//! [[peer]]
//! launch = ["ip", "netns", "exec", "lab-p0"]
//! listen_ip = "10.77.0.2"
//!
//! [[peer]]
//! launch = ["ip", "netns", "exec", "lab-p1"]
//! listen_ip = "10.77.1.2"
//! ```
//!
//! The launcher runs on this machine and the peer reads its files at this machine's paths,
//! so the launcher must see this file system (a namespace does; a plain `ssh` does not).

use std::ffi::OsStr;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Command;

use serde::Deserialize;

use crate::input_error::BadInput;

/// One peer's launcher and address.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PeerHost {
    /// The command line the peer's own command line is appended to; empty: none.
    #[serde(default)]
    pub(crate) launch: Vec<String>,
    /// The address the peer listens on (QUIC and TCP).
    pub(crate) listen_ip: IpAddr,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostsFile {
    peer: Vec<PeerHost>,
}

/// Where every peer of a run starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hosts {
    peers: Vec<PeerHost>,
}

impl Hosts {
    /// `peers` children of this process, listening on 127.0.0.1.
    pub(crate) fn loopback(peers: usize) -> Hosts {
        let here = PeerHost {
            launch: Vec::new(),
            listen_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        Hosts {
            peers: vec![here; peers],
        }
    }

    /// `--hosts FILE` when given, loopback otherwise; the file must name exactly `peers`
    /// peers.
    pub(crate) fn from_flag(file: Option<&Path>, peers: usize) -> Result<Hosts, BadInput> {
        match file {
            None => Ok(Hosts::loopback(peers)),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|error| {
                    BadInput(format!(
                        "--hosts {}: cannot read it: {error}",
                        path.display()
                    ))
                })?;
                Hosts::parse(&text, peers)
                    .map_err(|why| BadInput(format!("--hosts {}: {why}", path.display())))
            }
        }
    }

    /// Parses a hosts file's text; the error says what was wrong, without the file's name.
    fn parse(text: &str, peers: usize) -> Result<Hosts, String> {
        let file: HostsFile = toml::from_str(text).map_err(|error| error.to_string())?;
        if file.peer.len() != peers {
            return Err(format!(
                "it lists {} [[peer]] tables, but the run has {peers} peers; give one per peer",
                file.peer.len()
            ));
        }
        for (index, peer) in file.peer.iter().enumerate() {
            if peer.listen_ip.is_unspecified() {
                return Err(format!(
                    "peer {index}: listen_ip = \"{}\" is unspecified; give the address other \
                     peers reach it at",
                    peer.listen_ip
                ));
            }
            if peer.launch.iter().any(String::is_empty) {
                return Err(format!("peer {index}: launch has an empty word; remove it"));
            }
        }
        Ok(Hosts { peers: file.peer })
    }

    /// How many peers.
    pub(crate) fn len(&self) -> usize {
        self.peers.len()
    }

    /// The address peer `index` listens on.
    pub(crate) fn listen_ip(&self, index: usize) -> IpAddr {
        self.peers[index].listen_ip
    }

    /// Peer `index`'s listen multiaddrs: QUIC first, then TCP, on ports the system picks.
    pub(crate) fn listen_addrs(&self, index: usize) -> [String; 2] {
        let proto = match self.listen_ip(index) {
            IpAddr::V4(_) => "ip4",
            IpAddr::V6(_) => "ip6",
        };
        let ip = self.listen_ip(index);
        [
            format!("/{proto}/{ip}/udp/0/quic-v1"),
            format!("/{proto}/{ip}/tcp/0"),
        ]
    }

    /// A command that runs `program` as peer `index`: under its launcher, if it has one.
    pub(crate) fn command(&self, index: usize, program: impl AsRef<OsStr>) -> Command {
        let mut command = match self.peers[index].launch.split_first() {
            None => Command::new(program),
            Some((first, rest)) => {
                let mut command = Command::new(first);
                command.args(rest).arg(program);
                command
            }
        };
        end_with_parent(&mut command);
        command
    }
}

/// Has the kernel send the child SIGTERM (a clean stop for `murmur run`) when this process
/// dies, however it dies, even by SIGKILL: no peer outlives the `murmur local` or `bench
/// allreduce` that started it. Linux sends it when the *thread* that started the child
/// exits; both start their peers from the main thread, which lives as long as the process.
fn end_with_parent(command: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec. It only calls `prctl`,
    // `getppid` and `_exit`, which are async-signal-safe, and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the request: nobody will send the signal.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "[[peer]]\nlaunch = [\"ip\", \"netns\", \"exec\", \"a\"]\nlisten_ip = \"10.0.0.2\"\n\n[[peer]]\nlisten_ip = \"10.0.1.2\"\n";

    #[test]
    fn a_file_gives_each_peer_its_launcher_and_address() {
        let hosts = Hosts::parse(TWO, 2).unwrap();
        assert_eq!(hosts.len(), 2);
        let command = hosts.command(0, "/bin/murmur");
        assert_eq!(command.get_program(), "ip");
        let args: Vec<_> = command.get_args().collect();
        assert_eq!(args, ["netns", "exec", "a", "/bin/murmur"]);
        assert_eq!(hosts.command(1, "/bin/murmur").get_program(), "/bin/murmur");
        assert_eq!(
            hosts.listen_addrs(1),
            ["/ip4/10.0.1.2/udp/0/quic-v1", "/ip4/10.0.1.2/tcp/0"]
        );
    }

    #[test]
    fn loopback_peers_run_here() {
        let hosts = Hosts::loopback(3);
        assert_eq!(hosts.len(), 3);
        assert_eq!(hosts.command(2, "m").get_program(), "m");
        assert_eq!(hosts.listen_addrs(2)[0], "/ip4/127.0.0.1/udp/0/quic-v1");
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let wrong_count = Hosts::parse(TWO, 3).unwrap_err();
        assert!(
            wrong_count.contains("lists 2 [[peer]] tables"),
            "{wrong_count}"
        );
        let unknown =
            Hosts::parse("[[peer]]\nlisten_ip = \"10.0.0.2\"\nport = 3\n", 1).unwrap_err();
        assert!(unknown.contains("unknown field `port`"), "{unknown}");
        let not_ip = Hosts::parse("[[peer]]\nlisten_ip = \"ten\"\n", 1).unwrap_err();
        assert!(not_ip.contains("listen_ip"), "{not_ip}");
        let any = Hosts::parse("[[peer]]\nlisten_ip = \"0.0.0.0\"\n", 1).unwrap_err();
        assert!(any.contains("unspecified"), "{any}");
        let empty =
            Hosts::parse("[[peer]]\nlaunch = [\"\"]\nlisten_ip = \"10.0.0.2\"\n", 1).unwrap_err();
        assert!(empty.contains("empty word"), "{empty}");
    }

    #[test]
    fn a_missing_file_is_named() {
        let error = Hosts::from_flag(Some(Path::new("/nonexistent/hosts.toml")), 2).unwrap_err();
        assert!(
            error.0.contains("--hosts /nonexistent/hosts.toml"),
            "{error}"
        );
    }
}
