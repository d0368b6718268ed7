//! The `alloc_free` workloads, shared by the bench and the `fast_path_parts` example so
//! that both time exactly the same sequences.

use memcast_trace::EventKind;

/// Slots of the random programs (live blocks at most).
pub const SLOTS: usize = 1024;
/// Steps of one random program.
pub const STEPS: usize = 20_000;
/// The bench's mix: 60% 256 B..64 KiB, 30% 64 KiB..1 MiB, 10% 1..16 MiB (weight %,
/// log2 low, log2 high).
pub const MIX: [(u64, f64, f64); 3] = [(60, 8.0, 16.0), (30, 16.0, 20.0), (10, 20.0, 24.0)];

/// (slot, bytes) steps: the slot's old block is freed, then a new one allocated. Sizes
/// log-uniform in the given exponent ranges, chosen with the given weights (%).
pub fn program(ranges: &[(u64, f64, f64)]) -> Vec<(usize, u64)> {
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

/// The resnet50 trace: its operations, (slot, Some(bytes)) allocations and (slot, None)
/// frees, the number of slots they need, and its static blocks (parameters, optimizer
/// state: allocated once before the operations run, and kept).
pub struct TraceOps {
    pub ops: Vec<(usize, Option<u64>)>,
    pub slots: usize,
    pub statics: Vec<u64>,
}

pub fn trace_ops() -> TraceOps {
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
    TraceOps {
        ops,
        slots: next,
        statics: t.static_blocks.iter().map(|b| b.bytes).collect(),
    }
}
