//! The allocator's side of planned placement: a large allocation at its planned offset
//! (checked against the placement index), the log of every large run, and the plans at
//! iteration boundaries. See the module docs of `placement`.

use crate::backend::{DeviceBackend, DevicePtr, StreamId};
use crate::buddy::{Run, Spot};
use crate::error::AllocError;
use crate::pool::{Allocator, RecState};

use super::Target;

impl<B: DeviceBackend> Allocator<B> {
    /// `alloc_large` under planned placement: the planned offset if the plan has one
    /// and its range is free, else best fit; then the run is logged.
    #[cold]
    #[inline(never)]
    pub(crate) fn alloc_large_planned(
        &mut self,
        bytes: u64,
        stream: StreamId,
    ) -> Result<u32, AllocError> {
        // As in `alloc_large_best_fit` (min_block is a power of two); a request within
        // min_block of u64::MAX wraps to 0 and takes best fit's path, which refuses it.
        let len = bytes.wrapping_add(self.cfg.min_block - 1) & !(self.cfg.min_block - 1);
        // An unknown stream is best fit's error (before the log makes room for it).
        if stream >= self.streams {
            return self.alloc_large_best_fit(bytes, stream);
        }
        let p = self.placement.as_deref_mut().expect("planned placement");
        let (key, target) = p.next(stream, len);
        let mut placed = None;
        if let Some(t) = target.filter(|_| len > 0 && bytes <= self.request_cap) {
            let id = self.reserve_record();
            let mut got = self.carve_planned(stream, t, len, id);
            // The device refused the growth: memory that caches (of any stream) hold
            // goes back first, as best fit's out-of-memory path would do.
            if matches!(got, Err(true)) && self.release_free_memory().is_ok_and(|b| b > 0) {
                got = self.carve_planned(stream, t, len, id);
            }
            match got.ok() {
                Some((run, base)) => {
                    self.records[id].make_run(base, run, bytes, len, stream);
                    placed = Some(id);
                }
                None => {
                    self.free_records.push(id);
                    if tracing::enabled!(tracing::Level::TRACE) {
                        let who = self
                            .placement
                            .as_deref()
                            .map(|p| p.occupants(stream, t, len));
                        tracing::trace!(?key, ?t, len, ?who, "planned range not free");
                    }
                }
            }
            self.placement
                .as_deref_mut()
                .expect("planned placement")
                .outcome(stream, t, placed.is_some());
        }
        let id = match placed {
            Some(id) => id,
            None => self.alloc_large_best_fit(bytes, stream)?,
        };
        let (seg, blk) = self.records[id].seg_blk();
        let pool = self.pools[stream as usize].as_ref().expect("pool of a run");
        let off = pool.buddy.run_of(seg, blk).off;
        let growable = pool.growable[0] == Some(seg);
        self.placement
            .as_deref_mut()
            .expect("planned placement")
            .allocated(stream, id, key, seg, off, len, growable);
        Ok(id)
    }

    /// Carves the range `target` names for a run of `len` bytes, tagged `owner`, if
    /// that range of the stream's growable segment is free, mapping the segment up to
    /// the plan's highest end first (at most one growth chunk beyond the range) when the
    /// range lies beyond the mapped bytes and the free tail reaches it. `None`: not
    /// free, or the device refused the growth (best fit then decides, out of memory
    /// included).
    fn carve_planned(
        &mut self,
        stream: StreamId,
        target: Target,
        len: u64,
        owner: u32,
    ) -> Result<(Run, u64), bool> {
        let granule = self.granule();
        let high = self
            .placement
            .as_deref()
            .map_or(0, |p| p.high(stream, target));
        if !(self.cfg.growable_segments && self.backend.supports_growable()) {
            return Err(false);
        }
        self.pool_mut(stream).map_err(|_| false)?;
        let (seg, off) = match target {
            Target::Plan { seg, off } => (seg, off),
            Target::Profile { off } => (
                self.growable_segment(stream, false).map_err(|_| false)?,
                off,
            ),
        };
        let pool = self.pools[stream as usize].as_ref().ok_or(false)?;
        if pool.growable[0] != Some(seg) {
            return Err(false);
        }
        let s = &pool.buddy.segs[seg];
        let (base, mapped, order) = (s.base, s.mapped, s.order);
        let end = off.checked_add(len).ok_or(false)?;
        if end > mapped {
            // The free tail must start at or below `off`.
            if off < mapped - pool.buddy.trailing_free(seg) {
                return Err(false);
            }
            let room = (1u64 << order) - mapped;
            let need = (end - mapped).next_multiple_of(granule);
            // Up to the plan's highest end, by at most one growth chunk past the need.
            let want = high
                .max(end)
                .saturating_sub(mapped)
                .min(need + self.cfg.growth_initial)
                .next_multiple_of(granule);
            // Whole granules only (a backend may take finer sizes than the granule).
            let available =
                self.backend.capacity().saturating_sub(self.backend.used()) / granule * granule;
            let mut add = want.min(room).min(available).max(need);
            if need > room {
                return Err(false);
            }
            let tail_page = (mapped - pool.buddy.trailing_free(seg)) / granule;
            self.make_room(add, Some((stream, seg, tail_page, u64::MAX)))
                .map_err(|_| true)?;
            if self.backend.grow(DevicePtr(base), mapped, add).is_err() {
                if add == need || self.backend.grow(DevicePtr(base), mapped, need).is_err() {
                    return Err(true);
                }
                add = need;
            }
            self.stats.device_allocs += 1;
            self.stats.reserved.add(add);
            let pool = self.pools[stream as usize].as_mut().expect("pool");
            pool.reserved += add;
            pool.buddy.map_more(seg, add);
            tracing::debug!(stream, add, mapped = mapped + add, "grew to the plan");
        }
        // The search for the free block starts at the run left of the range.
        let from = self
            .placement
            .as_deref()
            .and_then(|p| p.left_of(stream, off))
            .and_then(|id| self.records.get(id))
            .map(|r| r.seg_blk())
            .and_then(|(s, blk)| (s == seg).then_some(blk));
        let pool = self.pools[stream as usize].as_mut().expect("pool");
        let spot: Spot = pool.buddy.spot_near(seg, from, off, len).ok_or(false)?;
        let (run, at) = pool.buddy.carve_at(spot, len, owner);
        self.back_or_undo(stream, &run, len).map_err(|_| true)?;
        Ok((run, at))
    }

    /// Planned placement at an iteration boundary: plans each stream's next iteration.
    pub(crate) fn plan_placement(&mut self) {
        let Some(mut p) = self.placement.take() else {
            return;
        };
        let pools = &self.pools;
        p.boundary(|s| pools.get(s as usize)?.as_ref()?.growable[0]);
        let planned = p.planned_streams();
        self.placement = Some(p);
        // A plan starts: what the cache holds goes back to the placement index.
        for s in planned {
            let cached = self
                .pools
                .get(s as usize)
                .and_then(|p| p.as_ref())
                .is_some_and(|p| p.cache.runs() > 0);
            if cached {
                if let Err(e) = self.flush_cache(s) {
                    tracing::warn!("planned placement: emptying the cache of stream {s}: {e}");
                }
            }
        }
    }

    /// Turns planned placement on with the profile of recorded run `trace` (what
    /// `placement_profile:PATH` does with a file). Before the first allocation only:
    /// later the log would miss the live runs, and the call is refused.
    pub fn set_placement_profile(
        &mut self,
        trace: &memcast_trace::Trace,
    ) -> Result<(), AllocError> {
        if self.stats.allocs > 0 {
            return Err(AllocError::Config(
                "a placement profile must be set before the first allocation".into(),
            ));
        }
        self.cfg.placement = crate::config::Placement::Planned;
        self.placement = Some(Box::new(super::Placement::for_trace(
            trace,
            self.classes.small_max(),
            self.cfg.min_block,
        )));
        Ok(())
    }

    /// Planned placement's counters, if it is on.
    pub fn placement_stats(&self) -> Option<super::PlacementStats> {
        self.placement.as_deref().map(|p| p.stats)
    }

    /// The placement log against the live runs (part of `check_invariants`).
    pub(crate) fn check_placement(&self) -> Result<(), AllocError> {
        let Some(p) = self.placement.as_deref() else {
            return Ok(());
        };
        let runs = self
            .records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.state != RecState::Free && !r.slab())
            .filter_map(|(id, r)| {
                let (seg, blk) = r.seg_blk();
                let pool = self.pools.get(r.stream() as usize)?.as_ref()?;
                let off = pool.buddy.run_of(seg, blk).off;
                Some((r.stream(), id as u32, seg, off, r.size()))
            });
        p.check(runs).map_err(AllocError::Invariant)
    }
}
