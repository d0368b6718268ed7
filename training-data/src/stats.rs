//! Summary statistics of a trace (`memcast trace stats`), with the metric definitions of
//! Definitions: requested bytes are what callers asked for; peak_requested includes the
//! blocks live before the trace began.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::error::TraceError;
use crate::model::{EventKind, TensorId, Trace};

/// What `memcast trace stats --json` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TraceStats {
    pub name: String,
    pub events: u64,
    pub allocs: u64,
    pub frees: u64,
    pub accesses: u64,
    pub static_blocks: u64,
    pub static_bytes: u64,
    /// Max over time of live requested bytes of tensors allocated in the trace.
    pub peak_live_bytes: u64,
    /// Max over time of live requested bytes including static blocks.
    pub peak_requested_bytes: u64,
    /// Event index at which `peak_requested_bytes` was first reached.
    pub peak_event: u64,
    pub iterations: u64,
    pub distinct_sizes: u64,
    pub streams: u64,
    pub duration_us: u64,
    /// Median over the iterations (spans between consecutive boundaries) of their
    /// length; 0 with fewer than two boundaries.
    pub iteration_us: u64,
    /// Median over the iterations of the longest stretch without an event. Event times
    /// are the host's: a host that runs ahead of the GPU issues an iteration's
    /// allocations early and then waits (at a synchronization) with nothing to record,
    /// so a large share of `iteration_us` here says the trace's compute times are the
    /// host's, not the GPU's (docs/tiers.md, "The compute timeline").
    pub longest_wait_us: u64,
    /// Tensors still live at the end (allocated in the trace, never freed).
    pub live_at_end: u64,
    pub total_requested_bytes: u64,
}

/// The peaks of live requested bytes over a trace: the one computation behind
/// [`TraceStats`] and the replay's sizing.
///
/// `requested(i) = static bytes not yet freed + bytes of trace tensors live after event
/// i`; frees of static blocks count like any free. A free of a tensor that is not live
/// frees nothing (`TraceStats::compute` refuses such a trace; this does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peaks {
    /// Max of live requested bytes of tensors allocated in the trace.
    pub live: u64,
    /// Max of `requested(i)` (static blocks included), and of the static bytes alone.
    pub requested: u64,
    /// First event index at which `requested` was reached (0 if at the start).
    pub event: u64,
}

/// [`Peaks`] of `t`, in one pass.
pub fn peaks(t: &Trace) -> Peaks {
    let mut live: HashMap<TensorId, (u64, bool)> = t
        .static_blocks
        .iter()
        .map(|b| (b.id, (b.bytes, true)))
        .collect();
    let (mut cur_trace, mut cur_static) = (0u64, t.static_bytes());
    let mut p = Peaks {
        live: 0,
        requested: cur_static,
        event: 0,
    };
    for (i, e) in t.events.iter().enumerate() {
        match e.kind {
            EventKind::Alloc { id, bytes, .. } => {
                if let Some((old, is_static)) = live.insert(id, (bytes, false)) {
                    // Allocated while live (an invalid trace): the old block is gone.
                    if is_static {
                        cur_static -= old;
                    } else {
                        cur_trace -= old;
                    }
                }
                cur_trace += bytes;
                p.live = p.live.max(cur_trace);
                if cur_trace + cur_static > p.requested {
                    p.requested = cur_trace + cur_static;
                    p.event = i as u64;
                }
            }
            EventKind::Free { id } => match live.remove(&id) {
                Some((bytes, true)) => cur_static -= bytes,
                Some((bytes, false)) => cur_trace -= bytes,
                None => {}
            },
            _ => {}
        }
    }
    p
}

impl TraceStats {
    /// Computes the statistics; fails (naming the event) if the trace frees or accesses a
    /// tensor that is not live.
    pub fn compute(t: &Trace) -> Result<TraceStats, TraceError> {
        let mut live: HashMap<TensorId, (u64, bool)> = t
            .static_blocks
            .iter()
            .map(|b| (b.id, (b.bytes, true)))
            .collect();
        let static_bytes = t.static_bytes();
        let (mut allocs, mut frees, mut accesses, mut total) = (0u64, 0u64, 0u64, 0u64);
        let mut sizes = HashSet::new();
        let mut streams: HashSet<u32> = t.static_blocks.iter().map(|b| b.stream).collect();
        for (i, e) in t.events.iter().enumerate() {
            match e.kind {
                EventKind::Alloc { id, bytes, stream } => {
                    if live.insert(id, (bytes, false)).is_some() {
                        return Err(TraceError::Invalid {
                            index: i as u64,
                            what: format!("tensor {id} allocated while live"),
                        });
                    }
                    allocs += 1;
                    total += bytes;
                    sizes.insert(bytes);
                    streams.insert(stream);
                }
                EventKind::Free { id } => {
                    live.remove(&id).ok_or(TraceError::Invalid {
                        index: i as u64,
                        what: format!("free of tensor {id}, which is not live"),
                    })?;
                    frees += 1;
                }
                EventKind::Access { id, .. } => {
                    if !live.contains_key(&id) {
                        return Err(TraceError::Invalid {
                            index: i as u64,
                            what: format!("access to tensor {id}, which is not live"),
                        });
                    }
                    accesses += 1;
                }
                EventKind::IterationBoundary => {}
            }
        }
        let p = peaks(t);
        let duration_us = match (t.events.first(), t.events.last()) {
            (Some(a), Some(b)) => b.time_us - a.time_us,
            _ => 0,
        };
        let (iteration_us, longest_wait_us) = iteration_times(t);
        Ok(TraceStats {
            name: t.meta.name.clone(),
            events: t.events.len() as u64,
            allocs,
            frees,
            accesses,
            static_blocks: t.static_blocks.len() as u64,
            static_bytes,
            peak_live_bytes: p.live,
            peak_requested_bytes: p.requested,
            peak_event: p.event,
            iterations: t.iterations() as u64,
            distinct_sizes: sizes.len() as u64,
            streams: streams.len().max(1) as u64,
            duration_us,
            iteration_us,
            longest_wait_us,
            live_at_end: live.values().filter(|(_, s)| !s).count() as u64,
            total_requested_bytes: total,
        })
    }
}

/// Each iteration of a trace (between consecutive boundaries): its span and the
/// longest stretch between two events within it (boundaries included), us. O(events).
pub fn iteration_waits(t: &Trace) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let (mut start, mut prev, mut wait) = (None::<u64>, 0u64, 0u64);
    for e in &t.events {
        if start.is_some() {
            wait = wait.max(e.time_us.saturating_sub(prev));
        }
        prev = e.time_us;
        if matches!(e.kind, EventKind::IterationBoundary) {
            if let Some(s) = start {
                out.push((e.time_us.saturating_sub(s), wait));
            }
            start = Some(e.time_us);
            wait = 0;
        }
    }
    out
}

/// The medians over the iterations of a trace of their span and of their longest
/// stretch without an event ([`iteration_waits`]), us; `(0, 0)` with fewer than two
/// boundaries.
fn iteration_times(t: &Trace) -> (u64, u64) {
    let (spans, waits): (Vec<u64>, Vec<u64>) = iteration_waits(t).into_iter().unzip();
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    (median(spans), median(waits))
}

/// Human-readable byte count (binary units), for printing.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Event, StaticBlock};

    #[test]
    fn peaks_count_static_blocks_and_their_frees() {
        let ev = |time_us, kind| Event { time_us, kind };
        let t = Trace {
            static_blocks: vec![StaticBlock {
                id: 100,
                bytes: 50,
                stream: 0,
            }],
            events: vec![
                ev(0, EventKind::IterationBoundary),
                ev(
                    1,
                    EventKind::Alloc {
                        id: 1,
                        bytes: 30,
                        stream: 0,
                    },
                ),
                ev(2, EventKind::Free { id: 100 }),
                ev(
                    3,
                    EventKind::Alloc {
                        id: 2,
                        bytes: 40,
                        stream: 0,
                    },
                ),
                ev(4, EventKind::Free { id: 1 }),
                ev(9, EventKind::IterationBoundary),
            ],
            ..Default::default()
        };
        let s = TraceStats::compute(&t).unwrap();
        assert_eq!(
            peaks(&t),
            Peaks {
                live: 70,
                requested: 80,
                event: 1
            }
        );
        assert_eq!(s.peak_live_bytes, 70);
        assert_eq!(s.peak_requested_bytes, 80); // 50 static + 30, before the static free
        assert_eq!(s.peak_event, 1);
        assert_eq!(
            (s.allocs, s.frees, s.iterations, s.duration_us),
            (2, 2, 1, 9)
        );
        assert_eq!(s.live_at_end, 1);
        // One iteration of 9 us; its longest stretch without an event: 4 -> 9.
        assert_eq!((s.iteration_us, s.longest_wait_us), (9, 5));
    }

    #[test]
    fn iteration_times_are_medians_over_the_iterations() {
        let ev = |time_us, kind| Event { time_us, kind };
        let alloc = |id| EventKind::Alloc {
            id,
            bytes: 8,
            stream: 0,
        };
        let b = EventKind::IterationBoundary;
        // Iterations of 10, 30 and 20 us whose longest waits are 6, 25 and 2 us (the
        // last: ten events 2 us apart); before the first boundary nothing counts.
        let mut events = vec![
            ev(0, alloc(1)),
            ev(100, b),
            ev(104, alloc(2)),
            ev(110, b),
            ev(115, alloc(3)),
            ev(140, b),
        ];
        for i in 1..=10 {
            events.push(ev(140 + 2 * i, if i == 10 { b } else { alloc(3 + i) }));
        }
        let t = Trace {
            events,
            ..Default::default()
        };
        assert_eq!(iteration_times(&t), (20, 6));
        let none = Trace {
            events: vec![ev(0, alloc(1)), ev(5, b)],
            ..Default::default()
        };
        assert_eq!(iteration_times(&none), (0, 0));
    }

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 30), "3.00 GiB");
    }
}
