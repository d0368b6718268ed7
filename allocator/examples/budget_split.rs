//! Budgeted replays of one split of the recorded corpus (default `test`, the traces
//! nothing was chosen on): reactive tiers with and without the one-arena allocator,
//! predictive tiers (default actions, the LSTM), iteration plans (from the last
//! iteration of the same shape, and the oracle's), beside the peak floor.
//!
//! `cargo run --release -p memcast-alloc --example budget_split [SPLIT] [BUDGET] [occupancy] [nodefer] [byaddr|noaddr] [noguard] [growable]`
//! (from the repository root; `BUDGET` a share of each trace's peak, default `60%`;
//! `occupancy`: plans model the link's occupancy, `TierConfig::plan_occupancy`;
//! `nodefer`: plans bring wrapped moves back within their iteration,
//! `TierConfig::plan_defer_wraps` off; `byaddr` / `noaddr`: `TierConfig::oom_by_address`
//! on / off; `noguard`: `TierConfig::plan_guard` off; `growable`: the allocator on growable segments, with its default page
//! release, instead of fixed ones; `peak`: with `growable`, page release at the peak;
//! `planned`: planned placement).

use memcast_alloc::config::Actions;
use memcast_alloc::replay::ReplayForecaster;
use memcast_alloc::tier::{replay_budgeted, Budget, TierReplayOptions};
use memcast_trace::corpus::{Corpus, Split};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let split: Split = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "test".into())
        .parse()?;
    let budget: Budget = std::env::args()
        .nth(2)
        .unwrap_or_else(|| "60%".into())
        .parse()?;
    let flag = |f: &str| std::env::args().skip(3).any(|a| a == f);
    let (occupancy, defer) = (flag("occupancy"), !flag("nodefer"));
    let corpus = Corpus::load(std::path::Path::new("training-data/corpus/manifest.tsv"))?;
    let plan = Actions {
        plan: true,
        ..Actions::none()
    };
    // (label, arena, predictive tiers)
    type Row = (&'static str, bool, Option<(ReplayForecaster, Actions)>);
    let rows: [Row; 5] = [
        ("reactive, no arena", false, None),
        ("reactive", true, None),
        (
            "predictive, lstm",
            true,
            Some((ReplayForecaster::Lstm, Actions::default())),
        ),
        (
            "plan, same shape",
            true,
            Some((ReplayForecaster::None, plan)),
        ),
        ("plan, oracle", true, Some((ReplayForecaster::Oracle, plan))),
    ];
    print!("| trace | peak floor |");
    for (name, _, _) in &rows {
        print!(" {name} |");
    }
    println!();
    println!("|---|---:|{}", "---:|".repeat(rows.len()));
    let mut sums = vec![0.0f64; rows.len() + 1];
    let mut n = 0;
    for e in corpus.split(split) {
        let t = memcast_trace::io::load_trace(&e.path)?;
        let mut cells = Vec::new();
        let mut floor = 0.0;
        for (i, (_, arena, p)) in rows.iter().enumerate() {
            let mut opts = TierReplayOptions {
                budget,
                arena: *arena,
                predictive: *p,
                ..Default::default()
            };
            opts.tier.plan_occupancy = occupancy;
            opts.tier.plan_defer_wraps = defer;
            if flag("byaddr") || flag("noaddr") {
                opts.tier.oom_by_address = flag("byaddr");
            }
            if flag("noguard") {
                opts.tier.plan_guard = false;
            }
            if flag("growable") {
                opts.alloc.growable_segments = true;
            }
            if flag("peak") {
                opts.alloc.page_release = memcast_alloc::config::PageRelease::Peak;
            }
            if flag("planned") {
                opts.alloc.placement = memcast_alloc::config::Placement::Planned;
            }
            let r = replay_budgeted(&t, &opts)?;
            floor = r.peak_floor_overhead;
            sums[i + 1] += r.stall_overhead;
            cells.push(if r.completed {
                format!("{:.2}", r.stall_overhead)
            } else {
                "OOM".into()
            });
        }
        sums[0] += floor;
        n += 1;
        println!("| {} | {:.2} | {} |", e.workload, floor, cells.join(" | "));
    }
    let means: Vec<String> = sums
        .iter()
        .map(|s| format!("{:.4}", s / n as f64))
        .collect();
    println!("| mean of {n} | {} |", means.join(" | "));
    Ok(())
}
