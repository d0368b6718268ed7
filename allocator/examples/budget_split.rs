//! Budgeted replays of one split of the recorded corpus (default `test`, the traces
//! nothing was chosen on): reactive tiers with and without the one-arena allocator,
//! predictive tiers (default actions, the LSTM), iteration plans (from the last
//! iteration of the same shape, and the oracle's), beside the peak floor.
//!
//! `cargo run --release -p memcast-alloc --example budget_split [SPLIT] [BUDGET] [occupancy] [nodefer] [nosteps] [nomorph] [byaddr|noaddr] [noguard] [norelocate] [earlypageable] [hysteresis] [growable] [steady] [spread] [manifest=PATH] [solo=PATH] [hits] [oracle] [low=X] [high=X] [pinned=X] [costs=NAME] [save=PATH] [base=PATH]`
//! (from the repository root; `BUDGET` a share of each trace's peak, default `60%`;
//! `occupancy`: plans model the link's occupancy, `TierConfig::plan_occupancy`;
//! `nodefer`: plans bring wrapped moves back within their iteration,
//! `TierConfig::plan_defer_wraps` off; `nosteps`: no step plans past the end of an
//! iteration plan's trajectory, `TierConfig::plan_steps` off; `nomorph`: no plans for a new
//! shape, `TierConfig::plan_new_shapes` off; `byaddr` / `noaddr`: `TierConfig::oom_by_address`
//! on / off; `noguard`: `TierConfig::plan_guard` off; `norelocate`: `TierConfig::relocate` off; `earlypageable`: `TierConfig::early_spills_pinned` off (spills nothing waits for may go to pageable memory); `hysteresis`: `TierConfig::spill_hysteresis` on; `growable`: the allocator on growable segments, with its default page
//! release, instead of fixed ones; `peak`: with `growable`, page release at the peak;
//! `planned`: planned placement; `steady`: the stall over the compute of the iterations
//! after the first, which no history describes and the oracle knows: the cells read
//! `whole run / from the second iteration`, and the goals are counted both ways;
//! `spread`: compute time from each iteration's final wait spread over it
//! (`TierReplayOptions::spread_waits`); `manifest=PATH`: another corpus manifest (default `training-data/corpus/manifest.tsv`);
//! `solo=PATH`: each trace's iterations scaled to the wall times measured with nothing
//! recorded (`memcast_trace::timeline::scale_iterations`; the JSON lines of
//! `scripts/corpus/time_iterations.py`, one per workload: `name`, `iteration_s`), for
//! the launch-blocking recordings; a trace without a line is an error; `hits`: under the
//! table, the prefetch hit rate of predictive with the LSTM on each trace whose peak
//! floor is at most 0.02 (where the link can carry the traffic). Under the table:
//! predictive with the LSTM at most half of reactive, and within 1.5x of the oracle's
//! plan, naming the traces outside); `oracle`: a column of predictive with the default
//! actions and the oracle forecaster, and with `steady` the goal counted against it
//! too; `low=X`, `high=X`: `TierConfig::low_watermark`
//! (also the plans' cap) and `high_watermark`; `pinned=X`: a pinned staging pool of
//! X times each trace's peak of requested bytes instead of the whole peak
//! (`TierConfig::staging_bytes`; what the out-of-memory path spills beyond it goes to pageable memory); `costs=h100`: the link and device costs
//! measured on an H100 (`CostModel::h100`, for its recordings) instead of the H200's;
//! `save=PATH`: every cell's unrounded figures written to PATH (tab-separated:
//! workload, column, whole run, from the second iteration); `base=PATH`: such a file
//! of an earlier run (another build or setting) read back, and under the table, per
//! column, how many traces are lower, higher and level against it (a change of more
//! than 0.005) and the median change: a mean over traces whose stalls differ by 100x
//! moves with one trace, and a change chosen on it alone may not hold elsewhere.

use memcast_alloc::backend::sim::CostModel;
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
    // The value of a `key=value` argument.
    let value = |key: &str| {
        std::env::args()
            .skip(3)
            .find_map(|a| a.strip_prefix(key)?.strip_prefix('=').map(String::from))
    };
    let fraction = |key: &str| -> Result<Option<f64>, String> {
        value(key)
            .map(|v| v.parse().map_err(|_| format!("{key}={v}: not a number")))
            .transpose()
    };
    let (low, high) = (fraction("low")?, fraction("high")?);
    let pinned = fraction("pinned")?;
    let (occupancy, defer) = (flag("occupancy"), !flag("nodefer"));
    let costs = match value("costs") {
        Some(name) => {
            CostModel::named(&name).ok_or_else(|| format!("costs={name}: not h200 or h100"))?
        }
        None => CostModel::default(),
    };
    let manifest = value("manifest").unwrap_or_else(|| "training-data/corpus/manifest.tsv".into());
    let corpus = Corpus::load(std::path::Path::new(&manifest))?;
    let solo = match value("solo") {
        Some(path) => Some(solo_times(&path)?),
        None => None,
    };
    let base = match value("base") {
        Some(path) => Some(read_figures(&path)?),
        None => None,
    };
    let mut now = Figures::new();
    let plan = Actions {
        plan: true,
        ..Actions::none()
    };
    // (label, arena, predictive tiers)
    type Row = (&'static str, bool, Option<(ReplayForecaster, Actions)>);
    let mut rows: Vec<Row> = vec![
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
    if flag("oracle") {
        rows.push((
            "predictive, oracle",
            true,
            Some((ReplayForecaster::Oracle, Actions::default())),
        ));
    }
    print!("| trace | peak floor |");
    for (name, _, _) in &rows {
        print!(" {name} |");
    }
    println!();
    println!("|---|---:|{}", "---:|".repeat(rows.len()));
    let mut sums = vec![0.0f64; rows.len() + 1];
    let mut steady_sums = vec![0.0f64; rows.len()];
    let mut goals: Vec<Goals> = Vec::new();
    let mut names = Vec::new();
    let mut hits = Vec::new();
    let mut n = 0;
    for e in corpus.split(split) {
        let mut t = memcast_trace::io::load_trace(&e.path)?;
        if let Some(solo) = &solo {
            let spans = solo
                .get(&e.workload)
                .ok_or_else(|| format!("{}: no solo timing", e.workload))?;
            t = memcast_trace::timeline::scale_iterations(&t, spans)
                .map_err(|err| format!("{}: {err}", e.workload))?;
        }
        let peak = memcast_trace::stats::TraceStats::compute(&t)?.peak_requested_bytes;
        let mut cells = Vec::new();
        let mut floor = 0.0;
        let mut figures = Vec::new();
        for (i, (_, arena, p)) in rows.iter().enumerate() {
            let mut opts = TierReplayOptions {
                budget,
                arena: *arena,
                predictive: *p,
                spread_waits: flag("spread"),
                costs: costs.clone(),
                ..Default::default()
            };
            opts.tier.plan_occupancy = occupancy;
            opts.tier.plan_defer_wraps = defer;
            if flag("byaddr") || flag("noaddr") {
                opts.tier.oom_by_address = flag("byaddr");
            }
            if let Some(x) = low {
                opts.tier.low_watermark = x;
            }
            if let Some(x) = high {
                opts.tier.high_watermark = x;
            }
            if flag("nosteps") {
                opts.tier.plan_steps = false;
            }
            if flag("nomorph") {
                opts.tier.plan_new_shapes = false;
            }
            if flag("noguard") {
                opts.tier.plan_guard = false;
            }
            if let Some(x) = pinned {
                // At least one 2 MiB page: 0 would mean the default (the trace's peak).
                opts.tier.staging_bytes = ((x * peak as f64) as u64).max(2 << 20);
            }
            if flag("norelocate") {
                opts.tier.relocate = false;
            }
            if flag("earlypageable") {
                opts.tier.early_spills_pinned = false;
            }
            if flag("hysteresis") {
                opts.tier.spill_hysteresis = true;
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
            if i == 2 && floor <= 0.02 {
                hits.push(format!("{} {:.2}", e.workload, r.prefetch_hit_rate));
            }
            sums[i + 1] += r.stall_overhead;
            let steady = after_first(&r);
            steady_sums[i] += steady;
            figures.push((r.stall_overhead, steady));
            now.insert(
                (e.workload.clone(), rows[i].0.to_string()),
                (r.stall_overhead, steady),
            );
            cells.push(if !r.completed {
                "OOM".into()
            } else if flag("steady") {
                format!("{:.2} / {:.2}", r.stall_overhead, steady)
            } else {
                format!("{:.2}", r.stall_overhead)
            });
        }
        sums[0] += floor;
        goals.push([figures[1], figures[2], figures[4], figures[rows.len() - 1]]);
        names.push(e.workload.clone());
        n += 1;
        println!("| {} | {:.2} | {} |", e.workload, floor, cells.join(" | "));
    }
    let means: Vec<String> = sums
        .iter()
        .map(|s| format!("{:.4}", s / n as f64))
        .collect();
    println!("| mean of {n} | {} |", means.join(" | "));
    if flag("hits") {
        println!(
            "prefetch hit rate (predictive, lstm) where the peak floor is at most 0.02: {}",
            hits.join(", ")
        );
    }
    if flag("steady") {
        let steady: Vec<String> = steady_sums
            .iter()
            .map(|s| format!("{:.4}", s / n as f64))
            .collect();
        println!(
            "| mean of {n}, from the second iteration | | {} |",
            steady.join(" | ")
        );
        // The goals counted on the whole run and from the second iteration.
        let count = |f: &dyn Fn(&Goals, bool) -> bool, later: bool| {
            goals.iter().filter(|g| f(g, later)).count()
        };
        let pick = |x: (f64, f64), later: bool| if later { x.1 } else { x.0 };
        let halved = |g: &Goals, l: bool| pick(g[1], l) <= 0.5 * pick(g[0], l);
        let near = |g: &Goals, l: bool| pick(g[1], l) <= 1.5 * pick(g[2], l);
        let near_forecaster = |g: &Goals, l: bool| pick(g[1], l) <= 1.5 * pick(g[3], l);
        println!(
            "predictive (lstm) at most half of reactive: {} of {n} (from the second iteration: {})",
            count(&halved, false),
            count(&halved, true)
        );
        println!(
            "predictive (lstm) within 1.5x of the oracle's plan: {} of {n} (from the second iteration: {})",
            count(&near, false),
            count(&near, true)
        );
        if flag("oracle") {
            println!(
                "predictive (lstm) within 1.5x of predictive with the oracle forecaster: {} of {n} (from the second iteration: {})",
                count(&near_forecaster, false),
                count(&near_forecaster, true)
            );
        }
        // (label, the oracle column in `Goals`, its goal)
        type Goal<'a> = &'a dyn Fn(&Goals, bool) -> bool;
        let mut refs: Vec<(&str, usize, Goal)> = vec![("", 2, &near)];
        if flag("oracle") {
            refs.push((" (oracle forecaster)", 3, &near_forecaster));
        }
        for ((label, col, near), later) in refs.into_iter().flat_map(|r| [(r, false), (r, true)]) {
            let outside: Vec<String> = (goals.iter().zip(&names))
                .filter(|(g, _)| !near(g, later))
                .map(|(g, name)| {
                    format!(
                        "{name} {:.4} vs {:.4}",
                        pick(g[1], later),
                        pick(g[col], later)
                    )
                })
                .collect();
            let when = if later {
                "from the second iteration"
            } else {
                "whole run"
            };
            let when = format!("{when}{label}");
            let outside = if outside.is_empty() {
                "none".to_string()
            } else {
                outside.join(", ")
            };
            println!("outside 1.5x, {when}: {outside}");
        }
    }
    if let Some(path) = value("save") {
        let text: String = now
            .iter()
            .map(|((w, col), (whole, later))| format!("{w}\t{col}\t{whole}\t{later}\n"))
            .collect();
        std::fs::write(&path, text).map_err(|e| format!("{path}: {e}"))?;
    }
    if let Some(base) = &base {
        for (name, _, _) in &rows {
            println!("against base, {name}: {}", against(base, &now, name));
        }
    }
    Ok(())
}

/// Unrounded figures by (workload, column): (whole run, from the second iteration).
type Figures = std::collections::BTreeMap<(String, String), (f64, f64)>;

fn read_figures(path: &str) -> Result<Figures, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    Ok(parse_figures(&text, path)?)
}

/// Parses what `save=PATH` writes; `origin` (the file) names the source in errors.
fn parse_figures(text: &str, origin: &str) -> Result<Figures, String> {
    let mut out = Figures::new();
    for (n, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split('\t').collect();
        let bad = || {
            format!(
                "{origin}: line {}: expected workload, column and two numbers",
                n + 1
            )
        };
        if f.len() != 4 {
            return Err(bad());
        }
        let whole: f64 = f[2].parse().map_err(|_| bad())?;
        let later: f64 = f[3].parse().map_err(|_| bad())?;
        out.insert((f[0].to_string(), f[1].to_string()), (whole, later));
    }
    Ok(out)
}

/// Column `name` of `now` against `base` on the traces both have: counts of lower,
/// higher and level traces (whole run; a change of at most 0.005 is level), the
/// median change and the two means.
fn against(base: &Figures, now: &Figures, name: &str) -> String {
    let mut changes: Vec<(f64, f64, f64)> = now
        .iter()
        .filter(|((_, col), _)| col == name)
        .filter_map(|(key, v)| base.get(key).map(|b| (v.0 - b.0, b.0, v.0)))
        .collect();
    if changes.is_empty() {
        return "no trace in common".into();
    }
    let lower = changes.iter().filter(|c| c.0 < -0.005).count();
    let higher = changes.iter().filter(|c| c.0 > 0.005).count();
    let n = changes.len();
    let (b, v) = changes
        .iter()
        .fold((0.0, 0.0), |(b, v), c| (b + c.1, v + c.2));
    changes.sort_by(|a, b| a.0.total_cmp(&b.0));
    let median = if n % 2 == 1 {
        changes[n / 2].0
    } else {
        0.5 * (changes[n / 2 - 1].0 + changes[n / 2].0)
    };
    format!(
        "lower {lower}, higher {higher}, level {} of {n}; median change {median:+.4}; mean {:.4} -> {:.4}",
        n - lower - higher,
        b / n as f64,
        v / n as f64
    )
}

/// The iteration wall times (us) of each workload in a `time_iterations.py` output.
fn solo_times(
    path: &str,
) -> Result<std::collections::HashMap<String, Vec<u64>>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let times =
        memcast_trace::corpus::parse_iteration_times(&text).map_err(|e| format!("{path}: {e}"))?;
    Ok(times
        .into_iter()
        .map(|(name, s)| (name, s.iter().map(|x| (x * 1e6).round() as u64).collect()))
        .collect())
}

/// Per trace, (whole run, from the second iteration) stall overheads of reactive,
/// predictive with the LSTM, the oracle's plan and the last column (with `oracle`,
/// predictive with the oracle forecaster).
type Goals = [(f64, f64); 4];

/// Stall over compute from the second iteration on (the first is the one no history
/// describes); the whole run's figure where the trace has fewer than two iterations.
fn after_first(r: &memcast_alloc::tier::TierReport) -> f64 {
    let stall: f64 = r.stall_per_iteration_us.iter().skip(1).sum();
    let compute: f64 = r.compute_per_iteration_us.iter().skip(1).sum();
    if compute > 0.0 {
        stall / compute
    } else {
        r.stall_overhead
    }
}
