//! Host buffers of the tiers and the copies to and from them: the pinned pool's
//! ranges (warm) or pageable buffers (cold), the host-byte counters, and the host's
//! time inside copies with pageable memory, which return only once the host buffer is
//! no longer needed.

use crate::backend::{DeviceBackend, DevicePtr, MemRef};
use crate::pool::Allocation;

use super::handle::TensorHandle;
use super::manager::TierManager;
use super::staging::HostLoc;
use super::transfer::{Completion, Direction, IssueError, TransferId};
use super::TierError;

impl<B: DeviceBackend> TierManager<B> {
    pub(crate) fn release_host(&mut self, host: HostLoc) -> Result<(), TierError> {
        match host {
            HostLoc::Warm { .. } => self.staging.release(host),
            HostLoc::Cold { ptr, len } => self.alloc.backend_mut().deallocate_host(ptr, len)?,
        }
        self.stats.host_bytes -= host.bytes();
        Ok(())
    }

    /// Room in the pinned staging pool for `bytes`, or `None` if it has none; `split`:
    /// two ranges may do where no single one does (`StagingPool::alloc`).
    pub(super) fn pinned_alloc(&mut self, bytes: u64, split: bool) -> Option<HostLoc> {
        let loc = self.staging.alloc(bytes, split)?;
        self.count_host(loc);
        Some(loc)
    }

    fn count_host(&mut self, loc: HostLoc) {
        self.stats.host_bytes += loc.bytes();
        self.stats.peak_host_bytes = self.stats.peak_host_bytes.max(self.stats.host_bytes);
    }

    /// A host buffer for a spill that may go to pageable memory: the staging pool if
    /// it has room (in two ranges if need be, with `split`: a spill the caller waits
    /// for or asked for), else pageable.
    pub(crate) fn host_alloc(&mut self, bytes: u64, split: bool) -> Result<HostLoc, TierError> {
        if let Some(loc) = self.pinned_alloc(bytes, split) {
            return Ok(loc);
        }
        let len = bytes.max(1);
        match self.alloc.backend_mut().allocate_host(len, false) {
            Ok(ptr) => {
                let loc = HostLoc::Cold { ptr, len };
                self.count_host(loc);
                Ok(loc)
            }
            Err(e) => {
                self.stats.host_alloc_failures += 1;
                Err(e.into())
            }
        }
    }

    /// Queues a copy of `bytes` between device memory at `dev` and `host`, out of the
    /// device or into it (`dir`), on the pipeline's stream of that direction: one copy
    /// per range of `host` (two for a pinned copy split over two ranges, one event
    /// after both). A copy with pageable memory returns only once the host buffer is no
    /// longer needed (to pageable memory: once done; from it: once staged through the
    /// driver's own pinned buffer), so the host time inside the call is counted:
    /// `pageable_copy_us` and the bytes. Cost: two clock reads for such a copy, none
    /// for a pinned one.
    pub(super) fn issue_copy(
        &mut self,
        dir: Direction,
        h: TensorHandle,
        dev: DevicePtr,
        host: HostLoc,
        bytes: u64,
    ) -> Result<TransferId, IssueError> {
        let mut parts = [(MemRef::Device(dev), MemRef::Device(dev), 0u64); 2];
        let mut n = 0;
        let mut at = 0;
        for (ptr, len) in host.parts() {
            let len = len.min(bytes - at);
            if len == 0 {
                break;
            }
            let (d, hp) = (MemRef::Device(dev.offset(at)), MemRef::Host(ptr));
            parts[n] = match dir {
                Direction::Out => (hp, d, len),
                Direction::In => (d, hp, len),
            };
            n += 1;
            at += len;
        }
        let parts = &parts[..n];
        if host.is_warm() {
            return self.pipe.issue(self.alloc.backend_mut(), dir, h, parts);
        }
        let t0 = self.alloc.backend().now_us();
        let r = self.pipe.issue(self.alloc.backend_mut(), dir, h, parts);
        self.stats.pageable_copy_us += self.alloc.backend().now_us() - t0;
        if r.is_ok() {
            self.stats.pageable_copied_bytes += bytes;
        }
        r
    }

    /// The device block a copy in failed to fill: freed, or, where part of the copy is
    /// queued (`orphan`), held by that orphan until the copy lands. The tensor stays on
    /// the host; its host copy, the queued part's source, stays its own, and goes to the
    /// orphan if the tensor is freed first (`Pipeline::adopt_host`).
    pub(super) fn release_copy_target(
        &mut self,
        orphan: Option<TransferId>,
        alloc: Allocation,
    ) -> Result<(), TierError> {
        match orphan {
            Some(id) => self.orphan_buffers(id, Some(alloc), None),
            None => Ok(self.alloc.deallocate(alloc, 0)?),
        }
    }

    /// Hands `device` and `host` to orphan `id`, released when its copies land.
    pub(super) fn orphan_buffers(
        &mut self,
        id: TransferId,
        device: Option<Allocation>,
        host: Option<HostLoc>,
    ) -> Result<(), TierError> {
        if self.pipe.orphan(id, Completion::Release { device, host }) {
            Ok(())
        } else {
            Err(TierError::Invariant(format!(
                "transfer {id:?} was to be an orphan in flight"
            )))
        }
    }
}
