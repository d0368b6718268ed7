//! Budgeted replay: a trace under a device budget with spilling and prefetching
//! (`memcast replay TRACE --budget B --policy reactive`).
//!
//! Setup (not counted as stall, like the job's own start-up): the pinned staging pool
//! is allocated and the static blocks are registered. Then the trace's operations
//! under the [`access`](super::access) model run in order, the clock advancing by the
//! trace's timestamps (compute time); the report's stall is the time the host was
//! blocked beyond that (device mallocs and frees, waits for transfers).
//!
//! Metrics: `compute_us` = the trace's span; `stall_us` = backend stall during the
//! replay; `stall_overhead = stall_us / compute_us`; prefetch hit rate = hits /
//! (hits + misses), a miss being an access that waited for a transfer (fault or late
//! prefetch). A step (the tensors one kernel needs at once, pinned together) whose
//! accesses exceed `max_step_fraction x budget` is split into several: multi-tensor
//! kernels such as the fused optimizer step (`multi_tensor_apply`) process their tensor
//! lists in chunks, so they never need every parameter, gradient and optimizer state
//! on the device at once. An out-of-memory is not an `Err`: the report says `completed: false`
//! and `error` names the step and the bytes short.

use std::collections::HashMap;
use std::time::Instant;

use memcast_trace::Trace;

use crate::backend::host::HostBackend;
use crate::backend::layers::Limit;
use crate::backend::sim::{SimBackend, H200_CAPACITY};
use crate::backend::DeviceBackend;
use crate::config::AllocConfig;
use crate::pool::Allocator;
use crate::replay::Device;

use super::access::{ops, AccessModel, OpKind};
use super::directives::{Plan, PlanRun};

use super::handle::TensorHandle;
use super::manager::{TensorOpts, TierManager};
use super::planned::{Guard, Planner};
use super::predictive::Demand;
use super::prefetch::{NoPrefetch, PrefetchPolicy, PreviousIterationOrder};
use super::recompute::TimeOnly;
use super::schedule::LinkModel;
use super::spill::{FarthestNextUse, LinkCost, LruK, SpillPolicy};
use super::{TierConfig, TierError};
use crate::replay::ReplayForecaster;

pub use super::budget::{Budget, BUDGET_SYNTAX};
use super::replay_options::check_budget;
pub use super::replay_options::{arena_bytes, TierReplayOptions};

pub use super::report::TierReport;

/// Errors that are not out-of-memory: a malformed trace or a backend failure.
#[derive(Debug, thiserror::Error)]
pub enum TierReplayError {
    #[error("{what}")]
    Trace { what: String },
    /// `TierReplayOptions::costs` is not a usable cost model (`CostModel::validate`).
    #[error("cost model: {0}")]
    Costs(String),
    #[error("{0}")]
    Stats(#[from] memcast_trace::TraceError),
    #[error("setup: {0}")]
    Setup(#[source] TierError),
    /// A budget no device of the replay can hold, or in which nothing fits.
    #[error("budget: {0}")]
    Budget(String),
}

/// Replays `trace` under `opts.budget`. See the module docs.
pub fn replay_budgeted(
    trace: &Trace,
    opts: &TierReplayOptions,
) -> Result<TierReport, TierReplayError> {
    opts.costs.validate().map_err(TierReplayError::Costs)?;
    let spread;
    let trace = if opts.spread_waits {
        spread = memcast_trace::timeline::spread_final_waits(trace);
        &spread
    } else {
        trace
    };
    let peak = memcast_trace::stats::TraceStats::compute(trace)?.peak_requested_bytes;
    let budget = opts.budget.bytes(peak);
    super::budget::within_max(budget).map_err(TierReplayError::Budget)?;
    let mut cfg = opts.tier.clone();
    cfg.budget = budget;
    if let Some(plan) = &opts.plan {
        plan.check(trace)
            .map_err(|what| TierReplayError::Trace { what })?;
        // The plan moves tensors; the replay spills only what would not fit otherwise.
        cfg.high_watermark = 1.0;
        cfg.prefetch_watermark = 1.0;
    }
    let mut alloc_cfg = opts.alloc.clone();
    if opts.arena && !alloc_cfg.growable_segments {
        let arena = arena_bytes(budget, &alloc_cfg);
        alloc_cfg.growth_initial = arena;
        alloc_cfg.growth_cap = alloc_cfg.growth_cap.max(arena);
    }

    if cfg.staging_bytes == 0 {
        // As much pinned memory as the trace's peak: a tensor in flight has a copy on
        // both sides, so what is on the host can exceed `peak - budget`; a smaller
        // pool sends the rest to pageable memory at a quarter of the bandwidth.
        cfg.staging_bytes = peak.max(64 << 20);
    }
    match opts.device {
        Device::Sim => {
            let b = Limit::new(
                SimBackend::new(H200_CAPACITY.max(budget), opts.costs.clone()),
                budget,
            );
            run(trace, b, cfg, &alloc_cfg, opts, peak)
        }
        Device::Host => {
            let b = Limit::new(HostBackend::new(budget), budget);
            run(trace, b, cfg, &alloc_cfg, opts, peak)
        }
        Device::Cuda => {
            let b = crate::backend::cuda::CudaBackend::new(0)
                .map_err(|e| TierReplayError::Setup(crate::AllocError::from(e).into()))?;
            run(trace, Limit::new(b, budget), cfg, &alloc_cfg, opts, peak)
        }
    }
}

fn run<B: DeviceBackend>(
    trace: &Trace,
    backend: B,
    cfg: TierConfig,
    alloc_cfg: &AllocConfig,
    opts: &TierReplayOptions,
    peak: u64,
) -> Result<TierReport, TierReplayError> {
    let wall = Instant::now();
    check_budget(
        cfg.budget,
        alloc_cfg.segment_granule.max(backend.granularity()),
    )?;
    let alloc =
        Allocator::new(backend, alloc_cfg.clone()).map_err(|e| TierReplayError::Setup(e.into()))?;
    let prefetch: Box<dyn PrefetchPolicy> = if opts.prefetch && opts.plan.is_none() {
        let mut p = PreviousIterationOrder::new(cfg.prefetch_window);
        // Predictive mode's `prefetch` action also predicts the reads of tensors of
        // shapes the previous iteration did not have ...
        p.new_shapes = matches!(opts.predictive, Some((_, a)) if a.prefetch);
        // ... and, in the first iteration, follows the reads that bring tensors back.
        p.stream = p.new_shapes;
        Box::new(p)
    } else {
        Box::new(NoPrefetch)
    };
    let staging_bytes = cfg.staging_bytes;
    let budget = cfg.budget;
    let lru = LruK { k: cfg.lru_k };
    let spill: Box<dyn SpillPolicy> = match opts.predictive {
        Some((_, a)) if a.spill => Box::new(FarthestNextUse { lru }),
        _ => Box::new(lru),
    };
    let spill_policy = spill.name();
    let mut cfg = cfg;
    if let Some((_, a)) = opts.predictive {
        cfg.recompute |= a.recompute;
        // The `prefetch` action also swaps ahead for the reads it predicts past the
        // previous iteration's end.
        cfg.swap_ahead |= a.prefetch;
    }
    let mut m = TierManager::with_policies(
        alloc,
        cfg.clone(),
        spill,
        Box::new(LinkCost {
            model: opts.costs.clone(),
        }),
        prefetch,
    )
    .map_err(TierReplayError::Setup)?;
    if let Some((fk, actions)) = opts.predictive {
        // The oracle reads the events the manager will feed: registrations of
        // non-empty tensors, their frees, the boundaries.
        let forecaster = fk
            .build(&opts.alloc, || crate::replay::trace_codes(trace, true))
            .map_err(|e| TierReplayError::Setup(e.into()))?;
        m.set_demand(Demand::new(forecaster, actions));
        if actions.plan {
            let mut p = Planner::new(cfg.low_watermark, None);
            p.drops = actions.recompute;
            p.link = LinkModel::from_costs(&opts.costs);
            p.link.occupancy = cfg.plan_occupancy;
            p.defer_wraps = cfg.plan_defer_wraps;
            p.steps = cfg.plan_steps;
            p.morph = cfg.plan_new_shapes;
            p.guard = cfg.plan_guard.then(Guard::default);
            m.set_planner(p);
        }
    }
    let forecaster = m.demand().map_or("none", |d| d.forecaster_name());
    let prefetcher = if opts.plan.is_some() {
        "plan"
    } else if opts.prefetch {
        "previous-iteration-order"
    } else {
        "none"
    };

    let recompute: HashMap<u64, f64> = trace
        .tensors
        .iter()
        .filter_map(|t| t.recompute_us.map(|r| (t.id, r as f64)))
        .collect();
    // Dropping needs each recomputable tensor's producer inputs (see `producer_inputs`).
    let plan_drops = opts.plan.as_ref().is_some_and(Plan::drops);
    let inputs = if cfg.recompute || plan_drops {
        m.set_producer(Box::new(TimeOnly));
        producer_inputs(trace)
    } else {
        HashMap::new()
    };
    let model = AccessModel::for_trace(trace);
    let program = ops(trace, model);
    let mut live: HashMap<u64, TensorHandle> = HashMap::with_capacity(4096);
    let mut compute_us = 0.0;
    // The stall and the tier counters when the setup ended: its time is not stall, and
    // its waits (spills of static blocks under a small budget) are in no part of it.
    let mut setup_end: Option<(f64, super::TierStats)> = None;
    let mut error = None;
    let mut n_ops = 0u64;
    let (mut reserved_time, mut frag_time, mut frag_span) = (0.0f64, 0.0f64, 0.0f64);
    let (mut last_frag, mut max_frag) = (None::<f64>, 0.0f64);
    let mut stall_per_iteration = Vec::new();
    let mut compute_per_iteration = Vec::new();
    let mut last_boundary_stall = None::<f64>;
    let mut last_boundary_compute = 0.0f64;
    let directives = opts.plan.as_ref().map_or(&[][..], |p| &p.directives[..]);
    let mut pc = 0usize;
    let mut deferred: Vec<TensorHandle> = Vec::new();
    let mut plan_run = PlanRun {
        directives: directives.len() as u64,
        ..Default::default()
    };
    let step_cap = (opts.max_step_fraction * budget as f64) as u64;
    let mut step_bytes = 0u64;
    let bytes_of: HashMap<u64, u64> = trace
        .static_blocks
        .iter()
        .map(|b| (b.id, b.bytes))
        .chain(trace.events.iter().filter_map(|e| match e.kind {
            memcast_trace::EventKind::Alloc { id, bytes, .. } => Some((id, bytes)),
            _ => None,
        }))
        .collect();

    let bad = |event: Option<u64>, what: String| TierReplayError::Trace {
        what: format!("{}: {what}", where_(event)),
    };
    let oracle_plan = matches!(opts.predictive, Some((ReplayForecaster::Oracle, a)) if a.plan);
    for (i, op) in program.iter().enumerate() {
        if op.event.is_some() && setup_end.is_none() {
            // Setup ends at the first trace event.
            setup_end = Some((m.backend().stall_us(), m.stats().clone()));
        }
        n_ops += 1;
        if let (Some(k), false) = (
            op.event,
            matches!(op.kind, OpKind::EndStep | OpKind::Advance(_)),
        ) {
            let r = super::directives::run_due(
                &mut m,
                directives,
                &mut pc,
                k,
                &live,
                &mut deferred,
                &mut plan_run,
            );
            if let Err(e) = r {
                error = Some(format!("{}: plan: {e}", where_(op.event)));
                break;
            }
        }
        let touched = match op.kind {
            OpKind::Alloc { bytes, .. } => bytes,
            OpKind::Access { id, .. } => bytes_of.get(&id).copied().unwrap_or(0),
            _ => 0,
        };
        if touched > 0 {
            if step_bytes > 0 && step_bytes + touched > step_cap {
                m.end_step();
                step_bytes = 0;
            }
            step_bytes += touched;
        }
        let r: Result<(), TierError> = match op.kind {
            OpKind::Advance(us) => {
                m.backend_mut().advance_us(us as f64);
                compute_us += us as f64;
                Ok(())
            }
            OpKind::EndStep => {
                m.end_step();
                step_bytes = 0;
                Ok(())
            }
            OpKind::IterationBoundary => {
                let now = m.backend().stall_us() + m.stats().recompute_us;
                if let Some(prev) = last_boundary_stall {
                    stall_per_iteration.push(now - prev);
                    compute_per_iteration.push(compute_us - last_boundary_compute);
                }
                last_boundary_stall = Some(now);
                last_boundary_compute = compute_us;
                if oracle_plan {
                    // The oracle plans the iteration that begins on its true operations.
                    let next =
                        super::floor::upcoming(&program[i + 1..], &bytes_of, &live, m.logical());
                    m.set_next_trajectory(next);
                }
                m.iteration_boundary()
            }
            OpKind::Alloc {
                id,
                bytes,
                persistent,
            } => {
                let opts_t = TensorOpts {
                    persistent,
                    recompute_us: recompute.get(&id).copied().unwrap_or(0.0),
                    recompute_prob: if recompute.contains_key(&id) {
                        opts.recompute_prob
                    } else {
                        0.0
                    },
                };
                // Zero-byte tensors hold no memory: nothing to place.
                if bytes == 0 {
                    Ok(())
                } else {
                    m.register(bytes, opts_t).and_then(|h| {
                        if live.insert(id, h).is_some() {
                            return Err(TierError::Invariant(format!(
                                "tensor {id} allocated twice"
                            )));
                        }
                        if let Some(ins) = inputs.get(&id) {
                            // Inputs of no bytes hold nothing; any other must be live.
                            let hs: Option<Vec<TensorHandle>> = ins
                                .iter()
                                .filter(|u| bytes_of.get(u).is_some_and(|&b| b > 0))
                                .map(|u| live.get(u).copied())
                                .collect();
                            if let Some(hs) = hs {
                                m.set_recomputable(h, &hs)?;
                            }
                        }
                        Ok(())
                    })
                }
            }
            OpKind::Access { id, write } => match live.get(&id) {
                Some(&h) if opts.plan.is_some() => {
                    super::directives::before_access(&mut m, h, &mut deferred, &mut plan_run)
                        .and_then(|_| m.access(h, write).map(|_| ()))
                }
                Some(&h) => m.access(h, write).map(|_| ()),
                None if is_zero(trace, id) => Ok(()),
                None => {
                    return Err(bad(
                        op.event,
                        format!("access to tensor {id}, which is not live"),
                    ))
                }
            },
            OpKind::Free { id } => match live.remove(&id) {
                Some(h) => m.free(h),
                None if is_zero(trace, id) => Ok(()),
                None => {
                    return Err(bad(
                        op.event,
                        format!("free of tensor {id}, which is not live"),
                    ))
                }
            },
        };
        if let Err(e) = r {
            error = Some(format!("{}: {e}", where_(op.event)));
            break;
        }
        if let OpKind::Advance(us) = op.kind {
            reserved_time += m.allocator().stats().reserved.current as f64 * us as f64;
            if let Some(f) = last_frag {
                frag_time += f * us as f64;
                frag_span += us as f64;
            }
        }
        if n_ops.is_multiple_of(256) {
            last_frag = fragmentation(m.allocator());
            if let Some(f) = last_frag {
                max_frag = max_frag.max(f);
            }
        }
        if opts.check_every > 0 && n_ops.is_multiple_of(opts.check_every) {
            m.check_invariants()
                .map_err(|e| bad(op.event, e.to_string()))?;
        }
    }
    if error.is_none() {
        let end = trace.events.len() as u64;
        let r = super::directives::run_due(
            &mut m,
            directives,
            &mut pc,
            end,
            &live,
            &mut deferred,
            &mut plan_run,
        );
        if let Err(e) = r {
            error = Some(format!("at the end: plan: {e}"));
        }
    }
    if error.is_none() {
        if let Err(e) = m.synchronize() {
            error = Some(format!("at the end: {e}"));
        }
    }
    if opts.check_every > 0 {
        m.check_invariants().map_err(|e| bad(None, e.to_string()))?;
    }
    // No trace event was reached (the setup failed, or there are none): all of it was
    // setup, none of it stall.
    let (setup_us, s0) = setup_end.unwrap_or_else(|| (m.backend().stall_us(), m.stats().clone()));
    let s = m.stats().times_since(&s0);
    // Recomputes ran on the compute stream: the caller waited for them.
    let stall_us = m.backend().stall_us() - setup_us + s.recompute_us;
    let ahead_spills = m.demand().map_or(0, |d| d.ahead_spills);
    let plan_stats = m.planner().map(|p| p.stats.clone()).unwrap_or_default();
    let planned_suppressed = m
        .planner()
        .and_then(|p| p.guard.as_ref())
        .map_or(0, |g| g.suppressed);
    let a = m.allocator().stats();
    let iterations = trace
        .events
        .iter()
        .filter(|e| matches!(e.kind, memcast_trace::EventKind::IterationBoundary))
        .count()
        .saturating_sub(1)
        .max(1) as f64;
    // Pinned copies, both directions at once: the measured duplex total, halved.
    let duplex = LinkModel::from_costs(&opts.costs).out_bytes_per_us;
    let link_us = iterations * peak.saturating_sub(budget) as f64 / duplex;
    let link_floor_us = (link_us - compute_us).max(0.0);
    let peak_floor_us =
        super::floor::replay_floor(&program, &bytes_of, budget, LinkModel::peak_of(&opts.costs));
    let events = (trace.events.len() + trace.static_blocks.len()) as u64;
    let wall_secs = wall.elapsed().as_secs_f64();
    Ok(TierReport {
        trace: trace.meta.name.clone(),
        policy: if opts.predictive.is_some() {
            "predictive"
        } else {
            "reactive"
        },
        forecaster,
        spill_policy,
        prefetcher,
        device: opts.device,
        access_model: model,
        timeline: if opts.spread_waits {
            "spread-final-waits"
        } else {
            "host"
        },
        completed: error.is_none(),
        ooms: s.ooms,
        error,
        budget_bytes: budget,
        peak_requested_bytes: peak,
        budget_fraction: if peak == 0 {
            0.0
        } else {
            budget as f64 / peak as f64
        },
        compute_us,
        stall_us,
        transfer_stall_us: s.transfer_stall_us,
        access_stall_us: s.access_stall_us,
        oom_wait_out_us: s.oom_wait_out_us,
        oom_spill_us: s.oom_spill_us,
        oom_spilled_bytes: s.oom_spilled_bytes,
        oom_wait_in_us: s.oom_wait_in_us,
        relocations: s.relocations,
        relocated_bytes: s.relocated_bytes,
        oom_relocate_us: s.oom_relocate_us,
        late_prefetch_us: s.late_prefetch_us,
        fault_us: s.fault_us,
        fault_bytes: s.fault_bytes,
        stall_overhead: if compute_us > 0.0 {
            stall_us / compute_us
        } else {
            0.0
        },
        link_floor_us,
        link_floor_overhead: if compute_us > 0.0 {
            link_floor_us / compute_us
        } else {
            0.0
        },
        peak_floor_us,
        peak_floor_overhead: if compute_us > 0.0 {
            peak_floor_us / compute_us
        } else {
            0.0
        },
        spills: s.spills,
        spilled_bytes: s.spilled_bytes,
        ahead_spills,
        swap_spills: s.swap_spills,
        planned_moves: plan_stats.moves,
        planned_spills: plan_stats.spills,
        planned_drops: plan_stats.drops,
        planned_prefetches: plan_stats.prefetches,
        planned_replans: plan_stats.replans,
        planned_step_plans: plan_stats.step_plans,
        planned_new_shape_plans: plan_stats.new_shape_plans,
        planned_skipped: plan_stats.skipped,
        planned_suppressed,
        drops: s.drops,
        dropped_bytes: s.dropped_bytes,
        recomputes: s.recomputes,
        recomputed_bytes: s.recomputed_bytes,
        recompute_us: s.recompute_us,
        prefetches: s.prefetches,
        prefetched_bytes: s.prefetched_bytes,
        prefetch_hits: s.prefetch_hits,
        prefetch_misses: s.prefetch_misses(),
        prefetch_hit_rate: s.prefetch_hit_rate(),
        faults: s.faults,
        late_prefetches: s.prefetch_late,
        blocked_prefetches: s.prefetch_blocked,
        wasted_prefetches: s.prefetch_wasted,
        cancelled_spills: s.cancelled_spills,
        sync_spills: s.sync_spills,
        early_spills_refused: s.early_spills_refused,
        pageable_copied_bytes: s.pageable_copied_bytes,
        pageable_copy_us: s.pageable_copy_us,
        peak_reserved_bytes: a.reserved.peak,
        reserved_overhead: if peak == 0 {
            0.0
        } else {
            a.reserved.peak as f64 / peak as f64 - 1.0
        },
        mean_reserved_bytes: if compute_us > 0.0 {
            reserved_time / compute_us
        } else {
            a.reserved.current as f64
        },
        peak_allocated_bytes: a.allocated.peak,
        peak_host_bytes: s.peak_host_bytes,
        device_allocs: a.device_allocs,
        device_frees: a.device_frees,
        critical_path_device_calls: a.device_allocs + a.device_frees,
        critical_path_device_us: (stall_us
            - s.transfer_stall_us
            - s.pageable_copy_us
            - s.recompute_us)
            .max(0.0),
        mean_fragmentation: if frag_span > 0.0 {
            frag_time / frag_span
        } else {
            0.0
        },
        max_fragmentation: max_frag,
        alloc_oom_retries: a.oom_retries,
        staging_bytes,
        setup_us,
        operations: n_ops,
        stall_per_iteration_us: stall_per_iteration,
        compute_per_iteration_us: compute_per_iteration,
        plan: opts.plan.as_ref().map(|_| plan_run),
        events,
        events_per_sec: if wall_secs > 0.0 {
            events as f64 / wall_secs
        } else {
            0.0
        },
        wall_secs,
    })
}

/// `1 - largest free block / free bytes` of the allocator, or `None` when less than 1%
/// of reserved bytes is free (the replay's rule).
fn fragmentation<B: DeviceBackend>(a: &Allocator<B>) -> Option<f64> {
    let (free, largest) = a.free_and_largest();
    let reserved = a.stats().reserved.current;
    if reserved == 0 || (free as f64) < 0.01 * reserved as f64 {
        return None;
    }
    Some(1.0 - largest.min(free) as f64 / free as f64)
}

fn where_(event: Option<u64>) -> String {
    match event {
        Some(i) => format!("step {i} (trace event {i})"),
        None => "setup (static blocks)".into(),
    }
}

/// Zero-byte tensors are not registered; their accesses and frees are no-ops.
fn is_zero(trace: &Trace, id: u64) -> bool {
    // Rare path (only reached for ids not live): a linear scan is fine.
    trace.static_blocks.iter().any(|b| b.id == id && b.bytes == 0)
        || trace.events.iter().any(|e| matches!(e.kind, memcast_trace::EventKind::Alloc { id: i, bytes: 0, .. } if i == id))
}

/// The producer inputs of every tensor with a recompute cost, by tensor id. The trace
/// names a tensor's producer op and every op that read each tensor (`TensorMeta`), not
/// the op's inputs: they are taken to be the other tensors that op read and that were
/// live when the tensor was allocated (op names repeat across iterations; liveness
/// tells their instances apart). A tensor whose producer is unknown gets none.
/// O(tensors + reads).
pub fn producer_inputs(trace: &Trace) -> HashMap<u64, Vec<u64>> {
    let mut readers: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, t) in trace.tensors.iter().enumerate() {
        for c in &t.consumers {
            let v = readers.entry(c.as_str()).or_default();
            if v.last() != Some(&i) {
                v.push(i);
            }
        }
    }
    let mut out = HashMap::new();
    for t in &trace.tensors {
        let (Some(_), Some(p), Some(a)) = (t.recompute_us, &t.producer, t.alloc_event) else {
            continue;
        };
        let ins = readers.get(p.as_str()).map_or_else(Vec::new, |v| {
            v.iter()
                .map(|&i| &trace.tensors[i])
                .filter(|u| {
                    u.id != t.id
                        && u.alloc_event.is_none_or(|x| x < a)
                        && u.free_event.is_none_or(|f| f > a)
                })
                .map(|u| u.id)
                .collect()
        });
        out.insert(t.id, ins);
    }
    out
}
