//! Page release: physical memory only behind the pages that hold runs.
//!
//! A growable large-run segment is virtually contiguous and mapped page by page
//! (`segment_granule`, 2 MiB). Fragmentation leaves free blocks between live runs; the
//! whole pages inside such a block hold no byte anyone uses, yet keep their physical
//! memory. With `AllocConfig::page_release`, when the device would have to provide
//! memory beyond the peak reserved so far (or has none left), whole free pages give
//! theirs back first (`DeviceBackend::unmap_pages`), and a run later placed over a
//! released page backs it again (`map_pages`). Placement never looks at which pages
//! are backed: the layout is the one the allocator has without page release, so a
//! run's place, the free-block index and every placement figure are unchanged; only
//! the physical memory behind free blocks is.
//!
//! So the peak of reserved bytes becomes, up to the growth chunk, the peak of the pages
//! that hold a live (or cached) byte: at most one partial page at each end of each live
//! stretch above the live bytes themselves.
//!
//! Costs: releasing pages waits for the pool's stream (unmapping is not ordered with
//! queued work; work on other streams cannot be using a free block: their uses hold
//! a block back until their events complete) and costs one unmap per page; backing costs one create + map per page. Both
//! happen only on the slow paths: a miss that grows the device, a placement over a
//! released page. The hot path pays one load and one branch (`PageMap::count`) per
//! run placed from the free-block index; a run from the cache of freed runs was live,
//! so its pages are backed, and pays nothing.
//!
//! Invariants (checked by `Allocator::check_invariants`), per stream pool:
//! - a released page lies inside the large growable segment's mapped range, wholly
//!   inside one free block (never under a used block or a cached run);
//! - `count` == number of released pages;
//! - `mapped - count x page == pool.reserved` for that segment (released pages hold no
//!   device memory), so `reserved + released == free + cached + slab free + pending +
//!   allocated`.

use crate::backend::{BackendError, DeviceBackend, DevicePtr, StreamId};
use crate::buddy::Run;
use crate::config::PageRelease;
use crate::error::AllocError;
use crate::pool::Allocator;

/// The released pages of one growable segment, a bit per page of its mapped range.
#[derive(Debug, Clone, Default)]
pub(crate) struct PageMap {
    bits: Vec<u64>,
    // Invariant: count == number of set bits.
    pub count: u64,
}

impl PageMap {
    pub fn is_released(&self, page: u64) -> bool {
        self.bits
            .get((page / 64) as usize)
            .is_some_and(|w| w >> (page % 64) & 1 == 1)
    }

    fn set(&mut self, page: u64, released: bool) {
        let w = (page / 64) as usize;
        if w >= self.bits.len() {
            self.bits.resize(w + 1, 0);
        }
        let was = self.bits[w] >> (page % 64) & 1 == 1;
        if was != released {
            self.bits[w] ^= 1 << (page % 64);
            if released {
                self.count += 1;
            } else {
                self.count -= 1;
            }
        }
    }

    /// Forgets the pages at and above `end` (a shrink unmapped them); returns how many
    /// of them were released.
    pub fn truncate(&mut self, end: u64) -> u64 {
        let mut gone = 0;
        let top = self.bits.len() as u64 * 64;
        for p in end..top {
            if self.is_released(p) {
                self.set(p, false);
                gone += 1;
            }
        }
        gone
    }

    /// Every released page, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.bits.iter().enumerate().flat_map(|(w, &b)| {
            (0..64)
                .filter(move |i| b >> i & 1 == 1)
                .map(move |i| w as u64 * 64 + i)
        })
    }
}

/// A stretch of backed whole pages inside a free block: `(stream, segment, first
/// page, pages)`.
type Stretch = (StreamId, u32, u64, u64);

impl<B: DeviceBackend> Allocator<B> {
    pub(crate) fn page_release_on(&self) -> bool {
        // Buddy placement (`best_fit:false`) keeps trees, not the free-block index
        // this works on, and carves slabs from any segment: not there.
        self.cfg.page_release != PageRelease::Off
            && self.cfg.best_fit
            && self.cfg.growable_segments
            && self.backend.supports_growable()
            && self.backend.supports_page_release()
    }

    /// Backs the released pages under `run` (`len` bytes) of `stream`, if it lies in
    /// the stream's large growable segment. Hot: one load and one compare when nothing
    /// of the pool is released.
    #[inline]
    pub(crate) fn back_run(
        &mut self,
        stream: StreamId,
        run: &Run,
        len: u64,
    ) -> Result<(), BackendError> {
        let pool = self.pools[stream as usize].as_ref().expect("pool");
        if pool.pages.count == 0 || pool.growable[0] != Some(run.seg) {
            return Ok(());
        }
        self.back_range(stream, run.seg, run.off, len)
    }

    /// [`Allocator::back_run`], undoing the carve when the pages cannot be backed (the
    /// run is free again, the caller sees a miss).
    #[inline]
    pub(crate) fn back_or_undo(
        &mut self,
        stream: StreamId,
        run: &Run,
        len: u64,
    ) -> Result<(), BackendError> {
        let r = self.back_run(stream, run, len);
        if r.is_err() {
            let pool = self.pools[stream as usize].as_mut().expect("pool");
            pool.buddy.free_run(*run, len);
        }
        r
    }

    /// [`Allocator::back_or_undo`] as a placement step reads it: `Ok(true)` backed,
    /// `Ok(false)` out of memory (the carve undone: a miss), `Err` any other device
    /// error (the carve undone too: the request's error).
    #[inline]
    pub(crate) fn back_or_miss(
        &mut self,
        stream: StreamId,
        run: &Run,
        len: u64,
    ) -> Result<bool, AllocError> {
        match self.back_or_undo(stream, run, len) {
            Ok(()) => Ok(true),
            Err(e) if e.is_oom() => Ok(false),
            Err(e) => Err(AllocError::Backend(e)),
        }
    }

    #[cold]
    #[inline(never)]
    fn back_range(
        &mut self,
        stream: StreamId,
        seg: u32,
        off: u64,
        len: u64,
    ) -> Result<(), BackendError> {
        let g = self.granule();
        let (first, end) = (off / g, (off + len).div_ceil(g));
        let mut p = first;
        while p < end {
            let pool = self.pools[stream as usize].as_ref().expect("pool");
            if !pool.pages.is_released(p) {
                p += 1;
                continue;
            }
            let mut q = p + 1;
            while q < end && pool.pages.is_released(q) {
                q += 1;
            }
            let bytes = (q - p) * g;
            let base = pool.buddy.segs[seg].base;
            self.make_room(bytes, Some((stream, seg, first, end)))?;
            if let Err(e) = self.backend.map_pages(DevicePtr(base), p * g, bytes) {
                if !e.is_oom() || self.in_advice {
                    return Err(e);
                }
                // Out of memory: release as the out-of-memory path does and back the
                // same pages, so that where a run goes never depends on which free
                // pages happen to be backed (memory grown ahead of a forecast, a tail
                // not yet trimmed). Advice never releases (it is best effort).
                self.stats.oom_retries += 1;
                let mut r = Err(e);
                if self.release_unplaced().map_err(backend_error)? > 0 {
                    r = self.backend.map_pages(DevicePtr(base), p * g, bytes);
                }
                if matches!(&r, Err(e) if e.is_oom()) {
                    tracing::debug!("device out of memory backing pages: releasing caches");
                    self.release_free_memory().map_err(backend_error)?;
                    r = self.backend.map_pages(DevicePtr(base), p * g, bytes);
                }
                r?;
            }
            let pool = self.pools[stream as usize].as_mut().expect("pool");
            for page in p..q {
                pool.pages.set(page, false);
            }
            pool.reserved += bytes;
            self.stats.reserved.add(bytes);
            self.stats.device_allocs += 1;
            self.stats.pages_backed += q - p;
            p = q;
        }
        Ok(())
    }

    /// Before the device provides `bytes` more: releases free pages (outside `keep`,
    /// `(stream, segment, first page, end page)`) so that reserved memory stays at its
    /// peak and within the device. What cannot be found is left to the device.
    pub(crate) fn make_room(
        &mut self,
        bytes: u64,
        keep: Option<(StreamId, u32, u64, u64)>,
    ) -> Result<(), BackendError> {
        if self.cfg.page_release != PageRelease::Peak || !self.page_release_on() || self.in_advice {
            return Ok(());
        }
        let over_peak =
            (self.stats.reserved.current + bytes).saturating_sub(self.stats.reserved.peak);
        let available = self.backend.capacity().saturating_sub(self.backend.used());
        let want = over_peak.max(bytes.saturating_sub(available));
        if want > 0 {
            self.release_free_pages(want, keep)?;
        }
        Ok(())
    }

    /// Releases up to `want` bytes (rounded up to pages) of free backed pages of every
    /// stream's large growable segment, largest stretches first (the free blocks best
    /// fit reuses last), skipping `keep`. Returns the bytes released. Cost:
    /// O(blocks of those segments) plus one device call per stretch released.
    pub(crate) fn release_free_pages(
        &mut self,
        want: u64,
        keep: Option<(StreamId, u32, u64, u64)>,
    ) -> Result<u64, BackendError> {
        let g = self.granule();
        let mut stretches: Vec<Stretch> = Vec::new();
        for (stream, pool) in self.pools.iter().enumerate() {
            let Some(pool) = pool else { continue };
            let Some(seg) = pool.growable[0] else {
                continue;
            };
            let stream = stream as StreamId;
            for (off, len, free) in pool.buddy.blocks_of(seg) {
                if !free {
                    continue;
                }
                let (mut p, end) = (off.div_ceil(g), (off + len) / g);
                while p < end {
                    let kept =
                        keep.is_some_and(|(s, k, a, b)| s == stream && k == seg && p >= a && p < b);
                    if kept || pool.pages.is_released(p) {
                        p += 1;
                        continue;
                    }
                    let mut q = p + 1;
                    while q < end
                        && !pool.pages.is_released(q)
                        && !keep
                            .is_some_and(|(s, k, a, b)| s == stream && k == seg && q >= a && q < b)
                    {
                        q += 1;
                    }
                    stretches.push((stream, seg, p, q - p));
                    p = q;
                }
            }
        }
        stretches.sort_by(|a, b| b.3.cmp(&a.3).then(a.2.cmp(&b.2)));
        let mut released = 0;
        for (stream, seg, first, n) in stretches {
            if released >= want {
                break;
            }
            let take = n.min((want - released).div_ceil(g));
            // The stretch's top pages: its low end stays backed for a run placed at
            // the block's start (best fit places at a block's start).
            let from = first + n - take;
            let base = self.pools[stream as usize]
                .as_ref()
                .expect("pool")
                .buddy
                .segs[seg]
                .base;
            self.backend
                .unmap_pages(DevicePtr(base), from * g, take * g, stream)?;
            let pool = self.pools[stream as usize].as_mut().expect("pool");
            for page in from..from + take {
                pool.pages.set(page, true);
            }
            pool.reserved -= take * g;
            self.stats.reserved.sub(take * g);
            self.stats.device_frees += 1;
            self.stats.pages_released += take;
            released += take * g;
        }
        Ok(released)
    }

    /// The released bytes of `stream`'s segment `seg` in `[from, to)` (for a shrink,
    /// which gives back only the backed pages of its range), forgotten from the map
    /// when `to` is the segment's mapped end.
    pub(crate) fn forget_released_above(&mut self, stream: StreamId, seg: u32, from: u64) -> u64 {
        let g = self.granule();
        let pool = self.pools[stream as usize].as_mut().expect("pool");
        if pool.growable[0] != Some(seg) || pool.pages.count == 0 {
            return 0;
        }
        pool.pages.truncate(from / g) * g
    }

    /// Checks the page map of every pool (the invariants in the module docs).
    pub(crate) fn check_pages(&self) -> Result<(), String> {
        let g = self.granule();
        for (s, pool) in self.pools.iter().enumerate() {
            let Some(pool) = pool else { continue };
            if pool.pages.iter().count() as u64 != pool.pages.count {
                return Err(format!("stream {s}: released page count disagrees"));
            }
            let Some(seg) = pool.growable[0] else {
                if pool.pages.count != 0 {
                    return Err(format!(
                        "stream {s}: released pages without a growable segment"
                    ));
                }
                continue;
            };
            let mut pages = pool.pages.iter().peekable();
            for (off, len, free) in pool.buddy.blocks_of(seg) {
                while let Some(&p) = pages.peek() {
                    if p * g >= off + len {
                        break;
                    }
                    if !free || p * g < off || (p + 1) * g > off + len {
                        return Err(format!(
                            "stream {s}: released page {p} is not inside a free block ([{off}, +{len}) {})",
                            if free { "free" } else { "used" }
                        ));
                    }
                    pages.next();
                }
            }
            if let Some(p) = pages.next() {
                return Err(format!(
                    "stream {s}: released page {p} beyond the mapped range"
                ));
            }
        }
        Ok(())
    }
}

/// An error of the release paths as the backend error a backing reports (they fail only
/// on a backend call).
#[cold]
fn backend_error(e: AllocError) -> BackendError {
    match e {
        AllocError::Backend(e) | AllocError::OutOfMemory { source: e, .. } => e,
        e => BackendError::Invalid(e.to_string()),
    }
}
