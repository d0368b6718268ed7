//! A thread-safe allocator: [`SharedAllocator`] wraps one [`Allocator`] in a mutex.
//!
//! Lock design, measured (docs/allocator.md, `cargo bench --bench alloc_free --
//! threads`): one global lock held for the few tens of nanoseconds of a fast-path call
//! is the whole design. The alternatives weighed — per-stream locks (PyTorch keeps one
//! lock per device), per-thread magazines of small blocks — only pay when several threads
//! allocate at a high rate on one device, which a GPU program's single launching thread
//! per device does not; and magazines hold memory out of the pools, which costs
//! reserved bytes, the figure this allocator is judged on. The lock is never held
//! across anything but the allocator's own work and the backend calls of a miss.

use std::sync::{Mutex, MutexGuard};

use crate::backend::{DeviceBackend, DevicePtr, StreamId, StreamPriority};
use crate::error::AllocError;
use crate::pool::{Allocation, Allocator};
use crate::stats::AllocStats;

/// An [`Allocator`] usable from many threads (`Sync`).
pub struct SharedAllocator<B: DeviceBackend> {
    inner: Mutex<Allocator<B>>,
}

impl<B: DeviceBackend> SharedAllocator<B> {
    pub fn new(a: Allocator<B>) -> Self {
        SharedAllocator {
            inner: Mutex::new(a),
        }
    }

    /// The allocator, locked. A panic while it was held (a bug) does not poison it for
    /// other threads: the allocator's state is consistent between calls.
    pub fn lock(&self) -> MutexGuard<'_, Allocator<B>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn allocate(&self, bytes: u64, stream: StreamId) -> Result<Allocation, AllocError> {
        self.lock().allocate(bytes, stream)
    }
    pub fn deallocate(&self, a: Allocation, stream: StreamId) -> Result<(), AllocError> {
        self.lock().deallocate(a, stream)
    }
    pub fn deallocate_ptr(&self, ptr: DevicePtr, stream: StreamId) -> Result<u64, AllocError> {
        self.lock().deallocate_ptr(ptr, stream)
    }
    pub fn record_stream(&self, a: &Allocation, stream: StreamId) -> Result<(), AllocError> {
        self.lock().record_stream(a, stream)
    }
    pub fn create_stream(&self, p: StreamPriority) -> Result<StreamId, AllocError> {
        self.lock().create_stream(p)
    }
    pub fn empty_cache(&self) -> Result<u64, AllocError> {
        self.lock().empty_cache()
    }
    pub fn stats(&self) -> AllocStats {
        self.lock().stats().clone()
    }
    pub fn check_invariants(&self) -> Result<(), AllocError> {
        self.lock().check_invariants()
    }
    pub fn into_inner(self) -> Allocator<B> {
        self.inner.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;
    use crate::config::AllocConfig;

    #[test]
    fn threads_allocate_and_free_concurrently() {
        let a = Allocator::new(SimBackend::h200(), AllocConfig::default()).unwrap();
        let shared = SharedAllocator::new(a);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let sh = &shared;
                s.spawn(move || {
                    let mut live = Vec::new();
                    for i in 0..2000u64 {
                        let bytes = 1 + (i * 7919 + t * 104729) % (3 << 20);
                        live.push(sh.allocate(bytes, 0).unwrap());
                        if i % 3 == 0 {
                            let a = live.swap_remove((i as usize * 31) % live.len());
                            sh.deallocate(a, 0).unwrap();
                        }
                    }
                    for a in live {
                        sh.deallocate(a, 0).unwrap();
                    }
                });
            }
        });
        shared.check_invariants().unwrap();
        let st = shared.stats();
        assert_eq!(st.requested.current, 0);
        assert_eq!(st.allocs, 8000);
    }
}
