//! `memcast demo`: the main job on the bundled real traces (recorded with PyTorch on an
//! NVIDIA H200). For each trace it shows what is in it, replays it through memcast's
//! allocator and an emulation of PyTorch's on a simulated H200 next to what PyTorch
//! itself reported, forecasts its demand with the shipped default model against the
//! baselines, and replays it under a device budget of 60% of its peak with spill and
//! prefetch.

use anyhow::{Context, Result};
use memcast_alloc::replay::{replay, Policy, ReplayOptions};
use memcast_alloc::tier::{replay_budgeted, Budget, TierReplayOptions};
use memcast_trace::bundled::{self, pytorch_figures};
use memcast_trace::stats::{human_bytes, TraceStats};
use serde_json::json;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Print one JSON object per trace instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Only the traces whose name contains this.
    #[arg(long)]
    pub only: Option<String>,
    /// Device budget of the tiered replay, as a fraction of each trace's peak.
    #[arg(long, default_value_t = 0.6)]
    pub budget: f64,
}

pub fn run(args: DemoArgs) -> Result<()> {
    anyhow::ensure!(
        args.budget > 0.0 && args.budget <= 1.0,
        "--budget must be a fraction in (0, 1]"
    );
    let traces: Vec<_> = bundled::ALL
        .iter()
        .filter(|b| args.only.as_deref().is_none_or(|o| b.name.contains(o)))
        .collect();
    anyhow::ensure!(!traces.is_empty(), "no bundled trace matches --only");
    let model_dir = memcast_predictor::artifact::default_model_dir();
    let mut model = memcast_predictor::artifact::load_model(&model_dir)
        .with_context(|| format!("loading the default model from {}", model_dir.display()))?;
    let cfg = model.weights().config.clone();

    let mut rows = Vec::new();
    for b in traces {
        let t = b
            .load()
            .with_context(|| format!("bundled trace {}", b.name))?;
        let s = TraceStats::compute(&t)?;
        let run = |policy| {
            replay(
                &t,
                &ReplayOptions {
                    policy,
                    ..Default::default()
                },
            )
            .with_context(|| format!("replaying {} ({policy:?})", b.name))
        };
        let ours = run(Policy::Memcast)?;
        let emu = run(Policy::Pytorch)?;
        let native = pytorch_figures(b.name, "pytorch-native");
        let expandable = pytorch_figures(b.name, "pytorch-expandable-segments");
        let series =
            memcast_predictor::data::Series::from_trace(b.name, &t, cfg.step, cfg.model.horizon);
        let eval = memcast_predictor::eval::evaluate(&series, Some(&mut model))?;
        let (best, best_wape) = eval.best_baseline();
        let lstm_wape = eval.models.get("lstm").map_or(f64::NAN, |m| m.wape);
        let tier = replay_budgeted(
            &t,
            &TierReplayOptions {
                budget: Budget::Fraction(args.budget),
                ..Default::default()
            },
        )
        .with_context(|| format!("tiered replay of {}", b.name))?;
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
            "tiered": {"budget_fraction": args.budget, "completed": tier.completed, "ooms": tier.ooms,
                       "stall_overhead": tier.stall_overhead, "spilled_bytes": tier.spilled_bytes,
                       "prefetch_hit_rate": tier.prefetch_hit_rate},
        }));
    }
    if args.json {
        for r in &rows {
            println!("{r}");
        }
    } else {
        print_tables(&rows, args.budget);
    }
    Ok(())
}

fn pct(v: &serde_json::Value) -> String {
    v.as_f64()
        .map_or_else(|| "-".into(), |x| format!("{:.2}%", x * 100.0))
}

fn print_tables(rows: &[serde_json::Value], budget: f64) {
    println!(
        "memcast demo: {} real traces recorded with PyTorch on an NVIDIA H200\n",
        rows.len()
    );
    println!("1. What is in them");
    println!(
        "{:<30} {:>8} {:>8} {:>5} {:>11} {:>11}",
        "trace", "kind", "events", "iters", "static", "peak req."
    );
    for r in rows {
        let s = &r["stats"];
        println!(
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
    println!("\n2. Reserved-memory overhead (peak reserved / peak requested - 1) and device allocations,");
    println!(
        "   replayed on a simulated H200, next to what PyTorch itself reported on the real run"
    );
    println!(
        "{:<30} {:>9} {:>9} {:>9} {:>9} | {:>7} {:>7}",
        "trace", "memcast", "pt-emul.", "pt-real", "pt-expd.", "allocs", "pt-real"
    );
    for r in rows {
        let p = &r["replay"];
        println!(
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
    println!("\n3. Demand forecast of the default model (WAPE of requested bytes per step, horizons 1..N)");
    println!(
        "   (the default model was trained on these traces; docs/predictor.md has leave-one-out)"
    );
    println!(
        "{:<30} {:>6} {:>8} {:>16} {:>8}",
        "trace", "steps", "LSTM", "best baseline", "WAPE"
    );
    for r in rows {
        let f = &r["forecast"];
        println!(
            "{:<30} {:>6} {:>8.4} {:>16} {:>8.4}",
            r["trace"].as_str().unwrap_or(""),
            f["steps"].to_string(),
            f["lstm_wape"].as_f64().unwrap_or(f64::NAN),
            f["best_baseline"].as_str().unwrap_or(""),
            f["best_baseline_wape"].as_f64().unwrap_or(f64::NAN),
        );
    }
    println!(
        "\n4. Tiered replay with a device budget of {:.0}% of each trace's peak (reactive spill + prefetch)",
        budget * 100.0
    );
    println!(
        "{:<30} {:>9} {:>10} {:>11} {:>9}",
        "trace", "completed", "stall/comp", "spilled", "pf. hits"
    );
    for r in rows {
        let t = &r["tiered"];
        println!(
            "{:<30} {:>9} {:>10} {:>11} {:>9}",
            r["trace"].as_str().unwrap_or(""),
            t["completed"].to_string(),
            pct(&t["stall_overhead"]),
            human_bytes(t["spilled_bytes"].as_u64().unwrap_or(0)),
            pct(&t["prefetch_hit_rate"]),
        );
    }
}
