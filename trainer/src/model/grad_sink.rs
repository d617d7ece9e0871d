//! Weight gradients added to the flat gradient by the ops that compute them, during a pass.
//!
//! candle's backward pass keeps every parameter's gradient in its store until the pass
//! ends, and the trainer then moves them into its flat buffer. With micro-batches that
//! buffer already holds the earlier passes' sum, so a pass ended holding two model-sized
//! gradients. The trainer's own ops on the CPU (the linear op, the projected loss) add
//! their weights' gradients into the flat buffer as they compute them instead, through a
//! sink opened over the buffer for one pass ([`OpenSink`]); candle's store never holds them.
//! On a GPU the ops are candle's and the sink stays empty.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use super::autograd::GradWrite;
use crate::layout::ParamLayout;

/// The flat gradient of one pass, as the ops see it. Written only while its [`OpenSink`]
/// is alive.
#[derive(Debug)]
pub(crate) struct GradSink {
    state: Mutex<SinkState>,
}

#[derive(Debug)]
struct SinkState {
    /// The flat gradient's first element; null once the sink is closed.
    base: *mut f32,
    ranges: Vec<Range<usize>>,
    write: GradWrite,
    /// Which tensors' ranges an op has written this pass.
    written: Vec<bool>,
}

// SAFETY: `base` is only dereferenced under the mutex, while the `OpenSink` that holds the
// exclusive borrow of the buffer it points into is alive (see `GradSink::add_with`).
unsafe impl Send for SinkState {}

/// A sink open over a flat gradient: the buffer stays borrowed until [`OpenSink::close`].
#[derive(Debug)]
pub(crate) struct OpenSink<'a> {
    sink: Arc<GradSink>,
    _buffer: PhantomData<&'a mut [f32]>,
}

/// The tensors whose gradients a pass's ops wrote, by layout index.
#[derive(Debug, Default)]
pub(crate) struct Written(Vec<bool>);

impl Written {
    /// Whether tensor `index`'s gradient is in the flat buffer already.
    pub(crate) fn contains(&self, index: usize) -> bool {
        self.0.get(index).copied().unwrap_or(false)
    }
}

impl<'a> OpenSink<'a> {
    /// Opens a sink over `grad_out`, laid out as `layout`, for a pass that writes its
    /// gradient as `write` says.
    pub(crate) fn open(grad_out: &'a mut [f32], layout: &ParamLayout, write: GradWrite) -> Self {
        let ranges: Vec<Range<usize>> = layout.tensors().iter().map(|t| t.range()).collect();
        debug_assert!(ranges.iter().all(|r| r.end <= grad_out.len()));
        let written = vec![false; ranges.len()];
        let state = SinkState {
            base: grad_out.as_mut_ptr(),
            ranges,
            write,
            written,
        };
        OpenSink {
            sink: Arc::new(GradSink {
                state: Mutex::new(state),
            }),
            _buffer: PhantomData,
        }
    }

    /// The sink, for the ops of the pass.
    pub(crate) fn sink(&self) -> &Arc<GradSink> {
        &self.sink
    }

    /// Closes the sink (an op that still holds it gets an error) and says which tensors it
    /// wrote.
    pub(crate) fn close(self) -> Written {
        let mut state = self.sink.lock();
        state.base = std::ptr::null_mut();
        Written(std::mem::take(&mut state.written))
    }
}

impl Drop for OpenSink<'_> {
    fn drop(&mut self) {
        self.sink.lock().base = std::ptr::null_mut();
    }
}

impl GradSink {
    fn lock(&self) -> std::sync::MutexGuard<'_, SinkState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Calls `add` with tensor `index`'s range of the flat gradient and the factor the
    /// pass scales its gradient by, for `add` to add its part into. The first part of a
    /// pass that overwrites finds the range zeroed.
    pub(crate) fn add_with(
        &self,
        index: usize,
        add: impl FnOnce(&mut [f32], f32),
    ) -> candle_core::Result<()> {
        let mut state = self.lock();
        if state.base.is_null() {
            candle_core::bail!("a gradient written after its pass ended");
        }
        let Some(range) = state.ranges.get(index).cloned() else {
            candle_core::bail!("a gradient for parameter tensor {index}, which does not exist");
        };
        // SAFETY: `base` points into the buffer an `OpenSink` borrows exclusively for as
        // long as it is alive, and it is not null, so that sink is alive (closing it nulls
        // `base` under this lock, which is held until the slice is dropped). `range` lies
        // inside the buffer (the layout's ranges, checked against its length at `open`),
        // and only one slice of it exists at a time, under the lock.
        let values =
            unsafe { std::slice::from_raw_parts_mut(state.base.add(range.start), range.len()) };
        let first = !std::mem::replace(&mut state.written[index], true);
        if first && state.write == GradWrite::Overwrite {
            values.fill(0.0);
        }
        add(values, state.write.scale());
        Ok(())
    }
}

/// The threads a `gemm` call may use: candle's, as its own CPU matrix products use them.
pub(crate) fn gemm_parallelism() -> gemm::Parallelism {
    match candle_core::utils::get_num_threads() {
        threads if threads > 1 => gemm::Parallelism::Rayon(threads),
        _ => gemm::Parallelism::None,
    }
}

/// `sum += scale · aᵀ · b`, with `a` `[rows, m]` and `b` `[rows, n]` row-major and `sum`
/// `[m, n]`: candle's CPU matrix product (gemm), accumulating in place.
pub(crate) fn add_transposed_product(
    sum: &mut [f32],
    scale: f32,
    a: &[f32],
    b: &[f32],
    (m, rows, n): (usize, usize, usize),
) {
    assert!(sum.len() == m * n && a.len() == rows * m && b.len() == rows * n);
    let parallelism = gemm_parallelism();
    // SAFETY: the three slices hold the elements the strides below reach (checked above):
    // `sum[i·n + j]` for i < m, j < n; `a[p·m + i]` (the transpose's (i, p)) and `b[p·n + j]`
    // for p < rows; `sum` does not overlap the others (it is borrowed mutably).
    unsafe {
        gemm::gemm(
            m,
            n,
            rows,
            sum.as_mut_ptr(),
            1,
            n as isize,
            true,
            a.as_ptr(),
            m as isize,
            1,
            b.as_ptr(),
            1,
            n as isize,
            1.0,
            scale,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Init, ParamLayout};

    fn layout() -> ParamLayout {
        let mut layout = ParamLayout::default();
        layout.push("a".into(), &[2, 2], true, Init::Zeros);
        layout.push("b".into(), &[3], false, Init::Zeros);
        layout
    }

    #[test]
    fn a_pass_that_overwrites_zeroes_a_range_once_then_adds_and_says_what_it_wrote() {
        let layout = layout();
        let mut grad = vec![9.0f32; 7];
        let open = OpenSink::open(&mut grad, &layout, GradWrite::Overwrite);
        let sink = Arc::clone(open.sink());
        for part in [1.0, 2.0] {
            sink.add_with(0, |out, scale| {
                for v in out.iter_mut() {
                    *v += scale * part;
                }
            })
            .unwrap();
        }
        let written = open.close();
        assert!(written.contains(0) && !written.contains(1) && !written.contains(9));
        assert_eq!(grad, [3.0, 3.0, 3.0, 3.0, 9.0, 9.0, 9.0]);
        // Closed: an op still holding the sink is refused.
        assert!(sink.add_with(1, |_, _| {}).is_err());
    }

    #[test]
    fn a_micro_batch_pass_adds_its_scaled_part_and_an_unknown_tensor_is_an_error() {
        let layout = layout();
        let mut grad = vec![1.0f32; 7];
        let open = OpenSink::open(&mut grad, &layout, GradWrite::Add { scale: 0.5 });
        let sink = Arc::clone(open.sink());
        sink.add_with(1, |out, scale| {
            out.iter_mut().for_each(|v| *v += scale * 4.0)
        })
        .unwrap();
        assert!(sink.add_with(2, |_, _| {}).is_err());
        drop(open);
        assert_eq!(grad, [1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0]);
        assert!(
            sink.add_with(1, |_, _| {}).is_err(),
            "dropping closes it too"
        );
    }

    #[test]
    fn the_transposed_product_accumulates_scaled() {
        // aᵀ·b for a = [[1, 2], [3, 4], [5, 6]] (3 × 2) and b = [[1], [0], [2]] (3 × 1).
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = [1.0, 0.0, 2.0];
        let mut sum = [10.0, 20.0];
        add_transposed_product(&mut sum, 0.5, &a, &b, (2, 3, 1));
        assert_eq!(sum, [10.0 + 0.5 * 11.0, 20.0 + 0.5 * 14.0]);
    }
}
