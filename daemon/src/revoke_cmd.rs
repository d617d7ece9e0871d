//! `murmur swarm revoke`: the organizer takes invites back.
//!
//! Each run signs a new list with a higher serial, naming every peer of the previous list
//! (read from `--out`, and checked to be this swarm's) plus the new ones, minus the lifted
//! ones. Written whole to a temporary file and renamed over `--out`, so a daemon reading
//! the file never sees half a list. Handing it to one member (its `swarm.revocation_file`)
//! is enough: members gossip it.

use std::path::Path;
use std::str::FromStr;

use anyhow::Context;
use murmur_protocol::identity::{MAX_REVOCATIONS_LEN, PeerId, Revocations};

use crate::cli::SwarmRevokeArgs;
use crate::input_error::BadInput;
use crate::swarm_cmd::load_authority;

/// `murmur swarm revoke PEER_ID… [--lift PEER_ID…]`.
pub(crate) fn revoke(args: &SwarmRevokeArgs) -> anyhow::Result<()> {
    if args.peer_ids.is_empty() && args.lift.is_empty() {
        return Err(
            BadInput("name a peer to revoke, or one to lift with --lift".to_owned()).into(),
        );
    }
    let (authority, swarm) = load_authority(&args.authority_key, &args.swarm_config)?;
    let previous = read_previous(&args.out)?;
    if let Some(list) = &previous {
        list.verify(&authority.public(), &swarm).map_err(|e| {
            BadInput(format!(
                "{} is not this swarm's revocation list: {e}; pass another --out",
                args.out.display()
            ))
        })?;
    }
    let revoke = parse_peers(&args.peer_ids)?;
    let lift = parse_peers(&args.lift)?;
    let mut peers: Vec<PeerId> = previous
        .as_ref()
        .map(|list| list.revoked().to_vec())
        .unwrap_or_default();
    peers.extend(revoke);
    peers.retain(|p| !lift.contains(p));
    // A clock set back must not make the new list older than the last one.
    let serial = previous
        .as_ref()
        .map_or(0, |list| list.serial().saturating_add(1))
        .max(crate::clock::unix_s());
    let list = Revocations::issue(&authority, &swarm, serial, peers)
        .map_err(|e| BadInput(e.to_string()))?;
    write_whole(&args.out, &list.encode())?;
    println!(
        "wrote {}: serial {serial} revokes {} peer(s) of swarm {swarm}",
        args.out.display(),
        list.revoked().len()
    );
    for peer in list.revoked() {
        println!("  {peer}");
    }
    println!(
        "copy it to any member's swarm.revocation_file: members look at it every second and \
         gossip it to the rest"
    );
    Ok(())
}

fn parse_peers(texts: &[String]) -> anyhow::Result<Vec<PeerId>> {
    texts
        .iter()
        .map(|text| {
            PeerId::from_str(text.trim()).map_err(|e| {
                BadInput(format!(
                    "{text:?} is not a peer id: {e}; pass ids as 12D3KooW…"
                ))
                .into()
            })
        })
        .collect()
}

/// The list at `path`, if there is one.
fn read_previous(path: &Path) -> anyhow::Result<Option<Revocations>> {
    if path.symlink_metadata().is_err() {
        return Ok(None);
    }
    let bytes = crate::config::read_regular(path, MAX_REVOCATIONS_LEN)
        .map_err(|e| BadInput(format!("cannot read {}: {e}", path.display())))?;
    let list = Revocations::decode(&bytes).map_err(|e| {
        BadInput(format!(
            "{} is not a revocation list: {e}; pass another --out",
            path.display()
        ))
    })?;
    Ok(Some(list))
}

/// Writes `bytes` to a temporary file beside `path` and renames it over `path`.
fn write_whole(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut temp = path.as_os_str().to_owned();
    temp.push(".tmp");
    let temp = std::path::PathBuf::from(temp);
    std::fs::write(&temp, bytes).with_context(|| format!("writing {}", temp.display()))?;
    std::fs::rename(&temp, path)
        .with_context(|| format!("renaming {} to {}", temp.display(), path.display()))
}
