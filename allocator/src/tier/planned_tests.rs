//! Run-time rules of planned tiers (`planned.rs`), on plans from trajectories the test
//! writes (the oracle's path), so that the plan does not depend on the host clock.

use crate::tier::handle::{Place, TensorKey};
use crate::tier::manager::TensorOpts;
use crate::tier::planned::Planner;
use crate::tier::schedule::{LoggedOp, OpUse, Trajectory};
use crate::tier::tests::{manager, pattern, read, write, TestBackend};
use crate::tier::{TensorHandle, TierManager};

const KIB: u64 = 1 << 10;
const ACTS: u32 = 12;

/// The operations of `halves` forward-backward passes over twelve activations each,
/// the weight read at the start of each (`halves = 2`: the weight is read again
/// between two peaks, as a backward that reads the weights does).
fn ops_of(w: TensorHandle, w_bytes: u64, halves: u32) -> Vec<(TensorKey, u64, OpUse)> {
    let mut ops = Vec::new();
    for h in 0..halves {
        ops.push((TensorKey::Persistent(w), w_bytes, OpUse::Access));
        for i in h * ACTS..(h + 1) * ACTS {
            ops.push((TensorKey::Ordinal(i), 128 * KIB, OpUse::Alloc));
            ops.push((TensorKey::Ordinal(i), 128 * KIB, OpUse::Access));
        }
        for i in (h * ACTS..(h + 1) * ACTS).rev() {
            ops.push((TensorKey::Ordinal(i), 128 * KIB, OpUse::Access));
            ops.push((TensorKey::Ordinal(i), 128 * KIB, OpUse::Free));
        }
    }
    ops
}

/// `ops` as a logged trajectory, 10 us per operation.
fn logged(ops: &[(TensorKey, u64, OpUse)], w_bytes: u64) -> Trajectory {
    let n = ops.len();
    Trajectory {
        ops: ops
            .iter()
            .enumerate()
            .map(|(p, &(key, bytes, kind))| LoggedOp {
                key,
                bytes,
                kind,
                t: 10.0 * p as f64,
            })
            .collect(),
        base: w_bytes,
        span_us: 10.0 * n as f64,
        ..Default::default()
    }
}

/// A persistent weight of `w_bytes`, written with a known pattern (its bytes).
fn weight(m: &mut TierManager<TestBackend>, w_bytes: u64) -> (TensorHandle, Vec<u8>) {
    let w = m
        .register(
            w_bytes,
            TensorOpts {
                persistent: true,
                ..TensorOpts::default()
            },
        )
        .unwrap();
    let w_data = pattern(99, w_bytes);
    write(m, w, &w_data).unwrap();
    m.end_step();
    (w, w_data)
}

/// Pass `half` of iteration `it` as [`ops_of`] logs it: the weight read (its bytes
/// checked), twelve activations written, then read (checked) and freed in reverse.
/// Returns where the weight was at the pass's peak (its forward's end).
fn pass(
    m: &mut TierManager<TestBackend>,
    (w, w_data): (TensorHandle, &[u8]),
    it: u64,
    half: u32,
) -> Place {
    assert_eq!(read(m, w).unwrap(), w_data, "iteration {it}");
    m.end_step();
    let mut live = Vec::new();
    for i in half * ACTS..(half + 1) * ACTS {
        let h = m.register(128 * KIB, TensorOpts::default()).unwrap();
        let data = pattern(it * 100 + u64::from(i), 128 * KIB);
        write(m, h, &data).unwrap();
        m.end_step();
        live.push((h, data));
    }
    let at_peak = m.place(w).unwrap();
    while let Some((h, data)) = live.pop() {
        assert_eq!(read(m, h).unwrap(), data, "iteration {it}");
        m.end_step();
        m.free(h).unwrap();
    }
    at_peak
}

/// Where the weight was in one iteration: at each pass's peak, just before the
/// boundary and just after it.
struct Seen {
    peaks: Vec<Place>,
    before: Place,
    after: Place,
}

/// Runs six iterations of [`ops_of`] (`halves` passes each, a weight of `w_bytes`)
/// with the oracle's plan; returns where the weight was in each (every iteration has
/// a plan), and the plan's spills and prefetches. The weight's bytes are checked at
/// every read.
fn weight_in_iterations(defer: bool, halves: u32, w_bytes: u64) -> (Vec<Seen>, (u64, u64)) {
    let (mut m, _) = manager(3);
    let mut p = Planner::new(0.8, None);
    p.defer_wraps = defer;
    m.set_planner(p);
    let (w, w_data) = weight(&mut m, w_bytes);
    let traj = logged(&ops_of(w, w_bytes, halves), w_bytes);
    m.set_next_trajectory(traj.clone());
    m.iteration_boundary().unwrap();
    let mut at = Vec::new();
    for it in 0..6u64 {
        let peaks = (0..halves)
            .map(|half| pass(&mut m, (w, &w_data), it, half))
            .collect();
        m.check_invariants().unwrap();
        let before = m.place(w).unwrap();
        m.set_next_trajectory(traj.clone());
        m.iteration_boundary().unwrap();
        at.push(Seen {
            peaks,
            before,
            after: m.place(w).unwrap(),
        });
    }
    let s = &m.planner().unwrap().stats;
    assert!(s.spills >= 6 && s.prefetches >= 5, "{s:?}");
    (at, (s.spills, s.prefetches))
}

/// The tensor is off the device (on the host, or its copy out in flight).
fn off(p: &Place) -> bool {
    matches!(p, Place::Host { .. } | Place::SpillingOut { .. })
}

/// The tensor is on the device, or its copy in is in flight.
fn back(p: &Place) -> bool {
    matches!(p, Place::Device { .. } | Place::PrefetchingIn { .. })
}

/// The weight's gap wraps (read in the forward, next in the next forward): the plan
/// spills it after its read to cover the activations' peak. With `defer_wraps` it is
/// off at the peak and back by the next iteration's start: brought back within the
/// iteration once its planned point has passed and the link in is idle (here at
/// some iterations' ends: the test backend completes copies at random), else from
/// the next one's start. Without, it is brought back within the iteration (by its
/// end). (Deferred to the next start always, as before the link-idle rule, it was off
/// at every boundary.)
#[test]
fn a_wrapped_move_comes_back_once_the_link_in_is_idle() {
    let (seen, _) = weight_in_iterations(true, 1, 256 * KIB);
    for s in &seen {
        assert!(off(&s.peaks[0]), "deferred: at the peak {:?}", s.peaks[0]);
        assert!(back(&s.after), "deferred: after the boundary {:?}", s.after);
    }
    let early = seen.iter().filter(|s| back(&s.before)).count();
    assert!(early > 0, "never back before a boundary");
    for s in weight_in_iterations(false, 1, 256 * KIB).0 {
        assert!(
            back(&s.before),
            "not deferred: before the boundary {:?}",
            s.before
        );
    }
}

/// The weight is read again between two peaks, so it has two moves: one within the
/// iteration and the wrapped one. Reaching the first one's prefetch point must not
/// keep the second one's spill from being hidden and deferred: the weight stays off
/// through the second peak, the plan brings it back (not the window prefetcher), and
/// it is back by the next iteration's start. (With the rule kept per tensor instead
/// of per move, the spill was not hidden: the window prefetcher brought the weight
/// back, and the plan made 6 of its 12 prefetches.)
#[test]
fn a_wrapped_move_after_another_move_of_the_same_tensor_is_deferred_too() {
    let (seen, (spills, prefetches)) = weight_in_iterations(true, 2, 512 * KIB);
    for s in &seen {
        assert!(off(&s.peaks[1]), "at the second peak {:?}", s.peaks[1]);
        assert!(back(&s.after), "after the boundary {:?}", s.after);
    }
    assert_eq!(prefetches, spills, "the plan's prefetches");
}

/// The guard: a shape whose planned iteration stalled more per byte above the budget
/// than its unplanned one runs without a plan, for `RETRY` iterations, then its plan
/// is tried again; other shapes, and iterations within the budget, are not affected.
#[test]
fn the_guard_holds_off_the_plans_of_a_shape_they_made_worse() {
    use crate::tier::planned::Guard;
    let (a, b): (&[u64], &[u64]) = (&[1, 2, 3, 4], &[4, 3, 2, 1]);
    let mut g = Guard::default();
    // Nothing to compare yet: plans run.
    assert!(g.next_may_plan(a, false, 100.0, 10));
    // A planned iteration at 15 us a byte against 10 without: the next is held off.
    assert!(!g.next_may_plan(a, true, 150.0, 10));
    assert!(g.holds_off(a) && !g.holds_off(b));
    assert_eq!(g.suppressed, 1);
    // Another shape is compared on its own figures.
    assert!(g.next_may_plan(b, false, 100.0, 10));
    assert!(g.next_may_plan(b, true, 50.0, 10));
    // An iteration within the budget records nothing: still held off.
    assert!(!g.next_may_plan(a, false, 0.0, 0));
    // Held off for RETRY iterations in all, then tried again.
    let mut runs = 2;
    while !g.next_may_plan(a, false, 100.0, 10) {
        runs += 1;
        assert!(runs <= Guard::RETRY, "held off past the retry");
    }
    assert_eq!(runs, Guard::RETRY);
    assert!(!g.holds_off(a));
    // A plan that now does better than the last unplanned iteration keeps running.
    assert!(g.next_may_plan(a, true, 80.0, 10));
    assert!(g.next_may_plan(a, true, 90.0, 10));
    // Stall per byte, not stall: twice the stall over twice the excess is not worse.
    let mut g = Guard::default();
    assert!(g.next_may_plan(a, false, 100.0, 10));
    assert!(g.next_may_plan(a, true, 200.0, 20));
}

/// The manager hands the guard the bytes the ended iteration rose above the budget,
/// not above the plan's cap (`cap_fraction x budget`, lower): an iteration whose live
/// bytes peak between the two stayed within the budget and records nothing.
#[test]
fn the_guard_counts_the_bytes_above_the_budget_not_the_cap() {
    use crate::tier::planned::Guard;
    let (mut m, _) = manager(1);
    let budget = m.config().budget;
    let mut p = Planner::new(0.8, None);
    p.guard = Some(Guard::default());
    m.set_planner(p);
    // Four allocations (an iteration's signature): 1.8 MiB live at the peak, between
    // the cap (1.6 MiB) and the budget (2 MiB).
    let bytes = budget * 9 / 40;
    for n in [4, 5] {
        let peak = n * bytes;
        let mut live = Vec::new();
        for i in 0..n {
            let h = m.register(bytes, TensorOpts::default()).unwrap();
            write(&mut m, h, &pattern(i, bytes)).unwrap();
            m.end_step();
            live.push(h);
        }
        for h in live {
            m.free(h).unwrap();
        }
        m.iteration_boundary().unwrap();
        let g = m.planner().unwrap().guard.as_ref().unwrap();
        let recorded = g
            .shapes
            .iter()
            .any(|(_, r)| r.planned.is_some() || r.unplanned.is_some());
        // Within the budget: nothing; above it (a fifth allocation): recorded.
        assert_eq!(recorded, peak > budget, "peak {peak}: {g:?}");
    }
}

/// The guard judges a plan by the iterations it was in charge of: an iteration that
/// ran past the end of the trajectory its plan came from (a generation request
/// longer than the one it was planned from) records nothing, where the same iteration
/// within the trajectory records the plan's figure.
#[test]
fn the_guard_does_not_judge_a_plan_by_an_iteration_longer_than_its_trajectory() {
    use crate::tier::planned::Guard;
    for halves in [1, 2] {
        let (mut m, _) = manager(3);
        let mut p = Planner::new(0.8, None);
        p.guard = Some(Guard::default());
        m.set_planner(p);
        // With a 1 MiB weight one pass peaks at 2.5 MiB, above the 2 MiB budget.
        let w_bytes = 1024 * KIB;
        let (w, w_data) = weight(&mut m, w_bytes);
        m.set_next_trajectory(logged(&ops_of(w, w_bytes, 1), w_bytes));
        m.iteration_boundary().unwrap();
        assert!(m.planner().unwrap().has_moves());
        // The trajectory's one pass, or a second one after it: past its end.
        for half in 0..halves {
            pass(&mut m, (w, &w_data), 0, half);
        }
        assert_eq!(m.planner().unwrap().past_end(), halves == 2);
        m.iteration_boundary().unwrap();
        m.check_invariants().unwrap();
        let g = m.planner().unwrap().guard.as_ref().unwrap();
        let judged = g.shapes.iter().any(|(_, r)| r.planned.is_some());
        assert_eq!(judged, halves == 1, "{halves} passes: {g:?}");
    }
}

/// Plans are advice, and the guard stops following advice that costs more than it
/// saves: on the synthetic MLP preset at 60% of peak (weights above the budget, the
/// link the bottleneck) a plan from the last iteration stalls far more than reactive
/// tiers; with the guard, iterations of its shape run without it once one planned
/// iteration measured worse, and the stall falls back towards reactive's.
#[test]
fn the_plan_guard_turns_off_plans_that_raise_the_stall() {
    use crate::config::Actions;
    use crate::replay::ReplayForecaster;
    use crate::tier::{replay_budgeted, Budget, TierReplayOptions};
    use memcast_trace::synth::{generate, Family, SynthConfig};
    let t = generate(&SynthConfig::preset(Family::Mlp)).unwrap();
    let plan = Actions {
        plan: true,
        ..Actions::none()
    };
    let run = |guard: bool, predictive| {
        let mut opts = TierReplayOptions {
            budget: Budget::Fraction(0.6),
            predictive,
            ..Default::default()
        };
        opts.tier.plan_guard = guard;
        replay_budgeted(&t, &opts).unwrap()
    };
    let reactive = run(true, None);
    let off = run(false, Some((ReplayForecaster::None, plan)));
    let on = run(true, Some((ReplayForecaster::None, plan)));
    assert!(off.completed && on.completed);
    assert_eq!(off.planned_suppressed, 0);
    assert!(on.planned_suppressed >= 4, "{}", on.planned_suppressed);
    assert!(
        off.stall_overhead > 1.3 * reactive.stall_overhead,
        "the case: plans hurt here ({} vs {})",
        off.stall_overhead,
        reactive.stall_overhead
    );
    assert!(
        on.stall_overhead < 0.8 * off.stall_overhead,
        "guard {} vs none {}",
        on.stall_overhead,
        off.stall_overhead
    );
    // The oracle's plans are never compared (it plans from the first iteration on).
    let oracle = run(true, Some((ReplayForecaster::Oracle, plan)));
    assert_eq!(oracle.planned_suppressed, 0);
}

/// A wrapped move whose spill still waits at the boundary (its tensor was read in the
/// iteration's last step, and its window is a peak later in that step) relieved a
/// window that has passed: it is dropped, and the tensor stays on the device. (Issued
/// after the boundary, the spill was hidden from the window prefetcher and due to
/// nothing: the tensor was on its way out when the next iteration read it.)
#[test]
fn a_planned_spill_still_waiting_at_the_boundary_is_dropped() {
    let (mut m, _) = manager(3);
    m.set_planner(Planner::new(0.8, None));
    let w_bytes = 512 * KIB;
    let (w, w_data) = weight(&mut m, w_bytes);
    // One pass over the activations, then a last step that reads the weight and
    // makes a peak of its own: nine 128 KiB tensors allocated and freed in the same
    // step (with the weight, 1.625 MiB: over the 1.6 MiB cap).
    const LAST: u32 = 9;
    let mut ops = ops_of(w, w_bytes, 1);
    let last_read = ops.len();
    ops.push((TensorKey::Persistent(w), w_bytes, OpUse::Access));
    for i in 0..LAST {
        ops.push((TensorKey::Ordinal(ACTS + i), 128 * KIB, OpUse::Alloc));
    }
    for i in (0..LAST).rev() {
        ops.push((TensorKey::Ordinal(ACTS + i), 128 * KIB, OpUse::Free));
    }
    let traj = logged(&ops, w_bytes);
    let plan = crate::tier::schedule::plan(
        &traj,
        (0.8 * (2u64 << 20) as f64) as u64,
        m.planner().unwrap().link,
    );
    assert!(
        plan.moves.iter().any(|mv| mv.wraps
            && mv.key == TensorKey::Persistent(w)
            && mv.spill_after == last_read),
        "the case needs a wrapped move from the last read: {plan:?}"
    );
    m.set_next_trajectory(traj.clone());
    m.iteration_boundary().unwrap();
    for it in 0..3u64 {
        pass(&mut m, (w, &w_data), it, 0);
        // The last step: no end_step before the boundary.
        assert_eq!(read(&mut m, w).unwrap(), w_data, "iteration {it}");
        let last: Vec<_> = (0..LAST)
            .map(|_| m.register(128 * KIB, TensorOpts::default()).unwrap())
            .collect();
        for h in last.into_iter().rev() {
            m.free(h).unwrap();
        }
        assert!(
            matches!(m.place(w).unwrap(), Place::Device { .. }),
            "pinned by its step: not spilled yet"
        );
        m.set_next_trajectory(traj.clone());
        m.iteration_boundary().unwrap();
        m.check_invariants().unwrap();
        let p = m.planner().unwrap();
        assert!(p.pending_spills.is_empty(), "iteration {it}");
        assert!(
            matches!(m.place(w).unwrap(), Place::Device { .. }),
            "iteration {it}: after the boundary {:?}",
            m.place(w).unwrap()
        );
    }
}

/// The link-idle condition of a deferred wrapped move: its copy in is not issued
/// while another tensor's copy in is in flight. Copies here run only when waited for
/// (`hold_on_query`: copies out run at once, copies in when waited for), the plan's cap leaves room for a few activations only
/// (so the plan moves activations besides the weight), and the trajectory's
/// operations are `us` apart: at 0.5 us the weight's copy takes many operations, so
/// its planned point falls within the backward while the activations come back.
/// Returns, over six iterations, the times the weight's copy in was first seen in
/// flight together with an activation's copy issued before it, and how many times
/// the weight was back before a boundary.
fn weight_copy_beside_activations(us: f64) -> (u32, u32) {
    let (mut m, _) = manager(3);
    let (_, in_stream) = m.pipe.streams();
    m.backend_mut().inner.hold_on_query = Some(in_stream);
    m.set_planner(Planner::new(0.5, None));
    let w_bytes = 256 * KIB;
    let (w, w_data) = weight(&mut m, w_bytes);
    let mut traj = logged(&ops_of(w, w_bytes, 1), w_bytes);
    for op in &mut traj.ops {
        op.t *= us / 10.0;
    }
    traj.span_us *= us / 10.0;
    m.set_next_trajectory(traj.clone());
    m.iteration_boundary().unwrap();
    let (mut overlaps, mut early) = (0, 0);
    let in_flight = |p: &Place| matches!(p, Place::PrefetchingIn { .. });
    for it in 0..6u64 {
        let mut before: Vec<TensorHandle> = Vec::new();
        let mut w_was_in = in_flight(&m.place(w).unwrap());
        // After each step: the activations whose copy in is in flight, and whether the
        // weight's copy in was first seen in flight beside one seen before it.
        let mut look = |m: &TierManager<TestBackend>, live: &[(TensorHandle, Vec<u8>)]| {
            let now: Vec<TensorHandle> = live
                .iter()
                .map(|(h, _)| *h)
                .filter(|&h| in_flight(&m.place(h).unwrap()))
                .collect();
            let w_in = in_flight(&m.place(w).unwrap());
            if w_in && !w_was_in && now.iter().any(|h| before.contains(h)) {
                overlaps += 1;
            }
            w_was_in = w_in;
            before = now;
        };
        assert_eq!(read(&mut m, w).unwrap(), w_data, "iteration {it}");
        m.end_step();
        let mut live = Vec::new();
        for i in 0..ACTS {
            let h = m.register(128 * KIB, TensorOpts::default()).unwrap();
            let data = pattern(it * 100 + u64::from(i), 128 * KIB);
            write(&mut m, h, &data).unwrap();
            m.end_step();
            live.push((h, data));
            look(&m, &live);
        }
        while let Some((h, data)) = live.pop() {
            assert_eq!(read(&mut m, h).unwrap(), data, "iteration {it}");
            m.end_step();
            look(&m, &live);
            m.free(h).unwrap();
            look(&m, &live);
        }
        m.check_invariants().unwrap();
        early += u32::from(back(&m.place(w).unwrap()));
        m.set_next_trajectory(traj.clone());
        m.iteration_boundary().unwrap();
    }
    let s = &m.planner().unwrap().stats;
    assert!(
        s.spills > 6 && s.prefetches > 6,
        "the plan moves activations too: {s:?}"
    );
    (overlaps, early)
}

/// Deferred, the weight's copy in is issued only once the activations' copies in
/// ahead of it have landed, and it is still back before every boundary. (Without the
/// link-idle condition it was issued beside one in every iteration: 6 of 6.)
#[test]
fn a_wrapped_move_waits_for_the_copies_in_ahead_of_it() {
    let (overlaps, early) = weight_copy_beside_activations(0.5);
    assert_eq!(overlaps, 0, "issued beside an activation's copy in");
    assert_eq!(early, 6, "back before the boundary");
}

/// Past the end of the trajectory its plan was made from (a second pass where the
/// plan's trajectory had one), an iteration is `past_end`, where the plan's wrapped
/// moves wait for the next iteration's start; the next iteration's plan starts afresh.
#[test]
fn an_iteration_longer_than_its_plan_is_past_its_end() {
    let w_bytes = 512 * KIB;
    let (mut m, _) = manager(5);
    m.set_planner(Planner::new(0.8, None));
    let (w, w_data) = weight(&mut m, w_bytes);
    let one = logged(&ops_of(w, w_bytes, 1), w_bytes);
    for it in 0..3u64 {
        m.set_next_trajectory(one.clone());
        m.iteration_boundary().unwrap();
        let p = m.planner().unwrap();
        assert!(
            p.has_moves() && !p.past_end(),
            "iteration {it}: at the start"
        );
        pass(&mut m, (w, &w_data), it, 0);
        assert!(
            !m.planner().unwrap().past_end(),
            "iteration {it}: the planned pass"
        );
        // One operation more than the plan's trajectory.
        assert_eq!(read(&mut m, w).unwrap(), w_data);
        m.end_step();
        assert!(
            m.planner().unwrap().past_end(),
            "iteration {it}: past the end"
        );
        m.check_invariants().unwrap();
    }
}
