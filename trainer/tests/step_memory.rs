//! A GPT step with a large vocabulary holds a block of logits at a time, not the logits.
//!
//! The live heap is counted by a global allocator that wraps the system's; this binary holds
//! only this test, so no other test's allocations are counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use murmur_trainer::{Batch, BatchInputs, DataShape, GptConfig, Model, ModelConfig};

/// The system allocator, keeping the live bytes and their high-water mark.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to `System` unchanged; the counters only observe it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with `layout` (every allocation here does).
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`, and the caller's contract for `new_size`.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            let live = LIVE.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn a_large_vocabularys_step_holds_a_block_of_logits_not_the_logits() {
    let (vocab, context, rows) = (16_384, 64, 32);
    let config = ModelConfig::Gpt(GptConfig {
        layers: 1,
        heads: 2,
        width: 32,
        context,
        vocab: None,
        mlp_ratio: 2,
    });
    let mut model = Model::new(&config, DataShape::Tokens { vocab, context }).unwrap();
    let params = model.init(5);
    let tokens = rows * context;
    let ids: Vec<u32> = (0..tokens as u32)
        .map(|i| i * 7919 % vocab as u32)
        .collect();
    let targets: Vec<u32> = (0..tokens as u32)
        .map(|i| i * 104_729 % vocab as u32)
        .collect();
    let batch = Batch {
        inputs: BatchInputs::Tokens { ids, context },
        targets,
        rows,
    };
    let mut grad = vec![0.0; params.len()];
    let logits_bytes = tokens * vocab * std::mem::size_of::<f32>();

    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let loss = model.loss_and_grad(&params, &batch, &mut grad).unwrap();
    let above = PEAK.load(Ordering::Relaxed) - before;

    assert!(loss.is_finite() && grad.iter().any(|g| g.abs() > 1e-6));
    // Built from generic ops the step's heap rose 11.2 times the logits' size (1.5 GB);
    // blocks of 16 MiB, the gradients and the rest of the step: 0.43 times.
    eprintln!(
        "peak {above} bytes above the start; the logits are {logits_bytes} bytes ({:.2}×)",
        above as f64 / logits_bytes as f64
    );
    assert!(
        above < logits_bytes,
        "the step's heap rose {above} bytes, logits are {logits_bytes}"
    );
}
