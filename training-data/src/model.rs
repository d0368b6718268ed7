//! The trace model: what every memcast component learns from or replays.
//!
//! A [`Trace`] is a list of [`Event`]s over time plus the blocks that were already live
//! when recording began ([`StaticBlock`]s: parameters, optimizer state, workspaces).
//! Tensors are named by [`TensorId`], never by address: addresses are reused by the
//! recording allocator, ids are not.
//!
//! Invariants of a well-formed trace (checked by [`Trace::validate`]):
//! - every `Alloc` has a fresh id (not a static block's, not an earlier alloc's);
//! - every `Free` and `Access` names an id that is live at that point;
//! - `time_us` never decreases;
//! - no allocation, and no sum of live tensors' bytes, exceeds
//!   [`crate::limits::MAX_TRACE_BYTES`].

use serde::{Deserialize, Serialize};

use crate::error::TraceError;

/// Identifies one tensor for its whole life. Never reused within a trace.
pub type TensorId = u64;

/// A stream index. `0` is the device's default stream; importers map each distinct
/// source stream handle to a small dense index in order of first appearance.
pub type StreamId = u32;

/// One thing that happened, at `time_us` microseconds after the trace's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    pub time_us: u64,
    pub kind: EventKind,
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum EventKind {
    /// A caller asked for `bytes` (requested, unrounded) on `stream`.
    Alloc {
        id: TensorId,
        bytes: u64,
        stream: StreamId,
    },
    /// The tensor's memory was returned (PyTorch: `free_completed`).
    Free { id: TensorId },
    /// A kernel read (or wrote) the live tensor. Only sources that know it emit these.
    Access { id: TensorId, write: bool },
    /// A training/inference iteration starts here (or, for the last one, the previous ends).
    IterationBoundary,
}

/// A block live before recording began. Part of the trace: replays allocate these first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticBlock {
    pub id: TensorId,
    pub bytes: u64,
    pub stream: StreamId,
}

/// Per-tensor metadata, where the source knows it (synthetic graph traces do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TensorMeta {
    pub id: TensorId,
    /// Requested bytes.
    pub size: u64,
    /// The op that produced it (e.g. `layer3.conv2.fwd`).
    pub producer: Option<String>,
    /// The ops that read it, in order.
    pub consumers: Vec<String>,
    /// Liveness interval as event indices: `[alloc_event, free_event)`; `None` ends
    /// mean "before the trace" / "still live at the end".
    pub alloc_event: Option<u64>,
    pub free_event: Option<u64>,
    /// Recompute cost in microseconds if the tensor can be recomputed instead of kept.
    pub recompute_us: Option<u64>,
}

/// A device segment event of the recording allocator (PyTorch's `segment_alloc` /
/// `segment_free`). Not demand: kept so that allocator emulations can be validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSegmentEvent {
    /// Index of the next demand event in [`Trace::events`] when this happened.
    pub before_event: u64,
    pub bytes: u64,
    pub alloc: bool,
}

/// Where a trace came from and what it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TraceMeta {
    /// Short name, e.g. `resnet50_b64_train`.
    pub name: String,
    /// `pytorch-snapshot`, `synthetic:<family>`, ...
    pub source: String,
    /// Free-form description (workload parameters).
    pub description: String,
}

/// A whole trace. See the module docs for the invariants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Trace {
    pub meta: TraceMeta,
    pub static_blocks: Vec<StaticBlock>,
    pub events: Vec<Event>,
    /// Empty when the source knows nothing beyond sizes.
    pub tensors: Vec<TensorMeta>,
    /// Empty for sources without an allocator of their own.
    pub source_segments: Vec<SourceSegmentEvent>,
}

impl Trace {
    /// Number of iteration boundaries in the trace.
    pub fn boundaries(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::IterationBoundary))
            .count()
    }

    /// Number of whole iterations: spans between consecutive boundaries.
    pub fn iterations(&self) -> usize {
        self.boundaries().saturating_sub(1)
    }

    /// Sum of the static blocks' requested bytes.
    /// The trace up to and including its `n`-th iteration boundary (all of it if it
    /// has fewer): the recording of a shorter run of the same job.
    pub fn until_boundary(&self, n: usize) -> Trace {
        let mut seen = 0;
        let end = self
            .events
            .iter()
            .position(|e| {
                seen += matches!(e.kind, EventKind::IterationBoundary) as usize;
                seen == n
            })
            .map_or(self.events.len(), |i| i + 1);
        Trace {
            events: self.events[..end].to_vec(),
            ..self.clone()
        }
    }

    pub fn static_bytes(&self) -> u64 {
        self.static_blocks.iter().map(|b| b.bytes).sum()
    }

    /// Checks the invariants in the module docs; the error names the first bad event.
    pub fn validate(&self) -> Result<(), TraceError> {
        let max = crate::limits::MAX_TRACE_BYTES;
        // The error for `bytes` (named `one`) that bring the live sum to `live` (named
        // `all`), if either passes the limit: the one that does is the one printed.
        let over = |bytes: u64, live: u64, one: &str, all: &str| {
            let (what, n) = match (bytes > max, live > max) {
                (true, _) => (one, bytes),
                (false, true) => (all, live),
                (false, false) => return None,
            };
            Some(format!(
                "{what} of {n} bytes, above the limit of {max} (MAX_TRACE_BYTES)"
            ))
        };
        let mut live: std::collections::HashMap<TensorId, u64> = Default::default();
        // Invariant: live_bytes = sum of `live`'s values <= MAX_TRACE_BYTES.
        let mut live_bytes = 0u64;
        for (index, b) in self.static_blocks.iter().enumerate() {
            let index = index as u64;
            if live.insert(b.id, b.bytes).is_some() {
                return Err(TraceError::InvalidStatic {
                    index,
                    what: format!("id {} is an earlier static block's too", b.id),
                });
            }
            live_bytes = live_bytes.saturating_add(b.bytes);
            if let Some(what) = over(b.bytes, live_bytes, "a block", "static blocks") {
                return Err(TraceError::InvalidStatic { index, what });
            }
        }
        let mut seen: std::collections::HashSet<TensorId> = live.keys().copied().collect();
        let mut last_t = 0;
        for (index, e) in self.events.iter().enumerate() {
            let index = index as u64;
            if e.time_us < last_t {
                return Err(TraceError::Invalid {
                    index,
                    what: format!("time goes backwards ({} < {last_t})", e.time_us),
                });
            }
            last_t = e.time_us;
            match e.kind {
                EventKind::Alloc { id, bytes, .. } => {
                    if !seen.insert(id) {
                        return Err(TraceError::Invalid {
                            index,
                            what: format!("tensor id {id} allocated twice"),
                        });
                    }
                    live_bytes = live_bytes.saturating_add(bytes);
                    if let Some(what) = over(bytes, live_bytes, "an allocation", "live tensors") {
                        return Err(TraceError::Invalid { index, what });
                    }
                    live.insert(id, bytes);
                }
                EventKind::Free { id } => match live.remove(&id) {
                    Some(bytes) => live_bytes -= bytes,
                    None => {
                        return Err(TraceError::Invalid {
                            index,
                            what: format!("free of tensor {id}, which is not live"),
                        })
                    }
                },
                EventKind::Access { id, .. } => {
                    if !live.contains_key(&id) {
                        return Err(TraceError::Invalid {
                            index,
                            what: format!("access to tensor {id}, which is not live"),
                        });
                    }
                }
                EventKind::IterationBoundary => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(id: TensorId, bytes: u64) -> Event {
        Event {
            time_us: id,
            kind: EventKind::Alloc {
                id,
                bytes,
                stream: 0,
            },
        }
    }

    fn block(id: TensorId, bytes: u64) -> StaticBlock {
        StaticBlock {
            id,
            bytes,
            stream: 0,
        }
    }

    fn err(t: &Trace) -> String {
        t.validate().unwrap_err().to_string()
    }

    #[test]
    fn sizes_beyond_the_limit_are_refused_with_their_event_or_block() {
        let max = crate::limits::MAX_TRACE_BYTES;
        let mut t = Trace {
            events: vec![
                alloc(1, max),
                Event {
                    time_us: 2,
                    kind: EventKind::Free { id: 1 },
                },
            ],
            ..Default::default()
        };
        t.validate().unwrap();
        // Freed bytes leave the live sum: the same again fits.
        t.events.push(alloc(3, max));
        t.validate().unwrap();
        t.events.push(alloc(4, 1));
        let e = err(&t);
        assert!(e.starts_with("trace event 3: live tensors of"), "{e}");
        // The allocation's own bytes, not the live sum it would make.
        t.static_blocks = vec![block(9, 1 << 20)];
        t.events = vec![alloc(1, max + 1)];
        let e = err(&t);
        assert!(
            e.starts_with(&format!(
                "trace event 0: an allocation of {} bytes",
                max + 1
            )),
            "{e}"
        );
        t.static_blocks.clear();
        t.events = vec![alloc(1, u64::MAX)];
        let e = err(&t);
        assert!(
            e.starts_with("trace event 0: an allocation of 18446744073709551615 bytes"),
            "{e}"
        );
        t.events.clear();
        t.static_blocks = vec![block(1, 1 << 20), block(2, max)];
        let e = err(&t);
        assert!(e.starts_with("static block 1: static blocks of"), "{e}");
        t.static_blocks = vec![block(1, max + 1)];
        assert!(err(&t).starts_with("static block 0: a block of"));
    }

    #[test]
    fn a_static_block_id_used_twice_names_the_second_block() {
        let t = Trace {
            static_blocks: vec![block(5, 64), block(6, 64), block(5, 64)],
            ..Default::default()
        };
        assert_eq!(
            err(&t),
            "static block 2: id 5 is an earlier static block's too"
        );
    }
}
