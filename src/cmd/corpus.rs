//! `memcast corpus`: re-checks memcast on one split of a trace corpus (a manifest of
//! recorded traces with PyTorch's own figures for the same runs).
//!
//! Per trace: memcast's reserved-memory overhead next to what PyTorch native and
//! expandable segments reserved on the real run; the PyTorch emulation's peak reserved
//! against PyTorch native's; device allocations; the tiered replay under a device
//! budget; and, for dynamic traces, the forecaster's WAPE against the best
//! non-learned forecaster, on requested bytes per step and on the horizon's peak rise
//! of live bytes (what predictive mode acts on). Then the share of traces that meet
//! each target.

use std::path::PathBuf;

use anyhow::{Context, Result};
use memcast_alloc::replay::pytorch::SegmentOrder;
use memcast_alloc::replay::warmup::StaticOrder;
use memcast_alloc::replay::{replay, Policy, ReplayForecaster, ReplayOptions};
use memcast_alloc::tier::{replay_budgeted, Budget, TierReplayOptions};
use memcast_trace::corpus::{Corpus, Split};
use serde_json::json;

#[derive(clap::Args)]
pub struct CorpusArgs {
    /// The corpus manifest (tab-separated: file, workload, family, shapes, split,
    /// description), with pytorch_allocator_figures.jsonl beside it.
    #[arg(default_value = "training-data/corpus/manifest.tsv")]
    pub manifest: PathBuf,
    /// Which split to check: train, validation or test.
    #[arg(long, default_value = "test")]
    pub split: String,
    /// Device budget of the tiered replay, a share of each trace's peak requested bytes.
    #[arg(long, default_value = "60%")]
    pub budget: String,
    /// Forecaster artifact directory (default: the model built into memcast).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Order in which the PyTorch emulation's modelled process creates the static
    /// blocks: size-desc (default), size-asc, or trace (the trace's own order, which
    /// for an imported snapshot is PyTorch's final layout).
    #[arg(long, default_value = "size-desc")]
    pub static_order: String,
    /// The PyTorch emulation's address order of segments, which breaks ties in best
    /// fit: newest-first (default) or oldest-first.
    #[arg(long, default_value = "newest-first")]
    pub segment_order: String,
    /// memcast's allocator settings for its replay, `key:value,...` (as `memcast
    /// replay --conf`; e.g. `page_release:peak`). The tiered replay keeps its own.
    #[arg(long)]
    pub conf: Option<String>,
    /// Print one JSON object per trace, then a summary object.
    #[arg(long)]
    pub json: bool,
}

/// Targets the summary counts (shares of the split's traces).
const EMULATION_TOLERANCE: f64 = 0.05;
const STATIC_OVERHEAD_TARGET: f64 = 0.02;
const WAPE_RATIO_TARGET: f64 = 0.8;

pub fn run(args: CorpusArgs) -> Result<()> {
    let split: Split = args
        .split
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--split: {e}"))?;
    let budget = memcast_alloc::tier::budget::parse_share(
        &args.budget,
        "the corpus holds traces of different sizes",
    )
    .map_err(|e| anyhow::anyhow!("--budget: {e}"))?;
    let static_order: StaticOrder = choice(
        "--static-order",
        &args.static_order,
        "size-desc, size-asc or trace",
    )?;
    let segment_order: SegmentOrder = choice(
        "--segment-order",
        &args.segment_order,
        "newest-first or oldest-first",
    )?;
    let corpus = Corpus::load(&args.manifest)
        .with_context(|| format!("reading corpus manifest {}", args.manifest.display()))?;
    let entries: Vec<_> = corpus.split(split).collect();
    anyhow::ensure!(
        !entries.is_empty(),
        "{}: no trace in split {split}",
        args.manifest.display()
    );
    // Before any figure: a row naming a missing file, and one whose file is named for
    // another workload (PyTorch's figures are matched by workload, so its replay would
    // be set beside another job's figures).
    for e in &entries {
        let at = || format!("{} line {}", args.manifest.display(), e.line);
        anyhow::ensure!(
            e.path.is_file(),
            "{}: the trace {} of workload {} does not exist",
            at(),
            e.path.display(),
            e.workload
        );
        let stem = memcast_trace::io::trace_name(&e.path);
        if stem != e.workload {
            eprintln!(
                "warning: {}: the file {} is named for {stem}, the row for workload {}: \
                 PyTorch's figures are those of {}",
                at(),
                e.path.display(),
                e.workload,
                e.workload
            );
        }
    }
    let unmeasured: Vec<&str> = entries
        .iter()
        .filter(|e| figures(&corpus, &e.workload, "pytorch-native").is_none())
        .map(|e| e.workload.as_str())
        .collect();
    if !unmeasured.is_empty() {
        let at = args
            .manifest
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join(memcast_trace::corpus::FIGURES_FILE);
        let state = if at.exists() {
            ""
        } else {
            ", which does not exist"
        };
        eprintln!(
            "warning: no PyTorch figures for {} of {} traces of split {split} in {}{state}; \
             their PyTorch columns stay empty and they count in no comparison with PyTorch: {}",
            unmeasured.len(),
            entries.len(),
            at.display(),
            unmeasured.join(", ")
        );
    }
    let alloc = match &args.conf {
        Some(c) => memcast_alloc::AllocConfig::default()
            .with_conf_string(c)
            .context("--conf")?,
        None => memcast_alloc::AllocConfig::default(),
    };
    let mut model = super::load_model(&args.model)?;
    let cfg = model.weights().config.clone();

    let mut rows = Vec::new();
    for e in entries {
        let t = memcast_trace::io::load_trace(&e.path)
            .with_context(|| format!("loading {}", e.path.display()))?;
        let run = |policy| {
            let mut o = ReplayOptions {
                policy,
                forecaster: ReplayForecaster::None,
                config: alloc.clone(),
                ..Default::default()
            };
            o.pytorch.static_order = static_order;
            o.pytorch.segment_order = segment_order;
            replay(&t, &o).with_context(|| format!("replaying {} ({policy:?})", e.workload))
        };
        let ours = run(Policy::Memcast)?;
        let emu = run(Policy::Pytorch)?;
        let native = figures(&corpus, &e.workload, "pytorch-native");
        let expandable = figures(&corpus, &e.workload, "pytorch-expandable-segments");
        let tier = replay_budgeted(
            &t,
            &TierReplayOptions {
                budget: Budget::Fraction(budget),
                ..Default::default()
            },
        )
        .with_context(|| format!("tiered replay of {}", e.workload))?;
        let forecast = if e.dynamic {
            let series = memcast_predictor::data::Series::from_trace(
                &e.workload,
                &t,
                cfg.step,
                cfg.model.horizon,
            );
            let r = memcast_predictor::eval::evaluate(&series, Some(&mut model))?;
            let (best, best_wape) = r.best_baseline();
            let lstm = r.models.get("lstm").map_or(f64::NAN, |m| m.wape);
            let (pbest, pbest_wape) = r.best_peak_baseline();
            let plstm = r.peak_rise.get("lstm").map_or(f64::NAN, |m| m.wape);
            Some(
                json!({"lstm_wape": lstm, "best_baseline": best, "best_baseline_wape": best_wape,
                        "ratio": lstm / best_wape, "models": r.models.iter().map(|(k, m)| (k.clone(), m.wape)).collect::<std::collections::BTreeMap<_, _>>(),
                        "peak_rise": {"lstm_wape": plstm, "best_baseline": pbest, "best_baseline_wape": pbest_wape,
                                      "ratio": plstm / pbest_wape,
                                      "models": r.peak_rise.iter().map(|(k, m)| (k.clone(), m.wape)).collect::<std::collections::BTreeMap<_, _>>()}}),
            )
        } else {
            None
        };
        let emu_error = native
            .as_ref()
            .map(|n| emu.peak_reserved_bytes as f64 / n.peak_reserved as f64 - 1.0);
        let row = json!({
            "workload": e.workload, "family": e.family, "dynamic": e.dynamic,
            "memcast": {"reserved_overhead": ours.reserved_overhead, "peak_reserved_bytes": ours.peak_reserved_bytes,
                        "device_allocs": ours.device_allocs, "device_frees": ours.device_frees,
                        "critical_path_device_calls_after_first_iteration": ours.critical_path_device_calls_after_first_iteration,
                        "device_time_us": ours.device_time_us,
                        "pages_moved_per_iteration": ours.pages_moved_per_iteration},
            "pytorch_emulation": {"peak_reserved_bytes": emu.peak_reserved_bytes, "device_allocs": emu.device_allocs,
                                  "error_vs_native": emu_error},
            "pytorch_native": native.as_ref().map(|f| json!({"reserved_overhead": f.comparable_overhead(),
                                  "reserved_overhead_vs_allocated": f.reserved_overhead(),
                                  "peak_reserved_bytes": f.peak_reserved, "device_allocs": f.num_device_alloc})),
            "pytorch_expandable": expandable.as_ref().map(|f| json!({"reserved_overhead": f.comparable_overhead(),
                                  "reserved_overhead_vs_allocated": f.reserved_overhead(),
                                  "peak_reserved_bytes": f.peak_reserved, "device_allocs": f.num_device_alloc})),
            "tiered": {"budget_fraction": budget, "completed": tier.completed, "ooms": tier.ooms,
                       "stall_overhead": tier.stall_overhead, "link_floor_overhead": tier.link_floor_overhead, "peak_floor_overhead": tier.peak_floor_overhead,
                       "spilled_bytes": tier.spilled_bytes, "prefetch_hit_rate": tier.prefetch_hit_rate},
            "forecast": forecast,
        });
        if args.json {
            out!("{row}");
        }
        rows.push(row);
    }
    let summary = summarize(&rows);
    if args.json {
        out!("{}", json!({ "summary": summary }));
    } else {
        print_table(split, budget, &rows, &summary);
    }
    Ok(())
}

fn figures(
    corpus: &Corpus,
    workload: &str,
    allocator: &str,
) -> Option<memcast_trace::bundled::PytorchFigures> {
    corpus
        .figures(workload, allocator)
        .cloned()
        .or_else(|| memcast_trace::bundled::pytorch_figures(workload, allocator))
}

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

fn summarize(rows: &[serde_json::Value]) -> serde_json::Value {
    let n = rows.len();
    let count = |p: &dyn Fn(&serde_json::Value) -> bool| rows.iter().filter(|r| p(r)).count();
    let with_exp = count(&|r| r["pytorch_expandable"].is_object());
    let at_or_below_exp = count(&|r| {
        f(&r["memcast"]["reserved_overhead"]) <= f(&r["pytorch_expandable"]["reserved_overhead"])
    });
    let statics = count(&|r| r["dynamic"] == false);
    let static_ok = count(&|r| {
        r["dynamic"] == false && f(&r["memcast"]["reserved_overhead"]) <= STATIC_OVERHEAD_TARGET
    });
    let with_native = count(&|r| r["pytorch_native"].is_object());
    let emu_ok =
        count(&|r| f(&r["pytorch_emulation"]["error_vs_native"]).abs() <= EMULATION_TOLERANCE);
    let dynamic = count(&|r| r["forecast"].is_object());
    let wape_ok = count(&|r| f(&r["forecast"]["ratio"]) <= WAPE_RATIO_TARGET);
    let peak_ok = count(&|r| f(&r["forecast"]["peak_rise"]["ratio"]) <= WAPE_RATIO_TARGET);
    let completed = count(&|r| r["tiered"]["completed"] == true);
    json!({
        "traces": n,
        "memcast_at_or_below_expandable": [at_or_below_exp, with_exp],
        "static_memcast_overhead_at_most_2pct": [static_ok, statics],
        "emulation_within_5pct_of_native": [emu_ok, with_native],
        "dynamic_lstm_wape_at_most_0_8x_best_baseline": [wape_ok, dynamic],
        "dynamic_lstm_peak_rise_wape_at_most_0_8x_best_baseline": [peak_ok, dynamic],
        "tiered_completed": [completed, n],
    })
}

fn pct(v: f64) -> String {
    if v.is_finite() {
        format!("{:.2}%", 100.0 * v)
    } else {
        "-".into()
    }
}

fn print_table(split: Split, budget: f64, rows: &[serde_json::Value], s: &serde_json::Value) {
    out!("memcast corpus: {} traces of the {split} split", rows.len());
    out!(
        "reserved overhead = peak reserved / peak requested - 1, for memcast and for PyTorch (its \
         figures' peak requested; / peak allocated where the figures lack it); \
         emulation = PyTorch emulation's peak reserved vs PyTorch native's; allocs = device \
         allocations; tiered = replay under a budget of {:.0}% of the peak (stall as a share of \
         compute); WAPE = forecast error on dynamic traces, LSTM vs the best non-learned forecaster \
         (requested bytes per step; peak: the horizon's peak rise of live bytes)",
        100.0 * budget
    );
    out!(
        "{:<34} {:>4} {:>8} {:>8} {:>8} {:>8} {:>17} {:>10} {:>18}",
        "workload",
        "",
        "memcast",
        "expand.",
        "native",
        "emul.",
        "allocs m/e/n/x",
        "tiered",
        "WAPE lstm/best"
    );
    for r in rows {
        let alloc = |k: &str| {
            r[k]["device_allocs"]
                .as_u64()
                .map_or("-".to_string(), |v| v.to_string())
        };
        let wape = if r["forecast"].is_object() {
            let p = &r["forecast"]["peak_rise"];
            format!(
                "{:.3}/{:.3} {}; peak {:.3}/{:.3} {}",
                f(&r["forecast"]["lstm_wape"]),
                f(&r["forecast"]["best_baseline_wape"]),
                r["forecast"]["best_baseline"].as_str().unwrap_or(""),
                f(&p["lstm_wape"]),
                f(&p["best_baseline_wape"]),
                p["best_baseline"].as_str().unwrap_or("")
            )
        } else {
            "-".into()
        };
        let tiered = if r["tiered"]["completed"] == true {
            pct(f(&r["tiered"]["stall_overhead"]))
        } else {
            "OOM".into()
        };
        out!(
            "{:<34} {:>4} {:>8} {:>8} {:>8} {:>8} {:>17} {:>10} {:>18}",
            r["workload"].as_str().unwrap_or(""),
            if r["dynamic"] == true { "dyn" } else { "stat" },
            pct(f(&r["memcast"]["reserved_overhead"])),
            pct(f(&r["pytorch_expandable"]["reserved_overhead"])),
            pct(f(&r["pytorch_native"]["reserved_overhead"])),
            pct(f(&r["pytorch_emulation"]["error_vs_native"])),
            format!(
                "{}/{}/{}/{}",
                alloc("memcast"),
                alloc("pytorch_emulation"),
                alloc("pytorch_native"),
                alloc("pytorch_expandable")
            ),
            tiered,
            wape,
        );
    }
    let frac = |k: &str| format!("{} of {}", s[k][0], s[k][1]);
    out!("");
    out!(
        "memcast at or below expandable segments: {}",
        frac("memcast_at_or_below_expandable")
    );
    out!(
        "static traces with memcast overhead at most 2%: {}",
        frac("static_memcast_overhead_at_most_2pct")
    );
    out!(
        "PyTorch emulation within 5% of native peak reserved: {}",
        frac("emulation_within_5pct_of_native")
    );
    out!(
        "dynamic traces with LSTM WAPE at most 0.8x the best non-learned forecaster: {}",
        frac("dynamic_lstm_wape_at_most_0_8x_best_baseline")
    );
    out!(
        "the same on the horizon's peak rise of live bytes (what predictive mode acts on): {}",
        frac("dynamic_lstm_peak_rise_wape_at_most_0_8x_best_baseline")
    );
    out!("tiered replays completed: {}", frac("tiered_completed"));
}

/// A kebab-case setting named `value`, or an error naming the flag and its `choices`.
fn choice<T: serde::de::DeserializeOwned>(flag: &str, value: &str, choices: &str) -> Result<T> {
    serde_json::from_value(json!(value)).map_err(|_| anyhow::anyhow!("{flag} {value}: {choices}"))
}
