//! Planned tiers: the tier manager carries out an [iteration plan](super::schedule)
//! built at each iteration boundary from the iteration that just ended (a training
//! job repeats its iterations; a dynamic one nearly does) or, in replay with the
//! oracle, from the true next one.
//!
//! At run time the plan is advice, checked before each action:
//! - after the operation a move names (`spill_after`), its tensor is spilled as soon as
//!   it is not pinned by the current step, if it is still on the device with the
//!   planned bytes (a dynamic iteration may differ: a mismatch is skipped); a spill
//!   still waiting at the iteration's end is dropped (its window has passed);
//! - from operation `prefetch_at` on, it is due back: prefetched in plan order as soon
//!   as it fits under `high_watermark x budget`, never by spilling anything;
//! - a move that drops (the `recompute` action: a recomputable tensor whose gap is too
//!   short to hide its copies, see [`schedule`](super::schedule)) drops its tensor at
//!   that point if it may be dropped then; its access recomputes it, nothing is due;
//!   with `TierConfig::recompute`, a planned spill whose tensor the per-victim cost
//!   rule prefers to drop is a drop too (measured on the synthetic BERT and MobileNet
//!   presets at 60%: geometric mean stall of the default actions with `recompute`
//!   3.07 without it, 2.70 with it);
//! - a tensor spilled by the plan and not yet due is hidden from the window prefetcher
//!   (which would bring it back at the first free byte and push out tensors needed
//!   sooner);
//! - a move whose gap wraps (the tensor's last use is in this iteration, its next in
//!   the next one: weights read only in the forward) is, with
//!   [`Planner::defer_wraps`] (`TierConfig::plan_defer_wraps`, on by default), not
//!   due at its planned point but once the link in is idle after it: every other
//!   move's prefetch point reached, nothing due, no copy in flight towards the device
//!   (in the optimizer's step, where the backward's copies end before it), and at the
//!   latest from the next iteration's start (only from there once the iteration has
//!   run past the end of the trajectory the plan came from: the link is then idle
//!   because the plan has nothing more to say). The plan covers one iteration, and at its
//!   end the link in carries the backward's tensors (under a budget it is the
//!   bottleneck there); brought back at their planned points the wrapped tensors
//!   queued in front of them. The tensor is off the device at least as long as
//!   planned, which only lowers the memory the plan counted. Measured
//!   (docs/predictive.md): the oracle's plan on ResNet-50 3.62 -> 3.11, GPT-2 6.39 ->
//!   6.01, BERT 1.43 -> 1.22 when they were due from the next iteration's start; since
//!   they come back as soon as the link is idle, on the corpus's train and validation
//!   splits, the median prefetch hit rate went from ~0.4 to ~0.9 and the mean stall
//!   down ("Small tensors stay; wrapped ones come back when the link is idle").
//!
//! The reactive machinery stays underneath: faults and the out-of-memory path (which
//! waits for copies in flight, then spills by the reactive policy) catch whatever the
//! plan misses; the watermark batch spill is off while a plan with moves is in charge
//! (see `pressure.rs`). A plan never loses or corrupts a byte and never spills a
//! tensor its step uses (property-tested with lying plans); what it may cost is
//! transfers and stalls, and, since it changes where tensors are, the memory layout:
//! that it never fails a request the reactive manager would have served is not
//! established (every replay here completes).
//!
//! Shapes: the planner keeps the last [`LIBRARY`] iterations by their signature (the
//! bytes of their first [`SIGNATURE`] allocations); at an iteration's fourth
//! allocation, if an earlier iteration of that signature is known and the plan came
//! from another, it re-plans from it (moves whose prefetch point has passed are
//! dropped, the others catch up).
//!
//! Cost: O(1) amortized per operation (cursors over the sorted moves; the pending and
//! due lists are short), plus a plan (see [`schedule`](super::schedule)) once per
//! iteration at its boundary and once more at the fourth allocation of an iteration
//! re-planned by shape: that allocation pays for it; past the end of the plan's
//! trajectory, the step plans of [`steps`](super::steps) (their own cost there). The
//! plan counters (`PlanStats::plans`, `moves`, ...) count step plans too.

use std::collections::HashSet;

use crate::backend::DeviceBackend;

use super::handle::{TensorHandle, TensorKey};
use super::manager::TierManager;
use super::schedule::{self, LinkModel, LoggedOp, OpUse, Plan, Trajectory};
use super::TierError;

pub use super::guard::Guard;

/// A planned spill (or drop) that is due and not issued yet (its tensor was pinned).
#[derive(Debug, Clone, Copy)]
struct Pending {
    key: TensorKey,
    bytes: u64,
    drop: bool,
    /// The index in the current plan's moves of the move it carries out.
    mv: usize,
}

/// Counters of planned tiers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlanStats {
    /// Plans built and moves they held (summed over iterations).
    pub plans: u64,
    pub moves: u64,
    /// Spills, drops and prefetches the plan issued.
    pub spills: u64,
    pub drops: u64,
    pub prefetches: u64,
    /// Moves skipped: the tensor was gone, elsewhere, or of other bytes than planned.
    pub skipped: u64,
    /// The largest excess over the cap a plan could not cover, bytes.
    pub max_residual_excess: u64,
    /// Plans replaced within an iteration: its first allocations matched an earlier
    /// iteration of the same shape better than the previous one.
    pub replans: u64,
    /// Plans of a period past the end of the plan's trajectory (`tier::steps`).
    pub step_plans: u64,
    /// Re-plans of an iteration of a new shape from an earlier one, morphed
    /// (`tier::planned::morph`; counted in `replans` too).
    pub new_shape_plans: u64,
}

/// Where the next iteration's trajectory comes from.
pub trait TrajectorySource: Send {
    /// The trajectory of the iteration about to begin, if this source knows it (the
    /// oracle); `None`: plan from the one that just ended.
    fn next(&mut self) -> Option<Trajectory>;
}

/// The plan state of a manager.
pub struct Planner {
    pub link: LinkModel,
    /// Plan drops of recomputable tensors (the `recompute` action; off by default).
    pub drops: bool,
    /// The plan keeps the trajectory under `cap_fraction x budget`.
    pub cap_fraction: f64,
    /// A move whose gap wraps (last used in this iteration, next in the next one) is
    /// brought back once the link in is idle after its planned point, at the latest
    /// from the next iteration's start, instead of at that point (see the module docs).
    pub defer_wraps: bool,
    /// Past the end of the plan's trajectory, plan the period the iteration repeats
    /// (`tier::steps`).
    pub steps: bool,
    /// Re-plan an iteration of a new shape from an earlier iteration's trajectory, its
    /// bytes mapped to this one's (`tier::planned::morph`).
    pub morph: bool,
    /// Re-plan by morphing at the next operation (this iteration's shape is new, or it
    /// departed from the iteration its plan was morphed from).
    morph_now: bool,
    /// The library iteration the current plan was morphed from, while this iteration
    /// agrees with it.
    morph_src: Option<usize>,
    /// The operation count from which a step plan is looked for again.
    steps_at: usize,
    /// The operations of the trajectory the iteration plan came from (a step plan
    /// replaces the plan, not this).
    iter_ops: usize,
    /// Deferred wrapped moves of the iteration plan a step plan replaced, still off the
    /// device when the last step plan was installed: hidden from the window prefetcher
    /// and due from the next iteration's start, as the plan's own would have been.
    carried: Vec<(TensorKey, u64)>,
    cur: Trajectory,
    t0: f64,
    plan: Plan,
    /// Indices into `plan.moves` by prefetch position.
    by_prefetch: Vec<usize>,
    /// With `defer_wraps`: the wrapped moves of `plan` not made due yet, by the
    /// position of their access in the next iteration.
    wrapped: Vec<usize>,
    next_spill: usize,
    next_prefetch: usize,
    /// Planned spills (and drops) due and not issued yet.
    pending_spills: Vec<Pending>,
    due: Vec<(TensorKey, u64)>,
    held: HashSet<TensorKey>,
    /// Moves of `plan` whose prefetch point was reached (a spill of that move issued
    /// after it is not hidden from the window prefetcher). Per move, not per key: a
    /// tensor read in the forward and the backward has two moves, and reaching the
    /// first one's prefetch point says nothing of the second.
    passed: HashSet<usize>,
    source: Option<Box<dyn TrajectorySource>>,
    /// The trajectory to plan the next iteration from, if given (the oracle).
    next: Option<Trajectory>,
    /// Recent iterations by their signature (the bytes of their first
    /// [`SIGNATURE`] allocations: the input batch's shape), most recent first, at
    /// most [`LIBRARY`].
    library: Vec<(Vec<u64>, Trajectory)>,
    /// This iteration's signature so far.
    sig: Vec<u64>,
    /// The signature of the trajectory the current plan came from (`None`: not from
    /// the library, e.g. the oracle's).
    planned_from: Option<Vec<u64>>,
    /// The cap of this iteration's plans, bytes.
    cap: u64,
    /// Plans are checked against the stall they cause (see [`Guard`]); `None`: off.
    pub guard: Option<Guard>,
    /// Stall (backend stall and recompute time, us) when this iteration began.
    stall0: f64,
    /// This iteration ran under a plan with moves.
    ran_plan: bool,
    pub stats: PlanStats,
}

/// Allocations that make an iteration's signature.
pub const SIGNATURE: usize = 4;
/// Iterations kept by signature.
pub const LIBRARY: usize = 8;

impl std::fmt::Debug for Planner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Planner")
            .field("cap_fraction", &self.cap_fraction)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Planner {
    /// A planner that keeps each iteration under `cap_fraction x budget`; with
    /// `source`, plans from the trajectories it gives (the oracle).
    pub fn new(cap_fraction: f64, source: Option<Box<dyn TrajectorySource>>) -> Self {
        Planner {
            link: LinkModel::default(),
            drops: false,
            cap_fraction,
            defer_wraps: true,
            steps: false,
            morph: false,
            morph_now: false,
            morph_src: None,
            steps_at: 0,
            iter_ops: 0,
            carried: Vec::new(),
            cur: Trajectory::default(),
            t0: 0.0,
            plan: Plan::default(),
            by_prefetch: Vec::new(),
            wrapped: Vec::new(),
            next_spill: 0,
            next_prefetch: 0,
            pending_spills: Vec::new(),
            due: Vec::new(),
            held: HashSet::new(),
            passed: HashSet::new(),
            source,
            next: None,
            library: Vec::new(),
            sig: Vec::new(),
            planned_from: None,
            cap: 0,
            guard: None,
            stall0: 0.0,
            ran_plan: false,
            stats: PlanStats::default(),
        }
    }

    /// Whether the current plan moves anything.
    pub fn has_moves(&self) -> bool {
        !self.plan.moves.is_empty()
    }

    /// Whether this iteration has run past the end of the trajectory the plan was made
    /// from (a dynamic iteration longer than the one it was planned from: a generation
    /// request with more tokens than the last of its shape). O(1).
    pub fn past_end(&self) -> bool {
        self.cur.ops.len() > self.plan.ops
    }

    /// Once this iteration's signature is known: if an earlier iteration of the same
    /// signature is known and the plan came from another, plan from it instead. The
    /// moves the new plan puts before the current position are carried out now (the
    /// cursors restart and catch up).
    fn rematch(&mut self) {
        if self.suppressed() {
            // The guard holds this shape's plans off: a plan made from another shape
            // is dropped too (its pending spills with it; what it spilled is no longer
            // hidden from the window prefetcher, its due prefetches stay due).
            if self.has_moves() {
                self.pending_spills.clear();
                self.held.clear();
                self.install(Plan::default());
            }
            // The iteration runs without a plan: the guard records it as such.
            self.ran_plan = false;
            return;
        }
        if self.planned_from.as_ref() == Some(&self.sig) {
            return;
        }
        let Some(i) = self.library.iter().position(|(s, _)| *s == self.sig) else {
            // A new shape: re-planned from an earlier iteration, morphed.
            self.morph_now = self.morph && !self.library.is_empty();
            return;
        };
        let mut plan = schedule::plan(&self.library[i].1, self.cap, self.link);
        // Moves whose prefetch point has passed would be a spill and an immediate
        // prefetch: dropped. The others catch up (their spills go now).
        let pos = self.cur.ops.len().saturating_sub(1);
        plan.moves.retain(|m| m.prefetch_at > pos);
        self.planned_from = Some(self.sig.clone());
        self.stats.replans += 1;
        // The old plan's spills not issued yet are dropped; what it spilled is no
        // longer hidden from the window prefetcher (its due prefetches stay due).
        self.pending_spills.clear();
        self.held.clear();
        self.install(plan);
    }

    /// The guard holds plans off for this iteration's shape.
    fn suppressed(&self) -> bool {
        self.guard.as_ref().is_some_and(|g| g.holds_off(&self.sig))
    }

    /// The operations logged in this iteration so far.
    pub(crate) fn cur_ops(&self) -> &[LoggedOp] {
        &self.cur.ops
    }

    /// The cap of this iteration's plans, bytes.
    pub(crate) fn cap(&self) -> u64 {
        self.cap
    }

    /// No period found: look again once the iteration has logged `at` operations.
    pub(crate) fn retry_steps_at(&mut self, at: usize) {
        self.steps_at = at;
    }

    /// Whether to look for a step plan now: on, past the end of the plan's trajectory,
    /// not held off by the guard, not before the retry point. O(1).
    fn wants_steps(&self) -> bool {
        self.steps
            && self.ran_plan
            && self.past_end()
            && self.cur.ops.len() >= self.steps_at
            && !self.suppressed()
    }

    /// Installs a plan of the trajectory that starts at operation `start` of this
    /// iteration (`tier::steps`): its positions become the iteration's; its moves in the
    /// past are carried out at once (as a re-plan's), those whose prefetch point has
    /// passed are dropped. A step trajectory is not an iteration: its wrapped moves are
    /// dropped, and the deferred wrapped moves of the plan it replaces that are off the
    /// device stay hidden and come back from the next iteration's start.
    pub(crate) fn install_steps(&mut self, mut plan: Plan, start: usize, off: &HashSet<TensorKey>) {
        let pos = self.cur.ops.len().saturating_sub(1);
        for m in &mut plan.moves {
            m.spill_after += start;
            m.prefetch_at += start;
            m.needed_at += start;
        }
        plan.ops += start;
        plan.moves.retain(|m| !m.wraps && m.prefetch_at > pos);
        if self.defer_wraps {
            let held = &self.held;
            self.carried.extend(
                self.plan
                    .moves
                    .iter()
                    .filter(|m| m.wraps && !m.drop && held.contains(&m.key))
                    .map(|m| (m.key, m.bytes)),
            );
        }
        // Only those still off the device (one a fault brought back is not hidden).
        self.carried.retain(|(k, _)| off.contains(k));
        self.pending_spills.clear();
        let carried = &self.carried;
        self.held.retain(|k| carried.iter().any(|(c, _)| c == k));
        self.stats.step_plans += 1;
        // A step plan that moves nothing is not looked for again before the operations
        // have doubled (a period that repeats without needing a plan).
        self.steps_at = if plan.moves.is_empty() {
            2 * (pos + 1)
        } else {
            0
        };
        let iter_ops = self.iter_ops;
        self.install(plan);
        self.iter_ops = iter_ops;
    }

    fn install(&mut self, plan: Plan) {
        self.ran_plan |= !plan.moves.is_empty();
        self.stats.plans += 1;
        self.stats.moves += plan.moves.len() as u64;
        self.stats.max_residual_excess = self.stats.max_residual_excess.max(plan.residual_excess);
        // A dropped tensor comes back by its recompute, not by a prefetch.
        let defer = self.defer_wraps;
        let mut by_prefetch: Vec<usize> = (0..plan.moves.len())
            .filter(|&i| !(plan.moves[i].drop || defer && plan.moves[i].wraps))
            .collect();
        by_prefetch.sort_by_key(|&i| (plan.moves[i].prefetch_at, plan.moves[i].needed_at));
        self.by_prefetch = by_prefetch;
        let mut wrapped: Vec<usize> = (0..plan.moves.len())
            .filter(|&i| defer && plan.moves[i].wraps && !plan.moves[i].drop)
            .collect();
        wrapped.sort_by_key(|&i| plan.moves[i].needed_at);
        self.wrapped = wrapped;
        self.iter_ops = plan.ops;
        self.plan = plan;
        self.passed.clear();
        self.next_spill = 0;
        self.next_prefetch = 0;
    }
}

impl<B: DeviceBackend> TierManager<B> {
    /// Turns on planned tiers (see the module docs).
    pub fn set_planner(&mut self, planner: Planner) {
        self.planner = Some(Box::new(planner));
    }

    pub fn planner(&self) -> Option<&Planner> {
        self.planner.as_deref()
    }

    /// Plans the next iteration from `traj` instead of the one that ends (the oracle:
    /// the caller knows the future). Call just before `iteration_boundary`.
    pub fn set_next_trajectory(&mut self, traj: Trajectory) {
        if let Some(p) = self.planner.as_deref_mut() {
            p.next = Some(traj);
        }
    }

    /// Bytes of every registered tensor, wherever it is.
    pub fn logical(&self) -> u64 {
        self.logical
    }

    fn compute_clock(&self) -> f64 {
        let b = self.alloc.backend();
        b.now_us() - b.stall_us() - self.stats.recompute_us
    }

    /// The key under which `h` is logged: its own, unless it is an ordinal of an
    /// earlier iteration (a tensor that outlived the boundary), which is logged by
    /// handle (the next iteration's ordinals name other tensors).
    pub(super) fn plan_key(&self, h: TensorHandle, key: TensorKey) -> TensorKey {
        match key {
            TensorKey::Ordinal(n) if self.ordinals.get(n as usize) != Some(&h) => {
                TensorKey::Persistent(h)
            }
            k => k,
        }
    }

    /// Logs an operation of `h` and carries out the moves due (hook of `register`,
    /// `access` and `free`; `key` and `bytes` are `h`'s).
    pub(crate) fn plan_op(
        &mut self,
        h: TensorHandle,
        key: TensorKey,
        bytes: u64,
        kind: OpUse,
    ) -> Result<(), TierError> {
        if self.planner.is_none() {
            return Ok(());
        }
        let key = self.plan_key(h, key);
        let t = self.compute_clock();
        let p = self.planner.as_deref_mut().expect("planner");
        let t = t - p.t0;
        let pos = p.cur.ops.len();
        p.cur.ops.push(LoggedOp {
            key,
            bytes,
            kind,
            t,
        });
        if p.drops && kind != OpUse::Free && self.is_recomputable(h) {
            let us = self.reg.get(h)?.recompute_us;
            let p = self.planner.as_deref_mut().expect("planner");
            p.cur.recompute_us.insert(key, us);
        }
        let p = self.planner.as_deref_mut().expect("planner");
        if kind == OpUse::Alloc && p.sig.len() < SIGNATURE {
            p.sig.push(bytes);
            if p.sig.len() == SIGNATURE && p.planned_from.is_some() {
                p.rematch();
            }
        }
        if p.morph_departs() {
            // The iteration no longer follows the one its plan was morphed from: a
            // re-plan from one it agrees with, if any.
            p.morph_src = None;
            p.morph_now = true;
        }
        if p.morph_now && !p.suppressed() {
            self.plan_morph();
        }
        let p = self.planner.as_deref_mut().expect("planner");
        if p.wants_steps() {
            self.plan_steps();
        }
        let p = self.planner.as_deref_mut().expect("planner");
        while let Some(m) = p.plan.moves.get(p.next_spill) {
            if m.spill_after > pos {
                break;
            }
            p.pending_spills.push(Pending {
                key: m.key,
                bytes: m.bytes,
                drop: m.drop,
                mv: p.next_spill,
            });
            p.next_spill += 1;
        }
        while let Some(&i) = p.by_prefetch.get(p.next_prefetch) {
            let m = p.plan.moves[i];
            if m.prefetch_at > pos {
                break;
            }
            p.held.remove(&m.key);
            p.passed.insert(i);
            p.due.push((m.key, m.bytes));
            p.next_prefetch += 1;
        }
        self.plan_act()
    }

    /// Whether the window prefetcher must leave `h` alone (spilled by the plan, not
    /// due yet).
    pub(crate) fn plan_holds(&self, h: TensorHandle) -> bool {
        let Some(p) = self.planner.as_deref() else {
            return false;
        };
        if p.held.is_empty() {
            return false;
        }
        self.reg
            .get(h)
            .is_ok_and(|e| p.held.contains(&self.plan_key(h, e.key)))
    }

    /// An iteration boundary (hook of `iteration_boundary`, before the ordinals
    /// restart): the next plan.
    pub(crate) fn plan_boundary(&mut self) {
        let t = self.compute_clock();
        let stall = self.alloc.backend().stall_us() + self.stats.recompute_us;
        let logical = self.logical;
        let budget = self.cfg.budget;
        let Some(p) = self.planner.as_deref_mut() else {
            return;
        };
        let mut ended = std::mem::take(&mut p.cur);
        ended.span_us = t - p.t0;
        // The plan keeps under the cap; the guard counts the bytes above the budget.
        let cap = (p.cap_fraction * budget as f64) as u64;
        p.cap = cap;
        let known = p
            .next
            .take()
            .or_else(|| p.source.as_mut().and_then(|s| s.next()));
        let may_plan = match p.guard.as_mut() {
            Some(g) => {
                // An iteration that ran past the end of its plan's trajectory was only
                // partly the plan's (a generation request longer than the one it was
                // planned from): it says nothing of the plan and is not recorded, as
                // an iteration within the budget is not.
                let judged = !(p.ran_plan && ended.ops.len() > p.iter_ops);
                let excess = if judged {
                    ended.peak().saturating_sub(budget)
                } else {
                    0
                };
                g.next_may_plan(&p.sig, p.ran_plan, stall - p.stall0, excess)
            }
            None => true,
        };
        p.stall0 = stall;
        p.ran_plan = false;
        let from = known.as_ref().unwrap_or(&ended);
        let plan = if from.ops.is_empty() || !may_plan {
            Plan::default()
        } else {
            schedule::plan(from, cap, p.link)
        };
        let ops = from.ops.len();
        // Deferred wrapped moves still off the device: due from the next iteration's
        // start (the in-link is busy at the end of this one, idle at the next one's).
        let deferred: Vec<(TensorKey, u64)> = if p.defer_wraps {
            p.plan
                .moves
                .iter()
                .filter(|m| m.wraps && !m.drop && p.held.contains(&m.key))
                .map(|m| (m.key, m.bytes))
                .collect()
        } else {
            Vec::new()
        };
        p.planned_from = known.is_none().then(|| std::mem::take(&mut p.sig));
        p.sig.clear();
        p.install(plan);
        p.held.clear();
        // The ended iteration joins the library under its signature.
        if let Some(sig) = p.planned_from.clone() {
            if sig.len() == SIGNATURE {
                p.library.retain(|(s, _)| *s != sig);
                p.library.insert(0, (sig, ended));
                p.library.truncate(LIBRARY);
            }
        }
        p.cur = Trajectory {
            ops: Vec::with_capacity(ops),
            base: logical,
            span_us: 0.0,
            ..Default::default()
        };
        p.t0 = t;
        // Spills still pending (their tensors were pinned until the end) relieved
        // windows of the iteration that ended: dropped, the tensors stay. (Issued now,
        // a wrapped one was hidden and due to nothing, and its next use faulted.) Due
        // prefetches of persistent keys stay due (the next iteration needs them).
        p.pending_spills.clear();
        p.due.retain(|(k, _)| matches!(k, TensorKey::Persistent(_)));
        p.due.extend(deferred);
        p.due.append(&mut p.carried);
        p.steps_at = 0;
        p.morph_now = false;
        p.morph_src = None;
    }
}

#[path = "planned_act.rs"]
mod act;
#[path = "morph.rs"]
mod morph;

#[cfg(test)]
#[path = "planned_tests.rs"]
mod tests;
