//! [`TierStats`]: what the tiering layer counted (spills, prefetches, faults, drops and
//! recomputes, stalls, host bytes). Counters only: updated in O(1) where they happen.

use serde::Serialize;

/// What the tiering layer counted. A new field is also sorted into times or totals
/// in [`TierStats::times_since`] (a compile error until it is).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TierStats {
    /// Spills issued (device to host copies) and their bytes.
    pub spills: u64,
    pub spilled_bytes: u64,
    /// Spills that went to the pinned pool / to pageable memory.
    pub spills_warm: u64,
    pub spills_cold: u64,
    /// Bytes copied between the device and pageable host memory (spills that found
    /// no room in the pinned pool, and their way back), and the host time spent inside
    /// those copies: they return only once done, so this is stall that no transfer
    /// wait counts (part of `stall_us`, not of `transfer_stall_us`).
    pub pageable_copied_bytes: u64,
    pub pageable_copy_us: f64,
    /// Spills nothing waits for that the pinned pool turned away
    /// (`TierConfig::early_spills_pinned`): a planned spill refused, or a batch (the
    /// watermark's, or ahead of a forecast) that issued less than it wanted because
    /// the pool had no room for the rest (one per batch, whatever it left out). Many
    /// of them say the pool is smaller than what the policies would move early.
    pub early_spills_refused: u64,
    /// Spills issued on the out-of-memory path (the caller waited for them).
    pub sync_spills: u64,
    /// Spills cancelled because the tensor was accessed while its copy was in flight.
    pub cancelled_spills: u64,
    /// Prefetches issued and their bytes.
    pub prefetches: u64,
    pub prefetched_bytes: u64,
    /// Accesses that found a prefetched tensor ready on the device.
    pub prefetch_hits: u64,
    /// Accesses that found a prefetch still in flight (waited: counted as misses).
    pub prefetch_late: u64,
    /// Accesses of a tensor prefetched from pageable memory: on the device in time, but
    /// the host waited inside that copy's call (`pageable_copy_us`), so nothing was
    /// hidden (counted as misses).
    pub prefetch_blocked: u64,
    /// Accesses of tensors on the host with no prefetch (synchronous fault).
    pub faults: u64,
    pub fault_bytes: u64,
    /// Prefetched tensors freed or spilled again before any access.
    pub prefetch_wasted: u64,
    /// Time the caller waited for transfers (faults, late prefetches, OOM-path spills);
    /// not the host's time inside copies with pageable memory, which block in the copy
    /// call itself (`pageable_copy_us`), so a fault from or an out-of-memory spill to
    /// pageable memory counts mostly there.
    pub transfer_stall_us: f64,
    /// Failed copies and host allocations (tensor kept where it was).
    pub transfer_failures: u64,
    pub host_alloc_failures: u64,
    /// Out-of-memory errors returned.
    pub ooms: u64,
    /// Host bytes holding tensors (warm + cold), now and at peak.
    pub host_bytes: u64,
    pub peak_host_bytes: u64,
    pub accesses: u64,
    /// Of `transfer_stall_us`, the part spent in accesses (faults and late
    /// prefetches); the rest was spent making room for allocations.
    pub access_stall_us: f64,
    /// Of the stall spent making room (the out-of-memory path): waiting for spills
    /// already in flight, for the spills the path issued itself (and their bytes),
    /// and for prefetches in flight.
    pub oom_wait_out_us: f64,
    pub oom_spill_us: f64,
    pub oom_spilled_bytes: u64,
    pub oom_wait_in_us: f64,
    /// Out-of-memory rounds that spilled an address window (`TierConfig::oom_by_address`).
    pub oom_windows: u64,
    /// Out-of-memory rounds that opened an address window by moving its tensors
    /// elsewhere on the device (`TierConfig::relocate`), the bytes moved, and the time
    /// the device copies took (part of `transfer_stall_us`).
    pub relocations: u64,
    pub relocated_bytes: u64,
    pub oom_relocate_us: f64,
    /// Of the access stall: waiting for late prefetches, and faults.
    pub late_prefetch_us: f64,
    pub fault_us: f64,
    /// Tensors dropped instead of spilled, and their bytes.
    pub drops: u64,
    pub dropped_bytes: u64,
    /// Dropped tensors recomputed on the device, their bytes, and the compute time the
    /// recomputes took (stall: the caller waited for them; not in `transfer_stall_us`).
    pub recomputes: u64,
    pub recomputed_bytes: u64,
    pub recompute_us: f64,
    /// Of `recomputes`, those made before an input was freed or written rather than
    /// at the tensor's own access.
    pub early_recomputes: u64,
    /// Swap-ahead rounds that spilled to make room for a predicted read
    /// (`TierConfig::swap_ahead`).
    pub swap_spills: u64,
}

impl TierStats {
    /// `hits / (hits + misses)`, misses = faults + late prefetches + prefetches from
    /// pageable memory; 1 when none.
    pub fn prefetch_hit_rate(&self) -> f64 {
        let n = self.prefetch_hits + self.prefetch_misses();
        if n == 0 {
            1.0
        } else {
            self.prefetch_hits as f64 / n as f64
        }
    }
    /// These counters with the times spent since `earlier` (a copy taken before):
    /// every `_us` field is the difference; counts and bytes stay totals. The pattern
    /// names every field, so a new one must be sorted into times or totals here.
    pub fn times_since(&self, earlier: &TierStats) -> TierStats {
        let TierStats {
            spills: _,
            spilled_bytes: _,
            spills_warm: _,
            spills_cold: _,
            pageable_copied_bytes: _,
            early_spills_refused: _,
            sync_spills: _,
            cancelled_spills: _,
            prefetches: _,
            prefetched_bytes: _,
            prefetch_hits: _,
            prefetch_late: _,
            prefetch_blocked: _,
            faults: _,
            fault_bytes: _,
            prefetch_wasted: _,
            transfer_failures: _,
            host_alloc_failures: _,
            ooms: _,
            host_bytes: _,
            peak_host_bytes: _,
            accesses: _,
            oom_spilled_bytes: _,
            oom_windows: _,
            relocations: _,
            relocated_bytes: _,
            drops: _,
            dropped_bytes: _,
            recomputes: _,
            recomputed_bytes: _,
            early_recomputes: _,
            swap_spills: _,
            pageable_copy_us,
            transfer_stall_us,
            access_stall_us,
            oom_wait_out_us,
            oom_spill_us,
            oom_wait_in_us,
            oom_relocate_us,
            late_prefetch_us,
            fault_us,
            recompute_us,
        } = earlier;
        let mut s = self.clone();
        s.pageable_copy_us -= pageable_copy_us;
        s.transfer_stall_us -= transfer_stall_us;
        s.access_stall_us -= access_stall_us;
        s.oom_wait_out_us -= oom_wait_out_us;
        s.oom_spill_us -= oom_spill_us;
        s.oom_wait_in_us -= oom_wait_in_us;
        s.oom_relocate_us -= oom_relocate_us;
        s.late_prefetch_us -= late_prefetch_us;
        s.fault_us -= fault_us;
        s.recompute_us -= recompute_us;
        s
    }

    pub fn prefetch_misses(&self) -> u64 {
        self.faults + self.prefetch_late + self.prefetch_blocked
    }
}
