//! Statistics the allocator keeps on its hot path.

use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::config::AllocConfig;
use memcast_alloc::Allocator;

/// Every `latency_sample_every`-th allocation is timed (0: none), small and large alike,
/// and the counts add up.
#[test]
fn latency_is_sampled_every_nth_allocation() {
    for (every, timed) in [(64u32, 3u64), (1, 200), (0, 0), (200, 1), (201, 0)] {
        let cfg = AllocConfig::default()
            .with_conf_string(&format!("latency_sample_every:{every}"))
            .unwrap();
        let mut a = Allocator::new(SimBackend::new(1 << 30, Default::default()), cfg).unwrap();
        let mut live = Vec::new();
        for i in 0..200u64 {
            // Alternate small (slab) and large (run) requests.
            live.push(
                a.allocate(if i % 2 == 0 { 1000 } else { 300_000 }, 0)
                    .unwrap(),
            );
        }
        let st = a.stats();
        assert_eq!(st.allocs, 200, "every {every}");
        assert_eq!(st.latency.count, timed, "every {every}");
        for h in live {
            a.deallocate(h, 0).unwrap();
        }
        a.check_invariants().unwrap();
    }
}

/// Deferred coalescing caches a freed run only where it cannot merge: a run with a free
/// neighbour goes back to the placement index at once, so that a later request never
/// finds a hole smaller than the merge would have made (placement around cached runs).
#[test]
fn a_freed_run_next_to_free_memory_is_merged_not_cached() {
    const MIB: u64 = 1 << 20;
    let cfg = memcast_alloc::config::AllocConfig::default();
    let mut a = memcast_alloc::Allocator::new(
        memcast_alloc::backend::sim::SimBackend::new(1 << 34, Default::default()),
        cfg,
    )
    .unwrap();
    // Three adjacent runs at the start of one growable segment; its free tail follows c.
    let x = a.allocate(MIB, 0).unwrap();
    let b = a.allocate(MIB, 0).unwrap();
    let c = a.allocate(MIB, 0).unwrap();
    // b has used neighbours on both sides: it is cached and its size comes back from the
    // cache.
    a.deallocate(b, 0).unwrap();
    let b2 = a.allocate(MIB, 0).unwrap();
    assert_eq!(a.stats().cache_hits, 1);
    // c borders the free tail: it merges at once, and the next request is placed, not
    // served from the cache.
    a.deallocate(c, 0).unwrap();
    let c2 = a.allocate(MIB, 0).unwrap();
    assert_eq!(a.stats().cache_hits, 1);
    a.check_invariants().unwrap();
    for r in [x, b2, c2] {
        a.deallocate(r, 0).unwrap();
    }
    a.check_invariants().unwrap();
}
