//! Link occupancy for the iteration planner: when each direction of the link is busy
//! with the copies a plan has already placed.
//!
//! The sim (and a GPU) has one link per direction: spills (device to host) and
//! prefetches (host to device) run on separate low-priority streams and overlap each
//! other (`transfer.rs`; `backend/sim.rs`: H2D and D2H are separate links). The
//! planner keeps one [`Timeline`] per direction. A copy placed on it takes the first
//! idle span long enough for it, after the time it may start (a spill: after its
//! tensor's last use) or, for a copy that must end by a deadline (a prefetch: before
//! the tensor's next access), the last idle span that ends by the deadline. The
//! streams themselves are FIFO, so a copy issued later can delay one the plan placed
//! in a hole before it; the timeline conserves the link's total work and is an
//! estimate of where copies land, not a replay of the streams.
//!
//! Representation: disjoint busy spans sorted by start, touching spans merged (copies
//! placed back to back become one span). A placement scans the spans from the first
//! that ends after the start (a binary search) until a hole is long enough: O(log s +
//! h) for `s` spans and `h` holes too short on the way; an insertion is O(s) (a
//! vector), with `s` at most the number of copies placed.

/// The busy spans of one direction of the link, us.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    // Invariant: sorted by start, disjoint, never touching (s_{i+1} > e_i), s < e.
    busy: Vec<(f64, f64)>,
}

impl Timeline {
    pub fn new() -> Self {
        Self::default()
    }

    /// The end of the earliest placement of a copy of `dur` us starting at `from` or
    /// later (nothing is reserved).
    pub fn earliest_end(&self, from: f64, dur: f64) -> f64 {
        let mut s = from;
        let i = self.busy.partition_point(|&(_, e)| e <= s);
        for &(bs, be) in &self.busy[i..] {
            if bs - s >= dur {
                break;
            }
            s = s.max(be);
        }
        s + dur
    }

    /// The start of the latest placement of a copy of `dur` us that ends by `by`
    /// (nothing is reserved); may be before any time the caller allows.
    pub fn latest_start(&self, by: f64, dur: f64) -> f64 {
        let mut e = by;
        // Spans starting before `e`, from the last one back.
        let i = self.busy.partition_point(|&(s, _)| s < e);
        for &(bs, be) in self.busy[..i].iter().rev() {
            if e - be >= dur {
                break;
            }
            e = e.min(bs);
        }
        e - dur
    }

    /// Marks `[s, e)` busy (the caller found it idle with the two queries above).
    pub fn reserve(&mut self, s: f64, e: f64) {
        if e <= s {
            return;
        }
        let i = self.busy.partition_point(|&(bs, _)| bs < s);
        let (mut s, mut e) = (s, e);
        // Merge with the span before if it touches or overlaps, and with those after.
        let mut lo = i;
        if lo > 0 && self.busy[lo - 1].1 >= s {
            lo -= 1;
            s = s.min(self.busy[lo].0);
            e = e.max(self.busy[lo].1);
        }
        let mut hi = i;
        while hi < self.busy.len() && self.busy[hi].0 <= e {
            e = e.max(self.busy[hi].1);
            hi += 1;
        }
        self.busy.splice(lo..hi, std::iter::once((s, e)));
    }

    /// Total busy time, us.
    pub fn busy_us(&self) -> f64 {
        self.busy.iter().map(|&(s, e)| e - s).sum()
    }

    #[cfg(test)]
    fn spans(&self) -> &[(f64, f64)] {
        &self.busy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_take_the_first_hole_long_enough_and_touching_spans_merge() {
        let mut t = Timeline::new();
        assert_eq!(t.earliest_end(5.0, 10.0), 15.0);
        t.reserve(5.0, 15.0);
        t.reserve(20.0, 30.0);
        // A hole of 5 between them: a copy of 4 fits, one of 6 goes after 30.
        assert_eq!(t.earliest_end(0.0, 4.0), 4.0);
        assert_eq!(t.earliest_end(6.0, 4.0), 19.0);
        assert_eq!(t.earliest_end(6.0, 6.0), 36.0);
        t.reserve(15.0, 19.0);
        assert_eq!(t.spans(), &[(5.0, 19.0), (20.0, 30.0)]);
        t.reserve(19.0, 20.0);
        assert_eq!(t.spans(), &[(5.0, 30.0)]);
        assert_eq!(t.busy_us(), 25.0);
    }

    #[test]
    fn deadline_copies_take_the_last_hole_that_ends_in_time() {
        let mut t = Timeline::new();
        t.reserve(10.0, 20.0);
        t.reserve(25.0, 40.0);
        assert_eq!(t.latest_start(50.0, 5.0), 45.0);
        // Must end by 38: inside the second span; the hole 20..25 holds 5 us.
        assert_eq!(t.latest_start(38.0, 5.0), 20.0);
        // 6 us does not fit between them: before 10.
        assert_eq!(t.latest_start(38.0, 6.0), 4.0);
        assert_eq!(t.latest_start(8.0, 3.0), 5.0);
    }
}
