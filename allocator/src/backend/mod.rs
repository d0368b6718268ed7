//! Device backends: where memory comes from.
//!
//! [`DeviceBackend`] is the one trait every allocator policy in this crate runs on, in
//! the spirit of RMM's `device_memory_resource`: it hands out device segments, moves
//! bytes between device and host buffers, and orders work with streams and events.
//! Everything above it (the buddy pools, the PyTorch emulation, the tiers)
//! talks only to this trait, so a backend is swapped without touching them.
//!
//! Backends:
//! - [`host::HostBackend`]: "device" memory is real host memory; copies move real
//!   bytes, so tests can write and verify data. Work runs synchronously: every event is
//!   complete as soon as it is recorded.
//! - [`sim::SimBackend`]: no memory at all, any capacity (a 141 GB H200 replays on a
//!   laptop); every call advances a simulated clock by the H200 costs measured in
//!   measured on an NVIDIA H200 (docs/allocator.md, docs/tiers.md, docs/cuda.md), and streams have timelines so that asynchronous
//!   copies overlap compute.
//! - [`cuda::CudaBackend`]: an NVIDIA GPU through the CUDA driver API (cudarc, loaded
//!   at run time; `BackendError::NoDriver` where there is no driver). See docs/cuda.md.
//!
//! Adaptors that add one behaviour each and compose over any backend (RMM's layering):
//! [`layers::Counting`] (call counts and bytes), [`layers::Limit`] (a byte budget),
//! [`layers::FailOnDemand`] (fault injection for tests).
//!
//! Two kinds of device segment:
//! - fixed: [`DeviceBackend::allocate`] / [`DeviceBackend::deallocate`] (`cudaMalloc`);
//! - growable: a virtual range reserved once ([`DeviceBackend::reserve_growable`]) whose
//!   prefix is mapped to physical memory on demand ([`DeviceBackend::grow`]) and given
//!   back from the end ([`DeviceBackend::shrink`]): CUDA's `cuMemAddressReserve` +
//!   `cuMemCreate`/`cuMemMap`, what PyTorch calls expandable segments. The mapped size
//!   is always a multiple of [`DeviceBackend::granularity`]. A backend that cannot do
//!   this returns `false` from [`DeviceBackend::supports_growable`].

pub mod cuda;
mod cuda_host;
mod cuda_kernels;
pub mod cuda_stats;
mod cuda_vmm;
pub mod host;
pub mod layers;
pub mod sim;

use serde::{Deserialize, Serialize};

/// A device address. Opaque to the allocator except for arithmetic inside a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0 + bytes)
    }
}

impl std::fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A host buffer handed out by [`DeviceBackend::allocate_host`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HostPtr(pub u64);

/// A stream: an ordered queue of device work. `0` is the default stream, which always
/// exists; others come from [`DeviceBackend::create_stream`].
pub type StreamId = u32;

/// An event: a marker recorded on a stream, complete when the work before it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EventId(pub u32);

/// Stream priority (CUDA: lower number = higher priority). Transfers of the tiering
/// layer run on `Low` streams so that they never delay compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum StreamPriority {
    #[default]
    Normal,
    Low,
    High,
}

/// One end of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemRef {
    Device(DevicePtr),
    Host(HostPtr),
}

/// Which link a copy uses; the sim's cost model has one bandwidth per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CopyKind {
    HostToDevicePinned,
    DeviceToHostPinned,
    HostToDevicePageable,
    DeviceToHostPageable,
    DeviceToDevice,
    HostToHost,
}

/// Errors from a backend. `OutOfMemory` is the one the allocator recovers from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    #[error("device out of memory ({requested} bytes requested, {available} available)")]
    OutOfMemory { requested: u64, available: u64 },
    /// A host buffer (pinned or pageable) could not be allocated. Not an out-of-memory
    /// of the device: releasing device caches does not help it.
    #[error("host out of memory ({requested} bytes requested)")]
    HostOutOfMemory { requested: u64 },
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("not supported by the {0} backend")]
    Unsupported(&'static str),
    #[error("injected failure: {0}")]
    Injected(String),
    /// The CUDA driver library could not be loaded (no GPU driver on this machine).
    #[error("no CUDA driver found")]
    NoDriver,
    /// A CUDA driver call failed (other than out of memory).
    #[error("{call} failed: {message} (CUDA error {code})")]
    Driver {
        call: &'static str,
        code: u32,
        message: String,
    },
}

impl BackendError {
    pub fn is_oom(&self) -> bool {
        matches!(self, BackendError::OutOfMemory { .. })
    }
}

/// The contract of [`DeviceBackend::unmap_pages`] / [`DeviceBackend::map_pages`], for
/// the backends to share: `[off, off+len)` is whole pages of `g` bytes inside the mapped
/// range `[0, mapped)` of the segment at `base`, each backed (`backed`) or each
/// released (`released(page offset)` says which).
pub(crate) fn check_page_range(
    base: DevicePtr,
    (off, len): (u64, u64),
    (g, mapped): (u64, u64),
    backed: bool,
    released: impl Fn(u64) -> bool,
) -> Result<(), BackendError> {
    let ok = len > 0
        && off.is_multiple_of(g)
        && len.is_multiple_of(g)
        && off.checked_add(len).is_some_and(|e| e <= mapped)
        && (off..off + len)
            .step_by(g as usize)
            .all(|p| released(p) != backed);
    if ok {
        Ok(())
    } else {
        Err(BackendError::Invalid(format!(
            "pages [{off}, +{len}) of {base} (mapped {mapped}) are not all {}",
            if backed { "backed" } else { "released" }
        )))
    }
}

/// Where device memory comes from, how bytes move, and how work is ordered.
///
/// Contract for implementors:
/// - `allocate` returns a pointer aligned to at least 256 bytes (CUDA gives 256; the
///   buddy core relies on it); `deallocate` gets back exactly the pointer and size.
/// - growable segments: `reserve_growable(max)` reserves `max` bytes of address space
///   and maps nothing; `grow(base, mapped, add)` maps `[base+mapped, base+mapped+add)`
///   (`add` a multiple of `granularity()`), `shrink(base, mapped, release)` unmaps
///   the last `release` bytes, `release_growable` unmaps everything and frees the range;
///   where `supports_page_release`, `unmap_pages` / `map_pages` release and back pages
///   inside the mapped range, and `shrink` / `release_growable` then give back only the
///   pages of their range that are backed (`used` falls by those).
/// - the copy functions with a stream are asynchronous: the copy is ordered after the
///   work already queued on that stream and is complete when an event recorded after
///   it is. Callers must not free or reuse either buffer before then.
/// - `now_us` is the backend's clock: wall time on real devices, simulated time on
///   `sim`; `advance_us` tells a simulated device that the host spent time computing
///   (a no-op elsewhere).
///
/// Every method takes `&mut self`: a backend is owned by one allocator, which provides
/// the locking (see `SharedAllocator`).
pub trait DeviceBackend: Send {
    /// Short name (`host`, `sim`, `cuda`).
    fn name(&self) -> &'static str;
    /// Total device memory in bytes.
    fn capacity(&self) -> u64;
    /// Bytes currently obtained from the device (fixed segments + mapped growable bytes).
    fn used(&self) -> u64;
    /// Physical allocation granularity (2 MiB on NVIDIA GPUs).
    fn granularity(&self) -> u64 {
        2 << 20
    }

    // ----- fixed segments -----
    fn allocate(&mut self, bytes: u64, stream: StreamId) -> Result<DevicePtr, BackendError>;
    fn deallocate(
        &mut self,
        ptr: DevicePtr,
        bytes: u64,
        stream: StreamId,
    ) -> Result<(), BackendError>;

    // ----- growable (virtually contiguous) segments -----
    fn supports_growable(&self) -> bool {
        false
    }
    fn reserve_growable(&mut self, _max_bytes: u64) -> Result<DevicePtr, BackendError> {
        Err(BackendError::Unsupported(self.name()))
    }
    fn grow(&mut self, _base: DevicePtr, _mapped: u64, _add: u64) -> Result<(), BackendError> {
        Err(BackendError::Unsupported(self.name()))
    }
    fn shrink(
        &mut self,
        _base: DevicePtr,
        _mapped: u64,
        _release: u64,
    ) -> Result<(), BackendError> {
        Err(BackendError::Unsupported(self.name()))
    }
    fn release_growable(&mut self, _base: DevicePtr, _mapped: u64) -> Result<(), BackendError> {
        Err(BackendError::Unsupported(self.name()))
    }
    /// Whether pages inside a growable segment's mapped range can be unmapped and
    /// mapped again one by one ([`DeviceBackend::unmap_pages`]).
    fn supports_page_release(&self) -> bool {
        false
    }
    /// Gives back the physical memory of `[base+off, base+off+len)`, pages of
    /// `granularity()` inside the mapped range, all of them backed: afterwards the range
    /// has no memory behind it (an access to it is an error) and `used` is `len` lower.
    /// Unmapping is not ordered with queued work, so it first waits for `stream`, the
    /// one stream whose queued work may still use the pages, and not for the whole
    /// device (PyTorch's expandable segments wait for the segment's stream alike): a
    /// free block of a stream's pool can be in use only by work queued on that stream,
    /// because the allocator holds a block used on other streams back until events
    /// recorded on them complete.
    fn unmap_pages(
        &mut self,
        _base: DevicePtr,
        _off: u64,
        _len: u64,
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        Err(BackendError::Unsupported(self.name()))
    }
    /// Backs `[base+off, base+off+len)` again (pages inside the mapped range that
    /// `unmap_pages` released): `used` is `len` higher; out of memory leaves every page
    /// as it was.
    fn map_pages(&mut self, _base: DevicePtr, _off: u64, _len: u64) -> Result<(), BackendError> {
        Err(BackendError::Unsupported(self.name()))
    }

    // ----- host buffers -----
    /// A host buffer; `pinned` = page-locked (fast DMA, very costly to create: pool it).
    fn allocate_host(&mut self, bytes: u64, pinned: bool) -> Result<HostPtr, BackendError>;
    fn deallocate_host(&mut self, ptr: HostPtr, bytes: u64) -> Result<(), BackendError>;

    // ----- data movement -----
    /// Copies `bytes` from `src` to `dst`. With `stream: None` the copy is synchronous
    /// (complete on return); with a stream it is queued on it, except that a copy to or
    /// from pageable host memory blocks the host until it is done, after the work queued
    /// before it on the stream (the CUDA driver's rule; the sim models the same).
    fn copy(
        &mut self,
        dst: MemRef,
        src: MemRef,
        bytes: u64,
        stream: Option<StreamId>,
    ) -> Result<(), BackendError>;
    /// Writes host bytes into memory (tests, staging). Synchronous.
    fn write(&mut self, dst: MemRef, data: &[u8]) -> Result<(), BackendError>;
    /// Reads memory into a host slice. Synchronous.
    fn read(&mut self, src: MemRef, out: &mut [u8]) -> Result<(), BackendError>;

    // ----- streams and events -----
    fn create_stream(&mut self, priority: StreamPriority) -> Result<StreamId, BackendError>;
    fn create_event(&mut self) -> Result<EventId, BackendError>;
    fn destroy_event(&mut self, event: EventId) -> Result<(), BackendError>;
    /// Marks the current end of `stream`'s queue.
    fn record_event(&mut self, event: EventId, stream: StreamId) -> Result<(), BackendError>;
    /// Future work on `stream` waits for `event` (no host blocking).
    fn stream_wait_event(&mut self, stream: StreamId, event: EventId) -> Result<(), BackendError>;
    /// Whether the work before `event` is complete (non-blocking).
    fn query_event(&mut self, event: EventId) -> Result<bool, BackendError>;
    /// Blocks the host until `event` is complete.
    fn synchronize_event(&mut self, event: EventId) -> Result<(), BackendError>;
    /// Blocks the host until everything queued on `stream` is complete.
    fn synchronize_stream(&mut self, stream: StreamId) -> Result<(), BackendError>;

    // ----- time -----
    /// The backend's clock in microseconds.
    fn now_us(&self) -> f64;
    /// The host computed for `us` microseconds (simulated devices advance their clock).
    fn advance_us(&mut self, _us: f64) {}
    /// Total time the host spent blocked in backend calls (device mallocs, frees,
    /// synchronizations), in microseconds: the allocator's stall.
    fn stall_us(&self) -> f64 {
        0.0
    }
}

/// Forwards every method of [`DeviceBackend`] except `name`, `capacity`, `used` and
/// `granularity`: `&mut self` methods to the `mut:` expression, `&self` ones to the
/// `ref:` expression (`forward_backend!(self => mut: (View(self)); ref: (self.inner))`). Adaptors implement
/// the few methods they change by hand and forward the rest with this.
#[macro_export]
macro_rules! forward_backend {
    ($s:tt => mut: ($($inner:tt)+); ref: ($($rinner:tt)+)) => {
        fn allocate(&mut $s, bytes: u64, stream: $crate::backend::StreamId)
            -> Result<$crate::backend::DevicePtr, $crate::backend::BackendError> {
            ($($inner)+).allocate(bytes, stream)
        }
        fn deallocate(&mut $s, ptr: $crate::backend::DevicePtr, bytes: u64, stream: $crate::backend::StreamId)
            -> Result<(), $crate::backend::BackendError> {
            ($($inner)+).deallocate(ptr, bytes, stream)
        }
        fn supports_growable(&$s) -> bool { ($($rinner)+).supports_growable() }
        fn reserve_growable(&mut $s, max_bytes: u64)
            -> Result<$crate::backend::DevicePtr, $crate::backend::BackendError> {
            ($($inner)+).reserve_growable(max_bytes)
        }
        fn grow(&mut $s, base: $crate::backend::DevicePtr, mapped: u64, add: u64)
            -> Result<(), $crate::backend::BackendError> {
            ($($inner)+).grow(base, mapped, add)
        }
        fn shrink(&mut $s, base: $crate::backend::DevicePtr, mapped: u64, release: u64)
            -> Result<(), $crate::backend::BackendError> {
            ($($inner)+).shrink(base, mapped, release)
        }
        fn release_growable(&mut $s, base: $crate::backend::DevicePtr, mapped: u64)
            -> Result<(), $crate::backend::BackendError> {
            ($($inner)+).release_growable(base, mapped)
        }
        fn supports_page_release(&$s) -> bool { ($($rinner)+).supports_page_release() }
        fn unmap_pages(&mut $s, base: $crate::backend::DevicePtr, off: u64, len: u64,
            stream: $crate::backend::StreamId) -> Result<(), $crate::backend::BackendError> {
            ($($inner)+).unmap_pages(base, off, len, stream)
        }
        fn map_pages(&mut $s, base: $crate::backend::DevicePtr, off: u64, len: u64)
            -> Result<(), $crate::backend::BackendError> {
            ($($inner)+).map_pages(base, off, len)
        }
        fn allocate_host(&mut $s, bytes: u64, pinned: bool)
            -> Result<$crate::backend::HostPtr, $crate::backend::BackendError> {
            ($($inner)+).allocate_host(bytes, pinned)
        }
        fn deallocate_host(&mut $s, ptr: $crate::backend::HostPtr, bytes: u64)
            -> Result<(), $crate::backend::BackendError> {
            ($($inner)+).deallocate_host(ptr, bytes)
        }
        fn copy(&mut $s, dst: $crate::backend::MemRef, src: $crate::backend::MemRef, bytes: u64,
            stream: Option<$crate::backend::StreamId>) -> Result<(), $crate::backend::BackendError> {
            ($($inner)+).copy(dst, src, bytes, stream)
        }
        fn write(&mut $s, dst: $crate::backend::MemRef, data: &[u8])
            -> Result<(), $crate::backend::BackendError> {
            ($($inner)+).write(dst, data)
        }
        fn read(&mut $s, src: $crate::backend::MemRef, out: &mut [u8])
            -> Result<(), $crate::backend::BackendError> {
            ($($inner)+).read(src, out)
        }
        fn create_stream(&mut $s, priority: $crate::backend::StreamPriority)
            -> Result<$crate::backend::StreamId, $crate::backend::BackendError> {
            ($($inner)+).create_stream(priority)
        }
        fn create_event(&mut $s) -> Result<$crate::backend::EventId, $crate::backend::BackendError> {
            ($($inner)+).create_event()
        }
        fn destroy_event(&mut $s, event: $crate::backend::EventId)
            -> Result<(), $crate::backend::BackendError> {
            ($($inner)+).destroy_event(event)
        }
        fn record_event(&mut $s, event: $crate::backend::EventId, stream: $crate::backend::StreamId)
            -> Result<(), $crate::backend::BackendError> {
            ($($inner)+).record_event(event, stream)
        }
        fn stream_wait_event(&mut $s, stream: $crate::backend::StreamId, event: $crate::backend::EventId)
            -> Result<(), $crate::backend::BackendError> {
            ($($inner)+).stream_wait_event(stream, event)
        }
        fn query_event(&mut $s, event: $crate::backend::EventId)
            -> Result<bool, $crate::backend::BackendError> {
            ($($inner)+).query_event(event)
        }
        fn synchronize_event(&mut $s, event: $crate::backend::EventId)
            -> Result<(), $crate::backend::BackendError> {
            ($($inner)+).synchronize_event(event)
        }
        fn synchronize_stream(&mut $s, stream: $crate::backend::StreamId)
            -> Result<(), $crate::backend::BackendError> {
            ($($inner)+).synchronize_stream(stream)
        }
        fn now_us(&$s) -> f64 { ($($rinner)+).now_us() }
        fn advance_us(&mut $s, us: f64) { ($($inner)+).advance_us(us) }
        fn stall_us(&$s) -> f64 { ($($rinner)+).stall_us() }
    };
    ($s:tt => mut: $($inner:tt)+) => { $crate::forward_backend!($s => mut: ($($inner)+); ref: ($($inner)+)); };
}
pub use forward_backend;

impl<B: DeviceBackend + ?Sized> DeviceBackend for Box<B> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn capacity(&self) -> u64 {
        (**self).capacity()
    }
    fn used(&self) -> u64 {
        (**self).used()
    }
    fn granularity(&self) -> u64 {
        (**self).granularity()
    }
    forward_backend!(self => mut: **self);
}
