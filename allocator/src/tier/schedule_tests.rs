//! Unit tests of the iteration planner (`schedule.rs`): the cover, drops, wrapped
//! gaps, link occupancy and the segment tree.

use super::*;

fn k(n: u32) -> TensorKey {
    TensorKey::Ordinal(n)
}
/// A link of `rate` bytes per microsecond each way, no fixed cost.
fn link_at(rate: f64) -> LinkModel {
    LinkModel {
        out_bytes_per_us: rate,
        in_bytes_per_us: rate,
        latency_us: 0.0,
        occupancy: false,
    }
}
fn op(key: TensorKey, bytes: u64, kind: OpUse, t: f64) -> LoggedOp {
    LoggedOp {
        key,
        bytes,
        kind,
        t,
    }
}

/// A forward of `layers` activations of `s` bytes each, 10 us apart, then a
/// backward reading and freeing them in reverse, 20 us apart.
fn fwd_bwd(layers: u32, s: u64) -> Trajectory {
    let mut ops = Vec::new();
    let mut t = 0.0;
    for i in 0..layers {
        t += 10.0;
        ops.push(op(k(i), s, OpUse::Alloc, t));
    }
    for i in (0..layers).rev() {
        t += 20.0;
        ops.push(op(k(i), s, OpUse::Access, t));
        ops.push(op(k(i), s, OpUse::Free, t));
    }
    Trajectory {
        ops,
        base: 0,
        span_us: t,
        ..Default::default()
    }
}

/// The resident bytes of `traj` after each operation under `plan`, if every copy
/// took exactly its own time: spilled from `spill_after + 1` to `prefetch_at - 1`.
fn resident(traj: &Trajectory, plan: &Plan) -> Vec<u64> {
    let mut out = Vec::new();
    let mut l = traj.base as i128;
    for (p, o) in traj.ops.iter().enumerate() {
        match o.kind {
            OpUse::Alloc => l += o.bytes as i128,
            OpUse::Free => l -= o.bytes as i128,
            OpUse::Access => {}
        }
        let off: i128 = plan
            .moves
            .iter()
            .filter(|m| m.spill_after < p && p < m.prefetch_at)
            .map(|m| m.bytes as i128)
            .sum();
        out.push((l - off) as u64);
    }
    out
}

#[test]
fn nothing_moves_when_the_trajectory_fits() {
    let t = fwd_bwd(8, 100);
    let p = plan(&t, 800, LinkModel::default());
    assert!(p.moves.is_empty());
    assert_eq!(p.peak, 800);
    assert_eq!(p.residual_excess, 0);
}

#[test]
fn the_earliest_activations_leave_first_and_the_plan_fits_the_cap() {
    // 8 x 1 MB; cap 5 MB: at least 3 must leave, and the first ones created (read
    // last) have the longest gaps.
    let s = 1_000_000;
    let t = fwd_bwd(8, s);
    let link = link_at(1e6);
    let p = plan(&t, 5 * s, link);
    assert_eq!(p.residual_excess, 0, "{p:?}");
    let keys: Vec<TensorKey> = p.moves.iter().map(|m| m.key).collect();
    assert_eq!(keys, vec![k(0), k(1), k(2)], "{p:?}");
    assert!(resident(&t, &p).iter().all(|&r| r <= 5 * s));
    for m in &p.moves {
        assert!(m.spill_after < m.prefetch_at && m.prefetch_at < m.needed_at);
    }
}

#[test]
fn a_link_too_slow_for_any_gap_moves_nothing_and_says_what_is_left() {
    let s = 1_000_000;
    let t = fwd_bwd(8, s);
    // 1 byte/us: no copy of 1 MB fits in any gap.
    let link = link_at(1.0);
    let p = plan(&t, 5 * s, link);
    assert!(p.moves.is_empty(), "{p:?}");
    assert_eq!(p.residual_excess, 3 * s);
}

#[test]
fn gaps_too_short_for_copies_drop_tensors_whose_recompute_is_cheap() {
    let s = 1_000_000;
    let mut t = fwd_bwd(8, s);
    let link = link_at(1.0);
    // Recompute costs of 5 us (cheap against 2 s of copies), except one that costs
    // more than its copies would leave unhidden.
    for i in 0..8 {
        t.recompute_us.insert(k(i), 5.0);
    }
    t.recompute_us.insert(k(1), 1e9);
    let p = plan(&t, 5 * s, link);
    assert_eq!(p.residual_excess, 0, "{p:?}");
    assert!(!p.moves.is_empty() && p.moves.iter().all(|m| m.drop));
    assert!(p.moves.iter().all(|m| m.key != k(1)));
    for m in &p.moves {
        // Off from just after its allocation until its access, where it is recomputed.
        assert_eq!(m.prefetch_at, m.needed_at);
        assert_eq!(t.ops[m.needed_at].kind, OpUse::Access);
        assert_eq!(t.ops[m.needed_at].key, m.key);
    }
    // A link fast enough to hide the copies spills instead.
    let p = plan(&t, 5 * s, link_at(1e6));
    assert!(
        !p.moves.is_empty() && p.moves.iter().all(|m| !m.drop),
        "{p:?}"
    );
}

#[test]
fn with_occupancy_copies_queue_on_the_link_and_the_plan_says_what_it_cannot_cover() {
    // 8 x 1 MB allocated 10 us apart, copies of 25 us: spilled back to back, the
    // third one ends at 85 us, after the peak (80 us).
    let s = 1_000_000;
    let t = fwd_bwd(8, s);
    let alone = link_at(s as f64 / 25.0);
    let p = plan(&t, 5 * s, alone);
    assert_eq!(p.residual_excess, 0, "{p:?}");
    let queued = LinkModel {
        occupancy: true,
        ..alone
    };
    let q = plan(&t, 5 * s, queued);
    assert_eq!(q.residual_excess, s, "{q:?}");
    // What it chose fits the link: the spills end 25 us apart at the earliest.
    let mut ends: Vec<f64> = q.moves.iter().map(|m| t.ops[m.spill_after].t).collect();
    ends.sort_by(f64::total_cmp);
    let mut free = 0.0f64;
    for a in ends {
        free = free.max(a) + 25.0;
    }
    assert!(free <= t.span_us, "{q:?}");
    for m in &q.moves {
        assert!(m.spill_after < m.prefetch_at && m.prefetch_at < m.needed_at);
    }
}

#[test]
fn a_persistent_tensor_wraps_the_boundary() {
    // A parameter read at the start, then a peak of activations: the parameter's
    // gap wraps into the next iteration and is the longest.
    let pk = TensorKey::Persistent(crate::tier::TensorHandle { index: 7, gen: 0 });
    let s = 1_000_000;
    let mut ops = vec![op(pk, 4 * s, OpUse::Access, 0.0)];
    let mut tt = 0.0;
    for i in 0..4 {
        tt += 100.0;
        ops.push(op(k(i), s, OpUse::Alloc, tt));
    }
    for i in (0..4).rev() {
        tt += 100.0;
        ops.push(op(k(i), s, OpUse::Access, tt));
        ops.push(op(k(i), s, OpUse::Free, tt));
    }
    let t = Trajectory {
        ops,
        base: 4 * s,
        span_us: tt + 100.0,
        ..Default::default()
    };
    let link = link_at(1e6);
    let p = plan(&t, 6 * s, link);
    assert_eq!(p.residual_excess, 0, "{p:?}");
    let m = p
        .moves
        .iter()
        .find(|m| m.key == pk)
        .expect("parameter moves");
    assert!(m.wraps);
    assert_eq!(m.spill_after, 0);
    assert_eq!(m.needed_at, 0);
    assert!(m.prefetch_at < t.ops.len());
}

#[test]
fn the_tree_finds_the_maximum_after_range_adds() {
    let mut t = MaxTree::new(&[1, 5, 3, 2, 4]);
    assert_eq!(t.max(), (1, 5));
    t.add(0, 2, -10);
    assert_eq!(t.max(), (4, 4));
    t.add(2, 3, 20);
    assert_eq!(t.max(), (3, 22));
    t.add(3, 3, -100);
    assert_eq!(t.max(), (2, 13));
}

/// A prefetch issued at an operation holds its memory from that operation on, so the
/// last position of a window is one whose next operation may still start the copy in.
/// Here A (10 B) leaves after its allocation and its window ends at the peak (F,
/// 100 B, at t = 80), so counted as off there it looks like the longest cover; but
/// A's copy in (10 us at 1 B/us, by t = 100) must start at the peak's own operation.
/// Only B (10 B, read at 106, copy in from t = 95) can be off at the peak.
#[test]
fn a_tensor_whose_copy_in_starts_at_the_peak_does_not_cover_it() {
    let ops = vec![
        op(k(0), 10, OpUse::Alloc, 0.0),
        op(k(1), 1, OpUse::Alloc, 20.0),
        op(k(2), 10, OpUse::Alloc, 30.0),
        op(k(3), 100, OpUse::Alloc, 80.0),
        op(k(3), 100, OpUse::Free, 95.0),
        op(k(0), 10, OpUse::Access, 100.0),
        op(k(2), 10, OpUse::Access, 106.0),
    ];
    let t = Trajectory {
        ops,
        base: 0,
        span_us: 110.0,
        ..Default::default()
    };
    let cap = 10 + 1 + 10 + 100 - 5;
    let p = plan(&t, cap, link_at(1.0));
    assert_eq!(p.residual_excess, 0, "{p:?}");
    assert!(resident(&t, &p).iter().all(|&r| r <= cap), "{p:?}");
    assert!(p.moves.iter().any(|m| m.key == k(2)), "{p:?}");
}

/// A gap whose only position is the peak, where its copy in must already start,
/// relieves nothing: no round trip is planned for it.
#[test]
fn a_window_that_ends_where_it_starts_plans_no_round_trip() {
    let ops = vec![
        op(k(0), 10, OpUse::Alloc, 0.0),
        op(k(1), 100, OpUse::Alloc, 50.0),
        op(k(1), 100, OpUse::Free, 95.0),
        op(k(0), 10, OpUse::Access, 100.0),
    ];
    let t = Trajectory {
        ops,
        base: 0,
        span_us: 110.0,
        ..Default::default()
    };
    let p = plan(&t, 105, link_at(1.0));
    assert!(p.moves.is_empty(), "{p:?}");
    assert_eq!(p.residual_excess, 5);
}

#[test]
fn tensors_smaller_than_a_copys_fixed_cost_stay() {
    // Twenty 1 kB tensors made first and read last (the longest windows of the
    // iteration) beside a forward and backward of four 100 kB activations; 110 kB
    // must leave at the peak. At 0.5 us a copy and 100 kB/us, a copy of 1 kB spends
    // 0.5 us in fixed cost and 0.01 us moving bytes (the bound is 50 kB): the
    // activations cover the excess, and no small tensor moves.
    let link = LinkModel {
        out_bytes_per_us: 100_000.0,
        in_bytes_per_us: 100_000.0,
        latency_us: 0.5,
        occupancy: false,
    };
    let small = |i: u32| TensorKey::Ordinal(100 + i);
    let mut t = fwd_bwd(4, 100_000);
    let mut ops: Vec<LoggedOp> = (0..20)
        .map(|i| op(small(i), 1_000, OpUse::Alloc, 1.0))
        .collect();
    ops.append(&mut t.ops);
    ops.extend((0..20).map(|i| op(small(i), 1_000, OpUse::Access, 130.0)));
    t.ops = ops;
    t.span_us = 130.0;
    let cap = 420_000 - 110_000;
    let p = plan(&t, cap, link);
    assert_eq!(p.residual_excess, 0, "{p:?}");
    assert!(resident(&t, &p).iter().all(|&l| l <= cap), "{p:?}");
    assert!(p.moves.iter().all(|m| m.bytes == 100_000), "{:?}", p.moves);
    // Without a fixed cost every gap is a candidate, and the small ones, whose
    // windows are longest, are taken first.
    let free_copies = LinkModel {
        latency_us: 0.0,
        ..link
    };
    let p = plan(&t, cap, free_copies);
    assert!(p.moves.iter().any(|m| m.bytes == 1_000), "{:?}", p.moves);
}
