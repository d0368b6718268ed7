//! The live large runs of one stream's log, by record id and, in the growable segment,
//! by offset.
//!
//! Two operations per large run on the allocation path (insert when it is carved,
//! remove when it is freed) and one query per planned offset (`left_of`: the run
//! nearest at or below it, where the walk of the placement index starts). Record ids
//! are dense (the allocator's record table), so the runs sit in a vector with an
//! id -> slot table (O(1), no hashing); the offset index is one doubly linked list per
//! 2 MiB bucket of the segment, with a two-level bitmap of the non-empty buckets
//! (O(1) insert and remove; a query scans the runs starting in at most two buckets).
//! Measured against the hash map and B-tree it replaces: see `placement`'s costs.

use super::Live;

/// The bucket of an offset: 2 MiB (a granule; a large run is at least `small_max`).
const SHIFT: u32 = 21;
const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Entry {
    id: u32,
    /// The neighbours in its bucket's list (record ids; `NONE` at the ends, and for a
    /// run outside the growable segment).
    next: u32,
    prev: u32,
    live: Live,
}

#[derive(Debug, Default)]
pub(super) struct LiveRuns {
    // Invariant: at[id] == i < runs.len() iff runs[i].id == id; NONE for every id not
    // live.
    at: Vec<u32>,
    runs: Vec<Entry>,
    // Invariant: the runs with `live.growable` are exactly those on the lists, each on
    // the list of bucket off >> SHIFT; heads[b] is NONE iff that list is empty.
    heads: Vec<u32>,
    // Invariant: bit b of words is set iff heads[b] != NONE; bit w of summary is set iff
    // words[w] != 0.
    words: Vec<u64>,
    summary: Vec<u64>,
    by_off: usize,
}

impl LiveRuns {
    fn slot(&self, id: u32) -> Option<usize> {
        let i = *self.at.get(id as usize)?;
        (i != NONE).then_some(i as usize)
    }

    /// The live run of record `id`.
    #[inline]
    pub(super) fn get(&self, id: u32) -> Option<&Live> {
        self.slot(id).map(|i| &self.runs[i].live)
    }

    pub(super) fn len(&self) -> usize {
        self.runs.len()
    }

    /// The live runs, in no particular order.
    pub(super) fn values(&self) -> impl Iterator<Item = &Live> {
        self.runs.iter().map(|e| &e.live)
    }

    /// Logs run `id` live (replacing any entry of that id). O(1).
    #[inline]
    pub(super) fn insert(&mut self, id: u32, live: Live) {
        if self.slot(id).is_some() {
            self.remove(id);
        }
        let i = id as usize;
        if i >= self.at.len() {
            self.at.resize(i + 1, NONE);
        }
        self.at[i] = self.runs.len() as u32;
        self.runs.push(Entry {
            id,
            next: NONE,
            prev: NONE,
            live,
        });
        if live.growable {
            self.link(id, live.off);
        }
    }

    /// Run `id`'s entry, removed. O(1).
    #[inline]
    pub(super) fn remove(&mut self, id: u32) -> Option<Live> {
        let i = self.slot(id)?;
        let e = self.runs[i];
        if e.live.growable {
            self.unlink(e);
        }
        self.at[id as usize] = NONE;
        self.runs.swap_remove(i);
        if let Some(moved) = self.runs.get(i) {
            self.at[moved.id as usize] = i as u32;
        }
        Some(e.live)
    }

    fn entry_mut(&mut self, id: u32) -> &mut Entry {
        let i = self.at[id as usize] as usize;
        &mut self.runs[i]
    }

    fn link(&mut self, id: u32, off: u64) {
        let b = (off >> SHIFT) as usize;
        if b >= self.heads.len() {
            self.heads.resize(b + 1, NONE);
            self.words.resize((b >> 6) + 1, 0);
            self.summary.resize((b >> 12) + 1, 0);
        }
        let head = self.heads[b];
        if head != NONE {
            self.entry_mut(head).prev = id;
        }
        self.entry_mut(id).next = head;
        self.heads[b] = id;
        self.words[b >> 6] |= 1 << (b & 63);
        self.summary[b >> 12] |= 1 << ((b >> 6) & 63);
        self.by_off += 1;
    }

    fn unlink(&mut self, e: Entry) {
        let b = (e.live.off >> SHIFT) as usize;
        if e.prev != NONE {
            self.entry_mut(e.prev).next = e.next;
        } else {
            self.heads[b] = e.next;
        }
        if e.next != NONE {
            self.entry_mut(e.next).prev = e.prev;
        }
        if self.heads[b] == NONE {
            self.words[b >> 6] &= !(1 << (b & 63));
            if self.words[b >> 6] == 0 {
                self.summary[b >> 12] &= !(1 << ((b >> 6) & 63));
            }
        }
        self.by_off -= 1;
    }

    /// The run of bucket `b` that starts nearest at or below `off`: (offset, id).
    fn best_in(&self, b: usize, off: u64) -> Option<(u64, u32)> {
        let mut best = None;
        let mut id = self.heads[b];
        while id != NONE {
            let e = &self.runs[self.at[id as usize] as usize];
            let o = e.live.off;
            if o <= off && best.is_none_or(|(bo, _)| o > bo) {
                best = Some((o, id));
            }
            id = e.next;
        }
        best
    }

    /// The highest non-empty bucket below `b`.
    fn bucket_below(&self, b: usize) -> Option<usize> {
        let b = b.min(self.heads.len());
        let (w, bit) = (b >> 6, b & 63);
        if let Some(&word) = self.words.get(w) {
            let m = word & ((1u64 << bit) - 1);
            if m != 0 {
                return Some(w * 64 + 63 - m.leading_zeros() as usize);
            }
        }
        // The highest non-empty word below w.
        if self.summary.is_empty() {
            return None;
        }
        let (s, sbit) = (w >> 6, w & 63);
        let mut mask = (1u64 << sbit) - 1;
        for si in (0..=s.min(self.summary.len() - 1)).rev() {
            let m = self.summary[si] & if si == s { mask } else { u64::MAX };
            if m != 0 {
                let wi = si * 64 + 63 - m.leading_zeros() as usize;
                let word = self.words[wi];
                return Some(wi * 64 + 63 - word.leading_zeros() as usize);
            }
            mask = u64::MAX;
        }
        None
    }

    /// The live run of the growable segment that starts nearest at or below `off` (its
    /// record id). O(runs starting in the bucket of `off` and in the non-empty bucket
    /// below it).
    #[inline]
    pub(super) fn left_of(&self, off: u64) -> Option<u32> {
        let b = (off >> SHIFT) as usize;
        if b < self.heads.len() {
            if let Some((_, id)) = self.best_in(b, off) {
                return Some(id);
            }
        }
        let below = self.bucket_below(b)?;
        self.best_in(below, off).map(|(_, id)| id)
    }

    /// Checks the invariants above (part of `check_invariants`).
    pub(super) fn check(&self) -> Result<(), String> {
        for (i, e) in self.runs.iter().enumerate() {
            if self.at.get(e.id as usize) != Some(&(i as u32)) {
                return Err(format!("placement log: run {} not at its slot", e.id));
            }
        }
        if self.at.iter().filter(|&&i| i != NONE).count() != self.runs.len() {
            return Err("placement log: slots of runs not live".into());
        }
        let mut linked = 0;
        for (b, &head) in self.heads.iter().enumerate() {
            let (mut id, mut prev) = (head, NONE);
            while id != NONE {
                let Some(l) = self.get(id) else {
                    return Err(format!("placement log: run {id} by offset, not live"));
                };
                let e = &self.runs[self.at[id as usize] as usize];
                if !l.growable || (l.off >> SHIFT) as usize != b || e.prev != prev {
                    return Err(format!("placement log: run {id} in bucket {b}"));
                }
                linked += 1;
                (prev, id) = (id, e.next);
            }
            let bit = self.words[b >> 6] >> (b & 63) & 1 == 1;
            if bit != (head != NONE) {
                return Err(format!("placement log: bit of bucket {b}"));
            }
        }
        for (w, &word) in self.words.iter().enumerate() {
            if (self.summary[w >> 6] >> (w & 63) & 1 == 1) != (word != 0) {
                return Err(format!("placement log: summary bit of word {w}"));
            }
        }
        let growable = self.values().filter(|l| l.growable).count();
        if linked != growable || linked != self.by_off {
            return Err(format!(
                "placement log: {linked} runs by offset, {growable} live in the growable segment"
            ));
        }
        Ok(())
    }
}
