//! Small objects: size classes and slabs carved from buddy runs.
//!
//! A request under `small_max` is rounded up to its size class (`classes_per_doubling`
//! classes per power of two, every class a multiple of the minimum block so objects
//! stay aligned) and served from a slab: one buddy run cut into equal slots. Taking or
//! returning a slot is a pop/push on the slab's free list: O(1), no tree work.
//!
//! The free list is intrusive: a slot's entry in `slot_rec` holds its record id while
//! it is used and `FREE | next free slot` while it is free, so a take or a return
//! touches one array (a separate stack of free slots cost a second cache line per
//! small alloc and free).
//!
//! Invariants (per slab, checked by [`Slab::check`]): the free list, from `free_head`,
//! holds exactly the slots whose entry has the `FREE` bit, each once, and
//! `used + (its length) == capacity`.

use crate::buddy::Run;

/// Tag of a free slot's `slot_rec` entry (record ids stay below it).
const FREE: u32 = 1 << 31;
/// End of the free list.
const END: u32 = FREE - 1;

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
    /// First free slot (END if none).
    free_head: u32,
    /// Per slot: its record id, or `FREE | next free slot`.
    slot_rec: Vec<u32>,
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
            free_head: if capacity > 0 { 0 } else { END },
            slot_rec: (1..=capacity)
                .map(|n| FREE | if n < capacity { n } else { END })
                .collect(),
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

    /// Slots free.
    #[inline]
    pub fn free_slots(&self) -> u32 {
        self.capacity - self.used
    }

    /// Takes a free slot for record `rec`. O(1).
    #[inline]
    pub fn take_slot(&mut self, rec: u32) -> Option<u32> {
        let s = self.free_head;
        if s == END {
            return None;
        }
        let e = &mut self.slot_rec[s as usize];
        self.free_head = *e & !FREE;
        *e = rec;
        self.used += 1;
        Some(s)
    }

    /// Returns slot `s` (used) to the free list. O(1).
    #[inline]
    pub fn return_slot(&mut self, s: u32) {
        debug_assert!(self.slot_rec[s as usize] & FREE == 0, "slot {s} is free");
        self.slot_rec[s as usize] = FREE | self.free_head;
        self.free_head = s;
        self.used -= 1;
    }

    /// The record of slot `s`, if it is used.
    #[inline]
    pub fn record_of(&self, s: u32) -> Option<u32> {
        self.slot_rec
            .get(s as usize)
            .copied()
            .filter(|&r| r & FREE == 0)
    }

    pub fn check(&self) -> Result<(), String> {
        let (mut s, mut n) = (self.free_head, 0u32);
        while s != END {
            let e = *self
                .slot_rec
                .get(s as usize)
                .ok_or_else(|| format!("slab: free list names slot {s} of {}", self.capacity))?;
            if e & FREE == 0 {
                return Err(format!("slab: free-listed slot {s} has record {e}"));
            }
            n += 1;
            if n > self.capacity {
                return Err("slab: the free list loops".into());
            }
            s = e & !FREE;
        }
        let tagged = self.slot_rec.iter().filter(|&&r| r & FREE != 0).count() as u32;
        if tagged != n || self.used + n != self.capacity {
            return Err(format!(
                "slab: used {} + free-listed {n} (tagged free {tagged}) != capacity {}",
                self.used, self.capacity
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_list_takes_and_returns_slots() {
        let run = Run {
            seg: 0,
            off: 0,
            blk: 0,
        };
        let mut s = Slab::new(0, run, 4096, 256, 0, 4);
        s.check().unwrap();
        // Slots come out in address order first, then last returned first.
        assert_eq!((s.take_slot(10), s.take_slot(11)), (Some(0), Some(1)));
        assert_eq!(
            (s.record_of(0), s.record_of(2), s.record_of(9)),
            (Some(10), None, None)
        );
        s.return_slot(0);
        assert_eq!(s.record_of(0), None);
        s.check().unwrap();
        assert_eq!(s.take_slot(12), Some(0));
        assert_eq!(
            (s.take_slot(13), s.take_slot(14), s.take_slot(15)),
            (Some(2), Some(3), None)
        );
        assert_eq!((s.used, s.free_slots()), (4, 0));
        s.check().unwrap();
        // A corrupted entry is caught.
        s.slot_rec[1] = FREE | END;
        assert!(s.check().is_err());
    }

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
