//! How an optimizer kernel reads the gradient, and whether it leaves each parameter's
//! update in its place.

use std::ops::Range;

/// The gradient a kernel steps along, element by element.
pub(crate) trait GradSlots {
    /// The slots of one tensor's range.
    type Part<'b>: GradSlots
    where
        Self: 'b;
    /// The slots of `range`.
    fn part(&mut self, range: Range<usize>) -> Self::Part<'_>;
    /// Elements.
    fn len(&self) -> usize;
    /// The gradient of element `i`.
    fn grad(&self, i: usize) -> f32;
    /// Element `i`'s parameter moved from `before` to `after`.
    fn moved(&mut self, i: usize, before: f32, after: f32);
}

impl GradSlots for &[f32] {
    type Part<'b>
        = &'b [f32]
    where
        Self: 'b;

    fn part(&mut self, range: Range<usize>) -> &[f32] {
        &self[range]
    }

    fn len(&self) -> usize {
        <[f32]>::len(self)
    }

    fn grad(&self, i: usize) -> f32 {
        self[i]
    }

    fn moved(&mut self, _: usize, _: f32, _: f32) {}
}

/// A gradient whose slots take each parameter's update `after − before` (in `f32`) once
/// the kernel has read them: whoever keeps the parameters apart from the trainer (SGP's
/// numerator) learns how far the step moved them without a copy from before it.
pub(crate) struct KeepUpdate<'a>(pub(crate) &'a mut [f32]);

impl GradSlots for KeepUpdate<'_> {
    type Part<'b>
        = KeepUpdate<'b>
    where
        Self: 'b;

    fn part(&mut self, range: Range<usize>) -> KeepUpdate<'_> {
        KeepUpdate(&mut self.0[range])
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn grad(&self, i: usize) -> f32 {
        self.0[i]
    }

    fn moved(&mut self, i: usize, before: f32, after: f32) {
        self.0[i] = after - before;
    }
}
