//! Invites: round trip, and one specific error per way an invite can be wrong.

use murmur_protocol::identity::{
    INVITE_CLOCK_SKEW_S, Invite, InviteDecodeError, InviteError, Keypair, MAX_INVITE_LEN, PeerId,
    SwarmId, SwarmIdError,
};
use proptest::prelude::*;

use super::{keypair, swarm};

struct InviteCase {
    authority: Keypair,
    peer: PeerId,
    swarm: SwarmId,
    invite: Invite,
}

const ISSUED: u64 = 1_700_000_000;
const EXPIRES: u64 = ISSUED + 86_400;

fn invite_case() -> InviteCase {
    let authority = keypair(1);
    let peer = keypair(2).peer_id();
    let swarm = swarm("gpt2-small.run-3");
    let invite = Invite::issue(&authority, &peer, &swarm, ISSUED, EXPIRES).expect("valid window");
    InviteCase {
        authority,
        peer,
        swarm,
        invite,
    }
}

impl InviteCase {
    fn verify(&self, invite: &Invite, now: u64) -> Result<(), InviteError> {
        invite.verify(&self.authority.public(), &self.swarm, &self.peer, now)
    }
}

#[test]
fn invite_round_trips_and_verifies() {
    let case = invite_case();
    let bytes = case.invite.encode();
    assert_eq!(bytes.len(), case.invite.encoded_len());
    assert!(bytes.len() <= MAX_INVITE_LEN);
    let decoded = Invite::decode(&bytes).expect("decode");
    assert_eq!(decoded, case.invite);
    assert_eq!(decoded.peer(), &case.peer);
    assert_eq!(decoded.swarm(), &case.swarm);
    assert_eq!(
        (decoded.issued_at(), decoded.expires_at()),
        (ISSUED, EXPIRES)
    );
    assert_eq!(decoded.authority(), &case.authority.public());
    assert_eq!(case.verify(&decoded, ISSUED + 10), Ok(()));
    assert_eq!(case.verify(&decoded, EXPIRES - 1), Ok(()));

    let mut small = vec![0u8; bytes.len() - 1];
    assert!(case.invite.encode_into(&mut small).is_err());
    let mut exact = vec![0u8; bytes.len()];
    assert_eq!(case.invite.encode_into(&mut exact), Ok(bytes.len()));
    assert_eq!(exact, bytes);
}

#[test]
fn invite_for_another_swarm_is_wrong_swarm() {
    let case = invite_case();
    let other = swarm("llama-7b.run-1");
    assert_eq!(
        case.invite
            .verify(&case.authority.public(), &other, &case.peer, ISSUED + 10),
        Err(InviteError::WrongSwarm {
            expected: other,
            found: case.swarm.clone()
        })
    );
}

#[test]
fn expired_invite_is_expired() {
    let case = invite_case();
    for now in [EXPIRES, EXPIRES + 1, u64::MAX] {
        assert_eq!(
            case.verify(&case.invite, now),
            Err(InviteError::Expired {
                expired_at: EXPIRES,
                now
            })
        );
    }
}

#[test]
fn invite_from_the_future_is_not_yet_valid_beyond_the_skew() {
    let case = invite_case();
    assert_eq!(
        case.verify(&case.invite, ISSUED - INVITE_CLOCK_SKEW_S),
        Ok(())
    );
    let now = ISSUED - INVITE_CLOCK_SKEW_S - 1;
    assert_eq!(
        case.verify(&case.invite, now),
        Err(InviteError::NotYetValid {
            valid_from: ISSUED,
            now
        })
    );
}

#[test]
fn invite_with_tampered_signature_is_bad_signature() {
    let case = invite_case();
    let mut bytes = case.invite.encode();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01; // the top byte of `s`: still decodes, no longer verifies
    let tampered = Invite::decode(&bytes).expect("a flipped signature bit still decodes");
    assert_eq!(
        case.verify(&tampered, ISSUED + 10),
        Err(InviteError::BadSignature)
    );
    bytes[last - 40] ^= 0x80; // inside `R`
    let tampered = Invite::decode(&bytes).expect("decodes");
    assert_eq!(
        case.verify(&tampered, ISSUED + 10),
        Err(InviteError::BadSignature)
    );
}

#[test]
fn invite_with_a_field_changed_after_signing_is_bad_signature() {
    let case = invite_case();
    let bytes = case.invite.encode();
    // Layout: tag 17, peer 32, swarm length 1, swarm n, issued 8, expires 8, authority, sig.
    let expires_at = 17 + 32 + 1 + case.swarm.as_bytes().len() + 8;
    let mut extended = bytes.clone();
    extended[expires_at..expires_at + 8].copy_from_slice(&(EXPIRES * 2).to_le_bytes());
    let extended = Invite::decode(&extended).expect("decodes");
    assert_eq!(extended.expires_at(), EXPIRES * 2);
    assert_eq!(
        case.verify(&extended, EXPIRES + 10),
        Err(InviteError::BadSignature)
    );

    // Another peer put its own key in place of the invited one.
    let thief = keypair(7).peer_id();
    let mut stolen = bytes;
    stolen[17..49].copy_from_slice(&keypair(7).public().to_bytes());
    let stolen = Invite::decode(&stolen).expect("decodes");
    assert_eq!(
        stolen.verify(&case.authority.public(), &case.swarm, &thief, ISSUED + 10),
        Err(InviteError::BadSignature)
    );
}

#[test]
fn invite_from_another_authority_is_wrong_authority() {
    let case = invite_case();
    let impostor = keypair(8);
    let forged = Invite::issue(&impostor, &case.peer, &case.swarm, ISSUED, EXPIRES).expect("ok");
    assert_eq!(
        case.verify(&forged, ISSUED + 10),
        Err(InviteError::WrongAuthority {
            expected: case.authority.peer_id(),
            found: impostor.peer_id(),
        })
    );
}

#[test]
fn invite_presented_by_another_peer_is_wrong_peer() {
    let case = invite_case();
    let other = keypair(9).peer_id();
    assert_eq!(
        case.invite
            .verify(&case.authority.public(), &case.swarm, &other, ISSUED + 10),
        Err(InviteError::WrongPeer {
            expected: other,
            found: case.peer
        })
    );
}

#[test]
fn invite_with_empty_window_cannot_be_issued() {
    let case = invite_case();
    assert_eq!(
        Invite::issue(&case.authority, &case.peer, &case.swarm, ISSUED, ISSUED),
        Err(InviteError::EmptyValidity {
            issued_at: ISSUED,
            expires_at: ISSUED
        })
    );
}

#[test]
fn malformed_invites_give_specific_decode_errors() {
    let case = invite_case();
    let bytes = case.invite.encode();

    for len in 0..bytes.len() {
        assert!(
            matches!(
                Invite::decode(&bytes[..len]),
                Err(InviteDecodeError::Truncated(_))
            ),
            "prefix of {len} bytes"
        );
    }
    let mut trailing = bytes.clone();
    trailing.extend_from_slice(&[0, 0, 0]);
    assert_eq!(
        Invite::decode(&trailing),
        Err(InviteDecodeError::TrailingBytes { count: 3 })
    );

    let mut wrong_tag = bytes.clone();
    wrong_tag[15] = b'2'; // murmur/invite/v2
    assert_eq!(
        Invite::decode(&wrong_tag),
        Err(InviteDecodeError::UnknownFormat)
    );

    let swarm_len_at = 17 + 32;
    let mut empty_swarm = bytes.clone();
    empty_swarm[swarm_len_at] = 0;
    assert_eq!(
        Invite::decode(&empty_swarm),
        Err(InviteDecodeError::InvalidSwarmId(SwarmIdError::Empty))
    );
    let mut long_swarm = bytes.clone();
    long_swarm[swarm_len_at] = 65;
    assert_eq!(
        Invite::decode(&long_swarm),
        Err(InviteDecodeError::InvalidSwarmId(SwarmIdError::TooLong {
            len: 65,
            max: 64
        }))
    );
    let mut bad_char = bytes;
    bad_char[swarm_len_at + 1] = b'G';
    assert_eq!(
        Invite::decode(&bad_char),
        Err(InviteDecodeError::InvalidSwarmId(
            SwarmIdError::InvalidCharacter {
                ch: 'G',
                position: 0
            }
        ))
    );
}

proptest! {
    /// Changing any byte of a valid invite makes it fail to decode or to verify.
    #[test]
    fn any_altered_invite_byte_is_refused(index in any::<prop::sample::Index>(), flip in 1u8..) {
        let case = invite_case();
        let mut bytes = case.invite.encode();
        let at = index.index(bytes.len());
        bytes[at] ^= flip;
        if let Ok(altered) = Invite::decode(&bytes) {
            prop_assert!(case.verify(&altered, ISSUED + 10).is_err());
        }
    }
}
