//! A hash map for integer keys (the run cache by length, the used-run index by address).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A cheap hasher for integer keys (run lengths, (segment, offset) pairs). Offsets are
/// multiples of 256, so the finaliser mixes high bits down: hashbrown indexes buckets by
/// the low bits (a plain multiply left them zero and every key collided).
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

pub(crate) const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for FxHasher {
    #[inline]
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(K);
        h ^ (h >> 29) ^ (h >> 47)
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(K);
        }
    }
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.0 = (self.0.rotate_left(5) ^ v as u64).wrapping_mul(K);
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(K);
    }
}

pub(crate) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;
