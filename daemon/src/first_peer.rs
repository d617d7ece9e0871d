//! The organizer's own first peer, set up by `murmur swarm new`: a key, an invite, and a
//! config that listens on a fixed port, so that the address volunteers bootstrap from
//! stays the same across restarts.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use murmur_protocol::identity::{Invite, Keypair, PeerId, SwarmId};

use crate::input_error::BadInput;

/// The template's listen line, which the first peer's config pins to a port.
const LISTEN_LINE: &str =
    "listen_addrs = [\"/ip4/0.0.0.0/udp/0/quic-v1\", \"/ip4/0.0.0.0/tcp/0\"]\n";
/// The template's bootstrap line, which `swarm.toml` fills in when the host is known.
const BOOTSTRAP_LINE: &str = "bootstrap = []\n";
/// How long the first peer's own invite lasts.
const INVITE_DAYS: u64 = 3650;

/// The organizer's first peer, once written.
#[derive(Debug)]
pub(crate) struct FirstPeer {
    pub(crate) id: PeerId,
    pub(crate) config: PathBuf,
    /// Its addresses with `/p2p/`, at `host` (or the placeholder `YOUR_PUBLIC_IP`).
    pub(crate) addresses: Vec<String>,
}

/// The files `write` creates in `dir`.
pub(crate) fn files(dir: &Path) -> [PathBuf; 3] {
    ["murmur.key", "invite", "murmur.toml"].map(|name| dir.join(name))
}

/// Checks `--public-host`: an IP address or a DNS name; returns its multiaddr prefix.
pub(crate) fn host_prefix(host: &str) -> Result<String, BadInput> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(match ip {
            IpAddr::V4(v4) => format!("/ip4/{v4}"),
            IpAddr::V6(v6) => format!("/ip6/{v6}"),
        });
    }
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .split('.')
            .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    if name_ok {
        Ok(format!("/dns/{host}"))
    } else {
        Err(BadInput(format!(
            "--public-host {host:?} is neither an IP address nor a DNS name"
        )))
    }
}

/// Writes the first peer into `dir` (its key, its invite from `authority`, and `swarm_toml`
/// listening on `port`); `prefix` is the multiaddr of its public host, if known.
pub(crate) fn write(
    dir: &Path,
    authority: &Keypair,
    swarm: &SwarmId,
    swarm_toml: &str,
    port: u16,
    prefix: Option<&str>,
) -> anyhow::Result<FirstPeer> {
    let [key_file, invite_file, config_file] = files(dir);
    let key = Keypair::create_file(&key_file).map_err(|e| BadInput(e.to_string()))?;
    let id = key.peer_id();
    let now = crate::clock::unix_s();
    let invite = Invite::issue(authority, &id, swarm, now, now + INVITE_DAYS * 86_400)
        .context("signing the first peer's invite")?;
    std::fs::write(&invite_file, invite.encode())
        .with_context(|| format!("writing {}", invite_file.display()))?;
    let listen = format!(
        "listen_addrs = [\"/ip4/0.0.0.0/udp/{port}/quic-v1\", \"/ip4/0.0.0.0/tcp/{port}\"]\n"
    );
    let config = swarm_toml.replacen(LISTEN_LINE, &listen, 1);
    std::fs::write(&config_file, config)
        .with_context(|| format!("writing {}", config_file.display()))?;
    let prefix = prefix.unwrap_or("/ip4/YOUR_PUBLIC_IP");
    Ok(FirstPeer {
        id,
        config: config_file,
        addresses: vec![
            format!("{prefix}/udp/{port}/quic-v1/p2p/{id}"),
            format!("{prefix}/tcp/{port}/p2p/{id}"),
        ],
    })
}

/// `swarm_toml` bootstrapping from `addresses`.
pub(crate) fn with_bootstrap(swarm_toml: &str, addresses: &[String]) -> String {
    let quoted: Vec<String> = addresses.iter().map(|a| format!("\"{a}\"")).collect();
    swarm_toml.replacen(
        BOOTSTRAP_LINE,
        &format!("bootstrap = [{}]\n", quoted.join(", ")),
        1,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::template;

    #[test]
    fn the_lines_to_edit_appear_once_in_the_template() {
        assert_eq!(template::TEMPLATE.matches(LISTEN_LINE).count(), 1);
        assert_eq!(template::TEMPLATE.matches(BOOTSTRAP_LINE).count(), 1);
    }

    #[test]
    fn public_hosts_become_multiaddr_prefixes() {
        assert_eq!(host_prefix("203.0.113.7").unwrap(), "/ip4/203.0.113.7");
        assert_eq!(host_prefix("2001:db8::1").unwrap(), "/ip6/2001:db8::1");
        assert_eq!(
            host_prefix("train.example.org").unwrap(),
            "/dns/train.example.org"
        );
        for bad in ["", "a b", "host:7600", "a..b"] {
            assert!(host_prefix(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
