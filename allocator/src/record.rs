//! The allocator's record table entries: one per allocation handle (generation-checked),
//! so that a free is O(1) and a stale or forged handle is an error, not corruption.

use std::num::NonZeroU32;

use crate::buddy::{Run, NIL};

/// The generation after `g` (wrapping past `u32::MAX` to 1).
#[inline]
pub(crate) fn next_gen(g: NonZeroU32) -> NonZeroU32 {
    g.checked_add(1).unwrap_or(NonZeroU32::MIN)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecState {
    Free,
    Live,
    /// A freed run kept whole in its stream's cache (deferred coalescing).
    Cached,
    /// Freed, waiting for events on other streams.
    Pending,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Record {
    pub ptr: u64,
    pub requested: u64,
    /// Bytes taken: the run length, or the slab class size.
    pub size: u64,
    /// Run: segment; slab: slab id.
    pub seg_or_slab: u32,
    /// Run: offset in the segment; slab: slot.
    pub off_or_slot: u64,
    /// Run: its block in the placement index (what a free hands back); slab: NIL.
    pub blk: u32,
    pub stream: u32,
    /// Generation: bumped on every life of the id, never 0 (so that
    /// `Option<Allocation>` is no larger than `Allocation`).
    pub gen: NonZeroU32,
    pub state: RecState,
    pub slab: bool,
    /// Other streams that used it (bit s = stream s; bit 63 = streams >= 63).
    pub uses: u64,
    /// Next cached run of the same length (state Cached), NIL at the end.
    pub next: u32,
}

impl Record {
    /// A record in no use (state Free), for the table to hand out.
    pub fn vacant() -> Record {
        Record {
            ptr: 0,
            requested: 0,
            size: 0,
            seg_or_slab: NIL,
            off_or_slot: 0,
            blk: NIL,
            stream: 0,
            gen: NonZeroU32::MIN,
            state: RecState::Free,
            slab: false,
            uses: 0,
            next: NIL,
        }
    }

    /// The record slot `slot` of slab `slab` owns for the slab's life (state Free until
    /// a small allocation revives it).
    pub fn slab_slot(ptr: u64, obj: u64, slab: u32, slot: u64, stream: u32) -> Record {
        Record {
            ptr,
            size: obj,
            seg_or_slab: slab,
            off_or_slot: slot,
            stream,
            slab: true,
            ..Record::vacant()
        }
    }

    /// The run of a run record.
    #[inline]
    pub fn run(&self) -> Run {
        debug_assert!(!self.slab);
        Run {
            seg: self.seg_or_slab,
            off: self.off_or_slot,
            blk: self.blk,
        }
    }

    /// Makes a Free or Cached record the live allocation of `requested` bytes under a
    /// new generation (a stale handle to its previous life no longer matches).
    #[inline]
    pub fn revive(&mut self, requested: u64) {
        self.gen = next_gen(self.gen);
        self.requested = requested;
        self.state = RecState::Live;
        self.uses = 0;
    }

    /// Makes this record the live allocation of `requested` bytes in `run` (`len`
    /// bytes at device address `base + run.off`) on `stream`, under a new generation.
    #[inline]
    pub fn make_run(&mut self, base: u64, run: Run, requested: u64, len: u64, stream: u32) {
        *self = Record {
            ptr: base + run.off,
            requested,
            size: len,
            seg_or_slab: run.seg,
            off_or_slot: run.off,
            blk: run.blk,
            stream,
            gen: next_gen(self.gen),
            state: RecState::Live,
            slab: false,
            uses: 0,
            next: NIL,
        };
    }

    #[inline]
    pub fn set_run(&mut self, run: Run) {
        self.seg_or_slab = run.seg;
        self.off_or_slot = run.off;
        self.blk = run.blk;
    }
}
