//! The push-sum state of one peer: numerator `x`, weight `w`, and the de-biased `z = x / w`.

use super::error::SgpError;

/// Bytes one numerator element occupies in an `f32` share payload.
pub(crate) const F32_BYTES: usize = 4;

/// The weight below which a peer rescales its mass ([`PushSumState::renormalize`]): 2⁻²⁰,
/// far above where `x = w·z` loses precision in `f32` for any parameter of ordinary size,
/// and far below what a healthy swarm's weights reach (about 1 each).
pub const MIN_WEIGHT: f64 = 1.0 / (1u64 << 20) as f64;

/// One peer's push-sum mass: a numerator vector `x` and a scalar weight `w`.
///
/// The de-biased parameters are `z = x / w`; they are what the peer trains on and what the
/// swarm converges to. Mixing moves mass between peers, never creates or destroys it: a
/// share subtracted here is exactly what another peer adds (Kempe et al., 2003). The weight
/// is kept in `f64` so that the total weight of the swarm stays exact to rounding over
/// millions of splits; the numerator is `f32`, like the parameters the trainer holds.
#[derive(Debug, Clone, PartialEq)]
pub struct PushSumState {
    /// Empty while lent for a local step ([`PushSumState::lend_debiased`]).
    numerator: Vec<f32>,
    weight: f64,
    len: usize,
}

impl PushSumState {
    /// A peer's initial state: `x` = its parameters, `w` = 1, so `z = x`.
    pub fn new(parameters: Vec<f32>) -> PushSumState {
        PushSumState {
            len: parameters.len(),
            numerator: parameters,
            weight: 1.0,
        }
    }

    /// A peer that holds no mass yet (`x = 0`, `w = 0`): a joiner waiting for its first share.
    pub fn empty(len: usize) -> PushSumState {
        PushSumState {
            numerator: vec![0.0; len],
            weight: 0.0,
            len,
        }
    }

    /// Number of elements in the parameter vector.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the parameter vector has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The push-sum weight `w`.
    pub fn weight(&self) -> f64 {
        self.weight
    }

    /// The numerator `x`.
    pub fn numerator(&self) -> &[f32] {
        &self.numerator
    }

    /// Scales `x` and `w` by one power of two, bringing `w` into `[1, 2)`, when `w` has
    /// fallen below [`MIN_WEIGHT`]; `z = x / w` is unchanged bit for bit.
    ///
    /// A crash loses the mass the crashed peer held and the shares in flight to it, and a
    /// share its receiver refuses is lost too, so under steady churn the swarm's total
    /// weight shrinks geometrically: 8 peers through a few hundred crashes take it below
    /// what an `f32` numerator can hold, and `x = w·z` underflows to zero (every parameter
    /// 0) long before `w`, kept in `f64`, does. Scaling one peer's pair changes how much its
    /// `z` counts in the average its neighbours form, not where they agree: every mixed `z`
    /// stays a convex combination of the `z`s mixed.
    pub fn renormalize(&mut self) {
        if !(self.weight > 0.0 && self.weight < MIN_WEIGHT) {
            return;
        }
        // w = m · 2^e with m in [1, 2): scaling by 2^−e leaves m.
        let scale = -(self.weight.log2().floor() as i32);
        self.weight *= 2f64.powi(scale);
        // Multiplying by a power of two is exact (a subnormal keeps the bits it still has);
        // f32 holds powers up to 2^127, so larger scales go in parts.
        let mut left = scale;
        while left > 0 {
            let part = left.min(126);
            let factor = 2f32.powi(part);
            for x in &mut self.numerator {
                *x *= factor;
            }
            left -= part;
        }
    }

    /// Mutable access to the numerator, for the optimizer step `x ← x − γ·g`.
    pub(crate) fn numerator_mut(&mut self) -> &mut [f32] {
        &mut self.numerator
    }

    /// Writes the de-biased parameters `z = x / w` into `out`.
    ///
    /// Fails when `out` has the wrong length, or when the peer holds no mass (`w = 0`, a
    /// joiner before its first share), where `z` is undefined.
    pub fn debiased_into(&self, out: &mut [f32]) -> Result<(), SgpError> {
        if out.len() != self.numerator.len() {
            return Err(SgpError::LengthMismatch {
                expected: self.numerator.len(),
                got: out.len(),
            });
        }
        if self.weight <= 0.0 {
            return Err(SgpError::NoMass);
        }
        let debias = Debias::new(self.weight);
        for (z, &x) in out.iter_mut().zip(&self.numerator) {
            *z = debias.apply(x);
        }
        Ok(())
    }

    /// Turns the numerator into the de-biased parameters `z = x / w`, in place and exactly
    /// as [`PushSumState::debiased_into`] computes them, and moves it out for a local step,
    /// so that the step holds the parameters once. The numerator is empty until
    /// [`PushSumState::restore_debiased`]; nothing may change the mass meanwhile.
    pub(crate) fn lend_debiased(&mut self) -> Result<Vec<f32>, SgpError> {
        if self.weight <= 0.0 {
            return Err(SgpError::NoMass);
        }
        if self.numerator.len() != self.len {
            return Err(SgpError::Lent);
        }
        let debias = Debias::new(self.weight);
        for x in &mut self.numerator {
            *x = debias.apply(*x);
        }
        Ok(std::mem::take(&mut self.numerator))
    }

    /// Takes back parameters lent by [`PushSumState::lend_debiased`], as the step left
    /// them: `x = w·z`, which is `x + w·Δz` to a rounding of each element.
    pub(crate) fn restore_debiased(&mut self, mut z: Vec<f32>) -> Result<(), SgpError> {
        if z.len() != self.len {
            return Err(SgpError::LengthMismatch {
                expected: self.len,
                got: z.len(),
            });
        }
        let weight = self.weight;
        for x in &mut z {
            *x = (f64::from(*x) * weight) as f32;
        }
        self.numerator = z;
        Ok(())
    }

    /// Whether the numerator is lent for a local step.
    pub(crate) fn is_lent(&self) -> bool {
        self.numerator.len() != self.len
    }

    /// Moves `fraction` of this peer's mass out, writing the numerator share into `payload`
    /// as little-endian `f32`s, and returns the share's weight.
    ///
    /// The share written is exactly what is subtracted: `x_k` becomes `x_k − s_k` with
    /// `s_k = fl(x_k · fraction)` as written, and for `fraction = ½` both are exact.
    pub(crate) fn split_f32(&mut self, fraction: f32, payload: &mut Vec<u8>) -> f64 {
        payload.clear();
        payload.resize(self.numerator.len() * F32_BYTES, 0);
        for (x, bytes) in self
            .numerator
            .iter_mut()
            .zip(payload.chunks_exact_mut(F32_BYTES))
        {
            let share = *x * fraction;
            *x -= share;
            bytes.copy_from_slice(&share.to_le_bytes());
        }
        self.take_weight(f64::from(fraction))
    }

    /// Moves all of this peer's mass out into `payload`; returns the weight moved.
    ///
    /// The numerator's memory goes with it: the zeros left are a fresh vector, which takes
    /// memory only where later shares write (a large allocation is mapped on demand), so a
    /// leaving peer does not hold its parameters twice while its hand-off travels.
    pub(crate) fn drain_f32(&mut self, payload: &mut Vec<u8>) -> f64 {
        payload.clear();
        payload.reserve(self.numerator.len() * F32_BYTES);
        for x in &self.numerator {
            payload.extend_from_slice(&x.to_le_bytes());
        }
        self.numerator = vec![0.0; self.numerator.len()];
        std::mem::take(&mut self.weight)
    }

    /// Adds a share (`weight`, numerator as little-endian `f32`s) to this peer's mass.
    ///
    /// The payload is checked before anything is added, so a malformed share leaves the
    /// state untouched.
    pub(crate) fn absorb_f32(&mut self, weight: f64, payload: &[u8]) -> Result<(), SgpError> {
        self.check_f32(weight, payload)?;
        for (x, bytes) in self
            .numerator
            .iter_mut()
            .zip(payload.chunks_exact(F32_BYTES))
        {
            *x += f32_from_le(bytes);
        }
        self.weight += weight;
        Ok(())
    }

    /// Whether [`PushSumState::absorb_f32`] would take the share.
    pub(crate) fn check_f32(&self, weight: f64, payload: &[u8]) -> Result<(), SgpError> {
        check_share_weight(weight)?;
        let expected = self.len * F32_BYTES;
        if payload.len() != expected {
            return Err(SgpError::PayloadLength {
                expected,
                got: payload.len(),
            });
        }
        let all_finite = payload
            .chunks_exact(F32_BYTES)
            .all(|bytes| f32_from_le(bytes).is_finite());
        if !all_finite {
            return Err(SgpError::NonFinitePayload);
        }
        Ok(())
    }

    /// Removes `weight · v` from the numerator's elements `start..start + v.len()`, with
    /// `(weight · v_k)` rounded to `f32` exactly as [`PushSumState::add_scaled_at`] rounds it
    /// on the other end.
    pub(crate) fn subtract_scaled_at(&mut self, start: usize, weight: f64, v: &[f32]) {
        for (x, &v) in self.numerator[start..].iter_mut().zip(v) {
            *x -= (f64::from(v) * weight) as f32;
        }
    }

    /// Adds `weight · v` to the numerator's elements `start..start + v.len()`; the weight
    /// is the caller's to add, once the whole share is in ([`PushSumState::add_weight`]).
    pub(crate) fn add_scaled_at(&mut self, start: usize, weight: f64, v: &[f32]) {
        for (x, &v) in self.numerator[start..].iter_mut().zip(v) {
            *x += (f64::from(v) * weight) as f32;
        }
    }

    /// Adds a share's `weight` to the weight.
    pub(crate) fn add_weight(&mut self, weight: f64) {
        self.weight += weight;
    }

    /// Removes `fraction` of the weight alone and returns the amount removed.
    pub(crate) fn take_fraction_of_weight(&mut self, fraction: f64) -> f64 {
        self.take_weight(fraction)
    }

    /// Removes `fraction` of the weight and returns the amount removed.
    ///
    /// The amount returned is the difference actually taken off, so sender and receiver
    /// account for the same number even where `w · fraction` rounds.
    fn take_weight(&mut self, fraction: f64) -> f64 {
        let before = self.weight;
        self.weight = before - before * fraction;
        before - self.weight
    }
}

/// A share weight must be finite and positive; anything else would poison `z`.
pub(crate) fn check_share_weight(weight: f64) -> Result<(), SgpError> {
    if weight.is_finite() && weight > 0.0 {
        Ok(())
    } else {
        Err(SgpError::BadShareWeight { weight })
    }
}

/// De-biasing, `z = x / w`, computed the same way wherever a `z` is made (from the
/// numerator, in place for a lent step, from a hand-off's payload, for an edge's deviation
/// or reference), so that every one of them agrees bit for bit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Debias {
    inverse: f64,
}

impl Debias {
    /// De-biasing by the push-sum weight `weight`.
    pub(crate) fn new(weight: f64) -> Self {
        Self {
            inverse: 1.0 / weight,
        }
    }

    /// `x / w`, rounded to `f32`.
    #[inline]
    pub(crate) fn apply(self, x: f32) -> f32 {
        (f64::from(x) * self.inverse) as f32
    }
}

/// Reads one little-endian `f32` from a 4-byte chunk.
pub(crate) fn f32_from_le(bytes: &[u8]) -> f32 {
    let mut raw = [0u8; F32_BYTES];
    raw.copy_from_slice(bytes);
    f32::from_le_bytes(raw)
}
