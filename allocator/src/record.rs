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
#[repr(u8)]
pub(crate) enum RecState {
    Free,
    Live,
    /// A freed run kept whole in its stream's cache (deferred coalescing).
    Cached,
    /// Freed, waiting for events on other streams.
    Pending,
}

/// Sizes are kept in units of 256 bytes (every size is a multiple of `min_block`,
/// which `AllocConfig::validate` keeps a power of two >= 256).
const UNIT_SHIFT: u32 = 8;
/// The largest size a record holds: 2^40 - 256 bytes (1 TiB). `Allocator::allocate`
/// refuses larger requests as too large.
pub(crate) const MAX_SIZE: u64 = (u32::MAX as u64) << UNIT_SHIFT;

const FLAG_SLAB: u8 = 1;
/// Used on other streams: the stream mask is in `Allocator::uses`.
const FLAG_USES: u8 = 2;

/// One record: 32 bytes, two to a cache line. The table holds one per slab slot (for
/// the slab's life) and one per large run, so its size decides how much of it stays in
/// the L1 cache: at 64 bytes a record, the `alloc_free` bench missed L1 on most frees
/// (callgrind's cache simulation, docs/allocator.md).
#[derive(Debug, Clone, Copy)]
#[repr(align(32))]
pub(crate) struct Record {
    pub ptr: u64,
    /// Bytes taken, in units of 256: the run length, or the slab class size.
    size_u: u32,
    /// Live: the bytes taken beyond the request (`size - requested`, < 2^32: a
    /// rounding to `min_block` or to a size class). Free slab slot or Cached run: the
    /// next record of its list (NIL at the end).
    link: u32,
    pub gen: NonZeroU32,
    /// Run: segment; slab: slab id.
    pub seg_or_slab: u32,
    /// Run: its block in the placement index (what a free hands back; the offset is
    /// the block's); slab: slot.
    pub blk_or_slot: u32,
    stream: u16,
    pub state: RecState,
    flags: u8,
}

const _: () = assert!(std::mem::size_of::<Record>() == 32);

impl Record {
    /// A record in no use (state Free), for the table to hand out.
    pub fn vacant() -> Record {
        Record {
            ptr: 0,
            size_u: 0,
            link: NIL,
            gen: NonZeroU32::MIN,
            seg_or_slab: NIL,
            blk_or_slot: NIL,
            stream: 0,
            state: RecState::Free,
            flags: 0,
        }
    }

    /// The record slot `slot` of slab `slab` owns for the slab's life (state Free until
    /// a small allocation revives it).
    pub fn slab_slot(ptr: u64, obj: u64, slab: u32, slot: u32, stream: u32) -> Record {
        Record {
            ptr,
            size_u: units(obj),
            seg_or_slab: slab,
            blk_or_slot: slot,
            stream: stream as u16,
            flags: FLAG_SLAB,
            ..Record::vacant()
        }
    }

    /// A record of `len` bytes for `stream` that no run holds yet (the caller places it
    /// with [`Record::set_run`]).
    pub fn unplaced(len: u64, stream: u32) -> Record {
        Record {
            size_u: units(len),
            stream: stream as u16,
            ..Record::vacant()
        }
    }

    /// Bytes taken: the run length, or the slab class size.
    #[inline]
    pub fn size(&self) -> u64 {
        (self.size_u as u64) << UNIT_SHIFT
    }

    /// Requested bytes of a Live record.
    #[inline]
    pub fn requested(&self) -> u64 {
        debug_assert_eq!(self.state, RecState::Live);
        self.size() - self.link as u64
    }

    #[inline]
    pub fn stream(&self) -> u32 {
        self.stream as u32
    }

    /// A slab slot's record (else a run's).
    #[inline]
    pub fn slab(&self) -> bool {
        self.flags & FLAG_SLAB != 0
    }

    /// Used on other streams (`Allocator::record_stream`).
    #[inline]
    pub fn has_uses(&self) -> bool {
        self.flags & FLAG_USES != 0
    }

    #[inline]
    pub fn set_uses(&mut self, on: bool) {
        self.flags = if on {
            self.flags | FLAG_USES
        } else {
            self.flags & !FLAG_USES
        };
    }

    /// The next record of a free list or cache list (not Live).
    #[inline]
    pub fn next(&self) -> u32 {
        debug_assert_ne!(self.state, RecState::Live);
        self.link
    }

    #[inline]
    pub fn set_next(&mut self, next: u32) {
        debug_assert_ne!(self.state, RecState::Live);
        self.link = next;
    }

    /// A run record's (segment, block).
    #[inline]
    pub fn seg_blk(&self) -> (u32, u32) {
        debug_assert!(!self.slab());
        (self.seg_or_slab, self.blk_or_slot)
    }

    /// Makes a Free or Cached record the live allocation of `requested` bytes under a
    /// new generation (a stale handle to its previous life no longer matches).
    #[inline]
    pub fn revive(&mut self, requested: u64) {
        debug_assert!(requested <= self.size());
        self.gen = next_gen(self.gen);
        self.link = (self.size() - requested) as u32;
        self.state = RecState::Live;
        self.flags &= !FLAG_USES;
    }

    /// Makes this record the live allocation of `requested` bytes in `run` (`len`
    /// bytes at device address `base + run.off`) on `stream`, under a new generation.
    #[inline]
    pub fn make_run(&mut self, base: u64, run: Run, requested: u64, len: u64, stream: u32) {
        debug_assert!(requested <= len && len - requested <= u32::MAX as u64);
        *self = Record {
            ptr: base + run.off,
            size_u: units(len),
            link: (len - requested) as u32,
            gen: next_gen(self.gen),
            seg_or_slab: run.seg,
            blk_or_slot: run.blk,
            stream: stream as u16,
            state: RecState::Live,
            flags: 0,
        };
    }

    #[inline]
    pub fn set_run(&mut self, run: Run) {
        self.seg_or_slab = run.seg;
        self.blk_or_slot = run.blk;
    }
}

/// `bytes` in record units (a multiple of 256, at most [`MAX_SIZE`]).
#[inline]
fn units(bytes: u64) -> u32 {
    debug_assert!(bytes.is_multiple_of(1 << UNIT_SHIFT) && bytes <= MAX_SIZE);
    (bytes >> UNIT_SHIFT) as u32
}
