//! The report of a budgeted replay (`memcast replay --budget B --json`).

use serde::Serialize;

use super::access::AccessModel;
use super::directives::PlanRun;
use crate::replay::Device;

/// What a budgeted replay measured (the `--json` output).
#[derive(Debug, Clone, Serialize)]
pub struct TierReport {
    pub trace: String,
    pub policy: &'static str,
    /// The demand forecaster of predictive tiers (`none` when reactive).
    pub forecaster: &'static str,
    /// The spill policy (`lru-k`, `farthest-next-use`) and the prefetcher.
    pub spill_policy: &'static str,
    pub prefetcher: &'static str,
    pub device: Device,
    pub access_model: AccessModel,
    /// Where compute time came from: `host` (the trace's event times) or
    /// `spread-final-waits` (each iteration's final wait spread over it,
    /// `memcast_trace::timeline`).
    pub timeline: &'static str,
    pub completed: bool,
    pub ooms: u64,
    /// The error that stopped the replay (names the step and the bytes short).
    pub error: Option<String>,
    pub budget_bytes: u64,
    pub peak_requested_bytes: u64,
    pub budget_fraction: f64,
    pub compute_us: f64,
    /// The stall and every time below that is a part of it count from the end of the
    /// setup (its time is `setup_us`); counts and bytes include the setup's.
    pub stall_us: f64,
    pub transfer_stall_us: f64,
    /// Of `transfer_stall_us`, the part spent in accesses (faults and late prefetches);
    /// the rest was spent making room for allocations (the out-of-memory path).
    pub access_stall_us: f64,
    /// The parts of the transfer stall: the out-of-memory path waiting for spills in
    /// flight, for its own spills (and their bytes), for prefetches in flight; late
    /// prefetches and faults.
    pub oom_wait_out_us: f64,
    pub oom_spill_us: f64,
    pub oom_spilled_bytes: u64,
    pub oom_wait_in_us: f64,
    /// The out-of-memory path's rounds that opened a block by moving tensors on the
    /// device instead (`TierConfig::relocate`), the bytes moved, the time the copies
    /// took (part of the transfer stall).
    pub relocations: u64,
    pub relocated_bytes: u64,
    pub oom_relocate_us: f64,
    pub late_prefetch_us: f64,
    pub fault_us: f64,
    /// Bytes faulted in (synchronously, on access).
    pub fault_bytes: u64,
    pub stall_overhead: f64,
    /// The link-bound floor: the stall no policy can avoid if every byte above the
    /// budget leaves and comes back once per iteration over the measured pinned
    /// bandwidths, fully overlapped with compute and with the other direction:
    /// `max(0, iterations x (peak - budget) / duplex bandwidth - compute)`, and as a
    /// share of compute.
    pub link_floor_us: f64,
    pub link_floor_overhead: f64,
    /// The peak floor: per iteration, the least stall any policy that moves whole
    /// tensors needs to get the bytes above the budget at the iteration's peaks off
    /// the device before them and back after them, each tensor no earlier than its
    /// last use and no later than its next (see `tier::floor::iteration_floor`),
    /// summed; and as a share of compute. A lower bound (`link_floor_us` is an
    /// estimate: it assumes every byte above the budget moves every iteration).
    pub peak_floor_us: f64,
    pub peak_floor_overhead: f64,
    pub spills: u64,
    pub spilled_bytes: u64,
    /// Spills started ahead of a forecast peak (predictive tiers).
    pub ahead_spills: u64,
    /// Swap-ahead rounds: spills made to bring back a read the prefetcher predicted
    /// and had no room for (predictive tiers' `prefetch` action).
    pub swap_spills: u64,
    /// Planned tiers (`predictive_actions` with `plan`): moves the iteration plans
    /// held, and the spills and prefetches the plan issued (0 without a plan).
    pub planned_moves: u64,
    pub planned_spills: u64,
    /// Drops the plan issued (with the `recompute` action).
    pub planned_drops: u64,
    pub planned_prefetches: u64,
    /// Plans replaced within an iteration by one from an earlier iteration of the same
    /// shape (its first allocations).
    pub planned_replans: u64,
    /// Step plans: the period an iteration repeats, planned past the end of its
    /// plan's trajectory (`tier::steps`).
    pub planned_step_plans: u64,
    /// Re-plans of an iteration of a shape not seen before from an earlier iteration,
    /// its bytes mapped (`tier::planned::morph`; counted in `planned_replans` too).
    pub planned_new_shape_plans: u64,
    /// Planned moves skipped at run time (the tensor gone, elsewhere, or of other
    /// bytes than planned).
    pub planned_skipped: u64,
    /// Iterations the plan guard ran without a plan (`TierConfig::plan_guard`: the
    /// last planned iteration of their shape stalled more per byte above the budget
    /// than the last unplanned one).
    pub planned_suppressed: u64,
    /// Tensors dropped instead of spilled (`TierConfig::recompute` or the `recompute`
    /// action) and their bytes; recomputes of dropped tensors, their bytes and their
    /// compute time (part of `stall_us`, not of `transfer_stall_us`).
    pub drops: u64,
    pub dropped_bytes: u64,
    pub recomputes: u64,
    pub recomputed_bytes: u64,
    pub recompute_us: f64,
    pub prefetches: u64,
    pub prefetched_bytes: u64,
    pub prefetch_hits: u64,
    pub prefetch_misses: u64,
    /// `prefetch_hits / (prefetch_hits + prefetch_misses)`; 1 when no spilled tensor
    /// was read back (nothing could miss).
    pub prefetch_hit_rate: f64,
    pub faults: u64,
    pub late_prefetches: u64,
    /// Accesses of tensors prefetched from pageable memory (misses: the host waited
    /// inside the copy call).
    pub blocked_prefetches: u64,
    pub wasted_prefetches: u64,
    pub cancelled_spills: u64,
    pub sync_spills: u64,
    /// Spills nothing waits for that the pinned pool turned away (not issued): planned
    /// spills, and batches (the watermark's, ahead of a forecast) cut short, one each.
    pub early_spills_refused: u64,
    /// Bytes copied to or from pageable host memory (what the pinned pool had no room
    /// for) and the host time inside those copies, which return only once done (part
    /// of `stall_us`, not of `transfer_stall_us`).
    pub pageable_copied_bytes: u64,
    pub pageable_copy_us: f64,
    pub peak_reserved_bytes: u64,
    /// `peak_reserved / peak_requested - 1` (under a budget, usually negative).
    pub reserved_overhead: f64,
    /// Reserved device bytes, time-weighted by compute time.
    pub mean_reserved_bytes: f64,
    pub peak_allocated_bytes: u64,
    pub peak_host_bytes: u64,
    /// Device calls of the allocator (segment maps/unmaps) and its out-of-memory retries.
    pub device_allocs: u64,
    pub device_frees: u64,
    /// Every allocator device call here is made inside a request (the allocator under
    /// the tiers runs reactive), and the host time of device calls (the stall beyond
    /// the waits for transfers, the copies with pageable memory and the recomputes).
    pub critical_path_device_calls: u64,
    pub critical_path_device_us: f64,
    /// Fragmentation of the device allocator, sampled every 256 operations,
    /// time-weighted mean and max (instants with at least 1% of reserved bytes free).
    pub mean_fragmentation: f64,
    pub max_fragmentation: f64,
    pub alloc_oom_retries: u64,
    pub staging_bytes: u64,
    /// Setup time (pinned pool + static blocks), not in `stall_us`.
    pub setup_us: f64,
    pub operations: u64,
    /// Stall of each iteration (between consecutive boundaries), us.
    pub stall_per_iteration_us: Vec<f64>,
    /// Compute of each iteration (the trace's gaps between consecutive boundaries), us:
    /// with `stall_per_iteration_us`, the predicted time of each step.
    pub compute_per_iteration_us: Vec<f64>,
    /// What the replay did with `--plan` (`None` without one).
    pub plan: Option<PlanRun>,
    /// Trace events and static blocks replayed, and their rate.
    pub events: u64,
    pub events_per_sec: f64,
    pub wall_secs: f64,
}
