//! Where the `alloc_free` time goes: each part of the bench's programs alone, memcast
//! against offset-allocator on the same sequence in the same run (ns per alloc+free pair,
//! best of the runs after three warm-up runs).
//!
//! `cargo run --release -p memcast-alloc --example fast_path_parts [RUNS]`
//! (memcast's configuration from `MEMCAST_ALLOC_CONF`, as in the bench)
//!
//! Parts: `small` (256 B-64 KiB: slabs), `mid` (64 KiB-1 MiB), `big` (1-16 MiB), `mixed`
//! (the bench's mix), `trace` (resnet50_b64_train's sequence), and `extents`: memcast's
//! placement index alone (best fit, take, release) on the `mid` sizes.

use std::time::Instant;

use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::extents::Extents;
use memcast_alloc::{AllocConfig, Allocation, Allocator};
use memcast_trace::EventKind;

const SLOTS: usize = 1024;
const STEPS: usize = 20_000;
const UNIT: u64 = 256;

/// (slot, bytes) steps: the slot's old block is freed, then a new one allocated. Sizes
/// log-uniform in the given exponent ranges, chosen with the given weights (%).
fn program(ranges: &[(u64, f64, f64)]) -> Vec<(usize, u64)> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..STEPS)
        .map(|_| {
            let slot = (rnd() % SLOTS as u64) as usize;
            let r = rnd() % 100;
            let mut acc = 0;
            let &(_, lo, hi) = ranges
                .iter()
                .find(|(w, _, _)| {
                    acc += w;
                    r < acc
                })
                .unwrap_or(&ranges[ranges.len() - 1]);
            let e = lo + (hi - lo) * ((rnd() % 1_000_000) as f64 / 1e6);
            (slot, 2f64.powf(e) as u64)
        })
        .collect()
}

/// The resnet50 trace as (slot, Some(bytes)) allocations and (slot, None) frees.
fn trace_ops() -> (Vec<(usize, Option<u64>)>, usize) {
    let t = memcast_trace::bundled::get("resnet50_b64_train")
        .expect("bundled")
        .load()
        .expect("decodes");
    let (mut slot_of, mut free, mut next, mut ops) =
        (std::collections::HashMap::new(), Vec::new(), 0, Vec::new());
    for e in &t.events {
        match e.kind {
            EventKind::Alloc { id, bytes, .. } => {
                let s = free.pop().unwrap_or_else(|| {
                    next += 1;
                    next - 1
                });
                slot_of.insert(id, s);
                ops.push((s, Some(bytes)));
            }
            EventKind::Free { id } => {
                let s = slot_of.remove(&id).expect("live");
                ops.push((s, None));
                free.push(s);
            }
            _ => {}
        }
    }
    (ops, next)
}

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
    let (ops, n) = trace_ops();
    let pairs = ops.iter().filter(|o| o.1.is_some()).count();
    let mut a = memcast();
    let mut live: Vec<Option<Allocation>> = vec![None; n];
    let m = best(runs, pairs, || {
        for &(s, op) in &ops {
            match op {
                Some(b) => live[s] = Some(a.allocate(b, 0).expect("alloc")),
                None => a
                    .deallocate(live[s].take().expect("live"), 0)
                    .expect("free"),
            }
        }
    });
    let mut o = offset();
    let mut live: Vec<Option<offset_allocator::Allocation>> = vec![None; n];
    let p = best(runs, pairs, || {
        for &(s, op) in &ops {
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
    let mixed = [(60, 8.0, 16.0), (30, 16.0, 20.0), (10, 20.0, 24.0)];
    println!("| part | memcast ns/pair | offset-allocator ns/pair |");
    println!("|---|---|---|");
    for (name, ranges) in [
        ("small", &[(100, 8.0, 16.0)][..]),
        ("mid", &[(100, 16.0, 20.0)][..]),
        ("big", &[(100, 20.0, 24.0)][..]),
        ("mixed", &mixed[..]),
    ] {
        let (m, p) = slots_part(&program(ranges), runs);
        println!("| {name} | {m:.1} | {p:.1} |");
    }
    let (m, p) = trace_part(runs);
    println!("| trace (resnet50_b64_train) | {m:.1} | {p:.1} |");
    let e = extents_part(&program(&[(100, 16.0, 20.0)]), runs);
    println!("| extents alone (mid sizes) | {e:.1} | |");
}
