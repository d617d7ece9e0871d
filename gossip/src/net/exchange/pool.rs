//! A bounded free list of byte buffers, so that steady-state traffic does not allocate.

use std::sync::{Arc, Mutex};

/// Byte buffers handed out and taken back; at most `limit` are kept for reuse.
#[derive(Debug, Clone)]
pub struct BufferPool {
    free: Arc<Mutex<Vec<Vec<u8>>>>,
    limit: usize,
}

impl BufferPool {
    /// A pool keeping at most `limit` idle buffers.
    pub fn new(limit: usize) -> BufferPool {
        BufferPool {
            free: Arc::new(Mutex::new(Vec::with_capacity(limit))),
            limit,
        }
    }

    /// An empty buffer, reused when one is idle.
    pub fn take(&self) -> Vec<u8> {
        self.free
            .lock()
            .ok()
            .and_then(|mut free| free.pop())
            .unwrap_or_default()
    }

    /// Gives a buffer back; dropped when the pool is full or the buffer holds no memory.
    pub fn give(&self, mut buf: Vec<u8>) {
        if buf.capacity() == 0 {
            return;
        }
        buf.clear();
        if let Ok(mut free) = self.free.lock()
            && free.len() < self.limit
        {
            free.push(buf);
        }
    }

    /// Idle buffers held.
    pub fn idle(&self) -> usize {
        self.free.lock().map(|f| f.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_buffers_up_to_the_limit() {
        let pool = BufferPool::new(2);
        let mut a = pool.take();
        a.extend_from_slice(&[1, 2, 3]);
        let ptr = a.as_ptr();
        pool.give(a);
        let b = pool.take();
        assert!(b.is_empty());
        assert_eq!(b.as_ptr(), ptr, "the idle buffer is handed out again");
        for _ in 0..5 {
            pool.give(Vec::with_capacity(8));
        }
        assert_eq!(pool.idle(), 2);
        pool.give(Vec::new());
        assert_eq!(pool.idle(), 2);
    }
}
