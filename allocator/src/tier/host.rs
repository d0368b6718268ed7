//! Host buffers of the tiers and the copies to and from them: the pinned pool's
//! ranges (warm) or pageable buffers (cold), the host-byte counters, and the host's
//! time inside copies with pageable memory, which return only once the host buffer is
//! no longer needed.

use crate::backend::{BackendError, DeviceBackend, MemRef};

use super::handle::TensorHandle;
use super::manager::TierManager;
use super::staging::HostLoc;
use super::transfer::{Direction, TransferId};
use super::TierError;

impl<B: DeviceBackend> TierManager<B> {
    pub(crate) fn release_host(&mut self, host: HostLoc) -> Result<(), TierError> {
        match host {
            HostLoc::Warm { len, .. } => {
                self.staging.release(host);
                self.stats.host_bytes -= len;
            }
            HostLoc::Cold { ptr, len } => {
                self.alloc.backend_mut().deallocate_host(ptr, len)?;
                self.stats.host_bytes -= len;
            }
        }
        Ok(())
    }

    /// A range of the pinned staging pool for `bytes`, or `None` if it has no room.
    pub(super) fn pinned_alloc(&mut self, bytes: u64) -> Option<HostLoc> {
        let loc = self.staging.alloc(bytes)?;
        self.count_host(loc);
        Some(loc)
    }

    fn count_host(&mut self, loc: HostLoc) {
        let len = match loc {
            HostLoc::Warm { len, .. } | HostLoc::Cold { len, .. } => len,
        };
        self.stats.host_bytes += len;
        self.stats.peak_host_bytes = self.stats.peak_host_bytes.max(self.stats.host_bytes);
    }

    /// A host buffer for `bytes`: the staging pool if it has room, else pageable.
    pub(crate) fn host_alloc(&mut self, bytes: u64) -> Result<HostLoc, TierError> {
        if let Some(loc) = self.pinned_alloc(bytes) {
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

    /// Queues a copy between the device and `host` on the pipeline's stream of `dir`.
    /// A copy with pageable memory returns only once the host buffer is no longer
    /// needed (to pageable memory: once done; from it: once staged through the driver's
    /// own pinned buffer), so the host time inside the call is counted:
    /// `pageable_copy_us` and the bytes. Cost: two clock reads for such a
    /// copy, none for a pinned one.
    pub(super) fn issue_copy(
        &mut self,
        dir: Direction,
        h: TensorHandle,
        dst: MemRef,
        src: MemRef,
        bytes: u64,
        host: HostLoc,
    ) -> Result<TransferId, BackendError> {
        if host.is_warm() {
            return self
                .pipe
                .issue(self.alloc.backend_mut(), dir, h, dst, src, bytes);
        }
        let t0 = self.alloc.backend().now_us();
        let r = self
            .pipe
            .issue(self.alloc.backend_mut(), dir, h, dst, src, bytes);
        self.stats.pageable_copy_us += self.alloc.backend().now_us() - t0;
        if r.is_ok() {
            self.stats.pageable_copied_bytes += bytes;
        }
        r
    }
}
