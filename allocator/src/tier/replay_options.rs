//! The settings of a budgeted replay ([`TierReplayOptions`]) and the budget it can
//! run in: at least one segment ([`check_budget`]), one arena ([`arena_bytes`]).

use crate::backend::sim::CostModel;
use crate::config::{Actions, AllocConfig};
use crate::replay::{Device, ReplayForecaster};

use super::budget::Budget;
use super::directives::Plan;
use super::replay::TierReplayError;
use super::TierConfig;

/// Settings of a budgeted replay.
#[derive(Debug, Clone)]
pub struct TierReplayOptions {
    pub budget: Budget,
    pub device: Device,
    /// `true`: the reactive prefetcher; `false`: none (every use of a spilled tensor
    /// faults).
    pub prefetch: bool,
    /// The tier knobs (`budget` and, if 0, `staging_bytes` are set by the replay).
    pub tier: TierConfig,
    /// The device allocator's settings (default: memcast's, with fixed segments).
    pub alloc: AllocConfig,
    /// Recompute probability given to tensors with a recompute cost (synthetic traces).
    pub recompute_prob: f64,
    /// Run `check_invariants()` every N operations (0 = never).
    pub check_every: u64,
    /// Largest working set of one step, as a fraction of the budget: a step that
    /// accesses more is split (see the module docs).
    pub max_step_fraction: f64,
    /// Predictive tiers: the forecaster and the actions it drives (`None`: reactive).
    pub predictive: Option<(ReplayForecaster, Actions)>,
    /// With fixed segments: the allocator's first large segment is the whole budget
    /// (less room for two slab segments), so that the budget is one arena and no
    /// segment is freed and re-created under pressure (see [`arena_bytes`]).
    pub arena: bool,
    /// A plan to execute ([`super::directives`]): its spills, prefetches and drops
    /// replace the reactive prefetcher, and spills of the replay's own start only when
    /// an allocation would not fit otherwise.
    pub plan: Option<Plan>,
    /// Compute time from the GPU's timeline as modelled by
    /// [`memcast_trace::timeline::spread_final_waits`] (each iteration's final wait,
    /// where a host that ran ahead of the GPU waited, spread over the iteration)
    /// instead of the trace's event times.
    pub spread_waits: bool,
    /// The simulated device's costs (`Device::Sim`) and the link the policies and the
    /// floors assume (every device): the H200's by default, [`CostModel::h100`] for
    /// timelines recorded on an H100.
    pub costs: CostModel,
}

impl Default for TierReplayOptions {
    fn default() -> Self {
        TierReplayOptions {
            budget: Budget::Fraction(1.0),
            device: Device::Sim,
            prefetch: true,
            tier: TierConfig {
                staging_bytes: 0,
                ..TierConfig::default()
            },
            // Fixed segments: a segment emptied by spills goes back to the budget whole,
            // where a growable one only shrinks from its end (measured in docs/tiers.md:
            // ResNet-50 at 100%: stall 308 ms vs 1076 ms with growable segments).
            alloc: AllocConfig {
                growable_segments: false,
                ..AllocConfig::default()
            },
            recompute_prob: 0.5,
            check_every: 0,
            max_step_fraction: 0.5,
            predictive: None,
            arena: true,
            plan: None,
            spread_waits: false,
            costs: CostModel::default(),
        }
    }
}

/// A budget in which anything fits: every device allocation is at least one granule
/// of the allocator (`segment_granule`, or the backend's page where that is larger),
/// so a budget below one holds none.
pub(super) fn check_budget(budget: u64, granule: u64) -> Result<(), TierReplayError> {
    use memcast_trace::stats::human_bytes;
    if budget < granule {
        return Err(TierReplayError::Budget(format!(
            "{} is less than one segment of the allocator ({}, `segment_granule` or the \
             device's page, whichever is larger): every device allocation is at least \
             that, so nothing fits",
            human_bytes(budget),
            human_bytes(granule)
        )));
    }
    Ok(())
}

/// The arena a budget of `budget` bytes gets: the budget rounded down to the segment
/// granule, less two slab chunks (slab segments are separate; without room for them
/// small requests under pressure free and re-create segments: on ResNet-50 at 60%,
/// an arena of the whole budget made 211 device calls, this one 2).
pub fn arena_bytes(budget: u64, cfg: &AllocConfig) -> u64 {
    let granule = cfg.segment_granule.max(1);
    let small = 2 * cfg.growth_small_chunk.max(granule);
    (budget / granule * granule)
        .saturating_sub(small)
        .max(granule)
}
