//! Finding an allocation by its address: the pointer API a framework integration
//! uses (`deallocate_ptr`, `lookup`) and the used-run index it builds on first use.

use crate::backend::{DeviceBackend, DevicePtr, StreamId};
use crate::buddy::NIL;
use crate::error::AllocError;
use crate::pool::{Allocation, Allocator, RecState, SLAB_TAG};

impl<B: DeviceBackend> Allocator<B> {
    /// Frees the allocation starting at `ptr` (the CUDA-style API; a tree lookup, so
    /// slower than [`Allocator::deallocate`]). Returns the requested size.
    pub fn deallocate_ptr(&mut self, ptr: DevicePtr, stream: StreamId) -> Result<u64, AllocError> {
        self.ensure_run_index();
        let a = self.lookup(ptr)?;
        self.deallocate(a, stream)?;
        Ok(a.size)
    }

    /// Turns on the used-run index of every pool (the address -> run map of large
    /// segments). It is off until the first free by pointer, so that allocators used
    /// through handles only never pay for it (two hash operations per large run).
    fn ensure_run_index(&mut self) {
        for (s, pool) in self.pools.iter_mut().enumerate() {
            let Some(pool) = pool else { continue };
            if pool.buddy.run_index() {
                continue;
            }
            let runs: Vec<_> = self
                .records
                .iter()
                .enumerate()
                .filter(|(_, r)| r.state != RecState::Free && !r.slab() && r.stream() as usize == s)
                .map(|(id, r)| {
                    let (seg, blk) = r.seg_blk();
                    let run = pool.buddy.run_of(seg, blk);
                    (seg, run.off, r.size(), id as u32)
                })
                .collect();
            pool.buddy.set_run_index(true, runs);
        }
    }

    /// The live allocation that starts at `ptr`. A tree lookup, or a scan of the record
    /// table for large runs until the first [`Allocator::deallocate_ptr`] builds the
    /// run index.
    pub fn lookup(&self, ptr: DevicePtr) -> Result<Allocation, AllocError> {
        let unknown = || AllocError::UnknownAllocation {
            what: format!("pointer {ptr}"),
        };
        for pool in self.pools.iter().flatten() {
            let Some((seg, off)) = pool.buddy.segment_of(ptr.0) else {
                continue;
            };
            let owner = match pool.buddy.owner_at(seg, off) {
                Some(o) => o,
                None if !pool.buddy.run_index() && !pool.buddy.segs[seg].tree => {
                    self.records
                        .iter()
                        .position(|r| r.state != RecState::Free && !r.slab() && r.ptr == ptr.0)
                        .ok_or_else(unknown)? as u32
                }
                None => return Err(unknown()),
            };
            let id = if owner != NIL && owner & SLAB_TAG != 0 {
                let slab = &self.slabs[owner & !SLAB_TAG];
                let rel = ptr.0 - slab.base;
                if !rel.is_multiple_of(slab.obj) {
                    return Err(unknown());
                }
                match slab.record_at((rel / slab.obj) as u32) {
                    // A free slot's record is the slab's, not an allocation.
                    Some(id) if self.records[id].state != RecState::Free => id,
                    _ => return Err(unknown()),
                }
            } else {
                owner
            };
            let r = self.records.get(id).ok_or_else(unknown)?;
            if r.ptr != ptr.0 {
                return Err(unknown());
            }
            if r.state != RecState::Live {
                return Err(AllocError::DoubleFree { ptr });
            }
            return Ok(self.handle(id));
        }
        Err(unknown())
    }
}
