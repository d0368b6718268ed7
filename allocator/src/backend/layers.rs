//! Adaptors over any [`DeviceBackend`], one behaviour each (RMM's layering):
//!
//! - [`Counting`]: counts device allocations, frees, maps and unmaps, and their bytes;
//! - [`Limit`]: refuses device memory beyond a byte budget (an `OutOfMemory` error);
//! - [`FailOnDemand`]: injects failures on command, for tests of error paths.
//!
//! They nest: `Counting<Limit<FailOnDemand<SimBackend>>>` is a valid backend.

use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::{forward_backend, BackendError, DeviceBackend, DevicePtr, StreamId};

/// Call counts and byte totals seen by a [`Counting`] layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CallCounts {
    /// Fixed segments obtained (`cudaMalloc`).
    pub allocs: u64,
    /// Fixed segments returned (`cudaFree`).
    pub frees: u64,
    /// Growable-segment maps (`cuMemCreate` + `cuMemMap` of one chunk, or of pages
    /// backed again).
    pub maps: u64,
    /// Growable-segment unmaps (a tail, or pages inside the mapped range).
    pub unmaps: u64,
    pub alloc_bytes: u64,
    pub free_bytes: u64,
    pub failures: u64,
}

/// Counts the device calls that pass through it.
#[derive(Debug)]
pub struct Counting<B> {
    pub inner: B,
    counts: CallCounts,
}

impl<B> Counting<B> {
    pub fn new(inner: B) -> Self {
        Counting {
            inner,
            counts: CallCounts::default(),
        }
    }
    pub fn counts(&self) -> CallCounts {
        self.counts
    }
}

impl<B: DeviceBackend> DeviceBackend for Counting<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }
    fn used(&self) -> u64 {
        self.inner.used()
    }
    fn granularity(&self) -> u64 {
        self.inner.granularity()
    }
    forward_backend!(self => mut: (CountingView(self)); ref: (self.inner));
}

/// Borrowed view through which [`Counting`] forwards: intercepts the four counted
/// calls and passes the rest to the inner backend.
struct CountingView<'a, B>(&'a mut Counting<B>);

impl<B: DeviceBackend> CountingView<'_, B> {
    fn tally<T>(
        &mut self,
        r: Result<T, BackendError>,
        f: impl FnOnce(&mut CallCounts),
    ) -> Result<T, BackendError> {
        match &r {
            Ok(_) => f(&mut self.0.counts),
            Err(_) => self.0.counts.failures += 1,
        }
        r
    }
    fn allocate(&mut self, bytes: u64, stream: StreamId) -> Result<DevicePtr, BackendError> {
        let r = self.0.inner.allocate(bytes, stream);
        self.tally(r, |c| {
            c.allocs += 1;
            c.alloc_bytes += bytes;
        })
    }
    fn deallocate(
        &mut self,
        ptr: DevicePtr,
        bytes: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        let r = self.0.inner.deallocate(ptr, bytes, stream);
        self.tally(r, |c| {
            c.frees += 1;
            c.free_bytes += bytes;
        })
    }
    fn grow(&mut self, base: DevicePtr, mapped: u64, add: u64) -> Result<(), BackendError> {
        let r = self.0.inner.grow(base, mapped, add);
        self.tally(r, |c| {
            c.maps += 1;
            c.alloc_bytes += add;
        })
    }
    fn shrink(&mut self, base: DevicePtr, mapped: u64, release: u64) -> Result<(), BackendError> {
        let r = self.0.inner.shrink(base, mapped, release);
        self.tally(r, |c| {
            c.unmaps += 1;
            c.free_bytes += release;
        })
    }
    fn map_pages(&mut self, base: DevicePtr, off: u64, len: u64) -> Result<(), BackendError> {
        let r = self.0.inner.map_pages(base, off, len);
        self.tally(r, |c| {
            c.maps += 1;
            c.alloc_bytes += len;
        })
    }
    fn unmap_pages(
        &mut self,
        base: DevicePtr,
        off: u64,
        len: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        let r = self.0.inner.unmap_pages(base, off, len, stream);
        self.tally(r, |c| {
            c.unmaps += 1;
            c.free_bytes += len;
        })
    }
    fn release_growable(&mut self, base: DevicePtr, mapped: u64) -> Result<(), BackendError> {
        let r = self.0.inner.release_growable(base, mapped);
        self.tally(r, |c| {
            if mapped > 0 {
                c.unmaps += 1;
                c.free_bytes += mapped;
            }
        })
    }
}

// Everything CountingView does not intercept goes straight to the inner backend.
impl<B: DeviceBackend> std::ops::Deref for CountingView<'_, B> {
    type Target = B;
    fn deref(&self) -> &B {
        &self.0.inner
    }
}
impl<B: DeviceBackend> std::ops::DerefMut for CountingView<'_, B> {
    fn deref_mut(&mut self) -> &mut B {
        &mut self.0.inner
    }
}

/// Refuses device memory beyond `limit` bytes in use (fixed + mapped), as a device of
/// that size would: `OutOfMemory`, which the allocator handles (release caches, retry).
#[derive(Debug)]
pub struct Limit<B> {
    pub inner: B,
    limit: u64,
}

impl<B: DeviceBackend> Limit<B> {
    pub fn new(inner: B, limit: u64) -> Self {
        Limit { inner, limit }
    }
    pub fn limit(&self) -> u64 {
        self.limit
    }
    fn check(&self, bytes: u64) -> Result<(), BackendError> {
        let used = self.inner.used();
        if used.saturating_add(bytes) > self.limit {
            Err(BackendError::OutOfMemory {
                requested: bytes,
                available: self.limit.saturating_sub(used),
            })
        } else {
            Ok(())
        }
    }
}

impl<B: DeviceBackend> DeviceBackend for Limit<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capacity(&self) -> u64 {
        self.limit.min(self.inner.capacity())
    }
    fn used(&self) -> u64 {
        self.inner.used()
    }
    fn granularity(&self) -> u64 {
        self.inner.granularity()
    }
    forward_backend!(self => mut: (LimitView(self)); ref: (self.inner));
}

struct LimitView<'a, B>(&'a mut Limit<B>);

impl<B: DeviceBackend> LimitView<'_, B> {
    fn allocate(&mut self, bytes: u64, stream: StreamId) -> Result<DevicePtr, BackendError> {
        self.0.check(bytes)?;
        self.0.inner.allocate(bytes, stream)
    }
    fn grow(&mut self, base: DevicePtr, mapped: u64, add: u64) -> Result<(), BackendError> {
        self.0.check(add)?;
        self.0.inner.grow(base, mapped, add)
    }
    fn map_pages(&mut self, base: DevicePtr, off: u64, len: u64) -> Result<(), BackendError> {
        self.0.check(len)?;
        self.0.inner.map_pages(base, off, len)
    }
}

impl<B: DeviceBackend> std::ops::Deref for LimitView<'_, B> {
    type Target = B;
    fn deref(&self) -> &B {
        &self.0.inner
    }
}
impl<B: DeviceBackend> std::ops::DerefMut for LimitView<'_, B> {
    fn deref_mut(&mut self) -> &mut B {
        &mut self.0.inner
    }
}

/// What a [`FailOnDemand`] layer does to the next calls.
#[derive(Debug, Clone, Default)]
pub struct FailPlan {
    /// Fail this many of the next device allocations/maps (then succeed again).
    pub fail_next_allocs: u64,
    /// Fail every device allocation/map while set.
    pub fail_all_allocs: bool,
    /// Fail this many of the next page maps (`map_pages`) with
    /// [`BackendError::Injected`], an error other than out of memory.
    pub fail_next_maps: u64,
    /// Fail this many of the next copies.
    pub fail_next_copies: u64,
    /// Let this many copies through before `fail_next_copies` fail (the second part
    /// of a transfer in two parts, say).
    pub pass_copies: u64,
    /// Fail this many of the next host-buffer allocations.
    pub fail_next_host_allocs: u64,
    /// Fail this many of the next event records (`record_event`).
    pub fail_next_records: u64,
    /// Fail this many of the next stream synchronizations (`synchronize_stream`).
    pub fail_next_stream_syncs: u64,
    /// How many failures were injected so far.
    pub injected: u64,
}

/// A handle to steer a [`FailOnDemand`] layer after the backend was moved into an
/// allocator.
#[derive(Debug, Clone, Default)]
pub struct FailSwitch(Arc<Mutex<FailPlan>>);

impl FailSwitch {
    pub fn fail_next_allocs(&self, n: u64) {
        self.plan().fail_next_allocs = n;
    }
    pub fn fail_all_allocs(&self, on: bool) {
        self.plan().fail_all_allocs = on;
    }
    pub fn fail_next_maps(&self, n: u64) {
        self.plan().fail_next_maps = n;
    }
    pub fn fail_next_copies(&self, n: u64) {
        self.plan().fail_next_copies = n;
    }
    /// Fails `n` copies after letting the next `pass` through.
    pub fn fail_copies_after(&self, pass: u64, n: u64) {
        let mut p = self.plan();
        p.pass_copies = pass;
        p.fail_next_copies = n;
    }
    pub fn fail_next_host_allocs(&self, n: u64) {
        self.plan().fail_next_host_allocs = n;
    }
    pub fn fail_next_records(&self, n: u64) {
        self.plan().fail_next_records = n;
    }
    pub fn fail_next_stream_syncs(&self, n: u64) {
        self.plan().fail_next_stream_syncs = n;
    }
    pub fn injected(&self) -> u64 {
        self.plan().injected
    }
    fn plan(&self) -> std::sync::MutexGuard<'_, FailPlan> {
        // A panic while holding this lock can only come from a test; recover the plan.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Injects failures on command: device allocations and maps fail as out of memory,
/// copies, host allocations, event records, stream synchronizations and
/// (`fail_next_maps`) page maps with [`BackendError::Injected`].
#[derive(Debug)]
pub struct FailOnDemand<B> {
    pub inner: B,
    switch: FailSwitch,
}

impl<B: DeviceBackend> FailOnDemand<B> {
    pub fn new(inner: B) -> (Self, FailSwitch) {
        let switch = FailSwitch::default();
        (
            FailOnDemand {
                inner,
                switch: switch.clone(),
            },
            switch,
        )
    }

    /// One injected [`BackendError::Injected`] if the counter `pick` selects is
    /// positive (and one less of them to come).
    fn injected(
        &self,
        pick: fn(&mut FailPlan) -> &mut u64,
        what: impl FnOnce() -> String,
    ) -> Result<(), BackendError> {
        let mut p = self.switch.plan();
        let n = pick(&mut p);
        if *n == 0 {
            return Ok(());
        }
        *n -= 1;
        p.injected += 1;
        Err(BackendError::Injected(what()))
    }

    fn alloc_fails(&self, bytes: u64) -> Result<(), BackendError> {
        let mut p = self.switch.plan();
        if p.fail_all_allocs || p.fail_next_allocs > 0 {
            p.fail_next_allocs = p.fail_next_allocs.saturating_sub(1);
            p.injected += 1;
            return Err(BackendError::OutOfMemory {
                requested: bytes,
                available: 0,
            });
        }
        Ok(())
    }
}

impl<B: DeviceBackend> DeviceBackend for FailOnDemand<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }
    fn used(&self) -> u64 {
        self.inner.used()
    }
    fn granularity(&self) -> u64 {
        self.inner.granularity()
    }
    forward_backend!(self => mut: (FailView(self)); ref: (self.inner));
}

struct FailView<'a, B>(&'a mut FailOnDemand<B>);

impl<B: DeviceBackend> FailView<'_, B> {
    fn allocate(&mut self, bytes: u64, stream: StreamId) -> Result<DevicePtr, BackendError> {
        self.0.alloc_fails(bytes)?;
        self.0.inner.allocate(bytes, stream)
    }
    fn grow(&mut self, base: DevicePtr, mapped: u64, add: u64) -> Result<(), BackendError> {
        self.0.alloc_fails(add)?;
        self.0.inner.grow(base, mapped, add)
    }
    fn map_pages(&mut self, base: DevicePtr, off: u64, len: u64) -> Result<(), BackendError> {
        self.0.injected(
            |p| &mut p.fail_next_maps,
            || format!("page map of {len} bytes"),
        )?;
        self.0.alloc_fails(len)?;
        self.0.inner.map_pages(base, off, len)
    }
    fn copy(
        &mut self,
        dst: super::MemRef,
        src: super::MemRef,
        bytes: u64,
        stream: Option<StreamId>,
    ) -> Result<(), BackendError> {
        let pass = {
            let mut p = self.0.switch.plan();
            let pass = p.pass_copies > 0 && p.fail_next_copies > 0;
            if pass {
                p.pass_copies -= 1;
            }
            pass
        };
        if !pass {
            self.0.injected(
                |p| &mut p.fail_next_copies,
                || format!("copy of {bytes} bytes"),
            )?;
        }
        self.0.inner.copy(dst, src, bytes, stream)
    }
    fn allocate_host(&mut self, bytes: u64, pinned: bool) -> Result<super::HostPtr, BackendError> {
        self.0.injected(
            |p| &mut p.fail_next_host_allocs,
            || format!("host allocation of {bytes} bytes"),
        )?;
        self.0.inner.allocate_host(bytes, pinned)
    }
    fn record_event(&mut self, e: super::EventId, s: StreamId) -> Result<(), BackendError> {
        self.0.injected(
            |p| &mut p.fail_next_records,
            || format!("record of event {} on stream {s}", e.0),
        )?;
        self.0.inner.record_event(e, s)
    }
    fn synchronize_stream(&mut self, s: StreamId) -> Result<(), BackendError> {
        self.0.injected(
            |p| &mut p.fail_next_stream_syncs,
            || format!("synchronization of stream {s}"),
        )?;
        self.0.inner.synchronize_stream(s)
    }
}

impl<B: DeviceBackend> std::ops::Deref for FailView<'_, B> {
    type Target = B;
    fn deref(&self) -> &B {
        &self.0.inner
    }
}
impl<B: DeviceBackend> std::ops::DerefMut for FailView<'_, B> {
    fn deref_mut(&mut self) -> &mut B {
        &mut self.0.inner
    }
}

#[cfg(test)]
mod tests {
    use super::super::sim::SimBackend;
    use super::*;

    #[test]
    fn layers_compose_and_count() {
        let (fail, switch) = FailOnDemand::new(SimBackend::h200());
        let mut b = Counting::new(Limit::new(fail, 10 << 20));
        let p = b.allocate(8 << 20, 0).unwrap();
        assert!(b.allocate(4 << 20, 0).unwrap_err().is_oom());
        switch.fail_next_allocs(1);
        assert!(b.allocate(1 << 20, 0).unwrap_err().is_oom());
        let q = b.allocate(1 << 20, 0).unwrap();
        b.deallocate(p, 8 << 20, 0).unwrap();
        b.deallocate(q, 1 << 20, 0).unwrap();
        let c = b.counts();
        assert_eq!((c.allocs, c.frees, c.failures), (2, 2, 2));
        assert_eq!(switch.injected(), 1);
        assert_eq!(b.capacity(), 10 << 20);
    }
}
