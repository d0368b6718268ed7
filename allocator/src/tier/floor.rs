//! The peak floor of a budgeted replay: per iteration, [`iteration_floor`] of the
//! trace's own trajectory (every tensor resident, the trace's compute times), summed.
//! A lower bound on the stall of any policy that only moves whole tensors, at the
//! link's peak bandwidths: what the stall of a policy should be compared with.

use std::collections::HashMap;

use super::access::{Op, OpKind};
use super::handle::TensorKey;
use super::schedule::{LinkModel, LoggedOp, OpUse, Trajectory};

/// A lower bound on the stall of one iteration under a budget, for any policy that
/// moves whole tensors (no recomputation), from the iteration's highest point: at the
/// peak `t_p`, `E = L(t_p) - budget` bytes must be off the device. They left over one
/// link after they were last used before the peak, and come back over the other
/// before their next use: the least stall before the peak is that of the `E` bytes
/// last used earliest, sent back to back (`max_s (sum_{used >= s} bytes / bw - (t_p -
/// s))`), and after it symmetrically that of the `E` bytes needed latest (the two
/// sets chosen apart). A tensor's device memory is free only once all of it has
/// left, so each side is also at least the smallest `c` such that the tensors whose
/// own trip costs at most `c` (`bytes / bw - slack`) hold `E` bytes. Only this
/// iteration's uses constrain: a tensor not used before the peak may have left
/// before the iteration began, one not read after it need not come back within it;
/// so each iteration's bound holds whatever the other iterations do, the bounds
/// count stalls of disjoint spans, and their sum bounds a whole replay. Returns
/// `(before_us, after_us)`; `(0, 0)` when the trajectory fits. [`iteration_floor`]
/// adds the iteration's other peaks.
pub fn peak_floor(traj: &Trajectory, budget: u64, link: LinkModel) -> (f64, f64) {
    let n = traj.ops.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let live_after: Vec<i128> = traj.live_after().collect();
    let mut at = 0usize;
    for (p, &l) in live_after.iter().enumerate() {
        if l > live_after[at] {
            at = p;
        }
    }
    window_floor(traj, &live_after, 0..n, at, budget, link)
}

/// The floor of one iteration: the larger of [`peak_floor`] and the sum over its
/// peaks. Every maximal run of operations above the budget has a peak (its highest
/// point); the iteration is cut at the lowest point between two runs, and each
/// piece's bound counts only the uses inside it (a tensor last used before the piece
/// may have left before it, one next used after it may come back after it), so the
/// stalls the pieces bound lie in disjoint spans and add up. O(n log n).
pub fn iteration_floor(traj: &Trajectory, budget: u64, link: LinkModel) -> f64 {
    let n = traj.ops.len();
    if n == 0 {
        return 0.0;
    }
    let live_after: Vec<i128> = traj.live_after().collect();
    let cap = budget as i128;
    // The peak of each run above the budget, and the lowest point after each run
    // (up to the next run).
    let mut peaks: Vec<usize> = Vec::new();
    let mut valleys: Vec<usize> = Vec::new();
    let mut in_run = false;
    for (p, &l) in live_after.iter().enumerate() {
        if l > cap {
            if !in_run {
                peaks.push(p);
                in_run = true;
            } else if l > live_after[*peaks.last().unwrap()] {
                *peaks.last_mut().unwrap() = p;
            }
        } else {
            if in_run {
                valleys.push(p);
                in_run = false;
            } else if let Some(v) = valleys.last_mut() {
                if l < live_after[*v] {
                    *v = p;
                }
            }
        }
    }
    let (b, a) = peak_floor(traj, budget, link);
    let global = b + a;
    if peaks.len() < 2 {
        return global;
    }
    // Pieces: `[0, v_0]`, `(v_0, v_1]`, ..., `(v_{k-2}, n)`; a valley after the last
    // peak is not a cut.
    let mut sum = 0.0;
    let mut lo = 0usize;
    for (i, &at) in peaks.iter().enumerate() {
        let hi = if i + 1 < peaks.len() {
            valleys[i] + 1
        } else {
            n
        };
        let (b, a) = window_floor(traj, &live_after, lo..hi, at, budget, link);
        sum += b + a;
        lo = hi;
    }
    global.max(sum)
}

/// The bound of [`peak_floor`] at operation `at`, counting only the uses of the
/// operations in `window` (which holds `at`).
fn window_floor(
    traj: &Trajectory,
    live_after: &[i128],
    window: std::ops::Range<usize>,
    at: usize,
    budget: u64,
    link: LinkModel,
) -> (f64, f64) {
    let peak = live_after[at];
    let excess = peak - budget as i128;
    if excess <= 0 {
        return (0.0, 0.0);
    }
    let tp = traj.ops[at].t;
    // The tensors live at the peak and their uses. A tensor with no use before the
    // peak in the window may have left before the window began, and one with no
    // access after it need not come back within it: both get an unbounded slack
    // below (only the window's uses constrain; see `peak_floor`'s docs). Live
    // bytes no operation of the window names are free to move.
    let mut state: HashMap<TensorKey, (bool, Option<f64>, u64)> = HashMap::new();
    for op in &traj.ops[window.start..=at] {
        match op.kind {
            OpUse::Alloc => {
                state.insert(op.key, (true, Some(op.t), op.bytes));
            }
            OpUse::Access => {
                let e = state.entry(op.key).or_insert((true, None, op.bytes));
                e.1 = Some(op.t);
            }
            OpUse::Free => {
                state.insert(op.key, (false, None, op.bytes));
            }
        }
    }
    let after_ops = &traj.ops[at + 1..window.end];
    // Live before the peak's uses and first named after the peak (read, or freed, later).
    for op in after_ops {
        let from_start = op.kind != OpUse::Alloc;
        state.entry(op.key).or_insert((from_start, None, op.bytes));
    }
    // After the peak: the next access, unless a free comes first.
    let mut next: HashMap<TensorKey, Option<f64>> = HashMap::new();
    for op in after_ops {
        if next.contains_key(&op.key) {
            continue;
        }
        match op.kind {
            OpUse::Access => {
                next.insert(op.key, Some(op.t));
            }
            OpUse::Free => {
                next.insert(op.key, None);
            }
            OpUse::Alloc => {}
        }
    }
    let mut before = Vec::new();
    let mut after = Vec::new();
    let mut seen = 0u64;
    for (k, &(live, last, bytes)) in &state {
        if !live {
            continue;
        }
        seen += bytes;
        before.push((last.map_or(f64::INFINITY, |t| tp - t), bytes));
        let nx = next.get(k).copied().flatten();
        after.push((nx.map_or(f64::INFINITY, |t| t - tp), bytes));
    }
    let free_bytes = (peak.max(0) as u64).saturating_sub(seen);
    let need = (excess as u64).saturating_sub(free_bytes);
    if need == 0 {
        return (0.0, 0.0);
    }
    (
        side_bound(before, need, link.out_bytes_per_us),
        side_bound(after, need, link.in_bytes_per_us),
    )
}

/// The least stall of moving `need` bytes of `items` (slack: time from its use to the
/// peak, or from the peak to its use; bytes) over a link of `rate` bytes/us: the
/// larger of the fluid bound (the `need` bytes of most slack, in the order of the
/// link, least slack last: the worst of `(bytes queued up to and including the
/// item) / rate - its slack`) and the whole-tensor bound (tensors in order of their
/// own trip `bytes / rate - slack` until they hold `need`: the last one's trip).
fn side_bound(mut items: Vec<(f64, u64)>, need: u64, rate: f64) -> f64 {
    items.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut chosen = Vec::new();
    let mut sent = 0u64;
    for &(slack, b) in &items {
        if sent >= need {
            break;
        }
        let take = b.min(need - sent);
        sent += take;
        chosen.push((slack, take));
    }
    // On the link: before the peak in order of release (most slack first), the bytes
    // after an item are what delays the peak; after the peak, deadlines in increasing
    // order (least slack first).
    chosen.reverse();
    let (mut queued, mut worst) = (0u64, 0.0f64);
    for (slack, b) in chosen {
        queued += b;
        worst = worst.max(queued as f64 / rate - slack);
    }
    // Whole tensors: any set holding `need` bytes has a member whose own trip costs
    // at least the `need`-th byte's in order of trip cost.
    let mut trips: Vec<(f64, u64)> = items
        .iter()
        .map(|&(slack, b)| (b as f64 / rate - slack, b))
        .collect();
    trips.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut held = 0u64;
    for (c, b) in trips {
        held += b;
        if held >= need {
            worst = worst.max(c);
            break;
        }
    }
    worst.max(0.0)
}

/// The trajectories of the iterations of `program` (the part before the first
/// boundary is one too), with keys by trace tensor id.
pub fn trajectories(program: &[Op], bytes_of: &HashMap<u64, u64>) -> Vec<Trajectory> {
    let mut out = Vec::new();
    let mut cur = Trajectory::default();
    let (mut t, mut t0) = (0.0f64, 0.0f64);
    let mut live = 0u64;
    let mut ids: HashMap<u64, u32> = HashMap::new();
    let mut key = |id: u64| {
        let n = ids.len() as u32;
        TensorKey::Ordinal(*ids.entry(id).or_insert(n))
    };
    for op in program {
        let logged = match op.kind {
            OpKind::Advance(us) => {
                t += us as f64;
                None
            }
            OpKind::EndStep => None,
            OpKind::IterationBoundary => {
                cur.span_us = t - t0;
                let base = live;
                out.push(std::mem::replace(
                    &mut cur,
                    Trajectory {
                        ops: Vec::new(),
                        base,
                        span_us: 0.0,
                        ..Default::default()
                    },
                ));
                t0 = t;
                None
            }
            OpKind::Alloc { id, bytes, .. } if bytes > 0 => {
                live += bytes;
                Some((key(id), bytes, OpUse::Alloc))
            }
            OpKind::Access { id, .. } => bytes_of
                .get(&id)
                .filter(|&&b| b > 0)
                .map(|&b| (key(id), b, OpUse::Access)),
            OpKind::Free { id } => bytes_of.get(&id).filter(|&&b| b > 0).map(|&b| {
                live = live.saturating_sub(b);
                (key(id), b, OpUse::Free)
            }),
            OpKind::Alloc { .. } => None,
        };
        if let Some((key, bytes, kind)) = logged {
            cur.ops.push(LoggedOp {
                key,
                bytes,
                kind,
                t: t - t0,
            });
        }
    }
    cur.span_us = t - t0;
    out.push(cur);
    out
}

/// The trajectory of the iteration that begins with `program` (up to its next
/// boundary), under the keys a [`TierManager`](super::TierManager) logs: tensors
/// registered in it by ordinal, the others (live at its start, `live`) by handle;
/// `base` is the bytes registered at its start. What the oracle plans from.
pub fn upcoming(
    program: &[Op],
    bytes_of: &HashMap<u64, u64>,
    live: &HashMap<u64, super::TensorHandle>,
    base: u64,
) -> Trajectory {
    let mut traj = Trajectory {
        base,
        ..Trajectory::default()
    };
    let mut ordinal: HashMap<u64, u32> = HashMap::new();
    let mut t = 0.0f64;
    for op in program {
        let (id, kind) = match op.kind {
            OpKind::Advance(us) => {
                t += us as f64;
                continue;
            }
            OpKind::EndStep => continue,
            OpKind::IterationBoundary => break,
            OpKind::Alloc {
                id,
                bytes,
                persistent,
            } => {
                // A persistent registration takes no ordinal in the manager (and no
                // handle is known for it yet): not planned.
                if bytes == 0 || persistent {
                    continue;
                }
                let n = ordinal.len() as u32;
                ordinal.insert(id, n);
                (id, OpUse::Alloc)
            }
            OpKind::Access { id, .. } => (id, OpUse::Access),
            OpKind::Free { id } => (id, OpUse::Free),
        };
        let key = match (ordinal.get(&id), live.get(&id)) {
            (Some(&n), _) => TensorKey::Ordinal(n),
            (None, Some(&h)) => TensorKey::Persistent(h),
            (None, None) => continue,
        };
        let Some(&bytes) = bytes_of.get(&id).filter(|&&b| b > 0) else {
            continue;
        };
        traj.ops.push(LoggedOp {
            key,
            bytes,
            kind,
            t,
        });
    }
    traj.span_us = t;
    traj
}

/// The summed peak floor of `program` under `budget` bytes over `link` (its
/// [`LinkModel::peak_of`]), us.
pub fn replay_floor(
    program: &[Op],
    bytes_of: &HashMap<u64, u64>,
    budget: u64,
    link: LinkModel,
) -> f64 {
    trajectories(program, bytes_of)
        .iter()
        .map(|tr| iteration_floor(tr, budget, link))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_floor_of_a_forward_and_backward_by_hand() {
        // Four 1 MB activations made at t = 10, 20, 30, 40 and read and freed at 60,
        // 70, 80, 90 in reverse; a budget of 2 MB: 2 MB must be off at the peak (t =
        // 40). At 1 MB per 20 us, the two made first (free from 10 and 20) are out by
        // 30 and 50: 10 us late. After the peak the two needed last (at 80 and 90)
        // come back in time.
        let k = TensorKey::Ordinal;
        let mb = 1_000_000;
        let mut ops = Vec::new();
        for i in 0..4u32 {
            ops.push(LoggedOp {
                key: k(i),
                bytes: mb,
                kind: OpUse::Alloc,
                t: 10.0 * f64::from(i + 1),
            });
        }
        for (j, i) in (0..4u32).rev().enumerate() {
            let t = 60.0 + 10.0 * j as f64;
            for kind in [OpUse::Access, OpUse::Free] {
                ops.push(LoggedOp {
                    key: k(i),
                    bytes: mb,
                    kind,
                    t,
                });
            }
        }
        let traj = Trajectory {
            ops,
            base: 0,
            span_us: 100.0,
            ..Default::default()
        };
        let link = LinkModel {
            out_bytes_per_us: mb as f64 / 20.0,
            in_bytes_per_us: mb as f64 / 20.0,
            latency_us: 0.0,
            occupancy: false,
        };
        let (before, after) = peak_floor(&traj, 2 * mb, link);
        assert!((before - 10.0).abs() < 1e-9, "{before}");
        assert_eq!(after, 0.0);
        // A slower link back: 1 MB per 45 us: the tensors needed at 80 and 90 (slack
        // 40 and 50) take 45 and 90 us from the peak: 5 and 40 us late.
        let slow = LinkModel {
            in_bytes_per_us: mb as f64 / 45.0,
            ..link
        };
        let (_, after) = peak_floor(&traj, 2 * mb, slow);
        assert!((after - 40.0).abs() < 1e-9, "{after}");
        // Within the budget: nothing to move.
        assert_eq!(peak_floor(&traj, 4 * mb, link), (0.0, 0.0));
    }

    fn op(i: u32, bytes: u64, kind: OpUse, t: f64) -> LoggedOp {
        LoggedOp {
            key: TensorKey::Ordinal(i),
            bytes,
            kind,
            t,
        }
    }

    /// 1 MB per 20 us both ways, no latency.
    fn slow_link() -> LinkModel {
        LinkModel {
            out_bytes_per_us: 1_000_000.0 / 20.0,
            in_bytes_per_us: 1_000_000.0 / 20.0,
            latency_us: 0.0,
            occupancy: false,
        }
    }

    #[test]
    fn a_tensor_leaves_whole() {
        // A 3 MB tensor made at t = 0 and a 1 MB one at t = 10, both read and freed at
        // t = 100; a budget of 2 MB: 2 MB must be off at t = 10. As a fluid, 2 MB of
        // the large one leave from t = 0 (40 us: 30 late); whole, it is all 3 MB (60
        // us: 50 late) or the small one, made at the peak (20 us late), which alone
        // is not enough. After the peak both are read 90 us later: in time.
        let mb = 1_000_000;
        let traj = Trajectory {
            ops: vec![
                op(0, 3 * mb, OpUse::Alloc, 0.0),
                op(1, mb, OpUse::Alloc, 10.0),
                op(0, 3 * mb, OpUse::Access, 100.0),
                op(0, 3 * mb, OpUse::Free, 100.0),
                op(1, mb, OpUse::Access, 100.0),
                op(1, mb, OpUse::Free, 100.0),
            ],
            base: 0,
            span_us: 100.0,
            ..Default::default()
        };
        let (before, after) = peak_floor(&traj, 2 * mb, slow_link());
        assert!((before - 50.0).abs() < 1e-9, "{before}");
        assert_eq!(after, 0.0);
    }

    #[test]
    fn each_peak_of_an_iteration_adds_its_stall() {
        // The pattern of `a_tensor_leaves_whole` twice, 1,000 us apart, with nothing
        // live between: each peak costs 50 us before it, and the second one is as
        // high as the first, so the highest point alone bounds only one of them.
        let mb = 1_000_000;
        let mut ops = Vec::new();
        for (n, t0) in [(0u32, 0.0), (2, 1000.0)] {
            ops.extend([
                op(n, 3 * mb, OpUse::Alloc, t0),
                op(n + 1, mb, OpUse::Alloc, t0 + 10.0),
                op(n, 3 * mb, OpUse::Access, t0 + 100.0),
                op(n, 3 * mb, OpUse::Free, t0 + 100.0),
                op(n + 1, mb, OpUse::Access, t0 + 100.0),
                op(n + 1, mb, OpUse::Free, t0 + 100.0),
            ]);
        }
        let traj = Trajectory {
            ops,
            base: 0,
            span_us: 1100.0,
            ..Default::default()
        };
        let (before, after) = peak_floor(&traj, 2 * mb, slow_link());
        assert!((before + after - 50.0).abs() < 1e-9, "{before} {after}");
        let all = iteration_floor(&traj, 2 * mb, slow_link());
        assert!((all - 100.0).abs() < 1e-9, "{all}");
        // Within the budget: nothing.
        assert_eq!(iteration_floor(&traj, 4 * mb, slow_link()), 0.0);
    }

    #[test]
    fn a_piece_counts_only_its_own_uses() {
        // X (4 MB) is live throughout and read at t = 990, just before the cut; the
        // second peak (D, 2 MB, at t = 1000) needs 1 MB off, which X, not used in the
        // second piece before its peak, may have left with long before: that piece
        // costs nothing. Had the piece counted X's read at 990 (10 us before the
        // peak: 80 us of copy, 70 late), it would read 40 (D's own copy). The first
        // piece: 2.5 MB off at t = 1 out of X, A, C made at 0, 1, 1: whole, A (60 us)
        // is the cheapest that completes it after C.
        let mb = 1_000_000;
        let half = mb / 2;
        let traj = Trajectory {
            ops: vec![
                op(0, 4 * mb, OpUse::Alloc, 0.0),
                op(1, 3 * mb, OpUse::Alloc, 1.0),
                op(2, half, OpUse::Alloc, 1.0),
                op(1, 3 * mb, OpUse::Access, 50.0),
                op(1, 3 * mb, OpUse::Free, 50.0),
                op(0, 4 * mb, OpUse::Access, 990.0),
                op(2, half, OpUse::Access, 995.0),
                op(2, half, OpUse::Free, 995.0),
                op(3, 2 * mb, OpUse::Alloc, 1000.0),
                op(3, 2 * mb, OpUse::Access, 2000.0),
                op(3, 2 * mb, OpUse::Free, 2000.0),
                op(0, 4 * mb, OpUse::Access, 2000.0),
                op(0, 4 * mb, OpUse::Free, 2000.0),
            ],
            base: 0,
            span_us: 2000.0,
            ..Default::default()
        };
        let all = iteration_floor(&traj, 5 * mb, slow_link());
        assert!((all - 60.0).abs() < 1e-9, "{all}");
    }
}
