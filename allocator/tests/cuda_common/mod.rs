//! What the CUDA test binaries share: the device (or the reason there is none), the
//! figures' report, copy timing. Each binary compiles its own copy (`mod cuda_common;`).
#![allow(dead_code)]

use std::io::Write;
use std::time::Instant;

use memcast_alloc::backend::cuda::CudaBackend;
use memcast_alloc::backend::{BackendError, DeviceBackend, MemRef, StreamId};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// The device, or `None` (the test passes, saying why) where no driver is found and
/// `MEMCAST_REQUIRE_GPU` is not set.
pub fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(BackendError::NoDriver) if std::env::var_os("MEMCAST_REQUIRE_GPU").is_none() => {
            eprintln!("skipped: no CUDA driver found");
            None
        }
        Err(e) => panic!("CUDA backend unavailable: {e}"),
    }
}

/// Prints one test's figures as a JSON line, and appends it to `MEMCAST_CUDA_REPORT`.
pub fn report(name: &str, v: serde_json::Value) {
    let line = serde_json::json!({ "test": name, "figures": v });
    println!("{line}");
    if let Some(p) = std::env::var_os("MEMCAST_CUDA_REPORT") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// GB/s of `reps` copies of `bytes` on stream `s` (one untimed copy first).
pub fn bandwidth(
    b: &mut CudaBackend,
    s: StreamId,
    dst: MemRef,
    src: MemRef,
    bytes: u64,
    reps: u32,
) -> f64 {
    b.copy(dst, src, bytes, Some(s)).unwrap();
    b.synchronize_stream(s).unwrap();
    let t = Instant::now();
    for _ in 0..reps {
        b.copy(dst, src, bytes, Some(s)).unwrap();
    }
    b.synchronize_stream(s).unwrap();
    (bytes * reps as u64) as f64 / t.elapsed().as_secs_f64() / 1e9
}
