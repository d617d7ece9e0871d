//! The reducer's side of a butterfly round: summing every member's copy of one part.

use murmur_protocol::codec::Codec;

use crate::Time;

use super::clip::{ChunkRows, ClipScratch, centered_clip};
use super::config::ClipConfig;
use super::error::ButterflyError;
use super::group::ChunkLayout;

/// What the reducer knows about one sender of its part.
#[derive(Debug, Clone, Copy)]
struct Sender {
    delivered: u32,
    last_seen: Time,
    dropped: bool,
}

/// Contributions kept whole for CenteredClip: `members × part` elements.
#[derive(Debug)]
struct ClipBuffers {
    config: ClipConfig,
    rows: Vec<f32>,
    /// `members × chunks` weights.
    weights: Vec<f32>,
    included: Vec<usize>,
    chunk_weights: Vec<f32>,
    scratch: ClipScratch,
    /// Contributions set aside as outliers, summed over chunks.
    rejected: u64,
}

/// The running reduction of the part this member reduces.
///
/// Per chunk it tracks which senders delivered, how many and with what total weight; a
/// chunk is final once every sender has either delivered it or been dropped. Without
/// clipping it holds one weighted sum per element; with clipping, every contribution.
#[derive(Debug)]
pub(crate) struct Reduction {
    layout: ChunkLayout,
    members: usize,
    words: usize,
    delivered: Vec<u64>,
    contributors: Vec<u32>,
    weights: Vec<f64>,
    finalized: Vec<bool>,
    pending: usize,
    senders: Vec<Sender>,
    sum: Vec<f32>,
    /// A final chunk's sums are replaced by its averages, to be sent from there
    /// ([`Reduction::keeping_averages`]).
    averages_in_sum: bool,
    clip: Option<ClipBuffers>,
    /// Each member's weight as it counts: what it declared on its first chunk, bounded.
    counted: Vec<Option<f32>>,
    /// A member's weight counts at most this many times the median weight declared so
    /// far; 0 = no bound.
    weight_cap: f32,
    /// Weights declared so far, for their median.
    declared: Vec<f32>,
    /// Senders whose declared weight the bound cut, this round.
    weights_capped: u32,
    /// This member's index, whose row clipping keeps ([`Reduction::begin_with_local`]).
    own: usize,
}

impl Reduction {
    /// A reduction of the part `layout` names among `members` senders, its sums kept in
    /// `sum` (memory from an earlier round; its contents are overwritten).
    pub(crate) fn new(
        layout: ChunkLayout,
        members: usize,
        clip: Option<ClipConfig>,
        weight_cap: f32,
        now: Time,
        mut sum: Vec<f32>,
    ) -> Reduction {
        let chunks = layout.chunks();
        let words = members.div_ceil(64);
        let clip = clip.map(|config| ClipBuffers {
            config,
            rows: vec![0.0; members * layout.len()],
            weights: vec![0.0; members * chunks],
            included: Vec::with_capacity(members),
            chunk_weights: Vec::with_capacity(members),
            scratch: ClipScratch::default(),
            rejected: 0,
        });
        // No zeroing: `begin_with_local` writes every sum before anything is added to it.
        if clip.is_some() {
            sum.clear();
        } else {
            // Grown to the part, not doubled: memory kept from a smaller part would
            // otherwise reach the whole vector's capacity, which the engine takes for its
            // gradient buffer lent to the round (`RoundEngine::take_back_sums`).
            sum.reserve_exact(layout.len().saturating_sub(sum.len()));
            sum.resize(layout.len(), 0.0);
        }
        Reduction {
            sum,
            averages_in_sum: false,
            delivered: vec![0; chunks * words],
            contributors: vec![0; chunks],
            weights: vec![0.0; chunks],
            finalized: vec![false; chunks],
            pending: chunks,
            senders: vec![
                Sender {
                    delivered: 0,
                    last_seen: now,
                    dropped: false,
                };
                members
            ],
            layout,
            members,
            words,
            clip,
            counted: vec![None; members],
            weight_cap,
            declared: Vec::with_capacity(members),
            weights_capped: 0,
            own: 0,
        }
    }

    /// Has each final chunk's sums replaced by its averages, exactly as they are written
    /// into the member's part, so that they can be sent from the sums' memory
    /// ([`Reduction::averages`]); without clipping only (clipping keeps no sums). Returns
    /// whether it does.
    pub(crate) fn keeping_averages(&mut self) -> bool {
        self.averages_in_sum = self.clip.is_none();
        self.averages_in_sum
    }

    /// The averages of final chunk `chunk`, when [`Reduction::keeping_averages`] holds.
    pub(crate) fn averages(&self, chunk: usize) -> &[f32] {
        &self.sum[self.layout.local(chunk)]
    }

    /// Senders whose declared weight was cut to the bound this round.
    pub(crate) fn weights_capped(&self) -> u32 {
        self.weights_capped
    }

    /// The weight `sender`'s chunks count with: the weight it declared on its first chunk
    /// (a sender cannot change it mid-round), at most `weight_cap` times the lower median
    /// of the weights declared so far, this member's own included. A sender that inflates
    /// its samples so buys no more influence than the bound allows.
    fn counted_weight(&self, sender: usize, declared: f32) -> (f32, bool) {
        if let Some(counted) = self.counted[sender] {
            return (counted, false);
        }
        if self.weight_cap <= 0.0 {
            return (declared, false);
        }
        let mut sorted = self.declared.clone();
        sorted.push(declared);
        sorted.sort_by(f32::total_cmp);
        let median = sorted[(sorted.len() - 1) / 2];
        let bound = self.weight_cap * median;
        if median > 0.0 && declared > bound {
            (bound, true)
        } else {
            (declared, false)
        }
    }

    /// Notes the weight `sender` declared and the weight it counts with, once.
    fn note_weight(&mut self, sender: usize, declared: f32, counted: f32, capped: bool) {
        if self.counted[sender].is_none() {
            self.counted[sender] = Some(counted);
            self.declared.push(declared);
            self.weights_capped += u32::from(capped);
        }
    }

    /// Contributions CenteredClip set aside as outliers so far, summed over chunks.
    pub(crate) fn contributions_rejected(&self) -> u64 {
        self.clip.as_ref().map_or(0, |clip| clip.rejected)
    }

    pub(crate) fn layout(&self) -> &ChunkLayout {
        &self.layout
    }

    /// Whether every chunk is final.
    pub(crate) fn is_complete(&self) -> bool {
        self.pending == 0
    }

    pub(crate) fn coverage(&self, chunk: usize) -> (u32, f32) {
        (self.contributors[chunk], self.weights[chunk] as f32)
    }

    /// The sums' memory, for the next round.
    pub(crate) fn into_sum(self) -> Vec<f32> {
        self.sum
    }

    /// The sums' memory, to take it out of a finished reduction.
    pub(crate) fn sum_mut(&mut self) -> &mut Vec<f32> {
        &mut self.sum
    }

    /// Starts the reduction with this member's own copy of the part, exactly. Comes first:
    /// it sets every sum rather than adding to it.
    pub(crate) fn begin_with_local(&mut self, me: usize, part: &[f32], weight: f32) {
        self.own = me;
        let declared = weight;
        let (weight, capped) = self.counted_weight(me, declared);
        self.note_weight(me, declared, weight, capped);
        for chunk in 0..self.layout.chunks() {
            let range = self.layout.local(chunk);
            match &mut self.clip {
                Some(clip) => {
                    let row = me * self.layout.len();
                    clip.rows[row + range.start..row + range.end].copy_from_slice(&part[range]);
                    clip.weights[me * self.finalized.len() + chunk] = weight;
                }
                None => {
                    for (s, x) in self.sum[range.clone()].iter_mut().zip(&part[range]) {
                        *s = weight * x;
                    }
                }
            }
            self.mark(me, chunk, weight);
        }
    }

    /// Decode-accumulates a sender's chunk. Returns whether it was taken: a chunk from a
    /// dropped sender, or one already received, is ignored. On error nothing changes.
    pub(crate) fn accept(
        &mut self,
        codec: &mut Codec,
        sender: usize,
        chunk: usize,
        weight: f32,
        payload: &[u8],
        now: Time,
    ) -> Result<bool, ButterflyError> {
        if self.senders[sender].dropped || self.finalized[chunk] || self.has(sender, chunk) {
            return Ok(false);
        }
        let declared = weight;
        let (weight, capped) = self.counted_weight(sender, declared);
        let range = self.layout.local(chunk);
        match &mut self.clip {
            Some(clip) => {
                let row = sender * self.layout.len();
                codec.decode_into(payload, &mut clip.rows[row + range.start..row + range.end])?;
                clip.weights[sender * self.finalized.len() + chunk] = weight;
            }
            None => codec.decode_accumulate(payload, weight, &mut self.sum[range])?,
        }
        self.note_weight(sender, declared, weight, capped);
        self.mark(sender, chunk, weight);
        let state = &mut self.senders[sender];
        state.last_seen = now;
        Ok(true)
    }

    /// Stops waiting for `sender`; chunks it did deliver keep its contribution. Returns
    /// whether it had chunks outstanding.
    pub(crate) fn drop_sender(&mut self, sender: usize) -> bool {
        let state = &mut self.senders[sender];
        if state.dropped || state.delivered as usize == self.finalized.len() {
            return false;
        }
        state.dropped = true;
        true
    }

    /// When the earliest silent sender should be dropped, skipping `me`.
    pub(crate) fn next_deadline(&self, me: usize, timeout: std::time::Duration) -> Option<Time> {
        if self.is_complete() {
            return None;
        }
        self.waited_on(me)
            .map(|s| self.senders[s].last_seen + timeout)
            .min()
    }

    /// Senders still owing chunks whose last chunk is older than `timeout` at `now`.
    pub(crate) fn silent_senders(
        &self,
        me: usize,
        now: Time,
        timeout: std::time::Duration,
    ) -> impl Iterator<Item = usize> + '_ {
        self.waited_on(me)
            .filter(move |&s| self.senders[s].last_seen + timeout <= now)
    }

    /// Finalises every chunk that no sender still owes, writing the averages into `part`
    /// (the part's slice of this member's vector, which holds its own values until then)
    /// and appending chunk indices to `ready`; returns the squared distance the averages
    /// moved the part.
    pub(crate) fn finalize_ready(&mut self, part: &mut [f32], ready: &mut Vec<u32>) -> f64 {
        let mut moved = 0.0;
        for chunk in 0..self.finalized.len() {
            if !self.finalized[chunk] && self.owed_by_nobody(chunk) {
                moved += self.finalize(chunk, part);
                ready.push(chunk as u32);
            }
        }
        moved
    }

    /// Finalises `chunk` if no sender still owes it, in `part` as
    /// [`Reduction::finalize_ready`] does; returns the squared distance it moved the
    /// chunk, or `None` if it did not finalise it.
    pub(crate) fn try_finalize(&mut self, chunk: usize, part: &mut [f32]) -> Option<f64> {
        if self.finalized[chunk] || !self.owed_by_nobody(chunk) {
            return None;
        }
        Some(self.finalize(chunk, part))
    }

    /// Writes `chunk`'s average over this member's own values in `part`; returns the
    /// squared distance between them.
    fn finalize(&mut self, chunk: usize, part: &mut [f32]) -> f64 {
        let range = self.layout.local(chunk);
        let total = self.weights[chunk];
        let out = &mut part[range.clone()];
        let mut moved = 0.0;
        match &mut self.clip {
            Some(clip) => {
                clip.included.clear();
                clip.chunk_weights.clear();
                let chunks = self.finalized.len();
                for sender in 0..self.members {
                    let word = self.delivered[chunk * self.words + sender / 64];
                    if word & (1 << (sender % 64)) != 0 {
                        clip.included.push(sender);
                    }
                    clip.chunk_weights
                        .push(clip.weights[sender * chunks + chunk]);
                }
                let rows = ChunkRows {
                    data: &clip.rows,
                    stride: self.layout.len(),
                    start: range.start,
                    len: range.len(),
                };
                let tau = clip.config.tau * (range.len() as f32).sqrt();
                clip.rejected += centered_clip(
                    rows,
                    &clip.included,
                    &clip.chunk_weights,
                    tau,
                    clip.config.iterations,
                    clip.config.reject_factor,
                    &mut clip.scratch,
                    out,
                ) as u64;
                // This member's own values are its row among the contributions.
                let own = &clip.rows[self.own * self.layout.len()..][range];
                moved = squared_distance(out, own);
            }
            None if total > 0.0 => {
                let scale = (1.0 / total) as f32;
                let keep = self.averages_in_sum;
                for (o, s) in out.iter_mut().zip(&mut self.sum[range]) {
                    let average = *s * scale;
                    moved += f64::from(average - *o).powi(2);
                    *o = average;
                    if keep {
                        *s = average;
                    }
                }
            }
            // Nothing with weight arrived: the part keeps this member's values.
            None => {
                if self.averages_in_sum {
                    self.sum[range].copy_from_slice(out);
                }
            }
        }
        self.finalized[chunk] = true;
        self.pending -= 1;
        moved
    }

    fn waited_on(&self, me: usize) -> impl Iterator<Item = usize> + '_ {
        let chunks = self.finalized.len();
        (0..self.members).filter(move |&s| {
            let state = &self.senders[s];
            s != me && !state.dropped && (state.delivered as usize) < chunks
        })
    }

    fn owed_by_nobody(&self, chunk: usize) -> bool {
        (0..self.members).all(|s| self.senders[s].dropped || self.has(s, chunk))
    }

    fn has(&self, sender: usize, chunk: usize) -> bool {
        self.delivered[chunk * self.words + sender / 64] & (1 << (sender % 64)) != 0
    }

    fn mark(&mut self, sender: usize, chunk: usize, weight: f32) {
        self.delivered[chunk * self.words + sender / 64] |= 1 << (sender % 64);
        self.contributors[chunk] += 1;
        self.weights[chunk] += f64::from(weight);
        self.senders[sender].delivered += 1;
    }
}

/// The squared L2 distance between `a` and `b`.
pub(crate) fn squared_distance(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part larger than the memory kept for its sums grows that memory to the part's
    /// length. Grown the amortized way it doubled: sums kept from a part of half the vector
    /// reached the whole vector's capacity, which the engine takes for a gradient buffer it
    /// lent (`RoundEngine::take_back_sums`). Fails at 1000 with `resize` alone.
    #[test]
    fn sums_grow_to_the_part_and_no_further() {
        let kept = Vec::with_capacity(500);
        let reduction = Reduction::new(
            ChunkLayout::new(0..600, 100),
            2,
            None,
            f32::MAX,
            Time::ZERO,
            kept,
        );
        assert_eq!(reduction.into_sum().capacity(), 600);
    }
}
