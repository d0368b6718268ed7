//! Small objects: size classes and slabs carved from buddy runs.
//!
//! A request under `small_max` is rounded up to its size class (`classes_per_doubling`
//! classes per power of two, every class a multiple of the minimum block so objects
//! stay aligned) and served from a slab: one buddy run cut into equal slots. Taking or
//! returning a slot is a push/pop on the slab's stack of free slots: O(1), no tree work.
//!
//! Invariant (per slab): `used + free.len() == capacity`, and `slot_rec[s] == NIL` iff
//! slot `s` is on the free stack.

use crate::buddy::{Run, NIL};

/// The size classes of small objects.
#[derive(Debug, Clone)]
pub struct SizeClasses {
    min_order: u32,
    per_doubling_log2: u32,
    /// `start[e]`: index of the first class above `2^e`.
    start: Vec<u32>,
    sizes: Vec<u64>,
    small_max: u64,
}

impl SizeClasses {
    pub fn new(min_block: u64, small_max: u64, classes_per_doubling: u32) -> Self {
        let min_order = min_block.trailing_zeros();
        let per_doubling_log2 = classes_per_doubling.trailing_zeros();
        let mut sizes = vec![min_block];
        let mut start = vec![0u32; 64];
        let top = if small_max <= min_block {
            min_order
        } else {
            64 - (small_max - 1).leading_zeros()
        };
        for e in min_order..top {
            start[e as usize] = sizes.len() as u32;
            let step = ((1u64 << e) >> per_doubling_log2).max(min_block);
            let mut s = (1u64 << e) + step;
            while s <= 1u64 << (e + 1) {
                sizes.push(s);
                s += step;
            }
        }
        SizeClasses {
            min_order,
            per_doubling_log2,
            start,
            sizes,
            small_max,
        }
    }

    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    pub fn size(&self, class: usize) -> u64 {
        self.sizes[class]
    }

    pub fn small_max(&self) -> u64 {
        self.small_max
    }

    /// `(class, class size)` for a request of `bytes` (1 ..= small_max). O(1).
    #[inline]
    pub fn class_of(&self, bytes: u64) -> (usize, u64) {
        let min = 1u64 << self.min_order;
        if bytes <= min {
            return (0, min);
        }
        let e = 63 - (bytes - 1).leading_zeros();
        let step_order = e.saturating_sub(self.per_doubling_log2).max(self.min_order);
        let step = 1u64 << step_order;
        let rounded = (bytes + step - 1) & !(step - 1);
        let k = ((rounded - (1u64 << e)) >> step_order) as usize;
        (self.start[e as usize] as usize + k - 1, rounded)
    }
}

/// One slab: `capacity` slots of `obj` bytes in the buddy run `[off, off + len)` of
/// segment `seg` in the pool of `stream`.
#[derive(Debug, Clone)]
pub struct Slab {
    pub stream: u32,
    pub seg: u32,
    pub off: u64,
    /// The run's block in the placement index.
    pub blk: u32,
    pub base: u64,
    pub obj: u64,
    pub class: u32,
    pub capacity: u32,
    pub used: u32,
    /// Stack of free slot indices.
    pub free: Vec<u32>,
    /// Record id per slot (NIL when free).
    pub slot_rec: Vec<u32>,
    /// On its stream's partial list for its class.
    pub in_partial: bool,
    pub live: bool,
}

impl Slab {
    pub fn new(stream: u32, run: Run, base: u64, obj: u64, class: u32, capacity: u32) -> Self {
        Slab {
            stream,
            seg: run.seg,
            off: run.off,
            blk: run.blk,
            base,
            obj,
            class,
            capacity,
            used: 0,
            free: (0..capacity).rev().collect(),
            slot_rec: vec![NIL; capacity as usize],
            in_partial: false,
            live: true,
        }
    }

    /// The buddy run the slab was carved from.
    pub fn run(&self) -> Run {
        Run {
            seg: self.seg,
            off: self.off,
            blk: self.blk,
        }
    }

    pub fn len(&self) -> u64 {
        self.obj * self.capacity as u64
    }

    pub fn is_empty(&self) -> bool {
        self.capacity == 0
    }

    pub fn check(&self) -> Result<(), String> {
        if self.used as usize + self.free.len() != self.capacity as usize {
            return Err(format!(
                "slab: used {} + free {} != capacity {}",
                self.used,
                self.free.len(),
                self.capacity
            ));
        }
        let nil_slots = self.slot_rec.iter().filter(|&&r| r == NIL).count();
        if nil_slots != self.free.len() {
            return Err("slab: free stack disagrees with slot records".into());
        }
        for &s in &self.free {
            if self.slot_rec[s as usize] != NIL {
                return Err(format!("slab: free slot {s} has a record"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_within_a_quarter() {
        let c = SizeClasses::new(256, 1 << 20, 4);
        assert_eq!(c.class_of(1), (0, 256));
        assert_eq!(c.class_of(256), (0, 256));
        let (i, s) = c.class_of(257);
        assert_eq!((c.size(i), s), (512, 512));
        for bytes in [
            300u64,
            1000,
            1025,
            5000,
            65537,
            100_000,
            1 << 20,
            (1 << 20) - 1,
        ] {
            let (i, s) = c.class_of(bytes);
            assert_eq!(c.size(i), s, "{bytes}");
            assert!(s >= bytes && s % 256 == 0);
            if bytes > 1024 {
                assert!((s - bytes) as f64 <= 0.25 * bytes as f64, "{bytes} -> {s}");
            }
            if i > 0 {
                assert!(c.size(i - 1) < bytes, "{bytes}: a smaller class fits");
            }
        }
        // Classes are strictly increasing.
        assert!((1..c.len()).all(|i| c.size(i) > c.size(i - 1)));
        assert_eq!(c.size(c.len() - 1), 1 << 20);
    }
}
