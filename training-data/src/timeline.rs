//! The compute timeline of a trace whose host ran ahead of the GPU.
//!
//! A snapshot's event times are the host's. A training loop that synchronizes once per
//! iteration (reading the loss, or the recorder's `torch.cuda.synchronize()`) lets the
//! host issue an iteration's kernels, and with them its allocations, well before the
//! GPU runs them, and then wait at the synchronization with nothing to record: the
//! iteration's events are bunched at its start and its last stretch is a wait. A
//! replay that takes its compute time from these times (the tiered replays) then sees
//! the compute that would hide copies in one lump at the iteration's end.
//!
//! [`spread_final_waits`] models the GPU's timeline instead: within each iteration, the
//! events are stretched so that the last one lands at the closing boundary, as if the
//! GPU worked through the iteration at the pace the host issued it. For iteration
//! `[a, b]` with its last event at `l` (`a < l <= b`), event time `t` becomes
//!
//! `t' = a + (t - a) * (b - a) / (l - a)`
//!
//! (rounded down; order kept, `t' <= b`). Iteration lengths, boundaries, the events
//! before the first boundary and after the last are unchanged; an iteration with no
//! event is left alone. No constant: a trace whose last event already sits at its
//! boundary is unchanged. Waits inside an iteration (a data-dependent `.item()`) stay.
//! Measured against the same programs recorded with `CUDA_LAUNCH_BLOCKING=1` (event
//! times that follow the GPU) in docs/tiers.md, "The compute timeline".

use crate::model::{EventKind, Trace};

/// `trace` with each iteration's final wait spread over its events (module docs).
/// O(events).
pub fn spread_final_waits(trace: &Trace) -> Trace {
    let mut out = trace.clone();
    let bounds: Vec<usize> = (0..out.events.len())
        .filter(|&i| matches!(out.events[i].kind, EventKind::IterationBoundary))
        .collect();
    for w in bounds.windows(2) {
        let (i, j) = (w[0], w[1]);
        if j == i + 1 {
            continue;
        }
        let a = out.events[i].time_us;
        let b = out.events[j].time_us;
        let l = out.events[j - 1].time_us;
        if l <= a || l >= b {
            continue;
        }
        let (num, den) = ((b - a) as u128, (l - a) as u128);
        for e in &mut out.events[i + 1..j] {
            let t = e.time_us.saturating_sub(a) as u128;
            e.time_us = a + (t * num / den) as u64;
        }
    }
    out
}

/// How far apart two recordings of the same program lie in time: per iteration (the
/// spans between boundaries present in both, matched in order, with as many events),
/// the mean over its events of `|share_a - share_b|`, an event's share being its time
/// since the iteration's start over the iteration's length; the median over the
/// iterations after the first two. `None` when no iteration matches. O(events).
pub fn shape_distance(a: &Trace, b: &Trace) -> Option<f64> {
    let iterations = |t: &Trace| -> Vec<Vec<f64>> {
        let mut out = Vec::new();
        let mut cur: Option<(u64, Vec<u64>)> = None;
        for e in &t.events {
            if matches!(e.kind, EventKind::IterationBoundary) {
                if let Some((s, times)) = cur.take() {
                    let span = e.time_us.saturating_sub(s).max(1) as f64;
                    out.push(times.iter().map(|&x| (x - s) as f64 / span).collect());
                }
                cur = Some((e.time_us, Vec::new()));
            } else if let Some((_, times)) = cur.as_mut() {
                times.push(e.time_us);
            }
        }
        out
    };
    let (ia, ib) = (iterations(a), iterations(b));
    let mut d: Vec<f64> = ia
        .iter()
        .zip(&ib)
        .skip(2)
        .filter(|(x, y)| x.len() == y.len() && !x.is_empty())
        .map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()).sum::<f64>() / x.len() as f64)
        .collect();
    d.sort_by(f64::total_cmp);
    d.get(d.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Event;

    fn ev(time_us: u64, kind: EventKind) -> Event {
        Event { time_us, kind }
    }

    #[test]
    fn the_final_wait_is_spread_over_the_iteration() {
        let alloc = |id| EventKind::Alloc {
            id,
            bytes: 8,
            stream: 0,
        };
        let b = EventKind::IterationBoundary;
        let t = Trace {
            events: vec![
                ev(5, alloc(1)), // before the first boundary: unchanged
                ev(10, b),
                ev(12, alloc(2)),
                ev(15, EventKind::Free { id: 2 }),
                ev(20, alloc(3)), // last event at 20, boundary at 110: x10
                ev(110, b),
                ev(111, EventKind::Free { id: 3 }),
                ev(120, b), // last event at 111 of [110, 120]: x10
                ev(130, b), // no event inside: unchanged
                ev(140, EventKind::Free { id: 1 }),
            ],
            ..Default::default()
        };
        let s = spread_final_waits(&t);
        let times: Vec<u64> = s.events.iter().map(|e| e.time_us).collect();
        assert_eq!(times, [5, 10, 30, 60, 110, 110, 120, 120, 130, 140]);
        // Kinds and everything else unchanged; spreading twice changes nothing more.
        assert!(s
            .events
            .iter()
            .zip(&t.events)
            .all(|(x, y)| x.kind == y.kind));
        assert_eq!(spread_final_waits(&s), s);
        s.validate().unwrap();
    }

    /// Against the test split recorded with launch blocking (event times that follow
    /// the GPU), spreading the final waits brings the corpus's timelines closer on most
    /// traces (`cargo run --release -p memcast-alloc --example timeline_shape` prints
    /// the table docs/tiers.md holds).
    #[test]
    fn spread_waits_bring_the_corpus_closer_to_the_gpu_timeline() {
        use crate::corpus::Corpus;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        let main = Corpus::load(&dir.join("manifest.tsv")).unwrap();
        let lb = Corpus::load(&dir.join("launch-blocking/manifest.tsv")).unwrap();
        let (mut closer, mut further) = (0, 0);
        for e in &lb.entries {
            let m = main.entry(&e.workload).unwrap();
            let gpu = crate::io::load_trace(&e.path).unwrap();
            let host = crate::io::load_trace(&m.path).unwrap();
            let before = shape_distance(&host, &gpu).unwrap();
            let after = shape_distance(&spread_final_waits(&host), &gpu).unwrap();
            if after < before - 0.01 {
                closer += 1;
            } else if after > before + 0.01 {
                further += 1;
            }
        }
        assert!(
            closer >= 14 && further <= 2,
            "closer {closer}, further {further}"
        );
    }
}
