//! The buddy pool's runs: finding room, carving, freeing, and lookups by offset (the
//! hot path of every large allocation and free; `buddy.rs` module docs give the
//! structure and its invariants).

use super::*;

impl BuddyPool {
    /// Finds room for a run of `len` bytes (a multiple of the minimum block): first a
    /// bounded best-fit scan of the `scan` newest free blocks of order floor(log2 len)
    /// for one followed by enough free space (a run straddling two buddies, no larger
    /// block split), then the smallest free block of order >= ceil(log2 len).
    /// Under best fit (the default): O(1), the run goes at the start of the chosen
    /// free block. Under buddy placement, finding the free block holding the chosen
    /// buddy walks that segment's blocks.
    #[inline(always)]
    pub fn find_run(&self, len: u64, scan: u32, small: bool) -> Option<Spot> {
        if self.best_fit {
            // Smallest free extent that fits in segments of the right kind; lowest
            // segment and offset among equals.
            let free = self.ext.best_fit(small, len)?;
            let (seg, off, _) = self.ext.span(free);
            return Some(Spot { seg, off, free });
        }
        let spot = |seg: u32, off: u64| {
            let free = self.ext.containing(seg, off, len)?;
            Some(Spot { seg, off, free })
        };
        let f = 63 - len.leading_zeros() as u8;
        let exact = len.is_power_of_two();
        let k = if exact { f } else { f + 1 };
        if !exact && scan > 0 {
            let rest = len - (1u64 << f);
            let mut i = self.heads[f as usize];
            let mut tried = 0;
            while i != NIL && tried < scan {
                let n = &self.nodes[i as usize];
                if self.is_free_range(n.seg, n.offset + (1u64 << f), rest) {
                    return spot(n.seg, n.offset);
                }
                i = n.next;
                tried += 1;
            }
        }
        let avail = self.nonempty & !((1u64 << k) - 1);
        if avail == 0 {
            return None;
        }
        let o = avail.trailing_zeros();
        let i = self.heads[o as usize];
        let n = &self.nodes[i as usize];
        spot(n.seg, n.offset)
    }

    /// The smallest free block of a large-run segment that holds `len` bytes and lies
    /// wholly outside the device addresses `[lo, hi)` (lowest segment and offset among
    /// equals), a growable segment's free tail excepted (placement keeps it for last):
    /// where relocation puts the runs of a window it opens. Best-fit placement only
    /// (`None` under buddy placement). O(free blocks): only on out-of-memory retries.
    pub fn best_fit_outside(&self, len: u64, lo: u64, hi: u64) -> Option<Spot> {
        if !self.best_fit {
            return None;
        }
        self.ext
            .free_blocks()
            .filter(|&(_, small, seg, off, l)| {
                let s = &self.segs[seg];
                let (a, b) = (s.base + off, s.base + off + l);
                let tail = s.growable && off + l == s.mapped;
                !small && !tail && l >= len && (b <= lo || a >= hi)
            })
            .min_by_key(|&(_, _, seg, off, l)| (l, seg, off))
            .map(|(free, _, seg, off, _)| Spot { seg, off, free })
    }

    /// Marks the free range `[spot.off, spot.off + len)` as a Used run tagged `owner`.
    #[inline(always)]
    pub fn carve(&mut self, spot: Spot, len: u64, owner: u32) -> Run {
        self.carve_at(spot, len, owner).0
    }

    /// [`BuddyPool::carve`], also returning the segment's base address (the caller's
    /// device address is `base + run.off`; read here, where the segment is at hand).
    #[inline(always)]
    pub fn carve_at(&mut self, spot: Spot, len: u64, owner: u32) -> (Run, u64) {
        let Spot { seg, off, free } = spot;
        debug_assert_eq!(
            self.ext.span(free).0,
            seg,
            "spot names a block of another segment"
        );
        let blk = self.ext.take(free, off, len);
        if self.segs[seg].tree {
            self.set_range(seg, off, len, State::Free, State::Used, owner);
        } else {
            self.free_bytes -= len;
            if self.index_runs {
                self.runs.insert((seg, off), (len, owner));
            }
        }
        let s = &mut self.segs[seg];
        s.used += len;
        (Run { seg, off, blk }, s.base)
    }

    /// Carves `[off, off + len)` at the end of `seg`'s free tail (growth's case).
    pub fn carve_tail(&mut self, seg: u32, off: u64, len: u64, owner: u32) -> Run {
        let free = self.ext.last(seg);
        self.carve(Spot { seg, off, free }, len, owner)
    }

    /// The run whose placement block is `blk` in segment `seg` (a record keeps only the
    /// block; the offset is the block's).
    #[inline(always)]
    pub fn run_of(&self, seg: u32, blk: u32) -> Run {
        let (_, off, _) = self.ext.span(blk);
        Run { seg, off, blk }
    }

    /// Frees the Used run `run` of `len` bytes (exactly as carved). O(1) on the
    /// placement index; a tree segment also walks its tree.
    #[inline(always)]
    pub fn free_run(&mut self, run: Run, len: u64) {
        let Run { seg, off, blk } = run;
        debug_assert_eq!(
            self.ext.span(blk),
            (seg, off, len),
            "a stale or foreign run"
        );
        self.ext.release(blk);
        if self.segs[seg].tree {
            self.set_range(seg, off, len, State::Used, State::Free, NIL);
        } else {
            self.free_bytes += len;
            if self.index_runs {
                let r = self.runs.remove(&(seg, off));
                debug_assert_eq!(r.map(|r| r.0), Some(len), "freeing a run that is not one");
            }
        }
        self.segs[seg].used -= len;
    }

    /// [`BuddyPool::free_run`] given the run's block (a record keeps only the block): the
    /// offset is read from the block only where a tree or the run index needs it.
    #[inline(always)]
    pub fn free_run_blk(&mut self, seg: u32, blk: u32, len: u64) {
        if self.segs[seg].tree || self.index_runs {
            return self.free_run(self.run_of(seg, blk), len);
        }
        debug_assert_eq!(
            (self.ext.span(blk).0, self.ext.span(blk).2),
            (seg, len),
            "a stale or foreign run"
        );
        self.ext.release(blk);
        self.free_bytes += len;
        self.segs[seg].used -= len;
    }

    /// Whether freeing the run at block `blk` of `seg` would merge it with a free
    /// neighbour (false where runs are tracked by buddy trees or the run index). O(1).
    #[inline(always)]
    pub fn run_has_free_neighbour(&self, seg: u32, blk: u32) -> bool {
        !(self.segs[seg].tree || self.index_runs) && self.ext.has_free_neighbour(blk)
    }

    /// The owner tag of the Used node holding segment offset `off`, if any.
    pub fn owner_at(&self, seg: u32, off: u64) -> Option<u32> {
        if off >= self.segs[seg].mapped {
            return None;
        }
        if !self.segs[seg].tree {
            // Runs are found by their start only: an interior address is no run's.
            return self.runs.get(&(seg, off)).map(|r| r.1);
        }
        let n = &self.nodes[self.locate(seg, off) as usize];
        (n.state == State::Used).then_some(n.owner)
    }

    /// Every placement block of segment `seg` in address order: `(offset, length,
    /// free)`. O(blocks of the segment).
    pub fn blocks_of(&self, seg: u32) -> impl Iterator<Item = (u64, u64, bool)> + '_ {
        self.ext.blocks_of(seg)
    }

    /// The live segment containing device address `addr`, with the offset.
    pub fn segment_of(&self, addr: u64) -> Option<(u32, u64)> {
        self.live_segments()
            .find(|(_, s)| addr >= s.base && addr < s.base + s.mapped)
            .map(|(i, s)| (i, addr - s.base))
    }
}
