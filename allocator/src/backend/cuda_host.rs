//! Host memory and copies of [`CudaBackend`]: pinned buffers (`cuMemHostAlloc`),
//! pageable ones (the global allocator), asynchronous copies on a stream
//! (`cuMemcpy{HtoD,DtoH,DtoD}Async`) and synchronous ones (on the default stream, then
//! `cuStreamSynchronize`). Every range is checked against this backend's live segments
//! and host buffers before it reaches the driver.

use std::alloc::Layout;
use std::ffi::c_void;

use cudarc::driver::sys;

use super::cuda::{check, CudaBackend, HostRegion};
use super::cuda_stats::CallKind;
use super::{BackendError, DeviceBackend, HostPtr, MemRef, StreamId};

impl CudaBackend {
    /// `[addr, addr+len)` inside a live host buffer: whether it is pinned.
    fn host_range(&self, addr: u64, len: u64) -> Result<bool, BackendError> {
        let end = addr
            .checked_add(len)
            .ok_or_else(|| BackendError::Invalid("address overflow".into()))?;
        match self.host.range(..=addr).next_back() {
            Some((&b, r)) if end <= b + r.len => Ok(r.pageable.is_none()),
            _ => Err(BackendError::Invalid(format!(
                "host range [{addr:#x}, {end:#x}) is not inside a host buffer of this backend"
            ))),
        }
    }

    fn check_ref(&self, m: MemRef, len: u64) -> Result<(), BackendError> {
        match m {
            MemRef::Device(d) => self.check_device_range(d.0, len),
            MemRef::Host(h) => self.host_range(h.0, len).map(|_| ()),
        }
    }

    /// Queues (or, `stream: None`, performs) a copy whose ends were checked.
    fn raw_copy(
        &mut self,
        dst: MemRef,
        src: MemRef,
        bytes: u64,
        stream: Option<StreamId>,
    ) -> Result<(), BackendError> {
        let s = self.stream(stream.unwrap_or(0))?;
        let n = bytes as usize;
        if let (MemRef::Host(d), MemRef::Host(h)) = (dst, src) {
            // Host to host: in stream order, done on the host.
            if let Some(st) = stream {
                self.synchronize_stream(st)?;
            }
            // SAFETY: both ranges were checked to lie inside live host buffers of this
            // backend; `copy` (memmove) allows overlap.
            unsafe { std::ptr::copy(h.0 as *const u8, d.0 as *mut u8, n) };
            return Ok(());
        }
        // A copy to or from pageable memory blocks the host in the call (the driver
        // stages it through pinned memory; one to pageable memory returns only once it
        // has completed): host time the stall counts, as the sim charges it.
        let pageable = match (dst, src) {
            (MemRef::Host(h), _) | (_, MemRef::Host(h)) => !self.host_range(h.0, bytes)?,
            _ => false,
        };
        // SAFETY: library loaded, context current (callers bind); device ranges lie in
        // live segments and host ranges in live host buffers (checked by the callers);
        // the caller keeps both alive until the copy completes (trait contract), and
        // synchronous copies are waited for below.
        let call = || unsafe {
            match (dst, src) {
                (MemRef::Device(d), MemRef::Host(h)) => {
                    sys::cuMemcpyHtoDAsync_v2(d.0, h.0 as *const c_void, n, s)
                }
                (MemRef::Host(h), MemRef::Device(d)) => {
                    sys::cuMemcpyDtoHAsync_v2(h.0 as *mut c_void, d.0, n, s)
                }
                (MemRef::Device(d), MemRef::Device(e)) => sys::cuMemcpyDtoDAsync_v2(d.0, e.0, n, s),
                (MemRef::Host(_), MemRef::Host(_)) => unreachable!("handled above"),
            }
        };
        let r = if pageable {
            self.timed(CallKind::Copy, bytes, 0, |_| call())
        } else {
            call()
        };
        check("cuMemcpyAsync", r)?;
        if stream.is_none() {
            self.synchronize_stream(0)?;
        }
        Ok(())
    }

    pub(super) fn host_alloc(&mut self, bytes: u64, pinned: bool) -> Result<HostPtr, BackendError> {
        let size = usize::try_from(bytes)
            .ok()
            .filter(|&s| s > 0)
            .ok_or_else(|| BackendError::Invalid(format!("bad host buffer size {bytes}")))?;
        let base = if pinned {
            self.bind()?;
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: library loaded, context current; `p` is a live local.
            let r = self.timed(CallKind::HostAlloc, bytes, 0, |_| unsafe {
                sys::cuMemHostAlloc(&mut p, size, sys::CU_MEMHOSTALLOC_PORTABLE)
            });
            if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                return Err(BackendError::HostOutOfMemory { requested: bytes });
            }
            check("cuMemHostAlloc", r)?;
            self.host.insert(
                p as u64,
                HostRegion {
                    len: bytes,
                    pageable: None,
                },
            );
            p as u64
        } else {
            let layout = Layout::from_size_align(size, 64)
                .map_err(|e| BackendError::Invalid(e.to_string()))?;
            // SAFETY: `layout` has a non-zero size; the pointer is checked for null and
            // freed once with the same layout (`deallocate_host` or `Drop`).
            let p = unsafe { std::alloc::alloc_zeroed(layout) };
            if p.is_null() {
                return Err(BackendError::HostOutOfMemory { requested: bytes });
            }
            self.host.insert(
                p as u64,
                HostRegion {
                    len: bytes,
                    pageable: Some(layout),
                },
            );
            p as u64
        };
        Ok(HostPtr(base))
    }

    pub(super) fn host_free(&mut self, ptr: HostPtr, bytes: u64) -> Result<(), BackendError> {
        match self.host.get(&ptr.0) {
            Some(r) if r.len == bytes => {}
            _ => {
                return Err(BackendError::Invalid(format!(
                    "free of host buffer {:#x} ({bytes} bytes): not one of this backend",
                    ptr.0
                )))
            }
        }
        let r = self.host.remove(&ptr.0).expect("checked above");
        match r.pageable {
            Some(layout) => {
                // SAFETY: allocated by `alloc_zeroed` with `layout` in `allocate_host`,
                // removed from the map above, so freed once.
                unsafe { std::alloc::dealloc(ptr.0 as *mut u8, layout) };
                Ok(())
            }
            None => {
                self.bind()?;
                // SAFETY: a live cuMemHostAlloc buffer of this backend, removed above.
                let res = self.timed(CallKind::HostFree, bytes, 0, |_| unsafe {
                    sys::cuMemFreeHost(ptr.0 as *mut c_void)
                });
                check("cuMemFreeHost", res)
            }
        }
    }

    pub(super) fn copy_bytes(
        &mut self,
        dst: MemRef,
        src: MemRef,
        bytes: u64,
        stream: Option<StreamId>,
    ) -> Result<(), BackendError> {
        if let Some(s) = stream {
            self.stream(s)?;
        }
        self.check_ref(dst, bytes)?;
        self.check_ref(src, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        self.raw_copy(dst, src, bytes, stream)
    }

    pub(super) fn write_bytes(&mut self, dst: MemRef, data: &[u8]) -> Result<(), BackendError> {
        let n = data.len() as u64;
        self.check_ref(dst, n)?;
        if n == 0 {
            return Ok(());
        }
        match dst {
            MemRef::Host(h) => {
                // SAFETY: the range lies inside a live host buffer (checked); memmove
                // is sound even if `data` borrows from it.
                unsafe { std::ptr::copy(data.as_ptr(), h.0 as *mut u8, data.len()) };
                Ok(())
            }
            MemRef::Device(d) => {
                self.bind()?;
                // SAFETY: library loaded, context current; the device range is inside
                // a live segment (checked); `data` outlives the call, which waits for
                // the copy (stream synchronization below).
                check("cuMemcpyHtoDAsync", unsafe {
                    sys::cuMemcpyHtoDAsync_v2(
                        d.0,
                        data.as_ptr() as *const c_void,
                        data.len(),
                        std::ptr::null_mut(),
                    )
                })?;
                self.synchronize_stream(0)
            }
        }
    }

    pub(super) fn read_bytes(&mut self, src: MemRef, out: &mut [u8]) -> Result<(), BackendError> {
        let n = out.len() as u64;
        self.check_ref(src, n)?;
        if n == 0 {
            return Ok(());
        }
        match src {
            MemRef::Host(h) => {
                // SAFETY: the range lies inside a live host buffer (checked); `out` is
                // an exclusive borrow of the same length; memmove handles overlap.
                unsafe { std::ptr::copy(h.0 as *const u8, out.as_mut_ptr(), out.len()) };
                Ok(())
            }
            MemRef::Device(d) => {
                self.bind()?;
                // SAFETY: as in `write`; `out` is exclusively borrowed until the copy
                // completes (synchronized below).
                check("cuMemcpyDtoHAsync", unsafe {
                    sys::cuMemcpyDtoHAsync_v2(
                        out.as_mut_ptr() as *mut c_void,
                        d.0,
                        out.len(),
                        std::ptr::null_mut(),
                    )
                })?;
                self.synchronize_stream(0)
            }
        }
    }
}
