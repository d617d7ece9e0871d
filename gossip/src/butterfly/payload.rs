//! Send buffers that outlive the output naming them, reused from round to round.

/// Names a send buffer held by a [`ButterflyRound`](super::ButterflyRound).
///
/// Read the bytes with [`ButterflyRound::payload`](super::ButterflyRound::payload) when
/// writing them out, then hand the reference back with
/// [`RoundInput::Sent`](super::RoundInput::Sent). A reference is good until then; after
/// that, the buffer carries another chunk and the old reference reads nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PayloadRef {
    slot: u32,
    generation: u32,
}

#[derive(Debug)]
struct Slot {
    bytes: Vec<u8>,
    len: usize,
    busy: bool,
    generation: u32,
}

/// A pool of send buffers. The number of buffers is bounded by the sends a round may have
/// in flight, so after warm-up nothing is allocated per chunk.
#[derive(Debug, Default)]
pub(crate) struct PayloadPool {
    slots: Vec<Slot>,
    free: Vec<u32>,
}

impl PayloadPool {
    /// A free buffer of at least `capacity` bytes.
    pub(crate) fn acquire(&mut self, capacity: usize) -> (PayloadRef, &mut [u8]) {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(Slot {
                    bytes: Vec::new(),
                    len: 0,
                    busy: false,
                    generation: 0,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let entry = &mut self.slots[slot as usize];
        entry.busy = true;
        entry.len = 0;
        if entry.bytes.len() < capacity {
            entry.bytes.resize(capacity, 0);
        }
        let reference = PayloadRef {
            slot,
            generation: entry.generation,
        };
        (reference, &mut entry.bytes[..capacity])
    }

    /// Records how many bytes of the buffer hold the payload.
    pub(crate) fn set_len(&mut self, reference: PayloadRef, len: usize) {
        if let Some(slot) = self.slot_mut(reference) {
            slot.len = len.min(slot.bytes.len());
        }
    }

    /// The payload, if the reference is still current.
    pub(crate) fn get(&self, reference: PayloadRef) -> Option<&[u8]> {
        let slot = self.slots.get(reference.slot as usize)?;
        (slot.busy && slot.generation == reference.generation).then(|| &slot.bytes[..slot.len])
    }

    /// Frees the buffer; false if the reference was not current.
    pub(crate) fn release(&mut self, reference: PayloadRef) -> bool {
        let Some(slot) = self.slot_mut(reference) else {
            return false;
        };
        slot.busy = false;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(reference.slot);
        true
    }

    /// Buffers allocated so far (busy or free).
    pub(crate) fn allocated(&self) -> usize {
        self.slots.len()
    }

    fn slot_mut(&mut self, reference: PayloadRef) -> Option<&mut Slot> {
        let slot = self.slots.get_mut(reference.slot as usize)?;
        (slot.busy && slot.generation == reference.generation).then_some(slot)
    }
}
