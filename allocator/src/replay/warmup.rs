//! A modelled warm-up iteration: how a training process created the trace's static
//! blocks before recording began, so that an allocator emulation starts the recording
//! with the segment layout such a process would have.
//!
//! A recorded trace starts after warm-up: its static blocks (parameters, optimizer
//! state, workspaces) already live, placed by the recording allocator among the
//! activations of the warm-up iteration. Allocating them all first, densely, gives a
//! caching allocator a layout that the real process never had (docs/allocator.md,
//! "Validating the PyTorch emulation", shows the two layouts side by side). The model:
//! 1. every static block not recognised as optimizer state (parameters, buffers,
//!    workspaces) is allocated first, in trace order, as `model.to(device)` does;
//! 2. one iteration of the trace is replayed; the optimizer state is allocated where a
//!    first `optimizer.step()` creates it (see [`step_point`]), parameter by parameter,
//!    `copies - 1` tensors each, as `Adam` (`exp_avg`, `exp_avg_sq`) and momentum `SGD`
//!    (`momentum_buffer`) do;
//! 3. what the warm-up iteration still holds is freed; the recording then replays from
//!    its first event, the static blocks live.
//!
//! Optimizer state is recognised by shape alone (traces carry no tensor roles): an
//! optimizer keeping `m - 1` state tensors per parameter makes the count of static
//! blocks of every parameter size a multiple of `m`. See [`state_copies`].

use std::collections::HashMap;
use std::ops::Range;

use memcast_trace::{EventKind, Trace};
use serde::{Deserialize, Serialize};

use crate::replay::workspace::{self, WorkspaceRule};
use crate::replay::{ReplayError, ReplayTarget};

/// Which iteration of the trace the modelled warm-up replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Warmup {
    /// No warm-up: static blocks are allocated first, then the recording.
    None,
    /// No warm-up when the trace holds its own ([`holds_its_own_warm_up`]: recorded
    /// from the process's start); else `largest` when the trace's source recording
    /// shows that its allocator reserved no memory while recording
    /// ([`reserved_nothing_while_recording`]); else `first`.
    #[default]
    Auto,
    /// The trace's first iteration (a warm-up like the first recorded iteration).
    First,
    /// The iteration with the largest peak demand: for recordings whose warm-up ran at
    /// the largest shape (a common way to pre-reserve memory for dynamic shapes).
    Largest,
}

/// Whether `trace` was recorded from its process's start: it has no static blocks and
/// allocates before its first iteration boundary (the model's construction and the
/// warm-up are events, as `scripts/corpus/record.py --from-start` records them). Then
/// there is nothing to model: the replay from its first event is what the process did.
pub fn holds_its_own_warm_up(trace: &Trace) -> bool {
    trace.static_blocks.is_empty()
        && trace
            .events
            .iter()
            .take_while(|e| !matches!(e.kind, EventKind::IterationBoundary))
            .any(|e| matches!(e.kind, EventKind::Alloc { .. }))
}

/// Whether `trace` comes from a recorded PyTorch snapshot whose allocator obtained no
/// segment while recording (its `segment_alloc` events are kept as
/// `Trace::source_segments`).
///
/// A caching allocator that never returns memory and reserved nothing new held, when
/// the recording began, enough for every recorded iteration, the largest included: the
/// process had already run something at least that demanding. The least warm-up
/// consistent with that is the largest iteration. A recording that did reserve memory
/// started from less, and the first iteration stands for its warm-up. Only the
/// decision comes from the recording: neither segment sizes nor the final layout are
/// used. Traces with no source recording (synthetic, native) get `first`.
///
/// Evidence (docs/allocator.md, "Validating the PyTorch emulation"): of the eight real
/// traces, only resnet50_multiscale reserved nothing while recording, and its
/// snapshot's segments show a warm-up at its largest (256-pixel) shape; bert_dynseq
/// and gpt2_dynbatch reserved memory while recording and warmed up at their first
/// shape. One trace decides this rule: a second such recording would test it.
pub fn reserved_nothing_while_recording(trace: &Trace) -> bool {
    trace.meta.source == "pytorch-snapshot" && !trace.source_segments.iter().any(|s| s.alloc)
}

/// The order in which the modelled process created the static blocks (placed in this
/// order: a caching allocator's layout follows it).
///
/// A trace's own order of static blocks may carry the recording allocator's layout: the
/// PyTorch importer lists the blocks still live at the end in the snapshot's segment and
/// address order, which is PyTorch's final layout. An emulation that placed blocks in
/// that order would be told where PyTorch put them. The default order uses only what
/// the recording's events and the blocks' sizes say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StaticOrder {
    /// Blocks freed during the recording first, in the order of their frees (events,
    /// not layout); then the rest by size, largest first, and by stream (blocks of one
    /// size and stream are interchangeable for placement).
    #[default]
    SizeDesc,
    /// As `size-desc`, smallest first.
    SizeAsc,
    /// The trace's own order (for an imported PyTorch snapshot: its final layout).
    Trace,
}

/// Static block indices (into `trace.static_blocks`) in creation order `how`.
pub fn creation_order(trace: &Trace, how: StaticOrder) -> Vec<usize> {
    let n = trace.static_blocks.len();
    if how == StaticOrder::Trace {
        return (0..n).collect();
    }
    let index: HashMap<u64, usize> = trace
        .static_blocks
        .iter()
        .enumerate()
        .map(|(i, b)| (b.id, i))
        .collect();
    let mut taken = vec![false; n];
    let mut order = Vec::with_capacity(n);
    for e in &trace.events {
        if let EventKind::Free { id } = e.kind {
            if let Some(&i) = index.get(&id) {
                if !std::mem::replace(&mut taken[i], true) {
                    order.push(i);
                }
            }
        }
    }
    let mut rest: Vec<usize> = (0..n).filter(|&i| !taken[i]).collect();
    // Stable sorts; blocks of one size and stream are interchangeable, so the result
    // does not depend on the trace's order.
    let key = |i: &usize| {
        (
            trace.static_blocks[*i].bytes,
            trace.static_blocks[*i].stream,
        )
    };
    match how {
        StaticOrder::SizeAsc => rest.sort_by_key(key),
        _ => rest.sort_by_key(|i| std::cmp::Reverse(key(i))),
    }
    order.extend(rest);
    order
}

/// What the warm-up allocates and when. Indices are into `trace.static_blocks` and
/// `trace.events`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmupPlan {
    /// Static blocks allocated before the warm-up iteration, in order.
    pub before: Vec<usize>,
    /// Static blocks (optimizer state) allocated before event `step_at`, in order.
    pub state: Vec<usize>,
    /// The events replayed as the warm-up iteration.
    pub iteration: Range<usize>,
    /// The event index in `iteration` (or its end) before which `state` is allocated.
    pub step_at: usize,
    /// cuBLAS workspaces ([`crate::replay::workspace`]): `(static block, event index)`, created
    /// before that event of `iteration` (or at its end).
    pub workspaces: Vec<(usize, usize)>,
    /// Tensors per parameter: 1 when no optimizer state was recognised.
    pub copies: usize,
    /// The iteration choice replayed (`first` or `largest`; `auto` resolved).
    pub which: Warmup,
}

impl WarmupPlan {
    /// What the warm-up inferred, for the replay report's `extra.warmup`.
    pub fn summary(&self) -> serde_json::Value {
        serde_json::json!({
            "iteration": self.which,
            "state_copies": self.copies,
            "static_blocks_first": self.before.len(),
            "state_blocks": self.state.len(),
            "workspaces_at_event": self.workspaces.iter().map(|w| w.1).collect::<Vec<_>>(),
            "iteration_events": [self.iteration.start, self.iteration.end],
            "step_at_event": self.step_at,
        })
    }
}

/// The share of static bytes that must sit in size classes whose count is a multiple
/// of `m` for the static blocks to be read as parameters plus `m - 1` state copies.
/// With Adam or momentum SGD every parameter has its state, so nearly all static bytes
/// pass (the rest: buffers, workspaces); without an optimizer (inference) the one-off
/// tensors (embeddings, heads: count 1) fail, however regular the repeated layers are.
/// The value was set with the eight real traces in view (their lowest passing share is
/// 91%): a model whose one-off tensors or workspaces hold more than 10% of the static
/// bytes is read as having no state (docs/allocator.md names two synthetic ones).
pub const STATE_SHARE: f64 = 0.9;

/// `m`: 3 (Adam-like), 2 (momentum-like) or 1 (no optimizer state recognised).
pub fn state_copies(trace: &Trace) -> usize {
    let n = trace.static_blocks.len();
    let count = size_classes(trace, &(0..n).collect::<Vec<_>>());
    // u128: sizes come from the input, and a sum must not overflow on any trace.
    let bytes = |keep: &dyn Fn(usize) -> bool| -> f64 {
        count
            .iter()
            .filter(|(_, idx)| keep(idx.len()))
            .map(|(&s, idx)| u128::from(s) * idx.len() as u128)
            .sum::<u128>() as f64
    };
    let total = bytes(&|_| true);
    if total == 0.0 {
        return 1;
    }
    let (s3, s2) = (bytes(&|c| c % 3 == 0), bytes(&|c| c % 2 == 0));
    let (p3, p2) = (s3 >= STATE_SHARE * total, s2 >= STATE_SHARE * total);
    // Counts that are multiples of 6 pass both tests; the one-off tensors (count m)
    // decide: the larger share wins, and a tie is ambiguous (no state recognised).
    match (p3, p2) {
        (true, true) if s3 > s2 => 3,
        (true, true) if s2 > s3 => 2,
        (true, true) => 1,
        (true, false) => 3,
        (false, true) => 2,
        (false, false) => 1,
    }
}

/// The warm-up plan for `trace`: `copies` tensors per parameter (0: [`state_copies`]),
/// replaying the iteration `which` picks. `None` for [`Warmup::None`] and for traces
/// without a whole iteration (fewer than two iteration boundaries).
pub fn plan(trace: &Trace, which: Warmup, copies: usize, order: StaticOrder) -> Option<WarmupPlan> {
    plan_with(trace, which, copies, order, WorkspaceRule::default())
}

/// [`plan`], with the cuBLAS workspaces read and placed by `workspaces`.
pub fn plan_with(
    trace: &Trace,
    which: Warmup,
    copies: usize,
    order: StaticOrder,
    workspaces: WorkspaceRule,
) -> Option<WarmupPlan> {
    let bounds: Vec<usize> = trace
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e.kind, EventKind::IterationBoundary))
        .map(|(i, _)| i)
        .collect();
    let iterations = bounds.windows(2).map(|w| w[0] + 1..w[1]);
    let which = match which {
        Warmup::Auto if holds_its_own_warm_up(trace) => return None,
        Warmup::Auto if reserved_nothing_while_recording(trace) => Warmup::Largest,
        Warmup::Auto => Warmup::First,
        w => w,
    };
    let iteration = match which {
        Warmup::None | Warmup::Auto => return None,
        Warmup::First => iterations.clone().next()?,
        // The first of the iterations with the largest peak.
        Warmup::Largest => {
            iterations
                .map(|it| (demand(trace, it.clone()).0, it))
                .fold(
                    None,
                    |best: Option<(i128, Range<usize>)>, (p, it)| match best {
                        Some((bp, _)) if bp >= p => best,
                        _ => Some((p, it)),
                    },
                )?
                .1
        }
    };
    let copies = if copies == 0 {
        state_copies(trace)
    } else {
        copies
    };
    let mut order = creation_order(trace, order);
    let ws = workspaces.pick(trace, &order, copies);
    order.retain(|i| !ws.contains(i));
    let (before, state) = split_state(trace, copies, &order);
    let peak = peak_point(trace, iteration.clone());
    let first_free = workspace::first_free(trace, iteration.clone());
    let points = workspaces.points(ws.len(), iteration.start, first_free, peak);
    Some(WarmupPlan {
        before,
        state,
        workspaces: ws.into_iter().zip(points).collect(),
        step_at: step_point(trace, iteration.clone()),
        iteration,
        copies,
        which,
    })
}

/// Static block indices by requested size, each list in `order`.
fn size_classes(trace: &Trace, order: &[usize]) -> HashMap<u64, Vec<usize>> {
    let mut by_size: HashMap<u64, Vec<usize>> = HashMap::new();
    for &i in order {
        by_size
            .entry(trace.static_blocks[i].bytes)
            .or_default()
            .push(i);
    }
    by_size
}

/// Splits the static blocks into (allocated first, optimizer state). In each size
/// class whose count `c` is a multiple of `copies`, the first `c / copies` blocks are
/// parameters and the others their state; the state is ordered parameter by
/// parameter (in the parameters' trace order), `copies - 1` blocks each.
///
/// `order` stands for creation order ([`creation_order`]). Traces do not record it, so
/// which block of a size is called the parameter and which its state is a guess;
/// same-size blocks are interchangeable for placement, so only the order in which
/// parameters of different sizes are placed is affected.
fn split_state(trace: &Trace, copies: usize, order: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let n = trace.static_blocks.len();
    if copies <= 1 {
        return (order.to_vec(), Vec::new());
    }
    let mut is_state = vec![false; n];
    let mut state_of: HashMap<usize, &[usize]> = HashMap::new();
    let classes = size_classes(trace, order);
    for idx in classes.values().filter(|idx| idx.len() % copies == 0) {
        let params = idx.len() / copies;
        let (firsts, rest) = idx.split_at(params);
        for (p, st) in firsts.iter().zip(rest.chunks(copies - 1)) {
            for &s in st {
                is_state[s] = true;
            }
            state_of.insert(*p, st);
        }
    }
    let before: Vec<usize> = order.iter().copied().filter(|&i| !is_state[i]).collect();
    let state = before
        .iter()
        .filter_map(|p| state_of.get(p))
        .flat_map(|st| st.iter().copied())
        .collect();
    (before, state)
}

/// The live-demand curve of events `it`: `(peak, curve)` where `curve[k]` is the
/// demand (relative to the iteration's start) before event `it.start + k`.
fn demand(trace: &Trace, it: Range<usize>) -> (i128, Vec<i128>) {
    let mut sizes: HashMap<u64, i128> = HashMap::new();
    let mut live: i128 = 0;
    let mut curve = Vec::with_capacity(it.len() + 1);
    for e in &trace.events[it] {
        curve.push(live);
        match e.kind {
            EventKind::Alloc { id, bytes, .. } => {
                sizes.insert(id, i128::from(bytes));
                live += i128::from(bytes);
            }
            // Frees of tensors from before the iteration do not count: the curve
            // measures what the iteration itself holds.
            EventKind::Free { id } => live -= sizes.remove(&id).unwrap_or(0),
            _ => {}
        }
    }
    curve.push(live);
    (curve.iter().copied().max().unwrap_or(0), curve)
}

/// The iteration's first event of most live demand (where forward ends and backward
/// begins in a training step).
pub fn peak_point(trace: &Trace, it: Range<usize>) -> usize {
    let (peak, curve) = demand(trace, it.clone());
    it.start + curve.iter().position(|&d| d == peak).unwrap_or(0)
}

/// Where a first `optimizer.step()` runs: after backward, when the iteration holds the
/// least, before the trailing run of frees (`zero_grad` releasing the gradients).
/// Formally: the first event index of minimum live demand between the iteration's
/// (first) peak and its last allocation; the iteration's end when nothing is
/// allocated after the peak. On the shared PyTorch traces this lands within five
/// events of the recorded `Optimizer.step` annotation (docs/allocator.md).
pub fn step_point(trace: &Trace, it: Range<usize>) -> usize {
    let (peak, curve) = demand(trace, it.clone());
    let at_peak = curve.iter().position(|&d| d == peak).unwrap_or(0);
    let last_alloc = trace.events[it.clone()]
        .iter()
        .rposition(|e| matches!(e.kind, EventKind::Alloc { .. }));
    match last_alloc {
        Some(k) if k >= at_peak => (at_peak..=k + 1)
            .min_by_key(|&j| (curve[j], j))
            .map_or(it.end, |j| it.start + j),
        _ => it.end,
    }
}

/// Runs `plan` on `t`: the static blocks, the warm-up iteration, its release. Returns
/// every static block's handle as `(index in trace.static_blocks, handle)`. The plan must
/// come from [`plan`] for this trace (crate-private, so a hand-built plan with bad
/// indexes cannot reach it).
/// `ensure_stream(t, stream, event)` creates the streams the events name.
pub(crate) fn run<T, S>(
    trace: &Trace,
    t: &mut T,
    plan: &WarmupPlan,
    ensure_stream: &mut S,
) -> Result<Vec<(usize, T::Handle)>, ReplayError>
where
    T: ReplayTarget,
    S: FnMut(&mut T, u32, u64) -> Result<(), ReplayError>,
{
    let fail = |index: usize| {
        move |source| ReplayError::Warmup {
            index: index as u64,
            source,
        }
    };
    let mut statics = Vec::with_capacity(trace.static_blocks.len());
    let mut alloc_static = |t: &mut T, ensure: &mut S, list: &[usize], index: usize| {
        for &i in list {
            let b = trace.static_blocks[i];
            ensure(t, b.stream, index as u64)?;
            statics.push((i, t.alloc(b.bytes, b.stream).map_err(fail(index))?));
        }
        Ok::<(), ReplayError>(())
    };
    alloc_static(t, ensure_stream, &plan.before, plan.iteration.start)?;
    // The warm-up's own tensors: id -> (allocation order, handle, stream).
    let mut held: HashMap<u64, (usize, T::Handle, u32)> = HashMap::new();
    let workspaces_at = |index: usize| -> Vec<usize> {
        plan.workspaces
            .iter()
            .filter(|w| w.1 == index)
            .map(|w| w.0)
            .collect()
    };
    for index in plan.iteration.clone() {
        alloc_static(t, ensure_stream, &workspaces_at(index), index)?;
        if index == plan.step_at {
            alloc_static(t, ensure_stream, &plan.state, index)?;
        }
        match trace.events[index].kind {
            EventKind::Alloc { id, bytes, stream } => {
                ensure_stream(t, stream, index as u64)?;
                let h = t.alloc(bytes, stream).map_err(fail(index))?;
                held.insert(id, (index, h, stream));
            }
            // Frees of static blocks are the recording's, not the warm-up's.
            EventKind::Free { id } => {
                if let Some((_, h, stream)) = held.remove(&id) {
                    t.free(h, stream).map_err(fail(index))?;
                }
            }
            EventKind::Access { .. } | EventKind::IterationBoundary => {}
        }
    }
    let late: Vec<usize> = plan
        .workspaces
        .iter()
        .filter(|w| w.1 >= plan.iteration.end)
        .map(|w| w.0)
        .collect();
    alloc_static(t, ensure_stream, &late, plan.iteration.end)?;
    if plan.step_at >= plan.iteration.end {
        alloc_static(t, ensure_stream, &plan.state, plan.iteration.end)?;
    }
    // What outlives the iteration (its outputs) is released before the recording,
    // oldest first.
    let mut rest: Vec<_> = held.into_values().collect();
    rest.sort_unstable_by_key(|r| r.0);
    for (_, h, stream) in rest {
        t.free(h, stream).map_err(fail(plan.iteration.end))?;
    }
    Ok(statics)
}

#[cfg(test)]
#[path = "warmup_tests.rs"]
pub(crate) mod tests;
