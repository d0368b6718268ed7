//! The allocator's invariant check (`Allocator::check_invariants`): the buddy trees',
//! the slabs', the caches', the record table against the statistics, the released
//! pages, and the conservation equation. Driven after every step by the property tests
//! and, with the `check-invariants` feature, after every allocate and free.

use crate::backend::DeviceBackend;
use crate::error::AllocError;
use crate::pool::{Allocator, RecState, SLAB_TAG};

impl<B: DeviceBackend> Allocator<B> {
    /// Checks every invariant: the buddy trees', the slabs', the caches', the record
    /// table against the statistics, and the conservation equation
    /// `reserved == buddy_free + cached + slab_free + pending + allocated`.
    pub fn check_invariants(&self) -> Result<(), AllocError> {
        let bad = |m: String| Err(AllocError::Invariant(m));
        let (mut requested, mut allocated) = (0u64, 0u64);
        let mut run_bytes = vec![0u64; self.pools.len()];
        let mut cached = vec![0u64; self.pools.len()];
        for (id, r) in self.records.iter().enumerate() {
            match r.state {
                RecState::Free => continue,
                RecState::Live => {
                    requested += r.requested();
                    allocated += r.size();
                    if r.ptr % self.cfg.min_block != 0 {
                        return bad(format!("record {id}: pointer {:#x} misaligned", r.ptr));
                    }
                }
                RecState::Cached => cached[r.stream() as usize] += r.size(),
                RecState::Pending => {}
            }
            // A live record flagged as used on other streams has its mask; a pending
            // one keeps the flag until its events complete (its mask went into them).
            let ok = match (r.state, r.has_uses()) {
                (RecState::Live, true) => self.uses.contains_key(&(id as u32)),
                (RecState::Pending, _) | (_, false) => true,
                _ => false,
            };
            if !ok {
                return bad(format!("record {id}: use flag and use mask disagree"));
            }
            if !r.slab() {
                run_bytes[r.stream() as usize] += r.size();
            }
        }
        for (&id, &mask) in &self.uses {
            let r = self.records.get(id);
            if mask == 0 || !r.is_some_and(|r| r.state == RecState::Live && r.has_uses()) {
                return bad(format!(
                    "use mask of record {id} without a live flagged record"
                ));
            }
        }
        if requested != self.stats.requested.current || allocated != self.stats.allocated.current {
            return bad(format!(
                "records say requested {requested} / allocated {allocated}, stats say {} / {}",
                self.stats.requested.current, self.stats.allocated.current
            ));
        }
        let mut reserved = 0u64;
        let mut buddy_free = 0u64;
        let mut slab_free = 0u64;
        let mut cached_total = 0u64;
        let mut released = 0u64;
        for (s, pool) in self.pools.iter().enumerate() {
            let Some(pool) = pool else { continue };
            pool.buddy
                .check()
                .map_err(|e| AllocError::Invariant(format!("stream {s}: {e}")))?;
            let mut n = 0;
            let mut bytes = 0;
            for (id, in_its_slot) in pool.cache.iter(&self.records) {
                let r = &self.records[id];
                if r.state != RecState::Cached || !in_its_slot || r.stream() as usize != s {
                    return bad(format!("stream {s}: bad cache entry {id}"));
                }
                n += 1;
                bytes += r.size();
            }
            if !pool.cache.mask_agrees() {
                return bad(format!("stream {s}: cache mask disagrees"));
            }
            if n != pool.cache.runs() || bytes != pool.cache.bytes() || bytes != cached[s] {
                return bad(format!("stream {s}: cache counters disagree"));
            }
            // Every listed slab (partial or spare) is live, of this stream and of its
            // list's class, and listed once.
            let mut seen = std::collections::HashSet::new();
            for (class, id) in pool
                .partial
                .iter()
                .chain(pool.spares.iter())
                .enumerate()
                .flat_map(|(c, l)| l.iter().map(move |&id| (c % pool.partial.len(), id)))
            {
                let ok = self.slabs.get(id).is_some_and(|sl| {
                    sl.live && sl.stream as usize == s && sl.class as usize == class
                });
                if !ok || !seen.insert(id) {
                    return bad(format!("stream {s}: slab {id} listed wrongly or twice"));
                }
            }
            let mut slab_bytes = 0;
            for (id, slab) in self.slabs.iter().enumerate() {
                if !slab.live || slab.stream as usize != s {
                    continue;
                }
                slab.check(id as u32, &self.records)
                    .map_err(|e| AllocError::Invariant(format!("slab {id}: {e}")))?;
                let listed = pool.partial[slab.class as usize].contains(&(id as u32));
                let spare = pool.spares[slab.class as usize].contains(&(id as u32));
                if listed != slab.in_partial
                    || (slab.in_partial && (slab.free_slots() == 0 || slab.used == 0))
                    || (spare && (listed || slab.used != 0))
                    || (!listed && !spare && slab.free_slots() != 0)
                {
                    return bad(format!("slab {id}: partial list membership is wrong"));
                }
                if pool.buddy.owner_at(slab.seg, slab.off) != Some(SLAB_TAG | id as u32) {
                    return bad(format!("slab {id}: its run is not tagged as its own"));
                }
                slab_bytes += slab.len();
                slab_free += slab.free_slots() as u64 * slab.obj;
            }
            let used: u64 = pool.buddy.live_segments().map(|(_, sg)| sg.used).sum();
            if used != run_bytes[s] + slab_bytes {
                return bad(format!(
                    "stream {s}: trees hold {used} bytes, runs {} + slabs {slab_bytes}",
                    run_bytes[s]
                ));
            }
            let mapped: u64 = pool.buddy.live_segments().map(|(_, sg)| sg.mapped).sum();
            let released_here = pool.pages.count * self.granule();
            if mapped != pool.reserved + released_here {
                return bad(format!(
                    "stream {s}: mapped {mapped} != reserved {} + released pages {released_here}",
                    pool.reserved
                ));
            }
            released += released_here;
            reserved += pool.reserved;
            buddy_free += pool.buddy.free_bytes();
            cached_total += pool.cache.bytes();
        }
        if reserved != self.stats.reserved.current {
            return bad(format!(
                "pools reserve {reserved}, stats say {}",
                self.stats.reserved.current
            ));
        }
        let rhs = buddy_free + cached_total + slab_free + self.pending_bytes + allocated;
        if reserved + released != rhs {
            return bad(format!(
                "conservation: reserved {reserved} + released pages {released} != free {buddy_free} + cached {cached_total} + slab free {slab_free} + pending {} + allocated {allocated}",
                self.pending_bytes
            ));
        }
        self.check_pages().map_err(AllocError::Invariant)?;
        if self.backend.used() < reserved {
            return bad(format!(
                "backend holds {} < reserved {reserved}",
                self.backend.used()
            ));
        }
        self.check_placement()
    }
}
