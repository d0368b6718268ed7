//! A hand-made job and plan replayed on the simulated H200: the predicted step of each
//! iteration is the compute plus the stalls the plan leaves, computed by hand here.

use memcast_trace::{Event, EventKind, StaticBlock, TensorMeta, Trace};

use super::*;
use crate::tier::replay::{replay_budgeted, Budget, TierReplayOptions};

const MIB: u64 = 1 << 20;
const A: u64 = 512 * MIB;
const R: u64 = 256 * MIB;

/// Three iterations of 70 ms of compute: A (512 MiB, spilled after the forward) and R
/// (256 MiB, dropped; recomputing it costs 7 ms) made at 0, a small X at 20 ms (the
/// forward's end), read at 40 ms, A and R read at 60 ms, everything freed at 70 ms.
/// Returns the trace and, per iteration, the event indices at 20, 40 and 60 ms.
fn job() -> (Trace, Vec<[u64; 3]>) {
    let mut ev = Vec::new();
    let mut tensors = Vec::new();
    let mut at = Vec::new();
    let push = |ev: &mut Vec<Event>, t: u64, kind| {
        ev.push(Event { time_us: t, kind });
        ev.len() as u64 - 1
    };
    for it in 0..3u64 {
        let t0 = it * 70_000;
        let (a, r, x) = (10 * it + 1, 10 * it + 2, 10 * it + 3);
        push(&mut ev, t0, EventKind::IterationBoundary);
        push(
            &mut ev,
            t0,
            EventKind::Alloc {
                id: a,
                bytes: A,
                stream: 0,
            },
        );
        let ra = push(
            &mut ev,
            t0,
            EventKind::Alloc {
                id: r,
                bytes: R,
                stream: 0,
            },
        );
        let e20 = push(
            &mut ev,
            t0 + 20_000,
            EventKind::Alloc {
                id: x,
                bytes: MIB,
                stream: 0,
            },
        );
        let e40 = push(
            &mut ev,
            t0 + 40_000,
            EventKind::Access {
                id: x,
                write: false,
            },
        );
        let e60 = push(
            &mut ev,
            t0 + 60_000,
            EventKind::Access {
                id: a,
                write: false,
            },
        );
        push(
            &mut ev,
            t0 + 60_000,
            EventKind::Access {
                id: r,
                write: false,
            },
        );
        push(&mut ev, t0 + 70_000, EventKind::Free { id: a });
        let rf = push(&mut ev, t0 + 70_000, EventKind::Free { id: r });
        push(&mut ev, t0 + 70_000, EventKind::Free { id: x });
        tensors.push(TensorMeta {
            id: r,
            size: R,
            producer: Some(format!("f{it}")),
            consumers: vec![format!("b{it}")],
            alloc_event: Some(ra),
            free_event: Some(rf),
            recompute_us: Some(7_000),
        });
        at.push([e20, e40, e60]);
    }
    push(&mut ev, 210_000, EventKind::IterationBoundary);
    let t = Trace {
        static_blocks: vec![StaticBlock {
            id: 1000,
            bytes: 64 * MIB,
            stream: 0,
        }],
        events: ev,
        tensors,
        ..Default::default()
    };
    t.validate().unwrap();
    (t, at)
}

fn d(before_event: u64, action: Action, id: u64) -> Directive {
    Directive {
        before_event,
        action,
        id,
    }
}

/// Iteration 0: A prefetched at 40 ms (back long before 60 ms), R recomputed: 70 + 7 ms.
/// Iteration 1: A prefetched only at its use: the copy back (512 MiB at the H200's
/// 54.7-55.0 GB/s pinned) is waited for: 70 + 7 + ~9.8 ms. Iteration 2: the prefetch is
/// asked for right after the spill started; it waits for the spill, then lands before
/// 60 ms: 70 + 7 ms.
fn plan(at: &[[u64; 3]]) -> Plan {
    let mut v = Vec::new();
    let when = [at[0][1], at[1][2], at[2][0]];
    for (it, e) in at.iter().enumerate() {
        let (a, r) = (10 * it as u64 + 1, 10 * it as u64 + 2);
        v.push(d(e[0], Action::Spill, a));
        v.push(d(e[0], Action::Drop, r));
        v.push(d(when[it], Action::Prefetch, a));
    }
    Plan::new(v)
}

#[test]
fn a_plan_replays_to_the_step_times_computed_by_hand() {
    let (t, at) = job();
    let p = plan(&at);
    p.check(&t).unwrap();
    let opts = TierReplayOptions {
        budget: Budget::Bytes(2 << 30),
        plan: Some(p),
        check_every: 1,
        ..Default::default()
    };
    let r = replay_budgeted(&t, &opts).unwrap();
    assert!(r.completed, "{:?}", r.error);
    assert_eq!(r.compute_per_iteration_us, vec![70_000.0; 3]);
    let step: Vec<f64> = (r.compute_per_iteration_us.iter())
        .zip(&r.stall_per_iteration_us)
        .map(|(c, s)| c + s)
        .collect();
    // The copy back of A when nothing hides it: 2 us + bytes / bandwidth.
    let (slow, fast) = (2.0 + A as f64 / 54.6e3, 2.0 + A as f64 / 55.1e3);
    assert!((step[0] - 77_000.0).abs() < 50.0, "{step:?}");
    assert!(
        step[1] > 77_000.0 + fast && step[1] < 77_000.0 + slow + 50.0,
        "{step:?}: the late prefetch should cost {fast:.0}-{slow:.0} us"
    );
    assert!((step[2] - 77_000.0).abs() < 50.0, "{step:?}");
    let run = r.plan.unwrap();
    assert_eq!(
        (run.directives, run.issued, run.refused, run.deferred),
        (9, 9, 0, 1)
    );
    assert_eq!((r.drops, r.recomputes, r.spills), (3, 3, 3));
    assert_eq!(r.faults, 0);
}

#[test]
fn bad_plans_name_the_directive() {
    let (t, at) = job();
    let e = Plan::new(vec![d(at[0][0], Action::Spill, 11)])
        .check(&t)
        .unwrap_err();
    assert!(
        e.contains("directive 0") && e.contains("tensor 11 is not live"),
        "{e}"
    );
    let e = Plan::new(vec![d(at[0][0], Action::Drop, 1)])
        .check(&t)
        .unwrap_err();
    assert!(e.contains("no producer and recompute cost"), "{e}");
    let e = Plan::new(vec![d(999, Action::Spill, 1)])
        .check(&t)
        .unwrap_err();
    assert!(e.contains("past the trace's end"), "{e}");
    let e = Plan::parse(br#"{"format": "memcast-plan", "version": 1, "directives": [{"before_event": 1, "action": "keep", "id": 1}]}"#).unwrap_err();
    assert!(
        e.contains("unknown variant") && e.contains("line 1 column"),
        "{e}"
    );
    let e = Plan::parse(br#"{"format": "x", "version": 1, "directives": []}"#).unwrap_err();
    assert!(e.contains("\"x\""), "{e}");
    // A plan that does not fit the trace is refused before the replay.
    let opts = TierReplayOptions {
        budget: Budget::Bytes(2 << 30),
        plan: Some(Plan::new(vec![d(at[0][0], Action::Spill, 11)])),
        ..Default::default()
    };
    let e = replay_budgeted(&t, &opts).unwrap_err().to_string();
    assert!(e.contains("directive 0"), "{e}");
}

/// The engine's semantics of a use that comes while the tensor's spill is in flight:
/// the use waits for the spill, then for the copy back (about 2 x 9.8 ms for A), where
/// the manager alone would cancel the spill and use the device copy at no cost.
#[test]
fn a_use_during_the_spill_waits_for_it_and_the_copy_back() {
    let (t, at) = job();
    let opts = TierReplayOptions {
        budget: Budget::Bytes(2 << 30),
        plan: Some(Plan::new(vec![d(at[0][2], Action::Spill, 1)])),
        check_every: 1,
        ..Default::default()
    };
    let r = replay_budgeted(&t, &opts).unwrap();
    assert!(r.completed, "{:?}", r.error);
    let step: Vec<f64> = (r.compute_per_iteration_us.iter())
        .zip(&r.stall_per_iteration_us)
        .map(|(c, s)| c + s)
        .collect();
    let (slow, fast) = (2.0 + A as f64 / 54.6e3, 2.0 + A as f64 / 55.1e3);
    assert!(
        step[0] > 70_000.0 + 2.0 * fast && step[0] < 70_000.0 + 2.0 * slow + 50.0,
        "{step:?}: the spill and the copy back should cost {:.0}-{:.0} us",
        2.0 * fast,
        2.0 * slow
    );
    assert!((step[1] - 70_000.0).abs() < 50.0, "{step:?}");
    assert_eq!(r.plan.unwrap().waited_spills, 1);
}
