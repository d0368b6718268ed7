//! `memcast replay <TRACE> --policy memcast|predictive --budget <BYTES|FRACTION> [--json]`:
//! replays a trace under a device budget with spilling to host memory and prefetching
//! back (`memcast_alloc::tier::replay_budgeted`), with the reactive or the predictive
//! tier policies. A budget too small for some step's working
//! set prints the report and fails with the error naming the step and the bytes short.

use anyhow::{bail, Context, Result};
use memcast_alloc::replay::Device;
use memcast_alloc::tier::{replay_budgeted, Budget, TierReplayOptions, TierReport};
use memcast_trace::stats::human_bytes;

use super::{DeviceArg, PolicyArg, ReplayArgs};

pub fn run(args: &ReplayArgs) -> Result<()> {
    let Some(b) = &args.budget else {
        bail!("the tiered replay needs --budget");
    };
    let policies = super::policies(args);
    if let Some(p) = policies
        .iter()
        .find(|p| matches!(p, PolicyArg::Pytorch | PolicyArg::Naive))
    {
        bail!(
            "--budget replays memcast's tiers (--policy memcast, reactive or predictive), not --policy {}",
            p.name()
        );
    }
    let budget: Budget = b
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))
        .context("--budget")?;
    let trace = args.import.load(&args.trace)?;
    // Zero-byte tensors hold no memory (the tiered replay places none of them).
    let allocates = (trace.events.iter())
        .any(|e| matches!(e.kind, memcast_trace::EventKind::Alloc { bytes, .. } if bytes > 0));
    if !allocates && trace.static_blocks.iter().all(|b| b.bytes == 0) {
        bail!(
            "{}: the trace allocates nothing, so there is nothing to replay under a budget",
            args.trace.display()
        );
    }
    let peak = memcast_trace::stats::TraceStats::compute(&trace)?.peak_requested_bytes;
    if budget.bytes(peak) >= peak {
        eprintln!(
            "warning: the budget ({}) holds the trace's peak of requested bytes ({}): nothing has to leave the device{}",
            human_bytes(budget.bytes(peak)),
            human_bytes(peak),
            if args.no_arena {
                ""
            } else {
                ", and the arena reserves the whole budget"
            }
        );
    }
    let plan = match &args.plan {
        Some(p) => Some(
            memcast_alloc::tier::directives::Plan::load(p)
                .map_err(|e| anyhow::anyhow!(e))
                .context("--plan")?,
        ),
        None => None,
    };
    // Allocator settings: the tiered replay's defaults (fixed segments), then the
    // environment and --conf on top.
    let alloc = super::alloc_config(args, TierReplayOptions::default().alloc)?;
    super::warn_unused_predictive_keys(args, &alloc);
    let mut tier = TierReplayOptions::default().tier;
    if let Some(w) = &args.watermarks {
        (tier.high_watermark, tier.low_watermark) = parse_watermarks(w)?;
    }
    tier.relocate = !args.no_relocate;
    tier.plan_steps = !args.no_step_plans;
    tier.plan_new_shapes = !args.no_new_shape_plans;
    tier.early_spills_pinned = !args.early_pageable;
    tier.spill_hysteresis = args.spill_hysteresis;
    if let Some(p) = &args.pinned {
        let pool = Budget::parse_as(p, "pinned pool")
            .map_err(|e: String| anyhow::anyhow!(e))
            .context("--pinned")?;
        // 0 would mean "the replay's default": the smallest pool is one byte.
        tier.staging_bytes = pool.bytes(peak).max(1);
    }
    let costs = super::cost_model(args)?;
    let mut reports = Vec::new();
    for p in &policies {
        let opts = TierReplayOptions {
            tier: tier.clone(),
            budget,
            device: match args.device {
                DeviceArg::Sim => Device::Sim,
                DeviceArg::Host => Device::Host,
                DeviceArg::Cuda => Device::Cuda,
            },
            prefetch: !args.no_prefetch,
            arena: !args.no_arena,
            spread_waits: args.spread_waits,
            costs: costs.model.clone(),
            check_every: args.check_every,
            alloc: alloc.clone(),
            plan: plan.clone(),
            predictive: super::runs_predictive(&alloc, *p)
                .then(|| (super::forecaster(args, &alloc), alloc.predictive_actions)),
            ..Default::default()
        };
        let _busy = super::super::progress::Busy::new(format!(
            "replaying {} under a budget ({})",
            args.trace.display(),
            p.name()
        ));
        let report = replay_budgeted(&trace, &opts)
            .with_context(|| format!("tiered replay of {} failed", args.trace.display()))?;
        reports.push((p.name(), report));
    }
    super::print_reports(args, &costs, &reports, print_table)?;
    if let Some(e) = reports.iter().find_map(|(_, r)| r.error.as_ref()) {
        bail!("{e}");
    }
    Ok(())
}

/// `HIGH,LOW`: two shares of the budget.
fn parse_watermarks(s: &str) -> Result<(f64, f64)> {
    let bad = || {
        anyhow::anyhow!("--watermarks {s:?}: expected HIGH,LOW, two numbers in (0, 1] with LOW <= HIGH, such as 0.9,0.8")
    };
    let (h, l) = s.split_once(',').ok_or_else(bad)?;
    let (h, l): (f64, f64) = (
        h.trim().parse().map_err(|_| bad())?,
        l.trim().parse().map_err(|_| bad())?,
    );
    if !(h > 0.0 && h <= 1.0 && l > 0.0 && l <= h) {
        return Err(bad());
    }
    Ok((h, l))
}

fn print_table(r: &TierReport) {
    out!("trace              {}", r.trace);
    out!(
        "policy             {} (forecaster: {}, spill: {}, prefetch: {}, access model: {:?})",
        r.policy,
        r.forecaster,
        r.spill_policy,
        r.prefetcher,
        r.access_model
    );
    out!(
        "budget             {} ({:.0}% of peak requested {})",
        human_bytes(r.budget_bytes),
        100.0 * r.budget_fraction,
        human_bytes(r.peak_requested_bytes)
    );
    out!("completed          {} ({} OOM)", r.completed, r.ooms);
    if r.device == Device::Sim {
        out!("compute            {:.1} ms", r.compute_us / 1e3);
        out!(
            "stall              {:.1} ms (transfers {:.1} ms), overhead {:.3} (stall / compute)",
            r.stall_us / 1e3,
            r.transfer_stall_us / 1e3,
            r.stall_overhead
        );
        out!(
            "link-bound floor   {:.1} ms, overhead {:.3} (the excess over the budget out and back once per iteration at the pinned duplex bandwidth)",
            r.link_floor_us / 1e3,
            r.link_floor_overhead
        );
        out!(
            "peak floor         {:.1} ms, overhead {:.3} (per iteration, the bytes above the budget at its peak off the device after their last use and back before their next, at the link's peak bandwidth: no policy that moves tensors stalls less)",
            r.peak_floor_us / 1e3,
            r.peak_floor_overhead
        );
    } else {
        out!("time               not modelled on this device (compute, stall and the floors are the simulated device's: --device sim)");
    }
    out!(
        "spilled            {} in {} spills ({} batches ahead of a forecast peak, {} rounds to make room for a predicted read, {} on the OOM path, {} cancelled)",
        human_bytes(r.spilled_bytes),
        r.spills,
        r.ahead_spills,
        r.swap_spills,
        r.sync_spills,
        r.cancelled_spills
    );
    if r.planned_moves > 0 {
        out!(
            "iteration plans    {} moves planned, {} spills, {} drops and {} prefetches issued by the plan",
            r.planned_moves,
            r.planned_spills,
            r.planned_drops,
            r.planned_prefetches
        );
    }
    if r.planned_suppressed > 0 {
        out!(
            "plan guard         {} iterations run without a plan (their shape's last planned iteration stalled more per byte above the budget than its last unplanned one)",
            r.planned_suppressed
        );
    }
    if let Some(p) = &r.plan {
        out!(
            "plan (--plan)      {} directives: {} carried out, {} refused, {} prefetches waited for their spill",
            p.directives,
            p.issued,
            p.refused,
            p.deferred
        );
    }
    if !r.compute_per_iteration_us.is_empty() && r.device == Device::Sim {
        let steps: Vec<String> = (r.compute_per_iteration_us.iter())
            .zip(&r.stall_per_iteration_us)
            .map(|(c, s)| format!("{:.1}", (c + s) / 1e3))
            .collect();
        out!(
            "step per iteration {} ms (compute + stall)",
            steps.join(", ")
        );
    }
    if r.drops > 0 {
        out!(
            "recomputed         {} in {} recomputes of {} dropped tensors ({} of compute stream time, in the stall)",
            human_bytes(r.recomputed_bytes),
            r.recomputes,
            r.drops,
            format_args!("{:.1} ms", r.recompute_us / 1e3)
        );
    }
    out!(
        "prefetched         {} in {} prefetches ({} never used)",
        human_bytes(r.prefetched_bytes),
        r.prefetches,
        r.wasted_prefetches
    );
    if r.prefetch_hits + r.prefetch_misses == 0 {
        out!("prefetch hit rate  - (no spilled tensor was read back: 0 hits, 0 misses)");
    } else {
        out!(
            "prefetch hit rate  {:.3} ({} hits, {} misses: {} faults, {} late{})",
            r.prefetch_hit_rate,
            r.prefetch_hits,
            r.prefetch_misses,
            r.faults,
            r.late_prefetches,
            if r.blocked_prefetches > 0 {
                format!(", {} from pageable memory", r.blocked_prefetches)
            } else {
                String::new()
            }
        );
    }
    if r.pageable_copied_bytes > 0 {
        out!(
            "pageable copies    {} to or from pageable memory (no room in the pinned pool), {:.1} ms of the host's time inside them (in the stall: such a copy returns once done)",
            human_bytes(r.pageable_copied_bytes),
            r.pageable_copy_us / 1e3
        );
    }
    if r.early_spills_refused > 0 {
        out!(
            "pinned pool full   {} early spills not issued (nothing waited for them; a larger pool, --pinned, would let them start early)",
            r.early_spills_refused
        );
    }
    out!(
        "peak reserved      {} (host {}, pinned pool {})",
        human_bytes(r.peak_reserved_bytes),
        human_bytes(r.peak_host_bytes),
        human_bytes(r.staging_bytes)
    );
}
