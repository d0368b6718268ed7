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
