//! The host side of `memcast_torch.offload`: per device, one pinned host pool (memcast's
//! warm tier, [`StagingPool`]: one `cuMemHostAlloc` at creation, then first-fit 4 KiB
//! ranges with coalescing) and memcast's low-priority transfer streams
//! (`cuStreamCreateWithPriority`, lowest priority, non-blocking).
//!
//! The pool has its own [`CudaBackend`] on the device's primary context (the one
//! PyTorch uses), independent of the allocator of `install()`: offloading works with
//! PyTorch's native allocator for device memory (and its memory cap) too.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use memcast_alloc::backend::cuda::CudaBackend;
use memcast_alloc::backend::{DeviceBackend, StreamPriority};
use memcast_alloc::tier::staging::{HostLoc, StagingPool};
use memcast_alloc::AllocError;

use crate::state::{TorchError, MAX_DEVICES};

pub struct HostPool {
    backend: CudaBackend,
    pool: StagingPool,
    /// Base address of each range handed out -> its length (rounded to 4 KiB).
    ranges: HashMap<u64, u64>,
    used: u64,
    peak_used: u64,
    allocs: u64,
    full: u64,
    streams: Vec<usize>,
}

static POOLS: [Mutex<Option<HostPool>>; MAX_DEVICES] = [const { Mutex::new(None) }; MAX_DEVICES];

fn slot(device: i32) -> Result<MutexGuard<'static, Option<HostPool>>, TorchError> {
    let m = usize::try_from(device)
        .ok()
        .and_then(|d| POOLS.get(d))
        .ok_or(TorchError::BadDevice(device))?;
    Ok(m.lock().unwrap_or_else(|e| e.into_inner()))
}

fn backend_err(e: memcast_alloc::backend::BackendError) -> TorchError {
    TorchError::Alloc(AllocError::from(e))
}

fn no_pool(device: i32) -> TorchError {
    TorchError::Invalid(format!(
        "no pinned host pool on device {device} (memcast_host_pool_create first)"
    ))
}

/// Creates the device's pool of `bytes` pinned bytes. An existing pool with no range in
/// use is replaced; one with ranges in use is an error.
pub fn create(device: i32, bytes: u64) -> Result<(), TorchError> {
    if bytes == 0 {
        return Err(TorchError::Invalid("a pinned host pool of 0 bytes".into()));
    }
    let mut g = slot(device)?;
    if let Some(p) = g.as_mut() {
        if !p.ranges.is_empty() {
            return Err(TorchError::Invalid(format!(
                "the pinned host pool of device {device} has {} ranges in use",
                p.ranges.len()
            )));
        }
        let mut old = g.take().expect("checked above");
        old.pool.destroy(&mut old.backend).map_err(backend_err)?;
    }
    let mut backend = CudaBackend::new(device).map_err(backend_err)?;
    let pool = StagingPool::new(&mut backend, bytes).map_err(backend_err)?;
    *g = Some(HostPool {
        backend,
        pool,
        ranges: HashMap::new(),
        used: 0,
        peak_used: 0,
        allocs: 0,
        full: 0,
        streams: Vec::new(),
    });
    Ok(())
}

/// A range of at least `bytes`: its address, or `None` when the pool has no free range
/// that large.
pub fn alloc(device: i32, bytes: u64) -> Result<Option<u64>, TorchError> {
    let mut g = slot(device)?;
    let p = g.as_mut().ok_or_else(|| no_pool(device))?;
    // One range: the caller gets one address.
    match p.pool.alloc(bytes, false) {
        Some(HostLoc::Warm { ptr, len, .. }) => {
            p.ranges.insert(ptr.0, len);
            p.used += len;
            p.peak_used = p.peak_used.max(p.used);
            p.allocs += 1;
            Ok(Some(ptr.0))
        }
        Some(HostLoc::Cold { .. }) => Err(TorchError::Invalid(
            "the staging pool returned a pageable range".into(),
        )),
        None => {
            p.full += 1;
            Ok(None)
        }
    }
}

/// Gives back a range from [`alloc`] (by its address).
pub fn release(device: i32, ptr: u64) -> Result<(), TorchError> {
    let mut g = slot(device)?;
    let p = g.as_mut().ok_or_else(|| no_pool(device))?;
    let len = p.ranges.remove(&ptr).ok_or_else(|| {
        TorchError::Invalid(format!(
            "{ptr:#x} is not a range of device {device}'s pinned host pool"
        ))
    })?;
    p.pool
        .release(HostLoc::warm(memcast_alloc::backend::HostPtr(ptr), len));
    p.used -= len;
    Ok(())
}

/// A new low-priority, non-blocking transfer stream on the device (a `cudaStream_t`,
/// owned by the pool's backend and destroyed with it).
pub fn transfer_stream(device: i32) -> Result<usize, TorchError> {
    let mut g = slot(device)?;
    let p = g.as_mut().ok_or_else(|| no_pool(device))?;
    let s = p
        .backend
        .create_stream(StreamPriority::Low)
        .map_err(backend_err)?;
    let raw = p.backend.raw_stream(s).map_err(backend_err)?;
    p.streams.push(raw);
    Ok(raw)
}

/// The pool's figures as JSON.
pub fn stats_json(device: i32) -> Result<String, TorchError> {
    let g = slot(device)?;
    let p = g.as_ref().ok_or_else(|| no_pool(device))?;
    let (low, high) = p.backend.priority_range();
    Ok(serde_json::json!({
        "size": p.pool.size(),
        "free": p.pool.free_bytes(),
        "used": p.used,
        "peak_used": p.peak_used,
        "ranges": p.ranges.len(),
        "allocs": p.allocs,
        "full": p.full,
        "streams": p.streams.len(),
        "stream_priority": low,
        "priority_range": [low, high],
    })
    .to_string())
}

/// Frees the pinned buffer (and the pool's streams). Ranges still in use: an error.
pub fn destroy(device: i32) -> Result<(), TorchError> {
    let mut g = slot(device)?;
    let Some(p) = g.as_mut() else {
        return Ok(());
    };
    if !p.ranges.is_empty() {
        return Err(TorchError::Invalid(format!(
            "the pinned host pool of device {device} has {} ranges in use",
            p.ranges.len()
        )));
    }
    let mut old = g.take().expect("checked above");
    old.pool.destroy(&mut old.backend).map_err(backend_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver the pool is a clear error; with one, ranges are handed out,
    /// the pool runs full, and released ranges are reused.
    #[test]
    fn host_pool_hands_out_and_reuses_ranges() {
        const DEV: i32 = 0; // no other test uses the host pool
        if let Err(e) = create(DEV, 1 << 20) {
            let t = e.to_string();
            assert!(
                t.contains("no CUDA driver found") || t.contains("device"),
                "{t}"
            );
            assert!(alloc(DEV, 4096)
                .unwrap_err()
                .to_string()
                .contains("no pinned"));
            eprintln!("skipped: {t}");
            return;
        }
        let a = alloc(DEV, 600 << 10).unwrap().expect("room");
        assert!(alloc(DEV, 600 << 10).unwrap().is_none(), "the pool is full");
        let b = alloc(DEV, 100 << 10).unwrap().expect("room");
        assert_ne!(a, b);
        assert!(destroy(DEV).is_err(), "ranges in use");
        release(DEV, a).unwrap();
        assert!(release(DEV, a).is_err(), "released twice");
        assert_eq!(
            alloc(DEV, 600 << 10).unwrap(),
            Some(a),
            "first fit reuses it"
        );
        let s = transfer_stream(DEV).unwrap();
        assert_ne!(s, 0);
        let j: serde_json::Value = serde_json::from_str(&stats_json(DEV).unwrap()).unwrap();
        assert_eq!(j["ranges"], 2);
        assert_eq!(j["full"], 1);
        release(DEV, a).unwrap();
        release(DEV, b).unwrap();
        destroy(DEV).unwrap();
    }
}
