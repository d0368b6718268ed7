//! Step plans: the part of an iteration past the end of what its plan was made from.
//!
//! An iteration plan covers the trajectory it came from (the previous iteration of the
//! same shape). A generation request that makes more tokens than that one runs past its
//! end, and the rest is token steps, which repeat: the same operations, each step's tensors `shift` ordinals after the
//! previous step's, the key/value caches a little larger each step. Once the iteration is
//! past its plan's end, the planner looks for the longest *period* that the logged
//! operations end with (their last `len` operations repeat the `len` before them), and
//! plans the trajectory made of that period followed by one more, extrapolated: each
//! operation's tensor `shift` ordinals on, its bytes grown as much as from the period
//! before (`2 b - b_prev`, exact where a cache grows by the same bytes each step), its
//! time one period's span later. The plan is installed with its positions shifted to the
//! period's start: its moves in the past (a cache allocated in the last step, read in
//! the next) are carried out at once, the rest as the iteration reaches them. At the end
//! of that trajectory the iteration is past the plan's end again, and the next period is
//! planned. Where no period is found, or the plan of the one found moves nothing, the
//! next try is at twice the operations. Step plans are made only in an iteration that
//! ran under an iteration plan with moves (they continue it); in a job's first
//! iteration, with no plan, they raised the stall (docs/predictive.md, "Step plans").
//!
//! The plan is advice like any other (`planned.rs`): an extrapolated move whose tensor
//! is not there, or not of the planned bytes (the request ended, the growth was not
//! linear), is skipped.
//!
//! Matching: two operations match when they are of one kind and name the same persistent
//! tensor, or ordinals `shift` apart (one `shift` for the whole period, at least 1: a
//! period that allocates nothing has nothing to plan); a period must read something
//! (a run of allocations alone repeats too, and has no gap to plan). Bytes are not
//! compared (the caches grow). A step that reads a tensor of this iteration allocated
//! before the steps (an encoder's output read by every decoder step) has no period
//! here: that read names one ordinal in every step. The longest period is taken (a multiple of the token step: one layer repeats
//! too, and a one-layer horizon does not reach the next step's read of a cache); its
//! trajectory is then as long as the history it repeats, so the plans per iteration grow
//! geometrically apart.
//!
//! Cost: a search tries each length from half the logged operations down; most fail at
//! the first or second comparison, but a length that is a multiple of a sub-period (a
//! layer within a token step) runs until the step's own operations break it: O(n x r)
//! per search for `r` repeats of a sub-period in the period (a decoder's layers),
//! O(n^2 / len) where the tail reads no ordinal at all. Then a plan (see
//! [`super::schedule`]) of `2 len` operations and a scan of the registry for the bytes
//! off the device; once per period, on the operation that ends one (it pays for it).
//! The planner covers the excess of the whole trajectory, its past half too: the moves
//! chosen for positions already passed are dropped at install, and may have kept other
//! gaps of their tensors from being chosen.

use std::collections::HashSet;

use crate::backend::DeviceBackend;

use super::handle::{Place, TensorKey};
use super::manager::TierManager;
use super::schedule::{self, LoggedOp, OpUse, Trajectory};

/// The repeating tail of a trajectory: its last `len` operations repeat the `len` before
/// them, with ordinals `shift` higher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Period {
    pub len: usize,
    pub shift: u32,
}

/// The `shift` with which the last `len` operations of `ops` repeat the `len` before
/// them, if they do (see the module docs). Checked from the end: a mismatch is usually
/// at the first or second pair. O(len) at most.
fn repeats(ops: &[LoggedOp], len: usize) -> Option<u32> {
    let n = ops.len();
    let mut shift = None;
    let mut reads = false;
    for k in (n - len..n).rev() {
        let (a, b) = (&ops[k - len], &ops[k]);
        if a.kind != b.kind {
            return None;
        }
        reads |= a.kind == OpUse::Access;
        match (a.key, b.key) {
            (TensorKey::Persistent(x), TensorKey::Persistent(y)) if x == y => {}
            (TensorKey::Ordinal(x), TensorKey::Ordinal(y)) if y > x => {
                if *shift.get_or_insert(y - x) != y - x {
                    return None;
                }
            }
            _ => return None,
        }
    }
    shift.filter(|_| reads)
}

/// The longest period `ops` ends with (at most half of them), if any. O(n) for the
/// search, see the module docs.
pub(crate) fn find_period(ops: &[LoggedOp]) -> Option<Period> {
    (1..=ops.len() / 2)
        .rev()
        .find_map(|len| repeats(ops, len).map(|shift| Period { len, shift }))
}

/// The last period of `ops` followed by `ahead` operations extrapolated from it (see
/// the module docs), times from the period's start; `base`: the bytes live on the
/// device at its start. O(len + ahead).
pub(crate) fn extend(ops: &[LoggedOp], per: Period, ahead: usize, base: u64) -> Trajectory {
    let n = ops.len();
    let start = n - per.len;
    let t0 = ops[start].t;
    // One period's span: from the operation before it to its last.
    let span = (ops[n - 1].t - ops[start - 1].t).max(0.0);
    let mut out: Vec<LoggedOp> = ops[start..]
        .iter()
        .map(|op| LoggedOp {
            t: op.t - t0,
            ..*op
        })
        .collect();
    for j in 0..ahead {
        // The j-th operation ahead repeats operation `i` of the last period, `k`
        // periods on.
        let (k, i) = (j / per.len + 1, start + j % per.len);
        let (prev, op) = (&ops[i - per.len], &ops[i]);
        let k32 = u32::try_from(k).unwrap_or(u32::MAX);
        let key = match op.key {
            TensorKey::Ordinal(o) => {
                TensorKey::Ordinal(o.saturating_add(per.shift.saturating_mul(k32)))
            }
            key => key,
        };
        let growth = op.bytes as i128 - prev.bytes as i128;
        let bytes = (op.bytes as i128 + k as i128 * growth).clamp(1, u64::MAX as i128) as u64;
        out.push(LoggedOp {
            key,
            bytes,
            kind: op.kind,
            t: op.t - t0 + k as f64 * span,
        });
    }
    let span_us = out.last().map_or(0.0, |op| op.t);
    Trajectory {
        ops: out,
        base,
        span_us,
        ..Default::default()
    }
}

impl<B: DeviceBackend> TierManager<B> {
    /// Past the end of the plan's trajectory: plans the next period, or sets when to
    /// look for one again (see the module docs).
    pub(crate) fn plan_steps(&mut self) {
        let Some(p) = self.planner.as_deref() else {
            return;
        };
        let ops = &p.cur_ops();
        let n = ops.len();
        let Some(per) = find_period(ops) else {
            let p = self.planner.as_deref_mut().expect("planner");
            p.retry_steps_at(2 * n.max(1));
            return;
        };
        let start = n - per.len;
        // Live bytes at the period's start: now, less what the period allocated net.
        let net: i128 = ops[start..]
            .iter()
            .map(|op| match op.kind {
                OpUse::Alloc => op.bytes as i128,
                OpUse::Free => -(op.bytes as i128),
                OpUse::Access => 0,
            })
            .sum();
        let mut traj = extend(ops, per, per.len, 0);
        // Tensors off the device that the trajectory does not read stay off: not in the
        // bytes the plan keeps under its cap (a generation request's weights, which its
        // plan spilled). Those on the device are counted (they are not the plan's to
        // move: the trajectory does not read them).
        let read: HashSet<TensorKey> = traj
            .ops
            .iter()
            .filter(|op| op.kind == OpUse::Access)
            .map(|op| op.key)
            .collect();
        let mut off_keys = HashSet::new();
        let mut off = 0;
        for (h, e) in self.reg.iter() {
            if matches!(e.place, Place::Host { .. } | Place::SpillingOut { .. }) {
                let key = self.plan_key(h, e.key);
                if !read.contains(&key) {
                    off += e.bytes;
                }
                off_keys.insert(key);
            }
        }
        let live = (self.logical as i128 - net).max(0) as u64;
        traj.base = live.saturating_sub(off);
        let p = self.planner.as_deref_mut().expect("planner");
        // The plan covers the trajectory (`plan.ops == 2 len`): past its end, the
        // next period is planned.
        let plan = schedule::plan(&traj, p.cap(), p.link);
        p.install_steps(plan, start, &off_keys);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A prefill of three tensors and a first cache, then `steps` token steps: each
    /// allocates the next cache (64 KiB larger), reads and frees the step before's,
    /// and allocates, reads and frees a scratch tensor; 100 us an operation. Each step
    /// allocates two ordinals (`shift` 2) in six operations.
    fn generation(steps: u32) -> Vec<LoggedOp> {
        use OpUse::*;
        let mut ops = Vec::new();
        let mut next = 0u32;
        let mut push = |key: u32, bytes: u64, kind: OpUse| {
            let t = 100.0 * ops.len() as f64;
            ops.push(LoggedOp {
                key: TensorKey::Ordinal(key),
                bytes,
                kind,
                t,
            });
        };
        for _ in 0..3 {
            push(next, 4 * MIB, Alloc);
            next += 1;
        }
        let (mut cache, mut bytes) = (next, MIB);
        push(cache, bytes, Alloc);
        next += 1;
        for _ in 0..steps {
            let new = next;
            push(new, bytes + 64 * 1024, Alloc);
            push(cache, bytes, Access);
            push(cache, bytes, Free);
            push(new + 1, MIB / 2, Alloc);
            push(new + 1, MIB / 2, Access);
            push(new + 1, MIB / 2, Free);
            next += 2;
            (cache, bytes) = (new, bytes + 64 * 1024);
        }
        ops
    }

    #[test]
    fn the_token_steps_are_found_as_the_longest_repeating_tail() {
        let ops = generation(9);
        let per = find_period(&ops).expect("a period");
        // A whole number of steps, two ordinals each, the longest within half the
        // operations (58 of them: four steps, not one).
        assert_eq!(per, Period { len: 24, shift: 8 });
        assert_eq!(repeats(&ops, 6), Some(2));
        // Not a period: a step and a half.
        assert_eq!(repeats(&ops, 9), None);
        // The prefill and the first step's read of the first cache: no period.
        assert_eq!(find_period(&ops[..7]), None);
    }

    #[test]
    fn the_next_period_is_extrapolated_with_its_tensors_and_their_growth() {
        let ops = generation(6);
        let per = Period { len: 6, shift: 2 };
        // Live at the period's start: the cache of the step before it (the prefill's
        // tensors are off the device).
        let base = ops[ops.len() - 5].bytes;
        let traj = extend(&ops, per, 6, base);
        assert_eq!(traj.base, base);
        assert_eq!(traj.ops.len(), 12);
        // The last real step, then the next: the same operations two ordinals on.
        let real = &ops[ops.len() - 6..];
        for (x, r) in traj.ops[..6].iter().zip(real) {
            assert_eq!((x.key, x.bytes, x.kind), (r.key, r.bytes, r.kind));
        }
        let next = &traj.ops[6..];
        let shifted = |k: TensorKey| match k {
            TensorKey::Ordinal(o) => TensorKey::Ordinal(o + 2),
            k => k,
        };
        for (x, r) in next.iter().zip(real) {
            assert_eq!((x.key, x.kind), (shifted(r.key), r.kind));
        }
        // Its cache 64 KiB larger than the last step's; its read of the last step's
        // cache with the bytes that cache was allocated with; the scratch unchanged.
        assert_eq!(next[0].bytes, real[0].bytes + 64 * 1024);
        assert_eq!((next[1].key, next[1].bytes), (real[0].key, real[0].bytes));
        assert_eq!(next[3].bytes, MIB / 2);
        // Times from the period's start, the next period one span later.
        assert_eq!(traj.ops[0].t, 0.0);
        assert_eq!(next[0].t, 600.0);
        // Under a cap below the two caches and a scratch, the plan spills the last
        // step's cache after its allocation and has it back for its read in the next
        // step: the gap the extrapolation made.
        let plan = schedule::plan(&traj, 2 * MIB, schedule::LinkModel::default());
        let m = plan
            .moves
            .iter()
            .find(|m| m.key == real[0].key)
            .unwrap_or_else(|| panic!("no move of the last step's cache: {plan:?}"));
        assert_eq!((m.spill_after, m.needed_at, m.wraps), (0, 7, false));
    }

    /// A request of 2 token steps over 20 caches of 1 MiB, then one of 12, under a
    /// 16 MiB budget, planned from the request before: the faults, prefetch hits and
    /// step plans of the run.
    fn requests(steps: bool) -> (u64, u64, u64) {
        use crate::tier::planned::Planner;
        use crate::tier::tests::short_then_long_request;
        use crate::tier::TierConfig;
        let m = short_then_long_request(TierConfig::default(), |m| {
            let mut p = Planner::new(0.8, None);
            p.steps = steps;
            m.set_planner(p);
        });
        let s = m.stats();
        let plans = m.planner().unwrap().stats.step_plans;
        (s.faults, s.prefetch_hits, plans)
    }

    /// Past the end of the 2-step request's plan, the 12-step request is planned by its
    /// steps: caches are spilled after their step and brought back before their reads.
    #[test]
    fn step_plans_bring_the_next_steps_caches_back_before_their_reads() {
        let (faults_off, hits_off, plans_off) = requests(false);
        let (faults_on, hits_on, plans_on) = requests(true);
        assert_eq!(plans_off, 0);
        assert!(plans_on > 0, "no step plan");
        // Without step plans the caches past the plan's end are left to the reactive
        // machinery (2 prefetch hits here); with them, the planned ones come back
        // before their reads (77). Here, where the reactive machinery keeps up (17
        // faults), step plans move more (they keep under the plan's cap, 80% of the
        // budget) and fault more (51): see docs/predictive.md, "Step plans".
        assert!(
            hits_on > 10 * hits_off.max(1),
            "hits: {hits_off} without, {hits_on} with ({faults_off} and {faults_on} faults)"
        );
    }
}
