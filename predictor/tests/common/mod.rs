//! Shared helpers for the predictor's tests: small traces built in code.
#![allow(dead_code)]

use memcast_trace::{Event, EventKind, StaticBlock, Trace};

/// `iters` iterations of `n` allocations; iteration `i`'s sizes are multiplied by
/// `scale(i)`; each tensor is freed four allocations later.
pub fn trace(iters: usize, n: usize, scale: impl Fn(usize) -> u64) -> Trace {
    let mut events = Vec::new();
    let mut t = 0;
    let mut id = 100;
    for i in 0..iters {
        events.push(Event {
            time_us: t,
            kind: EventKind::IterationBoundary,
        });
        let mut live = Vec::new();
        for j in 0..n as u64 {
            t += 1;
            let bytes = (4096 + 70_000 * (j % 5) * (j % 3 + 1) + 3_000_000 * (j % 11 == 0) as u64)
                * scale(i);
            events.push(Event {
                time_us: t,
                kind: EventKind::Alloc {
                    id,
                    bytes,
                    stream: 0,
                },
            });
            live.push(id);
            id += 1;
            if live.len() > 4 {
                events.push(Event {
                    time_us: t,
                    kind: EventKind::Free { id: live.remove(0) },
                });
            }
        }
        for l in live {
            events.push(Event {
                time_us: t,
                kind: EventKind::Free { id: l },
            });
        }
    }
    events.push(Event {
        time_us: t + 1,
        kind: EventKind::IterationBoundary,
    });
    Trace {
        static_blocks: vec![StaticBlock {
            id: 1,
            bytes: 50 << 20,
            stream: 0,
        }],
        events,
        ..Default::default()
    }
}

/// A pseudo-random scale schedule in {1, 2, 3, 4}.
pub fn dyn_scale(seed: u64) -> impl Fn(usize) -> u64 {
    move |i| 1 + ((i as u64 + 1).wrapping_mul(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 61) % 4
}
