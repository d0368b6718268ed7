//! `memcast demo`: the main job on the bundled real traces (recorded with PyTorch on an
//! NVIDIA H200). For each trace it shows what is in it, replays it through memcast's
//! allocator and an emulation of PyTorch's on a simulated H200 next to what PyTorch
//! itself reported, forecasts its demand with the built-in default model against the
//! baselines, replays it in predictive mode (the default model driving the allocator)
//! next to reactive, and replays it under a device budget (60% of its peak by
//! default) with reactive and with predictive spill and prefetch. Plots go to `--out`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use memcast_alloc::config::AllocConfig;
use memcast_alloc::replay::{replay, Policy, ReplayForecaster, ReplayOptions, ReplayReport};
use memcast_alloc::tier::{replay_budgeted, Budget, TierReplayOptions, TierReport};
use memcast_trace::bundled::{self, pytorch_figures};
use memcast_trace::features::CH_TOTAL;
use memcast_trace::stats::{human_bytes, TraceStats};
use plotters::style::{BLACK, BLUE, RED};
use serde_json::json;

use super::chart::{line_chart, Line};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Print one JSON object per trace instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Only the traces whose name contains this.
    #[arg(long)]
    pub only: Option<String>,
    /// Device budget of the tiered replay: a share of each trace's peak requested
    /// bytes (`60%` or `0.6`).
    #[arg(long, default_value = "60%")]
    pub budget: String,
    /// Folder for the plots (created): per trace, reserved bytes over time reactive
    /// vs predictive, forecast vs actual, stall per iteration under the budget.
    #[arg(long, default_value = "memcast-demo")]
    pub out: PathBuf,
    /// Draw no plots.
    #[arg(long)]
    pub no_plots: bool,
}

pub fn run(args: DemoArgs) -> Result<()> {
    let budget = memcast_alloc::tier::budget::parse_share(
        &args.budget,
        "the demo replays traces of different sizes",
    )
    .map_err(|e| anyhow::anyhow!("--budget: {e}"))?;
    // memcast's allocator settings from the environment apply here as in `replay`.
    let env_conf = std::env::var("MEMCAST_ALLOC_CONF").ok();
    let with_env = |base: AllocConfig| -> Result<AllocConfig> {
        match &env_conf {
            Some(c) => base.with_conf_string(c).context("MEMCAST_ALLOC_CONF"),
            None => Ok(base),
        }
    };
    let config = with_env(AllocConfig::default())?;
    let tier_alloc = with_env(TierReplayOptions::default().alloc)?;
    if let Some(c) = &env_conf {
        eprintln!("memcast's allocator with MEMCAST_ALLOC_CONF={c}");
    }
    let traces: Vec<_> = bundled::ALL
        .iter()
        .filter(|b| args.only.as_deref().is_none_or(|o| b.name.contains(o)))
        .collect();
    anyhow::ensure!(
        !traces.is_empty(),
        "no bundled trace's name contains --only {:?} (the bundled traces: {})",
        args.only.as_deref().unwrap_or_default(),
        bundled::ALL
            .iter()
            .map(|b| b.name)
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !args.no_plots {
        memcast_trace::output::create_dir(&args.out)?;
    }
    let mut model = super::load_model(&None)?;
    let cfg = model.weights().config.clone();

    let mut rows = Vec::new();
    let busy = super::progress::Busy::new("demo");
    let n = traces.len();
    for (i, b) in traces.into_iter().enumerate() {
        busy.set(format!("demo: trace {} of {n}, {}", i + 1, b.name));
        let t = b
            .load()
            .with_context(|| format!("bundled trace {}", b.name))?;
        let s = TraceStats::compute(&t)?;
        let run = |policy, forecaster, timeline| {
            replay(
                &t,
                &ReplayOptions {
                    policy,
                    forecaster,
                    timeline,
                    config: config.clone(),
                    ..Default::default()
                },
            )
            .with_context(|| format!("replaying {} ({policy:?})", b.name))
        };
        let plots = !args.no_plots;
        let ours = run(Policy::Memcast, ReplayForecaster::None, plots)?;
        let pred = run(Policy::Predictive, ReplayForecaster::Lstm, plots)?;
        let emu = run(Policy::Pytorch, ReplayForecaster::None, false)?;
        let native = pytorch_figures(b.name, "pytorch-native");
        let expandable = pytorch_figures(b.name, "pytorch-expandable-segments");
        let series =
            memcast_predictor::data::Series::from_trace(b.name, &t, cfg.step, cfg.model.horizon);
        let eval = memcast_predictor::eval::evaluate(&series, Some(&mut model))?;
        let (best, best_wape) = eval.best_baseline();
        let lstm_wape = eval.models.get("lstm").map_or(f64::NAN, |m| m.wape);
        let tiered = |predictive| {
            replay_budgeted(
                &t,
                &TierReplayOptions {
                    budget: Budget::Fraction(budget),
                    predictive,
                    alloc: tier_alloc.clone(),
                    ..Default::default()
                },
            )
            .with_context(|| format!("tiered replay of {}", b.name))
        };
        let tier = tiered(None)?;
        let actions = memcast_alloc::config::Actions::default();
        let tier_pred = tiered(Some((ReplayForecaster::Lstm, actions)))?;
        if plots {
            let fc = memcast_predictor::eval::run_model(&series, &mut model)?;
            draw(
                &args.out, b.name, &ours, &pred, &series, &fc, &tier, &tier_pred,
            )?;
        }
        let no_budget = |r: &ReplayReport| {
            json!({"reserved_overhead": r.reserved_overhead, "mean_reserved_bytes": r.mean_reserved_bytes,
                   "critical_path_device_calls": r.critical_path_device_calls,
                   "critical_path_device_calls_after_first_iteration": r.critical_path_device_calls_after_first_iteration,
                   "ahead_device_calls": r.ahead_device_calls, "mean_fragmentation": r.mean_fragmentation})
        };
        let budgeted = |r: &TierReport| {
            json!({"completed": r.completed, "ooms": r.ooms, "stall_overhead": r.stall_overhead,
                   "link_floor_overhead": r.link_floor_overhead, "peak_floor_overhead": r.peak_floor_overhead, "spilled_bytes": r.spilled_bytes,
                   "prefetch_hit_rate": r.prefetch_hit_rate})
        };
        rows.push(json!({
            "trace": b.name,
            "dynamic": b.dynamic,
            "stats": s,
            "replay": {
                "memcast": {"reserved_overhead": ours.reserved_overhead, "device_allocs": ours.device_allocs,
                            "peak_reserved_bytes": ours.peak_reserved_bytes},
                "pytorch_emulation": {"reserved_overhead": emu.reserved_overhead, "device_allocs": emu.device_allocs,
                            "peak_reserved_bytes": emu.peak_reserved_bytes},
                "pytorch_native_measured": native.as_ref().map(|f| json!({"reserved_overhead": f.reserved_overhead(), "device_allocs": f.num_device_alloc})),
                "pytorch_expandable_measured": expandable.as_ref().map(|f| json!({"reserved_overhead": f.reserved_overhead(), "device_allocs": f.num_device_alloc})),
            },
            "forecast": {"steps": eval.steps, "horizon": eval.horizon, "lstm_wape": lstm_wape,
                         "best_baseline": best, "best_baseline_wape": best_wape},
            "predictive": {"reactive": no_budget(&ours), "predictive": no_budget(&pred)},
            "tiered": {"budget_fraction": budget, "reactive": budgeted(&tier), "predictive": budgeted(&tier_pred)},
        }));
    }
    drop(busy);
    if args.json {
        for r in &rows {
            out!("{r}");
        }
    } else {
        print_tables(&rows, budget);
        if !args.no_plots {
            out!(
                "\nPlots (reserved over time, forecast vs actual, stall per iteration): {}",
                args.out.display()
            );
        }
    }
    Ok(())
}

/// The demo's three plots of one trace.
#[allow(clippy::too_many_arguments)]
fn draw(
    out: &std::path::Path,
    name: &str,
    ours: &ReplayReport,
    pred: &ReplayReport,
    series: &memcast_predictor::data::Series,
    fc: &[memcast_predictor::Forecast],
    tier: &TierReport,
    tier_pred: &TierReport,
) -> Result<()> {
    const GIB: f64 = (1u64 << 30) as f64;
    let t0 = ours.timeline.first().map_or(0.0, |p| p[0]);
    let over_time = |r: &ReplayReport, i: usize| -> Vec<(f64, f64)> {
        r.timeline
            .iter()
            .map(|p| ((p[0] - t0) / 1e3, p[i] / GIB))
            .collect()
    };
    line_chart(
        &out.join(format!("{name}_reserved.svg")),
        &format!("{name}: reserved bytes, reactive vs predictive (default model)"),
        "ms",
        "GiB",
        &[
            Line {
                name: "requested",
                color: BLACK,
                points: over_time(ours, 1),
            },
            Line {
                name: "reserved, reactive",
                color: BLUE,
                points: over_time(ours, 2),
            },
            Line {
                name: "reserved, predictive",
                color: RED,
                points: over_time(pred, 2),
            },
        ],
    )?;
    const MIB: f64 = (1u64 << 20) as f64;
    let actual: Vec<(f64, f64)> = (1..series.len())
        .map(|t| (t as f64, series.actual(t)[CH_TOTAL] as f64 / MIB))
        .collect();
    let forecast: Vec<(f64, f64)> = (1..series.len())
        .map(|t| (t as f64, fc[t - 1].bytes[0][CH_TOTAL] / MIB))
        .collect();
    line_chart(
        &out.join(format!("{name}_forecast.svg")),
        &format!("{name}: requested bytes per step, actual vs the default model one step ahead"),
        "step",
        "MiB",
        &[
            Line {
                name: "actual",
                color: BLACK,
                points: actual,
            },
            Line {
                name: "forecast",
                color: RED,
                points: forecast,
            },
        ],
    )?;
    let per_iter = |r: &TierReport| -> Vec<(f64, f64)> {
        r.stall_per_iteration_us
            .iter()
            .enumerate()
            .map(|(i, &s)| ((i + 1) as f64, s / 1e3))
            .collect()
    };
    line_chart(
        &out.join(format!("{name}_stall.svg")),
        &format!(
            "{name}: stall per iteration under a budget of {:.0}% of peak",
            100.0 * tier.budget_fraction
        ),
        "iteration",
        "ms",
        &[
            Line {
                name: "reactive",
                color: BLUE,
                points: per_iter(tier),
            },
            Line {
                name: "predictive",
                color: RED,
                points: per_iter(tier_pred),
            },
        ],
    )
}

fn pct(v: &serde_json::Value) -> String {
    v.as_f64()
        .map_or_else(|| "-".into(), |x| format!("{:.2}%", x * 100.0))
}

fn print_tables(rows: &[serde_json::Value], budget: f64) {
    out!(
        "memcast demo: {} real traces recorded with PyTorch on an NVIDIA H200\n",
        rows.len()
    );
    out!("1. What is in them");
    out!("   kind = static (the same shapes every iteration) or dynamic; iters = iterations; static = bytes live before");
    out!("   recording began (parameters, optimizer state); peak req. = the most bytes requested at once");
    out!(
        "{:<30} {:>8} {:>8} {:>5} {:>11} {:>11}",
        "trace",
        "kind",
        "events",
        "iters",
        "static",
        "peak req."
    );
    for r in rows {
        let s = &r["stats"];
        out!(
            "{:<30} {:>8} {:>8} {:>5} {:>11} {:>11}",
            r["trace"].as_str().unwrap_or(""),
            if r["dynamic"] == true {
                "dynamic"
            } else {
                "static"
            },
            s["events"].to_string(),
            s["iterations"].to_string(),
            human_bytes(s["static_bytes"].as_u64().unwrap_or(0)),
            human_bytes(s["peak_requested_bytes"].as_u64().unwrap_or(0)),
        );
    }
    out!("\n2. Reserved-memory overhead (peak reserved / peak requested - 1) and device allocations,");
    out!("   replayed on a simulated H200, next to what PyTorch itself reported on the real run");
    out!("   memcast = memcast's allocator; pt-emul. = memcast's emulation of PyTorch's caching allocator;");
    out!("   pt-real / pt-expd. = PyTorch's own figures on the GPU (native / expandable segments); allocs = device allocations");
    out!(
        "{:<30} {:>9} {:>9} {:>9} {:>9} | {:>7} {:>7}",
        "trace",
        "memcast",
        "pt-emul.",
        "pt-real",
        "pt-expd.",
        "allocs",
        "pt-real"
    );
    for r in rows {
        let p = &r["replay"];
        out!(
            "{:<30} {:>9} {:>9} {:>9} {:>9} | {:>7} {:>7}",
            r["trace"].as_str().unwrap_or(""),
            pct(&p["memcast"]["reserved_overhead"]),
            pct(&p["pytorch_emulation"]["reserved_overhead"]),
            pct(&p["pytorch_native_measured"]["reserved_overhead"]),
            pct(&p["pytorch_expandable_measured"]["reserved_overhead"]),
            p["memcast"]["device_allocs"].to_string(),
            p["pytorch_native_measured"]["device_allocs"].to_string(),
        );
    }
    out!("\n3. Demand forecast of the default model (WAPE = sum |actual - forecast| / sum actual, of requested bytes per step, horizons 1..N)");
    out!("   (the default model was trained on these traces; docs/predictor.md has leave-one-out)");
    out!(
        "{:<30} {:>6} {:>8} {:>16} {:>8}",
        "trace",
        "steps",
        "LSTM",
        "best baseline",
        "WAPE"
    );
    for r in rows {
        let f = &r["forecast"];
        out!(
            "{:<30} {:>6} {:>8.4} {:>16} {:>8.4}",
            r["trace"].as_str().unwrap_or(""),
            f["steps"].to_string(),
            f["lstm_wape"].as_f64().unwrap_or(f64::NAN),
            f["best_baseline"].as_str().unwrap_or(""),
            f["best_baseline_wape"].as_f64().unwrap_or(f64::NAN),
        );
    }
    out!("\n4. Predictive mode without a budget: the default model drives growth (reactive vs predictive)");
    out!("   overhead = peak reserved / peak requested - 1; waits = device calls inside requests (all / after the");
    out!("   first iteration); mean = time-weighted reserved bytes; frag. = mean of 1 - largest free block / free bytes;");
    out!("   pred. = the column before it, in predictive mode");
    out!(
        "{:<30} {:>9} {:>9} {:>11} {:>11} {:>10} {:>10} {:>6} {:>6}",
        "trace",
        "overhead",
        "pred.",
        "waits",
        "pred.",
        "mean",
        "pred.",
        "frag.",
        "pred."
    );
    for r in rows {
        let (a, p) = (&r["predictive"]["reactive"], &r["predictive"]["predictive"]);
        let waits = |v: &serde_json::Value| {
            format!(
                "{}/{}",
                v["critical_path_device_calls"],
                v["critical_path_device_calls_after_first_iteration"]
            )
        };
        let gib = |v: &serde_json::Value| {
            human_bytes(v["mean_reserved_bytes"].as_f64().unwrap_or(0.0) as u64)
        };
        out!(
            "{:<30} {:>9} {:>9} {:>11} {:>11} {:>10} {:>10} {:>6.3} {:>6.3}",
            r["trace"].as_str().unwrap_or(""),
            pct(&a["reserved_overhead"]),
            pct(&p["reserved_overhead"]),
            waits(a),
            waits(p),
            gib(a),
            gib(p),
            a["mean_fragmentation"].as_f64().unwrap_or(0.0),
            p["mean_fragmentation"].as_f64().unwrap_or(0.0),
        );
    }
    out!(
        "\n5. Tiered replay with a device budget of {:.0}% of each trace's peak: spill and prefetch, reactive vs predictive",
        budget * 100.0
    );
    out!("   stall/comp = time waiting for memory / compute time; floor = the peak floor (the least stall of any policy");
    out!("   that moves tensors: the bytes above the budget at each iteration's peak out after their last use and back");
    out!("   before their next, at the link's peak bandwidth); pf. hits = prefetch hit rate;");
    out!("   completed = whether the replay ran to the end without running out of memory (reactive/predictive); pred. = predictive");
    out!(
        "{:<30} {:>9} {:>10} {:>10} {:>8} {:>11} {:>9} {:>9}",
        "trace",
        "completed",
        "stall/comp",
        "pred.",
        "floor",
        "spilled",
        "pf. hits",
        "pred."
    );
    for r in rows {
        let (a, p) = (&r["tiered"]["reactive"], &r["tiered"]["predictive"]);
        out!(
            "{:<30} {:>9} {:>10} {:>10} {:>8} {:>11} {:>9} {:>9}",
            r["trace"].as_str().unwrap_or(""),
            format!("{}/{}", a["completed"], p["completed"]),
            pct(&a["stall_overhead"]),
            pct(&p["stall_overhead"]),
            pct(&a["peak_floor_overhead"]),
            human_bytes(a["spilled_bytes"].as_u64().unwrap_or(0)),
            pct(&a["prefetch_hit_rate"]),
            pct(&p["prefetch_hit_rate"]),
        );
    }
}
