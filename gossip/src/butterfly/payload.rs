//! Send buffers that outlive the output naming them, reused from round to round.

/// Names a send buffer held by a [`ButterflyRound`](super::ButterflyRound).
///
/// Read the bytes with [`ButterflyRound::payload`](super::ButterflyRound::payload) when
/// writing them out, then hand the reference back with
/// [`RoundInput::Sent`](super::RoundInput::Sent). A reference is good until then; after
/// that, the buffer carries another chunk and the old reference reads nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PayloadRef(Key);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    /// A buffer of a [`PayloadPool`], current while the slot's generation matches.
    Pooled { slot: u32, generation: u32 },
    /// The encoded average of a chunk of the part a member reduces ([`EncodedAverages`]).
    Average { chunk: u32 },
}

impl PayloadRef {
    /// The chunk of the member's own part whose encoded average this names, if it does.
    pub(crate) fn average_chunk(self) -> Option<usize> {
        match self.0 {
            Key::Average { chunk } => Some(chunk as usize),
            Key::Pooled { .. } => None,
        }
    }
}

/// The averages of the part a member reduces, each chunk encoded once, when the first
/// member takes it, and sent to every other member from the same bytes: encoding, not
/// the network, is what a lossy codec costs most per element.
///
/// They stay for the whole round (every chunk has its own place), so a reference to one
/// never goes stale, and their memory passes from round to round in
/// [`RoundBuffers`](super::RoundBuffers).
///
/// Averages kept elsewhere ([`EncodedAverages::elsewhere`]) take no memory here: only
/// their lengths are recorded ([`EncodedAverages::mark`]), and the round reads their bytes
/// from where they are.
#[derive(Debug, Default)]
pub(crate) struct EncodedAverages {
    bytes: Vec<u8>,
    /// Bytes reserved per chunk: the codec's largest encoding of the largest chunk.
    stride: usize,
    /// Each chunk's encoded length, once encoded.
    lens: Vec<Option<usize>>,
}

impl EncodedAverages {
    /// Room for `chunks` encodings of up to `stride` bytes each, in `bytes` (memory from
    /// an earlier round; its contents are overwritten).
    pub(crate) fn new(mut bytes: Vec<u8>, chunks: usize, stride: usize) -> EncodedAverages {
        bytes.resize(chunks * stride, 0);
        EncodedAverages {
            bytes,
            stride,
            lens: vec![None; chunks],
        }
    }

    /// The lengths of `chunks` encodings whose bytes are kept elsewhere; `bytes` is kept
    /// unused, for a later round.
    pub(crate) fn elsewhere(bytes: Vec<u8>, chunks: usize) -> EncodedAverages {
        EncodedAverages {
            bytes,
            stride: 0,
            lens: vec![None; chunks],
        }
    }

    /// Records that chunk `chunk`'s encoding, kept elsewhere, is `len` bytes long.
    pub(crate) fn mark(&mut self, chunk: usize, len: usize) -> PayloadRef {
        self.lens[chunk] = Some(len);
        PayloadRef(Key::Average {
            chunk: chunk as u32,
        })
    }

    /// Chunk `chunk`'s encoded length, if it was encoded.
    pub(crate) fn len_of(&self, chunk: usize) -> Option<usize> {
        self.lens.get(chunk).copied().flatten()
    }

    /// The reference to chunk `chunk`'s encoding, made with `encode` (which writes into the
    /// buffer it is given and returns the length) if this is the first time it is asked
    /// for. `chunk` must be below the count given to `new`.
    pub(crate) fn get_or_encode(
        &mut self,
        chunk: usize,
        encode: impl FnOnce(&mut [u8]) -> usize,
    ) -> PayloadRef {
        if self.lens[chunk].is_none() {
            let start = chunk * self.stride;
            let len = encode(&mut self.bytes[start..start + self.stride]);
            self.lens[chunk] = Some(len.min(self.stride));
        }
        PayloadRef(Key::Average {
            chunk: chunk as u32,
        })
    }

    /// The reference to chunk `chunk`'s encoding, if it was made.
    pub(crate) fn encoded(&self, chunk: usize) -> Option<PayloadRef> {
        self.lens.get(chunk).copied().flatten().map(|_| {
            PayloadRef(Key::Average {
                chunk: chunk as u32,
            })
        })
    }

    /// Chunk `chunk`'s encoding, if it was made here (`None` for one kept elsewhere: no
    /// room is reserved for those, `stride` 0).
    pub(crate) fn get(&self, chunk: usize) -> Option<&[u8]> {
        let len = (*self.lens.get(chunk)?)?;
        if self.stride == 0 {
            return None;
        }
        let start = chunk * self.stride;
        self.bytes.get(start..start + len)
    }

    /// The memory, for the next round.
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
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
        let reference = PayloadRef(Key::Pooled {
            slot,
            generation: entry.generation,
        });
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
        let Key::Pooled { slot, generation } = reference.0 else {
            return None;
        };
        let slot = self.slots.get(slot as usize)?;
        (slot.busy && slot.generation == generation).then(|| &slot.bytes[..slot.len])
    }

    /// Frees the buffer; false if the reference was not current.
    pub(crate) fn release(&mut self, reference: PayloadRef) -> bool {
        let Key::Pooled { slot: index, .. } = reference.0 else {
            return false;
        };
        let Some(slot) = self.slot_mut(reference) else {
            return false;
        };
        slot.busy = false;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index);
        true
    }

    /// Buffers allocated so far (busy or free).
    pub(crate) fn allocated(&self) -> usize {
        self.slots.len()
    }

    fn slot_mut(&mut self, reference: PayloadRef) -> Option<&mut Slot> {
        let Key::Pooled { slot, generation } = reference.0 else {
            return None;
        };
        let slot = self.slots.get_mut(slot as usize)?;
        (slot.busy && slot.generation == generation).then_some(slot)
    }
}
