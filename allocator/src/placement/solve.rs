//! The offline half of planned placement: given one iteration's large runs (their
//! lengths and lifetimes on the iteration's clock) and the runs already in the segment
//! (fixed offsets, with the time each is expected to be freed), choose an offset for
//! every run so that runs live at the same time never overlap, keeping the highest end
//! offset (the mapped bytes the iteration needs) low.
//!
//! Two heuristics, the better plan kept: greedy by size (the heuristic of TFLite's and
//! TVM's static memory planners: runs in decreasing length, ties by earlier
//! allocation, each at the lowest offset where it overlaps nothing it shares time
//! with), and best fit in allocation order with known lifetimes ([`by_time`]). On the
//! three PyTorch training runs recorded through memcast (ResNet-50, GPT-2, BERT) the
//! first reaches the peak of live bytes within 0.4%; on generation with a growing KV
//! cache the second wins (docs/allocator.md).
//!
//! Time is the iteration's clock: large events (allocations and frees of runs on the
//! stream) counted from the boundary. A run lives over `[alloc, free)`; a run still live
//! at the end has `free == end`. A fixed run is live over `[from, until)` (`u32::MAX`:
//! the whole iteration).
//!
//! Cost: O(n * (n + f) * log) for n runs and f fixed runs (greedy by size, skipped
//! above `BY_SIZE_MAX` runs), run at an iteration boundary only when a new plan is
//! needed, or once for a profile (never on the allocation path).

/// A run to place: live over `[alloc, free)`, and, if `again` is given, over that
/// later interval too at the same offset (a profile's last iteration: a run that lives
/// across the boundary and the run of its key one iteration earlier share one offset,
/// so that the iteration's plan can repeat).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    pub len: u64,
    pub alloc: u32,
    pub free: u32,
    pub again: Option<(u32, u32)>,
}

impl Want {
    pub fn new(len: u64, alloc: u32, free: u32) -> Self {
        Want {
            len,
            alloc,
            free,
            again: None,
        }
    }

    /// Its intervals.
    fn spans(&self) -> impl Iterator<Item = (u32, u32)> {
        std::iter::once((self.alloc, self.free)).chain(self.again)
    }

    /// Whether it shares time with `o`.
    fn meets(&self, o: &Want) -> bool {
        self.spans()
            .any(|(a, f)| o.spans().any(|(b, g)| a < g && b < f))
    }
}

/// A run already placed: `[off, off + len)`, live over clocks `[from, until)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fixed {
    pub off: u64,
    pub len: u64,
    pub from: u32,
    pub until: u32,
}

impl Fixed {
    /// Whether it shares time with `w`.
    fn meets(&self, w: &Want) -> bool {
        w.spans().any(|(a, f)| a < self.until && self.from < f)
    }
}

/// The offsets of `wants` (same order) and the highest end offset over all runs, fixed
/// ones included.
///
/// Postcondition: for any two runs i, j (fixed or placed) whose lifetimes intersect,
/// `[off_i, off_i + len_i)` and `[off_j, off_j + len_j)` are disjoint (fixed runs among
/// themselves are taken as given).
pub fn solve(wants: &[Want], fixed: &[Fixed]) -> (Vec<u64>, u64) {
    solve_with_hints(wants, fixed, &[])
}

/// [`solve`], where `hints[i]` (if given) is an offset tried first for `wants[i]`: the
/// in-run planner hints each run at the offset of its predecessor of one iteration
/// earlier, so that runs living across the boundary (gradients) keep their offsets
/// and the layout repeats (an unchanged layout needs no new plan).
pub fn solve_with_hints(wants: &[Want], fixed: &[Fixed], hints: &[Option<u64>]) -> (Vec<u64>, u64) {
    let time = by_time(wants, fixed, hints);
    if wants.len() > BY_SIZE_MAX {
        return time;
    }
    let size = by_size(wants, fixed, hints);
    if size.1 <= time.1 {
        size
    } else {
        time
    }
}

/// Runs above which only [`by_time`] runs (greedy by size is quadratic: ~0.1 s at
/// this size).
const BY_SIZE_MAX: usize = 16_384;

/// Best fit in allocation order, knowing each run's free time: what an online best fit
/// would do, but over the whole plan (the runs live at each allocation are exactly
/// those whose lifetime covers it). Better than greedy by size where runs grow over
/// time (a KV cache grown by concatenation: measured on the generation traces of
/// docs/allocator.md). O(n * live).
fn by_time(wants: &[Want], fixed: &[Fixed], hints: &[Option<u64>]) -> (Vec<u64>, u64) {
    let mut order: Vec<usize> = (0..wants.len()).collect();
    order.sort_by_key(|&i| (wants[i].alloc, i));
    let mut offs = vec![0u64; wants.len()];
    let mut high = fixed.iter().map(|f| f.off + f.len).max().unwrap_or(0);
    // Live ranges (start, end, free time), sorted by start.
    let mut live: Vec<(u64, u64, u32)> = fixed
        .iter()
        .filter(|f| f.from == 0)
        .map(|f| (f.off, f.off + f.len, f.until))
        .collect();
    live.sort_unstable();
    // Intervals that start later: second intervals of placed runs (`Want::again`) and
    // fixed runs from a later clock: (start, end, from, to).
    let mut later: Vec<(u64, u64, u32, u32)> = fixed
        .iter()
        .filter(|f| f.from > 0)
        .map(|f| (f.off, f.off + f.len, f.from, f.until))
        .collect();
    let mut busy: Vec<(u64, u64)> = Vec::new();
    for &i in &order {
        let w = wants[i];
        live.retain(|&(_, _, free)| free > w.alloc);
        later.retain(|&(_, _, _, to)| to > w.alloc);
        busy.clear();
        busy.extend(live.iter().map(|&(s, e, _)| (s, e)));
        busy.extend(
            later
                .iter()
                .filter(|&&(_, _, from, to)| w.spans().any(|(a, f)| a < to && from < f))
                .map(|&(s, e, _, _)| (s, e)),
        );
        if busy.len() > live.len() {
            busy.sort_unstable();
        }
        let hint = hints
            .get(i)
            .copied()
            .flatten()
            .filter(|&h| busy.iter().all(|&(s, e)| h + w.len <= s || e <= h));
        let off = hint.unwrap_or_else(|| {
            // The smallest gap that fits, else the top.
            let (mut best, mut cur) = (None::<(u64, u64)>, 0u64);
            for &(s, e) in &busy {
                if s > cur && s - cur >= w.len && best.is_none_or(|(g, _)| s - cur < g) {
                    best = Some((s - cur, cur));
                }
                cur = cur.max(e);
            }
            best.map_or(cur, |(_, o)| o)
        });
        offs[i] = off;
        high = high.max(off + w.len);
        let at = live.partition_point(|&(s, _, _)| s < off);
        live.insert(at, (off, off + w.len, w.free));
        if let Some((from, to)) = w.again {
            later.push((off, off + w.len, from, to));
        }
    }
    (offs, high)
}

/// Greedy by size (the module docs). O(n^2 log n).
fn by_size(wants: &[Want], fixed: &[Fixed], hints: &[Option<u64>]) -> (Vec<u64>, u64) {
    let mut order: Vec<usize> = (0..wants.len()).collect();
    order.sort_by(|&i, &j| {
        wants[j]
            .len
            .cmp(&wants[i].len)
            .then(wants[i].alloc.cmp(&wants[j].alloc))
    });
    let mut offs = vec![0u64; wants.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(wants.len());
    let mut high = fixed.iter().map(|f| f.off + f.len).max().unwrap_or(0);
    // Reused per run: the [start, end) ranges it must avoid.
    let mut busy: Vec<(u64, u64)> = Vec::new();
    for &i in &order {
        let w = wants[i];
        busy.clear();
        busy.extend(
            fixed
                .iter()
                .filter(|f| f.meets(&w))
                .map(|f| (f.off, f.off + f.len)),
        );
        busy.extend(
            placed
                .iter()
                .map(|&j| (j, wants[j]))
                .filter(|(_, o)| w.meets(o))
                .map(|(j, o)| (offs[j], offs[j] + o.len)),
        );
        let hint = hints
            .get(i)
            .copied()
            .flatten()
            .filter(|&h| busy.iter().all(|&(s, e)| h + w.len <= s || e <= h));
        let off = match hint {
            Some(h) => h,
            None => {
                busy.sort_unstable();
                let mut off = 0u64;
                for &(s, e) in &busy {
                    if s >= off + w.len {
                        break;
                    }
                    off = off.max(e);
                }
                off
            }
        };
        offs[i] = off;
        high = high.max(off + w.len);
        placed.push(i);
    }
    (offs, high)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
        a.0 < b.1 && b.0 < a.1
    }

    #[test]
    fn runs_apart_in_time_share_memory() {
        let w = [Want::new(100, 0, 2), Want::new(100, 2, 4)];
        let (offs, high) = solve(&w, &[]);
        assert_eq!(offs, vec![0, 0]);
        assert_eq!(high, 100);
    }

    #[test]
    fn runs_live_together_do_not_overlap_and_fixed_runs_are_avoided() {
        let w = [
            Want::new(50, 0, 10),
            Want::new(80, 1, 5),
            Want::new(30, 6, 9),
        ];
        // A fixed run at [0, 40) until clock 3, one at [200, 300) for ever.
        let f = [
            Fixed {
                off: 0,
                len: 40,
                from: 0,
                until: 3,
            },
            Fixed {
                off: 200,
                len: 100,
                from: 0,
                until: u32::MAX,
            },
        ];
        let (offs, high) = solve(&w, &f);
        // The 80-byte run shares time with the first fixed run: above it.
        assert_eq!(offs[1], 40);
        // The 50-byte run shares time with the first fixed run and the 80-byte run.
        assert_eq!(offs[0], 120);
        // The 30-byte run starts after the first fixed run ended: it may use [0, 40).
        assert_eq!(offs[2], 0);
        assert_eq!(high, 300);
    }

    #[test]
    fn the_postcondition_holds_on_random_inputs() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..200 {
            let n = 1 + rnd(40) as usize;
            let wants: Vec<Want> = (0..n)
                .map(|_| {
                    let a = rnd(100) as u32;
                    let f = a + 1 + rnd(50) as u32;
                    let mut w = Want::new((1 + rnd(64)) * 256, a, f);
                    if rnd(4) == 0 {
                        let b = f + rnd(20) as u32;
                        w.again = Some((b, b + 1 + rnd(30) as u32));
                    }
                    w
                })
                .collect();
            let fixed: Vec<Fixed> = (0..rnd(4))
                .map(|k| Fixed {
                    from: if rnd(3) == 0 { rnd(60) as u32 } else { 0 },
                    off: k * 100_000,
                    len: 256 * (1 + rnd(8)),
                    until: if rnd(2) == 0 {
                        u32::MAX
                    } else {
                        rnd(100) as u32
                    },
                })
                .collect();
            let hints: Vec<Option<u64>> = (0..n)
                .map(|_| (rnd(3) == 0).then(|| 256 * rnd(64)))
                .collect();
            for (offs, high) in [
                solve(&wants, &fixed),
                by_size(&wants, &fixed, &hints),
                by_time(&wants, &fixed, &hints),
            ] {
                for i in 0..n {
                    let (wi, ri) = (wants[i], (offs[i], offs[i] + wants[i].len));
                    assert!(ri.1 <= high);
                    for f in &fixed {
                        if f.meets(&wi) {
                            assert!(!overlaps(ri, (f.off, f.off + f.len)), "{wi:?} {f:?}");
                        }
                    }
                    for j in 0..i {
                        let wj = wants[j];
                        if wi.meets(&wj) {
                            assert!(!overlaps(ri, (offs[j], offs[j] + wj.len)));
                        }
                    }
                }
            }
        }
    }
}
