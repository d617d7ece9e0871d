//! Sizing the parts of a butterfly all-reduce by bandwidth.
//!
//! # The cost model
//!
//! A group of `N` members averages a vector of `S` bytes; member `i` reduces the fraction
//! `f_i` of it and has bandwidth `B_i` in each direction. In the reduce-scatter member `i`
//! uploads its copy of every other part, `(1 − f_i)·S`, and downloads everyone else's copy
//! of its own part, `(N − 1)·f_i·S`. The all-gather mirrors this: it uploads its averaged
//! part to the `N − 1` others and downloads the rest. With chunks pipelined the two phases
//! overlap, so each direction of its link carries `S·(1 + (N − 2)·f_i)` bytes and member
//! `i` needs about
//!
//! ```text
//! t_i = S·(1 + (N − 2)·f_i) / B_i
//! ```
//!
//! The round lasts as long as its slowest member, so the parts minimise `max_i t_i` subject
//! to `Σ f_i = 1` and `f_i ≥ 0`, with `f_i = 0` for members that cannot accept connections.
//!
//! # The solution
//!
//! Every member pays at least `S / B_i` (its own copy goes out, the average comes back), so
//! the fractions only decide how the `(N − 2)·S` bytes of reduction traffic are shared.
//! Equalising the times of the members that reduce something gives, for a set `A` of
//! reducers, `f_i = (T·B_i / S − 1) / (N − 2)` with the common time
//! `T = S·(N − 2 + |A|) / Σ_{i∈A} B_i`. A member whose equalised share would be negative
//! is too slow to help: it gets no part, and `T` is solved again without it (water-filling;
//! at most `N` passes). The result minimises the slowest member's time, and among the
//! reducers no member is slower than it must be. With `N ≤ 2` the fractions do not change
//! any member's time and the parts are split in proportion to bandwidth.
//!
//! Fractions become contiguous element ranges in units of the chunk size, so that every
//! chunk, and with it every codec block, starts on a multiple of the chunk size.

use std::ops::Range;

use super::error::ButterflyError;

/// What the partitioner needs to know about one member's link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemberLink {
    /// Bandwidth in bytes per second, in each direction.
    pub bandwidth: f64,
    /// Whether other members can open connections to it. One that cannot reduces nothing.
    pub accepts_connections: bool,
}

/// The fraction of the vector each member should reduce to minimise the slowest member's
/// time (see the [module docs](self)).
///
/// Members with no bandwidth or no inbound connections get 0. Fails when no member can
/// reduce.
pub fn optimal_fractions(links: &[MemberLink]) -> Result<Vec<f64>, ButterflyError> {
    let can_reduce = |link: &MemberLink| {
        link.accepts_connections && link.bandwidth.is_finite() && link.bandwidth > 0.0
    };
    let mut active: Vec<bool> = links.iter().map(can_reduce).collect();
    if !active.iter().any(|&a| a) {
        return Err(ButterflyError::NoReducer);
    }
    let n = links.len() as f64;
    let mut fractions = vec![0.0; links.len()];
    if links.len() <= 2 {
        let total: f64 = links
            .iter()
            .zip(&active)
            .filter(|(_, a)| **a)
            .map(|(l, _)| l.bandwidth)
            .sum();
        for ((f, link), a) in fractions.iter_mut().zip(links).zip(&active) {
            if *a {
                *f = link.bandwidth / total;
            }
        }
        return Ok(fractions);
    }
    // Water-filling: each pass either keeps every active member or drops at least one.
    let mut time = 0.0;
    for _ in 0..links.len() {
        let count = active.iter().filter(|&&a| a).count() as f64;
        let bandwidth: f64 = links
            .iter()
            .zip(&active)
            .filter(|(_, a)| **a)
            .map(|(l, _)| l.bandwidth)
            .sum();
        // In units of S = 1.
        time = (n - 2.0 + count) / bandwidth;
        let mut dropped = false;
        for (a, link) in active.iter_mut().zip(links) {
            if *a && time * link.bandwidth < 1.0 {
                *a = false;
                dropped = true;
            }
        }
        if !dropped {
            break;
        }
    }
    for ((f, link), a) in fractions.iter_mut().zip(links).zip(&active) {
        if *a {
            *f = (time * link.bandwidth - 1.0) / (n - 2.0);
        }
    }
    // The equalised shares sum to 1 up to rounding; make it exact for the caller.
    let sum: f64 = fractions.iter().sum();
    fractions.iter_mut().for_each(|f| *f /= sum);
    Ok(fractions)
}

/// The cost model's time for every member, in seconds, to average `bytes` bytes with these
/// fractions: `S·(1 + (N − 2)·f_i) / B_i`.
pub fn member_times(bytes: f64, links: &[MemberLink], fractions: &[f64]) -> Vec<f64> {
    let n = links.len() as f64;
    links
        .iter()
        .zip(fractions)
        .map(|(link, f)| bytes * (1.0 + (n - 2.0) * f) / link.bandwidth)
        .collect()
}

/// The slowest member's time under the cost model: what [`optimal_fractions`] minimises.
pub fn round_time(bytes: f64, links: &[MemberLink], fractions: &[f64]) -> f64 {
    member_times(bytes, links, fractions)
        .into_iter()
        .fold(0.0, f64::max)
}

/// How a flat vector is split into one contiguous part per member, in member order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// `parts + 1` boundaries, from 0 to the vector's length, never decreasing.
    bounds: Vec<usize>,
}

impl Partition {
    /// Parts of the given sizes, in order, as a `GroupBegin` lists them.
    pub fn from_sizes(sizes: impl IntoIterator<Item = usize>) -> Result<Partition, ButterflyError> {
        let mut bounds = vec![0];
        let mut end = 0usize;
        for size in sizes {
            end = end.checked_add(size).ok_or(ButterflyError::InvalidGroup {
                reason: "part sizes overflow",
            })?;
            bounds.push(end);
        }
        if bounds.len() < 2 {
            return Err(ButterflyError::InvalidGroup {
                reason: "a partition has at least one part",
            });
        }
        Ok(Partition { bounds })
    }

    /// Splits `len` elements by `fractions`, in units of `align` elements (the last part
    /// that is not empty takes the remainder). Units are handed out by largest remainder,
    /// so a member with fraction 0 gets nothing.
    pub fn from_fractions(
        len: usize,
        fractions: &[f64],
        align: usize,
    ) -> Result<Partition, ButterflyError> {
        if fractions.is_empty() || align == 0 {
            return Err(ButterflyError::InvalidGroup {
                reason: "a partition needs at least one part and a non-zero alignment",
            });
        }
        let sum: f64 = fractions.iter().sum();
        if !(sum.is_finite() && sum > 0.0) || fractions.iter().any(|f| f.is_nan() || *f < 0.0) {
            return Err(ButterflyError::InvalidGroup {
                reason: "fractions must be non-negative with a positive sum",
            });
        }
        let units = len.div_ceil(align);
        let exact: Vec<f64> = fractions.iter().map(|f| f / sum * units as f64).collect();
        let mut given: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
        let mut left = units.saturating_sub(given.iter().sum());
        let mut order: Vec<usize> = (0..fractions.len()).collect();
        // Largest remainder first; ties to the lower index, so every member computes the
        // same partition.
        order.sort_by(|&a, &b| {
            let (ra, rb) = (exact[a] - given[a] as f64, exact[b] - given[b] as f64);
            rb.total_cmp(&ra).then(a.cmp(&b))
        });
        for &i in order.iter().cycle().take(units) {
            if left == 0 {
                break;
            }
            if exact[i] > 0.0 {
                given[i] += 1;
                left -= 1;
            }
        }
        let mut bounds = Vec::with_capacity(fractions.len() + 1);
        bounds.push(0);
        let mut end_units = 0;
        for g in given {
            end_units += g;
            bounds.push((end_units * align).min(len));
        }
        Ok(Partition { bounds })
    }

    /// Equal parts (up to alignment): the baseline that bandwidth-aware sizing beats.
    pub fn equal(len: usize, parts: usize, align: usize) -> Result<Partition, ButterflyError> {
        Partition::from_fractions(len, &vec![1.0; parts], align)
    }

    /// Number of parts (members).
    pub fn parts(&self) -> usize {
        self.bounds.len() - 1
    }

    /// Elements the parts cover together.
    pub fn len(&self) -> usize {
        self.bounds[self.bounds.len() - 1]
    }

    /// Whether the parts cover no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements of part `part`; empty for a part past the end.
    pub fn range(&self, part: usize) -> Range<usize> {
        match (self.bounds.get(part), self.bounds.get(part + 1)) {
            (Some(&start), Some(&end)) => start..end,
            _ => 0..0,
        }
    }

    /// Elements in each part, in order.
    pub fn sizes(&self) -> impl Iterator<Item = usize> + '_ {
        self.bounds.windows(2).map(|w| w[1] - w[0])
    }

    /// The fraction of the vector in each part.
    pub fn fractions(&self) -> Vec<f64> {
        let len = self.len().max(1) as f64;
        self.sizes().map(|s| s as f64 / len).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{MemberLink, Partition, optimal_fractions, round_time};

    fn links(bandwidths: &[f64]) -> Vec<MemberLink> {
        bandwidths
            .iter()
            .map(|&bandwidth| MemberLink {
                bandwidth,
                accepts_connections: true,
            })
            .collect()
    }

    #[test]
    fn equal_bandwidths_get_equal_parts() {
        let f = optimal_fractions(&links(&[5.0; 8])).expect("reducers exist");
        assert!(f.iter().all(|x| (x - 0.125).abs() < 1e-12), "{f:?}");
    }

    #[test]
    fn reducers_finish_together_and_slow_members_reduce_nothing() {
        let l = links(&[1.0, 2.0, 4.0, 8.0]);
        let f = optimal_fractions(&l).expect("reducers exist");
        assert_eq!(&f[..2], &[0.0, 0.0]);
        assert!((f[2] - 1.0 / 6.0).abs() < 1e-12 && (f[3] - 5.0 / 6.0).abs() < 1e-12);
        // The slowest member's own traffic bounds the round: S / B_min.
        assert!((round_time(1.0, &l, &f) - 1.0).abs() < 1e-12);
        let equal = vec![0.25; 4];
        assert!((round_time(1.0, &l, &equal) - 1.5).abs() < 1e-12);
    }

    #[test]
    fn no_fraction_can_lower_the_slowest_time() {
        // Against a grid of alternatives on three members, the optimum is never beaten.
        let l = links(&[3.0, 1.0, 2.0]);
        let best = round_time(1.0, &l, &optimal_fractions(&l).expect("reducers exist"));
        for a in 0..=20 {
            for b in 0..=(20 - a) {
                let f = [a as f64 / 20.0, b as f64 / 20.0, (20 - a - b) as f64 / 20.0];
                assert!(
                    round_time(1.0, &l, &f) >= best - 1e-12,
                    "{f:?} beats the optimum"
                );
            }
        }
    }

    #[test]
    fn members_without_inbound_connections_get_no_part() {
        let mut l = links(&[8.0, 8.0, 1.0]);
        l[0].accepts_connections = false;
        let f = optimal_fractions(&l).expect("reducers exist");
        assert_eq!(f[0], 0.0);
        assert!((f.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        l.iter_mut().for_each(|m| m.accepts_connections = false);
        assert!(optimal_fractions(&l).is_err());
    }

    #[test]
    fn parts_are_aligned_cover_the_vector_and_follow_the_fractions() {
        let p = Partition::from_fractions(1000, &[0.0, 0.5, 0.25, 0.25], 64).expect("valid");
        assert_eq!(p.parts(), 4);
        assert_eq!(p.len(), 1000);
        assert_eq!(p.range(0), 0..0);
        for part in 0..4 {
            assert_eq!(p.range(part).start % 64, 0);
        }
        let sizes: Vec<usize> = p.sizes().collect();
        assert_eq!(sizes.iter().sum::<usize>(), 1000);
        assert!(sizes[1] >= 448 && sizes[1] <= 576, "{sizes:?}");
    }
}
