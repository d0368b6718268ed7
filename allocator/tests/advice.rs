//! Advice from a forecaster (`Allocator::apply_advice`): what each kind does to the
//! reserve, that advice the device cannot follow is ignored without an error or a
//! panic, and that the allocator stays consistent.

use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::config::AllocConfig;
use memcast_alloc::policy::Advice;
use memcast_alloc::Allocator;

const MIB: u64 = 1 << 20;

fn sim(capacity: u64, conf: &str) -> Allocator<SimBackend> {
    let cfg = AllocConfig::default().with_conf_string(conf).unwrap();
    Allocator::new(SimBackend::new(capacity, Default::default()), cfg).unwrap()
}

fn free_bytes(a: &Allocator<SimBackend>) -> u64 {
    a.free_and_largest().0
}

#[test]
fn ensure_free_near_capacity_maps_the_whole_deficit() {
    // 60 MiB device: a 10 MiB request grows the segment by 32 MiB (22 MiB free tail).
    let mut a = sim(60 * MIB, "");
    let _x = a.allocate(10 * MIB, 0).unwrap();
    assert_eq!(a.stats().reserved.current, 32 * MIB);
    assert_eq!(free_bytes(&a), 22 * MIB);
    // 50 MiB free asked: 28 MiB short, exactly what the device has left. The tail is
    // already free and must not be subtracted a second time.
    a.apply_advice(Advice::EnsureFree {
        stream: 0,
        bytes: 50 * MIB,
    })
    .unwrap();
    a.check_invariants().unwrap();
    assert_eq!(free_bytes(&a), 50 * MIB);
    assert_eq!(a.stats().reserved.current, 60 * MIB);
    // The reserve serves a 50 MiB request without another device call.
    let allocs = a.stats().device_allocs;
    let _y = a.allocate(50 * MIB, 0).unwrap();
    assert_eq!(a.stats().device_allocs, allocs);
}

#[test]
fn ensure_free_beyond_the_device_is_ignored_without_a_device_call() {
    // 32 MiB device, all of it reserved by the first growth; 22 MiB free.
    let mut a = sim(32 * MIB, "");
    let _x = a.allocate(10 * MIB, 0).unwrap();
    let allocs = a.stats().device_allocs;
    // 8 MiB short, less than the free tail: nothing can be mapped (this once mapped
    // zero bytes and tripped an assertion).
    a.apply_advice(Advice::EnsureFree {
        stream: 0,
        bytes: 30 * MIB,
    })
    .unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().device_allocs, allocs);
    assert_eq!(a.stats().reserved.current, 32 * MIB);
}

#[test]
fn presplit_runs_serve_the_next_requests_from_the_cache() {
    let mut a = sim(1 << 30, "");
    a.apply_advice(Advice::PreSplit {
        stream: 0,
        bytes: 3 * MIB,
        count: 2,
    })
    .unwrap();
    a.check_invariants().unwrap();
    let allocs = a.stats().device_allocs;
    let x = a.allocate(3 * MIB, 0).unwrap();
    let y = a.allocate(3 * MIB, 0).unwrap();
    assert_ne!(x.ptr, y.ptr);
    assert_eq!(a.stats().cache_hits, 2);
    assert_eq!(a.stats().device_allocs, allocs);
    a.check_invariants().unwrap();
}

#[test]
fn presplit_beyond_the_device_releases_nothing() {
    // 64 MiB device: 10 MiB live, 6 MiB freed, a free tail.
    let mut a = sim(64 * MIB, "");
    let _x = a.allocate(10 * MIB, 0).unwrap();
    let y = a.allocate(6 * MIB, 0).unwrap();
    a.deallocate(y, 0).unwrap();
    let (reserved, frees) = (a.stats().reserved.current, a.stats().device_frees);
    // A run the device cannot hold: advice is best effort, so the out-of-memory path's
    // releases (which would give back the free tail) do not run.
    a.apply_advice(Advice::PreSplit {
        stream: 0,
        bytes: 60 * MIB,
        count: 1,
    })
    .unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().reserved.current, reserved);
    assert_eq!(a.stats().device_frees, frees);
    assert_eq!(a.stats().oom_retries, 0);
}

#[test]
fn trim_returns_free_memory_and_spare_slabs_down_to_the_reserve() {
    // Fixed segments, so that a trim can give whole segments back.
    let mut a = sim(1 << 30, "growable_segments:false,slab_spares:4");
    let big: Vec<_> = (0..4).map(|_| a.allocate(40 * MIB, 0).unwrap()).collect();
    // Small objects of one class in two slabs, then all freed: the slabs become spares.
    let small: Vec<_> = (0..512).map(|_| a.allocate(4096, 0).unwrap()).collect();
    for s in small {
        a.deallocate(s, 0).unwrap();
    }
    for b in big {
        a.deallocate(b, 0).unwrap();
    }
    let before = a.stats().reserved.current;
    a.apply_advice(Advice::Trim {
        stream: 0,
        keep_bytes: 0,
    })
    .unwrap();
    a.check_invariants().unwrap();
    assert!(a.stats().reserved.current < before);
    // Everything was free: nothing stays reserved, spare slabs included.
    assert_eq!(a.stats().reserved.current, 0);
}

#[test]
fn release_immediate_keeps_no_spare_slabs() {
    let mut a = sim(1 << 30, "growable_segments:false,release:immediate");
    let small: Vec<_> = (0..64).map(|_| a.allocate(4096, 0).unwrap()).collect();
    for s in small {
        a.deallocate(s, 0).unwrap();
    }
    a.check_invariants().unwrap();
    assert_eq!(a.stats().reserved.current, 0);
}
