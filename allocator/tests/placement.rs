//! Planned placement (`placement:planned`, placement profiles): a plan is advice. Whatever
//! the plan (a profile of another program, of a shorter run, of the same run), every
//! allocation holds its bytes, the allocator's invariants hold, and an out-of-memory is
//! an error; and on a real recorded run a profile of its first iterations is followed
//! without a miss and reserves less than best fit.

use memcast_alloc::backend::host::HostBackend;
use memcast_alloc::backend::layers::Limit;
use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::backend::{DeviceBackend, MemRef};
use memcast_alloc::replay::{run, ReplayOptions};
use memcast_alloc::{AllocConfig, AllocError, Allocation, Allocator};
use memcast_trace::{Event, EventKind, Trace};
use proptest::prelude::*;

mod common;
use common::{stamp, Op, MIB};

fn op() -> impl Strategy<Value = Op> {
    common::op(2, 4, 16 * MIB)
}

/// The trace of `ops` (what a recording of that program holds).
fn trace_of(ops: &[Op]) -> Trace {
    let mut t = Trace::default();
    let mut live: Vec<u64> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let kind = match *op {
            Op::Alloc { bytes } => {
                live.push(i as u64);
                EventKind::Alloc {
                    id: i as u64,
                    bytes,
                    stream: 0,
                }
            }
            Op::Free { pick } if !live.is_empty() => EventKind::Free {
                id: live.swap_remove(pick % live.len()),
            },
            Op::Free { .. } => continue,
            Op::Boundary => EventKind::IterationBoundary,
        };
        t.events.push(Event {
            time_us: i as u64,
            kind,
        });
    }
    t
}

/// Runs `ops` on a planned allocator over real host memory of `cap` bytes; every
/// allocation is stamped with its own bytes and checked when freed.
fn run_planned(ops: &[Op], profile: Option<&Trace>, cap: u64) -> Result<(), TestCaseError> {
    let cfg = AllocConfig::default()
        .with_conf_string("placement:planned")
        .unwrap();
    let mut a = Allocator::new(Limit::new(HostBackend::new(cap), cap), cfg).unwrap();
    if let Some(p) = profile {
        a.set_placement_profile(p).unwrap();
    }
    let mut live: Vec<Allocation> = Vec::new();
    for op in ops {
        match *op {
            Op::Alloc { bytes } => match a.allocate(bytes, 0) {
                Ok(x) => {
                    a.backend_mut()
                        .write(MemRef::Device(x.ptr), &stamp(&x))
                        .unwrap();
                    live.push(x);
                }
                Err(AllocError::OutOfMemory { .. }) => {}
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            },
            Op::Free { pick } if !live.is_empty() => {
                let x = live.swap_remove(pick % live.len());
                let s = stamp(&x);
                let mut buf = vec![0u8; s.len()];
                a.backend_mut()
                    .read(MemRef::Device(x.ptr), &mut buf)
                    .unwrap();
                prop_assert_eq!(buf, s, "bytes of a live allocation changed");
                a.deallocate(x, 0).unwrap();
            }
            Op::Free { .. } => {}
            Op::Boundary => a.iteration_boundary(),
        }
        a.check_invariants()
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert!(a.backend().used() <= cap);
    }
    for x in live {
        a.deallocate(x, 0).unwrap();
    }
    a.check_invariants().unwrap();
    prop_assert_eq!(a.stats().requested.current, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A program repeated with boundaries, under plans learned in the run, under its
    /// own profile, and under the profile of another program (a lie).
    #[test]
    fn plans_right_or_wrong_keep_every_byte(
        body in proptest::collection::vec(op(), 1..80),
        other in proptest::collection::vec(op(), 1..200),
        repeats in 1usize..5,
        which in 0u8..3,
    ) {
        let mut ops = Vec::new();
        for _ in 0..repeats {
            ops.extend(body.iter().cloned());
            ops.push(Op::Boundary);
        }
        let profile = match which {
            0 => None,
            1 => Some(trace_of(&ops)),
            _ => Some(trace_of(&other)),
        };
        run_planned(&ops, profile.as_ref(), 160 * MIB)?;
    }
}

/// Peak reserved bytes and placement counters of a sim replay of `t`.
fn replay(t: &Trace, conf: &str, profile: Option<&Trace>) -> (u64, u64, serde_json::Value) {
    let cfg = AllocConfig::default().with_conf_string(conf).unwrap();
    let opts = ReplayOptions {
        config: cfg.clone(),
        ..Default::default()
    };
    let mut a =
        Allocator::new(SimBackend::new(opts.sim_capacity, Default::default()), cfg).unwrap();
    if let Some(p) = profile {
        a.set_placement_profile(p).unwrap();
    }
    let r = run(t, a, &opts).unwrap();
    (
        r.peak_reserved_bytes,
        r.peak_requested_bytes,
        r.extra["placement"].clone(),
    )
}

#[test]
fn a_profile_of_the_first_iterations_of_a_real_run_is_followed_and_reserves_less() {
    // BERT-base trained through memcast_torch on an H200, recorded from before the
    // model's first allocation: model load + warm-up step, then 4 steps.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../training-data/recorded/bert_from_start_memcast.mctrace");
    let t = memcast_trace::io::load_trace(&path).unwrap();
    let (best_fit, requested, _) = replay(&t, "", None);
    // The profile: the same job's first two steps (3 boundaries).
    let (profiled, _, stats) = replay(&t, "placement:planned", Some(&t.until_boundary(3)));
    // Every large allocation of the profile's iterations, and every one after them
    // (the profile's last iteration repeated), went where the plan put it.
    assert!(stats["profile_hits"].as_u64().unwrap() > 2000, "{stats}");
    assert_eq!(stats["profile_misses"], 0, "{stats}");
    assert!(stats["planned_hits"].as_u64().unwrap() > 1000, "{stats}");
    assert_eq!(stats["planned_misses"], 0, "{stats}");
    // Best fit reserves 9.1% above the peak of requested bytes; the plan 0.13%.
    assert!(profiled < best_fit, "{profiled} vs best fit {best_fit}");
    assert!(
        (profiled as f64) < requested as f64 * 1.005,
        "{profiled} vs requested {requested}"
    );
}

#[test]
fn a_profile_is_set_before_the_first_allocation_only_and_a_missing_file_is_named() {
    let mut a = Allocator::new(SimBackend::h200(), AllocConfig::default()).unwrap();
    let x = a.allocate(MIB, 0).unwrap();
    let e = a.set_placement_profile(&Trace::default()).unwrap_err();
    assert!(e.to_string().contains("before the first allocation"), "{e}");
    a.deallocate(x, 0).unwrap();
    let cfg = AllocConfig::default()
        .with_conf_string("placement_profile:/nonexistent/run.mctrace")
        .unwrap();
    assert_eq!(cfg.placement, memcast_alloc::config::Placement::Planned);
    let e = Allocator::new(SimBackend::h200(), cfg).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/run.mctrace"), "{e}");
    let e = AllocConfig::default()
        .with_conf_string("placement:sideways")
        .unwrap_err();
    assert!(e.to_string().contains("best_fit|planned"), "{e}");
}
