//! Liveness analysis: when each buffer of a [`Program`] comes to life and dies, and
//! the trace events that follow from it.
//!
//! A dynamic buffer is live over the closed step interval `[def, last]`, where `def` is
//! the step that allocates it and `last` the last step that allocates, reads, writes or
//! holds it. It is freed at the end of step `last` (reference-counting semantics).
//! Static buffers are live throughout. Cost: O(total list entries) time and memory.
//!
//! Live bytes at step `i` (after its allocations, before its frees):
//! `live(i) = Σ bytes(b) over dynamic b with def(b) <= i <= last(b)`; the trace's peak of
//! live requested bytes is `max_i live(i)`, because a step's allocations precede its frees.

use crate::error::TraceError;
use crate::model::{Event, EventKind, StaticBlock, TensorMeta, Trace, TraceMeta};

use super::program::{BufId, Program};
use super::timeline::Times;

/// The result of [`analyze`].
#[derive(Debug, Clone, PartialEq)]
pub struct Liveness {
    /// Allocating step of each buffer (`None` for static buffers).
    pub def: Vec<Option<usize>>,
    /// Last step using each buffer (`None` for static buffers, which never die).
    /// Invariant: `def[b] <= last[b]` where both are set.
    pub last: Vec<Option<usize>>,
    /// Buffers freed at the end of each step, in ascending id order.
    pub frees_after: Vec<Vec<BufId>>,
}

impl Liveness {
    /// Checks `def <= last` and that every dynamic buffer has both ends.
    pub fn check_invariants(&self) -> Result<(), TraceError> {
        for (b, (d, l)) in self.def.iter().zip(&self.last).enumerate() {
            match (d, l) {
                (Some(d), Some(l)) if d <= l => {}
                (None, None) => {}
                _ => {
                    return Err(TraceError::Param(format!(
                        "liveness: buffer {b} has interval {d:?}..{l:?}"
                    )))
                }
            }
        }
        Ok(())
    }

    /// Peak of live dynamic bytes over steps and the step where it is first reached.
    pub fn peak_live(&self, p: &Program) -> (u64, usize) {
        let mut delta_in = vec![0u64; p.steps.len() + 1];
        let mut delta_out = vec![0u64; p.steps.len() + 1];
        for (b, buf) in p.bufs.iter().enumerate() {
            if let (Some(d), Some(l)) = (self.def[b], self.last[b]) {
                delta_in[d] += buf.bytes;
                delta_out[l] += buf.bytes;
            }
        }
        let (mut live, mut peak, mut at) = (0u64, 0u64, 0usize);
        for i in 0..p.steps.len() {
            live += delta_in[i];
            if live > peak {
                peak = live;
                at = i;
            }
            live -= delta_out[i];
        }
        (peak, at)
    }
}

/// Computes every buffer's live interval. Errors if a step uses a dynamic buffer before
/// (or without) its allocation, or allocates one twice: bugs in the expansion.
pub fn analyze(p: &Program) -> Result<Liveness, TraceError> {
    let n = p.bufs.len();
    let mut def: Vec<Option<usize>> = vec![None; n];
    let mut last: Vec<Option<usize>> = vec![None; n];
    let bad = |what: String| Err(TraceError::Param(format!("liveness: {what}")));
    for (i, s) in p.steps.iter().enumerate() {
        for &b in &s.allocs {
            if b >= n || p.bufs[b].is_static || def[b].is_some() {
                return bad(format!(
                    "step {i} ({}) allocates buffer {b} wrongly",
                    s.name
                ));
            }
            def[b] = Some(i);
            last[b] = Some(i);
        }
        for &b in s.reads.iter().chain(&s.writes).chain(&s.holds) {
            if b >= n {
                return bad(format!("step {i} ({}) uses unknown buffer {b}", s.name));
            }
            if p.bufs[b].is_static {
                continue;
            }
            if def[b].is_none() {
                return bad(format!(
                    "step {i} ({}) uses buffer {b} ({}) before its allocation",
                    s.name, p.bufs[b].name
                ));
            }
            last[b] = Some(i);
        }
    }
    for (b, buf) in p.bufs.iter().enumerate() {
        if !buf.is_static && def[b].is_none() {
            return bad(format!("buffer {b} ({}) is never allocated", buf.name));
        }
    }
    let mut frees_after = vec![Vec::new(); p.steps.len()];
    for (b, l) in last.iter().enumerate() {
        if let Some(l) = *l {
            frees_after[l].push(b);
        }
    }
    let l = Liveness {
        def,
        last,
        frees_after,
    };
    l.check_invariants()?;
    Ok(l)
}

/// Turns a program and its liveness into a [`Trace`]: static blocks, then per step, at
/// its host start time, its allocations and accesses (reads, then writes; allocations
/// count as writes) and, at its host end time, its frees. Tensor ids are buffer indices.
/// O(events) time.
pub fn emit(p: &Program, l: &Liveness, times: &Times, meta: TraceMeta) -> Trace {
    let mut events = Vec::new();
    let mut tensors: Vec<TensorMeta> = p
        .bufs
        .iter()
        .enumerate()
        .map(|(b, buf)| TensorMeta {
            id: b as u64,
            size: buf.bytes,
            producer: buf.is_static.then(|| buf.name.clone()),
            recompute_us: buf.recompute_us.map(|u| u.round() as u64),
            ..Default::default()
        })
        .collect();
    let static_blocks = p
        .bufs
        .iter()
        .enumerate()
        .filter(|(_, b)| b.is_static)
        .map(|(b, buf)| StaticBlock {
            id: b as u64,
            bytes: buf.bytes,
            stream: 0,
        })
        .collect();
    let push = |events: &mut Vec<Event>, t: f64, kind| {
        events.push(Event {
            time_us: t as u64,
            kind,
        })
    };
    for (i, s) in p.steps.iter().enumerate() {
        let t = times.start[i];
        if s.boundary {
            push(&mut events, t, EventKind::IterationBoundary);
            continue;
        }
        for &b in &s.allocs {
            tensors[b].alloc_event = Some(events.len() as u64);
            tensors[b].producer = Some(s.name.clone());
            let kind = EventKind::Alloc {
                id: b as u64,
                bytes: p.bufs[b].bytes,
                stream: 0,
            };
            push(&mut events, t, kind);
        }
        for (list, write) in [(&s.reads, false), (&s.writes, true), (&s.allocs, true)] {
            for &b in list {
                if !write {
                    tensors[b].consumers.push(s.name.clone());
                }
                push(
                    &mut events,
                    t,
                    EventKind::Access {
                        id: b as u64,
                        write,
                    },
                );
            }
        }
        let t = times.end[i];
        for &b in &l.frees_after[i] {
            tensors[b].free_event = Some(events.len() as u64);
            push(&mut events, t, EventKind::Free { id: b as u64 });
        }
    }
    Trace {
        meta,
        static_blocks,
        events,
        tensors,
        source_segments: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::program::Step;
    use super::*;

    fn step(name: &str, allocs: &[BufId], reads: &[BufId]) -> Step {
        Step {
            name: name.into(),
            allocs: allocs.to_vec(),
            reads: reads.to_vec(),
            dur_us: 1.0,
            kernels: 1,
            ..Default::default()
        }
    }

    #[test]
    fn frees_after_last_use_and_peaks_before_frees() {
        let mut p = Program::default();
        let w = p.static_buf("w", 100);
        let a = p.buf("a", 10);
        let b = p.buf("b", 20);
        let c = p.buf("c", 40);
        p.push(step("s0", &[a], &[w]));
        p.push(step("s1", &[b], &[a]));
        p.push(step("s2", &[c], &[b]));
        p.push(step("s3", &[], &[a, c]));
        let l = analyze(&p).unwrap();
        assert_eq!(l.def, vec![None, Some(0), Some(1), Some(2)]);
        assert_eq!(l.last, vec![None, Some(3), Some(2), Some(3)]);
        // live: s0 10, s1 30, s2 70 (then b dies), s3 50.
        assert_eq!(l.peak_live(&p), (70, 2));
        let times = super::super::timeline::schedule(&p, &Default::default());
        let tr = emit(&p, &l, &times, TraceMeta::default());
        tr.validate().unwrap();
        assert_eq!(tr.static_bytes(), 100);
        assert_eq!(tr.tensors[a].consumers, vec!["s1", "s3"]);
        assert_eq!(tr.tensors[b].producer.as_deref(), Some("s1"));
    }

    #[test]
    fn use_before_alloc_is_an_error() {
        let mut p = Program::default();
        let a = p.buf("a", 10);
        p.push(step("s0", &[], &[a]));
        p.push(step("s1", &[a], &[]));
        assert!(analyze(&p).is_err());
        let mut p = Program::default();
        p.buf("never", 1);
        assert!(analyze(&p).is_err());
    }
}
