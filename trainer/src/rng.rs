//! The trainer's own seeded generator.
//!
//! Every peer must draw the same initial model and the same eval set from the swarm seed, on
//! any build and any platform, so the streams come from a generator murmur owns rather than
//! one whose output may change between library versions: xoshiro256** (Blackman and Vigna,
//! 2018) seeded through SplitMix64.

/// Stream tags that keep the generators of different purposes apart.
pub(crate) mod tag {
    /// Initial parameters.
    pub(crate) const INIT: u64 = 0x696e_6974;
    /// The synthetic task itself (teacher network, Markov chain).
    pub(crate) const TASK: u64 = 0x7461_736b;
    /// The held-out eval set.
    pub(crate) const EVAL: u64 = 0x6576_616c;
    /// A peer's training stream.
    pub(crate) const TRAIN: u64 = 0x7472_6169;
}

/// One SplitMix64 step: a strong 64-bit mixer.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hashes a sequence of words into one seed; different sequences give unrelated seeds.
pub(crate) fn derive_seed(parts: &[u64]) -> u64 {
    let mut state = 0x6d75_726d_7572_u64; // "murmur"
    let mut out = 0;
    for &part in parts {
        state ^= part;
        out = splitmix64(&mut state);
        state = out;
    }
    out
}

/// xoshiro256**: fast, small state, good statistical quality.
#[derive(Debug, Clone)]
pub(crate) struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator seeded from `seed` through SplitMix64 (never the all-zero state).
    pub(crate) fn new(seed: u64) -> Self {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Self { s }
    }

    /// A generator for the stream named by `parts` (see [`derive_seed`]).
    pub(crate) fn for_stream(parts: &[u64]) -> Self {
        Self::new(derive_seed(parts))
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` without modulo bias (Lemire's multiply-shift with rejection).
    /// `n` must be positive.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// Uniform index in `0..n`; `n` must be positive.
    pub(crate) fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// A standard normal draw (Box–Muller; one of the pair is discarded for simplicity).
    pub(crate) fn normal(&mut self) -> f64 {
        // 1 - u lies in (0, 1], so the logarithm is finite.
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Draws an index from a cumulative distribution (last entry ≈ 1).
    pub(crate) fn pick_cumulative(&mut self, cumulative: &[f64]) -> usize {
        let u = self.next_f64() * cumulative.last().copied().unwrap_or(1.0);
        cumulative
            .iter()
            .position(|&c| u < c)
            .unwrap_or(cumulative.len().saturating_sub(1))
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub(crate) fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.index(i + 1);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut rng = Rng::new(7);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let v = rng.below(5) as usize;
            assert!(v < 5);
            seen[v] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn normal_has_unit_moments() {
        let mut rng = Rng::new(3);
        let n = 200_000;
        let (mut sum, mut sq) = (0.0, 0.0);
        for _ in 0..n {
            let x = rng.normal();
            sum += x;
            sq += x * x;
        }
        let mean = sum / n as f64;
        let var = sq / n as f64 - mean * mean;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "variance {var}");
    }

    #[test]
    fn derived_seeds_differ_by_any_part() {
        let a = derive_seed(&[1, 2, 3]);
        assert_ne!(a, derive_seed(&[1, 2, 4]));
        assert_ne!(a, derive_seed(&[2, 1, 3]));
        assert_eq!(a, derive_seed(&[1, 2, 3]));
    }
}
