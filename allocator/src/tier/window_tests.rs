//! The out-of-memory path on a hand-made fragmented layout: by address
//! (`TierConfig::oom_by_address`) and by relocation on the device
//! (`TierConfig::relocate`).

use crate::backend::host::HostBackend;
use crate::backend::sim::SimBackend;
use crate::backend::{DeviceBackend, MemRef};
use crate::config::AllocConfig;
use crate::pool::Allocator;

use super::manager::{TensorOpts, TierManager};
use super::TierConfig;

const SLOT: u64 = 64 << 10;
const DEVICE: u64 = 2 << 20;

/// A 2 MiB device of 32 slots of 64 KiB: tensors at the even slots, the odd ones free
/// (1 MiB free, no free block above 64 KiB). Every tensor was accessed twice, in the
/// order 0, 4, 8, .., 28, then 2, 6, .., 30, so LRU-K's victims come one slot in four
/// first: each spill opens only 3 slots. Without relocation.
fn fragmented(by_address: bool) -> (TierManager<SimBackend>, Vec<super::TensorHandle>) {
    let lru = Box::new(super::spill::LruK { k: 2 });
    let order = Box::new(super::prefetch::PreviousIterationOrder::new(2048));
    fragmented_with(by_address, lru, order)
}

/// [`fragmented`] with the spill and prefetch policies given.
fn fragmented_with(
    by_address: bool,
    spill: Box<dyn super::spill::SpillPolicy>,
    prefetch: Box<dyn super::prefetch::PrefetchPolicy>,
) -> (TierManager<SimBackend>, Vec<super::TensorHandle>) {
    let sim = SimBackend::new(DEVICE, Default::default());
    fragmented_on(sim, (by_address, false), spill, prefetch)
}

/// A budget of `budget` bytes with no watermark spills and no prefetches: only the
/// out-of-memory path moves tensors.
fn oom_path_only(budget: u64) -> TierConfig {
    TierConfig {
        budget,
        high_watermark: 1.0,
        low_watermark: 1.0,
        prefetch_watermark: 0.01,
        staging_bytes: 4 << 20,
        ..TierConfig::default()
    }
}

/// [`fragmented`] on `backend`, with `oom_by_address` and `relocate` as given.
fn fragmented_on<B: DeviceBackend>(
    backend: B,
    (by_address, relocate): (bool, bool),
    spill: Box<dyn super::spill::SpillPolicy>,
    prefetch: Box<dyn super::prefetch::PrefetchPolicy>,
) -> (TierManager<B>, Vec<super::TensorHandle>) {
    let alloc = Allocator::new(
        backend,
        AllocConfig {
            growable_segments: false,
            ..AllocConfig::default()
        },
    )
    .unwrap();
    let cfg = TierConfig {
        oom_by_address: by_address,
        relocate,
        ..oom_path_only(DEVICE)
    };
    let cost = Box::new(super::spill::LinkCost::default());
    let mut m = TierManager::with_policies(alloc, cfg, spill, cost, prefetch).unwrap();
    let mut hs = Vec::new();
    for _ in 0..DEVICE / SLOT {
        hs.push(m.register(SLOT, TensorOpts::default()).unwrap());
        m.end_step();
    }
    let mut by_addr = hs.clone();
    by_addr.sort_by_key(|&h| m.reg.get(h).unwrap().place.device().unwrap().ptr.0);
    for &h in by_addr.iter().skip(1).step_by(2) {
        m.free(h).unwrap();
    }
    let order = (0..32)
        .step_by(4)
        .chain((2..32).step_by(4))
        .map(|i| by_addr[i]);
    for h in order {
        for _ in 0..2 {
            m.backend_mut().advance_us(10.0);
            m.access(h, false).unwrap();
            m.end_step();
        }
    }
    m.backend_mut().advance_us(10.0);
    m.check_invariants().unwrap();
    let (free, largest) = m.allocator().free_and_largest();
    assert_eq!(
        (free, largest),
        (DEVICE / 2, SLOT),
        "the layout is not the one meant"
    );
    (m, by_addr)
}

#[test]
fn a_window_by_address_opens_the_block_in_one_round() {
    // The spill policy's order: 5 slots' worth per round, 3 slots open each time; the
    // second round joins two of them.
    let (mut lru, _) = fragmented(false);
    lru.register(5 * SLOT, TensorOpts::default()).unwrap();
    lru.check_invariants().unwrap();
    assert_eq!(lru.stats().sync_spills, 2);
    assert_eq!(lru.stats().oom_spilled_bytes, 10 * SLOT);
    assert_eq!(lru.stats().oom_windows, 0);

    // By address: the window of 5 slots starting at a free slot holds 2 tensors.
    let (mut m, by_addr) = fragmented(true);
    let h = m.register(5 * SLOT, TensorOpts::default()).unwrap();
    m.check_invariants().unwrap();
    assert_eq!(m.stats().sync_spills, 1);
    assert_eq!(m.stats().oom_windows, 1);
    assert_eq!(m.stats().oom_spilled_bytes, 2 * SLOT);
    // The lowest such window: slots 1..6, so tensors 2 and 4 left and the block is at
    // slot 1.
    let base = m.reg.get(by_addr[0]).unwrap().place.device().unwrap().ptr.0;
    let at = m.reg.get(h).unwrap().place.device().unwrap().ptr.0;
    assert_eq!(at, base + SLOT);
    for (i, &t) in by_addr.iter().enumerate().step_by(2) {
        let on_device = m.reg.get(t).unwrap().place.device().is_some();
        assert_eq!(on_device, i != 2 && i != 4, "tensor at slot {i}");
    }
}

#[test]
fn pinned_tensors_bound_every_window_and_the_policy_serves_the_rest() {
    // Tensors at slots 0, 4, .., 28 are pinned by the current step: every run of 5
    // slots holds one, so there is no window; the policy's order spills the others,
    // which opens runs of 3 slots only, and the request fails (fragmentation) with
    // every pinned tensor still on the device.
    let (mut m, by_addr) = fragmented(true);
    for &h in by_addr.iter().step_by(4) {
        m.access(h, false).unwrap();
    }
    let e = m.register(5 * SLOT, TensorOpts::default()).unwrap_err();
    assert!(e.to_string().contains("fragmentation"), "{e}");
    m.check_invariants().unwrap();
    assert_eq!(m.stats().oom_windows, 0);
    assert!(m.stats().sync_spills >= 1);
    for &h in by_addr.iter().step_by(4) {
        assert!(m.reg.get(h).unwrap().place.device().is_some());
    }
}

/// A prefetch policy that predicts the next read of some tensors (the next
/// operation) and of no other, and prefetches nothing.
struct Soon(std::sync::Arc<std::sync::Mutex<Vec<super::handle::TensorKey>>>);

impl super::prefetch::PrefetchPolicy for Soon {
    fn on_access(&mut self, _: super::handle::TensorKey) {}
    fn on_iteration(&mut self) {}
    fn plan(
        &mut self,
        _: &dyn super::prefetch::PrefetchView,
        _: u64,
        _: &mut Vec<super::TensorHandle>,
    ) {
    }
    fn next_use(&self, key: super::handle::TensorKey) -> f64 {
        if self.0.lock().unwrap().contains(&key) {
            0.0
        } else {
            f64::INFINITY
        }
    }
    fn name(&self) -> &'static str {
        "soon"
    }
}

/// With victims by next use, a window whose tensors are read by the next operation
/// costs more than one of the same bytes whose tensors are not read again: with every
/// tensor but those at slots 6 and 8 predicted to be read next, the window of slots
/// 5..10 (tensors 6 and 8) is chosen, not the lowest one (slots 1..6, tensors 2 and 4)
/// that the round trip alone picks.
#[test]
fn a_window_of_tensors_read_next_costs_more() {
    let soon = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let spill = Box::new(super::spill::FarthestNextUse::default());
    let (mut m, by_addr) = fragmented_with(true, spill, Box::new(Soon(soon.clone())));
    for (i, &t) in by_addr.iter().enumerate().step_by(2) {
        if i != 6 && i != 8 {
            soon.lock().unwrap().push(m.reg.get(t).unwrap().key);
        }
    }
    let h = m.register(5 * SLOT, TensorOpts::default()).unwrap();
    m.check_invariants().unwrap();
    assert_eq!(m.stats().oom_windows, 1);
    assert_eq!(m.stats().oom_spilled_bytes, 2 * SLOT);
    let base = m.reg.get(by_addr[0]).unwrap().place.device().unwrap().ptr.0;
    let at = m.reg.get(h).unwrap().place.device().unwrap().ptr.0;
    assert_eq!(at, base + 5 * SLOT);
    for (i, &t) in by_addr.iter().enumerate().step_by(2) {
        let on_device = m.reg.get(t).unwrap().place.device().is_some();
        assert_eq!(on_device, i != 6 && i != 8, "tensor at slot {i}");
    }
}

/// Relocation: the window of 5 slots holding the fewest tensor bytes (slots 1..6,
/// tensors 2 and 4) is opened by moving its two tensors into free slots outside it,
/// on the device: no spill, every tensor still resident, the request served at slot 1,
/// and every tensor's bytes where its handle now points (the host backend holds real
/// bytes).
#[test]
fn relocation_opens_the_block_on_the_device() {
    let lru = Box::new(super::spill::LruK { k: 2 });
    let order = Box::new(super::prefetch::PreviousIterationOrder::new(2048));
    let (mut m, by_addr) = fragmented_on(HostBackend::new(DEVICE), (true, true), lru, order);
    let live: Vec<_> = by_addr.iter().copied().step_by(2).collect();
    let fill = |i: usize| vec![i as u8 + 1; SLOT as usize];
    for (i, &t) in live.iter().enumerate() {
        let p = m.access(t, true).unwrap();
        m.backend_mut().write(MemRef::Device(p), &fill(i)).unwrap();
        m.end_step();
    }
    let base = m.reg.get(by_addr[0]).unwrap().place.device().unwrap().ptr.0;
    let h = m.register(5 * SLOT, TensorOpts::default()).unwrap();
    m.end_step();
    m.check_invariants().unwrap();
    let s = m.stats();
    assert_eq!((s.relocations, s.relocated_bytes), (1, 2 * SLOT));
    assert_eq!((s.spills, s.sync_spills, s.oom_windows), (0, 0, 0));
    let at = m.reg.get(h).unwrap().place.device().unwrap().ptr.0;
    assert_eq!(at, base + SLOT);
    let mut got = vec![0u8; SLOT as usize];
    for (i, &t) in live.iter().enumerate() {
        assert!(
            m.reg.get(t).unwrap().place.device().is_some(),
            "tensor {i} left"
        );
        let p = m.access(t, false).unwrap();
        m.backend_mut().read(MemRef::Device(p), &mut got).unwrap();
        assert_eq!(got, fill(i), "tensor {i}'s bytes");
        m.end_step();
    }
    assert_eq!(m.stats().faults, 0);
}

/// Where no window's tensors fit outside it, relocation moves nothing (every target it
/// took is given back) and the path goes over the link as before. Eight slots: A (two
/// slots) at 0, B at 3, C at 5, D at 7, slots 2, 4 and 6 free; B and C pinned by the
/// step. The one window of three slots is A's and slot 2, and no free block outside it
/// holds A: A is spilled and the request goes at slot 0.
#[test]
fn relocation_that_cannot_place_a_tensor_moves_nothing() {
    // Slots of 256 KiB: the device is one segment granule (2 MiB).
    let (device, slot_bytes) = (DEVICE, DEVICE / 8);
    let alloc = Allocator::new(
        HostBackend::new(device),
        AllocConfig {
            growable_segments: false,
            growth_initial: device,
            ..AllocConfig::default()
        },
    )
    .unwrap();
    let mut m = TierManager::new(alloc, oom_path_only(device)).unwrap();
    let mut hs = Vec::new();
    for slots in [2, 1, 1, 1, 1, 1, 1] {
        hs.push(
            m.register(slots * slot_bytes, TensorOpts::default())
                .unwrap(),
        );
        m.end_step();
    }
    let base = m.reg.get(hs[0]).unwrap().place.device().unwrap().ptr.0;
    let slot = |m: &TierManager<HostBackend>, h| {
        (m.reg.get(h).unwrap().place.device().unwrap().ptr.0 - base) / slot_bytes
    };
    let at: Vec<u64> = hs.iter().map(|&h| slot(&m, h)).collect();
    assert_eq!(at, [0, 2, 3, 4, 5, 6, 7], "the layout is not the one meant");
    for i in [1, 3, 5] {
        m.free(hs[i]).unwrap();
    }
    let (a, b, c) = (hs[0], hs[2], hs[4]);
    m.access(b, false).unwrap();
    m.access(c, false).unwrap();
    let allocated = m.allocator().stats().allocated.current;
    let h = m.register(3 * slot_bytes, TensorOpts::default()).unwrap();
    m.check_invariants().unwrap();
    let s = m.stats();
    assert_eq!((s.relocations, s.relocated_bytes), (0, 0));
    assert_eq!(s.oom_windows, 1);
    assert!(
        m.reg.get(a).unwrap().place.device().is_none(),
        "A was not spilled"
    );
    assert_eq!(slot(&m, h), 0);
    assert_eq!(
        m.allocator().stats().allocated.current,
        allocated + slot_bytes,
        "a target of the undone round was kept"
    );
}
