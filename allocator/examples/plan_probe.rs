//! Where the stall of a budgeted replay comes from, for reactive tiers and iteration
//! plans: the access part (faults, late prefetches) and the allocation part (the
//! out-of-memory path), the bytes each direction of the link carried against the
//! compute time, on the bundled static training traces (or those named).
//!
//! `cargo run --release -p memcast-alloc --example plan_probe [anatomy] [nodefer] [TRACE...]`
//! (a bundled trace's name, or a `.mctrace` path; `nodefer`: `TierConfig::plan_defer_wraps`
//! off)

use memcast_alloc::config::Actions;
use memcast_alloc::replay::ReplayForecaster;
use memcast_alloc::tier::{replay_budgeted, Budget, TierReplayOptions};

fn anatomy(names: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    use memcast_alloc::tier::access::{ops, AccessModel, OpKind};
    use memcast_alloc::tier::floor::{peak_floor, trajectories};
    use memcast_alloc::tier::schedule::{plan, LinkModel, OpUse};
    use std::collections::HashMap;
    println!("| trace | it | span ms | peak GB | E GB | E/bw ms | t_peak/span | floor before/after ms | plan0.8 GB (before peak) | plan1.0 GB (before peak) | moves | above-budget time frac |");
    for b in memcast_trace::bundled::ALL {
        let t = b.load()?;
        if !names.contains(&t.meta.name) {
            continue;
        }
        let peak = memcast_trace::stats::TraceStats::compute(&t)?.peak_requested_bytes;
        let budget = (0.6 * peak as f64) as u64;
        let program = ops(&t, AccessModel::for_trace(&t));
        let bytes_of: HashMap<u64, u64> = t
            .static_blocks
            .iter()
            .map(|b| (b.id, b.bytes))
            .chain(t.events.iter().filter_map(|e| match e.kind {
                memcast_trace::EventKind::Alloc { id, bytes, .. } => Some((id, bytes)),
                _ => None,
            }))
            .collect();
        let _ = OpKind::EndStep;
        for (it, tr) in trajectories(&program, &bytes_of).iter().enumerate() {
            if tr.ops.is_empty() {
                continue;
            }
            let mut l = tr.base as i128;
            let (mut pk, mut at) = (l, 0);
            let mut above_t = 0.0;
            for (i, op) in tr.ops.iter().enumerate() {
                match op.kind {
                    OpUse::Alloc => l += op.bytes as i128,
                    OpUse::Free => l -= op.bytes as i128,
                    OpUse::Access => {}
                }
                if l > budget as i128 && i + 1 < tr.ops.len() {
                    above_t += tr.ops[i + 1].t - op.t;
                }
                if l > pk {
                    pk = l;
                    at = i;
                }
            }
            let e = (pk - budget as i128).max(0) as f64;
            // Live at the peak and never read again before their free (or the end).
            let mut alive: HashMap<_, u64> = HashMap::new();
            for op in &tr.ops[..=at] {
                match op.kind {
                    OpUse::Free => {
                        alive.remove(&op.key);
                    }
                    _ => {
                        alive.insert(op.key, op.bytes);
                    }
                }
            }
            let mut next_read: HashMap<_, bool> = HashMap::new();
            for op in &tr.ops[at + 1..] {
                if alive.contains_key(&op.key) && !next_read.contains_key(&op.key) {
                    next_read.insert(op.key, op.kind == OpUse::Access);
                }
            }
            let dead: u64 = alive
                .iter()
                .filter(|(k, _)| !next_read.get(k).copied().unwrap_or(false))
                .map(|(_, b)| *b)
                .sum();
            print!("dead-at-peak {:.2} GB; ", dead as f64 / 1e9);
            for c in [0.8, 1.0] {
                let p = plan(tr, (c * budget as f64) as u64, LinkModel::default());
                let w: u64 = p.moves.iter().filter(|m| m.wraps).map(|m| m.bytes).sum();
                let pre: u64 = p
                    .moves
                    .iter()
                    .filter(|m| !m.wraps && m.needed_at <= at)
                    .map(|m| m.bytes)
                    .sum();
                let cross: u64 = p
                    .moves
                    .iter()
                    .filter(|m| !m.wraps && m.spill_after < at && m.needed_at > at)
                    .map(|m| m.bytes)
                    .sum();
                let post: u64 = p
                    .moves
                    .iter()
                    .filter(|m| !m.wraps && m.spill_after >= at)
                    .map(|m| m.bytes)
                    .sum();
                print!("cap {c}: wrap {:.2} before-peak-only {:.2} across-peak {:.2} after-peak {:.2}; ", w as f64 / 1e9, pre as f64 / 1e9, cross as f64 / 1e9, post as f64 / 1e9);
            }
            let link = LinkModel::default();
            let (fb, fa) = peak_floor(tr, budget, LinkModel::peak());
            let pl = |c: f64| {
                let p = plan(tr, (c * budget as f64) as u64, link);
                let all: u64 = p.moves.iter().map(|m| m.bytes).sum();
                let before: u64 = p
                    .moves
                    .iter()
                    .filter(|m| m.spill_after < at)
                    .map(|m| m.bytes)
                    .sum();
                (all as f64 / 1e9, before as f64 / 1e9, p.moves.len())
            };
            let (a8, b8, n8) = pl(0.8);
            let (a1, b1, _) = pl(1.0);
            let span = tr.span_us.max(1.0);
            println!(
                "| {} | {} | {:.1} | {:.2} | {:.2} | {:.1} | {:.2} | {:.1} / {:.1} | {:.2} ({:.2}) | {:.2} ({:.2}) | {} | {:.2} |",
                t.meta.name, it, span / 1e3, pk as f64 / 1e9, e / 1e9,
                e / link.out_bytes_per_us / 1e3, tr.ops[at].t / span, fb / 1e3, fa / 1e3,
                a8, b8, a1, b1, n8, above_t / span
            );
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut names: Vec<String> = std::env::args().skip(1).collect();
    let anat = names.first().is_some_and(|n| n == "anatomy");
    if anat {
        names.remove(0);
    }
    let defer = !names.iter().any(|n| n == "nodefer");
    names.retain(|n| n != "nodefer");
    let names = if names.is_empty() {
        vec![
            "resnet50_b64_train".to_string(),
            "gpt2_b8_s1024_train_bf16".into(),
            "bert_base_b32_s128_train".into(),
        ]
    } else {
        names
    };
    if anat {
        return anatomy(&names);
    }
    let plan = Actions {
        plan: true,
        ..Actions::none()
    };
    type Row = (&'static str, Option<(ReplayForecaster, Actions)>);
    let rows: [Row; 4] = [
        ("reactive", None),
        (
            "predictive, lstm",
            Some((ReplayForecaster::Lstm, Actions::default())),
        ),
        ("plan, oracle", Some((ReplayForecaster::Oracle, plan))),
        ("plan, same shape", Some((ReplayForecaster::None, plan))),
    ];
    println!("| trace | policy | stall | floor | oom: wait out / own spills / wait in | late / fault | spilled (oom) | out-link / compute | prefetched (faulted) | cancelled | faults | late | planned spills / skipped |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut traces = Vec::new();
    for b in memcast_trace::bundled::ALL {
        let t = b.load()?;
        if names.contains(&t.meta.name) {
            traces.push(t);
        }
    }
    for n in names.iter().filter(|n| n.ends_with(".mctrace")) {
        traces.push(memcast_trace::io::load_trace(std::path::Path::new(n))?);
    }
    for t in &traces {
        for (label, p) in rows {
            let mut opts = TierReplayOptions {
                budget: Budget::Fraction(0.6),
                predictive: p,
                ..Default::default()
            };
            opts.tier.plan_defer_wraps = defer;
            let r = replay_budgeted(t, &opts)?;
            let c = r.compute_us.max(1.0);
            // The sim's pinned rate for large copies, each way alone (~55 GB/s).
            let out_us = r.spilled_bytes as f64 / 55.0e3;
            println!(
                "| {} | {} | {:.2} | {:.2} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} | {:.1} ({:.1}) GB | {:.2} | {:.1} ({:.1}) GB | {} | {} | {} | {} / {} |",
                t.meta.name,
                label,
                r.stall_overhead,
                r.peak_floor_overhead,
                r.oom_wait_out_us / c,
                r.oom_spill_us / c,
                r.oom_wait_in_us / c,
                r.late_prefetch_us / c,
                r.fault_us / c,
                r.spilled_bytes as f64 / 1e9,
                r.oom_spilled_bytes as f64 / 1e9,
                out_us / c,
                r.prefetched_bytes as f64 / 1e9,
                r.fault_bytes as f64 / 1e9,
                r.cancelled_spills,
                r.faults,
                r.late_prefetches,
                r.planned_spills,
                r.planned_skipped,
            );
        }
    }
    Ok(())
}
