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
//!
//! [`scale_iterations`] takes such a recording to the job's own pace: a launch-blocking
//! recording follows the GPU's work, but each kernel waits for the one before it is
//! launched, so its iterations run longer than the job's. Given each iteration's wall
//! time measured with nothing recorded, iteration `k`, `[a, b]`, is scaled to its
//! measured length `d_k` and placed after the ones before it:
//!
//! `t' = a' + (t - a) * d_k / (b - a)`, `a'_(k+1) = a'_k + d_k`
//!
//! (rounded down; order kept). The share of the iteration each event sits at is kept:
//! the launch-blocking stretch is taken to fall evenly over the iteration.

use crate::model::{EventKind, Trace};
use crate::TraceError;

/// `trace` with iteration `k` (the span between its `k`-th and `k+1`-th boundaries)
/// scaled to `spans_us[k]` microseconds (module docs). Events before the first
/// boundary are unchanged, those after the last shift with it. An error when the trace
/// has not `spans_us.len()` iterations, or a span is 0. O(events).
pub fn scale_iterations(trace: &Trace, spans_us: &[u64]) -> Result<Trace, TraceError> {
    let bounds = boundaries(trace);
    let n = bounds.len().saturating_sub(1);
    if n != spans_us.len() {
        return Err(TraceError::Param(format!(
            "the trace has {n} iterations, {} lengths were given",
            spans_us.len()
        )));
    }
    if let Some(k) = spans_us.iter().position(|&d| d == 0) {
        return Err(TraceError::Param(format!(
            "iteration {k}: a length of 0 us"
        )));
    }
    let mut out = trace.clone();
    // `a2`: where the current iteration starts on the new timeline.
    let Some(&first) = bounds.first() else {
        return Ok(out);
    };
    let mut a2 = trace.events[first].time_us;
    for (k, w) in bounds.windows(2).enumerate() {
        let (i, j) = (w[0], w[1]);
        let a = trace.events[i].time_us;
        let span = trace.events[j].time_us.saturating_sub(a).max(1) as u128;
        let d = spans_us[k];
        for idx in i + 1..j {
            let t = trace.events[idx].time_us.saturating_sub(a) as u128;
            out.events[idx].time_us = a2 + (t * d as u128 / span) as u64;
        }
        a2 += d;
        out.events[j].time_us = a2;
    }
    // After the last boundary: shifted with it.
    let last = *bounds.last().unwrap_or(&first);
    let (old, new) = (trace.events[last].time_us, a2);
    for idx in last + 1..trace.events.len() {
        let t = trace.events[idx].time_us.saturating_sub(old);
        out.events[idx].time_us = new + t;
    }
    Ok(out)
}

/// `trace` with each iteration's final wait spread over its events (module docs).
/// O(events).
pub fn spread_final_waits(trace: &Trace) -> Trace {
    let mut out = trace.clone();
    let bounds = boundaries(trace);
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

/// The indices of `trace`'s iteration boundaries, in order.
fn boundaries(trace: &Trace) -> Vec<usize> {
    (0..trace.events.len())
        .filter(|&i| matches!(trace.events[i].kind, EventKind::IterationBoundary))
        .collect()
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

    fn alloc(id: u64) -> EventKind {
        EventKind::Alloc {
            id,
            bytes: 8,
            stream: 0,
        }
    }

    /// The event times of `t`, after checking that its events are `before`'s, in the
    /// same order, with only their times changed.
    fn times_of(t: &Trace, before: &Trace) -> Vec<u64> {
        assert!(t.events.len() == before.events.len());
        assert!(t
            .events
            .iter()
            .zip(&before.events)
            .all(|(x, y)| x.kind == y.kind));
        t.validate().unwrap();
        t.events.iter().map(|e| e.time_us).collect()
    }

    #[test]
    fn the_final_wait_is_spread_over_the_iteration() {
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
        assert_eq!(
            times_of(&s, &t),
            [5, 10, 30, 60, 110, 110, 120, 120, 130, 140]
        );
        // Spreading twice changes nothing more.
        assert_eq!(spread_final_waits(&s), s);
    }

    #[test]
    fn iterations_are_scaled_to_the_lengths_given() {
        let b = EventKind::IterationBoundary;
        let t = Trace {
            events: vec![
                ev(5, alloc(1)), // before the first boundary: unchanged
                ev(10, b),
                ev(20, alloc(2)),
                ev(60, EventKind::Free { id: 2 }),
                ev(110, b), // [10, 110] to 50: x0.5
                ev(130, alloc(3)),
                ev(210, b),                         // [110, 210] to 300: x3
                ev(215, EventKind::Free { id: 3 }), // after the last: shifted with it
                ev(220, EventKind::Free { id: 1 }),
            ],
            ..Default::default()
        };
        let s = scale_iterations(&t, &[50, 300]).unwrap();
        assert_eq!(times_of(&s, &t), [5, 10, 15, 35, 60, 120, 360, 365, 370]);
        // The lengths it measured give the trace back.
        assert_eq!(scale_iterations(&t, &[100, 100]).unwrap(), t);
        let e = scale_iterations(&t, &[50]).unwrap_err().to_string();
        assert!(e.contains("2 iterations, 1 lengths"), "{e}");
        let e = scale_iterations(&t, &[50, 0]).unwrap_err().to_string();
        assert!(e.contains("iteration 1: a length of 0"), "{e}");
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
