//! Plans for a new shape: an iteration whose input shape no earlier iteration had.
//!
//! An iteration plan comes from the last iteration of the same shape (`planned.rs`). An
//! iteration of a shape not seen before (a sequence length, a batch, an image size drawn
//! for it) runs under the plan of the previous iteration, whose moves name the right
//! tensors (the same model allocates in the same order) with the wrong bytes: the moves
//! of tensors whose size changed are skipped, and the reactive machinery does the rest.
//!
//! Here, once such an iteration's signature is known (its fourth allocation), the
//! planner re-plans it from a *morphed* trajectory: the operations this iteration has
//! logged so far, followed by the rest of an earlier iteration's, their bytes mapped to
//! this iteration's. The earlier iteration is one of the planner's library (the last
//! eight shapes) that agrees with this one on every operation logged so far (kind and
//! tensor: operation `i` of one is taken to be operation `i` of the other), the one
//! whose signature's bytes are nearest by ratio (a sequence length of 512 is morphed
//! from 256 rather than from 64: the two may run other kernels, with other
//! workspaces). Bytes: a tensor already allocated in this iteration keeps its bytes; a
//! future allocation of `b` bytes takes the bytes that this iteration allocated where
//! the earlier one allocated `b` (the same layer at the new shape), else `b` scaled by
//! the ratio of the bytes allocated so far (all of a CNN's activations scale with the
//! image's area); persistent tensors keep theirs. Times: the rest of the earlier
//! iteration's, stretched by the ratio of compute time so far.
//!
//! The plan is installed as a re-plan by shape is (`planned.rs`): moves whose prefetch
//! point has passed are dropped, those whose spill is in the past go now; a tensor the
//! replaced plan spilled stays hidden from the window prefetcher if the new plan moves
//! it too. If the iteration departs from the one its plan was morphed from (an
//! operation of another kind or tensor at the same position: a convolution that picked
//! another algorithm allocates another workspace), it is re-planned once more from a
//! library iteration that agrees with it so far, if there is one; else the plan stays
//! (its moves of tensors that are not there, or not of the planned bytes, are
//! skipped).
//!
//! Measured and not kept (docs/predictive.md, "Plans for a new shape"): re-planning
//! at every eighth of the iteration as the bytes become known (the moves each re-plan
//! adds in the past go at once, in a burst, and the early estimates spilled too much),
//! mapping unknown sizes at a ratio of 1, dropping the plan where the iteration
//! departs with no library iteration to follow, and re-planning where an allocation's
//! bytes differ from the estimate.
//!
//! Cost: O(L n) to choose the earlier iteration (`L` <= 8 iterations of the library,
//! `n` operations logged), O(N) to build the trajectory of the earlier iteration's `N`
//! operations and a plan of it (see [`super::schedule`]), once at the signature and
//! once at each departure that finds another iteration to follow, on the operation
//! that triggers it (it pays for it); O(1) per operation to watch for a departure.

use std::collections::HashMap;

use crate::backend::DeviceBackend;
use crate::tier::handle::TensorKey;
use crate::tier::manager::TierManager;
use crate::tier::schedule::{self, LoggedOp, OpUse, Plan, Trajectory};

use super::Planner;

/// Whether two logged operations are the same operation of two iterations (the
/// alignment the module docs describe): of one kind, on the same tensor key.
fn same_op(a: &LoggedOp, b: &LoggedOp) -> bool {
    a.kind == b.kind && a.key == b.key
}

/// The iteration of `library` to morph `cur` from: of those longer than `cur` that
/// agree with it on every operation logged, the one whose signature's bytes are
/// nearest (by ratio) to `sig`'s, the most recent of equals. O(L n).
pub(crate) fn source(
    library: &[(Vec<u64>, Trajectory)],
    sig: &[u64],
    cur: &Trajectory,
) -> Option<usize> {
    let total = |s: &[u64]| s.iter().map(|&b| b as f64).sum::<f64>().max(1.0);
    let own = total(sig);
    let n = cur.ops.len();
    library
        .iter()
        .enumerate()
        .filter(|(_, (_, t))| {
            t.ops.len() > n && cur.ops.iter().zip(&t.ops).all(|(a, b)| same_op(a, b))
        })
        .min_by(|(i, (a, _)), (j, (b, _))| {
            let da = (total(a) / own).ln().abs();
            let db = (total(b) / own).ln().abs();
            da.total_cmp(&db).then(i.cmp(j))
        })
        .map(|(i, _)| i)
}

/// The trajectory of an iteration that has logged `cur`, assumed to continue as `prev`
/// did with its bytes mapped (see the module docs); `None` if `cur` does not agree with
/// `prev` operation by operation, or is not shorter. O(n).
pub(crate) fn morph(cur: &Trajectory, prev: &Trajectory) -> Option<Trajectory> {
    let n = cur.ops.len();
    if n == 0 || n >= prev.ops.len() {
        return None;
    }
    let mut key_bytes: HashMap<TensorKey, u64> = HashMap::new();
    let mut size_map: HashMap<u64, u64> = HashMap::new();
    let (mut old_sum, mut new_sum) = (0u128, 0u128);
    for (a, b) in cur.ops.iter().zip(&prev.ops) {
        if !same_op(a, b) {
            return None;
        }
        if a.kind == OpUse::Alloc {
            key_bytes.insert(a.key, a.bytes);
            if matches!(a.key, TensorKey::Ordinal(_)) {
                size_map.insert(b.bytes, a.bytes);
                old_sum += b.bytes as u128;
                new_sum += a.bytes as u128;
            }
        }
    }
    let ratio = if old_sum > 0 {
        new_sum as f64 / old_sum as f64
    } else {
        1.0
    };
    let (t_cur, t_prev) = (cur.ops[n - 1].t, prev.ops[n - 1].t);
    let stretch = if t_prev > 0.0 && t_cur > 0.0 {
        (t_cur / t_prev).clamp(0.25, 4.0)
    } else {
        1.0
    };
    // A future size: as this iteration allocated it where `prev` did, else scaled.
    let estimate = |b: u64| {
        size_map
            .get(&b)
            .copied()
            .unwrap_or_else(|| ((b as f64 * ratio).round() as u64).max(1))
    };
    let mut ops = Vec::with_capacity(prev.ops.len());
    ops.extend_from_slice(&cur.ops);
    for op in &prev.ops[n..] {
        let bytes = match (op.kind, op.key) {
            (_, TensorKey::Persistent(_)) => op.bytes,
            (OpUse::Alloc, key) => {
                let b = estimate(op.bytes);
                key_bytes.insert(key, b);
                b
            }
            (_, key) => key_bytes
                .get(&key)
                .copied()
                .unwrap_or_else(|| estimate(op.bytes)),
        };
        ops.push(LoggedOp {
            bytes,
            t: t_cur + (op.t - t_prev).max(0.0) * stretch,
            ..*op
        });
    }
    let span_us = t_cur + (prev.span_us - t_prev).max(0.0) * stretch;
    Some(Trajectory {
        ops,
        base: cur.base,
        span_us,
        ..Default::default()
    })
}

impl Planner {
    /// The trajectory of the library iteration to follow, morphed to this one's (see
    /// the module docs); `None` if none agrees with this iteration so far.
    pub(crate) fn morph_trajectory(&mut self) -> Option<Trajectory> {
        let i = source(&self.library, &self.sig, &self.cur)?;
        self.morph_src = Some(i);
        morph(&self.cur, &self.library[i].1)
    }

    /// Whether the operation just logged departs from the iteration the plan was
    /// morphed from. O(1).
    pub(super) fn morph_departs(&self) -> bool {
        let Some(i) = self.morph_src else {
            return false;
        };
        let Some(a) = self.cur.ops.last() else {
            return false;
        };
        self.library[i]
            .1
            .ops
            .get(self.cur.ops.len() - 1)
            .is_none_or(|b| !same_op(a, b))
    }

    /// No morphed plan now: the current plan stays.
    pub(crate) fn stop_morph(&mut self) {
        self.morph_now = false;
        self.morph_src = None;
    }

    /// Installs a plan of a morphed trajectory as a re-plan by shape (see
    /// [`rematch`](Self::rematch)); what the replaced plan spilled stays hidden where
    /// the new plan moves it too.
    pub(crate) fn install_morph(&mut self, mut plan: Plan) {
        let pos = self.cur.ops.len().saturating_sub(1);
        plan.moves.retain(|m| m.prefetch_at > pos);
        self.pending_spills.clear();
        let moved: std::collections::HashSet<TensorKey> = plan
            .moves
            .iter()
            .filter(|m| m.spill_after <= pos)
            .map(|m| m.key)
            .collect();
        self.held.retain(|k| moved.contains(k));
        self.stats.replans += 1;
        self.stats.new_shape_plans += 1;
        self.morph_now = false;
        self.install(plan);
    }
}

impl<B: DeviceBackend> TierManager<B> {
    /// A re-plan of an iteration of a new shape (see the module docs).
    pub(crate) fn plan_morph(&mut self) {
        let Some(p) = self.planner.as_deref_mut() else {
            return;
        };
        let Some(traj) = p.morph_trajectory() else {
            p.stop_morph();
            return;
        };
        let plan = schedule::plan(&traj, p.cap(), p.link);
        p.install_morph(plan);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(key: TensorKey, bytes: u64, kind: OpUse, t: f64) -> LoggedOp {
        LoggedOp {
            key,
            bytes,
            kind,
            t,
        }
    }

    fn ord(n: u32) -> TensorKey {
        TensorKey::Ordinal(n)
    }

    /// A forward of `acts` activations after an input of `input` bytes, then a
    /// backward that reads and frees them; one microsecond an operation.
    fn iteration(input: u64, acts: &[u64]) -> Trajectory {
        let mut ops = vec![op(ord(0), input, OpUse::Alloc, 0.0)];
        for (i, &b) in acts.iter().enumerate() {
            ops.push(op(ord(i as u32 + 1), b, OpUse::Alloc, 0.0));
        }
        for (i, &b) in acts.iter().enumerate().rev() {
            ops.push(op(ord(i as u32 + 1), b, OpUse::Access, 0.0));
            ops.push(op(ord(i as u32 + 1), b, OpUse::Free, 0.0));
        }
        ops.push(op(ord(0), input, OpUse::Free, 0.0));
        for (i, o) in ops.iter_mut().enumerate() {
            o.t = i as f64;
        }
        let span_us = ops.len() as f64;
        Trajectory {
            ops,
            span_us,
            ..Default::default()
        }
    }

    /// The rest of an earlier iteration takes this one's bytes: a size already seen
    /// at its new bytes, one not seen yet scaled by the ratio so far; the times
    /// stretched as the compute so far.
    #[test]
    fn the_rest_of_an_earlier_iteration_is_mapped_to_this_ones_bytes() {
        let prev = iteration(100, &[1000, 1000, 3000]);
        // The input grew by 7x, the activations of 1000 bytes by 2x.
        let full = iteration(700, &[2000, 2000, 7364]);
        // This iteration so far: its input and first activation, at twice the time.
        let mut cur = Trajectory {
            ops: full.ops[..2].to_vec(),
            base: 7,
            ..Default::default()
        };
        cur.ops[1].t = 2.0;
        let m = morph(&cur, &prev).expect("agrees");
        assert_eq!(m.ops.len(), prev.ops.len());
        assert_eq!(m.base, 7);
        let bytes: Vec<u64> = m.ops.iter().map(|o| o.bytes).collect();
        let want: Vec<u64> = full.ops.iter().map(|o| o.bytes).collect();
        // 1000 was seen as 2000; 3000 was not, and is scaled by (700 + 2000) / 1100.
        assert_eq!(bytes, want);
        assert_eq!(m.ops[2].t, 4.0, "{:?}", m.ops[2]);
        assert_eq!(m.span_us, 2.0 + (prev.span_us - 1.0) * 2.0);
        // An operation that does not agree: no morph.
        let mut other = cur.clone();
        other.ops[1].kind = OpUse::Access;
        assert!(morph(&other, &prev).is_none());
        // Nothing left to morph.
        assert!(morph(&prev, &prev).is_none());
    }

    /// Of the library's iterations that agree with this one so far, the one whose
    /// signature is nearest by ratio; one that departs is not taken, however near.
    #[test]
    fn the_source_agrees_so_far_and_has_the_nearest_signature() {
        let a = iteration(100, &[1000, 1000]);
        let b = iteration(400, &[4000, 4000]);
        let mut departs = iteration(700, &[7000, 7000]);
        departs.ops[1].kind = OpUse::Access;
        let library = vec![(vec![100], a.clone()), (vec![400], b), (vec![700], departs)];
        let cur = |input: u64| Trajectory {
            ops: iteration(input, &[input * 10]).ops[..2].to_vec(),
            ..Default::default()
        };
        assert_eq!(source(&library, &[150], &cur(150)), Some(0));
        assert_eq!(source(&library, &[300], &cur(300)), Some(1));
        // 700 is nearest to 800, but departs at its second operation.
        assert_eq!(source(&library, &[800], &cur(800)), Some(1));
        assert_eq!(source(&library[2..], &[800], &cur(800)), None);
    }

    /// A training loop whose inputs take shapes `s` of 6 to 11 (inputs of `s` to `4 s`
    /// KiB, twelve activations of `s x 16 KiB` read back in the backward; from 9 on over
    /// the 1.6 MiB cap; every size in proportion, as a CNN's at another image size),
    /// the large ones new: each new shape is re-planned from an earlier iteration with its
    /// bytes mapped, so that its planned moves find their tensors at the planned bytes
    /// (without it, the previous shape's moves are skipped, or there are none). Every
    /// byte read back is the one written.
    fn new_shapes(morph: bool) -> (u64, u64, u64) {
        let scales = [6u64, 7, 8, 6, 9, 10, 7, 11].map(|s| (s, None));
        let m = shapes_loop(5, morph, &scales);
        let s = &m.planner().unwrap().stats;
        (s.new_shape_plans, s.spills, s.skipped)
    }

    /// The loop of [`new_shapes`] over `(scale, extra)` iterations: an `extra` of
    /// `Some(i)` allocates one more 8 KiB tensor after the `i`-th activation (an
    /// iteration that departs from the others). Every byte read back is checked.
    fn shapes_loop(
        seed: u64,
        morph: bool,
        iterations: &[(u64, Option<usize>)],
    ) -> crate::tier::TierManager<crate::tier::tests::TestBackend> {
        use crate::tier::tests::{forward_backward, manager};
        let (mut m, _) = manager(seed);
        let mut p = crate::tier::planned::Planner::new(0.8, None);
        p.morph = morph;
        m.set_planner(p);
        for (it, &(scale, extra)) in iterations.iter().enumerate() {
            let it = it as u64;
            let input = [scale << 10, scale << 11, scale * (3 << 10), scale << 12];
            let mut sizes: Vec<u64> = input.to_vec();
            sizes.extend([scale * (16 << 10); 12]);
            if let Some(i) = extra {
                sizes.insert(4 + (i % 12) + 1, 8 << 10);
            }
            forward_backward(&mut m, it, &sizes);
            m.iteration_boundary().unwrap();
        }
        m
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Shapes drawn at random, some iterations departing from the others: plans for
        /// a new shape are made, replaced and abandoned mid-iteration, and every byte
        /// still comes back as written, with the allocator's invariants after every free.
        #[test]
        fn new_shapes_and_departures_keep_every_byte(
            seed in 0u64..1024,
            iterations in proptest::collection::vec(
                (4u64..13, proptest::option::weighted(0.3, 0usize..12)),
                6..12,
            ),
        ) {
            let m = shapes_loop(seed, true, &iterations);
            m.check_invariants().unwrap();
        }
    }

    #[test]
    fn a_new_shape_is_planned_from_an_earlier_one_with_its_bytes_mapped() {
        let (plans_off, spills_off, skipped_off) = new_shapes(false);
        let (plans_on, spills_on, skipped_on) = new_shapes(true);
        assert_eq!(plans_off, 0);
        assert!(plans_on >= 3, "{plans_on} plans for a new shape");
        assert!(
            spills_on > spills_off && skipped_on < skipped_off,
            "planned spills {spills_off} -> {spills_on}, skipped {skipped_off} -> {skipped_on}"
        );
    }
}
