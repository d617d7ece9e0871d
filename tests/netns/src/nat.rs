//! A small internet with home routers: one public host and two private hosts, each behind
//! a router that translates addresses (nftables masquerade), all joined through a hub.
//!
//! ```text
//!   public ns                    inet ns (hub)                 nat1 ns                 private1 ns
//!  eth0 10.99.0.2 ─veth─ to-public 10.99.0.1                                          
//!                        to-nat1   10.99.1.1 ─veth─ wan 10.99.1.2 | lan 192.168.1.1 ─veth─ eth0 192.168.1.2
//!                        to-nat2   10.99.2.1 ─veth─ wan 10.99.2.2 | lan 192.168.2.1 ─veth─ eth0 192.168.2.2
//! ```
//!
//! The hub routes between its three links and knows nothing of the 192.168 networks, as on
//! the internet: a packet to a private address from outside is unroutable. Each router
//! masquerades what leaves by its `wan` and forwards only what conntrack matches back in.
//!
//! - [`NatKind::Cone`]: plain masquerade. Linux keeps the source port where it can, and maps
//!   one socket to one outside port whatever the destination, so a hole punch works.
//! - [`NatKind::Symmetric`]: masquerade with `random,fully-random` ports: every new
//!   destination gets its own outside port, so the port a third party observed is useless
//!   to a peer, and hole punching fails.
//! - [`NatKind::UdpBlocked`]: cone routers, and the first one drops all UDP it forwards: its
//!   host can only use TCP.
//!
//! Namespaces are named like the [`crate::Harness`]'s (`murmur-nt-<pid>-<n>-…`), so a killed
//! test's namespaces are removed by the next harness, and SIGINT or SIGTERM removes them.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::Duration;

use crate::HarnessError;
use crate::harness::{
    TOOL_LIMIT, check_root, check_tool, claim_prefix, in_namespace, ip_in, remove_namespace, tool,
    write_sysctls,
};
use crate::run_checked;

/// How the routers translate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatKind {
    /// Endpoint-independent mapping (port kept): hole punching works.
    Cone,
    /// A random outside port per destination: hole punching fails.
    Symmetric,
    /// Cone routers; the first drops every UDP packet it forwards.
    UdpBlocked,
}

/// A host of the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatHost {
    /// On the hub's network, reachable by all.
    Public,
    /// Behind router `n` (1 or 2).
    Private(u8),
}

/// The built network; dropping it kills what runs in its namespaces and deletes them.
#[derive(Debug)]
pub struct NatNetwork {
    prefix: String,
    created: Vec<String>,
}

/// Interface name of each host's only link.
const HOST_DEVICE: &str = "eth0";

impl NatNetwork {
    /// Builds the network with routers of `kind`. Needs root, `ip` and `nft`.
    pub fn build(kind: NatKind) -> Result<NatNetwork, HarnessError> {
        check_root()?;
        check_tool("ip", "iproute2")?;
        check_tool("nft", "nftables")?;
        let prefix = claim_prefix()?;
        let mut network = NatNetwork {
            prefix,
            created: Vec::new(),
        };
        for name in ["inet", "public", "nat1", "nat2", "private1", "private2"] {
            let namespace = network.name(name);
            tool("ip", &["netns", "add", &namespace])?;
            network.created.push(namespace.clone());
            ip_in(&namespace, &["link", "set", "lo", "up"])?;
        }
        let inet = network.name("inet");
        network.link(
            &inet,
            "to-public",
            "10.99.0.1/24",
            "public",
            HOST_DEVICE,
            "10.99.0.2/24",
        )?;
        ip_in(
            &network.name("public"),
            &["route", "add", "default", "via", "10.99.0.1"],
        )?;
        for n in 1..=2u8 {
            let router = network.name(&format!("nat{n}"));
            let host = network.name(&format!("private{n}"));
            network.link(
                &inet,
                &format!("to-nat{n}"),
                &format!("10.99.{n}.1/24"),
                &format!("nat{n}"),
                "wan",
                &format!("10.99.{n}.2/24"),
            )?;
            network.link(
                &router,
                "lan",
                &format!("192.168.{n}.1/24"),
                &format!("private{n}"),
                HOST_DEVICE,
                &format!("192.168.{n}.2/24"),
            )?;
            ip_in(
                &router,
                &["route", "add", "default", "via", &format!("10.99.{n}.1")],
            )?;
            ip_in(
                &host,
                &["route", "add", "default", "via", &format!("192.168.{n}.1")],
            )?;
            write_sysctls(&router, &[("net/ipv4/ip_forward", "1", true)])?;
            let block_udp = kind == NatKind::UdpBlocked && n == 1;
            nft(&router, &ruleset(kind, block_udp))?;
        }
        write_sysctls(&inet, &[("net/ipv4/ip_forward", "1", true)])?;
        nft(&inet, HUB_RULESET)?;
        Ok(network)
    }

    fn name(&self, host: &str) -> String {
        format!("{}-{host}", self.prefix)
    }

    /// A veth pair: `a_dev` in namespace `a` with `a_addr`, `b_dev` in host `b` with
    /// `b_addr`; both up.
    fn link(
        &self,
        a: &str,
        a_dev: &str,
        a_addr: &str,
        b: &str,
        b_dev: &str,
        b_addr: &str,
    ) -> Result<(), HarnessError> {
        let b = self.name(b);
        tool(
            "ip",
            &[
                "link", "add", "name", a_dev, "netns", a, "type", "veth", "peer", "name", b_dev,
                "netns", &b,
            ],
        )?;
        for (namespace, dev, addr) in [(a, a_dev, a_addr), (b.as_str(), b_dev, b_addr)] {
            ip_in(namespace, &["addr", "add", addr, "dev", dev])?;
            ip_in(namespace, &["link", "set", dev, "up"])?;
        }
        Ok(())
    }

    /// The namespace of `host`.
    pub fn namespace(&self, host: NatHost) -> String {
        match host {
            NatHost::Public => self.name("public"),
            NatHost::Private(n) => self.name(&format!("private{n}")),
        }
    }

    /// The address of `host` on its own link (a private one behind a router).
    pub fn address(&self, host: NatHost) -> Ipv4Addr {
        match host {
            NatHost::Public => Ipv4Addr::new(10, 99, 0, 2),
            NatHost::Private(n) => Ipv4Addr::new(192, 168, n, 2),
        }
    }

    /// A command that runs `program` inside `host`'s namespace.
    pub fn command(&self, host: NatHost, program: impl AsRef<OsStr>) -> Command {
        in_namespace(&self.namespace(host), program)
    }

    /// Bytes `host` has received and sent on its link so far, from the kernel's counters.
    pub fn link_bytes(&self, host: NatHost) -> Result<(u64, u64), HarnessError> {
        let mut command = self.command(host, "cat");
        command.args([
            format!("/sys/class/net/{HOST_DEVICE}/statistics/rx_bytes"),
            format!("/sys/class/net/{HOST_DEVICE}/statistics/tx_bytes"),
        ]);
        let output = run_checked(command, TOOL_LIMIT)?;
        let text = String::from_utf8_lossy(&output.stdout);
        let mut numbers = text
            .split_whitespace()
            .map(|n| n.parse::<u64>().unwrap_or(0));
        Ok((numbers.next().unwrap_or(0), numbers.next().unwrap_or(0)))
    }

    /// Bytes the two routers have sent each other directly through the hub, both ways
    /// together: what private hosts exchange without a relay.
    pub fn direct_private_bytes(&self) -> Result<u64, HarnessError> {
        let mut command = in_namespace(&self.name("inet"), "nft");
        command.args(["list", "counter", "ip", "murmur_hub", "private_direct"]);
        let output = run_checked(command, TOOL_LIMIT)?;
        let text = String::from_utf8_lossy(&output.stdout);
        Ok(text
            .split_whitespace()
            .skip_while(|word| *word != "bytes")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0))
    }

    /// `GET path` from an HTTP server at `addr` inside `host`'s namespace (a daemon's
    /// `/status` on its loopback, say); the body of the answer. A thread of its own enters
    /// the namespace, so the caller's stays where it is.
    pub fn http_get(
        &self,
        host: NatHost,
        addr: SocketAddr,
        path: &str,
        limit: Duration,
    ) -> std::io::Result<String> {
        let namespace = format!("/run/netns/{}", self.namespace(host));
        let path = path.to_owned();
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    let file = std::fs::File::open(&namespace)?;
                    // SAFETY: `setns` on an open namespace file moves only this thread,
                    // which ends when this closure returns.
                    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let mut stream = TcpStream::connect_timeout(&addr, limit)?;
                    stream.set_read_timeout(Some(limit))?;
                    stream.set_write_timeout(Some(limit))?;
                    write!(
                        stream,
                        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
                    )?;
                    let mut answer = Vec::new();
                    stream.take(1 << 20).read_to_end(&mut answer)?;
                    let text = String::from_utf8_lossy(&answer).into_owned();
                    Ok(text
                        .split_once("\r\n\r\n")
                        .map_or(String::new(), |(_, body)| body.to_owned()))
                })
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the request thread panicked")))
        })
    }
}

/// The hub counts what the two routers send each other directly (not through the public
/// host): a hole-punched connection's bytes.
const HUB_RULESET: &str = "table ip murmur_hub {\n\
     counter private_direct { }\n\
     chain forward { type filter hook forward priority filter; \
     ip saddr 10.99.1.2 ip daddr 10.99.2.2 counter name \"private_direct\"; \
     ip saddr 10.99.2.2 ip daddr 10.99.1.2 counter name \"private_direct\"; }\n\
     }\n";

/// The router's nftables ruleset.
fn ruleset(kind: NatKind, block_udp: bool) -> String {
    let masquerade = match kind {
        NatKind::Symmetric => "masquerade random,fully-random",
        NatKind::Cone | NatKind::UdpBlocked => "masquerade",
    };
    let udp = if block_udp {
        "meta l4proto udp drop;"
    } else {
        ""
    };
    // Forward out freely; back in only what belongs to a connection started inside. The
    // router itself takes nothing unsolicited: dropped in `input`, such a packet leaves no
    // conntrack entry behind. (Accepted, or answered with a port-unreachable, it would hold
    // the tuple, and a host's hole punch to the same peer a moment later would be mapped
    // to another port, as on routers that do so.)
    format!(
        "table ip murmur_nat {{\n\
         chain postrouting {{ type nat hook postrouting priority srcnat; oifname \"wan\" {masquerade}; }}\n\
         chain forward {{ type filter hook forward priority filter; policy drop; {udp} \
         iifname \"lan\" accept; ct state established,related accept; }}\n\
         chain input {{ type filter hook input priority filter; policy drop; \
         iifname \"lo\" accept; ct state established,related accept; }}\n\
         }}\n"
    )
}

fn nft(namespace: &str, ruleset: &str) -> Result<(), HarnessError> {
    let path = std::env::temp_dir().join(format!("{namespace}.nft"));
    std::fs::write(&path, ruleset).map_err(|source| HarnessError::Spawn {
        command: format!("writing {}", path.display()),
        source,
    })?;
    let mut command = in_namespace(namespace, "nft");
    command.arg("-f").arg(&path);
    let result = run_checked(command, TOOL_LIMIT).map(drop);
    let _ = std::fs::remove_file(&path);
    result
}

impl Drop for NatNetwork {
    fn drop(&mut self) {
        for namespace in self.created.drain(..).rev() {
            if let Err(error) = remove_namespace(&namespace) {
                eprintln!("murmur-netns: could not remove namespace {namespace}: {error}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rulesets_masquerade_as_asked_and_block_udp_only_where_asked() {
        let cone = ruleset(NatKind::Cone, false);
        assert!(cone.contains("oifname \"wan\" masquerade;"));
        assert!(!cone.contains("udp drop"));
        assert!(ruleset(NatKind::Symmetric, false).contains("masquerade random,fully-random"));
        assert!(ruleset(NatKind::UdpBlocked, true).contains("meta l4proto udp drop;"));
    }
}
