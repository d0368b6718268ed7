//! The peak floor of a budgeted replay: per iteration, [`peak_floor`] of the trace's
//! own trajectory (every tensor resident, the trace's compute times), summed. A lower
//! bound on the stall of any policy that only moves tensors, at the link's peak
//! bandwidths: what the stall of a policy should be compared with.

use std::collections::HashMap;

use super::access::{Op, OpKind};
use super::handle::TensorKey;
use super::schedule::{LinkModel, LoggedOp, OpUse, Trajectory};

/// A lower bound on the stall of one iteration under a budget, for any policy that
/// moves tensors (no recomputation), from the iteration's highest point: at the peak
/// `t_p`, `E = L(t_p) - budget` bytes must be off the device. They left over one
/// link after they were last used before the peak, and come back over the other
/// before their next use: the least stall before the peak is that of the `E` bytes
/// last used earliest, sent back to back (`max_s (sum_{used >= s} bytes / bw - (t_p -
/// s))`), and after it symmetrically that of the `E` bytes needed latest (the two
/// sets chosen apart). Only this iteration's uses constrain: a tensor not used
/// before the peak may have left before the iteration began, one not read after it
/// need not come back within it; so each iteration's bound holds whatever the other
/// iterations do, the bounds count stalls of disjoint spans, and their sum bounds a
/// whole replay. Returns `(before_us, after_us)`; `(0, 0)` when the trajectory fits.
pub fn peak_floor(traj: &Trajectory, budget: u64, link: LinkModel) -> (f64, f64) {
    let n = traj.ops.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let live_after: Vec<i128> = traj.live_after().collect();
    let (mut peak, mut at) = (traj.base as i128, 0usize);
    for (p, &l) in live_after.iter().enumerate() {
        if l > peak {
            peak = l;
            at = p;
        }
    }
    let excess = peak - budget as i128;
    if excess <= 0 {
        return (0.0, 0.0);
    }
    let tp = traj.ops[at].t;
    // The tensors live at the peak and their uses. A tensor with no use before the
    // peak in this iteration may have left before the iteration began, and one with
    // no access after it need not come back within it: both get an unbounded slack
    // below (only this iteration's uses constrain; see the function's docs). Live
    // bytes no operation names (never used in the iteration) are free to move.
    let mut state: std::collections::HashMap<TensorKey, (bool, Option<f64>, u64)> =
        std::collections::HashMap::new();
    for op in &traj.ops[..=at] {
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
    // Live from the start and first named after the peak (read, or freed, later).
    for op in &traj.ops[at + 1..] {
        let from_start = op.kind != OpUse::Alloc;
        state.entry(op.key).or_insert((from_start, None, op.bytes));
    }
    // After the peak: the next access, unless a free comes first.
    let mut next: std::collections::HashMap<TensorKey, Option<f64>> =
        std::collections::HashMap::new();
    for op in &traj.ops[at + 1..] {
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
        // Not used before the peak in this iteration: it may have left before the
        // iteration began; not read after it: it need not come back within it.
        before.push((last.map_or(f64::INFINITY, |t| tp - t), bytes));
        let nx = next.get(k).copied().flatten();
        after.push((nx.map_or(f64::INFINITY, |t| t - tp), bytes));
    }
    let free_bytes = (peak.max(0) as u64).saturating_sub(seen);
    let need = (excess as u64).saturating_sub(free_bytes);
    if need == 0 {
        return (0.0, 0.0);
    }
    // Each item: (slack: time from its use to the peak, or from the peak to its use;
    // bytes). The least stall moves the `need` bytes of most slack; in the order of
    // the link (least slack last), the stall is the worst of `(bytes queued up to
    // and including the item) / rate - its slack`.
    let bound = |mut items: Vec<(f64, u64)>, rate: f64| -> f64 {
        items.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut chosen = Vec::new();
        let mut sent = 0u64;
        for (slack, b) in items {
            if sent >= need {
                break;
            }
            let take = b.min(need - sent);
            sent += take;
            chosen.push((slack, take));
        }
        // On the link: before the peak in order of release (most slack first), the
        // bytes after an item are what delays the peak; after the peak, deadlines in
        // increasing order (least slack first).
        chosen.reverse();
        let (mut queued, mut worst) = (0u64, 0.0f64);
        for (slack, b) in chosen {
            queued += b;
            worst = worst.max(queued as f64 / rate - slack);
        }
        worst.max(0.0)
    };
    (
        bound(before, link.out_bytes_per_us),
        bound(after, link.in_bytes_per_us),
    )
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

/// The summed peak floor of `program` under `budget` bytes, us.
pub fn replay_floor(program: &[Op], bytes_of: &HashMap<u64, u64>, budget: u64) -> f64 {
    let link = LinkModel::peak();
    trajectories(program, bytes_of)
        .iter()
        .map(|tr| {
            let (before, after) = peak_floor(tr, budget, link);
            before + after
        })
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
}
