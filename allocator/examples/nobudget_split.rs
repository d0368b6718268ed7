//! Predictive mode without a budget on one split of the recorded corpus (default
//! `test`, the traces nothing was chosen on): memcast reactive against predictive mode
//! (default actions) with the LSTM, `seasonal` and the oracle, on the simulated H200,
//! and the counts of the no-budget goals: reserved overhead not worse than reactive's;
//! no device call inside a request after the first iteration on static traces; on
//! dynamic traces at most half of reactive's.
//!
//! `cargo run --release -p memcast-alloc --example nobudget_split [SPLIT]`
//! (from the repository root).

use memcast_alloc::replay::{ReplayForecaster, ReplayReport};
use memcast_trace::corpus::{Corpus, Split};

#[path = "shared/no_budget.rs"]
mod shared;
use shared::no_budget as run;

const FORECASTERS: [ReplayForecaster; 3] = [
    ReplayForecaster::Lstm,
    ReplayForecaster::Seasonal,
    ReplayForecaster::Oracle,
];

/// Whether `p` meets the no-budget goals against reactive `r`: (overhead not worse,
/// device calls after the first iteration as the goal for the trace's kind asks).
/// Overheads are compared to a hundredth of a point, the precision the tables print.
fn goals(dynamic: bool, r: &ReplayReport, p: &ReplayReport) -> (bool, bool) {
    let not_worse = (1e4 * p.reserved_overhead).round() <= (1e4 * r.reserved_overhead).round();
    let (rc, pc) = (
        r.critical_path_device_calls_after_first_iteration,
        p.critical_path_device_calls_after_first_iteration,
    );
    let calls = if dynamic { 2 * pc <= rc } else { pc == 0 };
    (not_worse, calls)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let split: Split = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "test".into())
        .parse()?;
    let corpus = Corpus::load(std::path::Path::new("training-data/corpus/manifest.tsv"))?;
    println!("| trace | shapes | overhead: reactive / lstm / seasonal / oracle | calls in requests after iteration 1: reactive / lstm / seasonal / oracle | ahead: lstm / seasonal / oracle | mean reserved GB: reactive / lstm |");
    println!("|---|---|---|---|---|---|");
    // Per forecaster: traces where the overhead is not worse, where the calls goal holds.
    let mut met = [[0u32; 2]; FORECASTERS.len()];
    let (mut n, mut n_dyn) = (0u32, 0u32);
    let (mut sum_r, mut sum_l) = (0.0f64, 0.0f64);
    for e in corpus.split(split) {
        let t = memcast_trace::io::load_trace(&e.path)?;
        let r = run(&t, None)?;
        let ps: Vec<ReplayReport> = FORECASTERS
            .iter()
            .map(|&f| run(&t, Some(f)))
            .collect::<Result<_, _>>()?;
        for (m, p) in met.iter_mut().zip(&ps) {
            let (a, b) = goals(e.dynamic, &r, p);
            m[0] += u32::from(a);
            m[1] += u32::from(b);
        }
        n += 1;
        n_dyn += u32::from(e.dynamic);
        sum_r += r.mean_reserved_bytes;
        sum_l += ps[0].mean_reserved_bytes;
        let pct = |x: &ReplayReport| format!("{:.2}%", 100.0 * x.reserved_overhead);
        let calls = |x: &ReplayReport| {
            x.critical_path_device_calls_after_first_iteration
                .to_string()
        };
        let join = |v: Vec<String>| v.join(" / ");
        println!(
            "| {} | {} | {} | {} | {} | {:.3} / {:.3} |",
            e.workload,
            if e.dynamic { "dynamic" } else { "static" },
            join(std::iter::once(&r).chain(&ps).map(pct).collect()),
            join(std::iter::once(&r).chain(&ps).map(calls).collect()),
            join(
                ps.iter()
                    .map(|p| p.ahead_device_calls.to_string())
                    .collect()
            ),
            r.mean_reserved_bytes / 1e9,
            ps[0].mean_reserved_bytes / 1e9,
        );
    }
    println!();
    println!(
        "{n} traces ({n_dyn} dynamic); mean reserved {:.3} GB reactive, {:.3} GB predictive with the LSTM",
        sum_r / f64::from(n.max(1)) / 1e9,
        sum_l / f64::from(n.max(1)) / 1e9,
    );
    for (f, m) in FORECASTERS.iter().zip(&met) {
        println!(
            "{}: overhead not worse than reactive on {} of {n}; calls after iteration 1 as the goal asks (0 on static, at most half of reactive's on dynamic) on {} of {n}",
            f.name(),
            m[0],
            m[1],
        );
    }
    Ok(())
}
