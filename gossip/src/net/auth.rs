//! Proving membership: the [`AuthHello`] exchange that opens every connection.
//!
//! The side that dialed sends its hello (its key and its invite) as a control request right
//! after the connection is established; the side that accepted checks it and answers with
//! its own hello, or with a [`Reject`] naming why the invite failed, and only then asks for
//! the dialer's answer to its own hello in turn (the `disclosure` module: the dialer proves
//! first, so a stranger that connects is never sent an invite). A hello is accepted when:
//!
//! 1. it is a well-formed frame holding an [`AuthHello`] within the control limits;
//! 2. its public key is the key the transport authenticated for the connection (noise or
//!    TLS already proved the remote holds that key's secret);
//! 3. its invite decodes and [`Invite::verify`] accepts it for this swarm's authority, this
//!    swarm, that peer and the current time.
//!
//! Until a peer's hello is accepted its tensor streams are dropped unread and its gossip is
//! rejected; a peer that fails, or does not finish within `net.auth_timeout_ms`, is
//! disconnected and counted. An accepted hello is also what lets the peer's heartbeats
//! count when others relay them (the `invites` module): a key that never proved its invite
//! to this node is heard from nobody. This module is the check itself: no I/O, the time is
//! an argument.

use murmur_protocol::frame::{Frame, FrameError, FrameKind, FrameLimits, VERSION};
use murmur_protocol::identity::{
    Invite, InviteDecodeError, InviteError, Keypair, PeerId, PublicKey, RevocationError,
    Revocations, SwarmId,
};
use murmur_protocol::message::{
    AuthHello, MAX_REJECT_TEXT_LEN, Message, MessageError, Reject, RejectCode,
};
use thiserror::Error;

use super::control::ControlFrame;
use super::error::NetError;

/// Why a peer's hello was not accepted.
#[derive(Debug, Error)]
pub(crate) enum AuthFailure {
    /// The bytes were not a frame.
    #[error("hello is not a valid frame: {0}")]
    BadFrame(#[source] FrameError),
    /// The frame did not hold a valid message.
    #[error("hello frame does not decode: {0}")]
    BadMessage(#[source] MessageError),
    /// The frame held some other message.
    #[error("expected an auth hello, got a {} frame", .0.name())]
    NotHello(FrameKind),
    /// The peer refused our hello.
    #[error("the peer refused our invite: {} ({text})", code.name())]
    Refused {
        /// The peer's reason.
        code: RejectCode,
        /// The peer's text, untrusted.
        text: String,
    },
    /// The peers share no protocol version.
    #[error("peer speaks versions {min}..={max}; this build speaks {VERSION}")]
    UnsupportedVersion {
        /// The peer's lowest version.
        min: u8,
        /// The peer's highest version.
        max: u8,
    },
    /// The hello's key is not the key the transport authenticated.
    #[error("hello names key {claimed}, but the connection is from {remote}")]
    KeyMismatch {
        /// The key in the hello.
        claimed: String,
        /// The authenticated peer.
        remote: PeerId,
    },
    /// The invite does not decode.
    #[error("invite does not decode: {0}")]
    BadInvite(#[source] InviteDecodeError),
    /// The invite does not admit the peer.
    #[error("invite rejected: {0}")]
    Invite(#[source] InviteError),
    /// The swarm authority revoked the peer.
    #[error("the swarm authority revoked this peer (revocation list serial {serial})")]
    Revoked {
        /// The serial of the list that names it.
        serial: u64,
    },
}

impl AuthFailure {
    /// The reason code sent back to the peer.
    pub(crate) fn reject_code(&self) -> RejectCode {
        match self {
            AuthFailure::BadFrame(_) => RejectCode::BadFrame,
            AuthFailure::BadMessage(_) | AuthFailure::NotHello(_) => RejectCode::BadMessage,
            AuthFailure::UnsupportedVersion { .. } => RejectCode::UnsupportedVersion,
            AuthFailure::Invite(InviteError::Expired { .. }) => RejectCode::Expired,
            AuthFailure::Invite(InviteError::WrongSwarm { .. }) => RejectCode::WrongSwarm,
            AuthFailure::Refused { code, .. } => *code,
            AuthFailure::KeyMismatch { .. }
            | AuthFailure::BadInvite(_)
            | AuthFailure::Invite(_)
            | AuthFailure::Revoked { .. } => RejectCode::Unauthorized,
        }
    }
}

/// What an accepted hello proved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Admitted {
    /// When the peer's invite runs out (unix seconds); the peer is disconnected then.
    pub(crate) expires_at: u64,
}

/// Checks hellos against this swarm's authority and builds our own.
#[derive(Debug)]
pub(crate) struct Authorizer {
    authority: PublicKey,
    swarm: SwarmId,
    limits: FrameLimits,
    hello: ControlFrame,
    /// The newest revocation list verified, if any.
    revocations: Option<Revocations>,
}

impl Authorizer {
    /// An authorizer for `swarm` under `authority`, presenting `invite` for `keypair`.
    pub(crate) fn new(
        authority: PublicKey,
        swarm: SwarmId,
        limits: FrameLimits,
        keypair: &Keypair,
        invite: &[u8],
    ) -> Result<Authorizer, NetError> {
        let mut nonce = [0u8; 32];
        // The nonce is not secret; without OS randomness we still send a valid hello.
        if getrandom::fill(&mut nonce).is_err() {
            tracing::warn!("no OS randomness for the auth hello nonce; sending zeros");
        }
        let hello = ControlFrame::encode(&Message::AuthHello(AuthHello {
            min_version: VERSION,
            max_version: VERSION,
            public_key: keypair.public().to_bytes(),
            nonce,
            invite,
        }))?;
        Ok(Authorizer {
            authority,
            swarm,
            limits,
            hello,
            revocations: None,
        })
    }

    /// Takes `list` as the swarm's revocation list if it is the authority's, for this
    /// swarm, and newer than the one held. `Ok(false)`: valid, but not newer.
    pub(crate) fn adopt(&mut self, list: Revocations) -> Result<bool, RevocationError> {
        list.verify(&self.authority, &self.swarm)?;
        if self
            .revocations
            .as_ref()
            .is_some_and(|held| held.serial() >= list.serial())
        {
            return Ok(false);
        }
        self.revocations = Some(list);
        Ok(true)
    }

    /// The revocation list held, if any.
    pub(crate) fn revocations(&self) -> Option<&Revocations> {
        self.revocations.as_ref()
    }

    /// The serial of the list that revokes `peer`, if one does.
    pub(crate) fn revoked(&self, peer: &PeerId) -> Option<u64> {
        self.revocations
            .as_ref()
            .filter(|list| list.is_revoked(peer))
            .map(Revocations::serial)
    }

    /// Our hello, sent as the first control request on every connection and as the answer
    /// to the peer's.
    pub(crate) fn hello(&self) -> ControlFrame {
        self.hello.clone()
    }

    /// Checks a hello (or a refusal) that `remote` sent, at `now_unix_s`.
    pub(crate) fn verify(
        &self,
        remote: &PeerId,
        frame: &[u8],
        now_unix_s: u64,
    ) -> Result<Admitted, AuthFailure> {
        let (frame, _) = Frame::parse(frame, &self.limits).map_err(AuthFailure::BadFrame)?;
        let hello = match Message::from_frame(&frame).map_err(AuthFailure::BadMessage)? {
            Message::AuthHello(hello) => hello,
            Message::Reject(reject) => {
                return Err(AuthFailure::Refused {
                    code: reject.code,
                    text: reject.text.to_owned(),
                });
            }
            other => return Err(AuthFailure::NotHello(other.kind())),
        };
        if hello.min_version > VERSION || hello.max_version < VERSION {
            return Err(AuthFailure::UnsupportedVersion {
                min: hello.min_version,
                max: hello.max_version,
            });
        }
        if hello.public_key != remote.public_key().to_bytes() {
            let claimed = PublicKey::from_bytes(&hello.public_key)
                .map(|key| key.peer_id().to_string())
                .unwrap_or_else(|_| "<not an ed25519 key>".to_owned());
            return Err(AuthFailure::KeyMismatch {
                claimed,
                remote: *remote,
            });
        }
        let invite = Invite::decode(hello.invite).map_err(AuthFailure::BadInvite)?;
        invite
            .verify(&self.authority, &self.swarm, remote, now_unix_s)
            .map_err(AuthFailure::Invite)?;
        if let Some(serial) = self.revoked(remote) {
            return Err(AuthFailure::Revoked { serial });
        }
        Ok(Admitted {
            expires_at: invite.expires_at(),
        })
    }
}

/// A refusal frame with `code` and `text` (cut to the wire limit).
pub(crate) fn reject_frame(code: RejectCode, text: &str) -> Option<ControlFrame> {
    let text = truncate_utf8(text, MAX_REJECT_TEXT_LEN);
    ControlFrame::encode(&Message::Reject(Reject { code, text })).ok()
}

/// The longest prefix of `text` that fits in `max` bytes and ends on a char boundary.
pub(crate) fn truncate_utf8(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000;

    fn setup(invite_swarm: &str, expires_at: u64) -> (Authorizer, Authorizer, PeerId) {
        let authority = Keypair::from_seed([1; 32]);
        let swarm = SwarmId::new("test-swarm").unwrap_or_else(|e| panic!("{e}"));
        let peer = Keypair::from_seed([2; 32]);
        let invite_swarm = SwarmId::new(invite_swarm).unwrap_or_else(|e| panic!("{e}"));
        let invite = Invite::issue(
            &authority,
            &peer.peer_id(),
            &invite_swarm,
            NOW - 10,
            expires_at,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let limits = FrameLimits::new(4096).unwrap_or_else(|e| panic!("{e}"));
        let sender = Authorizer::new(
            authority.public(),
            swarm.clone(),
            limits,
            &peer,
            &invite.encode(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let receiver = Authorizer::new(
            authority.public(),
            swarm,
            limits,
            &authority,
            &invite.encode(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        (sender, receiver, peer.peer_id())
    }

    #[test]
    fn a_valid_hello_is_admitted_until_its_invite_expires() {
        let (sender, receiver, peer) = setup("test-swarm", NOW + 100);
        let admitted = receiver.verify(&peer, sender.hello().as_bytes(), NOW);
        assert_eq!(
            admitted.ok(),
            Some(Admitted {
                expires_at: NOW + 100
            })
        );
    }

    #[test]
    fn expired_wrong_swarm_and_wrong_peer_hellos_are_refused_with_their_code() {
        let (sender, receiver, peer) = setup("test-swarm", NOW + 100);
        let expired = receiver.verify(&peer, sender.hello().as_bytes(), NOW + 100);
        assert!(matches!(
            expired.map_err(|e| e.reject_code()),
            Err(RejectCode::Expired)
        ));

        let (sender, receiver, peer) = setup("other-swarm", NOW + 100);
        let wrong = receiver.verify(&peer, sender.hello().as_bytes(), NOW);
        assert!(matches!(
            wrong.map_err(|e| e.reject_code()),
            Err(RejectCode::WrongSwarm)
        ));

        let (sender, receiver, _) = setup("test-swarm", NOW + 100);
        let impostor = Keypair::from_seed([9; 32]).peer_id();
        let stolen = receiver.verify(&impostor, sender.hello().as_bytes(), NOW);
        assert!(matches!(stolen, Err(AuthFailure::KeyMismatch { .. })));
    }

    #[test]
    fn a_revoked_peer_is_refused_and_only_newer_lists_replace_older_ones() {
        let (sender, mut receiver, peer) = setup("test-swarm", NOW + 100);
        let authority = Keypair::from_seed([1; 32]);
        let swarm = SwarmId::new("test-swarm").unwrap_or_else(|e| panic!("{e}"));
        let list = |serial, peers: Vec<PeerId>| {
            Revocations::issue(&authority, &swarm, serial, peers).unwrap_or_else(|e| panic!("{e}"))
        };
        assert_eq!(receiver.adopt(list(5, vec![peer])), Ok(true));
        assert!(matches!(
            receiver.verify(&peer, sender.hello().as_bytes(), NOW),
            Err(AuthFailure::Revoked { serial: 5 })
        ));
        // An older list (a replay, or one that lifted the revocation before) changes nothing.
        assert_eq!(receiver.adopt(list(4, vec![])), Ok(false));
        assert_eq!(receiver.revoked(&peer), Some(5));
        // A newer one that leaves the peer out lifts the revocation.
        assert_eq!(receiver.adopt(list(6, vec![])), Ok(true));
        assert!(
            receiver
                .verify(&peer, sender.hello().as_bytes(), NOW)
                .is_ok()
        );
        // Another key's list is refused.
        let forged = Revocations::issue(&Keypair::from_seed([9; 32]), &swarm, 7, vec![peer])
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            receiver.adopt(forged),
            Err(RevocationError::WrongAuthority { .. })
        ));
        assert_eq!(receiver.revoked(&peer), None);
    }

    #[test]
    fn garbage_and_refusals_are_not_hellos() {
        let (_, receiver, peer) = setup("test-swarm", NOW + 100);
        assert!(matches!(
            receiver.verify(&peer, b"not a frame at all", NOW),
            Err(AuthFailure::BadFrame(_))
        ));
        let refusal = reject_frame(RejectCode::Expired, "old").map(|f| f.as_bytes().to_vec());
        let refusal = refusal.unwrap_or_default();
        assert!(matches!(
            receiver.verify(&peer, &refusal, NOW),
            Err(AuthFailure::Refused {
                code: RejectCode::Expired,
                ..
            })
        ));
    }

    #[test]
    fn reject_text_is_cut_on_a_char_boundary() {
        let text = "é".repeat(200);
        let cut = truncate_utf8(&text, MAX_REJECT_TEXT_LEN);
        assert!(cut.len() <= MAX_REJECT_TEXT_LEN);
        assert!(cut.len() >= MAX_REJECT_TEXT_LEN - 1);
    }
}
