//! The iteration plan: which tensors leave the device, when, and when they come back,
//! computed from one iteration's trajectory (the previous one, which a training job
//! repeats; or the true next one, for the oracle).
//!
//! Input: the iteration's operations in order (registrations, accesses, frees of
//! tensor keys, with their bytes and compute time since the iteration began), the
//! bytes live at its start and its compute span `T`. With everything resident, the
//! device would hold `L(i) = base + sum_{j <= i} (allocated_j - freed_j)` after
//! operation `i`; the plan makes `L(i) - sum_{tensors off at i} bytes <= cap` wherever
//! the trajectory allows.
//!
//! A *gap* is the span between two consecutive uses of a tensor, `(a, b)`, the second
//! one an access (a tensor never read again is not worth the copy). A tensor live at
//! the iteration's start and read in it is due back by the iteration's end after its
//! last use (a gap that *wraps*: the plan covers one iteration). Spilled in a gap, a
//! tensor is off the device from the end of its copy out, `t_a + bytes / bw_out`, to
//! the start of its copy in, `t_b - bytes / bw_in`: its *window*. A gap whose window
//! is empty relieves nothing (the tensor would be back before it left) and is never
//! chosen.
//!
//! Greedy choice (largest window first, Capuchin's and SwapAdvisor's rule of thumb:
//! the longest gaps hide their copies best and each spilled byte covers the most
//! excess): while the largest excess `max_i (L(i) - off(i) - cap)` is positive, take
//! the not yet chosen gap with the longest window that covers that position. Then, in
//! order of need, each chosen tensor is planned back at the first position from which
//! it fits under the cap until its access, at the latest just after its window's end
//! (the window holds the positions at which it is off: a prefetch issued at an
//! operation holds its memory from that operation on; one that fits from the window's
//! start was made redundant by later choices and is dropped). By default each copy is
//! timed alone: queued behind others on the link it ends later, which the plan does
//! not model; what it does not cover is left to the reactive machinery (see [`super::floor::peak_floor`] for what no policy avoids).
//!
//! Only gaps of at least `latency x bandwidth` bytes are candidates (`LinkModel`'s
//! fixed cost per copy and its slower direction: ~100 KB at the sim's 2 us and ~51
//! GB/s each way), the size below which a copy spends longer in its fixed cost than in
//! moving bytes. The longest windows are those of the smallest tensors (a norm's
//! weight, a bias: their copies take the fixed cost alone), so without that bound the
//! cover took them first, by the thousand, for a few MB: the LSTM-driven replays of
//! the corpus's validation split at 60% made 41,881 prefetches without the bound and
//! 14,396 with it, for the same bytes (docs/predictive.md, "Small tensors stay;
//! wrapped ones come back when the link is idle").
//!
//! Link occupancy ([`LinkModel::occupancy`], `TierConfig::plan_occupancy`; off by
//! default): the link has one direction for spills and one for prefetches (as the sim
//! and the transfer streams have them), each a timeline of the copies the plan has
//! placed ([`super::occupancy`]). A candidate gap's copy out takes the first idle span
//! of the out direction after its last use, its copy in the last idle span of the in
//! direction that ends by its access, and its window is what lies between: a gap
//! whose copies the link cannot carry in time covers fewer positions or none, and a
//! chosen gap's copies are placed for the gaps chosen after it. The cover then leaves
//! excess the link cannot relieve to the reactive machinery instead of planning
//! copies that land late. Measured (docs/predictive.md, "under a budget"): fewer
//! late prefetches and spilled bytes on the bundled traces, more spills on the
//! out-of-memory path, no better mean stall on the corpus's validation split; hence
//! off.
//!
//! Cost: O(G log G + (k + u) G + k log^2 n) for `G` gaps, `k` chosen, `u` positions
//! no gap covers and `n` operations, once per iteration at its boundary, and once more
//! at the fourth allocation of an iteration whose shape the planner recognizes
//! (`planned.rs`). With occupancy, each candidate that covers the position looked at
//! also costs two timeline queries (O(log k + h), `h` holes too short on the way) and
//! each choice an insertion (O(k)): about 5x the planning time of the replays of
//! docs/predictive.md (the validation split: 52 s against 9 s).

use super::handle::TensorKey;
use super::occupancy::Timeline;

/// Marks a position no gap can cover, during the greedy cover.
const BLOCKED: i64 = i64::MIN / 4;

/// What one logged operation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpUse {
    Alloc,
    Access,
    Free,
}

/// One operation of the iteration's trajectory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoggedOp {
    pub key: TensorKey,
    pub bytes: u64,
    pub kind: OpUse,
    /// Compute time since the iteration began, us (non-decreasing).
    pub t: f64,
}

/// The trajectory of one iteration.
#[derive(Debug, Clone, Default)]
pub struct Trajectory {
    pub ops: Vec<LoggedOp>,
    /// Bytes of every tensor live when the iteration began.
    pub base: u64,
    /// The iteration's compute span, us (>= the last operation's time).
    pub span_us: f64,
    /// Recompute cost (us) of the keys that were recomputable (may be dropped): the
    /// plan may drop them in gaps too short to hide their copies. Empty: no drops.
    pub recompute_us: std::collections::HashMap<TensorKey, f64>,
}

impl Trajectory {
    /// Live bytes after each operation, `base` included (signed: a trajectory that
    /// frees what it never allocated goes below zero). O(1) per item.
    pub fn live_after(&self) -> impl Iterator<Item = i128> + '_ {
        self.ops.iter().scan(self.base as i128, |l, op| {
            match op.kind {
                OpUse::Alloc => *l += op.bytes as i128,
                OpUse::Free => *l -= op.bytes as i128,
                OpUse::Access => {}
            }
            Some(*l)
        })
    }

    /// The highest live bytes of the trajectory (`base` included). O(ops).
    pub fn peak(&self) -> u64 {
        self.live_after().fold(self.base as i128, i128::max).max(0) as u64
    }
}

/// Link model of the plan.
#[derive(Debug, Clone, Copy)]
pub struct LinkModel {
    /// Bytes per microsecond each way (device to host, host to device).
    pub out_bytes_per_us: f64,
    pub in_bytes_per_us: f64,
    /// Fixed cost of one copy, us.
    pub latency_us: f64,
    /// Model the link's occupancy while choosing gaps: each chosen gap's copies are
    /// placed on its direction's timeline ([`super::occupancy`]), and a gap's window
    /// is what the link leaves it given the copies placed before (off: each copy is
    /// timed alone).
    pub occupancy: bool,
}

impl Default for LinkModel {
    /// [`LinkModel::from_costs`] of the default cost model (the H200's).
    fn default() -> Self {
        Self::from_costs(&crate::backend::sim::CostModel::default())
    }
}

impl LinkModel {
    /// A cost model's measured pinned duplex bandwidth, halved: the rate each direction
    /// keeps while the other one is busy too (~51 GB/s on an H200, ~47 on an H100).
    pub fn from_costs(c: &crate::backend::sim::CostModel) -> Self {
        let each = c.duplex_gbps / 2.0 * 1e3;
        LinkModel {
            out_bytes_per_us: each,
            in_bytes_per_us: each,
            latency_us: c.copy_latency_us,
            occupancy: false,
        }
    }

    /// The default cost model's [`LinkModel::peak_of`].
    pub fn peak() -> Self {
        Self::peak_of(&crate::backend::sim::CostModel::default())
    }

    /// A cost model's best pinned bandwidth each way with the other direction idle (for
    /// a lower bound: no policy's copies run faster), no fixed cost.
    pub fn peak_of(c: &crate::backend::sim::CostModel) -> Self {
        let best = |t: &[(f64, f64)]| t.iter().map(|&(_, g)| g).fold(0.0, f64::max) * 1e3;
        LinkModel {
            out_bytes_per_us: best(&c.d2h_pinned),
            in_bytes_per_us: best(&c.h2d_pinned),
            latency_us: 0.0,
            occupancy: false,
        }
    }
    fn out_us(&self, bytes: u64) -> f64 {
        self.latency_us + bytes as f64 / self.out_bytes_per_us
    }
    fn in_us(&self, bytes: u64) -> f64 {
        self.latency_us + bytes as f64 / self.in_bytes_per_us
    }
}

/// One planned move: spill `key` after operation `spill_after`, bring it back when
/// operation `prefetch_at` is reached (in the iteration the plan runs in). For a gap
/// that wraps (`wraps`), the next use is in the next iteration (`needed_at` is its
/// position there) and the tensor is planned back by this iteration's end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Move {
    pub key: TensorKey,
    pub bytes: u64,
    pub spill_after: usize,
    pub prefetch_at: usize,
    /// The access the tensor must be back for (a position of the iteration; for a
    /// wrapped gap, of the next one).
    pub needed_at: usize,
    pub wraps: bool,
    /// Dropped after `spill_after` instead of spilled, recomputed at its access
    /// (`needed_at`; no prefetch: `prefetch_at == needed_at`).
    pub drop: bool,
}

/// The plan for one iteration.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub moves: Vec<Move>,
    /// The largest excess over the cap the plan leaves (0: the trajectory fits).
    pub residual_excess: u64,
    /// `max_i L(i)` of the trajectory, bytes.
    pub peak: u64,
    pub ops: usize,
}

#[derive(Debug, Clone, Copy)]
struct Gap {
    key: TensorKey,
    bytes: u64,
    a: usize,
    /// The position the tensor must be back by: its next access, or for a gap that
    /// wraps the iteration's end (`n`: the plan runs one iteration).
    b: usize,
    /// A gap that wraps: the position of the next iteration's access.
    wrap_need: Option<usize>,
}

/// Builds the plan that keeps `traj` under `cap` bytes. See the module docs.
pub fn plan(traj: &Trajectory, cap: u64, link: LinkModel) -> Plan {
    let n = traj.ops.len();
    if n == 0 {
        return Plan::default();
    }
    // L(i), and the time of each position (position `n` is the next iteration's first
    // operation: one span after this one's).
    let live: Vec<u64> = traj.live_after().map(|l| l.max(0) as u64).collect();
    let span = traj.span_us.max(traj.ops[n - 1].t);
    let time = |p: usize| -> f64 {
        if p < n {
            traj.ops[p].t
        } else {
            traj.ops[0].t + span
        }
    };
    let gaps = find_gaps(&traj.ops);
    let peak = live.iter().copied().max().unwrap_or(0);
    let excess0: Vec<i64> = live
        .iter()
        .map(|&x| (x as i128 - cap as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64)
        .collect();
    if excess0.iter().all(|&e| e <= 0) {
        return Plan {
            peak,
            ops: n,
            ..Plan::default()
        };
    }
    // The positions p in (a, b) at which the tensor is off the device, given its copy
    // out ends at lo_t and its copy in may start at hi_t: time(p) >= lo_t, and the
    // copy in starts at the next operation, time(p + 1) <= hi_t (a prefetch issued at
    // an operation holds its memory from that operation on, so the operation it is
    // issued at is not relieved). b <= n, so p < n and p + 1 <= n.
    let window = |g: &Gap, lo_t: f64, hi_t: f64| -> Option<(usize, usize)> {
        let (mut lo, mut hi) = (g.a + 1, g.b.checked_sub(1)?);
        if lo > hi {
            return None;
        }
        // First position >= lo with time >= lo_t; last <= hi whose next position's
        // time is <= hi_t.
        lo = partition(lo, hi + 1, |p| time(p) < lo_t);
        let hi_end = partition(lo, hi + 1, |p| time(p + 1) <= hi_t);
        if hi_end == lo {
            return None;
        }
        hi = hi_end - 1;
        Some((lo, hi))
    };
    // Each gap's own window (its copies alone on the link).
    let own: Vec<Option<(usize, usize)>> = gaps
        .iter()
        .map(|g| {
            window(
                g,
                time(g.a) + link.out_us(g.bytes),
                time(g.b) - link.in_us(g.bytes),
            )
        })
        .collect();
    // Candidates: gaps with a window, by its length in time, longest first.
    let len_t = |w: (usize, usize)| time(w.1) - time(w.0);
    // A gap whose copies spend longer in the link's fixed cost than in moving its
    // bytes is not worth them (see the module docs).
    let min_bytes = link.latency_us * link.out_bytes_per_us.min(link.in_bytes_per_us);
    let mut hidden: Vec<usize> = (0..gaps.len())
        .filter(|&i| own[i].is_some() && gaps[i].bytes as f64 >= min_bytes)
        .collect();
    hidden.sort_by(|&x, &y| {
        len_t(own[y].unwrap())
            .total_cmp(&len_t(own[x].unwrap()))
            .then(gaps[y].bytes.cmp(&gaps[x].bytes))
    });
    // A key's gaps may not overlap in the plan (one copy of a tensor at a time); the
    // chosen gaps of each key are few, checked by a scan.
    let mut chosen: Vec<usize> = Vec::new();
    let mut is_chosen = vec![false; gaps.len()];
    // Drops: a recomputable tensor's gap whose copies its span cannot hide, if its
    // recompute costs less than the part of the round trip that does not fit; off the
    // device from just after its use to its access (where it is recomputed). Cheapest
    // recompute per byte first.
    let drop_window = |i: usize| -> Option<(usize, usize)> {
        let g = &gaps[i];
        (g.wrap_need.is_none() && g.a + 1 < g.b).then(|| (g.a + 1, g.b - 1))
    };
    let recompute_us = |i: usize| traj.recompute_us.get(&gaps[i].key).copied();
    let mut droppable: Vec<usize> = (0..gaps.len())
        .filter(|&i| own[i].is_none() && drop_window(i).is_some())
        .filter(|&i| {
            let g = &gaps[i];
            let unhidden = link.out_us(g.bytes) + link.in_us(g.bytes) - (time(g.b) - time(g.a));
            recompute_us(i).is_some_and(|r| r > 0.0 && r < unhidden)
        })
        .collect();
    let per_byte = |i: usize| recompute_us(i).unwrap_or(0.0) / gaps[i].bytes.max(1) as f64;
    droppable.sort_by(|&x, &y| per_byte(x).total_cmp(&per_byte(y)).then(x.cmp(&y)));
    let mut is_drop = vec![false; gaps.len()];
    // Greedy cover: each gap's own window, or with `occupancy` the window the link
    // leaves it beside the copies already placed (at most its own).
    let mut win = own.clone();
    let (mut out_link, mut in_link) = (Timeline::new(), Timeline::new());
    let mut tree = MaxTree::new(&excess0);
    let mut blocked = Vec::new();
    loop {
        let (p, e) = tree.max();
        if e <= 0 {
            break;
        }
        let covers = |w: Option<(usize, usize)>| w.is_some_and(|(lo, hi)| lo <= p && p <= hi);
        let pick = hidden.iter().find_map(|&i| {
            if is_chosen[i] || !covers(own[i]) || !free_of(&chosen, &gaps, i) {
                return None;
            }
            if !link.occupancy {
                return Some((i, own[i]?, None));
            }
            let g = &gaps[i];
            let (d_out, d_in) = (link.out_us(g.bytes), link.in_us(g.bytes));
            let out_end = out_link.earliest_end(time(g.a), d_out);
            let in_start = in_link.latest_start(time(g.b), d_in);
            let w = window(g, out_end, in_start)?;
            covers(Some(w)).then_some((i, w, Some((out_end, d_out, in_start, d_in))))
        });
        match pick {
            Some((i, w, placed)) => {
                is_chosen[i] = true;
                chosen.push(i);
                win[i] = Some(w);
                if let Some((out_end, d_out, in_start, d_in)) = placed {
                    out_link.reserve(out_end - d_out, out_end);
                    in_link.reserve(in_start, in_start + d_in);
                }
                let (lo, hi) = w;
                tree.add(lo, hi, -(gaps[i].bytes as i64));
            }
            None => {
                let drop = droppable.iter().copied().find(|&i| {
                    !is_chosen[i] && covers(drop_window(i)) && free_of(&chosen, &gaps, i)
                });
                if let Some(i) = drop {
                    is_chosen[i] = true;
                    is_drop[i] = true;
                    chosen.push(i);
                    let (lo, hi) = drop_window(i).expect("droppable gaps have a window");
                    tree.add(lo, hi, -(gaps[i].bytes as i64));
                    continue;
                }
                // Nothing can cover this position: leave it, look at the rest.
                tree.add(p, p, BLOCKED);
                blocked.push(p);
                if blocked.len() > n {
                    break;
                }
            }
        }
    }
    for p in blocked {
        tree.add(p, p, -BLOCKED);
    }
    // Back as early as memory allows: in order of need, each chosen tensor returns at
    // the first position from which it fits under the cap until its access, beside
    // everything else the plan has resident then. A tensor that fits from the start
    // of its window was made redundant by later choices: dropped.
    chosen.sort_by_key(|&c| (gaps[c].b, gaps[c].a));
    let mut back = vec![0usize; gaps.len()];
    chosen.retain(|&c| {
        if is_drop[c] {
            // Off until its access: nothing comes back before it.
            back[c] = gaps[c].b;
            return true;
        }
        let (lo, hi) = win[c].expect("chosen gaps have a window");
        let bytes = gaps[c].bytes as i64;
        // Back at position q: resident over [q, hi], off over [lo, q - 1].
        let fits = |q: usize, tree: &MaxTree| q > hi || tree.query(q, hi) + bytes <= 0;
        // At the latest just after the window's end (`hi + 1`: the last position its
        // copy in may start at and still land before the access).
        let first = partition(lo, hi + 1, |q| !fits(q, &tree));
        if first == lo {
            tree.add(lo, hi, bytes);
            return false;
        }
        tree.add(first, hi, bytes);
        back[c] = first;
        true
    });
    let residual = tree.max().1.max(0) as u64;
    let mut moves: Vec<Move> = chosen
        .iter()
        .map(|&c| {
            let g = gaps[c];
            // A prefetch point past the iteration's last operation would never be
            // reached (possible only for a copy that takes no time: a wrapped window
            // then reaches the last operation): at the latest at that operation.
            let at = back[c].min(n - 1);
            Move {
                key: g.key,
                bytes: g.bytes,
                spill_after: g.a,
                prefetch_at: if is_drop[c] { g.b } else { at },
                needed_at: g.wrap_need.unwrap_or(g.b),
                wraps: g.wrap_need.is_some(),
                drop: is_drop[c],
            }
        })
        .collect();
    moves.sort_by_key(|m| m.spill_after);
    Plan {
        moves,
        residual_excess: residual,
        peak,
        ops: n,
    }
}

/// Whether gap `i` overlaps no chosen gap of the same key.
fn free_of(chosen: &[usize], gaps: &[Gap], i: usize) -> bool {
    let g = &gaps[i];
    chosen.iter().all(|&c| {
        let h = &gaps[c];
        h.key != g.key || h.b <= g.a || g.b <= h.a
    })
}

/// The gaps of a trajectory: consecutive uses of a key, the second an access; for a
/// key used first by an access (it was live when the iteration began), its last use
/// pairs with that first access one iteration later.
fn find_gaps(ops: &[LoggedOp]) -> Vec<Gap> {
    let n = ops.len();
    let mut last: std::collections::HashMap<TensorKey, (usize, usize, u64)> =
        std::collections::HashMap::new();
    let mut first_access: std::collections::HashMap<TensorKey, usize> =
        std::collections::HashMap::new();
    let mut gaps = Vec::new();
    for (p, op) in ops.iter().enumerate() {
        match op.kind {
            OpUse::Alloc => {
                last.insert(op.key, (p, p, op.bytes));
            }
            OpUse::Access => match last.get_mut(&op.key) {
                Some(e) => {
                    if op.bytes == e.2 && p > e.1 + 1 {
                        gaps.push(Gap {
                            key: op.key,
                            bytes: op.bytes,
                            a: e.1,
                            b: p,
                            wrap_need: None,
                        });
                    }
                    e.1 = p;
                }
                None => {
                    last.insert(op.key, (p, p, op.bytes));
                    first_access.insert(op.key, p);
                }
            },
            OpUse::Free => {
                last.remove(&op.key);
            }
        }
    }
    // Wrapping gaps: live across the boundary, used first by an access this iteration.
    // The plan covers one iteration, so such a tensor is due back by its end.
    for (key, first) in first_access {
        if let Some(&(_, lastp, bytes)) = last.get(&key) {
            if n > lastp + 1 && bytes > 0 {
                gaps.push(Gap {
                    key,
                    bytes,
                    a: lastp,
                    b: n,
                    wrap_need: Some(first),
                });
            }
        }
    }
    gaps.retain(|g| g.bytes > 0);
    // Deterministic order (the map's is not).
    gaps.sort_by_key(|g| (g.a, g.b));
    gaps
}

/// First `p` in `[lo, hi)` with `!pred(p)` (pred true on a prefix); `hi` if none.
fn partition(mut lo: usize, mut hi: usize, pred: impl Fn(usize) -> bool) -> usize {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Range add, global max with its position (a lazy segment tree).
// Invariant: mx[node] = max over the node's range of the values, minus the pending
// adds of its ancestors.
struct MaxTree {
    n: usize,
    mx: Vec<i64>,
    arg: Vec<u32>,
    lz: Vec<i64>,
}

impl MaxTree {
    fn new(v: &[i64]) -> Self {
        let n = v.len();
        let mut t = MaxTree {
            n,
            mx: vec![0; 4 * n],
            arg: vec![0; 4 * n],
            lz: vec![0; 4 * n],
        };
        t.build(1, 0, n - 1, v);
        t
    }
    fn build(&mut self, node: usize, l: usize, r: usize, v: &[i64]) {
        if l == r {
            self.mx[node] = v[l];
            self.arg[node] = l as u32;
            return;
        }
        let m = (l + r) / 2;
        self.build(2 * node, l, m, v);
        self.build(2 * node + 1, m + 1, r, v);
        self.pull(node);
    }
    fn pull(&mut self, node: usize) {
        let (a, b) = (2 * node, 2 * node + 1);
        let (ma, mb) = (self.mx[a], self.mx[b]);
        let (m, i) = if ma >= mb {
            (ma, self.arg[a])
        } else {
            (mb, self.arg[b])
        };
        self.mx[node] = m.saturating_add(self.lz[node]);
        self.arg[node] = i;
    }
    fn add(&mut self, lo: usize, hi: usize, v: i64) {
        if lo > hi || hi >= self.n {
            return;
        }
        self.add_in(1, 0, self.n - 1, lo, hi, v);
    }
    fn add_in(&mut self, node: usize, l: usize, r: usize, lo: usize, hi: usize, v: i64) {
        if hi < l || r < lo {
            return;
        }
        if lo <= l && r <= hi {
            self.mx[node] = self.mx[node].saturating_add(v);
            self.lz[node] = self.lz[node].saturating_add(v);
            return;
        }
        let m = (l + r) / 2;
        self.add_in(2 * node, l, m, lo, hi, v);
        self.add_in(2 * node + 1, m + 1, r, lo, hi, v);
        self.pull(node);
    }
    /// The maximum over `[lo, hi]`.
    fn query(&self, lo: usize, hi: usize) -> i64 {
        self.query_in(1, 0, self.n - 1, lo, hi)
    }
    fn query_in(&self, node: usize, l: usize, r: usize, lo: usize, hi: usize) -> i64 {
        if hi < l || r < lo {
            return i64::MIN;
        }
        if lo <= l && r <= hi {
            return self.mx[node];
        }
        let m = (l + r) / 2;
        let best = self.query_in(2 * node, l, m, lo, hi).max(self.query_in(
            2 * node + 1,
            m + 1,
            r,
            lo,
            hi,
        ));
        best.saturating_add(self.lz[node])
    }
    /// (position, value) of the maximum.
    fn max(&self) -> (usize, i64) {
        (self.arg[1] as usize, self.mx[1])
    }
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
