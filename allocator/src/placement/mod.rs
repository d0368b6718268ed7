//! Planned placement (`placement:planned`): the last iteration decides where this
//! iteration's large runs go.
//!
//! A training or inference loop repeats itself: iteration k+1 asks for the same runs in
//! the same order, with the same lifetimes, as iteration k. Best fit places each run
//! knowing only the past and fragments the segment at the iteration's peak (PyTorch's
//! allocators alike: 1-11% above the peak of live bytes on the H200 recordings);
//! knowing the whole iteration, an offline placement reaches the peak of live bytes
//! itself ([`solve`]).
//!
//! The loop, per stream, on the stream's growable segment for large runs:
//! 1. *Log.* Each large run allocated in an iteration gets a key, its rounded length
//!    its context and the ordinal of both in the iteration ([`Key`]), and its
//!    allocation and free times on the iteration's
//!    clock (large events counted from the boundary).
//! 2. *Plan* (at [`Allocator::iteration_boundary`]): the runs live now are fixed, each
//!    expected to be freed when the run of its key allocated one iteration earlier was
//!    (or never); the iteration just ended, replayed, is what the next one will ask for.
//!    [`solve`] places it around the fixed runs. The plan is kept only if its highest
//!    end is at most what the ended iteration used (it never plans worse than what it
//!    saw), and computed again only when the last iteration missed or had no plan.
//! 3. *Serve.* A large allocation whose key has a planned offset is carved exactly
//!    there if that range of the segment is free (growing the segment to the plan's
//!    highest end when it lies beyond the mapped bytes); anything else (no plan, a key
//!    the plan does not know, a range not free because the iteration went otherwise) is
//!    placed by best fit as without a plan. The plan is advice: a wrong plan costs
//!    memory, never correctness; every carve is checked against the placement index.
//!
//! While a plan serves a stream, its freed runs are not cached (deferred coalescing
//! would hold them as used blocks where the plan wants free space): a freed run merges
//! with its free neighbours at once, and the cache is emptied when a plan starts.
//! Without a plan the stream caches as best fit does (measured: without the cache,
//! wav2vec2's dynamic-length trace reserves 18.8% above its peak instead of 10.2%).
//!
//! Costs (planned mode only; reactive allocators pay one untaken branch per large
//! allocation and per run freed): per large allocation, while the iteration repeats
//! the previous one (or the recording), the key and the planned offset read at its
//! position (`keys`: vector reads and a compare; at the first length that differs,
//! the ordinal map is rebuilt once and a hash entry and lookup follow); with a planned
//! offset, the live run left of it (`live`: O(1), 2 MiB bucket lists) and a walk of
//! the segment's blocks from there to the offset (`Extents::containing_from`); the log
//! (a vector push, a slot insert). Per run freed, a slot removal and a bucket unlink
//! (O(1)); no freed run is cached under a plan, so each one coalesces in the
//! placement index (best fit's cache hits skip that): the part of the gap to best fit
//! that remains. The plan at a boundary when needed (see [`solve`]). Measured on the
//! sim (`examples/planned_cost`, best fit and the trace as its own profile alternated,
//! best of the reps, ns per allocation or free), GPT-2's recording and 20 repeats of
//! its last iteration: 31 against 91 ns with a hash map and a B-tree of live runs and
//! hash-map keys, 31 against 55 ns now; ResNet-50 and BERT alike (docs/allocator.md).
//!
//! [`Allocator::iteration_boundary`]: crate::Allocator::iteration_boundary

mod keys;
mod live;
mod profile;
mod serve;
pub mod solve;

use keys::{IterKeys, KeyedPlan};
use profile::Profile;

use crate::config::AllocConfig;
use crate::error::AllocError;

/// The placement state `cfg` asks for: `None` under best fit; under planned placement
/// with a profile, the profile's plan (the trace is read and planned here; an
/// unreadable one is an error naming the file).
pub(crate) fn for_config(
    cfg: &AllocConfig,
    small_max: u64,
) -> Result<Option<Box<Placement>>, AllocError> {
    // A profile implies planned placement, whatever the order of the keys.
    if cfg.placement != crate::config::Placement::Planned && cfg.placement_profile.is_none() {
        return Ok(None);
    }
    let Some(path) = cfg.placement_profile.as_deref() else {
        return Ok(Some(Box::default()));
    };
    let trace = memcast_trace::io::load_trace(std::path::Path::new(path)).map_err(|e| {
        AllocError::Config(format!(
            "placement_profile {}",
            crate::config::named(path, &e)
        ))
    })?;
    Ok(Some(Box::new(Placement::for_trace(
        &trace,
        small_max,
        cfg.min_block,
    ))))
}

use crate::fxmap::FxMap;
use solve::{Fixed, Want};

/// A run's identity across iterations: its rounded length, its context (the lengths
/// of the two large allocations before it in the iteration) and the ordinal of that
/// (length, context) pair in the iteration. The context keeps an iteration whose
/// start differs (the first one, which also loads the model and creates the
/// optimizer's state) from shifting the keys of everything after: only runs within
/// two allocations of a difference change key.
pub type Key = (u64, u64, u32);

/// Where the plan wants a large allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// Offset `off` of segment `seg` (the in-run plan).
    Plan { seg: u32, off: u64 },
    /// Offset `off` of the stream's growable segment (the profile).
    Profile { off: u64 },
}

/// What planned placement did (`Allocator::placement_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PlacementStats {
    /// Large allocations carved at their planned offset.
    pub planned_hits: u64,
    /// Large allocations with a planned offset whose range was not free (placed by
    /// best fit instead).
    pub planned_misses: u64,
    /// Large allocations under a plan whose key it did not know.
    pub unplanned: u64,
    /// Iterations whose plan stopped serving at a miss or an unknown key (the rest of
    /// the iteration by best fit; planning then backs off).
    pub abandoned: u64,
    /// Boundaries where no plan was made because the iteration that ended differed
    /// from the one before it.
    pub not_repeating: u64,
    /// Plans computed, and plans that went on to serve: those computed and kept (no
    /// higher than the iteration they came from), plus a profile's hand-over of its
    /// last iteration's plan when the profile ends (so `plans_kept` can exceed `plans`).
    pub plans: u64,
    pub plans_kept: u64,
    /// The highest end offset of the last plan kept (bytes of its segment).
    pub plan_high: u64,
    /// Large allocations carved where a placement profile planned them, and those
    /// whose planned range was not free or whose key the profile did not know.
    pub profile_hits: u64,
    pub profile_misses: u64,
    /// The highest end offset of the profile's plan (stream 0's, if it has one).
    pub profile_high: u64,
}

/// A large run this iteration allocated.
#[derive(Debug, Clone, Copy)]
struct Item {
    key: Key,
    len: u64,
    alloc: u32,
    // Invariant: free == u32::MAX while the run is live.
    free: u32,
}

/// A live large run of the stream.
#[derive(Debug, Clone, Copy)]
struct Live {
    key: Key,
    seg: u32,
    growable: bool,
    off: u64,
    len: u64,
    /// The iteration it was allocated in, and its index in that iteration's items.
    iteration: u64,
    item: u32,
}

/// One stream's log and plan.
#[derive(Debug, Default)]
struct StreamPlan {
    /// Large events since the boundary.
    clock: u32,
    iteration: u64,
    /// Keys since the boundary.
    keys: IterKeys,
    /// The plan of a whole recorded run, while it serves.
    profile: Option<Profile>,
    items: Vec<Item>,
    // Invariant: one entry per live large run of the stream (record id -> run).
    /// The live runs, also by offset in the growable segment: the run left of a
    /// planned offset starts the search for the free block there
    /// (`Extents::containing_from`).
    live: live::LiveRuns,
    /// Keys of runs allocated in the previous iteration and freed in this one, with the
    /// clock of their free: when a run of that key allocated now will be freed.
    wrap: FxMap<Key, u32>,
    /// The plan of this iteration: key -> offset in segment `seg`.
    plan: KeyedPlan,
    seg: u32,
    high: u64,
    /// Misses this iteration (a new plan is computed at the boundary if any).
    misses: u64,
    /// The plan stopped serving this iteration (a miss, or a key it does not know:
    /// the iteration went otherwise, and what follows would miss in cascade).
    abandoned: bool,
    /// Iterations abandoned in a row, and boundaries left without planning (back-off:
    /// 2^fails - 1 of them, at most 63, so that a workload whose iterations differ
    /// pays for few wrong plans).
    fails: u32,
    skip: u32,
    /// A hash of this iteration's large events (allocations and frees, by key), and
    /// whether the iteration that ended repeated the one before it: only a repeating
    /// loop is planned (the next iteration is then likely the same again; where
    /// iterations differ, a plan of the last one misplaces runs before any miss shows
    /// it).
    sig: u64,
    last_sig: u64,
    /// Boundaries in a row whose iteration repeated the one before it.
    repeats: u32,
    /// The highest end offset of a run in `seg` this iteration.
    used_high: u64,
    /// The live runs the plan was made around ([`layout`]): a plan serves the next
    /// iteration only if it starts from the same layout.
    planned_layout: u64,
    /// The (layout, iteration signature) of the last plan made and not kept: the same
    /// inputs give the same plan, so it is not computed again for them.
    rejected: Option<(u64, u64)>,
}

/// Repeats in a row (equal consecutive iterations) before the log's plans are used.
const REPEATS: u32 = 2;

/// Large allocations in one iteration above which the log starts over, unplanned: a
/// program that never calls `iteration_boundary` must not grow the log for ever.
const ITEMS_MAX: usize = 1 << 17;

/// The running hash of an iteration's events: `h` after an event of `kind` on `key`.
fn mix(h: u64, key: Key, kind: u64) -> u64 {
    let x = key.0 ^ key.1.rotate_left(23) ^ (u64::from(key.2) << 40) ^ kind;
    (h.rotate_left(5) ^ x).wrapping_mul(crate::fxmap::K)
}

impl StreamPlan {
    /// The log of a new iteration: its clock, keys, runs and wrap times start over.
    fn next_iteration(&mut self) {
        self.iteration += 1;
        self.clock = 0;
        self.keys.clear();
        self.items.clear();
        self.wrap.clear();
    }
}

/// An order-independent hash of the live runs of segment `seg`: (key, offset, length)
/// of each.
fn layout(live: &live::LiveRuns, seg: u32) -> u64 {
    live.values()
        .filter(|l| l.seg == seg)
        .map(|l| {
            let h = (l.key.0 ^ l.key.1.rotate_left(17) ^ u64::from(l.key.2).rotate_left(41))
                .wrapping_mul(crate::fxmap::K)
                ^ l.off.wrapping_mul(0x2545_f491_4f6c_dd1d)
                ^ l.len.rotate_left(7);
            h ^ (h >> 31)
        })
        .fold(0u64, u64::wrapping_add)
}

/// Planned placement's state: one log and plan per stream.
#[derive(Debug, Default)]
pub struct Placement {
    streams: Vec<StreamPlan>,
    pub stats: PlacementStats,
}

/// Stream `s`'s log (created on first use).
fn stream_of(streams: &mut Vec<StreamPlan>, s: u32) -> &mut StreamPlan {
    let i = s as usize;
    if i >= streams.len() {
        streams.resize_with(i + 1, StreamPlan::default);
    }
    &mut streams[i]
}

impl Placement {
    fn stream(&mut self, s: u32) -> &mut StreamPlan {
        stream_of(&mut self.streams, s)
    }

    /// Planned placement with the profile of recorded run `trace` (see `profile`):
    /// large runs are those of at least `small_max` bytes, rounded to `min_block`.
    pub fn for_trace(trace: &memcast_trace::Trace, small_max: u64, min_block: u64) -> Self {
        let mut p = Placement::default();
        for (stream, prof) in profile::plan_trace(trace, small_max, min_block) {
            // Records keep the stream in 16 bits: no such stream can exist here.
            if stream > u32::from(u16::MAX) {
                continue;
            }
            if stream == 0 {
                p.stats.profile_high = prof.high;
            }
            p.stream(stream).profile = Some(prof);
        }
        p
    }

    /// The key of the next large allocation of `len` on `stream`, and where the plan
    /// wants it (the profile's offset while it serves, else the in-run plan's).
    #[inline]
    pub(crate) fn next(&mut self, stream: u32, len: u64) -> (Key, Option<Target>) {
        let p = stream_of(&mut self.streams, stream);
        let key = p.keys.next(len);
        if let Some(pr) = p.profile.as_mut() {
            if pr.active() {
                let off = pr.next(len);
                if off.is_none() {
                    self.stats.profile_misses += 1;
                }
                return (key, off.map(|off| Target::Profile { off }));
            }
        }
        if p.abandoned || p.plan.is_empty() {
            return (key, None);
        }
        let target = p
            .plan
            .get(p.items.len(), &key)
            .map(|off| Target::Plan { seg: p.seg, off });
        if target.is_none() {
            self.stats.unplanned += 1;
            p.abandoned = true;
        }
        (key, target)
    }

    /// Records the outcome of a planned offset.
    pub(crate) fn outcome(&mut self, stream: u32, target: Target, hit: bool) {
        let p = stream_of(&mut self.streams, stream);
        match (target, hit) {
            (Target::Profile { .. }, true) => self.stats.profile_hits += 1,
            (Target::Profile { .. }, false) => {
                self.stats.profile_misses += 1;
                if let Some(pr) = p.profile.as_mut() {
                    pr.missed();
                }
            }
            (Target::Plan { .. }, true) => self.stats.planned_hits += 1,
            (Target::Plan { .. }, false) => {
                self.stats.planned_misses += 1;
                p.misses += 1;
                p.abandoned = true;
            }
        }
    }

    /// The highest end offset of what `target` belongs to (growth maps up to it).
    pub(crate) fn high(&self, stream: u32, target: Target) -> u64 {
        let Some(p) = self.streams.get(stream as usize) else {
            return 0;
        };
        match target {
            Target::Plan { .. } => p.high,
            Target::Profile { .. } => p.profile.as_ref().map_or(0, |pr| pr.high),
        }
    }

    /// Logs a large run `id` of `len` bytes allocated at `off` of segment `seg` (the
    /// stream's growable segment if `growable`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn allocated(
        &mut self,
        stream: u32,
        id: u32,
        key: Key,
        seg: u32,
        off: u64,
        len: u64,
        growable: bool,
    ) {
        let p = self.stream(stream);
        if p.items.len() >= ITEMS_MAX {
            // An iteration of its own, never planned (no repeat is counted for it).
            p.next_iteration();
            p.repeats = 0;
            p.last_sig = !p.sig;
        }
        let alloc = p.clock;
        p.clock += 1;
        p.items.push(Item {
            key,
            len,
            alloc,
            free: u32::MAX,
        });
        if growable {
            p.used_high = p.used_high.max(off + len);
        }
        p.sig = mix(p.sig, key, 1);
        let item = (p.items.len() - 1) as u32;
        p.live.insert(
            id,
            Live {
                key,
                seg,
                growable,
                off,
                len,
                iteration: p.iteration,
                item,
            },
        );
    }

    /// Logs the free of large run `id` (a no-op for a run allocated before planned
    /// placement started).
    pub(crate) fn freed(&mut self, stream: u32, id: u32) {
        let p = self.stream(stream);
        let Some(l) = p.live.remove(id) else {
            return;
        };
        let now = p.clock;
        p.clock += 1;
        p.sig = mix(p.sig, l.key, 2 + (l.iteration != p.iteration) as u64);
        if l.iteration == p.iteration {
            p.items[l.item as usize].free = now;
        } else if l.iteration + 1 == p.iteration {
            p.wrap.insert(l.key, now);
        }
    }

    /// An iteration boundary: plans the next iteration of each stream from the one
    /// that ended. `growable(stream)` names the stream's growable segment for large
    /// runs, if it has one.
    pub(crate) fn boundary(&mut self, growable: impl Fn(u32) -> Option<u32>) {
        for s in 0..self.streams.len() {
            let seg = growable(s as u32);
            let stats = &mut self.stats;
            let p = &mut self.streams[s];
            let end = p.clock;
            // A profile that ended hands over its last iteration's plan, once.
            if let (Some(seg), Some(pr)) = (seg, p.profile.as_mut()) {
                if !pr.active() && !pr.periodic.is_empty() {
                    p.plan = std::mem::take(&mut pr.periodic);
                    p.seg = seg;
                    p.high = pr.high;
                    p.planned_layout = layout(&p.live, seg);
                    p.misses = 0;
                    stats.plans_kept += 1;
                    stats.plan_high = p.high;
                }
            }
            // While a profile serves and will outlast the next iteration, no plan of
            // the log's is needed.
            let profiled = p
                .profile
                .as_mut()
                .is_some_and(|pr| pr.active() && pr.left() > p.items.len() as u64);
            if p.abandoned {
                p.fails += 1;
                p.skip = (1u32 << p.fails.min(6)) - 1;
                p.plan.clear();
                stats.abandoned += 1;
            } else if !p.plan.is_empty() {
                p.fails = 0;
            }
            let skipping = p.skip > 0 && p.plan.is_empty();
            if skipping {
                p.skip -= 1;
            }
            p.repeats = if p.sig == p.last_sig {
                p.repeats + 1
            } else {
                0
            };
            // Three equal iterations in a row (two repeats): one repeat happens by
            // chance in a loop whose iterations differ (the graph networks of
            // docs/allocator.md), and a plan followed into an iteration that goes
            // otherwise leaves its runs where the rest of it does not want them.
            let repeating = p.repeats >= REPEATS;
            p.last_sig = p.sig;
            p.sig = 0;
            if !repeating && p.plan.is_empty() {
                stats.not_repeating += 1;
            }
            if let (Some(seg), false, false, true) = (seg, profiled, skipping, repeating) {
                let lay = layout(&p.live, seg);
                let needed = (p.plan.is_empty() && p.rejected != Some((lay, p.last_sig)))
                    || p.misses > 0
                    || p.seg != seg
                    || lay != p.planned_layout;
                if needed && !p.items.is_empty() {
                    stats.plans += 1;
                    plan(p, seg, end, stats);
                }
            }
            p.next_iteration();
            p.misses = 0;
            p.abandoned = false;
            p.used_high = seg.map_or(0, |seg| {
                p.live
                    .values()
                    .filter(|l| l.seg == seg)
                    .map(|l| l.off + l.len)
                    .max()
                    .unwrap_or(0)
            });
        }
    }

    /// Whether freed runs of `stream` may be cached (deferred coalescing): not while a
    /// plan serves it (a cached run is a used block where the plan wants free space).
    #[inline]
    pub(crate) fn caches(&self, stream: u32) -> bool {
        let Some(p) = self.streams.get(stream as usize) else {
            return true;
        };
        let profiled = p.profile.as_ref().is_some_and(|pr| pr.left() > 0);
        !profiled && (p.plan.is_empty() || p.abandoned)
    }

    /// The streams a plan serves from now on.
    pub(crate) fn planned_streams(&self) -> Vec<u32> {
        (0..self.streams.len() as u32)
            .filter(|&s| !self.caches(s))
            .collect()
    }

    /// The live run of `stream`'s growable segment that starts nearest at or below
    /// `off` (its record id). O(runs in two 2 MiB buckets).
    pub(crate) fn left_of(&self, stream: u32, off: u64) -> Option<u32> {
        let p = self.streams.get(stream as usize)?;
        p.live.left_of(off)
    }

    /// The logged live runs overlapping `target`'s range (diagnostics).
    pub(crate) fn occupants(&self, stream: u32, target: Target, len: u64) -> Vec<String> {
        let Some(p) = self.streams.get(stream as usize) else {
            return Vec::new();
        };
        let (seg, off) = match target {
            Target::Plan { seg, off } => (Some(seg), off),
            Target::Profile { off } => (None, off),
        };
        p.live
            .values()
            .filter(|l| seg.is_none_or(|s| s == l.seg) && l.off < off + len && off < l.off + l.len)
            .map(|l| {
                let planned = p.plan.get(usize::MAX, &l.key);
                let item = (l.iteration == p.iteration).then(|| p.items[l.item as usize]);
                format!(
                    "key {:?} at {} len {} it {} planned {:?} alloc {:?} clock {}",
                    l.key,
                    l.off,
                    l.len,
                    l.iteration,
                    planned,
                    item.map(|i| i.alloc),
                    p.clock
                )
            })
            .collect()
    }

    /// Checks the log against the allocator's live runs: `live_runs` yields (stream,
    /// record id, segment, offset, length) of every live large run. Every logged run
    /// must be one of them, where the log says.
    pub(crate) fn check(
        &self,
        live_runs: impl Iterator<Item = (u32, u32, u32, u64, u64)>,
    ) -> Result<(), String> {
        let mut seen = 0usize;
        for (s, id, seg, off, len) in live_runs {
            let Some(p) = self.streams.get(s as usize) else {
                continue;
            };
            if let Some(l) = p.live.get(id) {
                if (l.seg, l.off, l.len) != (seg, off, len) {
                    return Err(format!(
                        "placement log: run {id} at seg {} off {} len {}, allocator says seg {seg} off {off} len {len}",
                        l.seg, l.off, l.len
                    ));
                }
                seen += 1;
            }
        }
        for p in &self.streams {
            p.live.check()?;
        }
        let logged: usize = self.streams.iter().map(|p| p.live.len()).sum();
        if seen != logged {
            return Err(format!(
                "placement log: {logged} runs logged live, {seen} of them live in the allocator"
            ));
        }
        Ok(())
    }
}

/// Plans stream `p`'s next iteration in segment `seg` from the one that ended at clock
/// `end`; keeps the plan if it is no higher than what that iteration used.
fn plan(p: &mut StreamPlan, seg: u32, end: u32, stats: &mut PlacementStats) {
    let fixed: Vec<Fixed> = p
        .live
        .values()
        .filter(|l| l.seg == seg)
        .map(|l| Fixed {
            from: 0,
            off: l.off,
            len: l.len,
            until: if l.iteration == p.iteration {
                p.wrap.get(&l.key).copied().unwrap_or(u32::MAX)
            } else {
                u32::MAX
            },
        })
        .collect();
    let wants: Vec<Want> = p
        .items
        .iter()
        .map(|i| {
            Want::new(
                i.len,
                i.alloc,
                if i.free == u32::MAX { end } else { i.free },
            )
        })
        .collect();
    // Each run is hinted at its predecessor's offset (the live run of its key
    // allocated in the iteration that ended).
    let before: FxMap<Key, u64> = p
        .live
        .values()
        .filter(|l| l.seg == seg && l.iteration == p.iteration)
        .map(|l| (l.key, l.off))
        .collect();
    let hints: Vec<Option<u64>> = p
        .items
        .iter()
        .map(|i| before.get(&i.key).copied())
        .collect();
    let (offs, high) = solve::solve_with_hints(&wants, &fixed, &hints);
    if tracing::enabled!(tracing::Level::TRACE) {
        for l in p.live.values().filter(|l| l.seg == seg) {
            tracing::trace!(key = ?l.key, off = l.off, len = l.len, iteration = l.iteration,
                until = ?p.wrap.get(&l.key), "fixed");
        }
    }
    let seen = p
        .used_high
        .max(fixed.iter().map(|f| f.off + f.len).max().unwrap_or(0));
    tracing::debug!(
        iteration = p.iteration,
        runs = wants.len(),
        fixed = fixed.len(),
        fixed_bytes = fixed.iter().map(|f| f.len).sum::<u64>(),
        high,
        seen,
        misses = p.misses,
        kept = high <= seen,
        "placement plan"
    );
    p.plan.clear();
    p.high = 0;
    p.planned_layout = layout(&p.live, seg);
    p.rejected = (high > seen).then_some((p.planned_layout, p.last_sig));
    if high <= seen {
        p.plan = KeyedPlan::from_pairs(p.items.iter().zip(offs).map(|(i, o)| (i.key, o)));
        p.seg = seg;
        p.high = high;
        stats.plans_kept += 1;
        stats.plan_high = high;
    }
}
