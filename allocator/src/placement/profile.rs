//! A placement profile: a whole recorded run (a trace from `memcast_torch.record`, or
//! any trace) planned at once, so that a later run of the same job places every large
//! run, from its first allocation on, where the plan of the recorded one put it.
//!
//! In-run planning (the module docs) can only plan around the runs live at a boundary,
//! where best fit put them: parameters, gradients and optimizer state, which the first
//! iteration scatters across the segment. On GPT-2's recording those scattered runs
//! alone keep any plan of the steady iterations 0.5 GB above best fit. A profile places
//! them too: the plan of the whole recording reaches its peak of live bytes.
//!
//! Keys are those of the in-run log ([`super::Key`]: length, context, ordinal), counted
//! from the allocator's start instead of from each boundary. A run of the same job asks
//! for the same runs in the same order; where it does not, its keys stop matching and
//! the profile is dropped at its first miss, and in-run planning goes on alone. The
//! profile also ends where the recording ended.

use memcast_trace::{EventKind, Trace};

use super::keys::{KeyedPlan, Keys};
use super::solve::{self, Want};
use super::Key;
use crate::fxmap::FxMap;

/// One stream's plan of a whole recording.
#[derive(Debug, Default)]
pub(crate) struct Profile {
    /// The recording's large allocations in order: (length, planned offset). While
    /// this run's lengths are the recording's, the next one's offset is read here
    /// (its key would be the recording's key at the same position); at the first
    /// length that differs, `keys` and `plan` are built and serve from then on.
    seq: Vec<(u64, u64)>,
    pos: usize,
    // Invariant: follows, or keys holds the counts of this run's lengths so far and
    // plan = {the recording's key at i -> seq[i].1}.
    follows: bool,
    keys: Keys,
    plan: FxMap<Key, u64>,
    /// The last recorded iteration's offsets by per-iteration key: the plan of every
    /// iteration after the recording (empty when it had fewer than two boundaries).
    pub(crate) periodic: KeyedPlan,
    pub(crate) high: u64,
    /// Large allocations of the recording not yet seen in this run.
    left: u64,
    lookups: u64,
    misses: u64,
}

impl Profile {
    /// The planned offset of the next large allocation of `len` (advancing the keys);
    /// `None` once the profile ended. A vector read while this run follows the
    /// recording, else a key and a hash lookup.
    #[inline]
    pub(crate) fn next(&mut self, len: u64) -> Option<u64> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        self.lookups += 1;
        if self.follows {
            if let Some(&(l, off)) = self.seq.get(self.pos) {
                if l == len {
                    self.pos += 1;
                    return Some(off);
                }
            }
            self.diverge();
        }
        let key = self.keys.next(len);
        let off = self.plan.get(&key).copied();
        if off.is_none() {
            self.misses += 1;
        }
        off
    }

    /// This run stops following the recording: the keys of its lengths so far, and
    /// the plan by key.
    #[cold]
    #[inline(never)]
    fn diverge(&mut self) {
        self.follows = false;
        self.keys = Keys::after(self.seq[..self.pos].iter().map(|&(l, _)| l));
        let mut rec = Keys::default();
        self.plan = self
            .seq
            .iter()
            .map(|&(l, off)| (rec.next(l), off))
            .collect();
    }

    /// Large allocations of the recording not yet seen.
    pub(crate) fn left(&self) -> u64 {
        self.left
    }

    /// A planned offset whose range was not free.
    pub(crate) fn missed(&mut self) {
        self.misses += 1;
    }

    /// Whether it still serves: not past the recording's end and not diverged.
    pub(crate) fn active(&mut self) -> bool {
        if self.left > 0 && self.misses > 0 {
            tracing::info!(
                lookups = self.lookups,
                misses = self.misses,
                "placement profile: this run differs from the recorded one; dropped"
            );
            self.left = 0;
            // Nor does its last iteration say what this run's iterations are.
            self.periodic.clear();
        }
        self.left > 0
    }
}

/// Plans `trace` per stream: large runs are those of at least `small_max` bytes,
/// rounded up to `min_block`. The trace's static blocks are its first allocations (as
/// replay makes them), in trace order. Returns (stream, profile) for each stream with
/// large runs.
///
/// The last complete iteration is planned to repeat: each of its runs still live at
/// the end shares one offset with the run of its per-iteration key one iteration
/// earlier (when that one was freed in the last iteration), so that the runs live at
/// the last boundary sit where they sat at the one before; the last iteration's
/// offsets, by per-iteration key, then serve every later iteration
/// (`Profile::periodic`).
pub(crate) fn plan_trace(trace: &Trace, small_max: u64, min_block: u64) -> Vec<(u32, Profile)> {
    let round = |b: u64| b.div_ceil(min_block) * min_block;
    // Per stream: key generators (from the start, and from the last boundary), clock,
    // wants with their keys and iterations, and the clock at each boundary.
    #[derive(Default)]
    struct S {
        iter_keys: Keys,
        clock: u32,
        wants: Vec<Want>,
        iter_keyed: Vec<Key>,
        iteration: Vec<u32>,
        boundaries: Vec<u32>,
        /// The clock after the static blocks.
        first: u32,
    }
    let mut streams: FxMap<u32, S> = FxMap::default();
    // Tensor id -> (stream, index in its wants).
    let mut live: FxMap<u64, (u32, usize)> = FxMap::default();
    let alloc = |id: u64,
                 bytes: u64,
                 stream: u32,
                 streams: &mut FxMap<u32, S>,
                 live: &mut FxMap<u64, (u32, usize)>,
                 boundaries: u32| {
        if bytes < small_max {
            return;
        }
        let len = round(bytes);
        let s = streams.entry(stream).or_default();
        // A stream first seen after some boundaries: they are at its clock 0.
        while (s.boundaries.len() as u32) < boundaries {
            s.boundaries.push(s.clock);
        }
        let ikey = s.iter_keys.next(len);
        s.wants.push(Want::new(len, s.clock, u32::MAX));
        s.iter_keyed.push(ikey);
        s.iteration.push(boundaries);
        s.clock += 1;
        live.insert(id, (stream, s.wants.len() - 1));
    };
    for b in &trace.static_blocks {
        alloc(b.id, b.bytes, b.stream, &mut streams, &mut live, 0);
    }
    // Iteration 0 starts after the static blocks (its sequence is compared with the
    // next iteration's without them).
    for s in streams.values_mut() {
        s.first = s.clock;
    }
    let mut boundaries = 0u32;
    for e in &trace.events {
        match e.kind {
            EventKind::Alloc { id, bytes, stream } => {
                alloc(id, bytes, stream, &mut streams, &mut live, boundaries)
            }
            EventKind::Free { id } => {
                if let Some((stream, i)) = live.remove(&id) {
                    let s = streams.get_mut(&stream).expect("stream of a live run");
                    s.wants[i].free = s.clock;
                    s.clock += 1;
                }
            }
            EventKind::IterationBoundary => {
                boundaries += 1;
                for s in streams.values_mut() {
                    s.boundaries.push(s.clock);
                    s.iter_keys.clear();
                }
            }
            EventKind::Access { .. } => {}
        }
    }
    let mut out: Vec<(u32, Profile)> = streams
        .into_iter()
        .map(|(stream, mut s)| {
            let end = s.clock;
            let n = s.wants.len();
            // alias[j] = i: run j (live at the end of the last iteration) takes the
            // offset of run i (its key's run one iteration earlier).
            let mut alias: Vec<Option<usize>> = vec![None; n];
            let b = s.boundaries.len() as u32;
            let mut unaliased = false;
            if b >= 2 {
                let (last, before) = (b - 1, b - 2);
                // The clock at the last iteration's start (its opening boundary).
                let last_start = s.boundaries[(b - 2) as usize];
                let prev: FxMap<Key, usize> = (0..n)
                    .filter(|&i| s.iteration[i] == before)
                    .map(|i| (s.iter_keyed[i], i))
                    .collect();
                let tails: Vec<usize> = (0..n)
                    .filter(|&j| s.iteration[j] == last && s.wants[j].free == u32::MAX)
                    .collect();
                for j in tails {
                    let Some(&i) = prev.get(&s.iter_keyed[j]) else {
                        continue;
                    };
                    let (wi, wj) = (s.wants[i], s.wants[j]);
                    // The earlier run was freed in the last iteration, before this
                    // one was allocated: one offset serves both.
                    if wi.free != u32::MAX && wi.free >= last_start && wi.free <= wj.alloc {
                        s.wants[i].again = Some((wj.alloc, end));
                        alias[j] = Some(i);
                    } else {
                        // Both live at once (double buffered): the next iteration's run
                        // of this key cannot take this one's offset.
                        unaliased = true;
                    }
                }
            }
            for w in &mut s.wants {
                if w.free == u32::MAX {
                    w.free = end;
                }
            }
            // The last iteration repeats only if it equalled the one before it (the
            // same runs in the same order, freed in the same order).
            let seq = |it: u32| -> Vec<(Key, u32)> {
                let start = if it == 0 {
                    s.first
                } else {
                    s.boundaries[it as usize - 1]
                };
                (0..n)
                    .filter(|&i| s.iteration[i] == it && s.wants[i].alloc >= start)
                    .map(|i| (s.iter_keyed[i], s.wants[i].alloc - start))
                    .collect()
            };
            let repeats = b >= 2 && {
                let (x, y) = (seq(b - 1), seq(b - 2));
                x == y
            };
            let own: Vec<usize> = (0..n).filter(|&i| alias[i].is_none()).collect();
            let mut offs = vec![0u64; n];
            let high = if repeats {
                // The last iteration repeats (its plan serves the iterations after
                // the recording): one plan of the whole recording.
                let wants: Vec<Want> = own.iter().map(|&i| s.wants[i]).collect();
                let (solved, high) = solve::solve(&wants, &[]);
                for (&i, o) in own.iter().zip(solved) {
                    offs[i] = o;
                }
                high
            } else {
                // What follows the recording is unknown (best fit will place it): the
                // runs live at its end (parameters, optimizer state, the last
                // gradients) go first, at the bottom, and the rest around them, so
                // that the space above stays whole for what comes after.
                let tail = |w: &Want| w.free == end || w.again.is_some_and(|(_, t)| t == end);
                let (tails, rest): (Vec<usize>, Vec<usize>) =
                    own.iter().partition(|&&i| tail(&s.wants[i]));
                let tw: Vec<Want> = tails.iter().map(|&i| s.wants[i]).collect();
                let (toffs, _) = solve::solve(&tw, &[]);
                let mut fixed = Vec::new();
                for (&i, &o) in tails.iter().zip(&toffs) {
                    offs[i] = o;
                    let w = s.wants[i];
                    for (from, until) in std::iter::once((w.alloc, w.free)).chain(w.again) {
                        fixed.push(solve::Fixed {
                            off: o,
                            len: w.len,
                            from,
                            until,
                        });
                    }
                }
                let rw: Vec<Want> = rest.iter().map(|&i| s.wants[i]).collect();
                let (roffs, high) = solve::solve(&rw, &fixed);
                for (&i, o) in rest.iter().zip(roffs) {
                    offs[i] = o;
                }
                high
            };
            for j in 0..n {
                if let Some(i) = alias[j] {
                    offs[j] = offs[i];
                }
            }
            let periodic = if repeats && !unaliased {
                KeyedPlan::from_pairs(
                    (0..n)
                        .filter(|&i| s.iteration[i] == b - 1)
                        .map(|i| (s.iter_keyed[i], offs[i])),
                )
            } else {
                KeyedPlan::default()
            };
            let left = if periodic.is_empty() {
                n as u64
            } else {
                (0..n).filter(|&i| s.iteration[i] < b).count() as u64
            };
            let profile = Profile {
                seq: s.wants.iter().map(|w| w.len).zip(offs).collect(),
                pos: 0,
                follows: true,
                keys: Keys::default(),
                plan: FxMap::default(),
                periodic,
                high,
                // With a periodic hand-over, the profile ends with its last complete
                // iteration (the boundary after it hands over), not within what the
                // recording holds after it.
                left,
                lookups: 0,
                misses: 0,
            };
            (stream, profile)
        })
        .collect();
    out.sort_by_key(|(s, _)| *s);
    out
}
