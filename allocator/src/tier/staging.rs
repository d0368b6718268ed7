//! The warm tier: one pinned host buffer, allocated once and sub-allocated.
//!
//! Why: `cudaHostAlloc` costs 1.6 ms for 2 MiB and 153 ms for 256 MiB on the H200 host
//! (measured on the H200), so pinned memory is obtained once, at start, and
//! reused; only pinned memory reaches ~55 GB/s (pageable: 8-18 GB/s).
//!
//! The pool is a first-fit range allocator over offsets with coalescing of free
//! neighbours (a `BTreeMap` of free ranges): `alloc` is O(free ranges), `free`
//! O(log free ranges). Ranges are multiples of [`ALIGN`]. A copy that no single free
//! range holds, where the pool has room in total, takes two ranges (the largest free
//! one and a first fit for the rest) and is copied in two parts.
//!
//! Invariant: `free_bytes + used_bytes == size`, free ranges never touch or overlap.

use std::collections::BTreeMap;

use crate::backend::{BackendError, DeviceBackend, HostPtr};

/// Alignment of staging ranges (a DMA-friendly 4 KiB page).
pub const ALIGN: u64 = 4096;

/// Where a host copy lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostLoc {
    /// Pinned: `len` bytes of the staging pool, the first `head` at `ptr` and, where
    /// the pool had room for `len` but no single range, the rest at `tail`.
    // Invariant: 0 < head <= len; head == len (one range) or the rest, len - head
    // bytes, is a second range at `tail`.
    Warm {
        ptr: HostPtr,
        len: u64,
        head: u64,
        tail: HostPtr,
    },
    /// Its own pageable buffer.
    Cold { ptr: HostPtr, len: u64 },
}

impl HostLoc {
    /// `len` bytes of the staging pool in one range at `ptr`.
    pub fn warm(ptr: HostPtr, len: u64) -> HostLoc {
        HostLoc::Warm {
            ptr,
            len,
            head: len,
            tail: ptr,
        }
    }

    /// The host ranges, in the tensor's byte order: one, or two for a pinned copy
    /// split over two ranges of the pool.
    pub fn parts(&self) -> impl Iterator<Item = (HostPtr, u64)> {
        let (a, b) = match *self {
            HostLoc::Warm {
                ptr,
                len,
                head,
                tail,
            } => ((ptr, head), (tail, len - head)),
            HostLoc::Cold { ptr, len } => ((ptr, len), (ptr, 0)),
        };
        [a, b].into_iter().filter(|&(_, n)| n > 0)
    }
    pub fn is_warm(&self) -> bool {
        matches!(self, HostLoc::Warm { .. })
    }
    /// Bytes held (both ranges of a split one).
    pub fn bytes(&self) -> u64 {
        match *self {
            HostLoc::Warm { len, .. } | HostLoc::Cold { len, .. } => len,
        }
    }
}

/// The pinned staging pool. See the module docs.
#[derive(Debug, Default)]
pub struct StagingPool {
    base: Option<HostPtr>,
    // Invariant: size == free_bytes + used_bytes.
    size: u64,
    free_bytes: u64,
    /// offset -> length of each free range; ranges are disjoint and never adjacent.
    free: BTreeMap<u64, u64>,
}

impl StagingPool {
    /// Allocates the pinned buffer (`bytes` rounded up to [`ALIGN`]; 0 = no pool).
    pub fn new<B: DeviceBackend + ?Sized>(
        backend: &mut B,
        bytes: u64,
    ) -> Result<Self, BackendError> {
        let size = bytes.next_multiple_of(ALIGN);
        if size == 0 {
            return Ok(StagingPool::default());
        }
        let base = backend.allocate_host(size, true)?;
        let mut free = BTreeMap::new();
        free.insert(0, size);
        Ok(StagingPool {
            base: Some(base),
            size,
            free_bytes: size,
            free,
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Room for `bytes`: the first free range that holds them (first fit) or, with
    /// `split` where none does but the pool has room in total, the largest free range
    /// and the first that holds the rest (the copy then goes in two parts); `None` if
    /// neither. A split is only made where the pool's free bytes are scattered: a large
    /// tensor the out-of-memory path must spill would otherwise go to pageable memory,
    /// whose copies hold the host. Cost: O(free ranges).
    pub fn alloc(&mut self, bytes: u64, split: bool) -> Option<HostLoc> {
        let base = self.base?;
        let len = bytes.max(1).next_multiple_of(ALIGN);
        if len > self.free_bytes {
            return None;
        }
        if let Some(off) = self.take(len, None) {
            return Some(HostLoc::warm(HostPtr(base.0 + off), len));
        }
        if !split {
            return None;
        }
        let (&big, &head) = self
            .free
            .iter()
            .max_by_key(|&(&o, &l)| (l, std::cmp::Reverse(o)))?;
        let rest = self.take(len - head, Some(big))?;
        self.free.remove(&big);
        self.free_bytes -= head;
        Some(HostLoc::Warm {
            ptr: HostPtr(base.0 + big),
            len,
            head,
            tail: HostPtr(base.0 + rest),
        })
    }

    /// Takes `len` bytes from the first free range that holds them (other than the
    /// one at `skip`); its offset.
    fn take(&mut self, len: u64, skip: Option<u64>) -> Option<u64> {
        let (&off, &flen) = self
            .free
            .iter()
            .find(|&(&o, &l)| l >= len && Some(o) != skip)?;
        self.free.remove(&off);
        if flen > len {
            self.free.insert(off + len, flen - len);
        }
        self.free_bytes -= len;
        Some(off)
    }

    /// Returns the ranges of a copy from [`StagingPool::alloc`].
    pub fn release(&mut self, loc: HostLoc) {
        let (HostLoc::Warm { .. }, Some(base)) = (loc, self.base) else {
            return;
        };
        for (ptr, len) in loc.parts() {
            self.release_range(ptr.0 - base.0, len);
        }
    }

    fn release_range(&mut self, off: u64, len: u64) {
        let (mut off, mut len, freed) = (off, len, len);
        // Merge with the following free range.
        if let Some(&next) = self.free.get(&(off + len)) {
            self.free.remove(&(off + len));
            len += next;
        }
        // Merge with the preceding free range.
        if let Some((&poff, &plen)) = self.free.range(..off).next_back() {
            if poff + plen == off {
                self.free.remove(&poff);
                off = poff;
                len += plen;
            }
        }
        self.free.insert(off, len);
        self.free_bytes += freed;
    }

    /// Checks a location handed out by [`StagingPool::alloc`] and not released: its
    /// ranges lie in the pool, are aligned, and overlap neither each other nor a free
    /// range. (Its owner checks that the locations it holds sum to the bytes in use.)
    /// O(log free ranges).
    pub fn check_loc(&self, loc: &HostLoc) -> Result<(), String> {
        let HostLoc::Warm { len, head, .. } = *loc else {
            return Ok(());
        };
        let Some(base) = self.base else {
            return Err(format!("staging: {loc:?} held, but there is no pool"));
        };
        if head == 0 || head > len || head % ALIGN != 0 || len % ALIGN != 0 {
            return Err(format!("staging: bad split {loc:?}"));
        }
        let mut parts = loc.parts().map(|(p, n)| (p.0.wrapping_sub(base.0), n));
        let (first, second) = (parts.next(), parts.next());
        for (off, n) in first.into_iter().chain(second) {
            if off >= self.size || n > self.size - off {
                return Err(format!("staging: {loc:?} lies outside the pool"));
            }
            if let Some((&f, &flen)) = self.free.range(..off + n).next_back() {
                if f + flen > off {
                    return Err(format!(
                        "staging: {loc:?} overlaps the free range {f}+{flen}"
                    ));
                }
            }
        }
        if let (Some((a, an)), Some((b, bn))) = (first, second) {
            if a < b + bn && b < a + an {
                return Err(format!("staging: the two ranges of {loc:?} overlap"));
            }
        }
        Ok(())
    }

    /// Gives the pinned buffer back (at shutdown).
    pub fn destroy<B: DeviceBackend + ?Sized>(
        &mut self,
        backend: &mut B,
    ) -> Result<(), BackendError> {
        if let Some(base) = self.base.take() {
            backend.deallocate_host(base, self.size)?;
        }
        *self = StagingPool::default();
        Ok(())
    }

    pub fn check_invariants(&self) -> Result<(), String> {
        let mut sum = 0;
        let mut end = None;
        for (&off, &len) in &self.free {
            if len == 0 || off % ALIGN != 0 || len % ALIGN != 0 {
                return Err(format!("staging: bad free range {off}+{len}"));
            }
            if let Some(e) = end {
                if off <= e {
                    return Err(format!(
                        "staging: free range at {off} touches the previous (ends {e})"
                    ));
                }
            }
            end = Some(off + len);
            sum += len;
        }
        if sum != self.free_bytes || end.is_some_and(|e| e > self.size) {
            return Err(format!(
                "staging: free ranges sum to {sum}, counted {}, size {}",
                self.free_bytes, self.size
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::host::HostBackend;

    #[test]
    fn ranges_are_reused_and_coalesced() {
        let mut b = HostBackend::new(1 << 20);
        let mut p = StagingPool::new(&mut b, 64 << 10).unwrap();
        let a = p.alloc(5000, true).unwrap();
        let c = p.alloc(4096, true).unwrap();
        let d = p.alloc(40 << 10, true).unwrap();
        assert!(p.alloc(16 << 10, true).is_none());
        assert_eq!(p.free_bytes(), (64 << 10) - 8192 - 4096 - (40 << 10));
        p.release(c);
        p.release(a);
        p.check_invariants().unwrap();
        // a and c merged: 12 KiB contiguous again.
        let e = p.alloc(12 << 10, true).unwrap();
        p.release(e);
        p.release(d);
        p.check_invariants().unwrap();
        assert_eq!(p.free_bytes(), 64 << 10);
        assert!(p.alloc(64 << 10, true).is_some());
        p.destroy(&mut b).unwrap();
    }

    #[test]
    fn room_in_two_ranges_is_taken_in_two_parts_and_given_back() {
        let mut b = HostBackend::new(1 << 20);
        let mut p = StagingPool::new(&mut b, 64 << 10).unwrap();
        let q: Vec<_> = (0..4).map(|_| p.alloc(16 << 10, true).unwrap()).collect();
        p.release(q[0]);
        p.release(q[2]);
        // 32 KiB free in two ranges of 16: a split copy, the largest range first.
        let s = p.alloc(20 << 10, true).unwrap();
        let parts: Vec<_> = s.parts().collect();
        assert_eq!(parts.len(), 2, "{s:?}");
        assert_eq!((parts[0].1, parts[1].1), (16 << 10, 4 << 10));
        assert_eq!(s.bytes(), 20 << 10);
        assert_eq!(p.free_bytes(), 12 << 10);
        p.check_invariants().unwrap();
        // More than the pool has free: nothing taken.
        assert!(p.alloc(16 << 10, true).is_none());
        assert_eq!(p.free_bytes(), 12 << 10);
        for l in [s, q[1], q[3]] {
            p.check_loc(&l).unwrap();
        }
        // Locations no allocation made: the check names each.
        let HostLoc::Warm { ptr, tail, .. } = s else {
            unreachable!()
        };
        let bad = |loc: HostLoc| p.check_loc(&loc).unwrap_err();
        assert!(bad(HostLoc::Warm {
            ptr,
            len: 20 << 10,
            head: 0,
            tail
        })
        .contains("bad split"));
        assert!(bad(HostLoc::Warm {
            ptr,
            len: 20 << 10,
            head: 8 << 10,
            tail: ptr
        })
        .contains("two ranges"));
        assert!(bad(HostLoc::warm(HostPtr(ptr.0 + (60 << 10)), 8 << 10)).contains("outside"));
        p.release(s);
        // Released: its ranges are free now.
        assert!(p.check_loc(&s).unwrap_err().contains("free range"));
        p.release(q[1]);
        p.release(q[3]);
        p.check_invariants().unwrap();
        assert_eq!(p.free_bytes(), 64 << 10);
        assert_eq!(p.alloc(64 << 10, true).unwrap().parts().count(), 1);
        p.destroy(&mut b).unwrap();
    }
}
