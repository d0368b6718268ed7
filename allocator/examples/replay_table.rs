//! Replays the eight bundled real traces (the shared PyTorch snapshots, converted)
//! through `memcast` and the `pytorch` emulation on the `sim` device, and prints the
//! comparison table of docs/allocator.md, with PyTorch's own figures when given
//! `pytorch_allocator_figures.jsonl`. The emulation runs with its default modelled
//! warm-up, and again without it (`warmup: none`) for comparison.
//!
//! `cargo run --release -p memcast-alloc --example replay_table -- [FIGURES.jsonl] [WARMUP]`
//! (`WARMUP`: the emulation's modelled warm-up, `first` (default), `largest` or `none`.)
//! (`MEMCAST_ALLOC_CONF` configures the `memcast` policy.)

use memcast_alloc::replay::warmup::Warmup;
use memcast_alloc::replay::{replay, Policy, ReplayOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let figures: Vec<serde_json::Value> = match std::env::args().nth(1) {
        Some(p) => std::fs::read_to_string(p)?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let fig = |name: &str, alloc: &str, key: &str| -> Option<f64> {
        figures
            .iter()
            .find(|f| f["name"] == name && f["allocator"] == alloc)
            .and_then(|f| f[key].as_f64())
    };
    let warmup: Warmup = match std::env::args().nth(2) {
        Some(w) => serde_json::from_value(serde_json::Value::String(w))?,
        None => Warmup::default(),
    };
    let cfg = memcast_alloc::AllocConfig::from_env()?;
    println!("| trace | kind | memcast overhead | memcast device allocs | pytorch emulation overhead | emulation peak reserved vs PyTorch | same, no warm-up | emulation device allocs | PyTorch native overhead | PyTorch native device allocs | PyTorch segments at the end | PyTorch expandable overhead | memcast events/s |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for b in memcast_trace::bundled::ALL {
        let t = b.load()?;
        let mut o = ReplayOptions {
            config: cfg.clone(),
            ..Default::default()
        };
        let m = replay(&t, &o)?;
        o.policy = Policy::Pytorch;
        o.pytorch.warmup = warmup;
        let p = replay(&t, &o)?;
        o.pytorch.warmup = Warmup::None;
        let cold = replay(&t, &o)?;
        let ovh = |a: Option<f64>, r: Option<f64>| match (a, r) {
            (Some(a), Some(r)) => format!("{:.2}%", 100.0 * (r / a - 1.0)),
            _ => "-".into(),
        };
        let nat_res = fig(b.name, "pytorch-native", "peak_reserved");
        let vs = |bytes: u64| {
            nat_res
                .map(|r| format!("{:+.1}%", 100.0 * (bytes as f64 / r - 1.0)))
                .unwrap_or("-".into())
        };
        let count = |key: &str| {
            fig(b.name, "pytorch-native", key)
                .map(|v| v.to_string())
                .unwrap_or("-".into())
        };
        // Segments PyTorch still held at the end: comparable with the emulation's
        // device allocs, unlike the counters, which also count earlier runs in the same
        // process (a few held segments were inherited from those).
        let held = match (
            fig(b.name, "pytorch-native", "num_device_alloc"),
            fig(b.name, "pytorch-native", "num_device_free"),
        ) {
            (Some(a), Some(f)) => (a - f).to_string(),
            _ => "-".into(),
        };
        println!(
            "| {} | {} | {:.2}% | {} | {:.2}% | {} | {} | {} | {} | {} | {} | {} | {:.1} M |",
            b.name,
            if b.dynamic { "dynamic" } else { "static" },
            100.0 * m.reserved_overhead,
            m.device_allocs,
            100.0 * p.reserved_overhead,
            vs(p.peak_reserved_bytes),
            vs(cold.peak_reserved_bytes),
            p.device_allocs,
            ovh(fig(b.name, "pytorch-native", "peak_allocated"), nat_res),
            count("num_device_alloc"),
            held,
            ovh(
                fig(b.name, "pytorch-expandable-segments", "peak_allocated"),
                fig(b.name, "pytorch-expandable-segments", "peak_reserved")
            ),
            m.events_per_sec / 1e6,
        );
    }
    Ok(())
}
