//! One stream's cache of freed runs by exact length (deferred coalescing): a run freed
//! whole waits here, and a request of the same length takes it back without touching
//! the placement index.
//!
//! Shape: `SLOTS` direct-mapped slots keyed by a hash of the length, each the head of
//! an intrusive singly linked list through the records (`Record::next`), and a bitmask
//! of the non-empty slots. Lengths that share a slot share its list; a lookup walks it
//! for the first record of exactly that length.
//!
//! Why not a hash map: the cache turns over constantly (on the resnet50 trace a miss
//! flushes it every 1-4 frees), and a map paid a hash insert per free, a remove or
//! re-insert per hit and a drain of every bucket per flush: ~170 instructions per
//! alloc+free pair there (callgrind, `examples/fast_path_parts 1 trace`). Here a free
//! is a list push, a hit a short walk, a flush visits only the non-empty slots.
//!
//! Costs: `push` O(1); `take` O(length of one slot's list), and a miss walks that list
//! to its end, but a miss is followed by a flush of the whole cache, which costs more;
//! `drain` O(cached runs + SLOTS / 64).
//!
//! Invariants (checked by the allocator's `check_invariants` through [`RunCache::iter`]):
//! - every record on slot s's list is in state Cached with `slot_of(size) == s`;
//! - bit s of `mask` is set iff slot s's list is not empty;
//! - `runs` and `bytes` are the count and the total size of the listed records.

use crate::buddy::NIL;
use crate::fxmap;
use crate::record::Record;
use crate::table::Table;

const SLOTS: usize = 256;
const WORDS: usize = SLOTS / 64;

#[inline]
fn slot_of(len: u64) -> usize {
    ((len >> 8).wrapping_mul(fxmap::K) >> (64 - SLOTS.trailing_zeros())) as usize
}

#[derive(Debug, Clone)]
pub(crate) struct RunCache {
    heads: [u32; SLOTS],
    // Invariant: bit s of mask[s / 64] set iff heads[s] != NIL.
    mask: [u64; WORDS],
    // Invariant: runs == number of listed records; bytes == the sum of their sizes.
    runs: u64,
    bytes: u64,
}

impl Default for RunCache {
    fn default() -> Self {
        RunCache {
            heads: [NIL; SLOTS],
            mask: [0; WORDS],
            runs: 0,
            bytes: 0,
        }
    }
}

impl RunCache {
    /// Cached runs.
    #[inline]
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// Bytes of the cached runs.
    #[inline]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Caches record `id` (its `size` is the run's length). The caller sets its state.
    #[inline]
    pub fn push(&mut self, records: &mut Table<Record>, id: u32) {
        let size = records[id].size();
        let s = slot_of(size);
        records[id].set_next(self.heads[s]);
        self.heads[s] = id;
        self.mask[s / 64] |= 1 << (s % 64);
        self.runs += 1;
        self.bytes += size;
    }

    /// Takes a cached run of exactly `len` bytes out of the cache, if there is one.
    #[inline]
    pub fn take(&mut self, records: &mut Table<Record>, len: u64) -> Option<u32> {
        if self.runs == 0 {
            return None;
        }
        let s = slot_of(len);
        let (mut prev, mut id) = (NIL, self.heads[s]);
        while id != NIL {
            let r = &records[id];
            let next = r.next();
            if r.size() == len {
                if prev == NIL {
                    self.heads[s] = next;
                    if next == NIL {
                        self.mask[s / 64] &= !(1 << (s % 64));
                    }
                } else {
                    records[prev].set_next(next);
                }
                records[id].set_next(NIL);
                self.runs -= 1;
                self.bytes -= len;
                return Some(id);
            }
            prev = id;
            id = next;
        }
        None
    }

    /// Empties the cache, handing every cached record to `f` (in no particular order).
    pub fn drain(
        &mut self,
        records: &mut Table<Record>,
        mut f: impl FnMut(&mut Table<Record>, u32),
    ) {
        for w in 0..WORDS {
            let mut bits = std::mem::take(&mut self.mask[w]);
            while bits != 0 {
                let s = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let mut id = std::mem::replace(&mut self.heads[s], NIL);
                while id != NIL {
                    let next = records[id].next();
                    records[id].set_next(NIL);
                    f(records, id);
                    id = next;
                }
            }
        }
        self.runs = 0;
        self.bytes = 0;
    }

    /// Every cached record with the slot it is listed in, and whether that slot's
    /// mask bit is set (for checks and statistics; O(cached runs + SLOTS)).
    pub fn iter<'a>(
        &'a self,
        records: &'a Table<Record>,
    ) -> impl Iterator<Item = (u32, bool)> + 'a {
        (0..SLOTS).flat_map(move |s| {
            let mut id = self.heads[s];
            let marked = self.mask[s / 64] >> (s % 64) & 1 == 1;
            std::iter::from_fn(move || {
                if id == NIL {
                    return None;
                }
                let this = id;
                // Checked indexing: this walk is what finds a corrupt list.
                id = records.at(id).next();
                Some((this, marked && slot_of(records.at(this).size()) == s))
            })
        })
    }

    /// Whether the mask marks exactly the non-empty slots.
    pub fn mask_agrees(&self) -> bool {
        (0..SLOTS).all(|s| (self.mask[s / 64] >> (s % 64) & 1 == 1) == (self.heads[s] != NIL))
    }

    /// Length of the largest cached run (0 if none).
    pub fn largest(&self, records: &Table<Record>) -> u64 {
        self.iter(records)
            .map(|(id, _)| records[id].size())
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RecState;

    fn rec(size: u64) -> Record {
        let mut r = Record::unplaced(size, 0);
        r.state = RecState::Cached;
        r
    }

    /// Random pushes, takes and drains against a multiset model: a take finds a run
    /// of the length iff the model holds one; counters and mask stay exact.
    #[test]
    fn random_programs_match_a_multiset() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};
        let op = (0u8..8, 1u64..600);
        let mut runner = TestRunner::new(Config {
            cases: 256,
            ..Config::default()
        });
        runner
            .run(&proptest::collection::vec(op, 1..300), |ops| {
                let mut records: Table<Record> = Table::default();
                let mut c = RunCache::default();
                let mut model: Vec<u64> = Vec::new();
                for (kind, n) in ops {
                    // Few distinct lengths, many collisions per slot.
                    let len = (n % 40 + 1) * 256 * if n % 3 == 0 { 4096 } else { 1 };
                    match kind {
                        0..=3 => {
                            records.push(rec(len));
                            let id = (records.len() - 1) as u32;
                            c.push(&mut records, id);
                            model.push(len);
                        }
                        4..=6 => {
                            let got = c.take(&mut records, len);
                            let pos = model.iter().position(|&m| m == len);
                            prop_assert_eq!(got.is_some(), pos.is_some());
                            if let (Some(id), Some(p)) = (got, pos) {
                                prop_assert_eq!(records[id].size(), len);
                                prop_assert_eq!(records[id].next(), NIL);
                                model.swap_remove(p);
                            }
                        }
                        _ => {
                            let mut n = 0;
                            c.drain(&mut records, |_, _| n += 1);
                            prop_assert_eq!(n, model.len());
                            model.clear();
                        }
                    }
                    prop_assert_eq!(c.runs(), model.len() as u64);
                    prop_assert_eq!(c.bytes(), model.iter().sum::<u64>());
                    prop_assert!(c.mask_agrees());
                    prop_assert!(c.iter(&records).all(|(_, ok)| ok));
                    prop_assert_eq!(c.iter(&records).count(), model.len());
                    prop_assert_eq!(
                        c.largest(&records),
                        model.iter().copied().max().unwrap_or(0)
                    );
                }
                Ok(())
            })
            .unwrap();
    }
}
