//! Adam's moments in 8 bits an element: block-wise, logarithmic codes.
//!
//! Block-wise quantization of optimizer state is Dettmers et al.'s (*8-bit Optimizers via
//! Block-wise Quantization*, ICLR 2022): each block of elements is coded relative to its own
//! largest magnitude, so one outlier costs precision only in its block, and the code's levels
//! are spread over several orders of magnitude rather than evenly, because the moments of
//! one block span several. The levels here are powers of two: a first moment `m` keeps a
//! sign and one of 127 magnitudes eight to an octave below the block's largest
//! (`scale · 2^((k − 127) / 8)`, 2⁻¹⁵·⁹ of it at the least), and a second moment `v` keeps
//! `√v`, which has the gradient's units and half the range, as one of 255 magnitudes sixteen
//! to an octave. A stored `m` is within 4.4 % of the value coded, a `√v` within 2.2 %, so the
//! step `m / √v` is within 7 %; a value below the smallest level is 0, except that a
//! positive `v` keeps the smallest, so that no step divides by a second moment rounded to
//! zero while its first moment is not.
//!
//! The optimizer updates the moments in `f32` from their decoded values and codes the results
//! (as bitsandbytes does): rounding moves each value at most half a level, and it does not
//! build up, since every step codes afresh what the update computed. Coding is exact in one
//! respect that checkpoints need: decoding a block and coding the values again gives the same
//! codes and the same scale, so state written out as `f32` and read back is the state it was.

/// Elements that share one scale: 256, so the scales add 1.6 % to the codes.
pub(crate) const BLOCK: usize = 256;

/// How a slot's values are coded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MomentKind {
    /// Signed values (Adam's first moment): a sign and 127 magnitudes, 8 to an octave.
    Signed,
    /// Non-negative values kept as their square roots (Adam's second moment): 255
    /// magnitudes of the root, 16 to an octave.
    Squared,
}

impl MomentKind {
    /// The highest code's index, whose level is the block's scale.
    fn top(self) -> i32 {
        match self {
            MomentKind::Signed => 127,
            MomentKind::Squared => 255,
        }
    }

    /// Levels per octave.
    fn per_octave(self) -> i32 {
        match self {
            MomentKind::Signed => 8,
            MomentKind::Squared => 16,
        }
    }
}

/// The mantissa bits (of floats in `[1, 2)`) at which the next level's half-way point lies:
/// `2^((j + ½) / per_octave)` for each level `j` of an octave.
fn thresholds(kind: MomentKind) -> Vec<u32> {
    let per_octave = kind.per_octave();
    (0..per_octave)
        .map(|j| {
            let at = 2f64.powf((f64::from(j) + 0.5) / f64::from(per_octave)) as f32;
            at.to_bits() & 0x7f_ffff
        })
        .collect()
}

/// Each code's magnitude as a fraction of the block's scale (code 0 is 0).
fn levels(kind: MomentKind) -> Vec<f32> {
    let (top, per_octave) = (kind.top(), kind.per_octave());
    (0..=top)
        .map(|k| {
            if k == 0 {
                0.0
            } else {
                2f64.powf(f64::from(k - top) / f64::from(per_octave)) as f32
            }
        })
        .collect()
}

/// A vector coded in 8 bits an element, 256 elements to a scale.
#[derive(Debug, Clone, PartialEq)]
pub struct MomentCodes {
    kind: MomentKind,
    codes: Vec<u8>,
    /// Each block's largest magnitude (of `√v` for [`MomentKind::Squared`]).
    scales: Vec<f32>,
}

impl MomentCodes {
    /// `len` zeros.
    pub fn zeros(kind: MomentKind, len: usize) -> MomentCodes {
        MomentCodes {
            kind,
            codes: vec![0; len],
            scales: vec![0.0; len.div_ceil(BLOCK)],
        }
    }

    /// `values`, coded.
    pub fn from_values(kind: MomentKind, values: &[f32]) -> MomentCodes {
        let mut codes = MomentCodes::zeros(kind, values.len());
        let coder = Coder::new(kind);
        let mut block = [0.0; BLOCK];
        for (index, chunk) in values.chunks(BLOCK).enumerate() {
            block[..chunk.len()].copy_from_slice(chunk);
            coder.store(&mut codes, index, &block[..chunk.len()]);
        }
        codes
    }

    /// How the values are coded.
    pub fn kind(&self) -> MomentKind {
        self.kind
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.codes.len()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    /// Bytes the codes and scales occupy.
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * self.scales.len()
    }

    /// Writes the values from `start` on into `out`.
    pub fn read(&self, start: usize, out: &mut [f32]) {
        let coder = Coder::new(self.kind);
        let mut at = start;
        let mut out = out;
        while !out.is_empty() {
            let block = at / BLOCK;
            let offset = at % BLOCK;
            let take = (BLOCK - offset).min(out.len());
            let (head, rest) = out.split_at_mut(take);
            coder.load_range(self, block, offset, head);
            out = rest;
            at += take;
        }
    }

    /// The blocks, in order.
    pub(crate) fn blocks(&self) -> usize {
        self.scales.len()
    }
}

/// A kind's tables, made once per optimizer step or read.
pub(crate) struct Coder {
    kind: MomentKind,
    levels: Vec<f32>,
    thresholds: Vec<u32>,
}

impl Coder {
    pub(crate) fn new(kind: MomentKind) -> Coder {
        Coder {
            kind,
            levels: levels(kind),
            thresholds: thresholds(kind),
        }
    }

    /// Decodes block `block` of `codes` into `out` (its length: the block's elements).
    pub(crate) fn load(&self, codes: &MomentCodes, block: usize, out: &mut [f32]) {
        self.load_range(codes, block, 0, out);
    }

    fn load_range(&self, codes: &MomentCodes, block: usize, offset: usize, out: &mut [f32]) {
        let scale = codes.scales[block];
        let start = block * BLOCK + offset;
        let stored = &codes.codes[start..start + out.len()];
        match self.kind {
            MomentKind::Signed => {
                for (value, &code) in out.iter_mut().zip(stored) {
                    let magnitude = scale * self.levels[usize::from(code & 0x7f)];
                    *value = if code & 0x80 != 0 {
                        -magnitude
                    } else {
                        magnitude
                    };
                }
            }
            MomentKind::Squared => {
                for (value, &code) in out.iter_mut().zip(stored) {
                    let root = scale * self.levels[usize::from(code)];
                    *value = root * root;
                }
            }
        }
    }

    /// Codes `values` (the block's elements) as block `block` of `codes`.
    pub(crate) fn store(&self, codes: &mut MomentCodes, block: usize, values: &[f32]) {
        let start = block * BLOCK;
        let stored = &mut codes.codes[start..start + values.len()];
        let top = self.kind.top();
        let per_octave = self.kind.per_octave();
        let magnitude = |x: f32| match self.kind {
            MomentKind::Signed => x.abs(),
            MomentKind::Squared => x.max(0.0).sqrt(),
        };
        let scale = values.iter().fold(0.0f32, |max, &x| max.max(magnitude(x)));
        codes.scales[block] = scale;
        if !(scale > 0.0 && scale.is_finite()) {
            stored.fill(0);
            return;
        }
        let inverse = 1.0 / scale;
        for (code, &x) in stored.iter_mut().zip(values) {
            let fraction = magnitude(x) * inverse;
            let bits = fraction.to_bits();
            // fraction = 2^e · 1.m: the level is per_octave · e plus the levels of the octave
            // whose half-way points 1.m has passed, rounded to the nearest in log scale.
            let exponent = ((bits >> 23) & 0xff) as i32 - 127;
            let mantissa = bits & 0x7f_ffff;
            let within = self.thresholds.iter().filter(|&&t| mantissa >= t).count() as i32;
            let level = top + per_octave * exponent + within;
            let index = if fraction == 0.0 {
                0
            } else if level >= 1 {
                level.min(top)
            } else if self.kind == MomentKind::Squared {
                1
            } else {
                0
            };
            *code = match self.kind {
                MomentKind::Signed if x < 0.0 && index > 0 => 0x80 | index as u8,
                _ => index as u8,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wave(len: usize, spread: f32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let t = i as f32 * 0.37;
                t.sin() * (spread * (t * 0.11).cos()).exp()
            })
            .collect()
    }

    #[test]
    fn signed_values_come_back_within_half_a_level() {
        let values = wave(3 * BLOCK + 17, 4.0);
        let codes = MomentCodes::from_values(MomentKind::Signed, &values);
        let mut back = vec![0.0; values.len()];
        codes.read(0, &mut back);
        for (block, (a, b)) in values.chunks(BLOCK).zip(back.chunks(BLOCK)).enumerate() {
            let scale = a.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            for (&x, &y) in a.iter().zip(b) {
                if x.abs() > scale * 2f32.powf(-15.0) {
                    assert!(
                        (y / x - 1.0).abs() < 0.045,
                        "block {block}: {x} came back {y}"
                    );
                } else {
                    assert!(y.abs() <= x.abs() * 1.1 + scale * 2f32.powf(-15.0));
                }
            }
        }
        assert_eq!(codes.bytes(), values.len() + 4 * 4);
    }

    #[test]
    fn squared_values_keep_their_roots_within_half_a_level_and_never_round_to_zero() {
        let mut values: Vec<f32> = wave(2 * BLOCK, 6.0).iter().map(|x| x * x).collect();
        values[5] = 1e-30; // far below the smallest level of its block
        values[6] = 0.0;
        let codes = MomentCodes::from_values(MomentKind::Squared, &values);
        let mut back = vec![0.0; values.len()];
        codes.read(0, &mut back);
        let scale = values[..BLOCK].iter().fold(0.0f32, |m, &x| m.max(x.sqrt()));
        for (&x, &y) in values.iter().zip(&back).take(BLOCK) {
            if x.sqrt() > scale * 2f32.powf(-15.5) {
                assert!(
                    (y.sqrt() / x.sqrt() - 1.0).abs() < 0.022,
                    "{x} came back {y}"
                );
            }
        }
        assert!(
            back[5] > 0.0,
            "a positive second moment keeps the smallest level"
        );
        assert_eq!(back[6], 0.0);
    }

    #[test]
    fn decoded_values_code_to_the_same_codes() {
        for kind in [MomentKind::Signed, MomentKind::Squared] {
            let values: Vec<f32> = wave(5 * BLOCK + 3, 5.0)
                .iter()
                .map(|&x| {
                    if kind == MomentKind::Squared {
                        x * x
                    } else {
                        x
                    }
                })
                .collect();
            let codes = MomentCodes::from_values(kind, &values);
            let mut back = vec![0.0; values.len()];
            codes.read(0, &mut back);
            assert_eq!(MomentCodes::from_values(kind, &back), codes, "{kind:?}");
        }
    }

    #[test]
    fn a_read_from_the_middle_of_a_block_matches_a_whole_read() {
        let values = wave(4 * BLOCK, 3.0);
        let codes = MomentCodes::from_values(MomentKind::Signed, &values);
        let mut whole = vec![0.0; values.len()];
        codes.read(0, &mut whole);
        let mut part = vec![0.0; 2 * BLOCK + 9];
        codes.read(BLOCK - 5, &mut part);
        assert_eq!(part, whole[BLOCK - 5..3 * BLOCK + 4]);
    }

    #[test]
    fn zeros_and_an_all_zero_block_read_as_zeros() {
        let codes = MomentCodes::from_values(MomentKind::Signed, &[0.0; 300]);
        assert_eq!(codes, MomentCodes::zeros(MomentKind::Signed, 300));
        let mut back = vec![1.0; 300];
        codes.read(0, &mut back);
        assert!(back.iter().all(|&x| x == 0.0));
    }
}
