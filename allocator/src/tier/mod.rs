//! Tiered memory: tensors move between device memory and host memory while the
//! caller's handle stays valid. Reactive policies by default; predictive tiers
//! ([`predictive`]) replace the policies and add a demand forecast, never the
//! mechanisms.
//!
//! Tiers:
//! - **hot**: device memory, from the crate's [`Allocator`](crate::Allocator) under a
//!   byte budget (a [`Limit`](crate::backend::layers::Limit) layer in replay);
//! - **warm**: one pinned host buffer allocated once at start and sub-allocated
//!   ([`staging::StagingPool`]): pinned allocation costs ~0.6 ms per MiB on an H200
//!   host, so it is never done on the hot path; copies run at ~55 GB/s;
//! - **cold**: pageable host buffers, one per tensor, when the staging pool is full
//!   (copies at 8-18 GB/s, holding the host until done): for the out-of-memory path's
//!   spills and explicit [`TierManager::spill`]s only, unless
//!   `TierConfig::early_spills_pinned` is off. A disk tier (mmap) is not implemented.
//!
//! One concern per file:
//! - [`handle`]: handles, the registry of tensors and where each one is;
//! - [`staging`]: the pinned staging pool (warm tier) and host locations;
//! - [`stats`]: the counters of [`TierStats`];
//! - [`spill`]: victim choice: the [`spill::SpillPolicy`] (LRU-K, K = 2) and
//!   [`spill::MigrationCost`] (bytes / link bandwidth + recompute time x probability)
//!   traits with the reactive implementations;
//! - [`prefetch`]: the [`prefetch::PrefetchPolicy`] trait; the reactive baseline
//!   prefetches in the order tensors were accessed in the previous iteration;
//!   [`stream`]: predictive mode's prefetches of the first iteration, which has no
//!   previous one, following the reads that bring tensors back;
//! - [`transfer`]: the asynchronous pipeline: low-priority streams, copies in flight
//!   with their events, releases that wait for them (dependency tracking);
//! - [`manager`]: [`TierManager`], the mechanism tying these together; `host`: its
//!   host buffers (pinned or pageable) and the copies to and from them
//!   (`register` / `access` / `spill` / `prefetch` / `free`), with watermark and
//!   out-of-memory handling in `pressure`;
//! - [`schedule`]: the iteration plan (which tensors leave, when, and come back), with
//!   [`occupancy`] the link's timelines it may model; [`planned`] carries plans out;
//!   [`floor`] the peak floor no policy that moves tensors goes below;
//! - [`predictive`]: the demand forecast, spills ahead of a forecast peak, victims by
//!   predicted next use;
//! - [`recompute`]: dropping a tensor whose producer is known instead of spilling it,
//!   and recomputing it on its next access;
//! - [`access`]: the access model for traces without reads (PyTorch snapshots);
//! - [`replay`]: budgeted replay of a trace and its [`replay::TierReport`].
//!
//! See docs/tiers.md for the cost model, the measured replay table and how to
//! reproduce it.

pub mod access;
pub mod budget;
pub mod directives;
pub mod floor;
mod guard;
pub mod handle;
mod host;
pub mod manager;
pub mod occupancy;
pub mod planned;
pub mod predictive;
pub mod prefetch;
mod prefetching;
mod pressure;
pub mod recompute;
mod relocate;
pub mod replay;
mod replay_options;
pub mod report;
pub mod schedule;
pub mod spill;
pub mod staging;
pub mod stats;
mod steps;
pub mod stream;
mod swap;
pub mod transfer;

#[cfg(test)]
mod deferred;
#[cfg(test)]
mod recompute_tests;
#[cfg(test)]
mod replay_tests;
#[cfg(test)]
mod split_tests;
#[cfg(test)]
mod stuck_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod window_tests;

use serde::{Deserialize, Serialize};

use crate::backend::BackendError;
use crate::error::AllocError;

pub use handle::TensorHandle;
pub use manager::{TierManager, TierStats};
pub use replay::{replay_budgeted, Budget, TierReplayOptions, TierReport};

/// Knobs of the tiering layer. Defaults are what `memcast replay --policy reactive` uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TierConfig {
    /// Device budget in bytes: the watermarks are fractions of it.
    pub budget: u64,
    /// Start spilling (asynchronously) when allocated device bytes would pass
    /// `high_watermark x budget` (default 90%).
    pub high_watermark: f64,
    /// Spill down to `low_watermark x budget` (hysteresis: spills come in batches).
    pub low_watermark: f64,
    /// Prefetches may fill the device up to `prefetch_watermark x budget`.
    pub prefetch_watermark: f64,
    /// Bytes of the pinned staging pool (warm tier), allocated once at start.
    pub staging_bytes: u64,
    /// How many accesses ahead of the current one the prefetcher looks.
    pub prefetch_window: usize,
    /// K of LRU-K.
    pub lru_k: usize,
    /// Spill last the tensors the prefetch policy expects to be accessed soon (off by
    /// default: mixed results, see docs/tiers.md).
    pub protect_upcoming: bool,
    /// Drop a victim instead of spilling it when it is recomputable and its recompute
    /// time is below the link time the spill is expected not to hide
    /// ([`recompute`]); off by default.
    pub recompute: bool,
    /// Iteration plans model the link's occupancy while choosing gaps
    /// ([`schedule::LinkModel::occupancy`]); off by default: not better on the
    /// corpus's validation split (docs/predictive.md).
    pub plan_occupancy: bool,
    /// Iteration plans bring a tensor whose gap wraps (last used in this iteration,
    /// next in the next one: weights read in the forward only) back once the link in
    /// is idle after its planned point (the backward's tensors are back), at the latest
    /// from the next iteration's start, instead of at that point ([`planned`]); on by
    /// default (docs/predictive.md).
    pub plan_defer_wraps: bool,
    /// Past the end of the trajectory an iteration plan with moves came from (a
    /// generation request longer than the one it was planned from), plan the period the
    /// iteration repeats, one period ahead (`tier::steps`); on by default
    /// (docs/predictive.md, "Step plans").
    pub plan_steps: bool,
    /// Re-plan an iteration of an input shape not seen before from an earlier
    /// iteration that agrees with it so far, its bytes mapped to this one's
    /// (`tier::planned::morph`); on by default (docs/predictive.md, "Plans for a new
    /// shape").
    pub plan_new_shapes: bool,
    /// Iterations of an input shape run without a plan while the last planned one of
    /// that shape stalled more per byte above the budget than the last one without
    /// ([`planned::Guard`]); on by default (docs/predictive.md, "The plan guard").
    pub plan_guard: bool,
    /// On an out-of-memory retry with enough free bytes for the request (the failure
    /// is fragmentation), spill exactly the tensors of the cheapest address window that
    /// would hold the request (`Allocator::cheapest_window`, cost = the migration
    /// cost), so one round of spills opens the block; the spill policy's order is the
    /// fallback. On by default: better mean stall on the corpus's validation split and
    /// on the bundled traces, reactive and predictive (docs/tiers.md).
    pub oom_by_address: bool,
    /// On an out-of-memory retry with enough free bytes for the request (the failure is
    /// fragmentation), first open the address window holding the fewest movable bytes
    /// by moving its tensors into free blocks outside it, device to device
    /// (`tier/relocate.rs`), before anything goes over the link. On by default: lower mean
    /// stall on the corpus's train and validation splits, reactive and predictive
    /// (docs/tiers.md, "Relocation").
    pub relocate: bool,
    /// Spills that nothing waits for (the watermark's batches, spills ahead of a
    /// forecast peak, an iteration plan's moves) go only to the pinned pool: with no
    /// room there they are not issued. A copy to pageable memory returns only once it
    /// is done, so such a spill blocks the host as long as a spill on the
    /// out-of-memory path would and gains nothing by starting early; the
    /// out-of-memory path still spills to pageable memory when it must. On by default:
    /// with the default pool (the trace's peak) no replay of the corpus's train and
    /// validation splits reaches pageable memory; with a pool of a quarter of the peak
    /// the mean stall of every column falls on both splits (reactive lower on all 25
    /// train traces, predictive on 22 of 25; docs/tiers.md, "Copies to pageable
    /// memory"). Cost: a batch that nothing waits for skips the tensors the pool has no
    /// room for, and with a full pool is one compare.
    pub early_spills_pinned: bool,
    /// Spills in flight count as gone when deciding whether an allocation crosses the
    /// high watermark, as they already do when sizing the batch. Off (the default),
    /// their bytes still count as allocated until their copies land, so each allocation
    /// above the high watermark in that time spills up to its own size, choosing its
    /// victims from a list of its own (O(n log n) in the live tensors per allocation);
    /// on, a batch is spilled once the mark is crossed and none until it is crossed
    /// again (where the batch reached the low watermark: one cut short by the pinned
    /// pool or the candidates leaves the next allocation above the mark).
    /// Measured (docs/tiers.md, "Spill hysteresis"): on the corpus at 60% it lowers
    /// reactive tiers' stall on every split and timeline and leaves predictive's level
    /// held out (test 1.4704 -> 1.4684), but on the bundled GPT-2 generation trace
    /// predictive's stall rises 0.02 -> 0.08 (the oracle's forecast stays at 0.02: one
    /// batch per crossing falls behind bursts of allocations, which then wait at the
    /// out-of-memory path), and on an H100 12 test traces read level within one run's
    /// noise. An exception for allocations that would pass the budget (they spill at
    /// once, as without hysteresis) brought generation back to 0.02 but raised reactive
    /// tiers' stall by more than a third on two bundled traces (the same section). Off
    /// by default.
    pub spill_hysteresis: bool,
    /// Swap ahead (`tier::swap`): with the link idle both ways and no plan in charge,
    /// spill tensors predicted to be read later than a read the prefetch policy
    /// predicts past the previous iteration's end and has no room for, so that it comes
    /// back before that read. Replay turns it on with predictive mode's `prefetch`
    /// action; off by default (the reactive baseline).
    pub swap_ahead: bool,
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            budget: u64::MAX,
            high_watermark: 0.90,
            low_watermark: 0.80,
            prefetch_watermark: 0.80,
            staging_bytes: 1 << 30,
            prefetch_window: 2048,
            lru_k: 2,
            protect_upcoming: false,
            recompute: false,
            plan_occupancy: false,
            plan_defer_wraps: true,
            plan_steps: true,
            plan_new_shapes: true,
            plan_guard: true,
            oom_by_address: true,
            relocate: true,
            early_spills_pinned: true,
            spill_hysteresis: false,
            swap_ahead: false,
        }
    }
}

impl TierConfig {
    /// Checks the fractions are ordered and in (0, 1].
    pub fn validate(&self) -> Result<(), TierError> {
        let ok = |x: f64| x > 0.0 && x <= 1.0;
        if !(ok(self.high_watermark) && ok(self.low_watermark) && ok(self.prefetch_watermark)) {
            return Err(TierError::Config(format!(
                "watermarks must be in (0, 1]: high {}, low {}, prefetch {}",
                self.high_watermark, self.low_watermark, self.prefetch_watermark
            )));
        }
        if self.low_watermark > self.high_watermark {
            return Err(TierError::Config(format!(
                "low watermark {} above high watermark {}",
                self.low_watermark, self.high_watermark
            )));
        }
        if self.lru_k == 0 || self.lru_k > handle::MAX_K {
            return Err(TierError::Config(format!(
                "lru_k = {} outside 1..={}",
                self.lru_k,
                handle::MAX_K
            )));
        }
        if self.budget == 0 {
            return Err(TierError::Config("zero device budget".into()));
        }
        Ok(())
    }
}

/// Errors of the tiering layer. After any `Err` every registered tensor is still in
/// exactly one valid place (device, host, or dropped and recomputable) with its bytes: `check_invariants()` holds.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TierError {
    /// The tensors that must be on the device at once do not fit in the budget.
    #[error(
        "out of device memory: {requested} bytes needed with {in_use} bytes held by tensors \
         in use or in flight, budget {budget}: short by {short} bytes{detail}"
    )]
    OutOfMemory {
        requested: u64,
        in_use: u64,
        budget: u64,
        short: u64,
        /// Extra explanation (fragmentation), empty if none.
        detail: String,
    },
    /// A handle that was never issued or was already freed.
    #[error("unknown or freed tensor handle {0}")]
    UnknownHandle(TensorHandle),
    /// A transfer or a host allocation failed; the tensor stayed where it was.
    #[error("transfer of tensor {handle} failed, tensor kept where it was: {source}")]
    Transfer {
        handle: TensorHandle,
        #[source]
        source: BackendError,
    },
    /// At shutdown: copies whose stream cannot be synchronized may still use their
    /// buffers, so the pinned pool and the allocator are not given back.
    #[error(
        "{transfers} copies hold their buffers and their stream cannot be synchronized: {source}"
    )]
    Stuck {
        transfers: usize,
        #[source]
        source: BackendError,
    },
    #[error("device allocator: {0}")]
    Alloc(#[from] AllocError),
    #[error("device backend: {0}")]
    Backend(#[from] BackendError),
    #[error("tier configuration: {0}")]
    Config(String),
    /// The pinned staging pool (`TierConfig::staging_bytes`) could not be allocated.
    #[error("pinned staging pool of {bytes} bytes (`staging_bytes`): {source}")]
    Staging {
        bytes: u64,
        #[source]
        source: BackendError,
    },
    /// `set_recomputable` refused: the tensor cannot be declared recomputable.
    #[error("tensor {handle} cannot be declared recomputable: {why}")]
    NotRecomputable {
        handle: TensorHandle,
        why: &'static str,
    },
    /// `check_invariants()` found the bookkeeping broken (a bug).
    #[error("tier invariant violated: {0}")]
    Invariant(String),
}
