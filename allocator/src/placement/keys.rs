//! Key generation ([`super::Key`]: length, context, ordinal), and its fast path.
//!
//! A key needs the ordinal of its (length, context) pair since the boundary (or since
//! the start, for a profile): a hash map of counts, one lookup and insert per large
//! allocation. A repeating loop asks for the same lengths in the same order as the
//! iteration before it (or as the recording), so its keys are those of that sequence:
//! [`IterKeys`] (and the profile, `super::profile`) read them from it, position by
//! position, while the lengths agree. At the first length that differs the counts are
//! rebuilt from the lengths seen so far, exactly as the map would hold them, and the
//! map goes on alone (until the next boundary). The keys are the same either way.

use super::Key;
use crate::fxmap::FxMap;

/// Key generation for one stream, from its start or from a boundary.
#[derive(Debug, Default, Clone)]
pub(crate) struct Keys {
    ordinal: FxMap<(u64, u64), u32>,
    prev: [u64; 2],
}

impl Keys {
    /// The key of the next large allocation of `len`. One hash map entry.
    #[inline]
    pub(crate) fn next(&mut self, len: u64) -> Key {
        let ctx = self.prev[0].wrapping_mul(crate::fxmap::K) ^ self.prev[1].rotate_left(29);
        self.prev = [len, self.prev[0]];
        let n = self.ordinal.entry((len, ctx)).or_insert(0);
        let key = (len, ctx, *n);
        *n += 1;
        key
    }

    pub(crate) fn clear(&mut self) {
        self.ordinal.clear();
        self.prev = [0, 0];
    }

    /// The generator after the lengths `lens`, from a clear start.
    pub(crate) fn after(lens: impl Iterator<Item = u64>) -> Keys {
        let mut k = Keys::default();
        for len in lens {
            k.next(len);
        }
        k
    }
}

/// Keys generated since the last boundary, at most this many kept (the reference of
/// the next iteration: a longer iteration follows it up to there, then counts).
const KEPT_MAX: usize = 1 << 18;

/// The keys of the in-run log (from each boundary), following the previous
/// iteration's while the lengths agree.
#[derive(Debug)]
pub(crate) struct IterKeys {
    keys: Keys,
    // Invariant: while `follows`, keys is clear and kept == reference[..kept.len()]
    // (this iteration's lengths so far are the previous one's); otherwise keys holds
    // the counts of all of this iteration's lengths (kept: the first KEPT_MAX).
    follows: bool,
    /// This iteration's (length, key), and the previous iteration's.
    kept: Vec<(u64, Key)>,
    reference: Vec<(u64, Key)>,
}

impl Default for IterKeys {
    fn default() -> Self {
        IterKeys {
            keys: Keys::default(),
            follows: true,
            kept: Vec::new(),
            reference: Vec::new(),
        }
    }
}

impl IterKeys {
    /// The key of the next large allocation of `len`: a vector read while the
    /// iteration repeats the previous one, else one hash map entry (and, once per
    /// iteration, the map rebuilt from the lengths so far).
    #[inline]
    pub(crate) fn next(&mut self, len: u64) -> Key {
        let i = self.kept.len();
        if self.follows {
            if let Some(&(l, key)) = self.reference.get(i) {
                if l == len {
                    self.kept.push((len, key));
                    return key;
                }
            }
            self.diverge();
        }
        let key = self.keys.next(len);
        if i < KEPT_MAX {
            self.kept.push((len, key));
        }
        key
    }

    /// This iteration stops following the previous one: the counts of its lengths
    /// so far.
    #[cold]
    #[inline(never)]
    fn diverge(&mut self) {
        self.follows = false;
        self.keys = Keys::after(self.kept.iter().map(|&(l, _)| l));
    }

    /// A boundary: this iteration becomes the reference of the next.
    pub(crate) fn clear(&mut self) {
        std::mem::swap(&mut self.kept, &mut self.reference);
        self.kept.clear();
        self.keys.clear();
        self.follows = true;
    }
}

/// A plan by key (the in-run plan, or a profile's last iteration), with its keys in
/// the order of the iteration it was made from: the key of an iteration that repeats
/// it is found at its own position (a compare), else by hash lookup.
#[derive(Debug, Default)]
pub(crate) struct KeyedPlan {
    map: FxMap<Key, u64>,
    // Invariant: seq[i] == (k, map[k]) where k is the i-th key the plan was made from.
    seq: Vec<(Key, u64)>,
}

impl KeyedPlan {
    /// The plan of (key, offset) pairs in iteration order (a key given twice: its last
    /// offset).
    pub(crate) fn from_pairs(pairs: impl Iterator<Item = (Key, u64)>) -> KeyedPlan {
        let keys: Vec<(Key, u64)> = pairs.collect();
        let map: FxMap<Key, u64> = keys.iter().copied().collect();
        let seq = keys.into_iter().map(|(k, _)| (k, map[&k])).collect();
        KeyedPlan { map, seq }
    }

    /// The offset of `key`, the `pos`-th large allocation of its iteration. A compare
    /// where the iteration repeats the plan's, else one hash lookup.
    #[inline]
    pub(crate) fn get(&self, pos: usize, key: &Key) -> Option<u64> {
        if let Some((k, off)) = self.seq.get(pos) {
            if k == key {
                return Some(*off);
            }
        }
        self.map.get(key).copied()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.seq.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IterKeys gives the keys of `Keys` on any sequence of iterations, whether they
    /// repeat, diverge, or run past the previous one.
    #[test]
    fn iter_keys_are_the_maps_keys() {
        let mut seed = 7u64;
        let mut rnd = |n: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        let (mut fast, mut slow) = (IterKeys::default(), Keys::default());
        let mut prev: Vec<u64> = Vec::new();
        for _ in 0..200 {
            let n = rnd(40) as usize;
            let same = rnd(3) == 0;
            let it: Vec<u64> = (0..n)
                .map(|i| match (prev.get(i), rnd(4)) {
                    (Some(&l), _) if same => l,
                    (Some(&l), 0..=2) => l,
                    _ => 256 * (1 + rnd(4)),
                })
                .collect();
            for &len in &it {
                assert_eq!(fast.next(len), slow.next(len));
            }
            fast.clear();
            slow.clear();
            prev = it;
        }
    }

    /// KeyedPlan::get is the map's lookup, at any position.
    #[test]
    fn keyed_plan_gets_the_maps_offset() {
        let k = |n: u32| (256, 0, n);
        let pairs = [(k(0), 10), (k(1), 20), (k(0), 30), (k(2), 40)];
        let plan = KeyedPlan::from_pairs(pairs.into_iter());
        let map: FxMap<Key, u64> = pairs.into_iter().collect();
        for pos in 0..6 {
            for n in 0..4 {
                assert_eq!(plan.get(pos, &k(n)), map.get(&k(n)).copied());
            }
        }
    }
}
