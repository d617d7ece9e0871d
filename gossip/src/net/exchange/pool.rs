//! A bounded free list of byte buffers, so that steady-state traffic does not allocate.

use std::sync::{Arc, Mutex};

/// Byte buffers handed out and taken back; idle ones are kept for reuse while their
/// capacities add up to at most `limit` bytes.
#[derive(Debug, Clone)]
pub struct BufferPool {
    free: Arc<Mutex<Free>>,
    limit: usize,
}

#[derive(Debug, Default)]
struct Free {
    buffers: Vec<Vec<u8>>,
    /// The capacities of `buffers`, added up.
    bytes: usize,
}

impl BufferPool {
    /// A pool keeping idle buffers of at most `limit` bytes in all.
    pub fn new(limit: usize) -> BufferPool {
        BufferPool {
            free: Arc::new(Mutex::new(Free::default())),
            limit,
        }
    }

    /// An empty buffer, reused when one is idle.
    pub fn take(&self) -> Vec<u8> {
        let Ok(mut free) = self.free.lock() else {
            return Vec::new();
        };
        let buf = free.buffers.pop().unwrap_or_default();
        free.bytes -= buf.capacity();
        buf
    }

    /// Gives a buffer back; dropped when the pool has no room for it or it holds no memory.
    pub fn give(&self, mut buf: Vec<u8>) {
        if buf.capacity() == 0 {
            return;
        }
        buf.clear();
        if let Ok(mut free) = self.free.lock()
            && free.bytes + buf.capacity() <= self.limit
        {
            free.bytes += buf.capacity();
            free.buffers.push(buf);
        }
    }

    /// Idle buffers held.
    pub fn idle(&self) -> usize {
        self.free.lock().map(|f| f.buffers.len()).unwrap_or(0)
    }

    /// The capacities of the idle buffers, added up.
    pub fn idle_bytes(&self) -> usize {
        self.free.lock().map(|f| f.bytes).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_buffers_up_to_the_limit_in_bytes() {
        let pool = BufferPool::new(16);
        let mut a = pool.take();
        a.extend_from_slice(&[1, 2, 3]);
        let ptr = a.as_ptr();
        pool.give(a);
        let b = pool.take();
        assert!(b.is_empty());
        assert_eq!(b.as_ptr(), ptr, "the idle buffer is handed out again");
        assert_eq!(pool.idle_bytes(), 0);
        for _ in 0..5 {
            pool.give(Vec::with_capacity(8));
        }
        assert_eq!((pool.idle(), pool.idle_bytes()), (2, 16));
        pool.give(Vec::new());
        pool.give(Vec::with_capacity(17));
        assert_eq!(
            pool.idle(),
            2,
            "no room for another, nor for one past the limit"
        );
        drop(pool.take());
        assert_eq!(pool.idle_bytes(), 8);
    }
}
