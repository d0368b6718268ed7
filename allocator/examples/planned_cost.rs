//! The host cost of planned placement: each trace replayed by best fit and with
//! itself as placement profile, alternated in the same run, in ns per allocation or
//! free (the allocator's calls only: the loop holds the handles in a vector, and the
//! profile is planned before the clock starts; iteration boundaries are timed apart).
//!
//! `cargo run --release -p memcast-alloc --example planned_cost -- [--reps N] [--steady K] TRACE...`
//!
//! `--steady K` appends K more copies of the trace's last complete iteration after its
//! last boundary (each freeing what the one before it allocated, as the recorded
//! iteration freed its predecessor's runs): the steady state of a longer run, where
//! the profile has handed over to the in-run plan. Prints, per trace and mode, the
//! median and the best of the reps.

use std::time::Instant;

use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::{AllocConfig, Allocation, Allocator};
use memcast_trace::{EventKind, Trace};

#[derive(Clone, Copy)]
enum Op {
    Alloc { slot: u32, bytes: u64, stream: u32 },
    Free { slot: u32 },
    Boundary,
}

/// The trace as operations on dense slots (zero-byte tensors left out), with `steady`
/// copies of its last complete iteration appended after its last boundary.
fn ops_of(trace: &Trace, steady: usize) -> (Vec<Op>, usize) {
    let mut slot_of = std::collections::HashMap::new();
    let mut slots = 0u32;
    let mut ops = Vec::new();
    let alloc = |id: u64,
                 bytes: u64,
                 stream: u32,
                 ops: &mut Vec<Op>,
                 slot_of: &mut std::collections::HashMap<u64, u32>,
                 slots: &mut u32| {
        if bytes == 0 {
            return;
        }
        slot_of.insert(id, *slots);
        ops.push(Op::Alloc {
            slot: *slots,
            bytes,
            stream,
        });
        *slots += 1;
    };
    for b in &trace.static_blocks {
        alloc(b.id, b.bytes, b.stream, &mut ops, &mut slot_of, &mut slots);
    }
    let bounds: Vec<usize> = (0..trace.events.len())
        .filter(|&i| matches!(trace.events[i].kind, EventKind::IterationBoundary))
        .collect();
    // Without repeats (or without two complete iterations), the whole trace.
    let repeat = steady > 0 && bounds.len() >= 3;
    let cut = if repeat {
        bounds[bounds.len() - 1] + 1
    } else {
        trace.events.len()
    };
    for e in &trace.events[..cut] {
        match e.kind {
            EventKind::Alloc { id, bytes, stream } => {
                alloc(id, bytes, stream, &mut ops, &mut slot_of, &mut slots)
            }
            EventKind::Free { id } => {
                if let Some(s) = slot_of.remove(&id) {
                    ops.push(Op::Free { slot: s });
                }
            }
            EventKind::IterationBoundary => ops.push(Op::Boundary),
            EventKind::Access { .. } => {}
        }
    }
    if !repeat {
        return (ops, slots as usize);
    }
    // The last complete iteration (between the last two boundaries) and the one
    // before it: the index of each allocation in its iteration.
    let n = bounds.len();
    let (b0, b1, b2) = (bounds[n - 3], bounds[n - 2], bounds[n - 1]);
    let index_in = |from: usize, to: usize| {
        let mut m = std::collections::HashMap::new();
        for e in &trace.events[from..to] {
            if let EventKind::Alloc { id, bytes, .. } = e.kind {
                if bytes > 0 {
                    let k = m.len();
                    m.insert(id, k);
                }
            }
        }
        m
    };
    let (before, last) = (index_in(b0, b1), index_in(b1, b2));
    // The slots of the last iteration's allocations, as the trace replayed them.
    let mut prev: Vec<u32> = vec![u32::MAX; last.len()];
    {
        let mut k = 0;
        // The allocations after the second-to-last boundary op are the last iteration's.
        let mut seen = 0;
        for op in &ops {
            match *op {
                Op::Boundary => seen += 1,
                Op::Alloc { slot, .. } if seen == n - 1 => {
                    prev[k] = slot;
                    k += 1;
                }
                _ => {}
            }
        }
    }
    for _ in 0..steady {
        let cur: Vec<u32> = (0..last.len() as u32).map(|j| slots + j).collect();
        slots += last.len() as u32;
        let mut j = 0;
        for e in &trace.events[b1 + 1..b2] {
            match e.kind {
                EventKind::Alloc { bytes, stream, .. } if bytes > 0 => {
                    ops.push(Op::Alloc {
                        slot: cur[j],
                        bytes,
                        stream,
                    });
                    j += 1;
                }
                EventKind::Free { id } => {
                    if let Some(&k) = last.get(&id) {
                        ops.push(Op::Free { slot: cur[k] });
                    } else if let Some(&k) = before.get(&id) {
                        ops.push(Op::Free { slot: prev[k] });
                    }
                }
                _ => {}
            }
        }
        ops.push(Op::Boundary);
        prev = cur;
    }
    (ops, slots as usize)
}

/// One replay of `ops`: (ns per allocation or free outside boundaries, ns of all the
/// boundaries per allocation or free, peak reserved bytes and placement hits).
fn replay(ops: &[Op], slots: usize, profile: Option<&Trace>) -> (f64, f64, String) {
    let mut a = Allocator::new(SimBackend::h200(), AllocConfig::default()).expect("allocator");
    if let Some(t) = profile {
        a.set_placement_profile(t).expect("profile");
    }
    let mut live: Vec<Option<(Allocation, u32)>> = vec![None; slots];
    let mut streams = 1u32;
    let mut calls = 0u64;
    let mut in_bounds = 0f64;
    let t0 = Instant::now();
    for &op in ops {
        match op {
            Op::Alloc {
                slot,
                bytes,
                stream,
            } => {
                while streams <= stream {
                    a.create_stream(Default::default()).expect("stream");
                    streams += 1;
                }
                live[slot as usize] = Some((a.allocate(bytes, stream).expect("alloc"), stream));
                calls += 1;
            }
            Op::Free { slot } => {
                if let Some((h, s)) = live[slot as usize].take() {
                    a.deallocate(h, s).expect("free");
                    calls += 1;
                }
            }
            Op::Boundary => {
                let b = Instant::now();
                a.iteration_boundary();
                in_bounds += b.elapsed().as_secs_f64();
            }
        }
    }
    let total = t0.elapsed().as_secs_f64();
    let per = |s: f64| s * 1e9 / calls as f64;
    let hits = a.placement_stats().map_or(String::new(), |p| {
        format!(
            " (profile hits {}, plan hits {}, misses {}, plans {})",
            p.profile_hits,
            p.planned_hits,
            p.profile_misses + p.planned_misses + p.unplanned,
            p.plans
        )
    });
    (
        per(total - in_bounds),
        per(in_bounds),
        format!("{}{hits}", a.stats().reserved.peak),
    )
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut reps, mut steady, mut paths) = (15usize, 0usize, Vec::new());
    // `--only profile`: the profile's replays alone (under `perf record`).
    let mut only_profile = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--reps" => reps = args.next().ok_or("--reps N")?.parse()?,
            "--steady" => steady = args.next().ok_or("--steady K")?.parse()?,
            "--only" => only_profile = args.next().as_deref() == Some("profile"),
            _ => paths.push(a),
        }
    }
    println!(
        "trace | events | best fit ns/event (median, best) | profile ns/event (median, best) | ratio | profile boundaries ns/event | peak reserved bf / profile"
    );
    for path in &paths {
        let trace = memcast_trace::io::load_trace(std::path::Path::new(path))?;
        let (ops, slots) = ops_of(&trace, steady);
        let (mut bf, mut pr, mut prb) = (Vec::new(), Vec::new(), Vec::new());
        let (mut peak_bf, mut peak_pr) = (String::new(), String::new());
        // One warm-up of each, then alternated.
        for i in 0..reps + 1 {
            let (x, _, p) = if only_profile {
                (f64::NAN, 0.0, String::new())
            } else {
                replay(&ops, slots, None)
            };
            let (y, yb, q) = replay(&ops, slots, Some(&trace));
            if i > 0 {
                bf.push(x);
                pr.push(y);
                prb.push(yb);
            }
            (peak_bf, peak_pr) = (p, q);
        }
        let calls = ops.iter().filter(|o| !matches!(o, Op::Boundary)).count();
        let name = std::path::Path::new(path)
            .file_stem()
            .map_or(path.clone(), |s| s.to_string_lossy().into_owned());
        let (bm, pm) = (median(&mut bf), median(&mut pr));
        println!(
            "{name} | {calls} | {bm:.1}, {:.1} | {pm:.1}, {:.1} | {:.2} | {:.1} | {peak_bf} / {peak_pr}",
            bf[0],
            pr[0],
            pm / bm,
            median(&mut prb),
        );
    }
    Ok(())
}
