//! Property tests: random programs of alloc / free / stream changes against a simple
//! model, on the `host` backend (real bytes: every allocation is stamped and the stamp
//! is verified at free time, which also catches overlaps), with `check_invariants()`
//! after every step.

use std::collections::BTreeMap;

use memcast_alloc::backend::host::HostBackend;
use memcast_alloc::backend::{DeviceBackend, MemRef, StreamPriority};
use memcast_alloc::config::{AllocConfig, Coalesce, PageRelease, Release};
use memcast_alloc::policy::Advice;
use memcast_alloc::{AllocError, Allocation, Allocator};
use proptest::prelude::*;

mod common;
use common::stamp;

#[derive(Debug, Clone)]
enum Op {
    Alloc { bytes: u64, stream: u32 },
    Free { pick: usize },
    FreePtr { pick: usize },
    RecordStream { pick: usize, stream: u32 },
    EmptyCache,
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..4096,
        3 => 4096u64..(1 << 20),
        2 => (1u64 << 20)..(6 << 20),
        1 => Just(1u64 << 20),
        1 => (1u64..=8).prop_map(|k| k << 20),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (size(), 0u32..3).prop_map(|(bytes, stream)| Op::Alloc { bytes, stream }),
        3 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => any::<usize>().prop_map(|pick| Op::FreePtr { pick }),
        1 => (any::<usize>(), 0u32..3).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        1 => Just(Op::EmptyCache),
    ]
}

fn config() -> impl Strategy<Value = AllocConfig> {
    (any::<bool>(), any::<bool>(), any::<bool>(), 0u8..3).prop_map(
        |(growable, deferred, best_fit, pages)| AllocConfig {
            growable_segments: growable,
            page_release: [PageRelease::Off, PageRelease::OnOom, PageRelease::Peak][pages as usize],
            coalesce: if deferred {
                Coalesce::Deferred
            } else {
                Coalesce::Immediate
            },
            best_fit,
            cache_max_runs: 8,
            ..AllocConfig::default()
        },
    )
}

fn write_stamps(al: &mut Allocator<HostBackend>, a: &Allocation) {
    let s = stamp(a);
    al.backend_mut().write(MemRef::Device(a.ptr), &s).unwrap();
    if a.size >= 64 {
        let tail = a.ptr.offset(a.size - s.len() as u64);
        al.backend_mut().write(MemRef::Device(tail), &s).unwrap();
    }
}

fn check_stamps(al: &mut Allocator<HostBackend>, a: &Allocation) {
    let s = stamp(a);
    let mut buf = vec![0u8; s.len()];
    al.backend_mut()
        .read(MemRef::Device(a.ptr), &mut buf)
        .unwrap();
    assert_eq!(buf, s, "head of {:?} overwritten", a);
    if a.size >= 64 {
        let tail = a.ptr.offset(a.size - s.len() as u64);
        al.backend_mut()
            .read(MemRef::Device(tail), &mut buf)
            .unwrap();
        assert_eq!(buf, s, "tail of {:?} overwritten", a);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn random_programs_match_the_model(cfg in config(), ops in proptest::collection::vec(op(), 1..160)) {
        let backend = HostBackend::new(256 << 20);
        let mut al = Allocator::new(backend, cfg).unwrap();
        for _ in 0..2 {
            al.create_stream(StreamPriority::Normal).unwrap();
        }
        // Model: live allocations with their stream.
        let mut live: Vec<(Allocation, u32)> = Vec::new();
        let mut requested = 0u64;
        for op in ops {
            match op {
                Op::Alloc { bytes, stream } => {
                    let a = al.allocate(bytes, stream).unwrap();
                    prop_assert_eq!(a.size, bytes);
                    prop_assert_eq!(a.ptr.0 % 256, 0, "alignment");
                    write_stamps(&mut al, &a);
                    live.push((a, stream));
                    requested += bytes;
                }
                Op::Free { pick } | Op::FreePtr { pick } if !live.is_empty() => {
                    let (a, s) = live.swap_remove(pick % live.len());
                    check_stamps(&mut al, &a);
                    if matches!(op, Op::FreePtr { .. }) {
                        prop_assert_eq!(al.deallocate_ptr(a.ptr, s).unwrap(), a.size);
                    } else {
                        al.deallocate(a, s).unwrap();
                    }
                    requested -= a.size;
                }
                Op::RecordStream { pick, stream } if !live.is_empty() => {
                    let (a, _) = live[pick % live.len()];
                    al.record_stream(&a, stream).unwrap();
                }
                Op::EmptyCache => {
                    al.empty_cache().unwrap();
                }
                _ => {}
            }
            al.check_invariants().unwrap();
            prop_assert_eq!(al.stats().requested.current, requested);
            // No two live allocations overlap.
            let mut spans: BTreeMap<u64, u64> = BTreeMap::new();
            for (a, _) in &live {
                spans.insert(a.ptr.0, a.ptr.0 + a.size);
            }
            let mut end = 0;
            for (&s, &e) in &spans {
                prop_assert!(s >= end, "overlap at {:#x}", s);
                end = e;
            }
        }
        for (a, s) in live.drain(..) {
            check_stamps(&mut al, &a);
            al.deallocate(a, s).unwrap();
        }
        al.check_invariants().unwrap();
        // Everything freed: after coalescing, every segment is one free extent...
        al.coalesce().unwrap();
        al.check_invariants().unwrap();
        prop_assert!(al.fully_coalesced());
        prop_assert_eq!(al.stats().allocated.current, 0);
        // ...and all of it goes back to the device.
        al.empty_cache().unwrap();
        al.check_invariants().unwrap();
        prop_assert_eq!(al.stats().reserved.current, 0);
        prop_assert_eq!(al.backend().used(), 0);
    }
}

#[derive(Debug, Clone)]
enum AdviceOp {
    Alloc { bytes: u64, stream: u32 },
    Free { pick: usize },
    Advice(Advice),
    Coalesce,
}

fn advice() -> impl Strategy<Value = Advice> {
    prop_oneof![
        (0u32..3, 0u64..(64 << 20))
            .prop_map(|(stream, bytes)| Advice::EnsureFree { stream, bytes }),
        (0u32..3, size(), 0u32..6).prop_map(|(stream, bytes, count)| Advice::PreSplit {
            stream,
            bytes,
            count
        }),
        (0u32..3, 0u64..(32 << 20))
            .prop_map(|(stream, keep_bytes)| Advice::Trim { stream, keep_bytes }),
        (0u32..3, 0u64..(32 << 20))
            .prop_map(|(stream, keep_bytes)| Advice::TrimTail { stream, keep_bytes }),
    ]
}

fn advice_op() -> impl Strategy<Value = AdviceOp> {
    prop_oneof![
        5 => (size(), 0u32..3).prop_map(|(bytes, stream)| AdviceOp::Alloc { bytes, stream }),
        3 => any::<usize>().prop_map(|pick| AdviceOp::Free { pick }),
        3 => advice().prop_map(AdviceOp::Advice),
        1 => Just(AdviceOp::Coalesce),
    ]
}

fn advice_config() -> impl Strategy<Value = AllocConfig> {
    (config(), 0u32..3, any::<bool>()).prop_map(|(cfg, spares, immediate)| AllocConfig {
        slab_spares: spares,
        release: if immediate {
            Release::Immediate
        } else {
            Release::OnOom
        },
        ..cfg
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Forecasts are only advice: random advice (grow ahead, pre-split, trim) mixed into
    /// random programs on a small device, where requests and advice run out of memory,
    /// never corrupts data or the allocator. An out-of-memory request is an error that
    /// leaves everything as it was; advice that cannot be followed is ignored.
    #[test]
    fn random_advice_never_costs_correctness(
        cfg in advice_config(),
        ops in proptest::collection::vec(advice_op(), 1..160),
    ) {
        let mut al = Allocator::new(HostBackend::new(48 << 20), cfg).unwrap();
        for _ in 0..2 {
            al.create_stream(StreamPriority::Normal).unwrap();
        }
        let mut live: Vec<(Allocation, u32)> = Vec::new();
        for op in ops {
            match op {
                AdviceOp::Alloc { bytes, stream } => match al.allocate(bytes, stream) {
                    Ok(a) => {
                        write_stamps(&mut al, &a);
                        live.push((a, stream));
                    }
                    Err(e) => prop_assert!(
                        matches!(e, AllocError::OutOfMemory { .. }),
                        "unexpected error {e}"
                    ),
                },
                AdviceOp::Free { pick } if !live.is_empty() => {
                    let (a, s) = live.swap_remove(pick % live.len());
                    check_stamps(&mut al, &a);
                    al.deallocate(a, s).unwrap();
                }
                AdviceOp::Advice(adv) => al.apply_advice(adv).unwrap(),
                AdviceOp::Coalesce => al.coalesce().unwrap(),
                _ => {}
            }
            al.check_invariants().unwrap();
            prop_assert!(al.stats().reserved.current <= 48 << 20);
        }
        for (a, s) in live.drain(..) {
            check_stamps(&mut al, &a);
            al.deallocate(a, s).unwrap();
        }
        al.empty_cache().unwrap();
        al.check_invariants().unwrap();
        prop_assert_eq!(al.stats().reserved.current, 0);
        prop_assert_eq!(al.backend().used(), 0);
    }
}
