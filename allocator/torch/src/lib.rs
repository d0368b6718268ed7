//! `memcast_torch`: memcast as PyTorch's CUDA allocator.
//!
//! A C-ABI library for `torch.cuda.memory.CUDAPluggableAllocator(path, "memcast_malloc",
//! "memcast_free")`, used directly (`change_current_allocator`: every CUDA allocation
//! goes to memcast) or behind a `torch.cuda.MemPool` (PyTorch's caching allocator asks
//! memcast for its segments). The Python package `memcast_torch`
//! (`allocator/torch/python/`) wraps it; docs/cuda.md says how to use it.
//!
//! Exports (all thread-safe; one memcast allocator per device, created on the device's
//! first allocation over the device's primary context, the one PyTorch uses):
//! - `void* memcast_malloc(size_t size, int device, cudaStream_t stream)`: null when the
//!   allocation fails (out of memory, no driver), which PyTorch turns into its
//!   out-of-memory error; the reason is in `memcast_last_error`;
//! - `void memcast_free(void* ptr, size_t size, int device, cudaStream_t stream)`;
//! - `int memcast_configure(const char* conf)`: a `MEMCAST_ALLOC_CONF`-style string
//!   (over the environment's), before the first allocation only;
//! - `char* memcast_stats_json(int device)` (free it with `memcast_string_free`) and
//!   `long memcast_stats(int device, char* buf, size_t len)` (into a caller buffer);
//! - `int memcast_empty_cache(int device)`, `void memcast_reset(void)` (every device:
//!   the hook for `torch.cuda.empty_cache`);
//! - `int memcast_step(int device)`: an iteration boundary (predictive mode's forecaster
//!   lines its steps up on it); predictive mode itself is a configuration key
//!   (`predictive:true`, with `forecaster`, `model`, `horizon`, ...);
//! - `int memcast_record_start(int device)`, `int memcast_record_stop(int device, const
//!   char* path)`: the run as a `.mctrace` trace;
//! - `long memcast_last_error(char* buf, size_t len)`;
//! - the host side of `memcast_torch.offload` (`host_pool.rs`): `int
//!   memcast_host_pool_create(int device, size_t bytes)` (one pinned buffer),
//!   `int memcast_host_alloc(int device, size_t bytes, uint64_t* addr)` (0 and the
//!   address, 1 when the pool has no room, -1), `int memcast_host_release(int device,
//!   uint64_t addr)`, `void* memcast_transfer_stream(int device)` (a low-priority
//!   `cudaStream_t`, null on error), `long memcast_host_pool_stats(int device, char* buf,
//!   size_t len)`, `int memcast_host_pool_destroy(int device)`.
//!
//! The log (the allocator's warnings, and with `MEMCAST_LOG=debug` its predictive
//! advice and growth) goes to stderr, filtered by `MEMCAST_LOG` (`log.rs`).
//!
//! Functions returning `int` give 0 on success and a negative code on failure; those
//! returning `long` give the length of the text (without its NUL), or a negative code.
//! Codes: -1 error (see `memcast_last_error`), -2 internal error (a panic, caught),
//! -3 bad argument. No panic crosses the boundary: every export runs under
//! `catch_unwind`, logs to stderr and returns its failure value.
//!
//! `unsafe` is in this file only: reading the caller's C strings and writing into the
//! caller's buffers, under each export's `# Safety` contract.

pub mod host_pool;
pub mod log;
pub mod record;
pub mod state;

use std::ffi::{c_char, c_int, c_long, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use state::TorchError;

const ERR: c_int = -1;
const PANIC: c_int = -2;
const BAD_ARG: c_int = -3;

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs `f`; a panic becomes `fallback` (logged, and kept as the last error).
fn guard<T>(what: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            let msg = format!("{what}: internal error: {}", panic_text(&*p));
            eprintln!("memcast: {msg}");
            state::set_last_error(&msg);
            fallback
        }
    }
}

/// 0, or the error logged and kept as the last error.
fn code(what: &str, r: Result<(), TorchError>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            let msg = format!("{what}: {e}");
            eprintln!("memcast: {msg}");
            state::set_last_error(&msg);
            ERR
        }
    }
}

/// # Safety
/// `p` is null or a NUL-terminated string valid for the call.
unsafe fn text<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string valid for the call.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// Copies `s` and a NUL into `buf` when it fits; returns the length of `s`.
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
unsafe fn into_buffer(s: &str, buf: *mut c_char, len: usize) -> c_long {
    if !buf.is_null() && len > s.len() {
        // SAFETY: `buf` has room for `len > s.len()` bytes (caller's contract), and
        // does not overlap `s`, which this library owns.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, s.len());
            *buf.add(s.len()) = 0;
        }
    }
    s.len() as c_long
}

/// PyTorch's allocation hook. Null on failure (PyTorch raises its out-of-memory error).
#[no_mangle]
pub extern "C" fn memcast_malloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void {
    guard(
        "memcast_malloc",
        std::ptr::null_mut(),
        || match state::device(device).and_then(|d| d.malloc(size as u64, stream as usize)) {
            Ok(p) => p as *mut c_void,
            Err(e) => {
                let msg = format!("memcast_malloc({size} bytes, device {device}): {e}");
                if std::env::var_os("MEMCAST_QUIET").is_none() {
                    eprintln!("memcast: {msg}");
                }
                state::set_last_error(&msg);
                std::ptr::null_mut()
            }
        },
    )
}

/// PyTorch's free hook.
#[no_mangle]
pub extern "C" fn memcast_free(ptr: *mut c_void, size: usize, device: c_int, stream: *mut c_void) {
    guard("memcast_free", (), || {
        if ptr.is_null() {
            return;
        }
        let r = state::existing(device).and_then(|d| d.free(ptr as u64, stream as usize));
        let _ = code(&format!("memcast_free({ptr:?}, {size} bytes)"), r);
    })
}

/// Sets the allocator configuration (`key:value,...`, see `MEMCAST_ALLOC_CONF`) before
/// the first allocation. 0, or -1 when malformed or too late.
///
/// # Safety
/// `conf` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn memcast_configure(conf: *const c_char) -> c_int {
    guard("memcast_configure", PANIC, || {
        // SAFETY: the caller's contract.
        let Some(s) = (unsafe { text(conf) }) else {
            state::set_last_error("memcast_configure: null or non-UTF-8 string");
            return BAD_ARG;
        };
        code("memcast_configure", state::configure(s))
    })
}

/// The device's statistics as JSON, to free with [`memcast_string_free`]; null if the
/// device has no allocator yet (or on error).
#[no_mangle]
pub extern "C" fn memcast_stats_json(device: c_int) -> *mut c_char {
    guard(
        "memcast_stats_json",
        std::ptr::null_mut(),
        || match state::existing(device) {
            Ok(d) => CString::new(d.stats_json())
                .map(CString::into_raw)
                .unwrap_or(std::ptr::null_mut()),
            Err(e) => {
                state::set_last_error(&e.to_string());
                std::ptr::null_mut()
            }
        },
    )
}

/// Frees a string returned by [`memcast_stats_json`].
///
/// # Safety
/// `s` is null or a pointer returned by `memcast_stats_json`, freed once.
#[no_mangle]
pub unsafe extern "C" fn memcast_string_free(s: *mut c_char) {
    guard("memcast_string_free", (), || {
        if !s.is_null() {
            // SAFETY: `s` came from `CString::into_raw` (caller's contract).
            drop(unsafe { CString::from_raw(s) });
        }
    })
}

/// The device's statistics as JSON into `buf` (NUL-terminated when it fits); returns
/// the JSON's length (call again with a larger buffer if it is >= `len`), or -1.
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn memcast_stats(device: c_int, buf: *mut c_char, len: usize) -> c_long {
    guard("memcast_stats", PANIC as c_long, || {
        match state::existing(device) {
            // SAFETY: the caller's contract.
            Ok(d) => unsafe { into_buffer(&d.stats_json(), buf, len) },
            Err(e) => {
                state::set_last_error(&e.to_string());
                ERR as c_long
            }
        }
    })
}

/// The last error's text into `buf` (as [`memcast_stats`]).
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn memcast_last_error(buf: *mut c_char, len: usize) -> c_long {
    guard("memcast_last_error", PANIC as c_long, || {
        // SAFETY: the caller's contract.
        unsafe { into_buffer(&state::last_error(), buf, len) }
    })
}

/// Gives the device's free cached memory back to the driver. 0 (also when the device
/// has no allocator yet), or -1.
#[no_mangle]
pub extern "C" fn memcast_empty_cache(device: c_int) -> c_int {
    guard("memcast_empty_cache", PANIC, || {
        match state::existing(device) {
            Ok(d) => code("memcast_empty_cache", d.empty_cache().map(|_| ())),
            Err(TorchError::NotInitialized(_)) => 0,
            Err(e) => code("memcast_empty_cache", Err(e)),
        }
    })
}

/// `empty_cache` on every device (the reset hook of a pluggable allocator).
#[no_mangle]
pub extern "C" fn memcast_reset() {
    guard("memcast_reset", (), || {
        for d in state::all() {
            let _ = code("memcast_reset", d.empty_cache().map(|_| ()));
        }
    })
}

/// An iteration boundary on `device`: `Allocator::iteration_boundary` (predictive mode's
/// forecaster restarts its steps there), counted in the statistics (`steps`) and
/// recorded in a recording. 0, or -1 when the device has no allocator yet.
#[no_mangle]
pub extern "C" fn memcast_step(device: c_int) -> c_int {
    guard("memcast_step", PANIC, || {
        code(
            "memcast_step",
            state::existing(device).and_then(|d| d.step()),
        )
    })
}

/// Starts recording the device's allocations (the device is initialized if needed).
#[no_mangle]
pub extern "C" fn memcast_record_start(device: c_int) -> c_int {
    guard("memcast_record_start", PANIC, || {
        code(
            "memcast_record_start",
            state::device(device).and_then(|d| d.record_start()),
        )
    })
}

/// Stops recording and writes the trace (`.mctrace`) to `path`.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn memcast_record_stop(device: c_int, path: *const c_char) -> c_int {
    guard("memcast_record_stop", PANIC, || {
        // SAFETY: the caller's contract.
        let Some(p) = (unsafe { text(path) }) else {
            state::set_last_error("memcast_record_stop: null or non-UTF-8 path");
            return BAD_ARG;
        };
        code(
            "memcast_record_stop",
            state::existing(device)
                .and_then(|d| d.record_stop(std::path::Path::new(p)).map(|_| ())),
        )
    })
}

/// Creates the device's pinned host pool of `bytes` (see `host_pool.rs`).
#[no_mangle]
pub extern "C" fn memcast_host_pool_create(device: c_int, bytes: usize) -> c_int {
    guard("memcast_host_pool_create", PANIC, || {
        code(
            "memcast_host_pool_create",
            host_pool::create(device, bytes as u64),
        )
    })
}

/// A range of the pinned host pool: 0 and its address in `*addr`, 1 when no free range
/// is large enough, -1 on error, -3 when `addr` is null.
///
/// # Safety
/// `addr` is null or valid for one write of a `u64`.
#[no_mangle]
pub unsafe extern "C" fn memcast_host_alloc(device: c_int, bytes: usize, addr: *mut u64) -> c_int {
    guard("memcast_host_alloc", PANIC, || {
        if addr.is_null() {
            state::set_last_error("memcast_host_alloc: null address pointer");
            return BAD_ARG;
        }
        match host_pool::alloc(device, bytes as u64) {
            Ok(Some(p)) => {
                // SAFETY: `addr` is non-null and valid for a write (caller's contract).
                unsafe { *addr = p };
                0
            }
            Ok(None) => 1,
            Err(e) => code("memcast_host_alloc", Err(e)),
        }
    })
}

/// Gives back a range of the pinned host pool.
#[no_mangle]
pub extern "C" fn memcast_host_release(device: c_int, addr: u64) -> c_int {
    guard("memcast_host_release", PANIC, || {
        code("memcast_host_release", host_pool::release(device, addr))
    })
}

/// A new low-priority transfer stream of the device's pool (null on error).
#[no_mangle]
pub extern "C" fn memcast_transfer_stream(device: c_int) -> *mut c_void {
    guard(
        "memcast_transfer_stream",
        std::ptr::null_mut(),
        || match host_pool::transfer_stream(device) {
            Ok(s) => s as *mut c_void,
            Err(e) => {
                let _ = code("memcast_transfer_stream", Err(e));
                std::ptr::null_mut()
            }
        },
    )
}

/// The pinned host pool's figures as JSON into `buf` (as [`memcast_stats`]).
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn memcast_host_pool_stats(
    device: c_int,
    buf: *mut c_char,
    len: usize,
) -> c_long {
    guard("memcast_host_pool_stats", PANIC as c_long, || {
        match host_pool::stats_json(device) {
            // SAFETY: the caller's contract.
            Ok(s) => unsafe { into_buffer(&s, buf, len) },
            Err(e) => {
                state::set_last_error(&e.to_string());
                ERR as c_long
            }
        }
    })
}

/// Frees the device's pinned host pool (an error while ranges are in use).
#[no_mangle]
pub extern "C" fn memcast_host_pool_destroy(device: c_int) -> c_int {
    guard("memcast_host_pool_destroy", PANIC, || {
        code("memcast_host_pool_destroy", host_pool::destroy(device))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        let mut buf = vec![0 as c_char; 512];
        // SAFETY: `buf` has 512 writable bytes.
        let n = unsafe { memcast_last_error(buf.as_mut_ptr(), buf.len()) };
        assert!(n >= 0 && (n as usize) < buf.len());
        // SAFETY: NUL-terminated by `memcast_last_error`.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_does_not_cross_the_boundary() {
        let r = guard("test", -7, || -> i32 { panic!("boom") });
        assert_eq!(r, -7);
        assert!(last().contains("boom"));
    }

    #[test]
    fn bad_arguments_are_error_codes() {
        // SAFETY: null is allowed.
        assert_eq!(unsafe { memcast_configure(std::ptr::null()) }, BAD_ARG);
        let bad = CString::new("no_such_key:1").unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { memcast_configure(bad.as_ptr()) }, ERR);
        assert!(last().contains("unknown key"), "{}", last());
        assert!(memcast_stats_json(-1).is_null());
        assert_eq!(memcast_step(1 << 20), ERR);
        memcast_free(std::ptr::null_mut(), 0, 0, std::ptr::null_mut());
        memcast_free(16 as *mut c_void, 0, 3, std::ptr::null_mut());
        // SAFETY: null path is allowed.
        assert_eq!(unsafe { memcast_record_stop(0, std::ptr::null()) }, BAD_ARG);
    }

    /// Without a driver (CI, this machine) malloc returns null with the reason; with
    /// one, it allocates device memory that can be freed.
    #[test]
    fn malloc_without_a_driver_returns_null_with_the_reason() {
        match memcast_alloc::backend::cuda::CudaBackend::new(0) {
            Err(memcast_alloc::backend::BackendError::NoDriver) => {
                let p = memcast_malloc(1 << 20, 0, std::ptr::null_mut());
                assert!(p.is_null());
                assert!(last().ends_with("no CUDA driver found"), "{}", last());
                assert_eq!(memcast_empty_cache(0), 0);
                memcast_reset();
            }
            Err(e) => panic!("{e}"),
            Ok(_) => {
                let p = memcast_malloc(1 << 20, 0, std::ptr::null_mut());
                assert!(!p.is_null(), "{}", last());
                assert_eq!(memcast_step(0), 0);
                let s = memcast_stats_json(0);
                assert!(!s.is_null());
                // SAFETY: a string from memcast_stats_json, freed once below.
                let j = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
                unsafe { memcast_string_free(s) };
                assert!(j.contains("\"steps\":1"), "{j}");
                memcast_free(p, 1 << 20, 0, std::ptr::null_mut());
                assert_eq!(memcast_empty_cache(0), 0);
                // Configuration is frozen after the first allocation.
                let c = CString::new("growth_factor:2").unwrap();
                // SAFETY: a valid C string.
                assert_eq!(unsafe { memcast_configure(c.as_ptr()) }, ERR);
                assert!(last().contains("too late"));
            }
        }
    }
}
