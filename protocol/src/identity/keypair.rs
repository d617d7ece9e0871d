//! ed25519 keys and signatures: the secret [`Keypair`] a peer signs with, the [`PublicKey`]
//! others verify with, and the [`Signature`] between them.
//!
//! Verification is always strict (`verify_strict`): it rejects small-order public keys and
//! small-order `R` components as well as non-canonical scalars, so a signature cannot be
//! malleated into a second valid one and a weak key cannot vouch for arbitrary messages.

use std::fmt;

use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use thiserror::Error;

use super::peer_id::PeerId;

/// Length of an ed25519 secret seed in bytes.
pub const SECRET_SEED_LEN: usize = 32;
/// Length of an ed25519 public key in bytes.
pub const PUBLIC_KEY_LEN: usize = 32;
/// Length of an ed25519 signature in bytes.
pub const SIGNATURE_LEN: usize = 64;

/// A peer's ed25519 signing key.
///
/// The secret is wiped from memory when the keypair is dropped. `Keypair` is deliberately
/// not `Clone`: share it behind an `Arc` so only one copy of the secret exists. Its `Debug`
/// output shows the peer id and never the secret.
pub struct Keypair {
    signing: SigningKey,
}

/// The operating system's random number generator failed, so no key could be generated.
#[derive(Debug, Error)]
#[error(
    "cannot generate a key: the operating system's random number generator failed ({0}); \
     check that /dev/urandom or getrandom(2) is available to this process"
)]
pub struct EntropyError(#[source] getrandom::Error);

impl Keypair {
    /// Generates a fresh keypair from the operating system's random number generator.
    pub fn generate() -> Result<Keypair, EntropyError> {
        let mut seed = [0u8; SECRET_SEED_LEN];
        getrandom::fill(&mut seed).map_err(EntropyError)?;
        let keypair = Keypair::from_seed(seed);
        wipe(&mut seed);
        Ok(keypair)
    }

    /// Builds the keypair whose RFC 8032 secret seed is `seed`.
    ///
    /// The same seed gives the same key as libp2p's `Keypair::ed25519_from_bytes`.
    pub fn from_seed(mut seed: [u8; SECRET_SEED_LEN]) -> Keypair {
        let signing = SigningKey::from_bytes(&seed);
        wipe(&mut seed);
        Keypair { signing }
    }

    /// The public half of this keypair.
    pub fn public(&self) -> PublicKey {
        PublicKey(self.signing.verifying_key())
    }

    /// The peer id this keypair signs as.
    pub fn peer_id(&self) -> PeerId {
        self.public().peer_id()
    }

    /// Signs `message` (deterministic RFC 8032 ed25519).
    pub fn sign(&self, message: &[u8]) -> Signature {
        Signature(self.signing.sign(message))
    }

    /// The secret seed. It is the whole secret: pass it only to code that builds the same
    /// identity elsewhere (the libp2p keypair of the network layer, the key file).
    pub fn secret_seed(&self) -> &[u8; SECRET_SEED_LEN] {
        self.signing.as_bytes()
    }
}

impl fmt::Debug for Keypair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keypair")
            .field("peer_id", &self.peer_id())
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// An ed25519 public key, known to be a valid curve point.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(VerifyingKey);

/// Bytes that do not encode an ed25519 public key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("bytes are not an ed25519 public key: they do not decode to a curve point")]
pub struct InvalidPublicKey;

/// A signature that does not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("ed25519 signature does not verify: the message was altered, or was signed by another key")]
pub struct VerifyError;

impl PublicKey {
    /// Parses a compressed ed25519 public key.
    pub fn from_bytes(bytes: &[u8; PUBLIC_KEY_LEN]) -> Result<PublicKey, InvalidPublicKey> {
        VerifyingKey::from_bytes(bytes)
            .map(PublicKey)
            .map_err(|_| InvalidPublicKey)
    }

    /// The compressed key.
    pub fn to_bytes(&self) -> [u8; PUBLIC_KEY_LEN] {
        self.0.to_bytes()
    }

    /// The compressed key, borrowed.
    pub fn as_bytes(&self) -> &[u8; PUBLIC_KEY_LEN] {
        self.0.as_bytes()
    }

    /// The libp2p-compatible peer id of this key.
    pub fn peer_id(&self) -> PeerId {
        PeerId::from_public_key(self)
    }

    /// Checks that `signature` was made over `message` by this key's secret.
    ///
    /// Strict: small-order keys and non-canonical signatures are rejected.
    pub fn verify(&self, message: &[u8], signature: &Signature) -> Result<(), VerifyError> {
        self.0
            .verify_strict(message, &signature.0)
            .map_err(|_| VerifyError)
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.peer_id())
    }
}

/// An ed25519 signature.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Signature(ed25519_dalek::Signature);

impl Signature {
    /// The signature from its 64 bytes (`R || s`). Whether they are canonical is checked when
    /// the signature is verified.
    pub fn from_bytes(bytes: &[u8; SIGNATURE_LEN]) -> Signature {
        Signature(ed25519_dalek::Signature::from_bytes(bytes))
    }

    /// The 64 bytes of the signature (`R || s`).
    pub fn to_bytes(&self) -> [u8; SIGNATURE_LEN] {
        self.0.to_bytes()
    }
}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Signature(")?;
        for byte in self.to_bytes() {
            write!(f, "{byte:02x}")?;
        }
        f.write_str(")")
    }
}

/// Overwrites a buffer that held secret material.
///
/// Best effort: `black_box` keeps the compiler from proving the zeroing dead and removing it.
/// The signing key itself is wiped by ed25519-dalek's own `Drop`.
pub(super) fn wipe(secret: &mut [u8]) {
    secret.fill(0);
    std::hint::black_box(secret);
}
