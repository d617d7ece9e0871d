//! SGP shares larger than a frame travel in pieces: the sender cuts a share's encoded
//! payload into parcels of at most `max_piece` bytes ([`PiecesOut`] tracks what became of
//! them), and the receiver puts them back together, in any order, before the share is
//! folded in whole ([`PiecesIn`]).
//!
//! On the wire each piece is a `PushSumShare` whose `chunk` and `chunk_count` number the
//! pieces, whose `offset` is the piece's first byte in the encoded payload, and whose
//! `elements` is the whole share's. Every piece but the last holds the same number of bytes
//! `B`, and piece `i` starts at byte `i · B`, so the pieces tile the payload exactly; the
//! receiver refuses a piece that breaks this, or whose step, weight, reference or codec
//! differ from its share's other pieces.
//!
//! A share is written when every piece is; one piece the transport could not write makes
//! the whole share unwritten (no more of its pieces go out), and the sender takes its mass
//! back from the payload it keeps until then, as for any share the transport gives back.
//! The pieces are cut as the transport writes them, at most [`PIECES_AHEAD`] unreported for
//! a receiver, so a share in pieces holds its encoded bytes once and those few pieces
//! besides; a receiver's shares go out in order, each one's pieces after all of the
//! earlier one's. A receiver holds one incomplete share per sender: a piece
//! of a later share replaces it, and the sender, receiving no receipt for the one left
//! incomplete, asks to cancel it, is told it was never applied, and takes its mass back.

use std::collections::HashMap;

use murmur_protocol::codec::{Codec, CodecSpec};
use murmur_protocol::message::PushSumShare;

use crate::PeerKey;
use crate::sgp::ShareHeader;

/// The most pieces one share may be cut into: 64 MiB frames (the largest limit) carry a
/// 250M-parameter `f32` share in 15 pieces, 1 MiB frames in 954.
pub const MAX_PIECES: u32 = 1 << 16;

/// The most pieces cut for one receiver and not yet reported on by the transport.
pub(crate) const PIECES_AHEAD: u32 = 4;

/// The sender's shares in flight in pieces, by sequence number, each with its whole
/// payload: a piece the transport could not write makes the share unwritten, and its mass
/// comes back from that payload as for any share the transport gives back.
#[derive(Debug)]
pub(crate) struct PiecesOut<P> {
    shares: HashMap<u64, Outgoing<P>>,
}

impl<P> Default for PiecesOut<P> {
    fn default() -> Self {
        PiecesOut {
            shares: HashMap::new(),
        }
    }
}

#[derive(Debug)]
struct Outgoing<P> {
    to: P,
    header: ShareHeader,
    elements: u32,
    payload: Vec<u8>,
    /// Bytes of every piece but the last.
    size: usize,
    count: u32,
    /// The next piece to cut.
    next: u32,
    /// Pieces cut and not reported yet.
    unreported: u32,
    /// Whether a piece was not written.
    failed: bool,
}

impl<P> Outgoing<P> {
    /// Whether pieces are still to be cut.
    fn to_cut(&self) -> bool {
        !self.failed && self.next < self.count
    }
}

/// A share whose every piece the transport reported on.
#[derive(Debug)]
pub(crate) struct Reported {
    /// Whether every piece was written.
    pub(crate) written: bool,
    pub(crate) header: ShareHeader,
    pub(crate) payload: Vec<u8>,
}

impl<P: PeerKey> PiecesOut<P> {
    /// The share `header` of `elements` elements goes to `to` in pieces of `size` bytes
    /// cut from `payload`; [`PiecesOut::cut`] hands them out.
    pub(crate) fn sent(
        &mut self,
        to: P,
        (header, elements): (ShareHeader, u32),
        payload: Vec<u8>,
        size: usize,
    ) {
        let count = payload.len().div_ceil(size.max(1)) as u32;
        let outgoing = Outgoing {
            to,
            header,
            elements,
            payload,
            size: size.max(1),
            count,
            next: 0,
            unreported: 0,
            failed: false,
        };
        self.shares.insert(header.seq, outgoing);
    }

    /// Whether share `seq` travels in pieces.
    pub(crate) fn contains(&self, seq: u64) -> bool {
        self.shares.contains_key(&seq)
    }

    /// Cuts the pieces that may go to `to` now, each passed to `send` with its share's
    /// sequence number and its header: the oldest share's first, up to [`PIECES_AHEAD`]
    /// unreported for `to`.
    pub(crate) fn cut(&mut self, to: P, mut send: impl FnMut(u64, PushSumShare<'static>, &[u8])) {
        let mut unreported: u32 = self
            .shares
            .values()
            .filter(|share| share.to == to)
            .map(|share| share.unreported)
            .sum();
        while unreported < PIECES_AHEAD {
            let oldest = self
                .shares
                .iter()
                .filter(|(_, share)| share.to == to && share.to_cut())
                .map(|(&seq, _)| seq)
                .min();
            let Some(share) = oldest.and_then(|seq| self.shares.get_mut(&seq)) else {
                return;
            };
            while share.to_cut() && unreported < PIECES_AHEAD {
                let index = share.next as usize;
                let start = index * share.size;
                let end = (start + share.size).min(share.payload.len());
                let wire = PushSumShare {
                    chunk: share.next,
                    chunk_count: share.count,
                    offset: start as u64,
                    ..share.header.to_wire(share.elements)
                };
                send(share.header.seq, wire, &share.payload[start..end]);
                share.next += 1;
                share.unreported += 1;
                unreported += 1;
            }
        }
    }

    /// The transport reported one piece of share `seq`; the share once every piece cut is
    /// reported and no more will be.
    pub(crate) fn reported(&mut self, seq: u64, written: bool) -> Option<Reported> {
        let share = self.shares.get_mut(&seq)?;
        share.unreported = share.unreported.saturating_sub(1);
        share.failed |= !written;
        if share.unreported > 0 || share.to_cut() {
            return None;
        }
        let share = self.shares.remove(&seq)?;
        Some(Reported {
            written: !share.failed,
            header: share.header,
            payload: share.payload,
        })
    }
}

/// The shares being put back together, one per sender.
#[derive(Debug)]
pub(crate) struct PiecesIn<P> {
    shares: HashMap<P, Incoming>,
}

impl<P> Default for PiecesIn<P> {
    fn default() -> Self {
        PiecesIn {
            shares: HashMap::new(),
        }
    }
}

/// One share being put back together.
#[derive(Debug)]
struct Incoming {
    step: u64,
    weight: f64,
    reference: Option<u64>,
    codec: CodecSpec,
    chunk_count: u32,
    /// Bytes of every piece but the last, once a piece has said.
    piece: Option<usize>,
    /// The payload's length, once the last piece has come.
    len: Option<usize>,
    /// The most bytes the payload may hold (the codec's bound for the share's elements).
    max_len: usize,
    received: Vec<bool>,
    pieces_left: u32,
    bytes: Vec<u8>,
}

impl<P: PeerKey> PiecesIn<P> {
    /// Takes one piece from `from` of a share of `elements` elements; the whole payload
    /// once the piece completes its share, in a buffer `spare` lent (returned to the caller
    /// to recycle after use). A piece that cannot belong to a well-formed share is refused
    /// with the reason, and its share is dropped.
    pub(crate) fn piece(
        &mut self,
        from: P,
        share: &PushSumShare<'_>,
        payload: &[u8],
        elements: usize,
        spare: impl FnOnce() -> Vec<u8>,
    ) -> Result<Option<Vec<u8>>, String> {
        let stale = self.shares.get(&from).is_some_and(|s| {
            s.step != share.step
                || s.weight.to_bits() != share.weight.to_bits()
                || s.reference != share.reference_step
                || s.codec != share.codec
                || s.chunk_count != share.chunk_count
        });
        if stale {
            // A later share (or a resent one): the incomplete one will be cancelled by its
            // sender.
            self.shares.remove(&from);
        }
        let incoming = match self.shares.entry(from) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                entry.insert(Incoming::new(share, elements, spare())?)
            }
        };
        if let Err(reason) = incoming.add(share, payload) {
            self.shares.remove(&from);
            return Err(reason);
        }
        if incoming.pieces_left > 0 {
            return Ok(None);
        }
        let done = self.shares.remove(&from).expect("present");
        Ok(Some(done.bytes))
    }

    /// Drops what `peer` had sent of an incomplete share (it left).
    pub(crate) fn forget(&mut self, peer: &P) -> Option<Vec<u8>> {
        self.shares.remove(peer).map(|s| s.bytes)
    }
}

impl Incoming {
    fn new(share: &PushSumShare<'_>, elements: usize, mut bytes: Vec<u8>) -> Result<Self, String> {
        if share.chunk_count < 2 || share.chunk_count > MAX_PIECES {
            return Err(format!(
                "a share in {} pieces (2 to {MAX_PIECES})",
                share.chunk_count
            ));
        }
        let codec = Codec::new(share.codec).map_err(|e| format!("a share piece: {e}"))?;
        bytes.clear();
        Ok(Incoming {
            step: share.step,
            weight: share.weight,
            reference: share.reference_step,
            codec: share.codec,
            chunk_count: share.chunk_count,
            piece: None,
            len: None,
            max_len: codec.max_encoded_len(elements),
            received: vec![false; share.chunk_count as usize],
            pieces_left: share.chunk_count,
            bytes,
        })
    }

    fn add(&mut self, share: &PushSumShare<'_>, payload: &[u8]) -> Result<(), String> {
        let index = share.chunk as usize;
        let last = share.chunk + 1 == self.chunk_count;
        if share.chunk >= self.chunk_count || self.received[index] {
            return Err(format!(
                "share piece {} of {} again or out of range",
                share.chunk, self.chunk_count
            ));
        }
        // The piece size this piece implies: its own length unless it is the last; its
        // offset over its index otherwise.
        let size = if last {
            usize::try_from(share.offset)
                .ok()
                .filter(|&offset| offset % index == 0)
                .map(|offset| offset / index)
        } else {
            Some(payload.len())
        };
        let consistent = size.is_some_and(|size| {
            size > 0
                && self.piece.is_none_or(|p| p == size)
                && share.offset == (index * size) as u64
                && (!last || (1..=size).contains(&payload.len()))
        });
        let Some(size) = size.filter(|_| consistent) else {
            return Err(format!(
                "share piece {} of {} at byte {} with {} bytes does not tile the share",
                share.chunk,
                self.chunk_count,
                share.offset,
                payload.len()
            ));
        };
        self.piece = Some(size);
        let start = index * size;
        let end = start + payload.len();
        if end > self.max_len {
            return Err(format!(
                "share pieces reach byte {end}, past the {} bytes its codec encodes it in",
                self.max_len
            ));
        }
        if last {
            self.len = Some(end);
        }
        let needed = self.len.unwrap_or(end).max(end);
        if self.bytes.len() < needed {
            self.bytes.resize(needed, 0);
        }
        self.bytes[start..end].copy_from_slice(payload);
        self.received[index] = true;
        self.pieces_left -= 1;
        if self.pieces_left == 0 {
            // Every piece tiles its place, so the bytes end where the last piece does.
            self.bytes.truncate(self.len.unwrap_or(end));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(chunk: u32, count: u32, offset: u64) -> PushSumShare<'static> {
        PushSumShare {
            step: 9,
            chunk,
            chunk_count: count,
            offset,
            elements: 100,
            weight: 0.5,
            reference_step: None,
            codec: CodecSpec::F32,
            payload: &[],
        }
    }

    /// The payload of a 100-element `f32` share, cut into pieces of 150 bytes.
    fn cut() -> (Vec<u8>, Vec<(PushSumShare<'static>, Vec<u8>)>) {
        let whole: Vec<u8> = (0..400u32).map(|i| (i % 251) as u8).collect();
        let pieces = whole
            .chunks(150)
            .enumerate()
            .map(|(i, bytes)| (piece(i as u32, 3, i as u64 * 150), bytes.to_vec()))
            .collect();
        (whole, pieces)
    }

    #[test]
    fn pieces_in_any_order_give_back_the_whole_payload_once() {
        let (whole, pieces) = cut();
        for order in [[0, 1, 2], [2, 0, 1], [1, 2, 0]] {
            let mut incoming = PiecesIn::<u32>::default();
            let mut out = None;
            for (n, &i) in order.iter().enumerate() {
                let (share, bytes) = &pieces[i];
                let got = incoming.piece(7, share, bytes, 100, Vec::new).unwrap();
                assert_eq!(got.is_some(), n == 2, "order {order:?}, piece {i}");
                out = out.or(got);
            }
            assert_eq!(out.unwrap(), whole, "order {order:?}");
            assert!(incoming.forget(&7).is_none(), "nothing left once complete");
        }
    }

    #[test]
    fn a_piece_that_does_not_tile_the_share_is_refused() {
        let (_, pieces) = cut();
        let (first, bytes) = &pieces[0];
        let mut incoming = PiecesIn::<u32>::default();
        incoming.piece(7, first, bytes, 100, Vec::new).unwrap();
        // Again.
        assert!(incoming.piece(7, first, bytes, 100, Vec::new).is_err());
        // A middle piece at the wrong offset, or of another size.
        let mut incoming = PiecesIn::<u32>::default();
        incoming.piece(7, first, bytes, 100, Vec::new).unwrap();
        let (middle, bytes) = &pieces[1];
        let shifted = PushSumShare {
            offset: 149,
            ..*middle
        };
        assert!(incoming.piece(7, &shifted, bytes, 100, Vec::new).is_err());
        let mut incoming = PiecesIn::<u32>::default();
        incoming
            .piece(7, first, &pieces[0].1, 100, Vec::new)
            .unwrap();
        assert!(
            incoming
                .piece(7, middle, &bytes[..100], 100, Vec::new)
                .is_err()
        );
        // A last piece past what the codec encodes the share in.
        let mut incoming = PiecesIn::<u32>::default();
        let (last, _) = &pieces[2];
        assert!(incoming.piece(7, last, &[0; 150], 100, Vec::new).is_err());
        // One piece is not a share in pieces.
        let single = piece(0, 1, 0);
        assert!(
            PiecesIn::<u32>::default()
                .piece(7, &single, &[0; 4], 100, Vec::new)
                .is_err()
        );
    }

    #[test]
    fn a_piece_of_a_later_share_replaces_the_incomplete_one() {
        let (whole, pieces) = cut();
        let mut incoming = PiecesIn::<u32>::default();
        incoming
            .piece(7, &pieces[0].0, &pieces[0].1, 100, Vec::new)
            .unwrap();
        let later = |share: &PushSumShare<'static>| PushSumShare { step: 10, ..*share };
        let mut out = None;
        for (share, bytes) in &pieces {
            out = incoming
                .piece(7, &later(share), bytes, 100, Vec::new)
                .unwrap();
        }
        assert_eq!(out.unwrap(), whole);
        // Another sender's pieces are kept apart.
        incoming
            .piece(8, &pieces[0].0, &pieces[0].1, 100, Vec::new)
            .unwrap();
        assert!(incoming.forget(&8).is_some());
    }

    fn header(seq: u64) -> ShareHeader {
        ShareHeader {
            seq,
            step: 9,
            weight: 0.5,
            reference: None,
            codec: CodecSpec::F32,
        }
    }

    /// Cuts what may go to `to`: (seq, chunk, bytes) of each piece.
    fn cut_now(out: &mut PiecesOut<u32>, to: u32) -> Vec<(u64, u32, Vec<u8>)> {
        let mut pieces = Vec::new();
        out.cut(to, |seq, wire, bytes| {
            pieces.push((seq, wire.chunk, bytes.to_vec()))
        });
        pieces
    }

    #[test]
    fn a_share_is_written_once_every_piece_is_and_unwritten_if_one_is_not() {
        let mut out = PiecesOut::default();
        out.sent(7, (header(4), 100), vec![1, 2, 3], 1);
        assert!(out.contains(4));
        assert_eq!(cut_now(&mut out, 7).len(), 3);
        assert!(out.reported(4, true).is_none());
        assert!(out.reported(4, false).is_none());
        let done = out.reported(4, true).unwrap();
        assert!(!done.written);
        assert_eq!(done.payload, vec![1, 2, 3]);
        assert!(!out.contains(4));
        out.sent(7, (header(4), 100), vec![1], 1);
        assert_eq!(cut_now(&mut out, 7).len(), 1);
        assert!(out.reported(4, true).unwrap().written);
    }

    #[test]
    fn pieces_are_cut_as_the_transport_writes_them_a_receivers_shares_in_order() {
        let mut out = PiecesOut::default();
        // Two shares to 7 of 6 and 2 pieces, one to 8 of 1.
        out.sent(7, (header(1), 100), (0..6).collect(), 1);
        out.sent(7, (header(2), 100), vec![10, 11], 1);
        out.sent(8, (header(3), 100), vec![20], 1);
        let first = cut_now(&mut out, 7);
        let expected: Vec<(u64, u32, Vec<u8>)> = (0..4).map(|i| (1, i, vec![i as u8])).collect();
        assert_eq!(
            first, expected,
            "the oldest share's first pieces, four ahead"
        );
        assert!(
            cut_now(&mut out, 7).is_empty(),
            "nothing more until one is written"
        );
        assert_eq!(
            cut_now(&mut out, 8),
            [(3, 0, vec![20])],
            "another receiver's own window"
        );
        for _ in 0..2 {
            assert!(out.reported(1, true).is_none());
        }
        // Two written: the first share's last two pieces go, then nothing of the second.
        assert_eq!(cut_now(&mut out, 7), [(1, 4, vec![4]), (1, 5, vec![5])]);
        assert!(out.reported(1, true).is_none());
        assert_eq!(cut_now(&mut out, 7), [(2, 0, vec![10])]);
        // A piece that was not written: no more of its share is cut, and it ends unwritten
        // once the pieces cut are reported.
        let failed = out.reported(2, false).unwrap();
        assert!(!failed.written);
        assert_eq!(failed.payload, vec![10, 11]);
        assert!(cut_now(&mut out, 7).is_empty());
        for _ in 0..2 {
            assert!(out.reported(1, true).is_none());
        }
        assert!(out.reported(1, true).unwrap().written);
        assert!(!out.contains(1));
    }
}
