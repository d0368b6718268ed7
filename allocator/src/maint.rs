//! The allocator's slow paths: finding room, growing, releasing, cross-stream frees,
//! advice from a forecaster (the invariant check is in `check.rs`).

use crate::backend::{BackendError, DeviceBackend, DevicePtr, StreamId};
use crate::buddy::Run;
use crate::error::AllocError;
use crate::policy::{Advice, GrowthRequest, SegmentView};
use crate::pool::{Allocator, PendingFree, RecState, Record};
use crate::small::retire_slab;

impl<B: DeviceBackend> Allocator<B> {
    pub(crate) fn granule(&self) -> u64 {
        self.cfg.segment_granule.max(self.backend.granularity())
    }

    fn use_growable(&self) -> bool {
        self.cfg.growable_segments && self.backend.supports_growable()
    }

    /// A free run of `len` bytes for `stream`, tagged `owner`: from the trees, then
    /// after coalescing the cache, then after waiting for pending frees, then from the
    /// device, then (out of memory) after releasing every cached byte of every stream.
    pub(crate) fn obtain_run(
        &mut self,
        stream: StreamId,
        len: u64,
        owner: u32,
        small: bool,
    ) -> Result<Run, AllocError> {
        self.pool_mut(stream)?;
        if let Some(run) = self.try_carve(stream, len, owner, small)? {
            return Ok(run);
        }
        self.obtain_run_after_miss(stream, len, owner, small)
    }

    /// [`Allocator::obtain_run`] for a caller whose `try_carve` has just missed: the
    /// same steps, without searching the placement index again first.
    pub(crate) fn obtain_run_after_miss(
        &mut self,
        stream: StreamId,
        len: u64,
        owner: u32,
        small: bool,
    ) -> Result<Run, AllocError> {
        if self.pool_mut(stream)?.cache.runs() > 0 {
            self.flush_cache(stream)?;
            if let Some(x) = self.try_carve(stream, len, owner, small)? {
                return Ok(x);
            }
        }
        if !self.pending.is_empty() && self.process_pending(true)? > 0 {
            if let Some(x) = self.try_carve(stream, len, owner, small)? {
                return Ok(x);
            }
        }
        let oom = |r: &Result<Run, BackendError>| matches!(r, Err(e) if e.is_oom());
        let mut r = self.grow(stream, len, owner, small);
        // Advice never releases (it is best effort): a flush for a pre-split run would
        // move the runs after it, and a release would undo its own growth.
        if oom(&r) && !self.in_advice {
            self.stats.oom_retries += 1;
            // First what placement never reads (see `release_unplaced`): if that is
            // enough, the caches keep their runs, as they would have had the memory
            // never been taken.
            if self.release_unplaced()? > 0 {
                r = self.grow(stream, len, owner, small);
            }
            if oom(&r) {
                tracing::debug!(
                    len,
                    stream,
                    "device out of memory: releasing caches and retrying"
                );
                self.release_free_memory()?;
                if let Some(x) = self.try_carve(stream, len, owner, small)? {
                    return Ok(x);
                }
                r = self.grow(stream, len, owner, small);
            }
        }
        r.map_err(|source| {
            if source.is_oom() {
                AllocError::OutOfMemory {
                    requested: len,
                    stream,
                    reserved: self.stats.reserved.current,
                    allocated: self.stats.allocated.current,
                    source,
                }
            } else {
                AllocError::Backend(source)
            }
        })
    }

    /// A run from the placement index alone (no flush, no device call but backing
    /// released pages); `Ok(None)` also when the stream has no pool yet, or when the
    /// device is out of memory for the released pages under the run (a miss). Any
    /// other device error is the caller's, the carve undone.
    #[inline(always)]
    pub(crate) fn try_carve(
        &mut self,
        stream: StreamId,
        len: u64,
        owner: u32,
        small: bool,
    ) -> Result<Option<Run>, AllocError> {
        let scan = self.cfg.run_scan;
        let Some(pool) = self.pools[stream as usize].as_mut() else {
            return Ok(None);
        };
        let Some(spot) = pool.buddy.find_run(len, scan, small) else {
            return Ok(None);
        };
        let run = pool.buddy.carve(spot, len, owner);
        // Page release: released pages under the run are backed, or the carve is
        // undone and this is a miss (out of memory) or an error (anything else).
        if !small && pool.pages.count != 0 && !self.back_or_miss(stream, &run, len)? {
            return Ok(None);
        }
        Ok(Some(run))
    }

    fn growth_bytes(
        &mut self,
        stream: StreamId,
        request: u64,
        deficit: u64,
        growable: bool,
        small: bool,
    ) -> u64 {
        let granule = self.granule();
        let available = self.backend.capacity().saturating_sub(self.backend.used());
        let req = GrowthRequest {
            stream,
            request,
            deficit,
            reserved: self.stats.reserved.current,
            allocated: self.stats.allocated.current,
            peak_reserved: self.stats.reserved.peak,
            allocs: self.stats.allocs,
            granule,
            available,
            growable,
            small,
            ahead: self.in_advice,
        };
        let want = self
            .growth
            .grow_bytes(&req)
            .max(deficit)
            .next_multiple_of(granule);
        if want > available {
            deficit
        } else {
            want
        }
    }

    /// `stream`'s growable segment of kind `small` (slabs or large runs), its address
    /// range reserved on first use (nothing mapped). The stream's pool must exist.
    pub(crate) fn growable_segment(
        &mut self,
        stream: StreamId,
        small: bool,
    ) -> Result<u32, BackendError> {
        if let Some(s) = self.pools[stream as usize]
            .as_ref()
            .and_then(|p| p.growable[small as usize])
        {
            return Ok(s);
        }
        // Twice the device in address space: fragmentation can never exhaust it
        // before physical memory runs out (PyTorch: 1.125x).
        let va = self
            .backend
            .capacity()
            .next_power_of_two()
            .max(self.granule())
            * 2;
        let base = self.backend.reserve_growable(va)?;
        let pool = self.pools[stream as usize].as_mut().expect("pool");
        let s = pool.buddy.add_segment(base.0, 0, va, true, small);
        pool.growable[small as usize] = Some(s);
        Ok(s)
    }

    /// Obtains device memory for a run of `len` and carves it. Backend errors come back
    /// as they are (the caller retries out-of-memory after releasing caches).
    fn grow(
        &mut self,
        stream: StreamId,
        len: u64,
        owner: u32,
        small: bool,
    ) -> Result<Run, BackendError> {
        let granule = self.granule();
        if self.use_growable() {
            let seg = self.growable_segment(stream, small)?;
            let pool = self.pools[stream as usize].as_ref().expect("pool");
            let (base, mapped) = {
                let s = &pool.buddy.segs[seg];
                (s.base, s.mapped)
            };
            let tail = pool.buddy.trailing_free(seg).min(len);
            let deficit = (len - tail).next_multiple_of(granule);
            let room = (1u64 << pool.buddy.segs[seg].order) - mapped;
            if deficit > room {
                return Err(BackendError::OutOfMemory {
                    requested: deficit,
                    available: room,
                });
            }
            if deficit == 0 {
                // The free tail already holds the run (placement did not choose it,
                // e.g. under buddy placement): no device call.
                let pool = self.pools[stream as usize].as_mut().expect("pool");
                let run = pool.buddy.carve_tail(seg, mapped - tail, len, owner);
                self.back_or_undo(stream, &run, len)?;
                return Ok(run);
            }
            let mut add = self
                .growth_bytes(stream, len, deficit, true, small)
                .min(room);
            // Page release: free pages elsewhere give their memory first, so that the
            // growth does not raise the peak (the tail the run takes is kept).
            if !small {
                self.make_room(
                    add,
                    Some((stream, seg, (mapped - tail) / granule, u64::MAX)),
                )?;
            }
            if let Err(e) = self.backend.grow(DevicePtr(base), mapped, add) {
                if add == deficit || !e.is_oom() {
                    return Err(e);
                }
                add = deficit;
                self.backend.grow(DevicePtr(base), mapped, add)?;
            }
            self.stats.device_allocs += 1;
            self.stats.reserved.add(add);
            let pool = self.pools[stream as usize].as_mut().expect("pool");
            pool.reserved += add;
            pool.buddy.map_more(seg, add);
            let run = pool.buddy.carve_tail(seg, mapped - tail, len, owner);
            tracing::debug!(stream, add, mapped = mapped + add, "grew growable segment");
            // The part of the run in the old tail may lie over released pages.
            if !small {
                self.back_or_undo(stream, &run, len)?;
            }
            Ok(run)
        } else {
            let deficit = len.next_multiple_of(granule);
            let mut size = self.growth_bytes(stream, len, deficit, false, small);
            let base = match self.backend.allocate(size, stream) {
                Ok(b) => b,
                Err(e) if e.is_oom() && size > deficit => {
                    size = deficit;
                    self.backend.allocate(size, stream)?
                }
                Err(e) => return Err(e),
            };
            self.stats.device_allocs += 1;
            self.stats.reserved.add(size);
            let pool = self.pools[stream as usize].as_mut().expect("pool");
            pool.reserved += size;
            let seg = pool
                .buddy
                .add_segment(base.0, size, size.next_power_of_two(), false, small);
            let run = pool.buddy.carve_tail(seg, 0, len, owner);
            tracing::debug!(stream, size, %base, "new device segment");
            Ok(run)
        }
    }

    /// Applies the release policy to a segment of `stream` that may have become free.
    /// Inline: under a policy that never releases outside of an OOM (the default) a
    /// free pays one predictable branch.
    #[inline]
    pub(crate) fn maybe_release_segment(
        &mut self,
        stream: StreamId,
        seg: u32,
    ) -> Result<(), AllocError> {
        if !self.release_active {
            return Ok(());
        }
        self.apply_release_policy(stream, seg)
    }

    fn apply_release_policy(&mut self, stream: StreamId, seg: u32) -> Result<(), AllocError> {
        let pool = self.pools[stream as usize].as_ref().expect("pool");
        let s = &pool.buddy.segs[seg];
        if !s.live {
            return Ok(());
        }
        // Cheap tests before the policy call: most frees leave their segment in use
        // and its tail busy (the tail is one O(1) look at the segment's last block).
        let bytes = if s.growable {
            let t = pool.buddy.trailing_free(seg);
            t - t % self.granule()
        } else if s.used == 0 {
            s.mapped
        } else {
            0
        };
        if bytes == 0 {
            return Ok(());
        }
        let view = SegmentView {
            stream,
            bytes,
            growable: s.growable,
            reserved: self.stats.reserved.current,
            peak_reserved: self.stats.reserved.peak,
        };
        if self.release.release(&view) {
            self.release_segment(stream, seg)?;
        }
        Ok(())
    }

    /// Gives a free fixed segment back to the device, or the free tail of a growable one.
    fn release_segment(&mut self, stream: StreamId, seg: u32) -> Result<u64, AllocError> {
        let granule = self.granule();
        let pool = self.pools[stream as usize].as_mut().expect("pool");
        let s = pool.buddy.segs[seg].clone();
        if s.growable {
            let t = pool.buddy.trailing_free(seg);
            let release = t - t % granule;
            if release == 0 {
                return Ok(0);
            }
            self.backend.shrink(DevicePtr(s.base), s.mapped, release)?;
            // Released pages of the range held no memory: only the rest is given back.
            let backed = release - self.forget_released_above(stream, seg, s.mapped - release);
            let pool = self.pools[stream as usize].as_mut().expect("pool");
            pool.buddy.unmap_tail(seg, release);
            pool.reserved -= backed;
            self.stats.reserved.sub(backed);
            self.stats.device_frees += 1;
            Ok(backed)
        } else if s.used == 0 {
            self.backend
                .deallocate(DevicePtr(s.base), s.mapped, stream)?;
            let pool = self.pools[stream as usize].as_mut().expect("pool");
            pool.buddy.remove_segment(seg);
            pool.reserved -= s.mapped;
            self.stats.reserved.sub(s.mapped);
            self.stats.device_frees += 1;
            Ok(s.mapped)
        } else {
            Ok(0)
        }
    }

    /// Releases every byte the allocator can: coalesces all caches, waits for pending
    /// frees, returns empty slabs to their trees and free segments (growable tails) to
    /// the device. Returns the bytes given back. What `empty_cache` and the
    /// out-of-memory retry do.
    pub fn release_free_memory(&mut self) -> Result<u64, AllocError> {
        self.coalesce()?;
        let mut freed = 0;
        for stream in 0..self.pools.len() as u32 {
            let Some(pool) = self.pools[stream as usize].as_ref() else {
                continue;
            };
            let segs: Vec<u32> = pool.buddy.live_segments().map(|(i, _)| i).collect();
            for seg in segs {
                freed += self.release_segment(stream, seg)?;
            }
        }
        // Page release: the whole free pages inside segments too.
        if self.page_release_on() {
            freed += self.release_free_pages(u64::MAX, None)?;
        }
        Ok(freed)
    }

    /// Gives back the memory no placement decision reads: the free tails of growable
    /// segments (placement takes a tail last, at its start, however long it is) and,
    /// with page release, the free whole pages inside them (a run over released pages
    /// has them backed again). What the reactive allocator holds there is a chunk's
    /// rounding; what predictive mode grew ahead of a forecast is all there. Releasing
    /// it first on the out-of-memory paths, before the caches are flushed, keeps every
    /// run where it would have gone without that memory: growth and release ahead
    /// change the allocator's timing, never its placements. Returns the bytes given
    /// back. O(segments + free blocks of the growable segments).
    pub(crate) fn release_unplaced(&mut self) -> Result<u64, AllocError> {
        let mut freed = 0;
        for stream in 0..self.pools.len() as u32 {
            let Some(pool) = self.pools[stream as usize].as_ref() else {
                continue;
            };
            for seg in pool.growable.into_iter().flatten() {
                freed += self.release_segment(stream, seg)?;
            }
        }
        if self.page_release_on() {
            freed += self.release_free_pages(u64::MAX, None)?;
        }
        Ok(freed)
    }

    /// Merges everything that is free without giving memory back: coalesces every
    /// cache, completes pending frees, returns empty slabs to their trees. Afterwards a
    /// segment with nothing allocated is one free extent ([`Allocator::fully_coalesced`]).
    pub fn coalesce(&mut self) -> Result<(), AllocError> {
        self.process_pending(true)?;
        for stream in 0..self.pools.len() as u32 {
            if self.pools[stream as usize].is_none() {
                continue;
            }
            self.flush_cache(stream)?;
            self.return_empty_slabs(stream);
        }
        Ok(())
    }

    /// Returns every empty slab of `stream` (spares and empty partial slabs) to its
    /// buddy tree.
    fn return_empty_slabs(&mut self, stream: StreamId) {
        if let Some(pool) = self.pools.get_mut(stream as usize).and_then(|p| p.as_mut()) {
            for class in 0..pool.partial.len() {
                for spare in std::mem::take(&mut pool.spares[class]) {
                    retire_slab(
                        &mut self.slabs[spare],
                        spare,
                        &mut pool.buddy,
                        &mut self.free_records,
                        &mut self.free_slabs,
                    );
                }
                let mut k = 0;
                while k < pool.partial[class].len() {
                    let id = pool.partial[class][k];
                    let slab = &mut self.slabs[id];
                    if slab.used == 0 {
                        pool.partial[class].swap_remove(k);
                        slab.in_partial = false;
                        retire_slab(
                            slab,
                            id,
                            &mut pool.buddy,
                            &mut self.free_records,
                            &mut self.free_slabs,
                        );
                    } else {
                        k += 1;
                    }
                }
            }
        }
    }

    /// True iff every segment without live data is a single free extent (its buddy
    /// blocks all merged as far as alignment allows).
    pub fn fully_coalesced(&self) -> bool {
        self.pools.iter().flatten().all(|p| {
            p.buddy
                .live_segments()
                .filter(|(_, s)| s.used == 0)
                .all(|(i, s)| p.buddy.trailing_free(i) == s.mapped)
        })
    }

    /// Same as [`Allocator::release_free_memory`] (PyTorch's name).
    pub fn empty_cache(&mut self) -> Result<u64, AllocError> {
        self.release_free_memory()
    }

    pub(crate) fn defer_free(&mut self, id: u32) -> Result<(), AllocError> {
        let r = self.records[id];
        let uses = self.uses.remove(&id).unwrap_or(0);
        let mut events = Vec::new();
        for s in 0..64u32 {
            if uses & (1u64 << s) == 0 {
                continue;
            }
            // Bit 63 stands for every stream >= 63.
            let streams: Vec<u32> = if s == 63 {
                (63..self.streams).collect()
            } else {
                vec![s]
            };
            for st in streams {
                let e = self.backend.create_event()?;
                self.backend.record_event(e, st)?;
                events.push(e);
            }
        }
        self.records[id].state = RecState::Pending;
        self.pending_bytes += r.size();
        self.pending.push(PendingFree { rec: id, events });
        self.stats.deferred_frees += 1;
        Ok(())
    }

    /// Completes pending cross-stream frees whose events are done (all of them, waiting
    /// on the host, with `block`). Returns how many completed.
    pub(crate) fn process_pending(&mut self, block: bool) -> Result<usize, AllocError> {
        let mut done = 0;
        let mut k = 0;
        while k < self.pending.len() {
            let ready = if block {
                for &e in &self.pending[k].events {
                    self.backend.synchronize_event(e)?;
                }
                true
            } else {
                let mut all = true;
                for &e in &self.pending[k].events {
                    if !self.backend.query_event(e)? {
                        all = false;
                        break;
                    }
                }
                all
            };
            if ready {
                let p = self.pending.swap_remove(k);
                for e in p.events {
                    self.backend.destroy_event(e)?;
                }
                let r = self.records[p.rec];
                self.pending_bytes -= r.size();
                self.records[p.rec].set_uses(false);
                self.release_record(p.rec)?;
                done += 1;
            } else {
                k += 1;
            }
        }
        Ok(done)
    }

    /// Applies one piece of advice from a forecaster (predictive mode). Advice the
    /// allocator cannot follow safely is ignored; errors are an unknown stream
    /// ([`AllocError::UnknownStream`]) and backend failures other than out-of-memory
    /// (an OOM while following advice is not an error: the advice was just too
    /// optimistic).
    pub fn apply_advice(&mut self, advice: Advice) -> Result<(), AllocError> {
        self.in_advice = true;
        let r = self.follow(advice);
        self.in_advice = false;
        r
    }

    fn follow(&mut self, advice: Advice) -> Result<(), AllocError> {
        match advice {
            Advice::EnsureFree { stream, bytes } => {
                let growable = self.use_growable();
                let min_block = self.cfg.min_block;
                // More than the device holds cannot be followed: as much as it holds.
                let bytes = bytes.min(self.backend.capacity());
                let pool = self.pool_mut(stream)?;
                let free = pool.buddy.free_bytes() + pool.cache.bytes();
                if free >= bytes {
                    return Ok(());
                }
                let deficit = (bytes - free).next_multiple_of(min_block);
                // Obtain a run of the deficit from the device and free it at once: the
                // memory stays reserved and free for the predicted requests. A growable
                // segment's run also covers its free tail (already counted in `free`;
                // `grow` maps only what the tail lacks), so the mapping grows by the
                // deficit, not the deficit minus the tail.
                let tail = match pool.growable[0] {
                    Some(seg) if growable => pool.buddy.trailing_free(seg),
                    _ => 0,
                };
                let len = deficit + tail;
                let id = self.records.len() as u32;
                match self.grow(stream, len, id, false) {
                    Ok(run) => {
                        let pool = self.pools[stream as usize].as_mut().expect("pool");
                        pool.buddy.free_run(run, len);
                        Ok(())
                    }
                    Err(e) if e.is_oom() => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
            Advice::PreSplit {
                stream,
                bytes,
                count,
            } => {
                // Small sizes are slab slots; above `request_cap` a run cannot exist.
                if bytes < self.classes.small_max() || bytes == 0 || bytes > self.request_cap {
                    return Ok(());
                }
                let len = bytes.next_multiple_of(self.cfg.min_block);
                for _ in 0..count {
                    let id = self.new_record(Record::unplaced(len, stream));
                    let run = match self.obtain_run(stream, len, id, false) {
                        Ok(x) => x,
                        Err(e) => {
                            self.free_records.push(id);
                            return match e {
                                AllocError::OutOfMemory { .. } => Ok(()),
                                e => Err(e),
                            };
                        }
                    };
                    // Straight into the cache: ready for an O(1) hit.
                    let pool = self.pools[stream as usize].as_mut().expect("pool");
                    let base = pool.buddy.segs[run.seg].base;
                    let r = &mut self.records[id];
                    r.ptr = base + run.off;
                    r.set_run(run);
                    r.state = RecState::Cached;
                    pool.cache.push(&mut self.records, id);
                }
                Ok(())
            }
            Advice::TrimTail { stream, keep_bytes } => {
                let granule = self.granule();
                let growable = self.use_growable();
                let pool = self.pool_mut(stream)?;
                let Some(seg) = pool.growable[0].filter(|_| growable) else {
                    return Ok(());
                };
                let tail = pool.buddy.trailing_free(seg);
                let release = tail.saturating_sub(keep_bytes);
                let release = release - release % granule;
                if release == 0 {
                    return Ok(());
                }
                let (base, mapped) = {
                    let s = &pool.buddy.segs[seg];
                    (s.base, s.mapped)
                };
                self.backend.shrink(DevicePtr(base), mapped, release)?;
                let backed = release - self.forget_released_above(stream, seg, mapped - release);
                let pool = self.pools[stream as usize].as_mut().expect("pool");
                pool.buddy.unmap_tail(seg, release);
                pool.reserved -= backed;
                self.stats.reserved.sub(backed);
                self.stats.device_frees += 1;
                Ok(())
            }
            Advice::Trim { stream, keep_bytes } => {
                self.pool_mut(stream)?;
                self.flush_cache(stream)?;
                self.return_empty_slabs(stream);
                let pool = self.pool_mut(stream)?;
                let segs: Vec<(u32, u64)> = pool
                    .buddy
                    .live_segments()
                    .filter(|(_, s)| s.used == 0 || s.growable)
                    .map(|(i, s)| (i, s.mapped))
                    .collect();
                for (seg, _) in segs {
                    let free = self.pools[stream as usize]
                        .as_ref()
                        .expect("pool")
                        .buddy
                        .free_bytes();
                    if free <= keep_bytes {
                        break;
                    }
                    self.release_segment(stream, seg)?;
                }
                Ok(())
            }
        }
    }
}
