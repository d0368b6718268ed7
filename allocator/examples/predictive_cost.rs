//! What predictive mode costs the allocating thread, and what it did: runs the
//! `alloc_free` bench's programs (`benches/workload`) `RUNS` times through memcast
//! reactive and in predictive mode (with the forecaster and mode `MEMCAST_ALLOC_CONF`
//! sets on top of `predictive:true`), alternating, and prints ns per alloc+free pair
//! with the online path's counters.
//!
//! `cargo run --release -p memcast-alloc --example predictive_cost [RUNS]`

use std::time::Instant;

use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::{AllocConfig, Allocation, Allocator};

#[path = "../benches/workload/mod.rs"]
mod workload;

fn run(
    a: &mut Allocator<SimBackend>,
    mixed: &[(usize, u64)],
    trace: &[(usize, Option<u64>)],
    trace_slots: usize,
) {
    let mut slots: Vec<Option<Allocation>> = vec![None; workload::SLOTS];
    for &(slot, bytes) in mixed {
        if let Some(h) = slots[slot].take() {
            a.deallocate(h, 0).expect("free");
        }
        slots[slot] = Some(a.allocate(bytes, 0).expect("alloc"));
    }
    for h in slots.iter_mut().filter_map(Option::take) {
        a.deallocate(h, 0).expect("free");
    }
    let mut live: Vec<Option<Allocation>> = vec![None; trace_slots];
    for &(slot, op) in trace {
        match op {
            Some(bytes) => live[slot] = Some(a.allocate(bytes, 0).expect("alloc")),
            None => a
                .deallocate(live[slot].take().expect("live"), 0)
                .expect("free"),
        }
    }
    a.iteration_boundary();
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runs: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(20);
    let mixed = workload::program(&workload::MIX);
    let t = workload::trace_ops();
    let pairs = (mixed.len() + t.ops.iter().filter(|(_, b)| b.is_some()).count()) as f64;
    let base = AllocConfig::from_env()?;
    let mut reactive = Allocator::new(
        SimBackend::h200(),
        AllocConfig {
            predictive: false,
            ..base.clone()
        },
    )?;
    let mut pred = Allocator::new(
        SimBackend::h200(),
        AllocConfig {
            predictive: true,
            ..base
        },
    )?;
    let _s1: Vec<_> = t.statics.iter().map(|&b| reactive.allocate(b, 0)).collect();
    let _s2: Vec<_> = t.statics.iter().map(|&b| pred.allocate(b, 0)).collect();
    let (mut tr, mut tp) = (Vec::new(), Vec::new());
    let (wall, cpu0) = (Instant::now(), forecast_thread_cpu_ms());
    for _ in 0..runs {
        let t0 = Instant::now();
        run(&mut reactive, &mixed, &t.ops, t.slots);
        tr.push(t0.elapsed().as_secs_f64() * 1e9 / pairs);
        let t0 = Instant::now();
        run(&mut pred, &mixed, &t.ops, t.slots);
        tp.push(t0.elapsed().as_secs_f64() * 1e9 / pairs);
    }
    // (The thread may not have named itself yet at the start.)
    if let Some(b) = forecast_thread_cpu_ms() {
        let a = cpu0.unwrap_or(0);
        println!(
            "forecast thread CPU {} ms over {:.0} ms of runs",
            b - a,
            wall.elapsed().as_secs_f64() * 1e3
        );
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (r, p) = (median(&mut tr), median(&mut tp));
    println!("reactive   {r:.1} ns/pair (median of {runs})");
    println!("predictive {p:.1} ns/pair ({:+.1}%)", 100.0 * (p / r - 1.0));
    let s = pred.stats();
    println!(
        "forecasts used {}, advice applied {}, ahead device calls {}",
        s.forecasts_used, s.advice_applied, s.ahead_device_calls
    );
    if let Some(o) = pred.online() {
        println!("chunks handed over {}", o.chunks);
        if let Some(st) = o.service_stats() {
            println!("service {st:?}");
        }
    }
    Ok(())
}

/// CPU time of this process's `memcast-forecast` thread (Linux `/proc`; `None`
/// elsewhere), in ms.
fn forecast_thread_cpu_ms() -> Option<u64> {
    let tick_ms = 10; // USER_HZ = 100
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .filter_map(Result::ok)
        .find_map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            if !comm.starts_with("memcast-fore") {
                return None;
            }
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            // After the command's closing parenthesis: utime and stime are the 12th and
            // 13th fields.
            let rest = &stat[stat.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split(' ').collect();
            let (u, s): (u64, u64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
            Some((u + s) * tick_ms)
        })
}
