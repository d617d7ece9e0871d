//! The time-varying directed exponential graph that picks each step's out-peers.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How many out-peers a step sends to (`averaging.sgp.out_degree`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutDegree {
    /// `⌈L / 2⌉` in a view of `L` levels (see [`ExponentialGraph`]): a step covers half the
    /// powers of two, so every offset comes round within two steps at any swarm size. One
    /// out-peer up to 4 peers, two up to 16, three up to 64.
    Auto,
    /// This many (at most the view's number of levels).
    Fixed(usize),
}

impl OutDegree {
    /// The out-degree in a view with `levels` distinct powers of two below its size.
    fn at(self, levels: usize) -> usize {
        let wanted = match self {
            OutDegree::Auto => levels.div_ceil(2),
            OutDegree::Fixed(degree) => degree,
        };
        wanted.max(1).min(levels)
    }
}

impl fmt::Display for OutDegree {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutDegree::Auto => f.write_str("auto"),
            OutDegree::Fixed(degree) => write!(f, "{degree}"),
        }
    }
}

impl Serialize for OutDegree {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            OutDegree::Auto => serializer.serialize_str("auto"),
            OutDegree::Fixed(degree) => serializer.serialize_u64(*degree as u64),
        }
    }
}

impl<'de> Deserialize<'de> for OutDegree {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<OutDegree, D::Error> {
        deserializer.deserialize_any(OutDegreeVisitor)
    }
}

struct OutDegreeVisitor;

impl Visitor<'_> for OutDegreeVisitor {
    type Value = OutDegree;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number of out-peers or \"auto\"")
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<OutDegree, E> {
        usize::try_from(value)
            .map(OutDegree::Fixed)
            .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(value), &self))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<OutDegree, E> {
        u64::try_from(value)
            .map_err(|_| E::invalid_value(de::Unexpected::Signed(value), &self))
            .and_then(|value| self.visit_u64(value))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<OutDegree, E> {
        match value {
            "auto" => Ok(OutDegree::Auto),
            _ => Err(E::invalid_value(de::Unexpected::Str(value), &self)),
        }
    }
}

/// The time-varying directed exponential graph of Assran et al. (2019), over `n` ranks.
///
/// A peer sends to peers `2^0, 2^1, …, 2^⌊log₂(n − 1)⌋` ranks ahead, one power per step in
/// rotation: with `L = ⌊log₂(n − 1)⌋ + 1` levels (that is `⌈log₂ n⌉`), the peer of rank
/// `i` sends at step `k` to rank `(i + 2^(k mod L)) mod n`. Every offset is below `n`, so
/// no peer sends to itself, and each step's map is a shift of the ring: every rank receives
/// from exactly one rank per out-edge, so weights stay evenly spread.
///
/// Over one cycle of `L` lock-step steps a peer's value becomes the average over the `2^L`
/// subset sums of the offsets, which cover every residue mod `n` (their sum `2^L − 1` is at
/// least `n − 1`). When `n` is a power of two each residue is covered once, and `L` steps
/// average exactly (the sequence is a hypercube); otherwise some residues are covered
/// twice, and each cycle still shrinks the disagreement by a large constant factor.
///
/// With `out_degree = d > 1`, a step sends to the `d` offsets `2^((k + j) mod L)` for
/// `j < d` (at most `L` of them, all distinct).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExponentialGraph {
    out_degree: OutDegree,
}

impl ExponentialGraph {
    /// A graph in which every peer sends to `out_degree` peers per step (at least one).
    pub fn new(out_degree: OutDegree) -> ExponentialGraph {
        ExponentialGraph { out_degree }
    }

    /// Number of out-peers a step has in a view of `n` peers.
    pub fn out_degree(&self, n: usize) -> usize {
        self.out_degree.at(levels(n))
    }

    /// The ranks that rank `rank` sends to at `step` in a view of `n` peers.
    ///
    /// Empty when `n < 2`: a peer alone keeps its mass.
    pub fn out_ranks(
        &self,
        n: usize,
        rank: usize,
        step: u64,
    ) -> impl Iterator<Item = usize> + use<> {
        let levels = levels(n);
        let degree = self.out_degree(n);
        (0..degree).map(move |j| {
            // levels ≥ 1 whenever degree ≥ 1, and levels ≤ 63, so the shift and the
            // remainder below cannot overflow.
            let level = ((step % levels as u64) as usize + j) % levels;
            (rank % n + (1usize << level)) % n
        })
    }
}

impl Default for ExponentialGraph {
    fn default() -> ExponentialGraph {
        ExponentialGraph::new(OutDegree::Fixed(1))
    }
}

/// `⌊log₂(n − 1)⌋ + 1`, the number of distinct powers of two below `n`; 0 for `n < 2`.
fn levels(n: usize) -> usize {
    if n < 2 {
        0
    } else {
        (n - 1).ilog2() as usize + 1
    }
}

#[cfg(test)]
mod tests {
    use super::{ExponentialGraph, OutDegree};

    #[test]
    fn offsets_cycle_through_powers_of_two() {
        let graph = ExponentialGraph::new(OutDegree::Fixed(1));
        let targets: Vec<usize> = (0..4)
            .flat_map(|step| graph.out_ranks(8, 0, step))
            .collect();
        assert_eq!(targets, [1, 2, 4, 1]);
    }

    #[test]
    fn no_peer_sends_to_itself_and_each_step_is_a_permutation() {
        for n in 1..70 {
            for degree in [1, 2, 3]
                .map(OutDegree::Fixed)
                .into_iter()
                .chain([OutDegree::Auto])
            {
                let graph = ExponentialGraph::new(degree);
                for step in 0..8 {
                    let mut in_degree = vec![0usize; n];
                    for rank in 0..n {
                        for target in graph.out_ranks(n, rank, step) {
                            assert_ne!(target, rank, "n={n} step={step}");
                            in_degree[target] += 1;
                        }
                    }
                    let expected = graph.out_degree(n);
                    assert!(in_degree.iter().all(|&d| d == expected), "n={n}");
                }
            }
        }
    }

    #[test]
    fn levels_cover_every_power_of_two_below_n() {
        let graph = ExponentialGraph::new(OutDegree::Fixed(1));
        let offsets =
            |n: usize| -> Vec<usize> { (0..8).map(|s| graph.out_ranks(n, 0, s).sum()).collect() };
        assert_eq!(offsets(2), [1; 8]);
        assert_eq!(offsets(3), [1, 2, 1, 2, 1, 2, 1, 2]);
        assert_eq!(offsets(5), [1, 2, 4, 1, 2, 4, 1, 2]);
        assert_eq!(offsets(9), [1, 2, 4, 8, 1, 2, 4, 8]);
        assert_eq!(offsets(16), [1, 2, 4, 8, 1, 2, 4, 8]);
    }

    #[test]
    fn a_lone_peer_has_no_out_peer() {
        let graph = ExponentialGraph::new(OutDegree::Fixed(3));
        assert_eq!(graph.out_ranks(1, 0, 5).count(), 0);
        assert_eq!(graph.out_ranks(0, 0, 5).count(), 0);
    }

    #[test]
    fn auto_covers_every_level_within_two_steps() {
        let graph = ExponentialGraph::new(OutDegree::Auto);
        let degrees: Vec<usize> = [2, 3, 4, 5, 8, 9, 16, 17, 64, 65]
            .map(|n| graph.out_degree(n))
            .into();
        assert_eq!(degrees, [1, 1, 1, 2, 2, 2, 2, 3, 3, 4]);
        let mut offsets: Vec<usize> = (0..2).flat_map(|s| graph.out_ranks(8, 0, s)).collect();
        offsets.sort_unstable();
        assert_eq!(offsets, [1, 2, 2, 4]);
        assert_eq!(graph.out_degree(1), 0);
    }

    #[test]
    fn out_degree_reads_a_number_or_auto() {
        let read = |text: &str| serde_json::from_str::<OutDegree>(text).map_err(|e| e.to_string());
        assert_eq!(read("2"), Ok(OutDegree::Fixed(2)));
        assert_eq!(read("\"auto\""), Ok(OutDegree::Auto));
        for bad in ["-1", "\"two\"", "1.5"] {
            let error = read(bad).unwrap_err();
            assert!(error.contains("out-peers or \"auto\""), "{bad}: {error}");
        }
        assert_eq!(serde_json::to_string(&OutDegree::Auto).unwrap(), "\"auto\"");
        assert_eq!(OutDegree::Fixed(3).to_string(), "3");
    }
}
