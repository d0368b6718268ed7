//! Where the `alloc_free` time goes: each part of the bench's programs alone, memcast
//! against offset-allocator on the same sequence in the same run (ns per alloc+free pair,
//! best of the runs after three warm-up runs).
//!
//! `cargo run --release -p memcast-alloc --example fast_path_parts [RUNS [PART]]`
//! (PART: run only that part, e.g. under `perf record`)
//! (memcast's configuration from `MEMCAST_ALLOC_CONF`, as in the bench)
//!
//! Parts: `small` (256 B-64 KiB: slabs), `mid` (64 KiB-1 MiB), `big` (1-16 MiB), `mixed`
//! (the bench's mix), `trace` (resnet50_b64_train's sequence, its static blocks allocated
//! first and kept), and `extents`: memcast's
//! placement index alone (best fit, take, release) on the `mid` sizes.

use std::time::Instant;

use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::extents::Extents;
use memcast_alloc::{AllocConfig, Allocation, Allocator};

#[path = "../benches/workload/mod.rs"]
mod workload;
use workload::{program, trace_ops, MIX, SLOTS};

const UNIT: u64 = 256;

/// Best time of `runs` (after 3 warm-up runs) of `f`, in ns per pair.
fn best(runs: usize, pairs: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for i in 0..runs + 3 {
        let t = Instant::now();
        f();
        if i >= 3 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    best * 1e9 / pairs as f64
}

fn memcast() -> Allocator<SimBackend> {
    let cfg = AllocConfig::from_env().expect("MEMCAST_ALLOC_CONF");
    Allocator::new(SimBackend::h200(), cfg).expect("allocator")
}

fn offset() -> offset_allocator::Allocator {
    offset_allocator::Allocator::new((16u64 << 30).div_ceil(UNIT) as u32)
}

fn slots_part(prog: &[(usize, u64)], runs: usize) -> (f64, f64) {
    let mut a = memcast();
    let mut live: Vec<Option<Allocation>> = vec![None; SLOTS];
    let m = best(runs, prog.len(), || {
        for &(s, b) in prog {
            if let Some(h) = live[s].take() {
                a.deallocate(h, 0).expect("free");
            }
            live[s] = Some(a.allocate(b, 0).expect("alloc"));
        }
        for h in live.iter_mut().filter_map(Option::take) {
            a.deallocate(h, 0).expect("free");
        }
    });
    let mut o = offset();
    let mut live: Vec<Option<offset_allocator::Allocation>> = vec![None; SLOTS];
    let p = best(runs, prog.len(), || {
        for &(s, b) in prog {
            if let Some(h) = live[s].take() {
                o.free(h);
            }
            live[s] = Some(o.allocate(b.div_ceil(UNIT) as u32).expect("alloc"));
        }
        for h in live.iter_mut().filter_map(Option::take) {
            o.free(h);
        }
    });
    (m, p)
}

fn trace_part(runs: usize) -> (f64, f64) {
    let t = trace_ops();
    let (ops, n) = (&t.ops, t.slots);
    let pairs = ops.iter().filter(|o| o.1.is_some()).count();
    let mut a = memcast();
    // Static blocks first, kept (as in the bench).
    let _statics: Vec<Allocation> = t
        .statics
        .iter()
        .map(|&b| a.allocate(b, 0).expect("static"))
        .collect();
    let mut live: Vec<Option<Allocation>> = vec![None; n];
    let m = best(runs, pairs, || {
        for &(s, op) in ops {
            match op {
                Some(b) => live[s] = Some(a.allocate(b, 0).expect("alloc")),
                None => a
                    .deallocate(live[s].take().expect("live"), 0)
                    .expect("free"),
            }
        }
    });
    let mut o = offset();
    let _statics: Vec<_> = t
        .statics
        .iter()
        .map(|&b| o.allocate(b.div_ceil(UNIT) as u32).expect("static"))
        .collect();
    let mut live: Vec<Option<offset_allocator::Allocation>> = vec![None; n];
    let p = best(runs, pairs, || {
        for &(s, op) in ops {
            match op {
                Some(b) => live[s] = Some(o.allocate(b.div_ceil(UNIT) as u32).expect("alloc")),
                None => o.free(live[s].take().expect("live")),
            }
        }
    });
    (m, p)
}

fn extents_part(prog: &[(usize, u64)], runs: usize) -> f64 {
    let mut ex = Extents::default();
    ex.append(false, 0, 1 << 40);
    let mut live: Vec<Option<u32>> = vec![None; SLOTS];
    best(runs, prog.len(), || {
        for &(s, b) in prog {
            if let Some(h) = live[s].take() {
                ex.release(h);
            }
            let len = b.next_multiple_of(UNIT);
            let f = ex.best_fit(false, len).expect("fits");
            let (_, off, _) = ex.span(f);
            live[s] = Some(ex.take(f, off, len));
        }
        for h in live.iter_mut().filter_map(Option::take) {
            ex.release(h);
        }
    })
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .map_or(Ok(27), |s| s.parse())
        .expect("RUNS: a number");
    if let Some(part) = std::env::args().nth(2) {
        return only(&part, runs);
    }
    println!("| part | memcast ns/pair | offset-allocator ns/pair |");
    println!("|---|---|---|");
    for (name, ranges) in [
        ("small", &[(100, 8.0, 16.0)][..]),
        ("mid", &[(100, 16.0, 20.0)][..]),
        ("big", &[(100, 20.0, 24.0)][..]),
        ("mixed", &MIX[..]),
    ] {
        let (m, p) = slots_part(&program(ranges), runs);
        println!("| {name} | {m:.1} | {p:.1} |");
    }
    let (m, p) = trace_part(runs);
    println!("| trace (resnet50_b64_train) | {m:.1} | {p:.1} |");
    let e = extents_part(&program(&[(100, 16.0, 20.0)]), runs);
    println!("| extents alone (mid sizes) | {e:.1} | |");
}

/// One part alone, for profiling (memcast's figure printed).
fn only(part: &str, runs: usize) {
    let ranges: &[(u64, f64, f64)] = match part {
        "small" => &[(100, 8.0, 16.0)],
        "mid" | "extents" => &[(100, 16.0, 20.0)],
        "big" => &[(100, 20.0, 24.0)],
        "mixed" => &MIX,
        "trace" => &[],
        _ => panic!("PART: small, mid, big, mixed, trace or extents"),
    };
    let ns = match part {
        "trace" => trace_part(runs).0,
        "extents" => extents_part(&program(ranges), runs),
        _ => slots_part(&program(ranges), runs).0,
    };
    println!("{part}: {ns:.1} ns/pair");
}
