//! Measurements of the CUDA backend that check nothing: what device calls and copies
//! cost on the GPU they run on, in the simulated device's terms (`sim_cost::CostModel`),
//! so that a cost model of that GPU is read off their output. Like `cuda.rs` they skip
//! without a driver unless `MEMCAST_REQUIRE_GPU` is set; run them one at a time
//! (`--test-threads=1`). `MEMCAST_CUDA_REPORT=FILE` appends the figures as JSON lines.

use std::time::Instant;

use memcast_alloc::backend::cuda::CudaBackend;
use memcast_alloc::backend::{DeviceBackend, HostPtr, MemRef, StreamPriority};

mod cuda_common;
use cuda_common::{bandwidth, gpu, report, GIB, MIB};

/// Not a check: copy bandwidths (GB/s) at the sizes of the sim's tables
/// (`sim_cost::CostModel`: 2 MiB, 64 MiB, 1 GiB) for each copy kind, and the total of
/// 1 GiB copies in both directions at once on two streams, printed in the cost model's
/// own field names so that a cost model for another GPU is read off the output.
#[test]
fn measure_copy_bandwidths() {
    let Some(mut b) = gpu() else { return };
    let sizes = [(2 * MIB, 100u32), (64 * MIB, 16), (GIB, 4)];
    let d = b.allocate(GIB, 0).unwrap();
    let d2 = b.allocate(GIB, 0).unwrap();
    let pinned = b.allocate_host(GIB, true).unwrap();
    let pageable = b.allocate_host(GIB, false).unwrap();
    let (dev, dev2) = (MemRef::Device(d), MemRef::Device(d2));
    let (pin, page) = (MemRef::Host(pinned), MemRef::Host(pageable));
    // Written first, so that copies from pageable memory read real pages (a buffer
    // never written maps the zero page, which copies at another rate).
    let chunk: Vec<u8> = (0..64 * MIB).map(|i| (i * 7 + 1) as u8).collect();
    for off in (0..GIB).step_by(chunk.len()) {
        b.write(MemRef::Host(HostPtr(pageable.0 + off)), &chunk)
            .unwrap();
    }
    let s = b.create_stream(StreamPriority::Low).unwrap();
    let mut table = |dst: MemRef, src: MemRef, scale: u32| -> serde_json::Value {
        let rows: Vec<_> = sizes
            .iter()
            .map(|&(n, reps)| {
                let gbps = bandwidth(&mut b, s, dst, src, n, (reps / scale).max(2));
                serde_json::json!([n as f64, gbps])
            })
            .collect();
        serde_json::Value::Array(rows)
    };
    let h2d_pinned = table(dev, pin, 1);
    let d2h_pinned = table(pin, dev, 1);
    let h2d_pageable = table(dev, page, 2);
    let d2h_pageable = table(page, dev, 2);
    let d2d = table(dev2, dev, 1);
    // Both directions at once: 4 x 1 GiB in on one stream, 4 x 1 GiB out on another.
    let (s_in, s_out) = (
        b.create_stream(StreamPriority::Low).unwrap(),
        b.create_stream(StreamPriority::Low).unwrap(),
    );
    let h2 = b.allocate_host(GIB, true).unwrap();
    b.synchronize_device().unwrap();
    let t = Instant::now();
    for _ in 0..4 {
        b.copy(dev, pin, GIB, Some(s_in)).unwrap();
        b.copy(MemRef::Host(h2), dev2, GIB, Some(s_out)).unwrap();
    }
    b.synchronize_stream(s_in).unwrap();
    b.synchronize_stream(s_out).unwrap();
    let duplex = (8 * GIB) as f64 / t.elapsed().as_secs_f64() / 1e9;
    report(
        "copy_bandwidths",
        serde_json::json!({
            "h2d_pinned": h2d_pinned, "d2h_pinned": d2h_pinned,
            "h2d_pageable": h2d_pageable, "d2h_pageable": d2h_pageable,
            "d2d": d2d, "duplex_gbps": duplex,
        }),
    );
    b.deallocate_host(h2, GIB).unwrap();
    b.deallocate_host(pageable, GIB).unwrap();
    b.deallocate_host(pinned, GIB).unwrap();
    b.deallocate(d2, GIB, 0).unwrap();
    b.deallocate(d, GIB, 0).unwrap();
}

/// Grows a growable segment by `chunk` `reps` times, then shrinks it back chunk by chunk.
fn measure_growable(b: &mut CudaBackend, page: u64, chunk: u64, reps: u64) -> serde_json::Value {
    b.call_stats().reset();
    let base = b.reserve_growable(8 * GIB).unwrap();
    for i in 0..reps {
        b.grow(base, i * chunk, chunk).unwrap();
    }
    for i in (0..reps).rev() {
        b.shrink(base, (i + 1) * chunk, chunk).unwrap();
    }
    b.release_growable(base, 0).unwrap();
    let r = b.call_report();
    serde_json::json!({"page": page, "growable_chunk": chunk, "map": r.map, "unmap": r.unmap})
}

/// Not a check: measures the device calls the allocator makes (cuMemAlloc/cuMemFree by
/// size, map/unmap per page, cuMemHostAlloc) and reports them beside the sim's costs.
#[test]
fn measure_device_call_latencies() {
    let Some(mut b) = gpu() else { return };
    let mut rows = Vec::new();
    for (size, reps) in [
        (512u64, 50),
        (64 << 10, 50),
        (2 * MIB, 50),
        (20 * MIB, 50),
        (256 * MIB, 20),
        (GIB, 10),
    ] {
        b.call_stats().reset();
        let ptrs: Vec<_> = (0..reps).map(|_| b.allocate(size, 0).unwrap()).collect();
        for p in ptrs {
            b.deallocate(p, size, 0).unwrap();
        }
        let r = b.call_report();
        rows.push(serde_json::json!({"size": size, "alloc": r.alloc, "free": r.free}));
    }
    let g = b.granularity();
    for (chunk, reps) in [(g, 50u64), (32 * MIB, 20), (256 * MIB, 5)] {
        rows.push(measure_growable(&mut b, g, chunk, reps));
    }
    // Larger pages: one cuMemCreate + cuMemMap per 32 MiB.
    let mut big = CudaBackend::new(0).unwrap();
    big.set_page_size(32 * MIB).unwrap();
    assert!(big.set_page_size(3 * MIB).is_err());
    for (chunk, reps) in [(32 * MIB, 20u64), (256 * MIB, 5)] {
        rows.push(measure_growable(&mut big, 32 * MIB, chunk, reps));
    }
    drop(big);
    for (size, reps) in [(2 * MIB, 10), (256 * MIB, 2)] {
        b.call_stats().reset();
        let hs: Vec<_> = (0..reps)
            .map(|_| b.allocate_host(size, true).unwrap())
            .collect();
        for h in hs {
            b.deallocate_host(h, size).unwrap();
        }
        let r = b.call_report();
        rows.push(serde_json::json!({"pinned_size": size, "host_alloc": r.host_alloc, "host_free": r.host_free}));
    }
    report("device_call_latencies", serde_json::Value::Array(rows));
}

/// The driver calls behind one growable page, timed apart: `cuMemCreate`, `cuMemMap`
/// (each per page) and `cuMemSetAccess` (once over the range, as the backend calls it),
/// for `n` pages of the driver's granularity; then `cuMemUnmap` and `cuMemRelease`.
/// Microseconds per page (per call for the access), or the failing call's name.
fn page_calls_apart(n: usize) -> Result<serde_json::Value, String> {
    use cudarc::driver::sys;
    let ok = |what: &str, r: sys::CUresult| {
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(format!("{what}: {r:?}"))
        }
    };
    let mut b = gpu().ok_or("no CUDA driver found")?;
    let g = b.granularity();
    // Reserves address space and makes the device's context current on this thread.
    let base = b
        .reserve_growable(n as u64 * g)
        .map_err(|e| e.to_string())?;
    // SAFETY: a plain C struct for which all-zero bytes are the documented defaults.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    let mut hs = vec![0 as sys::CUmemGenericAllocationHandle; n];
    let per = |t: Instant, k: usize| t.elapsed().as_secs_f64() * 1e6 / k as f64;
    let t = Instant::now();
    for h in hs.iter_mut() {
        // SAFETY: the context is current; `h` and `prop` are live.
        ok("cuMemCreate", unsafe {
            sys::cuMemCreate(h, g as usize, &prop, 0)
        })?;
    }
    let create = per(t, n);
    let t = Instant::now();
    for (i, h) in hs.iter().enumerate() {
        // SAFETY: page `i` of the range reserved above, nothing mapped there; `h` is a
        // fresh allocation of `g` bytes.
        ok("cuMemMap", unsafe {
            sys::cuMemMap(base.0 + i as u64 * g, g as usize, 0, *h, 0)
        })?;
    }
    let map = per(t, n);
    // SAFETY: all-zero is valid for the struct; the range was mapped just above.
    let t = Instant::now();
    ok("cuMemSetAccess", unsafe {
        let mut d: sys::CUmemAccessDesc = std::mem::zeroed();
        d.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        d.location.id = 0;
        d.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        sys::cuMemSetAccess(base.0, n * g as usize, &d, 1)
    })?;
    let access = per(t, 1);
    let t = Instant::now();
    for i in 0..n {
        // SAFETY: mapped above; nothing was queued that uses it.
        ok("cuMemUnmap", unsafe {
            sys::cuMemUnmap(base.0 + i as u64 * g, g as usize)
        })?;
    }
    let unmap = per(t, n);
    let t = Instant::now();
    for h in &hs {
        // SAFETY: created above, unmapped, released once.
        ok("cuMemRelease", unsafe { sys::cuMemRelease(*h) })?;
    }
    let release = per(t, n);
    b.release_growable(base, 0).map_err(|e| e.to_string())?;
    Ok(serde_json::json!({
        "pages": n, "page_bytes": g, "create_us_per_page": create, "map_us_per_page": map,
        "set_access_us_per_call": access, "unmap_us_per_page": unmap,
        "release_us_per_page": release,
    }))
}

/// Microseconds per enqueue of a 4-byte `cuMemsetD8Async` (a stand-in for a kernel
/// launch: an enqueue that waits for nothing) on the calling thread, `n` of them, as
/// (p50, p99, max).
fn enqueue_latency(b: &mut CudaBackend, n: usize) -> (f64, f64, f64) {
    use cudarc::driver::sys;
    let s = b.create_stream(StreamPriority::Normal).unwrap();
    let raw = b.raw_stream(s).unwrap() as sys::CUstream;
    let p = b.allocate(2 * MIB, s).unwrap();
    let mut us = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        // SAFETY: `p` is a live device allocation of 2 MiB; `raw` is a live stream of
        // this context, which the backend made current.
        let r = unsafe { sys::cuMemsetD8Async(p.0, 0, 4, raw) };
        us.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        if i % 256 == 255 {
            b.synchronize_stream(s).unwrap();
        }
    }
    b.synchronize_stream(s).unwrap();
    b.deallocate(p, 2 * MIB, s).unwrap();
    us.sort_by(f64::total_cmp);
    let q = |f: f64| us[((us.len() - 1) as f64 * f) as usize];
    (q(0.5), q(0.99), us[us.len() - 1])
}

/// Not a check: where the time of a growable page goes (`cuMemCreate`, `cuMemMap`,
/// `cuMemSetAccess` apart), and whether pages made on a second thread hold up the
/// first thread's enqueues (driver calls that a job's own thread makes all the time):
/// enqueue latency alone, then while another thread creates, maps, unmaps and releases
/// pages in a loop. Growth made ahead of need on another thread helps a job only if it
/// neither takes long there nor holds the job's thread.
#[test]
fn measure_page_calls_and_a_second_thread() {
    let Some(mut b) = gpu() else { return };
    let mut rows = Vec::new();
    for n in [16usize, 128] {
        rows.push(page_calls_apart(n).unwrap());
    }
    let alone = enqueue_latency(&mut b, 4096);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let maker = std::thread::spawn(move || {
        let mut pages = 0u64;
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            let v = page_calls_apart(16).unwrap();
            pages += v["pages"].as_u64().unwrap();
        }
        pages
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    let t = Instant::now();
    let busy = enqueue_latency(&mut b, 4096);
    let secs = t.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let pages = maker.join().unwrap();
    rows.push(serde_json::json!({
        "enqueue_us_alone": {"p50": alone.0, "p99": alone.1, "max": alone.2},
        "enqueue_us_beside_page_maker": {"p50": busy.0, "p99": busy.1, "max": busy.2},
        "enqueue_seconds_beside_page_maker": secs,
        "pages_made_by_second_thread": pages,
    }));
    report(
        "page_calls_and_a_second_thread",
        serde_json::Value::Array(rows),
    );
}
