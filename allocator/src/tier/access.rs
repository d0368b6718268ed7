//! The access model: what a replay must have on the device, and when.
//!
//! A tiering replay needs reads, not just allocations and frees. Two sources:
//!
//! - **Recorded** (synthetic traces, which carry `Access` events): every `Access` is an
//!   access; a kernel step is the run of events with the same timestamp, and the
//!   tensors a step accesses are pinned together until the next timestamp. Static
//!   blocks (parameters, optimizer state) are accessed where the graph reads and
//!   writes them (forward, backward, optimizer step).
//! - **Inferred** (PyTorch snapshots, which record no reads), this model:
//!   - a tensor is written at its allocation (it is on the device when created);
//!   - it is read just before its free (saved activations are read in the backward
//!     right before they are freed): a spilled tensor must come back before it dies;
//!   - blocks live before the trace began (parameters, optimizer state) are read and
//!     written at every iteration boundary, one block per step (the optimizer's update
//!     walks the parameters), so spilling them is never free: each one spilled during
//!     an iteration is fetched back at its end.
//!
//!   Each allocation and each read is its own step (one tensor pinned at a time).
//!
//! The choice is automatic: a trace with at least one `Access` event is Recorded.
//! Compute time comes from the trace's timestamps in both cases ([`OpKind::Advance`]).

use memcast_trace::{EventKind, Trace};
use serde::Serialize;

/// Which access model a replay used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessModel {
    Recorded,
    Inferred,
}

impl AccessModel {
    pub fn for_trace(t: &Trace) -> Self {
        if t.events
            .iter()
            .any(|e| matches!(e.kind, EventKind::Access { .. }))
        {
            AccessModel::Recorded
        } else {
            AccessModel::Inferred
        }
    }
}

/// One thing the replay does. `event` is the index of the trace event it comes from
/// (`None`: a static block, before the trace's first event).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Op {
    pub event: Option<u64>,
    pub kind: OpKind,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OpKind {
    /// Register a tensor (a write access). `persistent` for static blocks.
    Alloc {
        id: u64,
        bytes: u64,
        persistent: bool,
    },
    Access {
        id: u64,
        write: bool,
    },
    Free {
        id: u64,
    },
    /// The current step ends (its tensors are unpinned).
    EndStep,
    IterationBoundary,
    /// Compute time passes (microseconds).
    Advance(u64),
}

/// The operations of `trace` under `model`, in order. O(events + static blocks x
/// iterations) time and memory.
pub fn ops(trace: &Trace, model: AccessModel) -> Vec<Op> {
    let mut out = Vec::with_capacity(trace.events.len() * 2 + trace.static_blocks.len() * 2);
    let op = |event: Option<u64>, kind| Op { event, kind };
    for b in &trace.static_blocks {
        out.push(op(
            None,
            OpKind::Alloc {
                id: b.id,
                bytes: b.bytes,
                persistent: true,
            },
        ));
        out.push(op(None, OpKind::EndStep));
    }
    // Static blocks still live (a recording may free some: an input batch whose free
    // waited for another stream, a workspace): only those are touched at boundaries.
    let mut static_live: std::collections::HashSet<u64> =
        trace.static_blocks.iter().map(|b| b.id).collect();
    let mut last_t = trace.events.first().map(|e| e.time_us).unwrap_or(0);
    for (i, e) in trace.events.iter().enumerate() {
        if let EventKind::Free { id } = e.kind {
            static_live.remove(&id);
        }
        let ev = Some(i as u64);
        if e.time_us > last_t {
            if model == AccessModel::Recorded {
                out.push(op(ev, OpKind::EndStep));
            }
            out.push(op(ev, OpKind::Advance(e.time_us - last_t)));
            last_t = e.time_us;
        }
        match (model, e.kind) {
            (_, EventKind::Alloc { id, bytes, .. }) => {
                out.push(op(
                    ev,
                    OpKind::Alloc {
                        id,
                        bytes,
                        persistent: false,
                    },
                ));
            }
            (AccessModel::Recorded, EventKind::Access { id, write }) => {
                out.push(op(ev, OpKind::Access { id, write }));
            }
            (AccessModel::Inferred, EventKind::Access { .. }) => {}
            (AccessModel::Recorded, EventKind::Free { id }) => {
                out.push(op(ev, OpKind::Free { id }))
            }
            (AccessModel::Inferred, EventKind::Free { id }) => {
                out.push(op(ev, OpKind::Access { id, write: false }));
                out.push(op(ev, OpKind::Free { id }));
            }
            (AccessModel::Recorded, EventKind::IterationBoundary) => {
                out.push(op(ev, OpKind::EndStep));
                out.push(op(ev, OpKind::IterationBoundary));
            }
            (AccessModel::Inferred, EventKind::IterationBoundary) => {
                out.push(op(ev, OpKind::IterationBoundary));
                for b in trace
                    .static_blocks
                    .iter()
                    .filter(|b| static_live.contains(&b.id))
                {
                    out.push(op(
                        ev,
                        OpKind::Access {
                            id: b.id,
                            write: true,
                        },
                    ));
                    out.push(op(ev, OpKind::EndStep));
                }
            }
        }
        if model == AccessModel::Inferred {
            out.push(op(ev, OpKind::EndStep));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use memcast_trace::{Event, StaticBlock};

    fn ev(t: u64, kind: EventKind) -> Event {
        Event { time_us: t, kind }
    }

    #[test]
    fn inferred_model_reads_before_free_and_touches_statics_at_boundaries() {
        let t = Trace {
            static_blocks: vec![StaticBlock {
                id: 100,
                bytes: 8,
                stream: 0,
            }],
            events: vec![
                ev(0, EventKind::IterationBoundary),
                ev(
                    5,
                    EventKind::Alloc {
                        id: 1,
                        bytes: 4,
                        stream: 0,
                    },
                ),
                ev(9, EventKind::Free { id: 1 }),
            ],
            ..Default::default()
        };
        assert_eq!(AccessModel::for_trace(&t), AccessModel::Inferred);
        let kinds: Vec<OpKind> = ops(&t, AccessModel::Inferred)
            .into_iter()
            .map(|o| o.kind)
            .collect();
        use OpKind::*;
        assert_eq!(
            kinds,
            vec![
                Alloc {
                    id: 100,
                    bytes: 8,
                    persistent: true
                },
                EndStep,
                IterationBoundary,
                Access {
                    id: 100,
                    write: true
                },
                EndStep,
                EndStep,
                Advance(5),
                Alloc {
                    id: 1,
                    bytes: 4,
                    persistent: false
                },
                EndStep,
                Advance(4),
                Access {
                    id: 1,
                    write: false
                },
                Free { id: 1 },
                EndStep,
            ]
        );
    }

    /// A static block freed during the recording (here on a second stream, as an input
    /// prefetched there is) is not touched at the boundaries after its free.
    #[test]
    fn inferred_model_skips_static_blocks_freed_before_a_boundary() {
        let t = Trace {
            static_blocks: vec![
                StaticBlock {
                    id: 0,
                    bytes: 8,
                    stream: 1,
                },
                StaticBlock {
                    id: 1,
                    bytes: 8,
                    stream: 0,
                },
            ],
            events: vec![
                ev(0, EventKind::Free { id: 0 }),
                ev(1, EventKind::IterationBoundary),
            ],
            ..Default::default()
        };
        let touched: Vec<u64> = ops(&t, AccessModel::Inferred)
            .into_iter()
            .filter_map(|o| match o.kind {
                OpKind::Access { id, .. } if o.event == Some(1) => Some(id),
                _ => None,
            })
            .collect();
        assert_eq!(touched, vec![1]);
    }
}
