//! `host`: "device" memory that is real host memory, so that data really moves.
//!
//! Tests write bytes through the allocator's pointers and read them back; the tiering
//! layer copies real bytes between its tiers. Work is synchronous: a copy is
//! done when `copy` returns, so every event is complete as soon as it is recorded.
//!
//! Memory comes from the global allocator's `alloc_zeroed` with its natural 16-byte
//! alignment, over-allocated by 4 KiB and aligned up here. (With a larger `Layout`
//! alignment Rust's system allocator zeroes the block itself, touching every page: a
//! 10 GB reserve took 44 s of system time; plain `calloc` gets lazily zeroed pages.) So
//! untouched memory costs no RAM, and a growable segment reserves its whole range at
//! once (like `cuMemAddressReserve`); `grow`/`shrink` only move the accessible limit,
//! which every read, write and copy checks.
//!
//! This file's `unsafe` is the regions' allocation and the copies within them; each
//! block says why it is sound (the crate docs list every place `unsafe` lives).

use std::alloc::Layout;
use std::collections::{BTreeMap, BTreeSet};

use super::{
    BackendError, DeviceBackend, DevicePtr, EventId, HostPtr, MemRef, StreamId, StreamPriority,
};

const ALIGN: usize = 4096;

#[derive(Debug)]
struct Region {
    /// What the global allocator returned (freed with `layout`).
    raw: usize,
    len: u64,
    /// Accessible prefix (== len except for growable segments).
    mapped: u64,
    /// Growable: offsets of the pages inside `[0, mapped)` that `unmap_pages` released
    /// (an access to them is refused, as the device would fault).
    unbacked: BTreeSet<u64>,
    layout: Layout,
    kind: RegionKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RegionKind {
    Fixed,
    Growable,
    Host { pinned: bool },
}

/// Real host memory behind the [`DeviceBackend`] trait, with a capacity limit.
#[derive(Debug)]
pub struct HostBackend {
    capacity: u64,
    used: u64,
    regions: BTreeMap<u64, Region>,
    streams: u32,
    events: Vec<bool>,
    start: std::time::Instant,
}

impl HostBackend {
    /// A "device" of `capacity` bytes (device segments only; host buffers are not
    /// counted against it).
    pub fn new(capacity: u64) -> Self {
        HostBackend {
            capacity,
            used: 0,
            regions: BTreeMap::new(),
            streams: 1,
            events: Vec::new(),
            start: std::time::Instant::now(),
        }
    }

    fn raw_alloc(&mut self, bytes: u64, kind: RegionKind) -> Result<u64, BackendError> {
        let size = usize::try_from(bytes)
            .map_err(|_| BackendError::Invalid(format!("{bytes} bytes do not fit usize")))?;
        let total = size
            .max(1)
            .checked_add(ALIGN)
            .ok_or_else(|| BackendError::Invalid(format!("{bytes} bytes overflow")))?;
        let layout =
            Layout::from_size_align(total, 16).map_err(|e| BackendError::Invalid(e.to_string()))?;
        // SAFETY: `layout` has a non-zero size and a valid alignment; the pointer is
        // checked for null before use and freed exactly once, with the same layout, in
        // `raw_free` or `Drop` (it is kept in `Region::raw`).
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(match kind {
                RegionKind::Host { .. } => BackendError::HostOutOfMemory { requested: bytes },
                _ => BackendError::OutOfMemory {
                    requested: bytes,
                    available: 0,
                },
            });
        }
        let base = (p as usize).next_multiple_of(ALIGN) as u64;
        let mapped = if kind == RegionKind::Growable {
            0
        } else {
            bytes
        };
        self.regions.insert(
            base,
            Region {
                raw: p as usize,
                len: bytes,
                mapped,
                unbacked: BTreeSet::new(),
                layout,
                kind,
            },
        );
        Ok(base)
    }

    fn raw_free(&mut self, base: u64) {
        if let Some(r) = self.regions.remove(&base) {
            // SAFETY: `r.raw` was returned by `alloc_zeroed` with exactly `r.layout` in
            // `raw_alloc`, and its region is removed here, so it is freed once.
            unsafe { std::alloc::dealloc(r.raw as *mut u8, r.layout) };
        }
    }

    /// The region holding `[addr, addr+len)` within its accessible prefix.
    fn resolve(&self, addr: u64, len: u64) -> Result<*mut u8, BackendError> {
        let (&base, r) = self
            .regions
            .range(..=addr)
            .next_back()
            .ok_or_else(|| BackendError::Invalid(format!("address {addr:#x} is not mapped")))?;
        let end = addr
            .checked_add(len)
            .ok_or_else(|| BackendError::Invalid("address overflow".into()))?;
        if end > base + r.mapped {
            return Err(BackendError::Invalid(format!(
                "[{addr:#x}, {end:#x}) is outside the mapped region at {base:#x} ({} bytes)",
                r.mapped
            )));
        }
        if !r.unbacked.is_empty() && len > 0 {
            let g = self.granularity();
            let first = (addr - base) / g * g;
            if let Some(p) = r.unbacked.range(first..end - base).next() {
                return Err(BackendError::Invalid(format!(
                    "[{addr:#x}, {end:#x}) touches the released page at {:#x}",
                    base + p
                )));
            }
        }
        Ok(addr as *mut u8)
    }

    fn addr(m: MemRef) -> u64 {
        match m {
            MemRef::Device(d) => d.0,
            MemRef::Host(h) => h.0,
        }
    }

    fn check_stream(&self, s: StreamId) -> Result<(), BackendError> {
        if s < self.streams {
            Ok(())
        } else {
            Err(BackendError::Invalid(format!("unknown stream {s}")))
        }
    }

    fn check_event(&self, e: EventId) -> Result<(), BackendError> {
        match self.events.get(e.0 as usize) {
            Some(true) => Ok(()),
            _ => Err(BackendError::Invalid(format!("unknown event {}", e.0))),
        }
    }
}

impl HostBackend {
    /// The growable region at `base`.
    fn growable_mut(&mut self, base: DevicePtr) -> Result<&mut Region, BackendError> {
        self.regions
            .get_mut(&base.0)
            .filter(|r| r.kind == RegionKind::Growable)
            .ok_or_else(|| BackendError::Invalid(format!("unknown growable segment {base}")))
    }

    /// The growable region at `base`, if `[off, off+len)` passes
    /// [`super::check_page_range`] (each page backed, or each released).
    fn pages(
        &mut self,
        base: DevicePtr,
        off: u64,
        len: u64,
        backed: bool,
    ) -> Result<&mut Region, BackendError> {
        let g = self.granularity();
        let r = self.growable_mut(base)?;
        let released = |p| r.unbacked.contains(&p);
        super::check_page_range(base, (off, len), (g, r.mapped), backed, released)?;
        Ok(r)
    }
}

impl Drop for HostBackend {
    fn drop(&mut self) {
        let bases: Vec<u64> = self.regions.keys().copied().collect();
        for b in bases {
            self.raw_free(b);
        }
    }
}

impl DeviceBackend for HostBackend {
    fn name(&self) -> &'static str {
        "host"
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn used(&self) -> u64 {
        self.used
    }

    fn allocate(&mut self, bytes: u64, stream: StreamId) -> Result<DevicePtr, BackendError> {
        self.check_stream(stream)?;
        if bytes == 0 {
            return Err(BackendError::Invalid("zero-size device allocation".into()));
        }
        if bytes > self.capacity - self.used {
            return Err(BackendError::OutOfMemory {
                requested: bytes,
                available: self.capacity - self.used,
            });
        }
        let p = self.raw_alloc(bytes, RegionKind::Fixed)?;
        self.used += bytes;
        Ok(DevicePtr(p))
    }

    fn deallocate(
        &mut self,
        ptr: DevicePtr,
        bytes: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        self.check_stream(stream)?;
        match self.regions.get(&ptr.0) {
            Some(r) if r.kind == RegionKind::Fixed && r.len == bytes => {}
            _ => {
                return Err(BackendError::Invalid(format!(
                    "free of {ptr} ({bytes} bytes): not a segment of this backend"
                )))
            }
        }
        self.raw_free(ptr.0);
        self.used -= bytes;
        Ok(())
    }

    fn supports_growable(&self) -> bool {
        true
    }

    fn reserve_growable(&mut self, max_bytes: u64) -> Result<DevicePtr, BackendError> {
        // Twice the capacity at most: with pages released inside it, a segment can
        // span more than the memory behind it, never more than twice (the allocator
        // asks for that much).
        let max = max_bytes.min(2 * self.capacity.next_multiple_of(self.granularity()));
        Ok(DevicePtr(self.raw_alloc(max, RegionKind::Growable)?))
    }

    fn grow(&mut self, base: DevicePtr, mapped: u64, add: u64) -> Result<(), BackendError> {
        let g = self.granularity();
        let available = self.capacity - self.used;
        let r = self.growable_mut(base)?;
        if r.mapped != mapped || !add.is_multiple_of(g) {
            return Err(BackendError::Invalid(format!(
                "grow of {base}: mapped {mapped} (backend has {}), add {add}",
                r.mapped
            )));
        }
        if add > available || mapped + add > r.len {
            return Err(BackendError::OutOfMemory {
                requested: add,
                available: available.min(r.len - mapped),
            });
        }
        r.mapped += add;
        self.used += add;
        Ok(())
    }

    fn shrink(&mut self, base: DevicePtr, mapped: u64, release: u64) -> Result<(), BackendError> {
        let g = self.granularity();
        let r = self.growable_mut(base)?;
        if r.mapped != mapped || release > mapped || !release.is_multiple_of(g) {
            return Err(BackendError::Invalid(format!(
                "shrink of {base}: mapped {mapped} (backend has {}), release {release}",
                r.mapped
            )));
        }
        let from = r.mapped - release;
        let holes = r.unbacked.split_off(&from).len() as u64 * g;
        r.mapped -= release;
        self.used -= release - holes;
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
        // Copies run at once here; the stream must exist all the same.
        self.synchronize_stream(stream)?;
        let g = self.granularity();
        let r = self.pages(base, off, len, true)?;
        r.unbacked.extend((off..off + len).step_by(g as usize));
        self.used -= len;
        Ok(())
    }

    fn map_pages(&mut self, base: DevicePtr, off: u64, len: u64) -> Result<(), BackendError> {
        let g = self.granularity();
        let available = self.capacity - self.used;
        let r = self.pages(base, off, len, false)?;
        if len > available {
            return Err(BackendError::OutOfMemory {
                requested: len,
                available,
            });
        }
        for p in (off..off + len).step_by(g as usize) {
            r.unbacked.remove(&p);
        }
        // Memory backed again holds no earlier bytes: poison it, so that a test reading
        // data through a page that was released and backed again sees the loss.
        // SAFETY: `[base+off, +len)` lies inside the region's allocation (checked by
        // `pages` against `mapped <= len`), which this backend owns.
        unsafe { std::ptr::write_bytes((base.0 + off) as *mut u8, 0xA5, len as usize) };
        self.used += len;
        Ok(())
    }

    fn release_growable(&mut self, base: DevicePtr, mapped: u64) -> Result<(), BackendError> {
        match self.regions.get(&base.0) {
            Some(r) if r.kind == RegionKind::Growable && r.mapped == mapped => {}
            _ => {
                return Err(BackendError::Invalid(format!(
                    "release of {base}: not a growable segment with {mapped} bytes mapped"
                )))
            }
        }
        let holes = self.regions[&base.0].unbacked.len() as u64 * self.granularity();
        self.used -= mapped - holes;
        self.raw_free(base.0);
        Ok(())
    }

    fn allocate_host(&mut self, bytes: u64, pinned: bool) -> Result<HostPtr, BackendError> {
        Ok(HostPtr(self.raw_alloc(bytes, RegionKind::Host { pinned })?))
    }

    fn deallocate_host(&mut self, ptr: HostPtr, bytes: u64) -> Result<(), BackendError> {
        match self.regions.get(&ptr.0) {
            Some(r) if matches!(r.kind, RegionKind::Host { .. }) && r.len == bytes => {
                self.raw_free(ptr.0);
                Ok(())
            }
            _ => Err(BackendError::Invalid(format!(
                "free of host buffer {:#x} ({bytes} bytes): not one of this backend",
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
        if let Some(s) = stream {
            self.check_stream(s)?;
        }
        let d = self.resolve(Self::addr(dst), bytes)?;
        let s = self.resolve(Self::addr(src), bytes)?;
        // SAFETY: both ranges were checked to lie inside live, accessible regions that
        // this backend owns; `copy` (memmove) allows them to overlap.
        unsafe { std::ptr::copy(s, d, bytes as usize) };
        Ok(())
    }

    fn write(&mut self, dst: MemRef, data: &[u8]) -> Result<(), BackendError> {
        let d = self.resolve(Self::addr(dst), data.len() as u64)?;
        // SAFETY: the destination range lies inside a live region of this backend and
        // cannot overlap `data`, which the caller borrows from its own memory... unless
        // it points into our region; `copy` (memmove) is sound in both cases.
        unsafe { std::ptr::copy(data.as_ptr(), d, data.len()) };
        Ok(())
    }

    fn read(&mut self, src: MemRef, out: &mut [u8]) -> Result<(), BackendError> {
        let s = self.resolve(Self::addr(src), out.len() as u64)?;
        // SAFETY: the source range lies inside a live region of this backend; `out` is
        // an exclusive borrow of the right length; memmove handles any overlap.
        unsafe { std::ptr::copy(s, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn create_stream(&mut self, _priority: StreamPriority) -> Result<StreamId, BackendError> {
        self.streams += 1;
        Ok(self.streams - 1)
    }

    fn create_event(&mut self) -> Result<EventId, BackendError> {
        if let Some(i) = self.events.iter().position(|&live| !live) {
            self.events[i] = true;
            return Ok(EventId(i as u32));
        }
        self.events.push(true);
        Ok(EventId(self.events.len() as u32 - 1))
    }

    fn destroy_event(&mut self, event: EventId) -> Result<(), BackendError> {
        self.check_event(event)?;
        self.events[event.0 as usize] = false;
        Ok(())
    }

    fn record_event(&mut self, event: EventId, stream: StreamId) -> Result<(), BackendError> {
        self.check_event(event)?;
        self.check_stream(stream)
    }

    fn stream_wait_event(&mut self, stream: StreamId, event: EventId) -> Result<(), BackendError> {
        self.check_event(event)?;
        self.check_stream(stream)
    }

    fn query_event(&mut self, event: EventId) -> Result<bool, BackendError> {
        self.check_event(event)?;
        Ok(true)
    }

    fn synchronize_event(&mut self, event: EventId) -> Result<(), BackendError> {
        self.check_event(event)
    }

    fn synchronize_stream(&mut self, stream: StreamId) -> Result<(), BackendError> {
        self.check_stream(stream)
    }

    fn now_us(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1e6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_through_device_and_host_buffers() {
        let mut b = HostBackend::new(16 << 20);
        let d = b.allocate(1 << 20, 0).unwrap();
        let h = b.allocate_host(4096, true).unwrap();
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        b.write(MemRef::Host(h), &data).unwrap();
        b.copy(
            MemRef::Device(d.offset(1000)),
            MemRef::Host(h),
            4096,
            Some(0),
        )
        .unwrap();
        let mut out = vec![0u8; 4096];
        b.read(MemRef::Device(d.offset(1000)), &mut out).unwrap();
        assert_eq!(out, data);
        // Out of bounds is an error, not a crash.
        assert!(b.read(MemRef::Device(d.offset(1 << 20)), &mut out).is_err());
        b.deallocate(d, 1 << 20, 0).unwrap();
        assert!(b.read(MemRef::Device(d), &mut out).is_err());
        b.deallocate_host(h, 4096).unwrap();
    }

    #[test]
    fn growable_segment_limits_access_to_the_mapped_prefix() {
        let mut b = HostBackend::new(8 << 20);
        let base = b.reserve_growable(1 << 40).unwrap();
        assert!(b.write(MemRef::Device(base), &[1]).is_err());
        b.grow(base, 0, 2 << 20).unwrap();
        b.write(MemRef::Device(base.offset((2 << 20) - 1)), &[1])
            .unwrap();
        assert!(b.write(MemRef::Device(base.offset(2 << 20)), &[1]).is_err());
        assert!(b.grow(base, 2 << 20, 8 << 20).unwrap_err().is_oom());
        b.shrink(base, 2 << 20, 2 << 20).unwrap();
        b.release_growable(base, 0).unwrap();
        assert_eq!(b.used(), 0);
    }
}
