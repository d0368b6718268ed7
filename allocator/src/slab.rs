//! Small objects: size classes and slabs carved from buddy runs.
//!
//! A request under `small_max` is rounded up to its size class (`classes_per_doubling`
//! classes per power of two, every class a multiple of the minimum block so objects
//! stay aligned) and served from a slab: one buddy run cut into equal slots.
//!
//! Every slot owns one record of the allocator's table for the slab's whole life
//! (created with the slab, returned with it): the record holds the slot's fixed pointer,
//! size and place, and a small allocation only flips it to Live with a new generation.
//! The slab's free slots are a list through those records (`Record::next`), so taking
//! or returning a slot touches the slot's own record and nothing else: no record is
//! created or freed per small allocation (that was ~40 of ~310 instructions per small
//! alloc+free pair, callgrind on `examples/fast_path_parts 1 small`).
//!
//! Invariants (per slab, checked by [`Slab::check`]): `slot_rec[s]` is the record of
//! slot `s` (a slab record naming this slab and slot); the free list, from `free_head`,
//! holds exactly the slot records in state Free, each once; and
//! `used + (its length) == capacity`.

use crate::buddy::{Run, NIL};
use crate::record::{RecState, Record};
use crate::table::Table;

/// The size classes of small objects.
#[derive(Debug, Clone)]
pub struct SizeClasses {
    min_order: u32,
    per_doubling_log2: u32,
    /// `start[e]`: index of the first class above `2^e`.
    start: Vec<u32>,
    sizes: Vec<u64>,
    small_max: u64,
    /// Class of every request, by `(bytes - 1) >> min_order` (requests up to
    /// `small_max`, at most 1 MiB): one load instead of ~20 instructions of arithmetic
    /// per small request.
    lut: Vec<u16>,
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
        let mut c = SizeClasses {
            min_order,
            per_doubling_log2,
            start,
            sizes,
            small_max,
            lut: Vec::new(),
        };
        assert!(
            c.sizes.len() <= u16::MAX as usize,
            "size classes fit the table"
        );
        // Up to 1 MiB (8 KiB of table at 256-byte blocks); larger requests, if
        // `small_max` allows them, are computed.
        let slots = small_max.clamp(min_block, 1 << 20).div_ceil(min_block);
        c.lut = (0..slots)
            .map(|i| c.compute_class((i + 1) << min_order).0 as u16)
            .collect();
        c
    }

    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    pub fn size(&self, class: usize) -> u64 {
        self.sizes[class]
    }

    pub fn small_max(&self) -> u64 {
        self.small_max
    }

    /// The class of a request of `bytes` (1 ..= small_max). O(1): a table lookup.
    #[inline]
    pub fn class_index(&self, bytes: u64) -> usize {
        match self.lut.get((bytes.max(1) - 1) as usize >> self.min_order) {
            Some(&c) => c as usize,
            None => self.compute_class(bytes).0,
        }
    }

    /// `(class, class size)` for a request of `bytes` (1 ..= small_max). O(1): a table
    /// lookup (what `class_index` returns, with the size; for the tests).
    #[cfg(test)]
    pub fn class_of(&self, bytes: u64) -> (usize, u64) {
        let c = self.class_index(bytes);
        (c, self.sizes[c])
    }

    /// `class_of` by arithmetic (what the table holds).
    fn compute_class(&self, bytes: u64) -> (usize, u64) {
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
    /// The record of the first free slot (NIL if none).
    free_head: u32,
    /// Per slot: its record (for the slab's whole life).
    slot_rec: Vec<u32>,
    /// On its stream's partial list for its class.
    pub in_partial: bool,
    pub live: bool,
}

impl Slab {
    /// A slab over `run` whose slots own the records `recs` (one per slot, in slot
    /// order). The caller has made them slot records of this slab (state Free); they
    /// are linked here into the free list, slot 0 first.
    pub(crate) fn new(
        stream: u32,
        run: Run,
        base: u64,
        obj: u64,
        class: u32,
        recs: Vec<u32>,
        records: &mut Table<Record>,
    ) -> Self {
        let mut head = NIL;
        for &id in recs.iter().rev() {
            records[id].set_next(head);
            head = id;
        }
        Slab {
            stream,
            seg: run.seg,
            off: run.off,
            blk: run.blk,
            base,
            obj,
            class,
            capacity: recs.len() as u32,
            used: 0,
            free_head: head,
            slot_rec: recs,
            in_partial: false,
            live: true,
        }
    }

    /// A placeholder for a slab table entry not in use.
    pub(crate) fn dead() -> Self {
        Slab {
            stream: 0,
            seg: 0,
            off: 0,
            blk: NIL,
            base: 0,
            obj: 0,
            class: 0,
            capacity: 0,
            used: 0,
            free_head: NIL,
            slot_rec: Vec::new(),
            in_partial: false,
            live: false,
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

    /// Slots free.
    #[inline]
    pub fn free_slots(&self) -> u32 {
        self.capacity - self.used
    }

    /// Takes a free slot: returns its record (still in state Free; the caller makes it
    /// Live). O(1).
    #[inline]
    pub(crate) fn take_slot(&mut self, records: &mut Table<Record>) -> Option<u32> {
        let id = self.free_head;
        if id == NIL {
            return None;
        }
        let r = &mut records[id];
        self.free_head = r.next();
        r.set_next(NIL);
        self.used += 1;
        Some(id)
    }

    /// Returns the slot of record `id` (one of this slab's, just set Free). O(1).
    #[inline]
    pub(crate) fn return_slot(&mut self, records: &mut Table<Record>, id: u32) {
        records[id].set_next(self.free_head);
        self.free_head = id;
        self.used -= 1;
    }

    /// The record of slot `s` (whatever its state).
    #[inline]
    pub fn record_at(&self, s: u32) -> Option<u32> {
        self.slot_rec.get(s as usize).copied()
    }

    /// The records of every slot, for giving them back with the slab.
    pub(crate) fn take_records(&mut self) -> Vec<u32> {
        self.free_head = NIL;
        std::mem::take(&mut self.slot_rec)
    }

    /// Checks the module invariants of slab `id` against the record table.
    pub(crate) fn check(&self, id: u32, records: &Table<Record>) -> Result<(), String> {
        if self.slot_rec.len() != self.capacity as usize {
            return Err(format!(
                "slab: {} slot records for {} slots",
                self.slot_rec.len(),
                self.capacity
            ));
        }
        let mut free = 0u32;
        for (s, &rid) in self.slot_rec.iter().enumerate() {
            let r = records
                .get(rid)
                .ok_or_else(|| format!("slab: slot {s} names record {rid}"))?;
            if !r.slab() || r.seg_or_slab != id || r.blk_or_slot != s as u32 || r.size() != self.obj
            {
                return Err(format!("slab: record {rid} is not slot {s}'s"));
            }
            if r.ptr != self.base + s as u64 * self.obj {
                return Err(format!("slab: record {rid} points elsewhere than slot {s}"));
            }
            if r.state == RecState::Free {
                free += 1;
            } else if r.state == RecState::Cached {
                return Err(format!("slab: record {rid} is cached"));
            }
        }
        let (mut i, mut n) = (self.free_head, 0u32);
        while i != NIL {
            let r = records
                .get(i)
                .ok_or_else(|| format!("slab: free list names record {i}"))?;
            if !r.slab() || r.seg_or_slab != id || r.state != RecState::Free {
                return Err(format!(
                    "slab: free-listed record {i} is not a free slot of it"
                ));
            }
            n += 1;
            if n > self.capacity {
                return Err("slab: the free list loops".into());
            }
            i = r.next();
        }
        if n != free || self.used + n != self.capacity {
            return Err(format!(
                "slab: used {} + free-listed {n} (free records {free}) != capacity {}",
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
    fn free_list_runs_through_the_slot_records() {
        let run = Run {
            seg: 0,
            off: 0,
            blk: 0,
        };
        let (base, obj) = (4096, 256);
        let mut records = Table::from(
            (0..4u64)
                .map(|s| Record::slab_slot(base + s * obj, obj, 7, s as u32, 0))
                .collect::<Vec<_>>(),
        );
        let mut s = Slab::new(0, run, base, obj, 0, vec![0, 1, 2, 3], &mut records);
        s.check(7, &records).unwrap();
        // Slots come out in address order first, then the last returned first.
        let take = |s: &mut Slab, records: &mut Table<Record>| {
            let id = s.take_slot(records)?;
            records[id].state = RecState::Live;
            Some(id)
        };
        assert_eq!(
            (take(&mut s, &mut records), take(&mut s, &mut records)),
            (Some(0), Some(1))
        );
        s.check(7, &records).unwrap();
        records[0].state = RecState::Free;
        s.return_slot(&mut records, 0);
        s.check(7, &records).unwrap();
        assert_eq!(take(&mut s, &mut records), Some(0));
        assert_eq!(
            (
                take(&mut s, &mut records),
                take(&mut s, &mut records),
                take(&mut s, &mut records)
            ),
            (Some(2), Some(3), None)
        );
        assert_eq!(
            (s.used, s.free_slots(), s.record_at(3), s.record_at(4)),
            (4, 0, Some(3), None)
        );
        s.check(7, &records).unwrap();
        // A record freed but not returned to the list is caught.
        records[2].state = RecState::Free;
        assert!(s.check(7, &records).is_err());
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
        // The table agrees with the arithmetic on every size up to small_max.
        for bytes in 1..=(1u64 << 20) {
            assert_eq!(c.class_of(bytes), c.compute_class(bytes), "{bytes}");
        }
        // Classes are strictly increasing.
        assert!((1..c.len()).all(|i| c.size(i) > c.size(i - 1)));
        assert_eq!(c.size(c.len() - 1), 1 << 20);
    }
}
