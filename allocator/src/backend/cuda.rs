//! `cuda`: an NVIDIA GPU through the CUDA driver API.
//!
//! The driver is reached through cudarc's raw bindings (`cudarc::driver::sys`), loaded
//! at run time (`dynamic-loading`): building needs no CUDA toolkit, and a machine
//! without a driver gets [`BackendError::NoDriver`] ("no CUDA driver found") from
//! [`CudaBackend::new`], never a panic. cudarc panics on the first call into a missing
//! library, so `device_handle` (under `new` and `gpu_name`) asks `is_culib_present()`
//! before any other call.
//!
//! What it maps to:
//! - fixed segments: `cuMemAlloc` / `cuMemFree`;
//! - growable segments (`cuda_vmm.rs`): `cuMemAddressReserve` once, then per page of
//!   the driver's granularity `cuMemCreate` + `cuMemMap` (one `cuMemSetAccess` per
//!   growth); shrinking first synchronizes the context (every stream, PyTorch's too),
//!   then `cuMemUnmap` + `cuMemRelease` page by page, as PyTorch's expandable segments do;
//! - streams: `cuStreamCreateWithPriority` (non-blocking). `Low` is the lowest priority
//!   of the device, `High` the highest, `Normal` the middle of the range. Stream 0 is
//!   the legacy default stream. Streams created elsewhere (PyTorch's `cudaStream_t`)
//!   join with [`CudaBackend::register_stream`] or [`CudaBackend::adopt_stream`];
//! - events: `cuEventCreate` (timing disabled), record, query, synchronize, stream wait;
//! - host memory: pinned with `cuMemHostAlloc`, pageable from the global allocator;
//!   copies `cuMemcpy{HtoD,DtoH,DtoD}Async` on a stream, or on the default stream
//!   followed by a synchronization when the caller wants a synchronous copy.
//!
//! One context per device: the device's primary context (the one the CUDA runtime, and
//! so PyTorch, uses), retained at creation and made current on the calling thread at
//! every entry (a `cuCtxGetCurrent` when it already is).
//!
//! Clock: `now_us` is the wall clock; `stall_us` sums the wall time of every call that
//! blocks the host (allocations, frees, maps, unmaps, host allocations,
//! synchronizations). Each of those is also a sample of [`CallStats`] (`cuda_stats.rs`).
//!
//! Where `unsafe` lives: this file (context, fixed segments, streams, events),
//! `cuda_host.rs` (host memory, copies), `cuda_vmm.rs` (virtual memory) and
//! `cuda_kernels.rs` (the PTX test kernels), besides `host.rs`. Each block states its invariant in a `SAFETY` comment.
//! The invariants they share: the library is loaded (checked in `new` before any call);
//! every handle passed to the driver was created by this backend and is still alive;
//! every device range passed to a copy lies inside a live segment of this backend
//! (`check_device_range`), every host range inside a live host buffer (`host_range`).

use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_void, CStr};
use std::time::Instant;

use cudarc::driver::sys;

use super::cuda_stats::{CallKind, CallStats, CudaCallReport};
use super::{
    BackendError, DeviceBackend, DevicePtr, EventId, HostPtr, MemRef, StreamId, StreamPriority,
};

pub(super) const OK: sys::CUresult = sys::CUresult::CUDA_SUCCESS;

/// A driver error for `call`, with the driver's own text.
pub(super) fn driver_error(call: &'static str, r: sys::CUresult) -> BackendError {
    let mut msg: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: only reached after the library was found (every driver call is behind
    // `new`'s check); cuGetErrorString writes a pointer to a static NUL-terminated
    // string or leaves it null, which is checked.
    let text = unsafe {
        if sys::cuGetErrorString(r, &mut msg) == OK && !msg.is_null() {
            CStr::from_ptr(msg).to_string_lossy().into_owned()
        } else {
            format!("{r:?}")
        }
    };
    BackendError::Driver {
        call,
        code: r as u32,
        message: text,
    }
}

/// `Ok` for `CUDA_SUCCESS`, the driver's error otherwise.
pub(super) fn check(call: &'static str, r: sys::CUresult) -> Result<(), BackendError> {
    if r == OK {
        Ok(())
    } else {
        Err(driver_error(call, r))
    }
}

#[derive(Debug)]
struct Stream {
    raw: sys::CUstream,
    /// Created (and destroyed) by this backend; external streams are only borrowed.
    owned: bool,
}

#[derive(Debug)]
pub(super) struct HostRegion {
    pub len: u64,
    /// `Some(layout)`: pageable, from the global allocator; `None`: pinned.
    pub pageable: Option<Layout>,
}

/// A growable segment: its reserved range and the pages mapped at its start.
#[derive(Debug)]
pub(super) struct Growable {
    pub max: u64,
    /// One physical allocation per page of the mapped range, in address order; `None`
    /// for a page that `unmap_pages` released (nothing mapped there).
    pub pages: Vec<Option<sys::CUmemGenericAllocationHandle>>,
}

/// An NVIDIA GPU behind the [`DeviceBackend`] trait. See the module docs.
#[derive(Debug)]
pub struct CudaBackend {
    pub(super) ordinal: i32,
    pub(super) dev: sys::CUdevice,
    pub(super) ctx: sys::CUcontext,
    capacity: u64,
    /// The page of growable segments (`granularity()`): the driver's granularity, or a
    /// multiple of it set with `set_page_size`.
    pub(super) granularity: u64,
    driver_granularity: u64,
    pub(super) used: u64,
    fixed: BTreeMap<u64, u64>,
    pub(super) growable: BTreeMap<u64, Growable>,
    pub(super) host: BTreeMap<u64, HostRegion>,
    streams: Vec<Stream>,
    by_raw: HashMap<usize, StreamId>,
    adopt_next: Option<usize>,
    /// (lowest, highest) priority: CUDA's numbers, lower = more urgent.
    priorities: (i32, i32),
    events: Vec<Option<sys::CUevent>>,
    free_events: Vec<u32>,
    pub(super) kernels: Option<super::cuda_kernels::Kernels>,
    start: Instant,
    pub(super) stall_us: f64,
    pub(super) calls: CallStats,
}

// SAFETY: the raw handles (context, streams, events, module) are plain driver handles,
// valid from any thread of the process; every method makes the context current on the
// calling thread before using them, and `&mut self` (the allocator's lock) serializes
// all use.
unsafe impl Send for CudaBackend {}

/// The driver's handle of GPU `device`, after `cuInit`. [`BackendError::NoDriver`]
/// when the CUDA driver library cannot be loaded; `Invalid` for a device that does not
/// exist.
fn device_handle(device: i32) -> Result<sys::CUdevice, BackendError> {
    // SAFETY: `is_culib_present` only tries to open the library (libloading); it
    // calls no driver function.
    if !unsafe { sys::is_culib_present() } {
        return Err(BackendError::NoDriver);
    }
    let mut count = 0;
    let mut dev: sys::CUdevice = 0;
    // SAFETY: the library is present (checked above); every out-pointer points to a
    // live local of the right type.
    unsafe {
        check("cuInit", sys::cuInit(0))?;
        check("cuDeviceGetCount", sys::cuDeviceGetCount(&mut count))?;
        if device < 0 || device >= count {
            return Err(BackendError::Invalid(format!(
                "CUDA device {device} does not exist ({count} devices)"
            )));
        }
        check("cuDeviceGet", sys::cuDeviceGet(&mut dev, device))?;
    }
    Ok(dev)
}

/// The driver's name of GPU `device` (e.g. "NVIDIA H100 80GB HBM3"), without creating a
/// context. [`BackendError::NoDriver`] when the CUDA driver library cannot be loaded.
pub fn gpu_name(device: i32) -> Result<String, BackendError> {
    let dev = device_handle(device)?;
    let mut buf = [0 as std::ffi::c_char; 256];
    // SAFETY: the library is present (`device_handle` checked it) and `dev` is a valid
    // handle; `cuDeviceGetName` writes at most `buf.len()` bytes, NUL included.
    unsafe {
        check(
            "cuDeviceGetName",
            sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, dev),
        )?;
    }
    // The driver NUL-terminates within the buffer; the last byte is a guard regardless.
    buf[buf.len() - 1] = 0;
    // SAFETY: `buf` holds a NUL-terminated string (guarded above).
    let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Ok(name.to_string_lossy().into_owned())
}

impl CudaBackend {
    /// The GPU of ordinal `device`: its primary context, capacity and granularity.
    /// [`BackendError::NoDriver`] when the CUDA driver library cannot be loaded.
    pub fn new(device: i32) -> Result<Self, BackendError> {
        let dev = device_handle(device)?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        let mut total: usize = 0;
        let mut prio = (0, 0);
        // SAFETY: the library is present and `dev` valid (`device_handle`); every
        // out-pointer points to a live local of the right type.
        unsafe {
            check(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
            )?;
            check("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx))?;
            check(
                "cuDeviceTotalMem",
                sys::cuDeviceTotalMem_v2(&mut total, dev),
            )?;
            check(
                "cuCtxGetStreamPriorityRange",
                sys::cuCtxGetStreamPriorityRange(&mut prio.0, &mut prio.1),
            )?;
        }
        let mut b = CudaBackend {
            ordinal: device,
            dev,
            ctx,
            capacity: total as u64,
            granularity: 2 << 20,
            driver_granularity: 2 << 20,
            used: 0,
            fixed: BTreeMap::new(),
            growable: BTreeMap::new(),
            host: BTreeMap::new(),
            streams: vec![Stream {
                raw: std::ptr::null_mut(),
                owned: false,
            }],
            by_raw: HashMap::from([(0usize, 0)]),
            adopt_next: None,
            priorities: prio,
            events: Vec::new(),
            free_events: Vec::new(),
            kernels: None,
            start: Instant::now(),
            stall_us: 0.0,
            calls: CallStats::default(),
        };
        b.granularity = b.query_granularity()?;
        b.driver_granularity = b.granularity;
        Ok(b)
    }

    /// The driver's allocation granularity (2 MiB on an H200).
    pub fn driver_granularity(&self) -> u64 {
        self.driver_granularity
    }

    /// Sets the page of growable segments: each page is one `cuMemCreate` + `cuMemMap`
    /// (about 55 us each on an H200, whatever the size up to 2 MiB and beyond), so a
    /// larger page makes growth cheaper, and growth and release coarser (the allocator
    /// grows and shrinks in multiples of `granularity()`). A power-of-two multiple of
    /// the driver's granularity; only before the first growable segment.
    pub fn set_page_size(&mut self, bytes: u64) -> Result<(), BackendError> {
        if !bytes.is_power_of_two() || bytes < self.driver_granularity {
            return Err(BackendError::Invalid(format!(
                "page size {bytes} must be a power of two >= the driver's granularity {}",
                self.driver_granularity
            )));
        }
        if !self.growable.is_empty() {
            return Err(BackendError::Invalid(
                "page size set after a growable segment was reserved".into(),
            ));
        }
        self.granularity = bytes;
        Ok(())
    }

    /// The device ordinal.
    pub fn device(&self) -> i32 {
        self.ordinal
    }

    /// The latency counters (a shared handle: it stays readable after the backend
    /// moved into an allocator).
    pub fn call_stats(&self) -> CallStats {
        self.calls.clone()
    }

    /// Summaries of the timed device calls, with the sim's charges beside them.
    pub fn call_report(&self) -> CudaCallReport {
        self.calls.report()
    }

    /// The driver's (lowest, highest) stream priorities (CUDA numbers: lower = more urgent).
    pub fn priority_range(&self) -> (i32, i32) {
        self.priorities
    }

    /// Free and total device memory as the driver sees it (all processes).
    pub fn mem_info(&mut self) -> Result<(u64, u64), BackendError> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: library loaded, context current; out-pointers are live locals.
        check("cuMemGetInfo", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    /// Makes this device's context current on the calling thread (if it is not).
    pub(super) fn bind(&self) -> Result<(), BackendError> {
        let mut cur: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: library loaded (checked in `new`); `cur` is a live local; `self.ctx`
        // is the primary context retained in `new` and released only in `Drop`.
        unsafe {
            check("cuCtxGetCurrent", sys::cuCtxGetCurrent(&mut cur))?;
            if cur != self.ctx {
                check("cuCtxSetCurrent", sys::cuCtxSetCurrent(self.ctx))?;
            }
        }
        Ok(())
    }

    /// Runs a blocking driver call, counting its wall time as stall and as a sample.
    pub(super) fn timed<T>(
        &mut self,
        kind: CallKind,
        bytes: u64,
        pages: u32,
        f: impl FnOnce(&mut Self) -> T,
    ) -> T {
        let t = Instant::now();
        let r = f(self);
        let us = t.elapsed().as_secs_f64() * 1e6;
        self.stall_us += us;
        self.calls.record(kind, bytes, pages, us);
        r
    }

    /// Blocks until all work of this device's context is complete (every stream, also
    /// those of other libraries sharing the primary context).
    pub fn synchronize_device(&mut self) -> Result<(), BackendError> {
        self.bind()?;
        // SAFETY: library loaded, context current.
        self.timed(CallKind::Sync, 0, 0, |_| {
            check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
        })
    }

    /// The raw `CUstream` of a stream id (for launching work on it).
    pub fn raw_stream(&self, s: StreamId) -> Result<usize, BackendError> {
        Ok(self.stream(s)? as usize)
    }

    /// Registers a stream created elsewhere (a `cudaStream_t`, e.g. PyTorch's current
    /// stream) and returns its id; the same raw stream always gets the same id. The
    /// backend never destroys it. Raw `0` is stream 0 (the legacy default stream).
    ///
    /// An allocator must also learn the id: use [`CudaBackend::adopt_stream`] and then
    /// `Allocator::create_stream`, which then returns this stream's id.
    pub fn register_stream(&mut self, raw: usize) -> StreamId {
        if let Some(&id) = self.by_raw.get(&raw) {
            return id;
        }
        self.streams.push(Stream {
            raw: raw as sys::CUstream,
            owned: false,
        });
        let id = (self.streams.len() - 1) as StreamId;
        self.by_raw.insert(raw, id);
        id
    }

    /// The next [`DeviceBackend::create_stream`] registers `raw` (see
    /// [`CudaBackend::register_stream`]) instead of creating a stream.
    pub fn adopt_stream(&mut self, raw: usize) {
        self.adopt_next = Some(raw);
    }

    /// The id of an already registered raw stream.
    pub fn stream_of_raw(&self, raw: usize) -> Option<StreamId> {
        self.by_raw.get(&raw).copied()
    }

    pub(super) fn stream(&self, s: StreamId) -> Result<sys::CUstream, BackendError> {
        self.streams
            .get(s as usize)
            .map(|s| s.raw)
            .ok_or_else(|| BackendError::Invalid(format!("unknown stream {s}")))
    }

    fn event(&self, e: EventId) -> Result<sys::CUevent, BackendError> {
        match self.events.get(e.0 as usize) {
            Some(Some(ev)) => Ok(*ev),
            _ => Err(BackendError::Invalid(format!("unknown event {}", e.0))),
        }
    }

    pub(super) fn oom(&mut self, requested: u64) -> BackendError {
        let available = self.mem_info().map(|(f, _)| f).unwrap_or(0);
        BackendError::OutOfMemory {
            requested,
            available,
        }
    }

    /// `[addr, addr+len)` lies inside a live fixed segment or the mapped prefix of a
    /// growable one.
    pub(super) fn check_device_range(&self, addr: u64, len: u64) -> Result<(), BackendError> {
        let end = addr
            .checked_add(len)
            .ok_or_else(|| BackendError::Invalid("address overflow".into()))?;
        if let Some((&b, &l)) = self.fixed.range(..=addr).next_back() {
            if end <= b + l {
                return Ok(());
            }
        }
        if let Some((&b, g)) = self.growable.range(..=addr).next_back() {
            let gr = self.granularity;
            // Inside the mapped range, and no page of it released.
            let (first, end_page) = ((addr - b) / gr, (end - b).div_ceil(gr));
            if end <= b + g.pages.len() as u64 * gr
                && (first..end_page).all(|i| g.pages[i as usize].is_some())
            {
                return Ok(());
            }
        }
        Err(BackendError::Invalid(format!(
            "device range [{addr:#x}, {end:#x}) is not inside a live segment of this backend"
        )))
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        // SAFETY: library loaded, context current; every handle below was created by
        // this backend and is released exactly once here (the maps are drained); the
        // context is synchronized first, so no queued work still uses the memory.
        unsafe {
            let _ = sys::cuCtxSynchronize();
            for ev in self.events.drain(..).flatten() {
                let _ = sys::cuEventDestroy_v2(ev);
            }
            for s in self.streams.drain(..).filter(|s| s.owned) {
                let _ = sys::cuStreamDestroy_v2(s.raw);
            }
            for (base, _) in std::mem::take(&mut self.fixed) {
                let _ = sys::cuMemFree_v2(base);
            }
            for (base, g) in std::mem::take(&mut self.growable) {
                for (i, h) in g.pages.iter().enumerate() {
                    let Some(h) = h else { continue };
                    let _ = sys::cuMemUnmap(
                        base + i as u64 * self.granularity,
                        self.granularity as usize,
                    );
                    let _ = sys::cuMemRelease(*h);
                }
                let _ = sys::cuMemAddressFree(base, g.max as usize);
            }
            for (base, r) in std::mem::take(&mut self.host) {
                match r.pageable {
                    Some(layout) => std::alloc::dealloc(base as *mut u8, layout),
                    None => {
                        let _ = sys::cuMemFreeHost(base as *mut c_void);
                    }
                }
            }
            if let Some(k) = self.kernels.take() {
                let _ = sys::cuModuleUnload(k.module);
            }
            let _ = sys::cuDevicePrimaryCtxRelease_v2(self.dev);
        }
    }
}

impl DeviceBackend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn used(&self) -> u64 {
        self.used
    }
    fn granularity(&self) -> u64 {
        self.granularity
    }

    fn allocate(&mut self, bytes: u64, stream: StreamId) -> Result<DevicePtr, BackendError> {
        self.stream(stream)?;
        if bytes == 0 {
            return Err(BackendError::Invalid("zero-size device allocation".into()));
        }
        self.bind()?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: library loaded, context current; `p` is a live local.
        let r = self.timed(CallKind::Alloc, bytes, 0, |_| unsafe {
            sys::cuMemAlloc_v2(&mut p, bytes as usize)
        });
        if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Err(self.oom(bytes));
        }
        check("cuMemAlloc", r)?;
        self.fixed.insert(p, bytes);
        self.used += bytes;
        Ok(DevicePtr(p))
    }

    fn deallocate(
        &mut self,
        ptr: DevicePtr,
        bytes: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        self.stream(stream)?;
        match self.fixed.get(&ptr.0) {
            Some(&b) if b == bytes => {}
            _ => {
                return Err(BackendError::Invalid(format!(
                    "free of {ptr} ({bytes} bytes): not a segment of this backend"
                )))
            }
        }
        self.bind()?;
        // SAFETY: `ptr` is a live cuMemAlloc allocation of this backend (checked above),
        // freed once (removed below). cuMemFree waits for work still using it.
        let r = self.timed(CallKind::Free, bytes, 0, |_| unsafe {
            sys::cuMemFree_v2(ptr.0)
        });
        check("cuMemFree", r)?;
        self.fixed.remove(&ptr.0);
        self.used -= bytes;
        Ok(())
    }

    fn supports_growable(&self) -> bool {
        true
    }
    fn reserve_growable(&mut self, max_bytes: u64) -> Result<DevicePtr, BackendError> {
        self.vmm_reserve(max_bytes)
    }
    fn grow(&mut self, base: DevicePtr, mapped: u64, add: u64) -> Result<(), BackendError> {
        self.vmm_grow(base, mapped, add)
    }
    fn shrink(&mut self, base: DevicePtr, mapped: u64, release: u64) -> Result<(), BackendError> {
        self.vmm_shrink(base, mapped, release)
    }
    fn release_growable(&mut self, base: DevicePtr, mapped: u64) -> Result<(), BackendError> {
        self.vmm_release(base, mapped)
    }
    fn supports_page_release(&self) -> bool {
        true
    }
    fn unmap_pages(
        &mut self,
        base: DevicePtr,
        off: u64,
        len: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        self.vmm_unmap_pages(base, off, len, stream)
    }
    fn map_pages(&mut self, base: DevicePtr, off: u64, len: u64) -> Result<(), BackendError> {
        self.vmm_map_pages(base, off, len)
    }

    fn allocate_host(&mut self, bytes: u64, pinned: bool) -> Result<HostPtr, BackendError> {
        self.host_alloc(bytes, pinned)
    }
    fn deallocate_host(&mut self, ptr: HostPtr, bytes: u64) -> Result<(), BackendError> {
        self.host_free(ptr, bytes)
    }
    fn copy(
        &mut self,
        dst: MemRef,
        src: MemRef,
        bytes: u64,
        stream: Option<StreamId>,
    ) -> Result<(), BackendError> {
        self.copy_bytes(dst, src, bytes, stream)
    }
    fn write(&mut self, dst: MemRef, data: &[u8]) -> Result<(), BackendError> {
        self.write_bytes(dst, data)
    }
    fn read(&mut self, src: MemRef, out: &mut [u8]) -> Result<(), BackendError> {
        self.read_bytes(src, out)
    }

    fn create_stream(&mut self, priority: StreamPriority) -> Result<StreamId, BackendError> {
        if let Some(raw) = self.adopt_next.take() {
            return Ok(self.register_stream(raw));
        }
        self.bind()?;
        let (low, high) = self.priorities;
        let p = match priority {
            StreamPriority::Low => low,
            StreamPriority::High => high,
            StreamPriority::Normal => (low + high) / 2,
        };
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: library loaded, context current; `s` is a live local.
        check("cuStreamCreateWithPriority", unsafe {
            sys::cuStreamCreateWithPriority(
                &mut s,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                p,
            )
        })?;
        self.streams.push(Stream {
            raw: s,
            owned: true,
        });
        let id = (self.streams.len() - 1) as StreamId;
        self.by_raw.insert(s as usize, id);
        Ok(id)
    }

    fn create_event(&mut self) -> Result<EventId, BackendError> {
        self.bind()?;
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: library loaded, context current; `e` is a live local.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
        })?;
        let id = match self.free_events.pop() {
            Some(i) => {
                self.events[i as usize] = Some(e);
                i
            }
            None => {
                self.events.push(Some(e));
                (self.events.len() - 1) as u32
            }
        };
        Ok(EventId(id))
    }

    fn destroy_event(&mut self, event: EventId) -> Result<(), BackendError> {
        let e = self.event(event)?;
        self.bind()?;
        // SAFETY: a live event of this backend, forgotten below (destroyed once).
        check("cuEventDestroy", unsafe { sys::cuEventDestroy_v2(e) })?;
        self.events[event.0 as usize] = None;
        self.free_events.push(event.0);
        Ok(())
    }

    fn record_event(&mut self, event: EventId, stream: StreamId) -> Result<(), BackendError> {
        let (e, s) = (self.event(event)?, self.stream(stream)?);
        self.bind()?;
        // SAFETY: live event and stream of this backend (or a registered external
        // stream, which its owner keeps alive while it is used); context current.
        check("cuEventRecord", unsafe { sys::cuEventRecord(e, s) })
    }

    fn stream_wait_event(&mut self, stream: StreamId, event: EventId) -> Result<(), BackendError> {
        let (e, s) = (self.event(event)?, self.stream(stream)?);
        self.bind()?;
        // SAFETY: as in `record_event`.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(s, e, 0)
        })
    }

    fn query_event(&mut self, event: EventId) -> Result<bool, BackendError> {
        let e = self.event(event)?;
        self.bind()?;
        // SAFETY: a live event of this backend; context current.
        match unsafe { sys::cuEventQuery(e) } {
            OK => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => Err(driver_error("cuEventQuery", r)),
        }
    }

    fn synchronize_event(&mut self, event: EventId) -> Result<(), BackendError> {
        let e = self.event(event)?;
        self.bind()?;
        // SAFETY: a live event of this backend; context current.
        self.timed(CallKind::Sync, 0, 0, |_| {
            check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(e) })
        })
    }

    fn synchronize_stream(&mut self, stream: StreamId) -> Result<(), BackendError> {
        let s = self.stream(stream)?;
        self.bind()?;
        // SAFETY: a live (or registered external) stream; context current.
        self.timed(CallKind::Sync, 0, 0, |_| {
            check("cuStreamSynchronize", unsafe {
                sys::cuStreamSynchronize(s)
            })
        })
    }

    fn now_us(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1e6
    }

    fn stall_us(&self) -> f64 {
        self.stall_us
    }
}
