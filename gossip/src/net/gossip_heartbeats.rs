//! Which gossip messages count as heartbeats: judged by who forwarded them, who signed
//! them, and when they were written ([`HeartbeatFreshness`](super::heartbeat_freshness)).

use std::time::{Duration, Instant};

use libp2p::gossipsub;
use murmur_protocol::identity::{PayloadType, PeerId, SignedEnvelope};
use murmur_protocol::message::HeartbeatBody;
use thiserror::Error;

use super::NetEvent;
use super::actor::NetActor;
use super::handle::unix_now;
use super::heartbeat_freshness::Staleness;
use super::identity::to_libp2p;
use super::invites::SignerRefusal;

/// At most one warning per this long about refused gossip; the rest go to debug.
const REFUSAL_WARN_EVERY: Duration = Duration::from_secs(30);

impl NetActor {
    /// Judges a gossip message and tells gossipsub whether to relay it. A heartbeat is
    /// accepted, relayed and reported as [`NetEvent::Heartbeat`] only if it passes
    /// [`check_heartbeat`](Self::check_heartbeat); anything else is counted and logged
    /// (at warn at most once per [`REFUSAL_WARN_EVERY`], at debug in between, so a flood
    /// does not flood the log).
    pub(crate) fn on_gossip(
        &mut self,
        source: libp2p::PeerId,
        message_id: gossipsub::MessageId,
        message: gossipsub::Message,
    ) {
        if message.topic == self.revocation.topic {
            let acceptance = self.on_revocation_gossip(&source, &message);
            self.swarm
                .behaviour_mut()
                .gossipsub
                .report_message_validation_result(&message_id, &source, acceptance);
            return;
        }
        let verdict = self.check_heartbeat(&source, &message);
        let acceptance = match verdict {
            Ok((peer, body)) => {
                self.freshness.accepted(peer, body.timestamp_ms);
                self.ctx.metrics.heartbeat_received();
                let _ = self.events.send(NetEvent::Heartbeat { peer, body });
                gossipsub::MessageAcceptance::Accept
            }
            Err(refusal) => {
                self.ctx.metrics.gossip_rejected();
                match refusal {
                    GossipRefusal::UninvitedSigner { .. } => {
                        self.ctx.metrics.heartbeat_refused_uninvited_signer();
                    }
                    GossipRefusal::Stale {
                        why: Staleness::OutOfWindow { .. },
                        ..
                    } => self.ctx.metrics.heartbeat_refused_stale(),
                    GossipRefusal::Stale {
                        why: Staleness::Replayed { .. },
                        ..
                    } => self.ctx.metrics.heartbeat_refused_replayed(),
                    GossipRefusal::Revoked { .. } => self.ctx.metrics.heartbeat_refused_revoked(),
                    GossipRefusal::UnauthorizedForwarder | GossipRefusal::Invalid(_) => {}
                }
                self.log_gossip_refusal(&source, &refusal);
                refusal.acceptance()
            }
        };
        self.swarm
            .behaviour_mut()
            .gossipsub
            .report_message_validation_result(&message_id, &source, acceptance);
    }

    /// A heartbeat counts when, in this order:
    ///
    /// 1. the peer that forwarded it (gossipsub's propagation source) is admitted;
    /// 2. it is on the heartbeat topic, its envelope verifies, and its signer is the author
    ///    gossipsub names (whose signature gossipsub's strict mode checked);
    /// 3. its signer is not this node, is not revoked by the swarm's revocation list, and
    ///    holds an invite this node verified in an auth
    ///    hello and that has not run out
    ///    ([`VerifiedInvites`](super::invites::VerifiedInvites)), whoever forwarded it: a
    ///    member may relay, but cannot vouch for a key it invents;
    /// 4. its body decodes;
    /// 5. it is fresh: written within `net.max_heartbeat_age_ms` of now, and after the last
    ///    heartbeat accepted from its signer
    ///    ([`HeartbeatFreshness`](super::heartbeat_freshness::HeartbeatFreshness)).
    ///
    /// A signer still connected and admitted counts by its connection state, so the record
    /// of verified invites evicting it at capacity does not silence it.
    fn check_heartbeat(
        &self,
        source: &libp2p::PeerId,
        message: &gossipsub::Message,
    ) -> Result<(PeerId, HeartbeatBody), GossipRefusal> {
        let forwarder_admitted = self
            .peers
            .get(source)
            .is_some_and(|s| s.admitted.is_some() && s.refused_at.is_none());
        if !forwarder_admitted {
            return Err(GossipRefusal::UnauthorizedForwarder);
        }
        if message.topic != self.topic {
            return Err(GossipRefusal::Invalid(format!(
                "unexpected topic {}",
                message.topic
            )));
        }
        let envelope = SignedEnvelope::decode(&message.data)
            .map_err(|e| GossipRefusal::Invalid(e.to_string()))?;
        let (signer, payload) = envelope
            .open(PayloadType::HEARTBEAT)
            .map_err(|e| GossipRefusal::Invalid(e.to_string()))?;
        let signer_libp2p = to_libp2p(&signer);
        if message.source != Some(signer_libp2p) {
            return Err(GossipRefusal::Invalid(format!(
                "heartbeat signed by {signer} but published by {:?}",
                message.source
            )));
        }
        if signer_libp2p == *self.swarm.local_peer_id() {
            return Err(GossipRefusal::Invalid(
                "heartbeat signed with this node's own key".to_owned(),
            ));
        }
        if let Some(serial) = self.authorizer.revoked(&signer) {
            return Err(GossipRefusal::Revoked { signer, serial });
        }
        let now = unix_now();
        let connected_and_admitted = self.peers.get(&signer_libp2p).is_some_and(|s| {
            s.refused_at.is_none() && s.admitted.is_some_and(|a| a.expires_at > now)
        });
        if !connected_and_admitted {
            self.invites
                .check(&signer, now)
                .map_err(|why| GossipRefusal::UninvitedSigner { signer, why })?;
        }
        let body =
            HeartbeatBody::decode(payload).map_err(|e| GossipRefusal::Invalid(e.to_string()))?;
        self.freshness
            .check(&signer, body.timestamp_ms, wall_ms())
            .map_err(|why| GossipRefusal::Stale { signer, why })?;
        Ok((signer, body))
    }

    /// Logs a refused gossip message: at warn the first time and then at most once per
    /// [`REFUSAL_WARN_EVERY`] (with how many went by at debug meanwhile), at debug otherwise.
    fn log_gossip_refusal(&mut self, source: &libp2p::PeerId, refusal: &GossipRefusal) {
        let now = Instant::now();
        let due = self
            .gossip_refusals_warned_at
            .is_none_or(|at| now.duration_since(at) >= REFUSAL_WARN_EVERY);
        if due {
            let since = std::mem::take(&mut self.gossip_refusals_unwarned);
            self.gossip_refusals_warned_at = Some(now);
            tracing::warn!(
                %source,
                reason = %refusal,
                logged_at_debug_since = since,
                "gossip message rejected"
            );
        } else {
            self.gossip_refusals_unwarned += 1;
            tracing::debug!(%source, reason = %refusal, "gossip message rejected");
        }
    }
}

/// Why a gossip message was not taken as a heartbeat.
#[derive(Debug, Error)]
pub(crate) enum GossipRefusal {
    /// The peer that forwarded it has not proved its invite to this node.
    #[error("forwarded by a peer that is not authorized")]
    UnauthorizedForwarder,
    /// Not on the heartbeat topic, or not a well-formed heartbeat signed by its author.
    #[error("{0}")]
    Invalid(String),
    /// Well formed and signed, but its signer holds no invite this node verified and that
    /// is still valid ([`VerifiedInvites`](super::invites::VerifiedInvites)).
    #[error("heartbeat signed by {signer}: {why}")]
    UninvitedSigner {
        /// The key that signed it.
        signer: PeerId,
        /// What the record of verified invites said.
        why: SignerRefusal,
    },
    /// Signed by a peer the swarm's revocation list names.
    #[error("heartbeat signed by {signer}, revoked by the swarm authority (list serial {serial})")]
    Revoked {
        /// The key that signed it.
        signer: PeerId,
        /// The serial of the list that names it.
        serial: u64,
    },
    /// Well formed, signed and invited, but stale or replayed.
    #[error("heartbeat signed by {signer}: {why}")]
    Stale {
        /// The key that signed it.
        signer: PeerId,
        /// How it was not fresh.
        why: Staleness,
    },
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl GossipRefusal {
    /// What gossipsub is told. A message that is invalid, or forwarded by a peer that is not
    /// authorized, is rejected: the forwarder sent something no honest member sends. A
    /// heartbeat of a signer this node has not verified is ignored: it is not relayed from
    /// here either, but the forwarder may have verified an invite this node never saw. A
    /// stale heartbeat is ignored too: an honest forwarder may have relayed it in time.
    fn acceptance(&self) -> gossipsub::MessageAcceptance {
        match self {
            GossipRefusal::UninvitedSigner { .. }
            | GossipRefusal::Revoked { .. }
            | GossipRefusal::Stale { .. } => gossipsub::MessageAcceptance::Ignore,
            GossipRefusal::UnauthorizedForwarder | GossipRefusal::Invalid(_) => {
                gossipsub::MessageAcceptance::Reject
            }
        }
    }
}
