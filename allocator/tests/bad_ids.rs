//! Every public entry point that takes an id from its caller (a stream, an allocation
//! handle, a pointer, a tensor handle), driven with ids in range, out of range (up to
//! `u32::MAX`), stale (freed) and foreign (from another allocator or manager, whose
//! ids run past this one's tables): a typed error or success, never a panic, and
//! `check_invariants()` holds after every call.

use memcast_alloc::backend::host::HostBackend;
use memcast_alloc::backend::{DevicePtr, StreamPriority};
use memcast_alloc::config::AllocConfig;
use memcast_alloc::policy::Advice;
use memcast_alloc::tier::manager::{TensorOpts, TierManager};
use memcast_alloc::tier::{TensorHandle, TierConfig, TierError};
use memcast_alloc::{AllocError, Allocation, Allocator};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

/// Stream ids: the allocator's (0..3), just past them, past the 16 bits a record keeps,
/// and arbitrary.
fn stream() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 0u32..3,
        1 => 3u32..8,
        1 => Just(u16::MAX as u32 + 1),
        1 => Just(u32::MAX),
        1 => any::<u32>(),
    ]
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 1u64..4096,
        2 => 4096u64..(2 * MIB),
        1 => (2 * MIB)..(8 * MIB),
        1 => Just(0u64),
        1 => Just(u64::MAX),
    ]
}

/// Which handle a call gets: a live one, a freed one, or another allocator's.
#[derive(Debug, Clone, Copy)]
enum Pick {
    Live(usize),
    Freed(usize),
    Foreign(usize),
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        2 => any::<usize>().prop_map(Pick::Live),
        2 => any::<usize>().prop_map(Pick::Freed),
        2 => any::<usize>().prop_map(Pick::Foreign),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(u64, u32),
    Free(Pick, u32),
    FreePtr(Pick, u32, u64),
    RawPtr(u64, u32),
    RecordStream(Pick, u32),
    Lookup(Pick),
    Advice(Advice),
    EmptyCache,
}

fn advice() -> impl Strategy<Value = Advice> {
    prop_oneof![
        (stream(), size()).prop_map(|(stream, bytes)| Advice::EnsureFree { stream, bytes }),
        (stream(), size(), 0u32..4).prop_map(|(stream, bytes, count)| Advice::PreSplit {
            stream,
            bytes,
            count
        }),
        (stream(), size()).prop_map(|(stream, keep_bytes)| Advice::Trim { stream, keep_bytes }),
        (stream(), size()).prop_map(|(stream, keep_bytes)| Advice::TrimTail { stream, keep_bytes }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (size(), stream()).prop_map(|(b, s)| Op::Alloc(b, s)),
        3 => (pick(), stream()).prop_map(|(p, s)| Op::Free(p, s)),
        1 => (pick(), stream(), 0u64..4).prop_map(|(p, s, k)| Op::FreePtr(p, s, k * 128)),
        1 => (any::<u64>(), stream()).prop_map(|(p, s)| Op::RawPtr(p, s)),
        2 => (pick(), stream()).prop_map(|(p, s)| Op::RecordStream(p, s)),
        1 => pick().prop_map(Op::Lookup),
        2 => advice().prop_map(Op::Advice),
        1 => Just(Op::EmptyCache),
    ]
}

/// The errors a bad id or a bad size may give (anything else fails the test).
fn expected(e: &AllocError) -> bool {
    matches!(
        e,
        AllocError::ZeroSize
            | AllocError::TooLarge { .. }
            | AllocError::OutOfMemory { .. }
            | AllocError::UnknownAllocation { .. }
            | AllocError::DoubleFree { .. }
            | AllocError::WrongStream { .. }
            | AllocError::UnknownStream(_)
    )
}

fn choose(
    p: Pick,
    live: &[(Allocation, u32)],
    freed: &[(Allocation, u32)],
    foreign: &[Allocation],
) -> Option<(Allocation, bool)> {
    let at = |v: usize, n: usize| (n > 0).then(|| v % n);
    match p {
        Pick::Live(i) => at(i, live.len()).map(|k| (live[k].0, true)),
        Pick::Freed(i) => at(i, freed.len()).map(|k| (freed[k].0, false)),
        Pick::Foreign(i) => at(i, foreign.len()).map(|k| (foreign[k], false)),
    }
}

/// An allocator with many records: its handles' ids run past the tested one's table.
fn foreign_handles() -> Vec<Allocation> {
    let mut b = Allocator::new(HostBackend::new(64 * MIB), AllocConfig::default()).unwrap();
    let mut v: Vec<Allocation> = (0..600)
        .map(|i| b.allocate(256 + (i % 7) * 4096, 0).unwrap())
        .collect();
    v.extend((0..8).map(|i| b.allocate((3 + i) * MIB / 2, 0).unwrap()));
    // Keep a few from the end (the highest ids) and a few from the start.
    let n = v.len();
    vec![v[0], v[1], v[n - 9], v[n - 2], v[n - 1], v[300]]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, .. ProptestConfig::default() })]

    #[test]
    fn allocator_entry_points_turn_bad_ids_into_typed_errors(
        growable in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let cfg = AllocConfig { growable_segments: growable, ..AllocConfig::default() };
        let mut a = Allocator::new(HostBackend::new(48 * MIB), cfg).unwrap();
        for _ in 0..2 {
            a.create_stream(StreamPriority::Normal).unwrap();
        }
        let foreign = foreign_handles();
        let mut live: Vec<(Allocation, u32)> = Vec::new();
        let mut freed: Vec<(Allocation, u32)> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc(bytes, s) => match a.allocate(bytes, s) {
                    Ok(x) => {
                        prop_assert!(s < 3 && bytes > 0);
                        live.push((x, s));
                    }
                    Err(e) => {
                        prop_assert!(expected(&e), "{e}");
                        if s >= 3 && bytes > 0 && bytes < 8 * MIB {
                            prop_assert!(matches!(e, AllocError::UnknownStream(x) if x == s), "{e}");
                        }
                    }
                },
                Op::Free(p, s) => {
                    let Some((x, is_live)) = choose(p, &live, &freed, &foreign) else { continue };
                    let owner = live.iter().find(|l| l.0 == x).map(|l| l.1);
                    match a.deallocate(x, s) {
                        Ok(()) => {
                            prop_assert!(is_live && owner == Some(s));
                            live.retain(|l| l.0 != x);
                            freed.push((x, s));
                        }
                        Err(e) => {
                            prop_assert!(expected(&e), "{e}");
                            prop_assert!(!is_live || owner != Some(s), "live handle refused: {e}");
                        }
                    }
                }
                Op::FreePtr(p, s, interior) => {
                    let Some((x, _)) = choose(p, &live, &freed, &foreign) else { continue };
                    // A freed or foreign pointer may be a live allocation's address
                    // (memory is reused): the model is the live allocation there.
                    let ptr = x.ptr.offset(interior);
                    let there = live.iter().copied().find(|l| l.0.ptr == ptr);
                    match a.deallocate_ptr(ptr, s) {
                        Ok(n) => {
                            let Some((y, owner)) = there else {
                                return Err(TestCaseError::fail(format!("freed {ptr}, not live")));
                            };
                            prop_assert_eq!(owner, s);
                            prop_assert_eq!(n, y.size);
                            live.retain(|l| l.0 != y);
                            freed.push((y, s));
                        }
                        Err(e) => {
                            prop_assert!(expected(&e), "{e}");
                            prop_assert!(there.is_none_or(|l| l.1 != s), "live {ptr} refused: {e}");
                        }
                    }
                }
                Op::RawPtr(p, s) => {
                    if let Err(e) = a.lookup(DevicePtr(p)) {
                        prop_assert!(expected(&e), "{e}");
                    }
                    if live.iter().all(|l| l.0.ptr.0 != p) {
                        let e = a.deallocate_ptr(DevicePtr(p), s).unwrap_err();
                        prop_assert!(expected(&e), "{e}");
                    }
                }
                Op::RecordStream(p, s) => {
                    let Some((x, is_live)) = choose(p, &live, &freed, &foreign) else { continue };
                    match a.record_stream(&x, s) {
                        Ok(()) => prop_assert!(is_live && s < 3),
                        Err(e) => {
                            prop_assert!(expected(&e), "{e}");
                            prop_assert!(!is_live || s >= 3, "{e}");
                        }
                    }
                }
                Op::Lookup(p) => {
                    let Some((x, is_live)) = choose(p, &live, &freed, &foreign) else { continue };
                    match a.lookup(x.ptr) {
                        Ok(y) => prop_assert!(live.iter().any(|l| l.0 == y)),
                        Err(e) => {
                            prop_assert!(expected(&e), "{e}");
                            prop_assert!(!is_live, "live pointer not found: {e}");
                        }
                    }
                }
                Op::Advice(adv) => {
                    if let Err(e) = a.apply_advice(adv) {
                        prop_assert!(matches!(e, AllocError::UnknownStream(_)), "{adv:?}: {e}");
                    }
                }
                Op::EmptyCache => {
                    a.empty_cache().unwrap();
                }
            }
            a.check_invariants().unwrap();
        }
        for (x, s) in live.drain(..) {
            a.deallocate(x, s).unwrap();
        }
        a.empty_cache().unwrap();
        a.check_invariants().unwrap();
        prop_assert_eq!(a.stats().reserved.current, 0);
    }
}

#[derive(Debug, Clone)]
enum TierOp {
    Register(u64),
    Access(Pick),
    Free(Pick),
    Spill(Pick),
    Prefetch(Pick),
    Query(Pick),
    Boundary,
}

fn tier_op() -> impl Strategy<Value = TierOp> {
    prop_oneof![
        3 => prop_oneof![Just(0u64), 1u64..(3 * MIB)].prop_map(TierOp::Register),
        2 => pick().prop_map(TierOp::Access),
        2 => pick().prop_map(TierOp::Free),
        1 => pick().prop_map(TierOp::Spill),
        1 => pick().prop_map(TierOp::Prefetch),
        1 => pick().prop_map(TierOp::Query),
        1 => Just(TierOp::Boundary),
    ]
}

fn manager(budget: u64) -> TierManager<HostBackend> {
    let a = Allocator::new(HostBackend::new(budget), AllocConfig::default()).unwrap();
    let cfg = TierConfig {
        budget,
        staging_bytes: MIB,
        ..TierConfig::default()
    };
    TierManager::new(a, cfg).unwrap()
}

fn choose_t(
    p: Pick,
    live: &[TensorHandle],
    freed: &[TensorHandle],
    foreign: &[TensorHandle],
) -> Option<(TensorHandle, bool)> {
    let at = |v: usize, n: usize| (n > 0).then(|| v % n);
    match p {
        Pick::Live(i) => at(i, live.len()).map(|k| (live[k], true)),
        Pick::Freed(i) => at(i, freed.len()).map(|k| (freed[k], false)),
        Pick::Foreign(i) => at(i, foreign.len()).map(|k| (foreign[k], false)),
    }
}

/// A stale or foreign handle is `UnknownHandle`, whatever the call.
fn unknown(
    r: Result<impl std::fmt::Debug, TierError>,
    h: TensorHandle,
) -> Result<(), TestCaseError> {
    match r {
        Err(TierError::UnknownHandle(x)) if x == h => Ok(()),
        other => Err(TestCaseError::fail(format!(
            "{h}: expected UnknownHandle, got {other:?}"
        ))),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]

    #[test]
    fn tier_manager_calls_turn_bad_handles_into_typed_errors(
        ops in proptest::collection::vec(tier_op(), 1..80),
    ) {
        let mut m = manager(8 * MIB);
        let mut other = manager(64 * MIB);
        // Another manager's handles: indices past this one's registry.
        let foreign: Vec<TensorHandle> = (0..40)
            .map(|_| other.register(4096, TensorOpts::default()).unwrap())
            .collect();
        let foreign = vec![foreign[39], foreign[20]];
        let mut live: Vec<TensorHandle> = Vec::new();
        let mut freed: Vec<TensorHandle> = Vec::new();
        for op in ops {
            match op {
                TierOp::Register(bytes) => match m.register(bytes, TensorOpts::default()) {
                    Ok(h) => live.push(h),
                    Err(e) => prop_assert!(
                        matches!(e, TierError::OutOfMemory { .. } | TierError::Alloc(AllocError::ZeroSize)),
                        "{e}"
                    ),
                },
                TierOp::Access(p) => {
                    let Some((h, is_live)) = choose_t(p, &live, &freed, &foreign) else { continue };
                    if is_live {
                        if let Err(e) = m.access(h, false) {
                            prop_assert!(matches!(e, TierError::OutOfMemory { .. }), "{e}");
                        }
                    } else {
                        unknown(m.access(h, false), h)?;
                    }
                }
                TierOp::Free(p) => {
                    let Some((h, is_live)) = choose_t(p, &live, &freed, &foreign) else { continue };
                    if is_live {
                        m.free(h).unwrap();
                        live.retain(|&x| x != h);
                        freed.push(h);
                    } else {
                        unknown(m.free(h), h)?;
                    }
                }
                TierOp::Spill(p) => {
                    let Some((h, is_live)) = choose_t(p, &live, &freed, &foreign) else { continue };
                    if is_live {
                        m.spill(h).unwrap();
                    } else {
                        unknown(m.spill(h), h)?;
                    }
                }
                TierOp::Prefetch(p) => {
                    let Some((h, is_live)) = choose_t(p, &live, &freed, &foreign) else { continue };
                    if is_live {
                        m.prefetch(h).unwrap();
                    } else {
                        unknown(m.prefetch(h), h)?;
                    }
                }
                TierOp::Query(p) => {
                    let Some((h, is_live)) = choose_t(p, &live, &freed, &foreign) else { continue };
                    if is_live {
                        m.place(h).unwrap();
                        m.bytes(h).unwrap();
                        m.device_ptr(h).unwrap();
                    } else {
                        unknown(m.place(h), h)?;
                        unknown(m.bytes(h), h)?;
                        unknown(m.device_ptr(h), h)?;
                    }
                }
                TierOp::Boundary => {
                    m.end_step();
                    m.iteration_boundary().unwrap();
                }
            }
            m.check_invariants().unwrap();
            m.allocator().check_invariants().unwrap();
        }
        for h in live {
            m.free(h).unwrap();
        }
        m.synchronize().unwrap();
        m.check_invariants().unwrap();
    }
}
