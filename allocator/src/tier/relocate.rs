//! Relocation: the out-of-memory path's first resort when the device holds the free
//! bytes a request needs but no block of them (the budget's arena is fragmented).
//!
//! Under a budget the arena fragments: spills and frees leave holes between the tensors
//! that stay, and a request can fail with more free bytes than it asks for. The
//! out-of-memory path used to answer every such failure over the link (wait for spills
//! in flight, then spill the cheapest address window: `TierConfig::oom_by_address`).
//! Relocation answers it on the device: the tensors of the address window of the
//! request's size that holds the fewest movable bytes are copied device to device into
//! free blocks outside it, and their old blocks are freed, which opens the window.
//!
//! - **Targets first.** Every moved tensor's new block is allocated while the
//!   window's tensors still hold theirs, largest tensor first, each in the smallest
//!   free block wholly outside the window (`Allocator::allocate_outside`); if one does
//!   not fit, the round is undone (every target freed, nothing moved) and the path goes
//!   on over the link as before.
//! - **Then the copies**, synchronous on the compute stream (the device's copy moves
//!   ~1.8 TB/s at 64 MiB on an H200, measured, against ~51 GB/s over the link each way:
//!   a 64 MiB tensor in ~37 us where its spill takes ~1.3 ms and its return as much
//!   again), each tensor's place updated to its new block and its old block freed. A
//!   moved tensor stays resident: nothing has to come back. A failed copy leaves its
//!   tensor whole in its old block (as a failed spill does) and ends the round.
//! - **Who moves**: spill candidates only (unpinned device tensors with no copy in
//!   flight, prefetched-unused ones included: moving them costs no return), as for the
//!   window of `oom_by_address`. A tensor's address changes only between the steps that
//!   pin it, as with spills.
//!
//! The out-of-memory path tries a round before each wait over the link until one opens
//! its window: then the retry after it is served. A round that moved nothing, or stopped
//! at a failed copy, leaves the path to go on over the link (and to try again after the
//! next wait). Requests below the large size classes (the slabs') are not relocated.
//! While a round runs, the allocator's counters hold the moved tensors twice (targets
//! are allocated before the old blocks are freed), as its peaks then show.
//!
//! Cost: the candidates (O(tensors)), a map by address and a sweep of the arena's blocks,
//! then per moved tensor one search of the free blocks outside the window (O(free
//! blocks)), one device copy and one free. Only on out-of-memory retries that
//! fragmentation caused.

use crate::backend::{DeviceBackend, MemRef};
use crate::pool::Allocation;

use super::handle::{Place, TensorHandle};
use super::manager::TierManager;
use super::TierError;

impl<B: DeviceBackend> TierManager<B> {
    /// One round of relocation for a request of `bytes` that failed (see the module
    /// docs). Returns whether it opened the window (every tensor of it moved: the caller
    /// retries the request); a round that moved nothing, or stopped at a failed copy,
    /// returns false. A device error freeing a block is returned after every other
    /// target of the round has been given back.
    pub(crate) fn relocate_window(&mut self, bytes: u64) -> Result<bool, TierError> {
        // Small requests live in the slabs, which windows do not cover.
        if !self.cfg.relocate
            || !self.alloc.is_large(bytes)
            || self.alloc.large_free_bytes(0) < bytes
        {
            return Ok(false);
        }
        let cands = self.candidates(true);
        let by_ptr = self.by_device_ptr(&cands);
        // The cost of a window is the bytes its tensors would move.
        let Some(w) = self.alloc.cheapest_window(bytes, 0, |p| {
            by_ptr.get(&p.0).map(|&i| cands[i].bytes as f64)
        }) else {
            return Ok(false);
        };
        let mut victims: Vec<(TensorHandle, Allocation)> = Vec::new();
        for p in &w.victims {
            let Some(&i) = by_ptr.get(&p.0) else {
                return Ok(false);
            };
            let h = cands[i].handle;
            let Place::Device { alloc } = self.reg.get(h)?.place else {
                return Ok(false);
            };
            victims.push((h, alloc));
        }
        victims.sort_by_key(|&(_, a)| std::cmp::Reverse(a.size));
        let window = (w.start.0, w.start.0 + w.span);
        let mut targets: Vec<Allocation> = Vec::with_capacity(victims.len());
        for &(_, old) in &victims {
            match self.alloc.allocate_outside(old.size, 0, window) {
                Ok(Some(a)) => targets.push(a),
                other => {
                    self.free_all(targets)?;
                    return other.map(|_| false).map_err(TierError::from);
                }
            }
        }
        let t0 = self.alloc.backend().now_us();
        let (mut moved, mut left) = (0, Vec::new());
        let mut first_err = None;
        for (&(h, old), &target) in victims.iter().zip(&targets) {
            if !left.is_empty() {
                left.push(target);
                continue;
            }
            let copy = self.alloc.backend_mut().copy(
                MemRef::Device(target.ptr),
                MemRef::Device(old.ptr),
                old.size,
                None,
            );
            if copy.is_err() {
                // The tensor stays in its old block, whole, as a failed spill leaves
                // it; the round ends and the targets left are given back.
                self.stats.transfer_failures += 1;
                left.push(target);
                continue;
            }
            self.reg.get_mut(h)?.place = Place::Device { alloc: target };
            moved += old.size;
            if let Err(e) = self.alloc.deallocate(old, 0) {
                first_err.get_or_insert(e);
            }
        }
        let opened = left.is_empty();
        let r = self.free_all(left);
        let us = self.alloc.backend().now_us() - t0;
        self.stats.transfer_stall_us += us;
        self.stats.oom_relocate_us += us;
        tracing::debug!(bytes, moved, opened, us, "relocation round");
        if moved > 0 {
            self.stats.relocations += 1;
            self.stats.relocated_bytes += moved;
        }
        if let Some(e) = first_err {
            return Err(e.into());
        }
        r?;
        Ok(opened)
    }

    /// Frees every allocation of `allocs` even if one fails; the first error.
    fn free_all(&mut self, allocs: Vec<Allocation>) -> Result<(), TierError> {
        let mut first = Ok(());
        for a in allocs {
            if let Err(e) = self.alloc.deallocate(a, 0) {
                if first.is_ok() {
                    first = Err(e.into());
                }
            }
        }
        first
    }
}
