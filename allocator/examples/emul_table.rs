//! Development helper: the PyTorch emulation's peak reserved against PyTorch native's on
//! one corpus split, under a choice of the emulation's warm-up rules (only the
//! emulation is replayed: quicker than `memcast corpus`).
//!
//! `cargo run --release -p memcast-alloc --example emul_table -- MANIFEST SPLIT [WORKSPACES [WARMUP]]`
//!
//! `WORKSPACES`: `before`, `start-and-peak` (the default), `peak` or
//! `first-free-and-peak` (`PytorchConfig::workspaces.at`); `WARMUP`: `auto` (the
//! default), `first`, `largest` or `none` (`PytorchConfig::warmup`). Prints per trace the error, then the count
//! within 5%, the mean and the largest absolute error.

use memcast_alloc::replay::pytorch::PytorchConfig;
use memcast_alloc::replay::warmup::Warmup;
use memcast_alloc::replay::workspace::WorkspaceAt;
use memcast_alloc::replay::{replay, Policy, ReplayOptions};
use memcast_trace::corpus::{Corpus, Split};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: emul_table MANIFEST SPLIT [WORKSPACES [WARMUP]]";
    let manifest = args.first().ok_or(usage)?;
    let split: Split = args.get(1).ok_or(usage)?.parse()?;
    let mut cfg = PytorchConfig::default();
    if let Some(w) = args.get(2) {
        cfg.workspaces.at = serde_json::from_value::<WorkspaceAt>(serde_json::json!(w))?;
    }
    if let Some(w) = args.get(3) {
        cfg.warmup = serde_json::from_value::<Warmup>(serde_json::json!(w))?;
    }
    let corpus = Corpus::load(std::path::Path::new(manifest))?;
    let (mut n, mut within, mut sum, mut max) = (0, 0, 0.0f64, 0.0f64);
    for e in corpus.split(split) {
        let native = corpus
            .figures(&e.workload, "pytorch-native")
            .cloned()
            .or_else(|| memcast_trace::bundled::pytorch_figures(&e.workload, "pytorch-native"));
        let Some(native) = native else { continue };
        let t = memcast_trace::io::load_trace(&e.path)?;
        let o = ReplayOptions {
            policy: Policy::Pytorch,
            pytorch: cfg.clone(),
            ..Default::default()
        };
        let r = replay(&t, &o)?;
        let err = r.peak_reserved_bytes as f64 / native.peak_reserved as f64 - 1.0;
        n += 1;
        within += (err.abs() <= 0.05) as usize;
        sum += err.abs();
        max = max.max(err.abs());
        println!("{:<36} {:>+8.2}%", e.workload, 100.0 * err);
    }
    println!(
        "within 5%: {within} of {n}; mean abs {:.2}%; max {:.2}%",
        100.0 * sum / n.max(1) as f64,
        100.0 * max
    );
    Ok(())
}
