//! The simulated transport of an SGP swarm: shares and refusal notices on the wire, their
//! delivery reports, and shares given back.
//!
//! A share that reaches its receiver is delivered, and the sender hears so one latency
//! later. If the receiver cannot use it because it does not hold the edge reference the
//! share was built on ([`SgpError::StaleReference`]: it restarted, or dropped the edge), it
//! answers with a [`ShareRefused`] notice, which crosses the links like any message; the
//! sender then takes the share back ([`SgpInput::ShareRefused`]). A share whose receiver is
//! gone comes back from the transport itself ([`SgpInput::ShareReturned`]).
//!
//! Receipts and cancel requests ([`ShareReceipt`], [`ShareCancel`]) cross the links too. A
//! notice is meant for one process: one addressed to a peer that restarted since is
//! dropped, as its connection would be.

use std::time::Duration;

use murmur_protocol::message::{ShareCancel, ShareReceipt, ShareRefused, WireMessage};

use crate::Time;
use crate::sgp::{SgpError, SgpInput, ShareHeader};
use crate::sim::error::SimError;
use crate::sim::network::Departure;
use crate::sim::queue::Lane;

use super::{Event, SgpSwarm};

/// The least time a transport takes to give up on a peer that is gone. Without it a
/// zero-latency run could bounce a share between a leaver and a departed heir forever
/// without virtual time advancing.
const RETURN_FLOOR: Duration = Duration::from_millis(1);

/// A message on the wire.
#[derive(Debug)]
pub(super) struct Message {
    route: Route,
    body: Body,
}

/// Where a message goes, and whose mass it carries.
#[derive(Debug, Clone, Copy)]
struct Route {
    from: u32,
    to: u32,
    /// The incarnation of the peer the carried mass belongs to, the share's sender (for a
    /// notice, its receiver): only that process can take the mass back.
    incarnation: u32,
    departure: Departure,
}

/// What a message carries.
#[derive(Debug)]
pub(super) enum Body {
    /// A push-sum share.
    Share {
        header: ShareHeader,
        payload: Vec<u8>,
        /// The receiver was gone when the share arrived.
        receiver_gone: bool,
    },
    /// The receiver of a share refused it and tells its sender.
    Refusal {
        notice: ShareRefused,
        /// The refused share's weight. The wire form does not carry it (the sender knows
        /// what it sent); the simulator keeps it to account for the mass on its way back.
        weight: f64,
    },
    /// What became of a share, for its sender (`Route::incarnation` is the sender's).
    Receipt(ShareReceipt),
    /// A sender asks what became of its share (`Route::incarnation` is the sender's).
    Cancel(ShareCancel),
}

impl Message {
    /// The push-sum weight the message carries, or carries back.
    pub(super) fn weight(&self) -> f64 {
        match self.body {
            Body::Share { header, .. } => header.weight,
            Body::Refusal { weight, .. } => weight,
            Body::Receipt(_) | Body::Cancel(_) => 0.0,
        }
    }
}

impl Body {
    /// Payload bytes on the wire.
    fn wire_len(&self) -> usize {
        match self {
            Body::Share { payload, .. } => payload.len(),
            Body::Refusal { notice, .. } => WireMessage::encoded_len(notice),
            Body::Receipt(notice) => WireMessage::encoded_len(notice),
            Body::Cancel(notice) => WireMessage::encoded_len(notice),
        }
    }
}

impl SgpSwarm {
    /// Hands a message from `from` to `to` to the network now; `incarnation` is that of
    /// the peer whose mass it carries.
    pub(super) fn post(&mut self, from: u32, to: u32, incarnation: u32, body: Body) {
        let departure = self
            .network
            .depart(self.now, from as usize, body.wire_len());
        let route = Route {
            from,
            to,
            incarnation,
            departure,
        };
        let message = Message { route, body };
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(message);
                slot
            }
            None => {
                self.slots.push(Some(message));
                (self.slots.len() - 1) as u32
            }
        };
        self.queue
            .push(departure.reaches, Lane::Normal, Event::Reach { slot });
    }

    /// The first byte of the message in `slot` reaches its receiver: it queues at the
    /// receiver's downlink.
    pub(super) fn on_reach(&mut self, slot: u32) {
        if let Some(message) = self.slots.get(slot as usize).and_then(Option::as_ref) {
            let route = &message.route;
            let arrival = self
                .network
                .arrive(&route.departure, route.to as usize, &mut self.rng);
            self.queue
                .push(arrival, Lane::Normal, Event::Arrive { slot });
        }
    }

    pub(super) fn on_arrive(&mut self, slot: u32) -> Result<(), SimError> {
        let Some(Message { route, body }) =
            self.slots.get_mut(slot as usize).and_then(Option::take)
        else {
            return Ok(());
        };
        match body {
            Body::Share {
                header, payload, ..
            } => self.on_share(slot, route, header, payload),
            Body::Refusal { notice, weight } => {
                self.free_slots.push(slot);
                self.on_refusal(route, notice, weight)
            }
            Body::Receipt(receipt) => {
                self.free_slots.push(slot);
                if self.incarnation(route.to) != Some(route.incarnation) {
                    return Ok(());
                }
                let input = SgpInput::ReceiptReceived {
                    from: route.from,
                    step: receipt.step,
                    outcome: receipt.outcome,
                };
                self.feed(route.to, input)
            }
            Body::Cancel(cancel) => {
                self.free_slots.push(slot);
                let input = SgpInput::CancelAsked {
                    from: route.from,
                    step: cancel.step,
                };
                // The answer goes to the process that asked.
                self.answering = Some(route.incarnation);
                let fed = self.feed(route.to, input);
                self.answering = None;
                fed
            }
        }
    }

    /// Gives the share in `slot` back to its sender at `at`; `receiver_gone` when nobody
    /// took it.
    fn give_back(
        &mut self,
        slot: u32,
        at: Time,
        route: Route,
        (header, payload): (ShareHeader, Vec<u8>),
        receiver_gone: bool,
    ) {
        let body = Body::Share {
            header,
            payload,
            receiver_gone,
        };
        self.slots[slot as usize] = Some(Message { route, body });
        self.queue.push(at, Lane::Normal, Event::Return { slot });
    }

    fn on_share(
        &mut self,
        slot: u32,
        route: Route,
        header: ShareHeader,
        payload: Vec<u8>,
    ) -> Result<(), SimError> {
        let Route { from, to, .. } = route;
        let receiver = self
            .peers
            .get_mut(to as usize)
            .and_then(|peer| peer.machine.as_mut())
            .filter(|machine| !machine.has_departed());
        let Some(receiver) = receiver else {
            // Nobody took it: the transport notices after a round trip and hands it back.
            let at = self.now + (self.network.latency() * 2).max(RETURN_FLOOR);
            self.give_back(slot, at, route, (header, payload), true);
            return Ok(());
        };
        let input = SgpInput::ShareReceived {
            from,
            header,
            payload: &payload,
        };
        let mut refusal = None;
        match receiver.handle(self.now, input) {
            Ok(()) => {}
            Err(SgpError::StaleReference { version }) => {
                // Delivered, but built on a reference this peer does not hold: it tells the
                // sender, who takes the share back, as the daemon does.
                let notice = ShareRefused {
                    step: header.step,
                    reference_step: version,
                };
                refusal = Some(Body::Refusal {
                    notice,
                    weight: header.weight,
                });
            }
            Err(error) if error.returns_share() => {
                // Sound but unusable here: back to the sender before it is confirmed.
                let at = self.now + self.network.latency();
                self.give_back(slot, at, route, (header, payload), false);
                return Ok(());
            }
            // A malformed share (a byzantine peer's NaN) is dropped and the receiver carries
            // on; its weight is lost, as it would be on a real network.
            Err(_) => self.dropped_weight += header.weight,
        }
        // The sender keeps an exact share's payload once it is written, to take it back
        // should it be cancelled: its own buffer in the daemon, a copy here.
        if header.reference.is_none() {
            let key = (from, route.incarnation, header.seq);
            self.written_payloads.insert(key, payload.clone());
        }
        receiver.recycle(payload);
        self.free_slots.push(slot);
        if let Some(refusal) = refusal {
            self.refusals.refused += 1;
            self.post(to, from, route.incarnation, refusal);
        }
        // The receipt goes to the process that sent the share.
        self.answering = Some(route.incarnation);
        let pumped = self.pump(to);
        self.answering = None;
        pumped?;
        let at = self.now + self.network.latency();
        let delivered = Event::Delivered {
            from,
            incarnation: route.incarnation,
            to,
            seq: header.seq,
        };
        self.queue.push(at, Lane::Normal, delivered);
        Ok(())
    }

    /// A refusal notice reached the sender of the refused share.
    fn on_refusal(
        &mut self,
        route: Route,
        notice: ShareRefused,
        weight: f64,
    ) -> Result<(), SimError> {
        let sender = route.to;
        let machine = self
            .peers
            .get_mut(sender as usize)
            .filter(|peer| peer.incarnation == route.incarnation)
            .and_then(|peer| peer.machine.as_mut());
        let Some(machine) = machine else {
            // The sender crashed, departed or restarted since: nobody holds the claim on
            // this mass any more, and it is lost with the process that sent it.
            self.refusals.lost += 1;
            self.crashed_weight += weight;
            return Ok(());
        };
        let input = SgpInput::ShareRefused {
            by: route.from,
            step: notice.step,
        };
        match machine.handle(self.now, input) {
            Ok(()) => self.refusals.taken_back += 1,
            // A later share on that edge replaced the reference the share needs.
            Err(_) => {
                self.refusals.lost += 1;
                self.dropped_weight += weight;
            }
        }
        self.pump(sender)
    }

    pub(super) fn on_return(&mut self, slot: u32) -> Result<(), SimError> {
        let Some(Message { route, body }) =
            self.slots.get_mut(slot as usize).and_then(Option::take)
        else {
            return Ok(());
        };
        self.free_slots.push(slot);
        // Only shares are given back (`give_back`).
        let Body::Share {
            header,
            payload,
            receiver_gone,
        } = body
        else {
            return Ok(());
        };
        let sender = self
            .peers
            .get_mut(route.from as usize)
            .filter(|peer| peer.incarnation == route.incarnation)
            .and_then(|peer| peer.machine.as_mut());
        let Some(sender) = sender else {
            // The sender is gone too, or restarted: this share's mass is lost with it.
            self.crashed_weight += header.weight;
            return Ok(());
        };
        let input = SgpInput::ShareReturned {
            to: route.to,
            header,
            payload: &payload,
            receiver_gone,
        };
        if sender.handle(self.now, input).is_err() {
            self.dropped_weight += header.weight;
        }
        sender.recycle(payload);
        self.pump(route.from)
    }
}
