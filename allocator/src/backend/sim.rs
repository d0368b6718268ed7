//! `sim`: a simulated device with no memory and the measured costs of a GPU
//! ([`CostModel`]: an NVIDIA H200's by default, `CostModel::h100` an H100's).
//!
//! The default constants were measured on an NVIDIA H200 (p50 host wall time per call,
//! copy bandwidths measured with CUDA events). Between measured sizes the cost is
//! interpolated linearly in log(size); outside them it is clamped to the nearest point.
//!
//! Time model:
//! - `now` is the host clock. A device malloc/free blocks the host for its cost (that
//!   time is counted as stall); `cudaFree` also synchronizes the device first, as the
//!   real one does.
//! - each stream has a timeline (`ready`: when its queued work ends). An asynchronous
//!   copy starts at `max(now, ready[stream], link free)` and occupies its link for
//!   `latency + bytes / bandwidth`; H2D and D2H are separate links (so both directions
//!   overlap: the measured 102 GB/s duplex is ~2 x 51), D2D and H2H have their own.
//!   One to or from pageable host memory also blocks the host until it ends (counted
//!   as stall), as the driver's "asynchronous" copies with pageable memory do.
//! - an event completes at the `ready` time of its stream when recorded.
//! - growable segments: mapping costs `map_page_us` per page of the granularity (2 MiB)
//!   and unmapping `unmap_page_us` per page, the figures measured on the H200 with the
//!   CUDA backend (docs/cuda.md: `cuMemCreate` + `cuMemMap` per page, `cuMemUnmap` +
//!   `cuMemRelease` per page). Before that measurement the sim charged `cudaMalloc(n)`
//!   / `cudaFree(n)` for `n` bytes, which is right for one page and 12x (32 MiB) to 86x
//!   (256 MiB) too cheap for larger growths. Pages inside a segment released and backed
//!   again (`unmap_pages`, `map_pages`) cost the same per page; a shrink synchronizes
//!   the device first, a page release waits for the one stream that owns the
//!   pages (`DeviceBackend::unmap_pages`).

use std::collections::{BTreeSet, HashMap};

use super::{
    BackendError, CopyKind, DeviceBackend, DevicePtr, EventId, HostPtr, MemRef, StreamId,
    StreamPriority,
};

#[path = "sim_cost.rs"]
mod cost;
pub use cost::CostModel;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Link {
    H2D,
    D2H,
    D2D,
    H2H,
}

/// A simulated device: accounting and a clock, no memory.
#[derive(Debug)]
pub struct SimBackend {
    cost: CostModel,
    capacity: u64,
    used: u64,
    next_va: u64,
    fixed: HashMap<u64, u64>,
    growable: HashMap<u64, (u64, u64)>,
    /// Per growable segment: offsets of the pages inside its mapped range that
    /// `unmap_pages` released (no memory behind them).
    unbacked: HashMap<u64, BTreeSet<u64>>,
    host: HashMap<u64, (u64, bool)>,
    next_host: u64,
    now: f64,
    stall: f64,
    /// Per stream: when its queued work ends, and its priority.
    streams: Vec<(f64, StreamPriority)>,
    links: HashMap<Link, f64>,
    /// Per event: completion time (None = never recorded, complete).
    events: Vec<Option<Option<f64>>>,
    free_events: Vec<u32>,
}

/// 141 GB: the H200's memory (`torch.cuda.get_device_properties().total_memory`
/// reports about 150,000,000,000 bytes; 141 GiB usable is what matters here).
pub const H200_CAPACITY: u64 = 141 * (1 << 30);

impl SimBackend {
    /// [`super::check_page_range`] for the growable segment at `base`.
    fn check_pages(
        &self,
        base: DevicePtr,
        off: u64,
        len: u64,
        backed: bool,
    ) -> Result<(), BackendError> {
        let &(_, mapped) = self
            .growable
            .get(&base.0)
            .ok_or_else(|| BackendError::Invalid(format!("unknown growable segment {base}")))?;
        let set = self.unbacked.get(&base.0);
        let released = |p| set.is_some_and(|s| s.contains(&p));
        super::check_page_range(
            base,
            (off, len),
            (self.granularity(), mapped),
            backed,
            released,
        )
    }

    /// An H200: 141 GiB, measured costs.
    pub fn h200() -> Self {
        Self::new(H200_CAPACITY, CostModel::h200())
    }

    pub fn new(capacity: u64, cost: CostModel) -> Self {
        SimBackend {
            cost,
            capacity,
            used: 0,
            next_va: 0x7f00_0000_0000,
            fixed: HashMap::new(),
            growable: HashMap::new(),
            unbacked: HashMap::new(),
            host: HashMap::new(),
            next_host: 0x1000_0000_0000,
            now: 0.0,
            stall: 0.0,
            streams: vec![(0.0, StreamPriority::Normal)],
            links: HashMap::new(),
            events: Vec::new(),
            free_events: Vec::new(),
        }
    }

    pub fn cost_model(&self) -> &CostModel {
        &self.cost
    }

    fn block(&mut self, us: f64) {
        self.now += us;
        self.stall += us;
    }

    fn sync_device(&mut self) {
        let end = self.streams.iter().map(|s| s.0).fold(self.now, f64::max);
        let end = self.links.values().copied().fold(end, f64::max);
        if end > self.now {
            self.stall += end - self.now;
            self.now = end;
        }
    }

    fn take_va(&mut self, bytes: u64) -> u64 {
        let base = self.next_va;
        // Keep segments 2 MiB aligned and never reuse addresses (easier debugging).
        self.next_va += bytes.div_ceil(2 << 20).max(1) * (2 << 20);
        base
    }

    fn stream(&self, s: StreamId) -> Result<usize, BackendError> {
        let i = s as usize;
        if i < self.streams.len() {
            Ok(i)
        } else {
            Err(BackendError::Invalid(format!("unknown stream {s}")))
        }
    }

    fn event(&self, e: EventId) -> Result<usize, BackendError> {
        match self.events.get(e.0 as usize) {
            Some(Some(_)) => Ok(e.0 as usize),
            _ => Err(BackendError::Invalid(format!("unknown event {}", e.0))),
        }
    }

    fn oom(&self, requested: u64) -> BackendError {
        BackendError::OutOfMemory {
            requested,
            available: self.capacity - self.used,
        }
    }

    /// A copy on `link` starting at `start` while the opposite direction is busy shares
    /// the measured duplex bandwidth: at most half of it for this copy.
    fn duplex(&self, link: Link, bytes: u64, dur: f64, start: f64) -> f64 {
        let other = match link {
            Link::H2D => Link::D2H,
            Link::D2H => Link::H2D,
            _ => return dur,
        };
        let busy = self.links.get(&other).copied().unwrap_or(0.0) > start;
        if !busy || self.cost.duplex_gbps <= 0.0 {
            return dur;
        }
        let shared = self.cost.copy_latency_us + bytes as f64 / (self.cost.duplex_gbps / 2.0 * 1e3);
        dur.max(shared)
    }

    fn kind_of(&self, dst: MemRef, src: MemRef) -> Result<(CopyKind, Link), BackendError> {
        let pinned = |h: HostPtr| -> Result<bool, BackendError> {
            self.host
                .get(&h.0)
                .map(|&(_, p)| p)
                // An address inside a buffer (a staging pool's range): O(buffers).
                .or_else(|| {
                    self.host
                        .iter()
                        .find(|(&b, &(len, _))| h.0 > b && h.0 < b + len)
                        .map(|(_, &(_, p))| p)
                })
                .ok_or_else(|| BackendError::Invalid(format!("unknown host buffer {:#x}", h.0)))
        };
        Ok(match (dst, src) {
            (MemRef::Device(_), MemRef::Host(h)) => {
                if pinned(h)? {
                    (CopyKind::HostToDevicePinned, Link::H2D)
                } else {
                    (CopyKind::HostToDevicePageable, Link::H2D)
                }
            }
            (MemRef::Host(h), MemRef::Device(_)) => {
                if pinned(h)? {
                    (CopyKind::DeviceToHostPinned, Link::D2H)
                } else {
                    (CopyKind::DeviceToHostPageable, Link::D2H)
                }
            }
            (MemRef::Device(_), MemRef::Device(_)) => (CopyKind::DeviceToDevice, Link::D2D),
            (MemRef::Host(_), MemRef::Host(_)) => (CopyKind::HostToHost, Link::H2H),
        })
    }
}

impl DeviceBackend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn used(&self) -> u64 {
        self.used
    }

    fn allocate(&mut self, bytes: u64, stream: StreamId) -> Result<DevicePtr, BackendError> {
        self.stream(stream)?;
        if bytes == 0 {
            return Err(BackendError::Invalid("zero-size device allocation".into()));
        }
        let cost = self.cost.malloc_us(bytes);
        self.block(cost);
        if bytes > self.capacity - self.used {
            return Err(self.oom(bytes));
        }
        let base = self.take_va(bytes);
        self.fixed.insert(base, bytes);
        self.used += bytes;
        Ok(DevicePtr(base))
    }

    fn deallocate(
        &mut self,
        ptr: DevicePtr,
        bytes: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        self.stream(stream)?;
        match self.fixed.get(&ptr.0) {
            Some(&b) if b == bytes => {}
            Some(&b) => {
                return Err(BackendError::Invalid(format!(
                    "free of {ptr} with {bytes} bytes, allocated with {b}"
                )))
            }
            None => {
                return Err(BackendError::Invalid(format!(
                    "free of unknown segment {ptr}"
                )))
            }
        }
        self.sync_device();
        let cost = self.cost.free_us(bytes);
        self.block(cost);
        self.fixed.remove(&ptr.0);
        self.used -= bytes;
        Ok(())
    }

    fn supports_growable(&self) -> bool {
        true
    }

    fn reserve_growable(&mut self, max_bytes: u64) -> Result<DevicePtr, BackendError> {
        let base = self.take_va(max_bytes);
        self.growable.insert(base, (max_bytes, 0));
        self.block(self.cost.event_us);
        Ok(DevicePtr(base))
    }

    fn grow(&mut self, base: DevicePtr, mapped: u64, add: u64) -> Result<(), BackendError> {
        let g = self.granularity();
        let &(max, m) = self
            .growable
            .get(&base.0)
            .ok_or_else(|| BackendError::Invalid(format!("unknown growable segment {base}")))?;
        if m != mapped || !add.is_multiple_of(g) || mapped + add > max {
            return Err(BackendError::Invalid(format!(
                "grow of {base}: mapped {mapped} (backend has {m}), add {add}, max {max}"
            )));
        }
        let cost = self.cost.map_page_us * (add / g).max(1) as f64;
        self.block(cost);
        if add > self.capacity - self.used {
            return Err(self.oom(add));
        }
        self.used += add;
        self.growable.insert(base.0, (max, mapped + add));
        Ok(())
    }

    fn shrink(&mut self, base: DevicePtr, mapped: u64, release: u64) -> Result<(), BackendError> {
        let &(max, m) = self
            .growable
            .get(&base.0)
            .ok_or_else(|| BackendError::Invalid(format!("unknown growable segment {base}")))?;
        if m != mapped || release > mapped || !release.is_multiple_of(self.granularity()) {
            return Err(BackendError::Invalid(format!(
                "shrink of {base}: mapped {mapped} (backend has {m}), release {release}"
            )));
        }
        self.sync_device();
        let g = self.granularity();
        let holes = match self.unbacked.get_mut(&base.0) {
            Some(set) => {
                let gone: Vec<u64> = set.range(mapped - release..).copied().collect();
                for p in &gone {
                    set.remove(p);
                }
                gone.len() as u64 * g
            }
            None => 0,
        };
        let cost = self.cost.unmap_page_us * ((release - holes) / g).max(1) as f64;
        self.block(cost);
        self.used -= release - holes;
        self.growable.insert(base.0, (max, mapped - release));
        Ok(())
    }

    fn supports_page_release(&self) -> bool {
        true
    }

    fn unmap_pages(
        &mut self,
        base: DevicePtr,
        off: u64,
        len: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        self.check_pages(base, off, len, true)?;
        self.synchronize_stream(stream)?;
        let g = self.granularity();
        self.block(self.cost.unmap_page_us * (len / g) as f64);
        let set = self.unbacked.entry(base.0).or_default();
        set.extend((off..off + len).step_by(g as usize));
        self.used -= len;
        Ok(())
    }

    fn map_pages(&mut self, base: DevicePtr, off: u64, len: u64) -> Result<(), BackendError> {
        self.check_pages(base, off, len, false)?;
        let g = self.granularity();
        self.block(self.cost.map_page_us * (len / g) as f64);
        if len > self.capacity - self.used {
            return Err(self.oom(len));
        }
        let set = self.unbacked.get_mut(&base.0).expect("checked");
        for p in (off..off + len).step_by(g as usize) {
            set.remove(&p);
        }
        self.used += len;
        Ok(())
    }

    fn release_growable(&mut self, base: DevicePtr, mapped: u64) -> Result<(), BackendError> {
        if mapped > 0 {
            self.shrink(base, mapped, mapped)?;
        }
        self.growable
            .remove(&base.0)
            .ok_or_else(|| BackendError::Invalid(format!("unknown growable segment {base}")))?;
        self.unbacked.remove(&base.0);
        Ok(())
    }

    fn allocate_host(&mut self, bytes: u64, pinned: bool) -> Result<HostPtr, BackendError> {
        let cost = if pinned {
            CostModel::interp(&self.cost.host_alloc_pinned, bytes as f64)
        } else {
            self.cost.host_alloc_pageable_us
        };
        self.block(cost);
        let p = self.next_host;
        self.next_host += bytes.div_ceil(4096).max(1) * 4096;
        self.host.insert(p, (bytes, pinned));
        Ok(HostPtr(p))
    }

    fn deallocate_host(&mut self, ptr: HostPtr, bytes: u64) -> Result<(), BackendError> {
        match self.host.get(&ptr.0) {
            Some(&(b, pinned)) if b == bytes => {
                let cost = if pinned {
                    CostModel::interp(&self.cost.host_free_pinned, bytes as f64)
                } else {
                    self.cost.host_alloc_pageable_us
                };
                self.block(cost);
                self.host.remove(&ptr.0);
                Ok(())
            }
            _ => Err(BackendError::Invalid(format!(
                "free of unknown host buffer {:#x} ({bytes} bytes)",
                ptr.0
            ))),
        }
    }

    fn copy(
        &mut self,
        dst: MemRef,
        src: MemRef,
        bytes: u64,
        stream: Option<StreamId>,
    ) -> Result<(), BackendError> {
        let (kind, link) = self.kind_of(dst, src)?;
        let dur = self.cost.copy_us(kind, bytes);
        // The driver's "asynchronous" copies to or from pageable host memory block the
        // host: one to pageable memory returns only once the copy has completed, one
        // from it once the buffer is staged (modelled: completed), each after the work
        // queued before it on its stream.
        let pageable = matches!(
            kind,
            CopyKind::HostToDevicePageable | CopyKind::DeviceToHostPageable
        );
        match stream {
            None => {
                // Synchronous: waits for the link, then blocks the host for the copy.
                let start = self.links.get(&link).copied().unwrap_or(0.0).max(self.now);
                let end = start + self.duplex(link, bytes, dur, start);
                self.links.insert(link, end);
                self.stall += end - self.now;
                self.now = end;
            }
            Some(s) => {
                let i = self.stream(s)?;
                let start = self.streams[i]
                    .0
                    .max(self.now)
                    .max(self.links.get(&link).copied().unwrap_or(0.0));
                let end = start + self.duplex(link, bytes, dur, start);
                self.links.insert(link, end);
                self.streams[i].0 = end;
                if pageable {
                    self.stall += end - self.now;
                    self.now = end;
                }
            }
        }
        Ok(())
    }

    fn write(&mut self, _dst: MemRef, _data: &[u8]) -> Result<(), BackendError> {
        Err(BackendError::Unsupported("sim (it holds no bytes)"))
    }

    fn read(&mut self, _src: MemRef, _out: &mut [u8]) -> Result<(), BackendError> {
        Err(BackendError::Unsupported("sim (it holds no bytes)"))
    }

    fn create_stream(&mut self, priority: StreamPriority) -> Result<StreamId, BackendError> {
        self.streams.push((self.now, priority));
        Ok((self.streams.len() - 1) as StreamId)
    }

    fn create_event(&mut self) -> Result<EventId, BackendError> {
        if let Some(i) = self.free_events.pop() {
            self.events[i as usize] = Some(None);
            return Ok(EventId(i));
        }
        self.events.push(Some(None));
        Ok(EventId((self.events.len() - 1) as u32))
    }

    fn destroy_event(&mut self, event: EventId) -> Result<(), BackendError> {
        let i = self.event(event)?;
        self.events[i] = None;
        self.free_events.push(i as u32);
        Ok(())
    }

    fn record_event(&mut self, event: EventId, stream: StreamId) -> Result<(), BackendError> {
        let i = self.event(event)?;
        let s = self.stream(stream)?;
        self.events[i] = Some(Some(self.streams[s].0.max(self.now)));
        self.now += self.cost.event_us;
        Ok(())
    }

    fn stream_wait_event(&mut self, stream: StreamId, event: EventId) -> Result<(), BackendError> {
        let i = self.event(event)?;
        let s = self.stream(stream)?;
        if let Some(Some(t)) = self.events[i] {
            self.streams[s].0 = self.streams[s].0.max(t);
        }
        self.now += self.cost.event_us;
        Ok(())
    }

    fn query_event(&mut self, event: EventId) -> Result<bool, BackendError> {
        let i = self.event(event)?;
        Ok(match self.events[i] {
            Some(Some(t)) => t <= self.now,
            _ => true,
        })
    }

    fn synchronize_event(&mut self, event: EventId) -> Result<(), BackendError> {
        let i = self.event(event)?;
        if let Some(Some(t)) = self.events[i] {
            if t > self.now {
                self.stall += t - self.now;
                self.now = t;
            }
        }
        Ok(())
    }

    fn synchronize_stream(&mut self, stream: StreamId) -> Result<(), BackendError> {
        let s = self.stream(stream)?;
        let t = self.streams[s].0;
        if t > self.now {
            self.stall += t - self.now;
            self.now = t;
        }
        Ok(())
    }

    fn now_us(&self) -> f64 {
        self.now
    }

    fn advance_us(&mut self, us: f64) {
        if us > 0.0 {
            self.now += us;
        }
    }

    fn stall_us(&self) -> f64 {
        self.stall
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_interpolate_between_measured_sizes() {
        let c = CostModel::h200();
        assert_eq!(c.malloc_us(2 << 20), 51.0);
        let mid = c.malloc_us(6 << 20);
        assert!(mid > 51.0 && mid < 63.5, "{mid}");
        assert_eq!(c.malloc_us(1), 2.5);
        assert_eq!(c.free_us(4 << 30), 684.5);
        // 1 GiB pinned H2D at 55 GB/s: about 19.5 ms.
        let t = c.copy_us(CopyKind::HostToDevicePinned, 1 << 30);
        assert!((t - (2.0 + (1u64 << 30) as f64 / 55e3)).abs() < 1e-6);
    }

    #[test]
    fn async_copies_overlap_across_directions_and_events_track_them() {
        let mut b = SimBackend::h200();
        let s1 = b.create_stream(StreamPriority::Low).unwrap();
        let s2 = b.create_stream(StreamPriority::Low).unwrap();
        let d = b.allocate(64 << 20, 0).unwrap();
        let h = b.allocate_host(64 << 20, true).unwrap();
        let t0 = b.now_us();
        b.copy(MemRef::Device(d), MemRef::Host(h), 64 << 20, Some(s1))
            .unwrap();
        b.copy(MemRef::Host(h), MemRef::Device(d), 64 << 20, Some(s2))
            .unwrap();
        let e1 = b.create_event().unwrap();
        b.record_event(e1, s1).unwrap();
        assert!(!b.query_event(e1).unwrap());
        b.synchronize_stream(s1).unwrap();
        b.synchronize_stream(s2).unwrap();
        assert!(b.query_event(e1).unwrap());
        let one = b
            .cost_model()
            .copy_us(CopyKind::HostToDevicePinned, 64 << 20);
        // Both directions overlapped: total well under two copies back to back.
        assert!(
            b.now_us() - t0 < 1.5 * one,
            "{} vs {}",
            b.now_us() - t0,
            one
        );
    }

    /// As the driver does: an "asynchronous" copy to or from pageable memory blocks the
    /// host until it is done (after the work queued before it on its stream), where one
    /// to or from pinned memory returns at once.
    #[test]
    fn async_copies_block_the_host_only_with_pageable_memory() {
        let mut b = SimBackend::h200();
        let s = b.create_stream(StreamPriority::Low).unwrap();
        let d = b.allocate(64 << 20, 0).unwrap();
        let pinned = b.allocate_host(64 << 20, true).unwrap();
        let pageable = b.allocate_host(64 << 20, false).unwrap();
        let (t0, st0) = (b.now_us(), b.stall_us());
        b.copy(MemRef::Host(pinned), MemRef::Device(d), 64 << 20, Some(s))
            .unwrap();
        assert_eq!((b.now_us(), b.stall_us()), (t0, st0), "pinned: no wait");
        // Queued behind the pinned copy on the same stream, then waited for.
        b.copy(MemRef::Host(pageable), MemRef::Device(d), 64 << 20, Some(s))
            .unwrap();
        let c = b.cost_model().clone();
        let both = c.copy_us(CopyKind::DeviceToHostPinned, 64 << 20)
            + c.copy_us(CopyKind::DeviceToHostPageable, 64 << 20);
        assert!((b.now_us() - t0 - both).abs() < 1e-6, "{}", b.now_us() - t0);
        assert!((b.stall_us() - st0 - both).abs() < 1e-6);
        // Nothing left on the stream: its synchronization costs nothing more.
        let t1 = b.now_us();
        b.synchronize_stream(s).unwrap();
        assert_eq!(b.now_us(), t1);
        // Host to device from pageable memory blocks too.
        b.copy(MemRef::Device(d), MemRef::Host(pageable), 64 << 20, Some(s))
            .unwrap();
        let h2d = c.copy_us(CopyKind::HostToDevicePageable, 64 << 20);
        assert!((b.now_us() - t1 - h2d).abs() < 1e-6);
    }

    #[test]
    fn oom_and_bad_frees_are_errors() {
        let mut b = SimBackend::new(10 << 20, CostModel::h200());
        let p = b.allocate(8 << 20, 0).unwrap();
        assert!(b.allocate(4 << 20, 0).unwrap_err().is_oom());
        assert!(b.deallocate(p, 4 << 20, 0).is_err());
        assert!(b.deallocate(DevicePtr(12), 4 << 20, 0).is_err());
        b.deallocate(p, 8 << 20, 0).unwrap();
        assert_eq!(b.used(), 0);
        assert!(b.stall_us() > 0.0);
    }

    #[test]
    fn growable_segments_map_and_unmap_by_granule() {
        let mut b = SimBackend::new(64 << 20, CostModel::h200());
        let base = b.reserve_growable(1 << 40).unwrap();
        b.grow(base, 0, 4 << 20).unwrap();
        assert!(b.grow(base, 4 << 20, 1 << 20).is_err());
        b.grow(base, 4 << 20, 2 << 20).unwrap();
        assert_eq!(b.used(), 6 << 20);
        b.shrink(base, 6 << 20, 2 << 20).unwrap();
        b.release_growable(base, 4 << 20).unwrap();
        assert_eq!(b.used(), 0);
    }
}
