//! Growable segments of [`CudaBackend`] on CUDA virtual memory (what PyTorch calls
//! expandable segments).
//!
//! - reserve: `cuMemAddressReserve` once, for at most twice the device's memory
//!   (rounded up to the granularity): with pages released inside the range, more than
//!   the device can be spanned, never more than twice;
//! - grow: per page (the driver's granularity, `cuMemGetAllocationGranularity`, 2 MiB on
//!   an H200, or a larger page set with `set_page_size`) one `cuMemCreate` + `cuMemMap`,
//!   then one `cuMemSetAccess` over the new
//!   range. A page that fails (out of memory) unmaps and releases the pages this call
//!   created: the segment is as it was;
//! - shrink: `cuCtxSynchronize` first (work queued on any stream may still use the
//!   pages; unmapping is not ordered with it), then `cuMemUnmap` + `cuMemRelease` per
//!   page from the end;
//! - release: shrink to nothing, then `cuMemAddressFree`;
//! - page release (`unmap_pages`): `cuStreamSynchronize` of the stream that owns the
//!   pages, not `cuCtxSynchronize` (PyTorch's expandable segments wait for the
//!   segment's stream alike), then `cuMemUnmap` +
//!   `cuMemRelease` of each page of a range inside the mapped part; `map_pages` backs
//!   such pages again (`cuMemCreate` + `cuMemMap` each, one `cuMemSetAccess`). A
//!   shrink or release skips the pages released this way.
//!
//! One physical allocation per page (not per growth) so that any suffix, and any page
//! inside, can be given back; the cost is one create + map per 2 MiB (measured in
//! docs/cuda.md).

use cudarc::driver::sys;

use super::cuda::{check, driver_error, CudaBackend, Growable};
use super::cuda_stats::CallKind;
use super::{BackendError, DevicePtr, StreamId};

impl CudaBackend {
    fn prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: CUmemAllocationProp is a plain C struct for which all-zero bytes are
        // valid (null pointer, zero enums/flags: the documented defaults).
        let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = self.dev;
        p
    }

    pub(super) fn query_granularity(&self) -> Result<u64, BackendError> {
        let prop = self.prop();
        let mut g: usize = 0;
        // SAFETY: library loaded, context current (called from `new`); `prop` and `g`
        // are live locals.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        if g == 0 || !g.is_power_of_two() {
            return Err(BackendError::Invalid(format!(
                "driver granularity {g} is not a power of two"
            )));
        }
        Ok(g as u64)
    }

    fn segment(&self, base: DevicePtr) -> Result<&Growable, BackendError> {
        self.growable
            .get(&base.0)
            .ok_or_else(|| BackendError::Invalid(format!("unknown growable segment {base}")))
    }

    pub(super) fn vmm_reserve(&mut self, max_bytes: u64) -> Result<DevicePtr, BackendError> {
        let g = self.granularity;
        // Twice the device at most: with pages released inside it (`unmap_pages`), a
        // segment spans more than the memory behind it. Address space costs nothing.
        let cap = 2 * crate::backend::DeviceBackend::capacity(self).next_multiple_of(g);
        let max = max_bytes.next_multiple_of(g).min(cap);
        if max == 0 {
            return Err(BackendError::Invalid("zero-size growable segment".into()));
        }
        self.bind()?;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: library loaded, context current; `base` is a live local. Reserving
        // address space maps no memory.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut base, max as usize, g as usize, 0, 0)
        })?;
        self.growable.insert(
            base,
            Growable {
                max,
                pages: Vec::new(),
            },
        );
        Ok(DevicePtr(base))
    }

    pub(super) fn vmm_grow(
        &mut self,
        base: DevicePtr,
        mapped: u64,
        add: u64,
    ) -> Result<(), BackendError> {
        let g = self.granularity;
        let seg = self.segment(base)?;
        let have = seg.pages.len() as u64 * g;
        if have != mapped || add == 0 || !add.is_multiple_of(g) {
            return Err(BackendError::Invalid(format!(
                "grow of {base}: mapped {mapped} (backend has {have}), add {add} (granularity {g})"
            )));
        }
        if mapped + add > seg.max {
            return Err(BackendError::OutOfMemory {
                requested: add,
                available: seg.max - mapped,
            });
        }
        // SAFETY: `[base+mapped, +add)` lies inside the reserved range (checked against
        // `max` above) and nothing is mapped there (pages are mapped in order and
        // `mapped` matched the segment's page count).
        let made = unsafe { self.map_range(base.0 + mapped, add)? };
        self.growable
            .get_mut(&base.0)
            .expect("checked above")
            .pages
            .extend(made.into_iter().map(Some));
        self.used += add;
        Ok(())
    }

    /// Backs `[start, start+len)` with fresh pages ([`map_fresh`], timed as one map
    /// call): their handles, in order. Out of memory (or any failure) leaves the range
    /// as it was.
    ///
    /// # Safety
    /// `[start, start+len)` lies inside a range reserved by `vmm_reserve`, whole pages,
    /// and nothing is mapped in it.
    unsafe fn map_range(
        &mut self,
        start: u64,
        len: u64,
    ) -> Result<Vec<sys::CUmemGenericAllocationHandle>, BackendError> {
        let g = self.granularity;
        let n = (len / g) as usize;
        self.bind()?;
        let prop = self.prop();
        let ordinal = self.ordinal;
        // SAFETY: the caller's contract; the library is loaded (a backend exists) and
        // the context is current (bound above).
        let r = self.timed(CallKind::Map, len, n as u32, |_| unsafe {
            map_fresh(start, n, g, &prop, ordinal)
        });
        match r {
            Ok(made) => Ok(made),
            Err(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) => Err(self.oom(len)),
            Err(r) => Err(driver_error("cuMemCreate/cuMemMap/cuMemSetAccess", r)),
        }
    }

    pub(super) fn vmm_shrink(
        &mut self,
        base: DevicePtr,
        mapped: u64,
        release: u64,
    ) -> Result<(), BackendError> {
        let g = self.granularity;
        let seg = self.segment(base)?;
        let have = seg.pages.len() as u64 * g;
        if have != mapped || release > mapped || !release.is_multiple_of(g) {
            return Err(BackendError::Invalid(format!(
                "shrink of {base}: mapped {mapped} (backend has {have}), release {release}"
            )));
        }
        if release == 0 {
            return Ok(());
        }
        self.bind()?;
        let n = (release / g) as usize;
        let keep = seg.pages.len() - n;
        let handles: Vec<_> = seg.pages[keep..].to_vec();
        let backed = handles.iter().filter(|h| h.is_some()).count() as u64 * g;
        let from = base.0 + keep as u64 * g;
        // SAFETY: each page `[from + i*g, +g)` with a handle was mapped by `vmm_grow` or
        // `vmm_map_pages` to `handles[i]`, and is given back once (dropped from the
        // segment below).
        let r = self.timed(CallKind::Unmap, release, n as u32, |_| unsafe {
            sync_unmap_release(from, &handles, g)
        });
        // Pages are dropped from the segment only when all of them were given back; a
        // driver failure here is a broken context, reported as is.
        r.map_err(|(call, r)| driver_error(call, r))?;
        self.growable
            .get_mut(&base.0)
            .expect("checked above")
            .pages
            .truncate(keep);
        self.used -= backed;
        Ok(())
    }

    /// The first page of `[off, off+len)` of `base`, if the range passes
    /// [`super::check_page_range`] (each page backed, or each released).
    fn page_range(
        &self,
        base: DevicePtr,
        off: u64,
        len: u64,
        backed: bool,
    ) -> Result<usize, BackendError> {
        let g = self.granularity;
        let seg = self.segment(base)?;
        let mapped = seg.pages.len() as u64 * g;
        let released = |p: u64| seg.pages[(p / g) as usize].is_none();
        super::check_page_range(base, (off, len), (g, mapped), backed, released)?;
        Ok((off / g) as usize)
    }

    pub(super) fn vmm_unmap_pages(
        &mut self,
        base: DevicePtr,
        off: u64,
        len: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        let g = self.granularity;
        let first = self.page_range(base, off, len, true)?;
        let n = (len / g) as usize;
        let handles: Vec<_> = self.segment(base)?.pages[first..first + n].to_vec();
        let s = self.stream(stream)?;
        self.bind()?;
        let from = base.0 + off;
        // SAFETY: each page `[from + i*g, +g)` is mapped to `handles[i]` (checked
        // above: all backed), and is given back once (marked released below); `s` is a
        // live stream, the only one whose queued work may use the pages (the contract
        // of `unmap_pages`), and it is synchronized first.
        let r = self.timed(CallKind::Unmap, len, n as u32, |_| unsafe {
            let r = sys::cuStreamSynchronize(s);
            if r != super::cuda::OK {
                return Err(("cuStreamSynchronize", r));
            }
            unmap_release(from, &handles, g)
        });
        // As in a shrink: a driver failure part-way is a broken context, reported as is.
        r.map_err(|(call, r)| driver_error(call, r))?;
        let seg = self.growable.get_mut(&base.0).expect("checked above");
        for h in &mut seg.pages[first..first + n] {
            *h = None;
        }
        self.used -= len;
        Ok(())
    }

    pub(super) fn vmm_map_pages(
        &mut self,
        base: DevicePtr,
        off: u64,
        len: u64,
    ) -> Result<(), BackendError> {
        let g = self.granularity;
        let first = self.page_range(base, off, len, false)?;
        let n = (len / g) as usize;
        // SAFETY: `[base+off, +len)` lies inside the segment's mapped range, reserved by
        // `vmm_reserve`, and every page of it is released (checked above): nothing is
        // mapped there.
        let made = unsafe { self.map_range(base.0 + off, len)? };
        let seg = self.growable.get_mut(&base.0).expect("checked above");
        for (slot, h) in seg.pages[first..first + n].iter_mut().zip(made) {
            *slot = Some(h);
        }
        self.used += len;
        Ok(())
    }

    pub(super) fn vmm_release(&mut self, base: DevicePtr, mapped: u64) -> Result<(), BackendError> {
        self.vmm_shrink(base, mapped, mapped)?;
        let max = self.segment(base)?.max;
        self.bind()?;
        // SAFETY: the range was reserved by `vmm_reserve` with exactly `max` bytes and
        // nothing in it is mapped any more; it is forgotten below (freed once).
        check("cuMemAddressFree", unsafe {
            sys::cuMemAddressFree(base.0, max as usize)
        })?;
        self.growable.remove(&base.0);
        Ok(())
    }
}

/// Creates `n` pages of `g` bytes and maps them at `[start, start + n*g)`, then grants
/// the device read-write access to the range. On any failure every page this call
/// created is unmapped and released: nothing changed.
///
/// # Safety
/// The CUDA library is loaded and the context current; `[start, start + n*g)` lies
/// inside an address range reserved with `cuMemAddressReserve` and nothing is mapped in
/// it.
unsafe fn map_fresh(
    start: u64,
    n: usize,
    g: u64,
    prop: &sys::CUmemAllocationProp,
    ordinal: i32,
) -> Result<Vec<sys::CUmemGenericAllocationHandle>, sys::CUresult> {
    let mut made: Vec<sys::CUmemGenericAllocationHandle> = Vec::with_capacity(n);
    let undo = |made: &[sys::CUmemGenericAllocationHandle]| {
        for (i, h) in made.iter().enumerate() {
            // SAFETY: pages this call created and mapped; undone once, nothing used
            // them yet.
            unsafe {
                let _ = sys::cuMemUnmap(start + i as u64 * g, g as usize);
                let _ = sys::cuMemRelease(*h);
            }
        }
    };
    for i in 0..n {
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: the caller's contract; `h` and `prop` are live.
        let r = unsafe { sys::cuMemCreate(&mut h, g as usize, prop, 0) };
        if r != super::cuda::OK {
            undo(&made);
            return Err(r);
        }
        // SAFETY: `[start + i*g, +g)` is inside the caller's unmapped reserved range;
        // `h` is a fresh allocation of exactly `g` bytes.
        let r = unsafe { sys::cuMemMap(start + i as u64 * g, g as usize, 0, h, 0) };
        if r != super::cuda::OK {
            // SAFETY: `h` was created above and never mapped.
            unsafe {
                let _ = sys::cuMemRelease(h);
            }
            undo(&made);
            return Err(r);
        }
        made.push(h);
    }
    // SAFETY: CUmemAccessDesc is a plain C struct (all-zero is valid); the range
    // `[start, start + n*g)` was mapped just above.
    let r = unsafe {
        let mut desc: sys::CUmemAccessDesc = std::mem::zeroed();
        desc.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        desc.location.id = ordinal;
        desc.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        sys::cuMemSetAccess(start, n * g as usize, &desc, 1)
    };
    if r != super::cuda::OK {
        undo(&made);
        return Err(r);
    }
    Ok(made)
}

/// Waits for the device, then unmaps and releases each page `[from + i*g, +g)` that has a
/// handle in `handles` (a `None` is a page released before: nothing mapped there).
/// Stops at the first failing call and names it.
///
/// # Safety
/// The CUDA library is loaded and the context current; each `Some(h)` is the handle
/// mapped at its page, and no one uses these pages or handles afterwards.
unsafe fn sync_unmap_release(
    from: u64,
    handles: &[Option<sys::CUmemGenericAllocationHandle>],
    g: u64,
) -> Result<(), (&'static str, sys::CUresult)> {
    // SAFETY: the caller's contract. The synchronization makes sure no queued work
    // still reads or writes the pages (unmapping is not ordered with it).
    unsafe {
        let r = sys::cuCtxSynchronize();
        if r != super::cuda::OK {
            return Err(("cuCtxSynchronize", r));
        }
        unmap_release(from, handles, g)
    }
}

/// `cuMemUnmap` + `cuMemRelease` of each page of `handles` (at `from`, `g` bytes
/// each) that has one. Stops at the first failing call and names it.
///
/// # Safety
/// As [`sync_unmap_release`], and no queued work uses the pages (the caller waited).
unsafe fn unmap_release(
    from: u64,
    handles: &[Option<sys::CUmemGenericAllocationHandle>],
    g: u64,
) -> Result<(), (&'static str, sys::CUresult)> {
    // SAFETY: the caller's contract.
    unsafe {
        for (i, h) in handles.iter().enumerate() {
            let Some(h) = h else { continue };
            let r = sys::cuMemUnmap(from + i as u64 * g, g as usize);
            if r != super::cuda::OK {
                return Err(("cuMemUnmap", r));
            }
            let r = sys::cuMemRelease(*h);
            if r != super::cuda::OK {
                return Err(("cuMemRelease", r));
            }
        }
    }
    Ok(())
}
