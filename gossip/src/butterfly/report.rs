//! What a butterfly round achieved: which element ranges were averaged over how many peers.

use std::ops::Range;

use crate::{PeerKey, Time};

/// How one part of the vector ended up at this member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartOutcome {
    /// Every chunk of the part holds its reducer's average.
    Averaged,
    /// The reducer fell silent: the part's chunks whose average had not come keep this
    /// member's local values (the averages that came are kept).
    LocalFallback,
    /// The part holds no element.
    Empty,
}

/// The average behind one chunk of the result.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkCoverage {
    /// The chunk's elements in the flat vector.
    pub elements: Range<usize>,
    /// Members whose contribution the value averages (1 for local values).
    pub contributors: u32,
    /// The sum of their weights (samples).
    pub total_weight: f32,
    /// Whether the chunk kept this member's local values: its reducer fell silent before
    /// its average came.
    pub local: bool,
}

/// The coverage of one part.
#[derive(Debug, Clone, PartialEq)]
pub struct PartCoverage<P> {
    /// The part's index, which is also its reducer's index in the group.
    pub part: usize,
    /// The member that reduces it.
    pub reducer: P,
    /// The part's elements in the flat vector.
    pub elements: Range<usize>,
    /// Whether it was averaged or kept local.
    pub outcome: PartOutcome,
    /// One entry per chunk, in order.
    pub chunks: Vec<ChunkCoverage>,
}

/// A contiguous element range with the same coverage, merged across chunks and parts.
#[derive(Debug, Clone, PartialEq)]
pub struct CoverageRange {
    /// The elements.
    pub elements: Range<usize>,
    /// Members whose contribution the range averages (1 for local values).
    pub contributors: u32,
    /// The sum of their weights.
    pub total_weight: f32,
    /// Whether the values are local because the reducer fell silent.
    pub local_fallback: bool,
}

/// A member's account of one butterfly round, produced when its result is complete.
#[derive(Debug, Clone, PartialEq)]
pub struct CoverageReport<P> {
    /// The all-reduce this report is about.
    pub group_id: u64,
    /// When the result was complete.
    pub finished_at: Time,
    /// Every part, in order.
    pub parts: Vec<PartCoverage<P>>,
    /// Senders that this member, as a reducer, stopped waiting for (sender timeout or lost
    /// connection) before they had sent all of its part.
    pub dropped_senders: Vec<P>,
}

impl<P: PeerKey> CoverageReport<P> {
    /// Reducers whose parts kept local values.
    pub fn fallback_reducers(&self) -> Vec<P> {
        self.parts
            .iter()
            .filter(|p| p.outcome == PartOutcome::LocalFallback)
            .map(|p| p.reducer)
            .collect()
    }

    /// Coverage as maximal ranges of equal contributors, weight and fallback.
    pub fn ranges(&self) -> Vec<CoverageRange> {
        let mut merged: Vec<CoverageRange> = Vec::new();
        for part in &self.parts {
            for chunk in &part.chunks {
                let local_fallback = chunk.local;
                match merged.last_mut() {
                    Some(last)
                        if last.elements.end == chunk.elements.start
                            && last.contributors == chunk.contributors
                            && last.total_weight == chunk.total_weight
                            && last.local_fallback == local_fallback =>
                    {
                        last.elements.end = chunk.elements.end;
                    }
                    _ => merged.push(CoverageRange {
                        elements: chunk.elements.clone(),
                        contributors: chunk.contributors,
                        total_weight: chunk.total_weight,
                        local_fallback,
                    }),
                }
            }
        }
        merged
    }

    /// The fraction of the vector averaged over at least `contributors` members (local
    /// fallbacks count as one).
    pub fn fraction_covered_by(&self, contributors: u32) -> f64 {
        let total: usize = self.parts.iter().map(|p| p.elements.len()).sum();
        if total == 0 {
            return 1.0;
        }
        let covered: usize = self
            .parts
            .iter()
            .flat_map(|p| p.chunks.iter())
            .filter(|c| c.contributors >= contributors)
            .map(|c| c.elements.len())
            .sum();
        covered as f64 / total as f64
    }

    /// The coverage of the chunk holding `element`.
    pub fn chunk_at(&self, element: usize) -> Option<&ChunkCoverage> {
        self.parts
            .iter()
            .find(|p| p.elements.contains(&element))?
            .chunks
            .iter()
            .find(|c| c.elements.contains(&element))
    }
}
