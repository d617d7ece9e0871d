//! Quantized shares: deviations from a reference each edge shares, with mass kept exact.
//!
//! Quantizing a share of the numerator itself would add noise proportional to the
//! parameters' magnitude on every step, and push-sum would never agree. Instead each
//! directed edge `i → j` keeps a reference `r`, a de-biased parameter vector both ends hold
//! bit for bit (CHOCO-SGD, Koloskova et al., ICML 2019; quantized push-sum, Taheri et al.,
//! ICML 2020). A share of weight `w_s` is sent as `Q(z_i − r)`; both ends compute
//! `v = r + Q⁻¹(Q(z_i − r))`, set `r ← v`, and move the numerator `w_s · v`: the sender
//! subtracts exactly the vector the receiver adds. The quantization error `w_s·(z_i − v)`
//! stays in the sender's numerator instead of vanishing, so no mass is lost, and its size
//! is the codec's error on `z_i − r`, which is how far the sender moved since its last
//! share on this edge: it shrinks as the swarm agrees.
//!
//! An edge starts from the zero reference at both ends: its first share, and the first after
//! the edge was forgotten, is `Q(z_i)`, marked [`FRESH_REFERENCE`], and its quantization
//! error stays in the sender's numerator like any other share's. A share is never a whole
//! `f32` copy of the parameters, which at a model's size would outgrow every other buffer
//! the edge keeps for as long as it travels. An edge carries at most one unconfirmed
//! share (confirmed by its receiver's receipt); a share due on an edge still waiting is
//! skipped (the peer keeps that mass), so that a returned or cancelled share can always be
//! taken back exactly. A receiver whose reference does
//! not match a share rejects it with [`SgpError::StaleReference`] and tells its sender
//! (a `ShareRefused` message, or the transport hands the share back before confirming
//! it); the sender takes the share back and forgets the edge. A refusal can come after
//! the transport confirmed the share, so each edge remembers its last share until the next:
//! its weight, its payload and the reference it was built on, from which `v` is computed
//! again bit for bit, and `w_s · v` is what to take back. The next share folds it in.
//!
//! References are kept in 16 bits an element ([`super::reference`]): `r ← v` rounds `v`
//! the same way at both ends, and the rounding, never part of the mass a share moves,
//! goes out with the next share's deviation.

use murmur_protocol::codec::{Codec, CodecError, CodecSpec};

use crate::PeerKey;

use super::error::SgpError;
use super::reference::{REFERENCE_BLOCK, Reference};
use super::share::{FRESH_REFERENCE, ShareHeader};
use super::state::{Debias, F32_BYTES, PushSumState, f32_from_le};

/// The sender's end of an edge.
#[derive(Debug)]
struct OutEdge<P> {
    peer: P,
    /// The sender step at which the edge's reference was last set (by `last_share`).
    version: u64,
    /// The reference before `last_share`: the edge's reference is `r + Q⁻¹(last_share)`,
    /// folded in (and rounded to 16 bits) once its receiver applied it, or when the next
    /// share is made.
    reference: Reference,
    /// The payload of the last share on this edge (empty: none since `reference`), kept
    /// until its receiver applied it so that its `v` can be computed again, bit for bit,
    /// to take it back.
    last_share: Vec<u8>,
    /// Sequence number of the share on this edge not yet confirmed.
    unconfirmed: Option<u64>,
    /// The weight of the last share on this edge (the one of step `version`), which its
    /// receiver may still refuse after the transport confirmed it.
    last_weight: f64,
    /// The peer left the view; drop the edge once its share is settled.
    orphaned: bool,
    last_used: u64,
}

/// The receiver's end of an edge.
#[derive(Debug)]
struct InEdge<P> {
    peer: P,
    version: u64,
    reference: Reference,
    last_used: u64,
}

/// The quantized-share state of one peer: its codec and its edges' references.
#[derive(Debug)]
pub(crate) struct EdgeReferences<P> {
    coder: PieceCoder,
    capacity: usize,
    out_edges: Vec<OutEdge<P>>,
    in_edges: Vec<InEdge<P>>,
    clock: u64,
}

/// Elements a share is encoded and checked in at a time (rounded up to whole blocks): 256
/// KiB of scratch, where a whole vector's took as much as the model.
const PIECE_ELEMENTS: usize = 1 << 16;

/// What [`EdgeReferences::split`] put in the payload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SplitShare {
    pub(crate) weight: f64,
    pub(crate) reference: Option<u64>,
    pub(crate) codec: CodecSpec,
}

impl<P: PeerKey> EdgeReferences<P> {
    pub(crate) fn new(codec: Codec, capacity: usize, len: usize) -> EdgeReferences<P> {
        EdgeReferences {
            coder: PieceCoder::new(codec, len),
            capacity: capacity.max(1),
            out_edges: Vec::new(),
            in_edges: Vec::new(),
            clock: 0,
        }
    }

    /// Bytes the edges hold: every reference, and each out-edge's last share while its
    /// receiver has not applied it.
    pub(crate) fn held_bytes(&self) -> usize {
        let outgoing: usize = self
            .out_edges
            .iter()
            .map(|edge| edge.reference.bytes() + edge.last_share.capacity())
            .sum();
        let incoming: usize = self.in_edges.iter().map(|e| e.reference.bytes()).sum();
        outgoing + incoming
    }

    /// The most bytes a quantized share of `len` elements takes.
    pub(crate) fn max_encoded_len(&self, len: usize) -> usize {
        self.coder.codec.max_encoded_len(len)
    }

    /// Moves `fraction` of `state`'s mass towards `to` at `step`, writing the payload.
    ///
    /// Returns `None`, leaving `state` untouched, when the edge to `to` still waits for a
    /// confirmation (the peer then keeps that share), or when the share cannot be made (a
    /// parameter is not finite).
    pub(crate) fn split(
        &mut self,
        state: &mut PushSumState,
        to: P,
        fraction: f32,
        step: u64,
        seq: u64,
        payload: &mut Vec<u8>,
    ) -> Option<SplitShare> {
        self.clock += 1;
        let clock = self.clock;
        let at = self.out_edges.iter().position(|edge| edge.peer == to);
        if let Some(at) = at
            && self.out_edges[at].unconfirmed.is_some()
        {
            return None;
        }
        if state.weight() <= 0.0 {
            return None;
        }
        let len = state.len();
        let at = match at {
            Some(at) => at,
            None => {
                // No reference yet: both ends start this edge from zero.
                self.make_room_out();
                self.out_edges.push(OutEdge {
                    peer: to,
                    version: FRESH_REFERENCE,
                    reference: Reference::zeros(len),
                    last_share: Vec::new(),
                    unconfirmed: None,
                    last_weight: 0.0,
                    orphaned: false,
                    last_used: clock,
                });
                self.out_edges.len() - 1
            }
        };
        if self.make_share(state, at, payload).is_none() {
            if self.out_edges[at].version != FRESH_REFERENCE {
                // The last share was folded into the reference: it can no longer be taken
                // back, so the edge no longer answers for it and starts again from zero.
                self.out_edges.swap_remove(at);
            }
            return None;
        }
        let edge = &mut self.out_edges[at];
        let weight = state.take_fraction_of_weight(f64::from(fraction));
        // x ← x − w_s·v, v = r + Q⁻¹(payload): what the receiver adds.
        let moved = self
            .coder
            .each_value(payload, Some(&edge.reference), len, |start, v| {
                state.subtract_scaled_at(start, weight, v);
            });
        debug_assert!(moved.is_ok(), "a share just encoded decodes");
        edge.last_share.clear();
        edge.last_share.extend_from_slice(payload);
        let reference = Some(edge.version);
        edge.version = step;
        edge.unconfirmed = Some(seq);
        edge.last_weight = weight;
        edge.last_used = clock;
        Some(SplitShare {
            weight,
            reference,
            codec: self.coder.codec.spec(),
        })
    }

    /// Folds out-edge `at`'s last share into its reference, then writes `Q(z − r)` into
    /// `payload`. `None` if that fails (a parameter is not finite).
    fn make_share(&mut self, state: &PushSumState, at: usize, payload: &mut Vec<u8>) -> Option<()> {
        let len = state.len();
        let edge = &mut self.out_edges[at];
        if !edge.last_share.is_empty() {
            // r ← round(r + Q⁻¹(last share)): what the receiver set its reference to.
            self.coder
                .fold(&edge.last_share, &mut edge.reference, len)
                .ok()?;
            edge.last_share.clear();
        }
        self.coder.encode_deviation(state, &edge.reference, payload)
    }

    /// Adds a share from `from` to `state`. Nothing changes on error.
    pub(crate) fn absorb(
        &mut self,
        state: &mut PushSumState,
        from: P,
        header: ShareHeader,
        payload: &[u8],
    ) -> Result<(), SgpError> {
        self.clock += 1;
        let len = state.len();
        let Some(version) = header.reference else {
            check_exact(header.codec)?;
            state.absorb_f32(header.weight, payload)?;
            let at = self.in_edge(from, len);
            let edge = &mut self.in_edges[at];
            reference_from_share(payload, header.weight, &mut edge.reference, &mut self.coder);
            edge.version = header.step;
            edge.last_used = self.clock;
            return Ok(());
        };
        self.check_codec_and_weight(header)?;
        let at = if version == FRESH_REFERENCE {
            // The sender starts this edge again from zero, whatever this end held for it.
            // Checked whole first, then applied: a refused share changes nothing.
            self.coder.check(payload, None, len)?;
            let at = self.in_edge(from, len);
            self.in_edges[at].reference.clear();
            at
        } else {
            let at = self.in_edge_at(from, version)?;
            self.coder
                .check(payload, Some(&self.in_edges[at].reference), len)?;
            at
        };
        let edge = &mut self.in_edges[at];
        let weight = header.weight;
        // x ← x + w_s·v and r ← round(v), v = r + Q⁻¹(payload), a piece at a time. The
        // bytes were just decoded whole, so they decode again.
        let moved = self
            .coder
            .each_value_storing(payload, &mut edge.reference, len, |start, v| {
                state.add_scaled_at(start, weight, v);
            });
        debug_assert!(moved.is_ok(), "a share just checked decodes");
        state.add_weight(weight);
        edge.version = header.step;
        edge.last_used = self.clock;
        Ok(())
    }

    /// Whether [`EdgeReferences::absorb`] would take a share from `from` after the shares
    /// from `from` accepted before it and not yet absorbed, the last of which has step
    /// `after`: the checks `absorb` makes, without applying anything. A share on top of
    /// an unabsorbed one is checked against no reference (its own deviation decodes and is
    /// finite): the reference it is built on exists only once the one before is absorbed.
    pub(crate) fn check_share(
        &mut self,
        state: &PushSumState,
        from: P,
        header: ShareHeader,
        payload: &[u8],
        after: Option<u64>,
    ) -> Result<(), SgpError> {
        let len = state.len();
        let Some(version) = header.reference else {
            check_exact(header.codec)?;
            return state.check_f32(header.weight, payload);
        };
        self.check_codec_and_weight(header)?;
        if version == FRESH_REFERENCE || after.is_some() {
            if after.is_some_and(|after| version != FRESH_REFERENCE && version != after) {
                return Err(SgpError::StaleReference { version });
            }
            return self.coder.check(payload, None, len);
        }
        let at = self.in_edge_at(from, version)?;
        self.coder
            .check(payload, Some(&self.in_edges[at].reference), len)
    }

    /// A quantized share's codec is this swarm's, and its weight one a share may carry.
    fn check_codec_and_weight(&self, header: ShareHeader) -> Result<(), SgpError> {
        if header.codec != self.coder.codec.spec() {
            return Err(SgpError::UnexpectedCodec {
                expected: self.coder.codec.spec(),
                got: header.codec,
            });
        }
        super::state::check_share_weight(header.weight)
    }

    /// The in-edge from `from` whose reference is at `version`: the one a share built on
    /// that version decodes against.
    fn in_edge_at(&self, from: P, version: u64) -> Result<usize, SgpError> {
        self.in_edges
            .iter()
            .position(|edge| edge.peer == from && edge.version == version)
            .ok_or(SgpError::StaleReference { version })
    }

    /// Takes back a share the transport returned from `to`, and forgets the edge.
    ///
    /// Fails, leaving `state` untouched, when the edge no longer holds the reference the
    /// share was built on (it timed out and was forgotten): that share's mass is lost.
    pub(crate) fn reclaim(
        &mut self,
        state: &mut PushSumState,
        to: P,
        header: ShareHeader,
        payload: &[u8],
    ) -> Result<(), SgpError> {
        let at = self.out_edges.iter().position(|edge| edge.peer == to);
        let Some(version) = header.reference else {
            check_exact(header.codec)?;
            state.absorb_f32(header.weight, payload)?;
            if let Some(at) = at
                && self.out_edges[at].unconfirmed == Some(header.seq)
            {
                self.out_edges.swap_remove(at);
            }
            return Ok(());
        };
        let at = at
            .filter(|&at| {
                let edge = &self.out_edges[at];
                edge.unconfirmed == Some(header.seq) && edge.version == header.step
            })
            .ok_or(SgpError::StaleReference { version })?;
        super::state::check_share_weight(header.weight)?;
        let edge = self.out_edges.swap_remove(at);
        self.coder.take_back(state, &edge, header.weight);
        Ok(())
    }

    /// Takes back the share of `step` that `to` refused after taking delivery (it did not
    /// hold the reference the share was built on), and forgets the edge, so that the next
    /// share to `to` starts it again from zero. Returns the share's sequence number if the
    /// transport has not confirmed it yet.
    ///
    /// Fails, leaving `state` untouched, unless that share is still the edge's last: a later
    /// one folded it into the reference (that one will be refused and taken back in its
    /// turn), or the edge was forgotten.
    pub(crate) fn take_back_refused(
        &mut self,
        state: &mut PushSumState,
        to: P,
        step: u64,
    ) -> Result<Option<u64>, SgpError> {
        let at = self
            .out_edges
            .iter()
            .position(|edge| edge.peer == to && edge.version == step && !edge.last_share.is_empty())
            .ok_or(SgpError::NotTakenBack { step })?;
        let edge = self.out_edges.swap_remove(at);
        self.coder.take_back(state, &edge, edge.last_weight);
        Ok(edge.unconfirmed)
    }

    /// The share `seq` to `to` was applied by its receiver: it can no longer be taken back,
    /// so it is folded into the edge's reference now and its payload freed, rather than
    /// kept until the next share (through the next step's passes, where a peer's memory
    /// peaks).
    pub(crate) fn confirm(&mut self, to: P, seq: u64) {
        let Some(at) = self
            .out_edges
            .iter()
            .position(|edge| edge.peer == to && edge.unconfirmed == Some(seq))
        else {
            return;
        };
        let edge = &mut self.out_edges[at];
        edge.unconfirmed = None;
        if edge.orphaned {
            self.out_edges.swap_remove(at);
            return;
        }
        let last_share = std::mem::take(&mut edge.last_share);
        if !last_share.is_empty() {
            let len = edge.reference.len();
            if self
                .coder
                .fold(&last_share, &mut edge.reference, len)
                .is_err()
            {
                // A payload this peer encoded decodes; if not, the edge starts again.
                self.out_edges.swap_remove(at);
            }
        }
    }

    /// The sender stopped waiting for share `seq` to `to`: forget that edge.
    pub(crate) fn expire(&mut self, to: P, seq: u64) {
        self.out_edges
            .retain(|edge| !(edge.peer == to && edge.unconfirmed == Some(seq)));
    }

    /// `peer` left the view: forget its edges, once their shares are settled.
    pub(crate) fn forget(&mut self, peer: P) {
        self.in_edges.retain(|edge| edge.peer != peer);
        self.out_edges.retain_mut(|edge| {
            if edge.peer != peer {
                return true;
            }
            edge.orphaned = true;
            edge.unconfirmed.is_some()
        });
    }

    /// Drops the least recently used settled out-edge if the table is full.
    fn make_room_out(&mut self) {
        if self.out_edges.len() < self.capacity {
            return;
        }
        if let Some(at) = self
            .out_edges
            .iter()
            .enumerate()
            .filter(|(_, edge)| edge.unconfirmed.is_none())
            .min_by_key(|(_, edge)| edge.last_used)
            .map(|(at, _)| at)
        {
            self.out_edges.swap_remove(at);
        }
    }

    /// The index of the in-edge from `from`, made (a zero reference of `len` elements) if
    /// there is none; its version and use are the caller's to set.
    fn in_edge(&mut self, from: P, len: usize) -> usize {
        if let Some(at) = self.in_edges.iter().position(|edge| edge.peer == from) {
            return at;
        }
        self.make_room_in();
        self.in_edges.push(InEdge {
            peer: from,
            version: 0,
            reference: Reference::zeros(len),
            last_used: 0,
        });
        self.in_edges.len() - 1
    }

    /// Drops the least recently used in-edge if the table is full.
    fn make_room_in(&mut self) {
        if self.in_edges.len() < self.capacity {
            return;
        }
        if let Some(at) = self
            .in_edges
            .iter()
            .enumerate()
            .min_by_key(|(_, edge)| edge.last_used)
            .map(|(at, _)| at)
        {
            self.in_edges.swap_remove(at);
        }
    }
}

/// The codec and the buffers a share is encoded and decoded with, a piece at a time.
#[derive(Debug)]
struct PieceCoder {
    codec: Codec,
    /// Elements encoded or decoded at a time: a multiple of the codec's blocks, or the
    /// whole vector for `topk`, which encodes only whole vectors.
    piece: usize,
    /// One piece of `z − r`, or of a decoded `v`.
    scratch: Vec<f32>,
    /// One piece's encoding.
    piece_bytes: Vec<u8>,
}

impl PieceCoder {
    fn new(codec: Codec, len: usize) -> PieceCoder {
        // Pieces start on the codec's blocks and on the reference's.
        let piece = match codec.piece_alignment() {
            Some(align) => PIECE_ELEMENTS
                .next_multiple_of(least_common_multiple(align, REFERENCE_BLOCK))
                .min(len),
            None => len,
        }
        .max(1);
        PieceCoder {
            codec,
            piece,
            scratch: vec![0.0; piece],
            piece_bytes: Vec::new(),
        }
    }

    /// Writes `Q(z − r)` into `payload`, `z` the de-biased parameters, a piece at a time.
    /// `None` if an element is not finite.
    fn encode_deviation(
        &mut self,
        state: &PushSumState,
        reference: &Reference,
        payload: &mut Vec<u8>,
    ) -> Option<()> {
        let len = state.len();
        let debias = Debias::new(state.weight());
        let numerator = state.numerator();
        payload.clear();
        payload.resize(self.codec.max_encoded_len(len), 0);
        for start in (0..len).step_by(self.piece) {
            let end = (start + self.piece).min(len);
            let piece = &mut self.scratch[..end - start];
            reference.read_into(start, piece);
            // z − r, with z rounded to f32 first, as `PushSumState::debiased_into` rounds it.
            for (d, &x) in piece.iter_mut().zip(&numerator[start..end]) {
                *d = debias.apply(x) - *d;
            }
            if piece.len() == len {
                // `topk` (or a vector of one piece): the whole vector at once.
                let encoded = self.codec.encode(piece, payload).ok()?;
                payload.truncate(encoded);
                return Some(());
            }
            self.codec
                .encode_piece(piece, start, len, payload, &mut self.piece_bytes)
                .ok()?;
        }
        Some(())
    }

    /// Hands `each` every piece of `v = r + Q⁻¹(payload)` in order, with its start (`r =
    /// None`: the zero reference of a fresh edge).
    fn each_value(
        &mut self,
        payload: &[u8],
        reference: Option<&Reference>,
        len: usize,
        mut each: impl FnMut(usize, &[f32]),
    ) -> Result<(), CodecError> {
        for start in (0..len).step_by(self.piece) {
            let v = self.value(payload, reference, (start, len))?;
            each(start, v);
        }
        Ok(())
    }

    /// [`PieceCoder::each_value`], then `r ← round(v)` a piece at a time.
    fn each_value_storing(
        &mut self,
        payload: &[u8],
        reference: &mut Reference,
        len: usize,
        mut each: impl FnMut(usize, &[f32]),
    ) -> Result<(), CodecError> {
        for start in (0..len).step_by(self.piece) {
            let v = self.value(payload, Some(reference), (start, len))?;
            each(start, v);
            reference.store(start, v);
        }
        Ok(())
    }

    /// `r ← round(r + Q⁻¹(payload))`.
    fn fold(
        &mut self,
        payload: &[u8],
        reference: &mut Reference,
        len: usize,
    ) -> Result<(), CodecError> {
        self.each_value_storing(payload, reference, len, |_, _| {})
    }

    /// Whether `v = r + Q⁻¹(payload)` decodes and is finite everywhere.
    fn check(
        &mut self,
        payload: &[u8],
        reference: Option<&Reference>,
        len: usize,
    ) -> Result<(), SgpError> {
        let mut finite = true;
        self.each_value(payload, reference, len, |_, v| {
            finite &= v.iter().all(|v| v.is_finite());
        })
        .map_err(|error| SgpError::BadPayload(error.to_string()))?;
        if finite {
            Ok(())
        } else {
            Err(SgpError::NonFinitePayload)
        }
    }

    /// Adds `weight · v` of out-edge `edge`'s last share back to `state`: the vector its
    /// split subtracted, bit for bit.
    fn take_back<P>(&mut self, state: &mut PushSumState, edge: &OutEdge<P>, weight: f64) {
        let len = state.len();
        // An edge's version names its last share only while it holds that share's payload
        // (a share that fails to fold or encode drops the edge).
        debug_assert!(!edge.last_share.is_empty(), "a share to take back");
        let moved = self.each_value(&edge.last_share, Some(&edge.reference), len, |start, v| {
            state.add_scaled_at(start, weight, v);
        });
        debug_assert!(moved.is_ok(), "a share this peer encoded decodes");
        state.add_weight(weight);
    }

    /// Piece `start..` of `r + Q⁻¹(payload)`, in the scratch buffer.
    fn value(
        &mut self,
        payload: &[u8],
        reference: Option<&Reference>,
        (start, len): (usize, usize),
    ) -> Result<&[f32], CodecError> {
        let end = (start + self.piece).min(len);
        let v = &mut self.scratch[..end - start];
        match reference {
            Some(reference) => reference.read_into(start, v),
            None => v.fill(0.0),
        }
        if v.len() == len {
            // A `topk` share's only piece: the whole vector's decode.
            self.codec.decode_accumulate(payload, 1.0, v)?;
        } else {
            self.codec.decode_accumulate_piece(
                payload,
                (start, len),
                1.0,
                v,
                &mut self.piece_bytes,
            )?;
        }
        Ok(v)
    }
}

fn least_common_multiple(a: usize, b: usize) -> usize {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
}

/// An exact share must say so: `f32`, no reference.
fn check_exact(codec: CodecSpec) -> Result<(), SgpError> {
    if codec == CodecSpec::F32 {
        Ok(())
    } else {
        Err(SgpError::UnexpectedCodec {
            expected: CodecSpec::F32,
            got: codec,
        })
    }
}

/// `r_k = s_k / w_s` rounded to 16 bits, computed the same way at both ends of the edge.
fn reference_from_share(
    payload: &[u8],
    weight: f64,
    reference: &mut Reference,
    coder: &mut PieceCoder,
) {
    let debias = Debias::new(weight);
    let len = payload.len() / F32_BYTES;
    for start in (0..len).step_by(coder.piece) {
        let end = (start + coder.piece).min(len);
        let piece = &mut coder.scratch[..end - start];
        let bytes = &payload[start * F32_BYTES..end * F32_BYTES];
        for (r, bytes) in piece.iter_mut().zip(bytes.chunks_exact(F32_BYTES)) {
            *r = debias.apply(f32_from_le(bytes));
        }
        reference.store(start, piece);
    }
}
