//! The warm tier: one pinned host buffer, allocated once and sub-allocated.
//!
//! Why: `cudaHostAlloc` costs 1.6 ms for 2 MiB and 153 ms for 256 MiB on the H200 host
//! (measured on the H200), so pinned memory is obtained once, at start, and
//! reused; only pinned memory reaches ~55 GB/s (pageable: 8-18 GB/s).
//!
//! The pool is a first-fit range allocator over offsets with coalescing of free
//! neighbours (a `BTreeMap` of free ranges): `alloc` is O(free ranges), `free`
//! O(log free ranges). Ranges are multiples of [`ALIGN`].
//!
//! Invariant: `free_bytes + used_bytes == size`, free ranges never touch or overlap.

use std::collections::BTreeMap;

use crate::backend::{BackendError, DeviceBackend, HostPtr, MemRef};

/// Alignment of staging ranges (a DMA-friendly 4 KiB page).
pub const ALIGN: u64 = 4096;

/// Where a host copy lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostLoc {
    /// A range of the pinned staging pool.
    Warm { ptr: HostPtr, len: u64 },
    /// Its own pageable buffer.
    Cold { ptr: HostPtr, len: u64 },
}

impl HostLoc {
    pub fn mem(&self) -> MemRef {
        match *self {
            HostLoc::Warm { ptr, .. } | HostLoc::Cold { ptr, .. } => MemRef::Host(ptr),
        }
    }
    pub fn is_warm(&self) -> bool {
        matches!(self, HostLoc::Warm { .. })
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

    /// A range for `bytes`, or `None` if no free range is large enough (first fit).
    pub fn alloc(&mut self, bytes: u64) -> Option<HostLoc> {
        let base = self.base?;
        let len = bytes.max(1).next_multiple_of(ALIGN);
        if len > self.free_bytes {
            return None;
        }
        let (&off, &flen) = self.free.iter().find(|(_, &l)| l >= len)?;
        self.free.remove(&off);
        if flen > len {
            self.free.insert(off + len, flen - len);
        }
        self.free_bytes -= len;
        Some(HostLoc::Warm {
            ptr: HostPtr(base.0 + off),
            len,
        })
    }

    /// Returns a range from [`StagingPool::alloc`].
    pub fn release(&mut self, loc: HostLoc) {
        let (HostLoc::Warm { ptr, len }, Some(base)) = (loc, self.base) else {
            return;
        };
        let mut off = ptr.0 - base.0;
        let mut len = len;
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
        self.free_bytes += loc_len(&loc);
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

fn loc_len(l: &HostLoc) -> u64 {
    match *l {
        HostLoc::Warm { len, .. } | HostLoc::Cold { len, .. } => len,
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
        let a = p.alloc(5000).unwrap();
        let c = p.alloc(4096).unwrap();
        let d = p.alloc(40 << 10).unwrap();
        assert!(p.alloc(16 << 10).is_none());
        assert_eq!(p.free_bytes(), (64 << 10) - 8192 - 4096 - (40 << 10));
        p.release(c);
        p.release(a);
        p.check_invariants().unwrap();
        // a and c merged: 12 KiB contiguous again.
        let e = p.alloc(12 << 10).unwrap();
        p.release(e);
        p.release(d);
        p.check_invariants().unwrap();
        assert_eq!(p.free_bytes(), 64 << 10);
        assert!(p.alloc(64 << 10).is_some());
        p.destroy(&mut b).unwrap();
    }
}
