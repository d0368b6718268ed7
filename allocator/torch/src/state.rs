//! The library's global state: one [`SharedAllocator`] per device, created on the
//! device's first allocation, plus the bookkeeping around it (live pointers for the
//! recorder, step count, errors).
//!
//! Locks: a device's allocator (its `SharedAllocator`) and its `Book` are separate
//! mutexes, never held together. An allocation takes the allocator, then records in
//! the book; a free records in the book first, then frees: so a pointer is out of the
//! book before another thread can get it again.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use memcast_alloc::backend::cuda::CudaBackend;
use memcast_alloc::backend::{DeviceBackend, DevicePtr, StreamId, StreamPriority};
use memcast_alloc::{AllocConfig, AllocError, Allocator, SharedAllocator};

use crate::record::{Live, Recorder};

/// Devices a process can use through the library.
pub const MAX_DEVICES: usize = 64;

/// Errors of the library (their text is what `memcast_last_error` returns).
#[derive(Debug, thiserror::Error)]
pub enum TorchError {
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error("device {0} is outside 0..{MAX_DEVICES}")]
    BadDevice(i32),
    #[error("memcast is not initialized on device {0} (no allocation yet)")]
    NotInitialized(i32),
    #[error("too late to configure: memcast already allocated on a device (configure before the first CUDA allocation)")]
    TooLate,
    #[error("{0}")]
    Invalid(String),
    #[error("trace: {0}")]
    Trace(#[from] memcast_trace::TraceError),
}

/// Bookkeeping of one device beside its allocator.
#[derive(Debug, Default)]
pub struct Book {
    pub live: Live,
    pub next_id: u64,
    pub rec: Option<Recorder>,
    pub steps: u64,
    pub failed_allocs: u64,
    pub failed_frees: u64,
    // Invariant: live_bytes = the sum of the requested sizes in `live`.
    /// Requested bytes live now, their peak since the last step, and that peak over the
    /// last completed step (what the next step is forecast to need if it repeats the
    /// last: `memcast_torch.distributed.exchange` shares it).
    pub live_bytes: u64,
    pub step_peak: u64,
    pub last_step_peak: u64,
}

pub struct Device {
    pub ordinal: i32,
    pub alloc: SharedAllocator<CudaBackend>,
    book: Mutex<Book>,
    /// Time the calling threads spent in `malloc` and `free` (nanoseconds, from entry
    /// to return, locks included) and the calls: the allocator's cost on the thread
    /// that launches the work (two `Instant::now()` and two relaxed adds per call;
    /// not measured apart: a whole best-fit call, timing included, took 0.40-0.53 us
    /// on the H200).
    host: HostTime,
}

/// Calls and the nanoseconds spent in them, per entry point.
#[derive(Debug, Default)]
struct HostTime {
    malloc_ns: AtomicU64,
    mallocs: AtomicU64,
    free_ns: AtomicU64,
    frees: AtomicU64,
}

impl HostTime {
    fn add(&self, ns: &AtomicU64, calls: &AtomicU64, since: Instant) {
        let t = since.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        ns.fetch_add(t, Relaxed);
        calls.fetch_add(1, Relaxed);
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "malloc_ns": self.malloc_ns.load(Relaxed),
            "mallocs": self.mallocs.load(Relaxed),
            "free_ns": self.free_ns.load(Relaxed),
            "frees": self.frees.load(Relaxed),
        })
    }
}

static DEVICES: [OnceLock<Device>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];
/// The configuration strings given before the first allocation, in order (each over
/// MEMCAST_ALLOC_CONF and the ones before: a later one may set a key again).
static CONF: Mutex<Vec<String>> = Mutex::new(Vec::new());
static INIT: Mutex<()> = Mutex::new(());
static LAST_ERROR: Mutex<String> = Mutex::new(String::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn set_last_error(e: &str) {
    *lock(&LAST_ERROR) = e.to_string();
}

pub fn last_error() -> String {
    lock(&LAST_ERROR).clone()
}

fn slot(device: i32) -> Result<&'static OnceLock<Device>, TorchError> {
    usize::try_from(device)
        .ok()
        .and_then(|d| DEVICES.get(d))
        .ok_or(TorchError::BadDevice(device))
}

/// Whether any device has an allocator (configuration is frozen then).
pub fn started() -> bool {
    DEVICES.iter().any(|d| d.get().is_some())
}

/// The configuration the next device gets: defaults, MEMCAST_ALLOC_CONF, then the
/// string given to `configure`.
pub fn config() -> Result<AllocConfig, TorchError> {
    configured(&lock(&CONF))
}

/// Defaults, MEMCAST_ALLOC_CONF, then each of `confs` in turn.
fn configured(confs: &[String]) -> Result<AllocConfig, TorchError> {
    let mut c = AllocConfig::from_env()?;
    for s in confs {
        c = c.with_conf_string(s)?;
    }
    Ok(c)
}

/// Sets the configuration string (checked now), before any allocation.
pub fn configure(conf: &str) -> Result<(), TorchError> {
    let _g = lock(&INIT);
    if started() {
        return Err(TorchError::TooLate);
    }
    let mut confs = lock(&CONF).clone();
    confs.push(conf.to_string());
    configured(&confs)?;
    *lock(&CONF) = confs;
    Ok(())
}

/// The device's allocator, created on first use.
pub fn device(device: i32) -> Result<&'static Device, TorchError> {
    let s = slot(device)?;
    if let Some(d) = s.get() {
        return Ok(d);
    }
    let _g = lock(&INIT);
    if let Some(d) = s.get() {
        return Ok(d);
    }
    crate::log::init();
    let cfg = config()?;
    let mut b = CudaBackend::new(device).map_err(AllocError::from)?;
    // Pages of growable segments: the configured segment granule (2 MiB by default).
    b.set_page_size(cfg.segment_granule.max(b.driver_granularity()))
        .map_err(AllocError::from)?;
    let a = Allocator::new(b, cfg)?;
    let _ = s.set(Device {
        ordinal: device,
        alloc: SharedAllocator::new(a),
        book: Mutex::new(Book::default()),
        host: HostTime::default(),
    });
    s.get()
        .ok_or_else(|| TorchError::Invalid("device initialization raced".into()))
}

/// The device's allocator if it exists.
pub fn existing(device: i32) -> Result<&'static Device, TorchError> {
    slot(device)?
        .get()
        .ok_or(TorchError::NotInitialized(device))
}

/// Every initialized device.
pub fn all() -> impl Iterator<Item = &'static Device> {
    DEVICES.iter().filter_map(|d| d.get())
}

/// The allocator's id of a raw `cudaStream_t` (registered on first sight).
fn stream_id(a: &mut Allocator<CudaBackend>, raw: usize) -> Result<StreamId, AllocError> {
    if let Some(s) = a.backend().stream_of_raw(raw) {
        return Ok(s);
    }
    a.backend_mut().adopt_stream(raw);
    a.create_stream(StreamPriority::Normal)
}

impl Device {
    pub fn book(&self) -> MutexGuard<'_, Book> {
        lock(&self.book)
    }

    pub fn malloc(&self, size: u64, raw_stream: usize) -> Result<u64, TorchError> {
        let t = Instant::now();
        let r = self.malloc_timed(size, raw_stream);
        self.host.add(&self.host.malloc_ns, &self.host.mallocs, t);
        r
    }

    fn malloc_timed(&self, size: u64, raw_stream: usize) -> Result<u64, TorchError> {
        // PyTorch may ask for 0 bytes: a 1-byte block gives it a unique valid pointer.
        let bytes = size.max(1);
        let (ptr, stream) = {
            let mut a = self.alloc.lock();
            let s = stream_id(&mut a, raw_stream)?;
            let r = a.allocate(bytes, s);
            match r {
                Ok(x) => (x.ptr.0, s),
                Err(e) => {
                    drop(a);
                    self.book().failed_allocs += 1;
                    return Err(e.into());
                }
            }
        };
        let mut b = self.book();
        let id = b.next_id;
        b.next_id += 1;
        b.live.insert(ptr, (size, stream, id));
        b.live_bytes += size;
        b.step_peak = b.step_peak.max(b.live_bytes);
        if let Some(r) = b.rec.as_mut() {
            r.alloc(id, size, stream);
        }
        Ok(ptr)
    }

    pub fn free(&self, ptr: u64, raw_stream: usize) -> Result<(), TorchError> {
        let t = Instant::now();
        let r = self.free_timed(ptr, raw_stream);
        self.host.add(&self.host.free_ns, &self.host.frees, t);
        r
    }

    fn free_timed(&self, ptr: u64, raw_stream: usize) -> Result<(), TorchError> {
        {
            let mut b = self.book();
            if let Some((bytes, _, id)) = b.live.remove(&ptr) {
                b.live_bytes -= bytes;
                if let Some(r) = b.rec.as_mut() {
                    r.free(id);
                }
            }
        }
        let mut a = self.alloc.lock();
        let r = (|| -> Result<(), AllocError> {
            let s = stream_id(&mut a, raw_stream)?;
            match a.deallocate_ptr(DevicePtr(ptr), s) {
                Ok(_) => Ok(()),
                // Freed on another stream than its own: that stream used it; free it on
                // its own stream once that use is complete.
                Err(AllocError::WrongStream { owner, .. }) => {
                    let x = a.lookup(DevicePtr(ptr))?;
                    a.record_stream(&x, s)?;
                    a.deallocate(x, owner)
                }
                Err(e) => Err(e),
            }
        })();
        drop(a);
        if r.is_err() {
            self.book().failed_frees += 1;
        }
        Ok(r?)
    }

    pub fn empty_cache(&self) -> Result<u64, TorchError> {
        Ok(self.alloc.empty_cache()?)
    }

    /// An iteration boundary: the allocator's (predictive mode's forecaster restarts
    /// its steps there; a no-op in reactive mode), counted, recorded when recording.
    pub fn step(&self) -> Result<(), TorchError> {
        self.alloc.lock().iteration_boundary();
        let mut b = self.book();
        b.steps += 1;
        b.last_step_peak = b.step_peak;
        b.step_peak = b.live_bytes;
        if let Some(r) = b.rec.as_mut() {
            r.boundary();
        }
        Ok(())
    }

    pub fn record_start(&self) -> Result<(), TorchError> {
        let mut b = self.book();
        if b.rec.is_some() {
            return Err(TorchError::Invalid("already recording".into()));
        }
        b.rec = Some(Recorder::start(&b.live));
        Ok(())
    }

    /// Ends the recording and writes it to `path`; returns the number of events.
    pub fn record_stop(&self, path: &Path) -> Result<usize, TorchError> {
        let rec = self
            .book()
            .rec
            .take()
            .ok_or_else(|| TorchError::Invalid("not recording".into()))?;
        let t = rec.finish(path, self.ordinal)?;
        Ok(t.events.len())
    }

    pub fn stats_json(&self) -> String {
        let (stats, used, capacity, calls, cfg, placement, service) = {
            let a = self.alloc.lock();
            (
                a.stats().clone(),
                a.backend().used(),
                a.backend().capacity(),
                a.backend().call_report(),
                a.config().clone(),
                a.placement_stats(),
                a.online().and_then(|o| o.service_stats()),
            )
        };
        let b = self.book();
        let mut v = serde_json::to_value(&stats).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            let extra = serde_json::json!({
                "device": self.ordinal,
                "backend_used_bytes": used,
                "capacity_bytes": capacity,
                "steps": b.steps,
                "live_tensors": b.live.len(),
                "live_bytes": b.live_bytes,
                "step_peak": {"current": b.step_peak, "last": b.last_step_peak},
                "recording_events": b.rec.as_ref().map(|r| r.events()),
                "failed_allocs": b.failed_allocs,
                "failed_frees": b.failed_frees,
                "device_calls": calls,
                "predictive": cfg.predictive,
                "placement": placement,
                // Predictive mode's forecast thread: chunks of events handed over and
                // dropped (its queue full), forecasts made and published.
                "forecast_service": service.map(|s| serde_json::json!({
                    "submitted": s.submitted,
                    "dropped": s.dropped,
                    "processed": s.processed,
                    "forecasts": s.forecasts,
                    "published": s.published,
                    "carried_boundaries": s.carried,
                })),
                "host_time": self.host.json(),
                "config": cfg,
            });
            if let Some(e) = extra.as_object() {
                o.extend(e.clone());
            }
        }
        v.to_string()
    }
}

/// Every live pointer of a device, by address (tests).
pub fn live_of(device: i32) -> Result<HashMap<u64, (u64, u32, u64)>, TorchError> {
    Ok(existing(device)?.book().live.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn host_time_counts_calls_and_the_time_in_them_per_entry_point() {
        let h = HostTime::default();
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        h.add(&h.malloc_ns, &h.mallocs, t);
        h.add(&h.malloc_ns, &h.mallocs, Instant::now());
        h.add(&h.free_ns, &h.frees, Instant::now());
        let j = h.json();
        assert_eq!(j["mallocs"], 2);
        assert_eq!(j["frees"], 1);
        assert!(j["malloc_ns"].as_u64().unwrap() >= 2_000_000, "{j}");
        assert!(j["free_ns"].as_u64().unwrap() < 1_000_000_000, "{j}");
    }
}
