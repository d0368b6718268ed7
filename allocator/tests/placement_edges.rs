//! Planned placement at its edges: exactly periodic programs (plain and double
//! buffered, learned in the run or from a profile, a profile cut just after a
//! boundary) are served without a miss; a broad property test over configurations,
//! streams, cross-stream frees, frees by pointer and `empty_cache` keeps every byte; a
//! rejected plan is not computed again for an unchanged layout; a profile survives
//! memory that another stream's cache holds.

use memcast_alloc::backend::host::HostBackend;
use memcast_alloc::backend::layers::Limit;
use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::backend::{DeviceBackend, MemRef, StreamPriority};
use memcast_alloc::config::{AllocConfig, Coalesce, Placement, Release};
use memcast_alloc::placement::PlacementStats;
use memcast_alloc::{AllocError, Allocation, Allocator};
use memcast_trace::{Event, EventKind, Trace};
use proptest::prelude::*;
use std::collections::HashMap;

mod common;
use common::{stamp, MIB};

#[derive(Debug, Clone, Copy)]
enum Ev {
    Alloc { id: u64, bytes: u64, stream: u32 },
    Free { id: u64 },
    Boundary,
}

fn trace_of(evs: &[Ev]) -> Trace {
    let mut t = Trace::default();
    for (i, e) in evs.iter().enumerate() {
        let kind = match *e {
            Ev::Alloc { id, bytes, stream } => EventKind::Alloc { id, bytes, stream },
            Ev::Free { id } => EventKind::Free { id },
            Ev::Boundary => EventKind::IterationBoundary,
        };
        t.events.push(Event {
            time_us: i as u64,
            kind,
        });
    }
    t
}

/// An exactly periodic training loop: params in iteration 0, then per iteration
/// activations, grads (live across the boundary). `double_buffer`: the previous
/// iteration's grads are freed after this iteration's are allocated (else at the start,
/// as zero_grad(set_to_none) does).
fn prog(iters: usize, double_buffer: bool) -> Vec<Ev> {
    let mut v = Vec::new();
    let a = |v: &mut Vec<Ev>, id: u64, mib: f64| {
        v.push(Ev::Alloc {
            id,
            bytes: (mib * MIB as f64) as u64,
            stream: 0,
        })
    };
    for (j, m) in [8.0, 2.0, 6.0].iter().enumerate() {
        a(&mut v, 90_000 + j as u64, *m);
    }
    for k in 0..iters as u64 {
        let base = k * 1000;
        let prev = base.wrapping_sub(1000);
        if k > 0 && !double_buffer {
            for j in 0..2 {
                v.push(Ev::Free { id: prev + 900 + j });
            }
        }
        let acts = [4.0, 1.0, 3.0, 2.0, 5.0, 1.5];
        for (j, m) in acts.iter().enumerate() {
            a(&mut v, base + j as u64, *m);
        }
        v.push(Ev::Free { id: base + 5 });
        a(&mut v, base + 100, 3.0);
        a(&mut v, base + 900, 8.0);
        a(&mut v, base + 901, 6.0);
        if k > 0 && double_buffer {
            for j in 0..2 {
                v.push(Ev::Free { id: prev + 900 + j });
            }
        }
        for j in (0..5).rev() {
            v.push(Ev::Free { id: base + j });
        }
        v.push(Ev::Free { id: base + 100 });
        v.push(Ev::Boundary);
    }
    v
}

fn run_sim(evs: &[Ev], conf: &str, profile: Option<&Trace>) -> PlacementStats {
    let cfg = AllocConfig::default().with_conf_string(conf).unwrap();
    let mut a = Allocator::new(SimBackend::h200(), cfg).unwrap();
    if let Some(p) = profile {
        a.set_placement_profile(p).unwrap();
    }
    let mut live: HashMap<u64, Allocation> = HashMap::new();
    for e in evs {
        match *e {
            Ev::Alloc { id, bytes, stream } => {
                live.insert(id, a.allocate(bytes, stream).unwrap());
            }
            Ev::Free { id } => {
                let x = live.remove(&id).unwrap();
                a.deallocate(x, 0).unwrap();
            }
            Ev::Boundary => a.iteration_boundary(),
        }
        a.check_invariants().unwrap();
    }
    a.placement_stats().unwrap()
}

fn first_boundaries(evs: &[Ev], n: usize) -> Vec<Ev> {
    let mut seen = 0;
    let mut out = Vec::new();
    for e in evs {
        out.push(*e);
        if matches!(e, Ev::Boundary) {
            seen += 1;
            if seen == n {
                break;
            }
        }
    }
    out
}

/// Runs the 14-iteration periodic program (`double_buffer`: runs live across the
/// boundary are double buffered) under in-run plans, or with its first 4 boundaries as
/// a profile, and checks every plan was served without a miss.
fn served_without_misses(double_buffer: bool, profiled: bool) {
    let p = prog(14, double_buffer);
    let prof = profiled.then(|| trace_of(&first_boundaries(&p, 4)));
    let s = run_sim(&p, "placement:planned", prof.as_ref());
    eprintln!("{s:?}");
    assert!(s.planned_hits > 0, "{s:?}");
    assert_eq!(
        (s.profile_misses, s.planned_misses, s.unplanned, s.abandoned),
        (0, 0, 0, 0),
        "{s:?}"
    );
}

#[test]
fn periodic_in_run_plan_serves_without_misses() {
    served_without_misses(false, false);
}

#[test]
fn periodic_profile_prefix_serves_without_misses() {
    served_without_misses(false, true);
}

#[test]
fn double_buffered_in_run_plan_serves_without_misses() {
    served_without_misses(true, false);
}

#[test]
fn double_buffered_profile_prefix_serves_without_misses() {
    served_without_misses(true, true);
}

#[test]
fn profile_cut_a_few_events_after_a_boundary_still_hands_over() {
    let p = prog(14, false);
    let mut cut = first_boundaries(&p, 4);
    // The recorder stopped a few allocations into the next step.
    cut.extend_from_slice(&p[cut.len()..cut.len() + 3]);
    let prof = trace_of(&cut);
    let s = run_sim(&p, "placement:planned", Some(&prof));
    eprintln!("{s:?}");
    assert!(s.planned_hits > 0, "{s:?}");
    assert_eq!(
        (s.planned_misses, s.unplanned, s.abandoned),
        (0, 0, 0),
        "{s:?}"
    );
}

// ---------- the broad property test ----------

#[derive(Debug, Clone)]
enum Op {
    Alloc { bytes: u64, stream: u32 },
    Free { pick: usize },
    FreePtr { pick: usize },
    RecordStream { pick: usize, stream: u32 },
    EmptyCache,
    Boundary,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (prop_oneof![
            2 => 1u64..(64 << 10),
            4 => (64u64 << 10)..(4 * MIB),
            2 => (4 * MIB)..(16 * MIB),
        ], prop_oneof![4 => Just(0u32), 1 => 1u32..3]).prop_map(|(bytes, stream)| Op::Alloc { bytes, stream }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => any::<usize>().prop_map(|pick| Op::FreePtr { pick }),
        1 => (any::<usize>(), 0u32..3).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        1 => Just(Op::Boundary),
    ]
}

fn config() -> impl Strategy<Value = AllocConfig> {
    (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
        |(growable, deferred, best_fit, immediate)| AllocConfig {
            growable_segments: growable,
            coalesce: if deferred {
                Coalesce::Deferred
            } else {
                Coalesce::Immediate
            },
            best_fit,
            release: if immediate {
                Release::Immediate
            } else {
                Release::OnOom
            },
            placement: Placement::Planned,
            cache_max_runs: 8,
            ..AllocConfig::default()
        },
    )
}

fn trace_of_ops(ops: &[Op]) -> Trace {
    let mut evs = Vec::new();
    let mut live: Vec<u64> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc { bytes, stream } => {
                live.push(i as u64);
                evs.push(Ev::Alloc {
                    id: i as u64,
                    bytes,
                    stream,
                });
            }
            Op::Free { pick } | Op::FreePtr { pick } if !live.is_empty() => {
                let id = live.swap_remove(pick % live.len());
                evs.push(Ev::Free { id });
            }
            Op::Boundary => evs.push(Ev::Boundary),
            _ => {}
        }
    }
    trace_of(&evs)
}

fn run_ops(
    cfg: AllocConfig,
    ops: &[Op],
    profile: Option<&Trace>,
    cap: u64,
) -> Result<(), TestCaseError> {
    let mut a = Allocator::new(Limit::new(HostBackend::new(cap), cap), cfg).unwrap();
    for _ in 0..2 {
        a.create_stream(StreamPriority::Normal).unwrap();
    }
    if let Some(p) = profile {
        a.set_placement_profile(p).unwrap();
    }
    let mut live: Vec<(Allocation, u32)> = Vec::new();
    for op in ops {
        match *op {
            Op::Alloc { bytes, stream } => match a.allocate(bytes, stream) {
                Ok(x) => {
                    a.backend_mut()
                        .write(MemRef::Device(x.ptr), &stamp(&x))
                        .unwrap();
                    live.push((x, stream));
                }
                Err(AllocError::OutOfMemory { .. }) => {}
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            },
            Op::Free { pick } | Op::FreePtr { pick } if !live.is_empty() => {
                let (x, s) = live.swap_remove(pick % live.len());
                let st = stamp(&x);
                let mut buf = vec![0u8; st.len()];
                a.backend_mut()
                    .read(MemRef::Device(x.ptr), &mut buf)
                    .unwrap();
                prop_assert_eq!(buf, st, "bytes of a live allocation changed");
                if matches!(op, Op::FreePtr { .. }) {
                    a.deallocate_ptr(x.ptr, s).unwrap();
                } else {
                    a.deallocate(x, s).unwrap();
                }
            }
            Op::RecordStream { pick, stream } if !live.is_empty() => {
                let (x, _) = live[pick % live.len()];
                a.record_stream(&x, stream).unwrap();
            }
            Op::EmptyCache => {
                a.empty_cache().unwrap();
            }
            Op::Boundary => a.iteration_boundary(),
            _ => {}
        }
        a.check_invariants()
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert!(a.backend().used() <= cap);
        prop_assert_eq!(a.stats().reserved.current, a.backend().used());
    }
    for (x, s) in live {
        a.deallocate(x, s).unwrap();
    }
    a.check_invariants().unwrap();
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    prop_assert_eq!(a.stats().reserved.current, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn plans_keep_every_byte_across_configs_and_streams(
        cfg in config(),
        body in proptest::collection::vec(op(), 1..60),
        other in proptest::collection::vec(op(), 1..100),
        repeats in 1usize..6,
        which in 0u8..3,
        empty in any::<bool>(),
    ) {
        let mut ops = Vec::new();
        for r in 0..repeats {
            ops.extend(body.iter().cloned());
            if empty && r == 2 {
                ops.push(Op::EmptyCache);
            }
            ops.push(Op::Boundary);
        }
        let profile = match which {
            0 => None,
            1 => Some(trace_of_ops(&ops)),
            _ => Some(trace_of_ops(&other)),
        };
        run_ops(cfg, &ops, profile.as_ref(), 96 * MIB)?;
    }
}

// ---------- plans that are not kept are computed again at every boundary ----------

#[derive(Debug, Clone)]
enum Op1 {
    Alloc { bytes: u64 },
    Free { pick: usize },
}

fn op1() -> impl Strategy<Value = Op1> {
    prop_oneof![
        5 => (1u64..=16).prop_map(|k| Op1::Alloc { bytes: k * MIB }),
        4 => any::<usize>().prop_map(|pick| Op1::Free { pick }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn a_rejected_plan_is_not_recomputed_for_an_unchanged_layout(
        body in proptest::collection::vec(op1(), 1..40),
    ) {
        // Each iteration frees what it allocated (a periodic program whose layout at
        // every boundary is empty: nothing changes between boundaries).
        let cfg = AllocConfig::default().with_conf_string("placement:planned").unwrap();
        let mut a = Allocator::new(SimBackend::h200(), cfg).unwrap();
        for _ in 0..12 {
            let mut live: Vec<Allocation> = Vec::new();
            for op in &body {
                match *op {
                    Op1::Alloc { bytes } => live.push(a.allocate(bytes, 0).unwrap()),
                    Op1::Free { pick } if !live.is_empty() => {
                        let x = live.swap_remove(pick % live.len());
                        a.deallocate(x, 0).unwrap();
                    }
                    _ => {}
                }
            }
            for x in live.drain(..) {
                a.deallocate(x, 0).unwrap();
            }
            a.iteration_boundary();
        }
        let s = a.placement_stats().unwrap();
        prop_assert!(s.plans <= s.plans_kept + 1, "{s:?}");
    }
}

#[test]
fn a_profile_survives_memory_held_in_another_streams_cache() {
    // The recording: stream 0 allocates and frees a 16 MiB run per iteration.
    let mut rec = Vec::new();
    for k in 0..4u64 {
        rec.push(Ev::Alloc {
            id: k,
            bytes: 16 * MIB,
            stream: 0,
        });
        rec.push(Ev::Free { id: k });
        rec.push(Ev::Boundary);
    }
    let cap = 64 * MIB;
    let mut a = Allocator::new(
        SimBackend::new(cap, Default::default()),
        AllocConfig::default(),
    )
    .unwrap();
    let s1 = a.create_stream(StreamPriority::Normal).unwrap();
    a.set_placement_profile(&trace_of(&rec)).unwrap();
    // Stream 1 (no profile) caches 56 MiB of freed runs.
    let xs: Vec<_> = (0..7).map(|_| a.allocate(8 * MIB, s1).unwrap()).collect();
    for x in xs {
        a.deallocate(x, s1).unwrap();
    }
    for _ in 0..4 {
        let x = a.allocate(16 * MIB, 0).unwrap();
        a.deallocate(x, 0).unwrap();
        a.iteration_boundary();
    }
    let s = a.placement_stats().unwrap();
    eprintln!("{s:?}");
    assert_eq!(
        s.profile_misses, 0,
        "the profile was dropped for want of memory a cache held: {s:?}"
    );
}
