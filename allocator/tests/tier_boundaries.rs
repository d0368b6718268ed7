//! The tier manager passes iteration boundaries on to the allocator under it, so that
//! what the allocator does at a boundary (planned placement, the online path of
//! predictive mode) also happens under tiers.

use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::tier::manager::{TensorOpts, TierManager};
use memcast_alloc::tier::TierConfig;
use memcast_alloc::{AllocConfig, Allocator};

const MIB: u64 = 1 << 20;

#[test]
fn planned_placement_plans_a_loop_run_through_the_tier_manager() {
    let cfg = AllocConfig::default()
        .with_conf_string("placement:planned")
        .unwrap();
    let a = Allocator::new(SimBackend::h200(), cfg).unwrap();
    let mut m = TierManager::new(
        a,
        TierConfig {
            budget: 4 << 30,
            ..TierConfig::default()
        },
    )
    .unwrap();
    for _ in 0..8 {
        // A forward that keeps its activations and a backward that frees them.
        let mut live = Vec::new();
        for i in 1..=6u64 {
            live.push(m.register(i * 8 * MIB, TensorOpts::default()).unwrap());
            m.end_step();
        }
        while let Some(h) = live.pop() {
            m.free(h).unwrap();
        }
        m.iteration_boundary().unwrap();
    }
    m.check_invariants().unwrap();
    let s = m.allocator().placement_stats().unwrap();
    assert!(s.plans_kept >= 1, "{s:?}");
    assert!(s.planned_hits > 0, "{s:?}");
}
