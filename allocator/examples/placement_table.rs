//! Planned placement against best fit and PyTorch's expandable segments, per trace of
//! a corpus split (or the traces given), on the `sim` device:
//! - `best fit`: memcast's default placement;
//! - `planned`: `placement:planned`, plans learned in the run (no profile);
//! - `profile, prefix`: a profile recorded from a shorter run of the same job (the
//!   trace's first `PREFIX` iterations, default 2) replayed over the whole trace: what
//!   a user gets who records a few steps once and then trains with the profile;
//! - `profile, whole`: the trace as its own profile (an upper bound: the run's exact
//!   future).
//!
//! Overheads are `peak reserved / peak requested - 1`; PyTorch's are its own figures
//! for the same recipe (`pytorch_allocator_figures.jsonl` beside the manifest).
//!
//! `cargo run --release -p memcast-alloc --example placement_table -- SPLIT|TRACE... [--prefix N]`
//! (SPLIT: train, validation, test or all, from training-data/corpus/manifest.tsv.)

use std::path::PathBuf;

use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::replay::{run, ReplayOptions};
use memcast_alloc::{AllocConfig, Allocator};
use memcast_trace::corpus::{Corpus, Split};
use memcast_trace::Trace;

/// (peak reserved, reserved overhead, device allocs, placement stats) of a replay of
/// `t` under `cfg`, with `profile` as the placement profile if given.
fn replay(
    t: &Trace,
    cfg: &AllocConfig,
    profile: Option<&Trace>,
) -> Result<(u64, f64, u64, serde_json::Value), Box<dyn std::error::Error>> {
    let opts = ReplayOptions {
        config: cfg.clone(),
        ..Default::default()
    };
    let mut a = Allocator::new(
        SimBackend::new(opts.sim_capacity, Default::default()),
        cfg.clone(),
    )?;
    if let Some(p) = profile {
        a.set_placement_profile(p)?;
    }
    let r = run(t, a, &opts)?;
    Ok((
        r.peak_reserved_bytes,
        r.reserved_overhead,
        r.device_allocs,
        r.extra["placement"].clone(),
    ))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut keep = 2usize;
    if let Some(i) = args.iter().position(|a| a == "--prefix") {
        keep = args.get(i + 1).ok_or("--prefix N")?.parse()?;
        args.drain(i..i + 2);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../training-data/corpus");
    let corpus = Corpus::load(&root.join("manifest.tsv"))?;
    let mut traces: Vec<(String, PathBuf, bool)> = Vec::new();
    for a in &args {
        let split = match a.as_str() {
            "all" => None,
            s => match s.parse::<Split>() {
                Ok(s) => Some(s),
                Err(_) => {
                    let p = PathBuf::from(a);
                    let name = p.file_stem().map(|s| s.to_string_lossy().into_owned());
                    traces.push((name.unwrap_or_default(), p, false));
                    continue;
                }
            },
        };
        for e in corpus
            .entries
            .iter()
            .filter(|e| split.is_none_or(|s| e.split == s))
        {
            traces.push((e.workload.clone(), e.path.clone(), e.dynamic));
        }
    }
    let best_fit = AllocConfig::default();
    let planned = AllocConfig::default().with_conf_string("placement:planned")?;
    println!("| trace | shapes | best fit | planned | profile, prefix ({keep} it.) | profile, whole | PyTorch expandable | prefix profile hits / misses | prefix at or below expandable |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let (mut n, mut below, mut below_bf) = (0, 0, 0);
    for (name, path, dynamic) in traces {
        let t = memcast_trace::io::load_trace(&path)?;
        let bf = replay(&t, &best_fit, None)?;
        let pl = replay(&t, &planned, None)?;
        let pre = replay(&t, &planned, Some(&t.until_boundary(keep)))?;
        let whole = replay(&t, &planned, Some(&t))?;
        if std::env::var_os("PLACEMENT_DEBUG").is_some() {
            eprintln!("{name}: prefix {} whole {}", pre.3, whole.3);
        }
        let exp = corpus
            .figures(&name, "pytorch-expandable-segments")
            .map(|f| f.comparable_overhead());
        let pct = |x: f64| format!("{:.2}%", 100.0 * x);
        let cmp = exp.map_or("-".to_string(), |e| {
            n += 1;
            let ok = pre.1 <= e + 1e-12;
            below += ok as u32;
            below_bf += (bf.1 <= e + 1e-12) as u32;
            if ok { "yes" } else { "no" }.into()
        });
        println!(
            "| {name} | {} | {} ({}) | {} ({}) | {} ({}) | {} ({}) | {} | {} / {} | {cmp} |",
            if dynamic { "dynamic" } else { "static" },
            pct(bf.1),
            bf.2,
            pct(pl.1),
            pl.2,
            pct(pre.1),
            pre.2,
            pct(whole.1),
            whole.2,
            exp.map_or("-".into(), pct),
            pre.3["profile_hits"],
            pre.3["profile_misses"],
        );
    }
    if n > 0 {
        println!(
            "\nAt or below PyTorch expandable segments: profile from the prefix {below} of {n}; best fit {below_bf} of {n}."
        );
    }
    Ok(())
}
