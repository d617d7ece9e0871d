//! The swarm's revocation list: where it comes from, what adopting one does, and how it
//! spreads.
//!
//! A list comes from the file `swarm.revocation_file` names (read at start and whenever
//! its size or modification time changes), from [`NetHandle::adopt_revocations`]
//! (super::NetHandle::adopt_revocations), or from a member on the gossip topic
//! `murmur/<swarm>/revocations`. Whatever its source, a list counts only if the swarm
//! authority signed it for this swarm, and replaces the one held only if its serial is
//! higher. Adopting one:
//!
//! - refuses every connected peer it names (counted, and towards a ban like any invite
//!   refusal), and forgets their verified invites, so heartbeats others relay from them are
//!   dropped too;
//! - makes the auth check refuse their hellos from then on;
//! - gossips the list, and gossips it again a few seconds after each newly admitted peer
//!   (gossipsub delivers only what is published after a peer joins), so a member that
//!   never read the file learns it. A member ignores a list that is not newer than its own,
//!   so repeats stop at the first hop.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use libp2p::gossipsub;
use murmur_protocol::identity::{MAX_REVOCATIONS_LEN, RevocationError, Revocations};

use super::actor::{NetActor, Refusal};

/// How long after a peer is admitted the list is gossiped again: time for its
/// subscription to the topic to arrive.
const REPUBLISH_AFTER_ADMISSION: Duration = Duration::from_secs(2);
/// How often the list is gossiped when nothing else asks for it.
const REPUBLISH_EVERY: Duration = Duration::from_secs(60);
/// How often the file's metadata is looked at.
const FILE_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Where a list came from, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// `swarm.revocation_file`.
    File,
    /// The application, through the handle.
    Handle,
    /// A member's gossip.
    Gossip,
}

/// The revocation state of the network task.
#[derive(Debug)]
pub(crate) struct RevocationState {
    /// The gossip topic of lists.
    pub(crate) topic: gossipsub::TopicHash,
    /// When the file was last looked at, and what its metadata said.
    file_checked_at: Option<Instant>,
    file_seen: Option<(SystemTime, u64)>,
    /// When the held list is next gossiped.
    publish_at: Option<Instant>,
}

impl RevocationState {
    pub(crate) fn new(topic: gossipsub::TopicHash) -> RevocationState {
        RevocationState {
            topic,
            file_checked_at: None,
            file_seen: None,
            publish_at: None,
        }
    }
}

impl NetActor {
    /// Verifies `list` and adopts it if newer (see the module's documentation).
    pub(crate) fn adopt_revocations(
        &mut self,
        list: Revocations,
        origin: Origin,
    ) -> Result<bool, RevocationError> {
        let serial = list.serial();
        let revoked = list.revoked().len();
        if !self.authorizer.adopt(list)? {
            return Ok(false);
        }
        self.ctx.metrics.revocation_list_adopted();
        tracing::info!(serial, revoked, ?origin, "revocation list adopted");
        let named: Vec<libp2p::PeerId> = self
            .peers
            .iter()
            .filter(|(_, state)| state.refused_at.is_none())
            .filter_map(|(peer, state)| state.id.map(|id| (*peer, id)))
            .filter(|(_, id)| self.authorizer.revoked(id).is_some())
            .map(|(peer, _)| peer)
            .collect();
        if let Some(list) = self.authorizer.revocations() {
            for id in list.revoked() {
                self.invites.forget(id);
            }
        }
        for peer in named {
            self.ctx.metrics.peer_refused_revoked();
            self.refuse(
                &peer,
                Refusal::Rejected,
                format!("the swarm authority revoked it (revocation list serial {serial})"),
            );
        }
        // Gossip already relays what it delivered; the others spread it now, so that every
        // member refuses the revoked peers within moments of this one.
        self.revocation.publish_at = Some(Instant::now() + REPUBLISH_EVERY);
        if origin != Origin::Gossip {
            self.publish_revocations();
        }
        Ok(true)
    }

    /// Judges a list that arrived by gossip from `source`.
    pub(crate) fn on_revocation_gossip(
        &mut self,
        source: &libp2p::PeerId,
        message: &gossipsub::Message,
    ) -> gossipsub::MessageAcceptance {
        let forwarder_admitted = self
            .peers
            .get(source)
            .is_some_and(|s| s.admitted.is_some() && s.refused_at.is_none());
        if !forwarder_admitted {
            self.ctx.metrics.gossip_rejected();
            return gossipsub::MessageAcceptance::Reject;
        }
        let verdict = Revocations::decode(&message.data)
            .map_err(|e| e.to_string())
            .and_then(|list| {
                self.adopt_revocations(list, Origin::Gossip)
                    .map_err(|e| e.to_string())
            });
        match verdict {
            Ok(true) => gossipsub::MessageAcceptance::Accept,
            Ok(false) => gossipsub::MessageAcceptance::Ignore,
            Err(reason) => {
                self.ctx.metrics.gossip_rejected();
                tracing::warn!(forwarder = %source, %reason, "revocation list from gossip refused");
                gossipsub::MessageAcceptance::Reject
            }
        }
    }

    /// A peer was just admitted: gossip the list again soon, so that it learns it.
    pub(crate) fn revocations_for_newcomer(&mut self) {
        if self.authorizer.revocations().is_none() {
            return;
        }
        let soon = Instant::now() + REPUBLISH_AFTER_ADMISSION;
        let at = self.revocation.publish_at.map_or(soon, |at| at.min(soon));
        self.revocation.publish_at = Some(at);
    }

    /// The periodic work: read the file if it changed, gossip the list when due.
    pub(crate) fn revocations_tick(&mut self, now: Instant) {
        let check_due = self
            .revocation
            .file_checked_at
            .is_none_or(|at| now.duration_since(at) >= FILE_CHECK_EVERY);
        if check_due && let Some(path) = self.config.raw.revocation_file.clone() {
            self.revocation.file_checked_at = Some(now);
            self.read_revocation_file(&path);
        }
        if self.revocation.publish_at.is_some_and(|at| at <= now) {
            self.revocation.publish_at = Some(now + REPUBLISH_EVERY);
            self.publish_revocations();
        }
    }

    fn read_revocation_file(&mut self, path: &Path) {
        let Ok(meta) = std::fs::metadata(path) else {
            // Not written yet: nothing is revoked by it.
            return;
        };
        let seen = (
            meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            meta.len(),
        );
        if self.revocation.file_seen == Some(seen) {
            return;
        }
        self.revocation.file_seen = Some(seen);
        let list = read_bounded(path, MAX_REVOCATIONS_LEN)
            .map_err(|e| e.to_string())
            .and_then(|bytes| Revocations::decode(&bytes).map_err(|e| e.to_string()));
        let adopted = list.and_then(|list| {
            self.adopt_revocations(list, Origin::File)
                .map_err(|e| e.to_string())
        });
        match adopted {
            Ok(true) => {}
            Ok(false) => tracing::info!(
                file = %path.display(),
                "swarm.revocation_file holds a list no newer than the one held; ignored"
            ),
            Err(reason) => tracing::warn!(
                file = %path.display(),
                %reason,
                "swarm.revocation_file is not a valid revocation list for this swarm; \
                 the list held stays in force"
            ),
        }
    }

    fn publish_revocations(&mut self) {
        let Some(bytes) = self.authorizer.revocations().map(Revocations::encode) else {
            return;
        };
        let topic = self.revocation.topic.clone();
        // No subscribed member yet is fine: the next admission publishes again.
        if let Err(e) = self.swarm.behaviour_mut().gossipsub.publish(topic, bytes) {
            tracing::debug!(error = %e, "revocation list not gossiped");
        }
    }
}

/// The bytes of the regular file at `path`, at most `max` of them. Anything else (a FIFO
/// would block the network task; a device or folder is not a list) is refused before it
/// is opened.
fn read_bounded(path: &Path, max: usize) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".to_owned());
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(max as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| e.to_string())?;
    if bytes.len() > max {
        return Err(format!("longer than the largest list ({max} bytes)"));
    }
    Ok(bytes)
}
