//! The small-request path: slots of size-class slabs carved from buddy runs.
//!
//! A request up to `small_max` takes a slot of its class's current slab on the stream
//! (the last slab of the class's partial list): a list read, a bitmap pop and a record
//! revive, no device call. A class with no partial slab takes a spare (an empty slab
//! kept back, `slab_spares`) or carves a new slab from the stream's buddy trees
//! (`obtain_run`, which may grow the device). A freed slot goes back to its slab; an
//! emptied slab becomes a spare or goes back to its tree, and a full slab that frees a
//! slot goes back on its partial list.

use crate::backend::{DeviceBackend, StreamId};
use crate::buddy::BuddyPool;
use crate::error::AllocError;
use crate::pool::{Allocator, RecState, Record, SLAB_TAG};
use crate::slab::Slab;

/// Gives empty slab `id` back: its run to `buddy`, its slot records to the free records,
/// itself to the free slabs.
pub(crate) fn retire_slab(
    slab: &mut Slab,
    id: u32,
    buddy: &mut BuddyPool,
    free_records: &mut Vec<u32>,
    free_slabs: &mut Vec<u32>,
) {
    debug_assert_eq!(slab.used, 0, "retiring a slab in use");
    buddy.free_run(slab.run(), slab.len());
    slab.live = false;
    free_records.extend(slab.take_records());
    free_slabs.push(id);
}

impl<B: DeviceBackend> Allocator<B> {
    /// A slab slot for `bytes`; returns the slot's record id. Hot case: the class has a
    /// partial slab on an existing pool (a slot exists, so the request fits the device).
    #[inline]
    pub(crate) fn alloc_small(&mut self, bytes: u64, stream: StreamId) -> Result<u32, AllocError> {
        let class = self.classes.class_index(bytes);
        let slab_id = match self.pools.get_mut(stream as usize) {
            Some(Some(pool)) => match pool.partial[class].last() {
                Some(&s) => s,
                None => self.small_slab(bytes, stream, class)?,
            },
            _ => self.small_slab(bytes, stream, class)?,
        };
        // The slot's record is the slab's; a small allocation only brings it to life.
        let slab = &mut self.slabs[slab_id];
        let id = slab
            .take_slot(&mut self.records)
            .expect("partial slab has a free slot");
        if slab.free_slots() == 0 {
            slab.in_partial = false;
            if let Some(p) = self.pools[stream as usize].as_mut() {
                p.partial[class].pop();
            }
        }
        self.records[id].revive(bytes);
        self.stats.slab_allocs += 1;
        Ok(id)
    }

    /// No partial slab of `class` on `stream` (or no pool yet): a spare, else a new
    /// slab. Returns the slab, now on the class's partial list.
    #[cold]
    #[inline(never)]
    fn small_slab(
        &mut self,
        bytes: u64,
        stream: StreamId,
        class: usize,
    ) -> Result<u32, AllocError> {
        self.check_size(bytes)?;
        let obj = self.classes.size(class);
        let pool = self.pool_mut(stream)?;
        if let Some(&s) = pool.partial[class].last() {
            return Ok(s);
        }
        if let Some(s) = pool.spares[class].pop() {
            pool.partial[class].push(s);
            self.slabs[s].in_partial = true;
            return Ok(s);
        }
        self.new_slab(stream, class, obj)
    }

    fn new_slab(&mut self, stream: StreamId, class: usize, obj: u64) -> Result<u32, AllocError> {
        let capacity = (self.cfg.slab_min_bytes / obj)
            .max(self.cfg.slab_objects)
            .max(1);
        let len = capacity * obj;
        let id = match self.free_slabs.pop() {
            Some(i) => i,
            None => {
                self.slabs.push(Slab::dead());
                (self.slabs.len() - 1) as u32
            }
        };
        self.slabs[id].live = false;
        let run = match self.obtain_run(stream, len, SLAB_TAG | id, true) {
            Ok(x) => x,
            Err(e) => {
                self.free_slabs.push(id);
                return Err(e);
            }
        };
        self.stats.slabs_carved += 1;
        let pool = self.pools[stream as usize].as_mut().expect("pool exists");
        let base = pool.buddy.segs[run.seg].base + run.off;
        pool.partial[class].push(id);
        // One record per slot, for the slab's life (O(capacity) here, none per alloc).
        let recs: Vec<u32> = (0..capacity)
            .map(|slot| {
                self.new_record(Record::slab_slot(
                    base + slot * obj,
                    obj,
                    id,
                    slot as u32,
                    stream,
                ))
            })
            .collect();
        let mut slab = Slab::new(
            stream,
            run,
            base,
            obj,
            class as u32,
            recs,
            &mut self.records,
        );
        slab.in_partial = true;
        self.slabs[id] = slab;
        Ok(id)
    }

    /// Returns slot record `id` to slab `slab_id`. Hot case (the slab stays partly
    /// used and on its partial list): a list push and a compare.
    #[inline(always)]
    pub(crate) fn free_slot(&mut self, id: u32, slab_id: u32) {
        self.records[id].state = RecState::Free;
        let slab = &mut self.slabs[slab_id];
        slab.return_slot(&mut self.records, id);
        if slab.used == 0 || !slab.in_partial {
            self.slab_changed_list(slab_id);
        }
    }

    /// Slab `slab_id` just became empty (a spare, or back to its tree) or just got a
    /// free slot while full (back on its partial list).
    #[cold]
    #[inline(never)]
    fn slab_changed_list(&mut self, slab_id: u32) {
        let slab = &mut self.slabs[slab_id];
        let (class, stream) = (slab.class as usize, slab.stream);
        let pool = self.pools[stream as usize]
            .as_mut()
            .expect("pool of a slab");
        if slab.used == 0 {
            // Empty: off the partial list; kept as a spare of its class, or, if the
            // class has enough, back to the buddy tree.
            if slab.in_partial {
                let list = &mut pool.partial[class];
                if let Some(pos) = list.iter().rposition(|&s| s == slab_id) {
                    list.swap_remove(pos);
                }
                slab.in_partial = false;
            }
            // An active release policy wants memory back promptly: no spares then.
            if pool.spares[class].len() < self.cfg.slab_spares as usize && !self.release_active {
                pool.spares[class].push(slab_id);
                return;
            }
            let seg = slab.seg;
            retire_slab(
                slab,
                slab_id,
                &mut pool.buddy,
                &mut self.free_records,
                &mut self.free_slabs,
            );
            let _ = self.maybe_release_segment(stream, seg);
        } else {
            slab.in_partial = true;
            pool.partial[class].push(slab_id);
        }
    }
}
