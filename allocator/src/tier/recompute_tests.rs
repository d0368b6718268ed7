//! Tests of recomputation: a dropped tensor is served only recomputed and charged, and
//! replays of the synthetic families (the traces with producers) drop and recompute.
//! The property tests with recomputable tensors are in `tests.rs`.

use crate::backend::DeviceBackend;
use crate::config::AllocConfig;
use crate::pool::Allocator;

use super::handle::Place;
use super::manager::{TensorOpts, TierManager};
use super::replay::{replay_budgeted, Budget, TierReplayOptions};
use super::tests::{manager, read, recomputable, Produced, TestProducer};
use super::TierConfig;

/// An allocator on a simulated 1 GiB device and tier settings for it: a manager's parts.
fn sim_parts() -> (Allocator<crate::backend::sim::SimBackend>, TierConfig) {
    let alloc = Allocator::new(
        crate::backend::sim::SimBackend::new(1 << 30, Default::default()),
        AllocConfig::default(),
    )
    .unwrap();
    let cfg = TierConfig {
        budget: 1 << 30,
        staging_bytes: 64 << 20,
        ..TierConfig::default()
    };
    (alloc, cfg)
}

/// A dropped tensor holds no device or host bytes, and is served only recomputed: its
/// producer runs (the bytes are back), its cost is charged, and on a simulated device
/// the clock moves by it.
#[test]
fn a_dropped_tensor_is_served_recomputed_and_charged() {
    let (mut m, _) = manager(1);
    let produced = std::sync::Arc::new(std::sync::Mutex::new(Produced::default()));
    m.set_producer(Box::new(TestProducer(produced.clone())));
    let x = m.register(96 << 10, TensorOpts::default()).unwrap();
    let (h, data) = recomputable(&mut m, &produced, &[x], 7, 128 << 10, 250.0);
    assert!(!m.drop_tensor(h).unwrap(), "pinned by its step");
    m.end_step();
    let before = m.allocator().stats().requested.current;
    assert!(m.drop_tensor(h).unwrap());
    assert_eq!(m.place(h).unwrap(), Place::Dropped);
    assert_eq!(
        m.allocator().stats().requested.current,
        before - (128 << 10)
    );
    assert_eq!(m.stats().host_bytes, 0);
    m.check_invariants().unwrap();
    // Its input can be spilled, not dropped (not recomputable), and is brought back.
    m.end_step();
    assert!(m.spill(x).unwrap());
    m.synchronize().unwrap();
    m.end_step();
    assert_eq!(read(&mut m, h).unwrap(), data);
    assert!(matches!(m.place(x).unwrap(), Place::Device { .. }));
    let s = m.stats();
    assert_eq!(
        (s.drops, s.recomputes, s.recomputed_bytes),
        (1, 1, 128 << 10)
    );
    assert_eq!(s.recompute_us, 250.0);
    assert_eq!(produced.lock().unwrap().runs, 1);
    m.check_invariants().unwrap();
    // An input freed while its dependent is dropped is kept for the recompute (out of
    // the caller's sight), and released by it; then the dependent is not recomputable.
    m.end_step();
    assert!(m.drop_tensor(h).unwrap());
    m.end_step();
    let held = m.allocator().stats().requested.current;
    m.free(x).unwrap();
    assert!(m.place(x).is_err() && m.len() == 1);
    assert_eq!(m.place(h).unwrap(), Place::Dropped);
    assert_eq!(m.allocator().stats().requested.current, held);
    m.check_invariants().unwrap();
    assert!(m.spill(x).is_err(), "the caller's handle is stale");
    m.end_step();
    assert_eq!(read(&mut m, h).unwrap(), data);
    assert_eq!(m.stats().recomputes, 2);
    assert_eq!(m.allocator().stats().requested.current, 128 << 10);
    assert!(!m.is_recomputable(h));
    m.end_step();
    assert!(!m.drop_tensor(h).unwrap());
    m.check_invariants().unwrap();
    m.shutdown().unwrap();

    // The clock: a simulated device's compute stream runs the recompute.
    let (alloc, cfg) = sim_parts();
    let mut m = TierManager::new(alloc, cfg).unwrap();
    m.set_producer(Box::new(super::recompute::TimeOnly));
    let opts = TensorOpts {
        recompute_us: 250.0,
        ..TensorOpts::default()
    };
    let h = m.register(1 << 20, opts).unwrap();
    m.set_recomputable(h, &[]).unwrap();
    m.end_step();
    assert!(m.drop_tensor(h).unwrap());
    let t0 = m.backend().now_us();
    m.access(h, false).unwrap();
    assert!(m.backend().now_us() - t0 >= 250.0);
    assert_eq!(m.stats().recompute_us, 250.0);
}

/// The producer inputs found from `TensorMeta` are tensors live when the tensor was
/// made, and recomputable tensors of the synthetic families have them; replays that
/// drop and recompute complete with every invariant, and charge each recompute.
#[test]
fn synthetic_tensors_are_recomputed_with_their_cost_charged() {
    use memcast_trace::synth::{generate, Family, SynthConfig};
    for fam in [Family::Mlp, Family::Cnn, Family::Transformer] {
        let cfg = SynthConfig {
            iterations: 2,
            ..SynthConfig::preset(fam)
        };
        let t = generate(&cfg).unwrap();
        let ins = super::replay::producer_inputs(&t);
        let by_id: std::collections::HashMap<u64, &memcast_trace::TensorMeta> =
            t.tensors.iter().map(|x| (x.id, x)).collect();
        let mut listed = 0;
        for (id, v) in &ins {
            let a = by_id[id].alloc_event.unwrap();
            for u in v {
                let u = by_id[u];
                assert!(u.alloc_event.is_none_or(|x| x < a) && u.free_event.is_none_or(|f| f > a));
            }
            listed += !v.is_empty() as usize;
        }
        assert!(listed > 0, "{fam:?}: no producer inputs");
        let mut opts = TierReplayOptions {
            budget: Budget::Fraction(0.6),
            check_every: 97,
            ..Default::default()
        };
        let r0 = replay_budgeted(&t, &opts).unwrap();
        assert_eq!((r0.drops, r0.recomputes), (0, 0), "off by default");
        opts.tier.recompute = true;
        let r = replay_budgeted(&t, &opts).unwrap();
        assert!(r.completed, "{fam:?}: {:?}", r.error);
        assert!(r.recomputes <= r.drops);
        assert!(r.stall_us >= r.recompute_us);
        if fam != Family::Mlp {
            assert!(
                r.recomputes > 0 && r.recompute_us > 0.0,
                "{fam:?}: nothing recomputed"
            );
        }
    }
}

/// The drop-or-spill rule prices copies with the spill cost's own measured link, so a
/// manager given the H100's costs does not keep the H200's for recomputation.
#[test]
fn the_recompute_rule_takes_the_spill_costs_model() {
    use crate::backend::sim::CostModel;
    let (alloc, cfg) = sim_parts();
    let cost = super::spill::LinkCost {
        model: CostModel::h100(),
    };
    let m = TierManager::with_policies(
        alloc,
        cfg,
        Box::new(super::spill::LruK::default()),
        Box::new(cost),
        Box::new(super::prefetch::NoPrefetch),
    )
    .unwrap();
    assert_eq!(m.recompute.model, CostModel::h100());
    assert_ne!(CostModel::h100(), CostModel::default());
}
