//! The parameters lent for a local step, and what arrives meanwhile.
//!
//! A step runs at `z = x / w`. Rather than a copy of `z` beside the numerator, the numerator
//! itself is turned into `z` and lent to the trainer ([`SgpPeer::lend_parameters`]), and
//! comes back as the step left it, `x = w·z'` ([`SgpPeer::return_parameters`]): the peer
//! holds its parameters once through the step's passes, where its memory peaks.
//!
//! Nothing may change the mass meanwhile, yet a step can take longer than a share may wait
//! for its receipt. So a share that arrives is checked as [`SgpPeer::handle`] would check
//! it, acknowledged at once, and kept, to be absorbed when the parameters come back; what
//! would take mass back (a returned, refused or cancelled share) and what would drop an
//! edge's reference (a peer gone) waits too, with the membership news that must come after
//! it (a peer back), all of it replayed in the order it came. A
//! receipt for a share kept this way is a promise: were the process to die before the step
//! ends, the share's mass is lost with it, as a share absorbed just before a crash is.

use murmur_protocol::message::ShareOutcome;

use super::{Absorbed, SgpInput, SgpOutput, SgpPeer};
use crate::sgp::error::SgpError;
use crate::sgp::share::{FRESH_REFERENCE, ShareHeader};
use crate::{PeerKey, Time};

/// Quantized shares from one sender kept at most while the parameters are lent: a sender
/// sends the next share on an edge only once this peer acknowledged the last, so a second
/// arrives only while this peer's step takes longer than the sender's, a third while it
/// takes twice as long. The one past the bound is refused (its sender takes it back and
/// starts the edge again), so that a straggler does not hold a share a sender step.
const KEPT_PER_SENDER: usize = 2;

/// What became of a kept input whose outcome the caller reports (as it reports those it
/// handles at once): a share taken back or lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed<P> {
    /// A share `P` cancelled at this peer's request, taken back.
    Cancelled(P),
    /// A share `P` refused, taken back.
    TakenBack(P),
    /// A share to or from `P` whose mass could not be taken back or absorbed: lost.
    Lost(P),
}

/// An input that waits for the parameters to come back.
#[derive(Debug)]
pub(super) enum Deferred<P> {
    /// A share accepted and acknowledged, to absorb.
    Share {
        from: P,
        header: ShareHeader,
        payload: Vec<u8>,
    },
    /// A share the transport gave back.
    Returned {
        to: P,
        header: ShareHeader,
        payload: Vec<u8>,
        receiver_gone: bool,
    },
    /// A share its receiver refused.
    Refused { by: P, step: u64 },
    /// A share its receiver cancelled at this peer's request.
    Cancelled { from: P, step: u64 },
    /// A peer seen (again): kept too, so that it comes after a leave or crash kept before it.
    Joined(P),
    /// A peer that left.
    Left(P),
    /// A peer declared crashed.
    Crashed(P),
    /// This peer's own leave.
    Leave,
}

impl<P: PeerKey> SgpPeer<P> {
    /// Lends the parameters, as `z = x / w`, for the step [`SgpOutput::StartStep`] allowed;
    /// until [`SgpPeer::return_parameters`] the peer keeps what would change its mass: a
    /// share that arrives is checked, acknowledged at once and absorbed when they return.
    pub fn lend_parameters(&mut self) -> Result<Vec<f32>, SgpError> {
        if !self.computing {
            return Err(SgpError::NoStepInProgress);
        }
        self.state.lend_debiased()
    }

    /// The push-sum weight this peer holds: its state's, plus that of the shares it accepted
    /// while its parameters were lent, which it absorbs when they come back. The swarm's
    /// weights, so counted, sum to what its founders brought, less what crashes lost.
    pub fn held_weight(&self) -> f64 {
        let kept: f64 = self
            .deferred
            .iter()
            .map(|deferred| match deferred {
                Deferred::Share { header, .. } => header.weight,
                _ => 0.0,
            })
            .sum();
        self.state.weight() + kept
    }

    /// Whether the parameters are lent for a step.
    pub fn parameters_lent(&self) -> bool {
        self.state.is_lent()
    }

    /// Takes the lent parameters back as the step left them (`z'`, so `x = w·z'`), then
    /// absorbs and acts on what arrived meanwhile, in order; says what became of the kept
    /// shares whose fate is reported. Feed [`SgpInput::LocalStepDone`] after it.
    pub fn return_parameters(
        &mut self,
        now: Time,
        z: Vec<f32>,
    ) -> Result<Vec<Replayed<P>>, SgpError> {
        if !self.state.is_lent() {
            return Err(SgpError::Lent);
        }
        self.state.restore_debiased(z)?;
        let mut replayed = Vec::new();
        for deferred in std::mem::take(&mut self.deferred) {
            replayed.extend(self.replay(now, deferred));
        }
        Ok(replayed)
    }

    /// Accepts a share that arrived while the parameters are lent: checked as
    /// [`SgpPeer::handle`] checks one, acknowledged, and kept with its `payload` until they
    /// come back. On error the share is refused (nothing changes) and the payload comes
    /// back with the error.
    pub fn accept_while_lent(
        &mut self,
        from: P,
        header: ShareHeader,
        payload: Vec<u8>,
    ) -> Result<(), (SgpError, Vec<u8>)> {
        if !self.state.is_lent() {
            return Err((SgpError::Lent, payload));
        }
        if self.receipts.is_cancelled(from, header.step) {
            return Err((SgpError::Cancelled { step: header.step }, payload));
        }
        let mut kept = 0;
        let mut after = None;
        for deferred in &self.deferred {
            if let Deferred::Share {
                from: sender,
                header: earlier,
                ..
            } = deferred
                && *sender == from
            {
                kept += 1;
                after = Some(earlier.step);
            }
        }
        let checked = match &mut self.edges {
            Some(edges) => match header.reference {
                Some(version) if kept >= KEPT_PER_SENDER && version != FRESH_REFERENCE => {
                    Err(SgpError::StaleReference { version })
                }
                _ => edges.check_share(&self.state, from, header, &payload, after),
            },
            None => match header.reference {
                None if header.codec == murmur_protocol::codec::CodecSpec::F32 => {
                    self.state.check_f32(header.weight, &payload)
                }
                _ => Err(SgpError::UnexpectedCodec {
                    expected: murmur_protocol::codec::CodecSpec::F32,
                    got: header.codec,
                }),
            },
        };
        if let Err(error) = checked {
            self.stats.shares_rejected += 1;
            return Err((error, payload));
        }
        self.receipts.applied(from, header.step);
        // Counted as received once acknowledged, as a share folded in at once is.
        self.stats.shares_received += 1;
        self.outputs.push_back(SgpOutput::Receipt {
            to: from,
            step: header.step,
            outcome: ShareOutcome::Applied,
        });
        self.deferred.push_back(Deferred::Share {
            from,
            header,
            payload,
        });
        Ok(())
    }

    /// While the parameters are lent: takes `input` if it would change the mass or drop a
    /// reference (kept, or a share accepted), and says so; `false` for an input handled as
    /// usual.
    pub(super) fn taken_while_lent(&mut self, input: &SgpInput<'_, P>) -> Result<bool, SgpError> {
        let deferred = match *input {
            SgpInput::LocalStepDone => return Err(SgpError::Lent),
            SgpInput::ShareReceived {
                from,
                header,
                payload,
            } => {
                self.accept_while_lent(from, header, payload.to_vec())
                    .map_err(|(error, _)| error)?;
                return Ok(true);
            }
            SgpInput::ShareReturned {
                to,
                header,
                payload,
                receiver_gone,
            } => Deferred::Returned {
                to,
                header,
                payload: payload.to_vec(),
                receiver_gone,
            },
            SgpInput::ShareRefused { by, step } => Deferred::Refused { by, step },
            SgpInput::ReceiptReceived {
                from,
                step,
                outcome: ShareOutcome::Cancelled,
            } => Deferred::Cancelled { from, step },
            SgpInput::PeerJoined(peer) => Deferred::Joined(peer),
            SgpInput::PeerLeft(peer) => Deferred::Left(peer),
            SgpInput::PeerCrashed(peer) => Deferred::Crashed(peer),
            SgpInput::Leave => Deferred::Leave,
            _ => return Ok(false),
        };
        self.deferred.push_back(deferred);
        Ok(true)
    }

    /// Acts on one kept input now that the parameters are back. A kept share that no longer
    /// absorbs (an edge dropped meanwhile to make room for another) is lost, as a crashed
    /// receiver's is.
    fn replay(&mut self, now: Time, deferred: Deferred<P>) -> Option<Replayed<P>> {
        match deferred {
            Deferred::Share {
                from,
                header,
                payload,
            } => {
                let absorbed = self.absorb(from, header, &payload);
                self.recycle(payload);
                if absorbed.is_err() {
                    return Some(Replayed::Lost(from));
                }
                self.after_absorb(now, Absorbed::Received);
                None
            }
            Deferred::Returned {
                to,
                header,
                payload,
                receiver_gone,
            } => {
                let input = SgpInput::ShareReturned {
                    to,
                    header,
                    payload: &payload,
                    receiver_gone,
                };
                let taken_back = self.handle(now, input);
                self.recycle(payload);
                taken_back.err().map(|_| Replayed::Lost(to))
            }
            Deferred::Refused { by, step } => {
                match self.handle(now, SgpInput::ShareRefused { by, step }) {
                    Ok(()) => Some(Replayed::TakenBack(by)),
                    Err(_) => Some(Replayed::Lost(by)),
                }
            }
            Deferred::Cancelled { from, step } => {
                let input = SgpInput::ReceiptReceived {
                    from,
                    step,
                    outcome: ShareOutcome::Cancelled,
                };
                let cancelled = self.stats.shares_cancelled;
                match self.handle(now, input) {
                    Err(_) => Some(Replayed::Lost(from)),
                    Ok(()) if self.stats.shares_cancelled > cancelled => {
                        Some(Replayed::Cancelled(from))
                    }
                    Ok(()) => None,
                }
            }
            membership => {
                let input = match membership {
                    Deferred::Joined(peer) => SgpInput::PeerJoined(peer),
                    Deferred::Left(peer) => SgpInput::PeerLeft(peer),
                    Deferred::Crashed(peer) => SgpInput::PeerCrashed(peer),
                    _ => SgpInput::Leave,
                };
                // Membership news and a leave fail only after the peer departed, where
                // they change nothing.
                let _ = self.handle(now, input);
                None
            }
        }
    }
}
