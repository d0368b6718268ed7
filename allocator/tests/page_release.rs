//! Page release (`AllocConfig::page_release`): the whole free pages inside a growable
//! segment give their memory back; placement does not change, data never moves.

use memcast_alloc::backend::host::HostBackend;
use memcast_alloc::backend::layers::FailOnDemand;
use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::backend::{DeviceBackend, MemRef, StreamPriority};
use memcast_alloc::config::{AllocConfig, PageRelease};
use memcast_alloc::{AllocError, Allocation, Allocator};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

fn cfg(mode: PageRelease) -> AllocConfig {
    AllocConfig {
        page_release: mode,
        // Growth by the deficit only: the reserved bytes below follow by hand.
        growth_initial: 2 * MIB,
        ..AllocConfig::default()
    }
}

/// Worked by hand: A, B, C of 4 MiB, B freed (a hole of two pages), D of 6 MiB does not
/// fit the hole: with `peak` the hole's pages back D's growth, so reserved stays 14 MiB
/// where it is 18 MiB without; E of 4 MiB then goes into the hole (best fit: the same
/// place either way) and takes two pages from D's freed tail.
#[test]
fn a_hole_lends_its_pages_to_the_growth_and_gets_them_back() {
    let run = |mode| {
        let mut a = Allocator::new(HostBackend::new(1 << 30), cfg(mode)).unwrap();
        let x = a.allocate(4 * MIB, 0).unwrap();
        let b = a.allocate(4 * MIB, 0).unwrap();
        let c = a.allocate(4 * MIB, 0).unwrap();
        a.deallocate(b, 0).unwrap();
        let d = a.allocate(6 * MIB, 0).unwrap();
        let peak_after_d = a.stats().reserved.peak;
        a.deallocate(d, 0).unwrap();
        let e = a.allocate(4 * MIB, 0).unwrap();
        a.check_invariants().unwrap();
        // Offsets from A: the host backend's segments lie wherever the system
        // allocator puts them, which differs between the two allocators.
        let ptrs = [x, c, d, e].map(|h| h.ptr.0 - x.ptr.0);
        (
            ptrs,
            peak_after_d,
            a.stats().reserved.peak,
            a.stats().pages_released,
        )
    };
    let (p_off, d_off, peak_off, rel_off) = run(PageRelease::Off);
    let (p_peak, d_peak, peak_peak, rel_peak) = run(PageRelease::Peak);
    assert_eq!(
        p_off, p_peak,
        "the same places with and without page release"
    );
    assert_eq!(p_peak[3], p_peak[0] + 4 * MIB, "E goes into B's hole");
    assert_eq!((d_off, peak_off, rel_off), (18 * MIB, 18 * MIB, 0));
    assert_eq!((d_peak, peak_peak), (14 * MIB, 14 * MIB));
    assert_eq!(
        rel_peak, 4,
        "two pages of the hole, then two of D's freed tail"
    );
}

/// A device error other than out of memory while backing released pages under a
/// carved run is the caller's error, named as the device gave it: not a miss that
/// quietly puts the run elsewhere. The carve is undone, the allocator stays consistent,
/// and the same request then goes where it would have gone.
#[test]
fn a_device_error_backing_released_pages_is_returned_not_a_miss() {
    let (fail, switch) = FailOnDemand::new(HostBackend::new(1 << 30));
    let mut a = Allocator::new(fail, cfg(PageRelease::Peak)).unwrap();
    // As above: B's hole lends its two pages to D's growth.
    let x = a.allocate(4 * MIB, 0).unwrap();
    let b = a.allocate(4 * MIB, 0).unwrap();
    let c = a.allocate(4 * MIB, 0).unwrap();
    a.deallocate(b, 0).unwrap();
    let d = a.allocate(6 * MIB, 0).unwrap();
    a.deallocate(d, 0).unwrap();
    assert!(a.stats().pages_released > 0);
    let reserved = a.stats().reserved.current;
    // E goes into the hole, whose pages must be backed again: the map fails.
    switch.fail_next_maps(1);
    let e = a.allocate(4 * MIB, 0).unwrap_err();
    assert!(
        matches!(&e, AllocError::Backend(b) if b.to_string().contains("page map")),
        "{e}"
    );
    assert_eq!(switch.injected(), 1);
    a.check_invariants().unwrap();
    // Nothing backed, nothing grown (pages freed elsewhere to make room for the
    // backing may stay released).
    assert!(a.stats().reserved.current <= reserved);
    assert_eq!(a.stats().allocated.current, 8 * MIB);
    // The same request, the device well again: B's hole, as without the error.
    let e = a.allocate(4 * MIB, 0).unwrap();
    assert_eq!(e.ptr.0, x.ptr.0 + 4 * MIB);
    for h in [x, c, e] {
        a.deallocate(h, 0).unwrap();
    }
    a.check_invariants().unwrap();
}

/// Out of memory, `on_oom` (the default) releases the free pages inside the segment,
/// and the request that did not fit is served; `off` fails it.
#[test]
fn on_oom_the_free_pages_inside_the_segment_serve_the_request() {
    let run = |mode| {
        let mut a = Allocator::new(HostBackend::new(16 * MIB), cfg(mode)).unwrap();
        let mut keep = Vec::new();
        let mut holes = Vec::new();
        for i in 0..4 {
            let h = a.allocate(2 * MIB, 0).unwrap();
            if i % 2 == 0 {
                holes.push(h);
            } else {
                keep.push(h);
            }
        }
        // 8 MiB used; two holes of one page each.
        for h in holes {
            a.deallocate(h, 0).unwrap();
        }
        // 4 MiB live, 8 MiB mapped; 10 MiB more needs 18 > 16 MiB without the holes.
        let r = a.allocate(10 * MIB, 0);
        a.check_invariants().unwrap();
        r.map(|x: Allocation| x.size)
    };
    assert!(matches!(
        run(PageRelease::Off),
        Err(memcast_alloc::AllocError::OutOfMemory { .. })
    ));
    assert_eq!(run(PageRelease::OnOom).unwrap(), 10 * MIB);
}

#[test]
fn host_pages_released_refuse_access_and_come_back_poisoned() {
    let mut b = HostBackend::new(64 * MIB);
    let base = b.reserve_growable(1 << 30).unwrap();
    b.grow(base, 0, 8 * MIB).unwrap();
    b.write(MemRef::Device(base.offset(2 * MIB)), &[7; 16])
        .unwrap();
    b.unmap_pages(base, 2 * MIB, 4 * MIB, 0).unwrap();
    assert_eq!(b.used(), 4 * MIB);
    assert!(b.write(MemRef::Device(base.offset(3 * MIB)), &[1]).is_err());
    assert!(b
        .write(MemRef::Device(base.offset(2 * MIB - 1)), &[1, 2])
        .is_err());
    b.write(MemRef::Device(base.offset(6 * MIB)), &[1]).unwrap();
    assert!(b.unmap_pages(base, 2 * MIB, 2 * MIB, 0).is_err(), "twice");
    assert!(b.map_pages(base, 0, 2 * MIB).is_err(), "a backed page");
    assert!(
        b.unmap_pages(base, 8 * MIB, 2 * MIB, 0).is_err(),
        "beyond the mapped range"
    );
    b.map_pages(base, 2 * MIB, 2 * MIB).unwrap();
    let mut out = [0u8; 16];
    b.read(MemRef::Device(base.offset(2 * MIB)), &mut out)
        .unwrap();
    assert_eq!(out, [0xA5; 16], "backed again: no earlier bytes");
    // A shrink over a released page gives back only the backed ones.
    b.shrink(base, 8 * MIB, 6 * MIB).unwrap();
    assert_eq!(b.used(), 2 * MIB);
    b.release_growable(base, 2 * MIB).unwrap();
    assert_eq!(b.used(), 0);
}

#[test]
fn sim_pages_cost_a_call_per_page_and_keep_the_count() {
    let mut b = SimBackend::h200();
    let base = b.reserve_growable(1 << 40).unwrap();
    b.grow(base, 0, 8 * MIB).unwrap();
    let t = b.now_us();
    b.unmap_pages(base, 0, 4 * MIB, 0).unwrap();
    assert!(b.now_us() > t);
    assert_eq!(b.used(), 4 * MIB);
    assert!(b.map_pages(base, 4 * MIB, 2 * MIB).is_err(), "backed");
    b.map_pages(base, 2 * MIB, 2 * MIB).unwrap();
    assert_eq!(b.used(), 6 * MIB);
    b.release_growable(base, 8 * MIB).unwrap();
    assert_eq!(b.used(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]

    /// The same program places every run at the same offset whatever the page-release
    /// setting (no device limit), never reserves more with it, and keeps every byte.
    #[test]
    fn page_release_changes_no_place_and_no_byte(
        ops in proptest::collection::vec((0u8..3, (64u64 << 10)..(12 << 20), any::<usize>()), 1..200),
    ) {
        let run = |mode: PageRelease| {
            let mut a = Allocator::new(HostBackend::new(1 << 30), cfg(mode)).unwrap();
            let mut live: Vec<(Allocation, u8)> = Vec::new();
            let mut ptrs = Vec::new();
            for (i, &(kind, bytes, pick)) in ops.iter().enumerate() {
                if kind > 0 || live.is_empty() {
                    let h = a.allocate(bytes, 0).unwrap();
                    let tag = i as u8;
                    let n = h.size.min(4096) as usize;
                    a.backend_mut().write(MemRef::Device(h.ptr), &vec![tag; n]).unwrap();
                    let end = h.ptr.offset(h.size - n as u64);
                    a.backend_mut().write(MemRef::Device(end), &vec![tag; n]).unwrap();
                    ptrs.push(h.ptr.0);
                    live.push((h, tag));
                } else {
                    let (h, tag) = live.swap_remove(pick % live.len());
                    let n = h.size.min(4096) as usize;
                    for at in [h.ptr, h.ptr.offset(h.size - n as u64)] {
                        let mut buf = vec![0u8; n];
                        a.backend_mut().read(MemRef::Device(at), &mut buf).unwrap();
                        assert!(buf.iter().all(|&b| b == tag), "bytes of {h:?} lost");
                    }
                    a.deallocate(h, 0).unwrap();
                }
                a.check_invariants().unwrap();
            }
            // Offsets in the large-run segment (every size here is a large run; the
            // first run is at its start).
            let base = ptrs[0];
            let offs: Vec<u64> = ptrs.iter().map(|p| p - base).collect();
            (offs, a.stats().reserved.peak)
        };
        let (p_off, peak_off) = run(PageRelease::Off);
        for mode in [PageRelease::OnOom, PageRelease::Peak] {
            let (p, peak) = run(mode);
            prop_assert_eq!(&p, &p_off);
            prop_assert!(peak <= peak_off, "{:?}: {} > {}", mode, peak, peak_off);
        }
    }
}

/// A page release waits for the stream that owns the pages, not for the device: a
/// copy in flight on another stream (a spill, a prefetch) does not hold it up.
#[test]
fn sim_page_release_waits_for_its_stream_only() {
    let mut b = SimBackend::h200();
    let unmap_us = b.cost_model().unmap_page_us;
    let base = b.reserve_growable(1 << 40).unwrap();
    b.grow(base, 0, 8 * MIB).unwrap();
    let copies = b.create_stream(StreamPriority::Low).unwrap();
    let host = b.allocate_host(1 << 30, true).unwrap();
    let src = b.allocate(1 << 30, 0).unwrap();
    // ~20 ms over the host link.
    b.copy(
        MemRef::Host(host),
        MemRef::Device(src),
        1 << 30,
        Some(copies),
    )
    .unwrap();
    let t = b.now_us();
    b.unmap_pages(base, 0, 2 * MIB, 0).unwrap();
    assert!(
        (b.now_us() - t - unmap_us).abs() < 1e-6,
        "waited {} us for a copy on another stream",
        b.now_us() - t
    );
    b.unmap_pages(base, 2 * MIB, 2 * MIB, copies).unwrap();
    assert!(
        b.now_us() - t > 10_000.0,
        "did not wait for the copy's stream"
    );
}

/// A repeating training loop (GPT-2 with activation checkpointing, recorded on an
/// H200) under `page_release:peak`: best fit's layout repeats each iteration but holds
/// data on more pages over the iteration than at its peak, so the same pages move every
/// iteration. With planned placement the loop is placed by a plan of its iteration (no
/// higher than what the iteration used), and once that plan serves no page moves.
#[test]
fn with_planned_placement_a_repeating_loop_stops_moving_pages() {
    use memcast_alloc::replay::{run, ReplayOptions};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../training-data/corpus/train/gpt2_b16_s512_bf16_ckpt.mctrace");
    let t = memcast_trace::io::load_trace(&path).unwrap();
    let replay = |conf: &str| {
        let cfg = AllocConfig::default().with_conf_string(conf).unwrap();
        let opts = ReplayOptions {
            config: cfg.clone(),
            check_every: 4096,
            ..Default::default()
        };
        let a =
            Allocator::new(SimBackend::new(opts.sim_capacity, Default::default()), cfg).unwrap();
        run(&t, a, &opts).unwrap()
    };
    let best_fit = replay("page_release:peak");
    let planned = replay("page_release:peak,placement:planned");
    let tail = |v: &[u64]| v[v.len() - 4..].to_vec();
    assert_eq!(best_fit.pages_moved_per_iteration.len(), 8);
    assert!(
        tail(&best_fit.pages_moved_per_iteration)
            .iter()
            .all(|&n| n > 1000),
        "best fit: {:?}",
        best_fit.pages_moved_per_iteration
    );
    assert_eq!(
        tail(&planned.pages_moved_per_iteration),
        [0; 4],
        "planned: {:?}",
        planned.pages_moved_per_iteration
    );
    assert_eq!(tail(&planned.device_calls_per_iteration), [0; 4]);
    // Both at the peak of the pages that hold data (best fit without page release:
    // 16.3%).
    for r in [&best_fit, &planned] {
        assert!(r.reserved_overhead < 0.01, "{}", r.reserved_overhead);
    }
}
