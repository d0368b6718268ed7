//! Import of PyTorch memory snapshots (`torch.cuda.memory._snapshot()` pickles).
//!
//! Semantics (PyTorch 2.x `device_traces` entries; facts in docs/trace-format.md):
//! - `alloc`: a caller asked for `size` requested (unrounded) bytes at `addr`. It becomes
//!   an [`EventKind::Alloc`] with a fresh [`TensorId`]; the address maps to that id until
//!   the block is freed (addresses are reused, ids are not).
//! - `free_requested`: the caller dropped the tensor; the block may still be in use by
//!   other streams. Only checked here.
//! - `free_completed`: the memory really went back to the allocator: [`EventKind::Free`].
//!   A free of an address the trace never allocated is a block that was live before
//!   recording began: it becomes a [`StaticBlock`].
//! - `segment_alloc` / `segment_free` (and `segment_map` / `segment_unmap` with
//!   expandable segments): the recording allocator's own device calls, kept as
//!   [`SourceSegmentEvent`]s for validating allocator emulations. Other actions (`oom`,
//!   `snapshot`, ...) and unknown keys are ignored.
//! - Blocks live before recording began are found in `segments[*].blocks` with an active
//!   state, minus those explained by trace allocations still live at the end.
//! - Iteration markers: an `alloc` of exactly [`SnapshotOptions::iteration_marker_bytes`]
//!   immediately followed by its `free_requested` becomes an
//!   [`EventKind::IterationBoundary`]; its alloc/free pair is dropped unless
//!   [`SnapshotOptions::keep_marker_allocs`].

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use crate::error::TraceError;
use crate::model::{
    Event, EventKind, SourceSegmentEvent, StaticBlock, StreamId, TensorId, Trace, TraceMeta,
};
use crate::pickle::{self, Handle, Pickle};

/// The marker size used by the recorder of the shared traces.
pub const DEFAULT_MARKER_BYTES: u64 = 7_341_568;

/// How to read a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotOptions {
    /// Which entry of `device_traces` (the CUDA device index). Default 0.
    pub device: usize,
    /// Allocation size that marks an iteration boundary; `None` disables detection.
    /// Default [`DEFAULT_MARKER_BYTES`].
    pub iteration_marker_bytes: Option<u64>,
    /// Keep the marker allocations as ordinary alloc/free events as well. Default false.
    pub keep_marker_allocs: bool,
    /// Trace name recorded in the metadata.
    pub name: String,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions {
            device: 0,
            iteration_marker_bytes: Some(DEFAULT_MARKER_BYTES),
            keep_marker_allocs: false,
            name: String::new(),
        }
    }
}

/// Reads a snapshot pickle from memory.
pub fn import_snapshot(data: &[u8], opts: &SnapshotOptions) -> Result<Trace, TraceError> {
    let p = pickle::parse(data)?;
    from_pickle(&p, opts)
}

fn snap_err(what: impl Into<String>) -> TraceError {
    TraceError::Snapshot { what: what.into() }
}

/// One `device_traces` entry, decoded.
#[derive(Default)]
struct RawEvent<'a> {
    action: Option<&'a [u8]>,
    addr: Option<i64>,
    size: Option<i64>,
    stream: Option<i64>,
    time_us: Option<i64>,
}

fn raw_event<'a>(p: &Pickle<'a>, ev: Handle, index: usize) -> Result<RawEvent<'a>, TraceError> {
    let pairs = p.pairs(ev).ok_or_else(|| TraceError::SnapshotEvent {
        index: index as u64,
        what: format!("a {}, expected a dict", p.type_name(ev)),
    })?;
    let mut raw = RawEvent::default();
    for (k, v) in pairs {
        match p.str_bytes(k) {
            Some(b"action") => raw.action = p.str_bytes(v),
            Some(b"addr") => raw.addr = p.as_int(v),
            Some(b"size") => raw.size = p.as_int(v),
            Some(b"stream") => raw.stream = p.as_int(v),
            Some(b"time_us") => raw.time_us = p.as_int(v),
            _ => {} // frames, compile_context, user_metadata, future keys
        }
    }
    Ok(raw)
}

/// Converts an already parsed snapshot.
pub fn from_pickle(p: &Pickle<'_>, opts: &SnapshotOptions) -> Result<Trace, TraceError> {
    let root = p.root();
    if p.pairs(root).is_none() {
        return Err(snap_err(format!(
            "top level is a {}, expected the dict of torch.cuda.memory._snapshot()",
            p.type_name(root)
        )));
    }
    let traces = p
        .get(root, "device_traces")
        .ok_or_else(|| snap_err("no `device_traces` key (record with _record_memory_history)"))?;
    let traces: Vec<Handle> = p
        .elements(traces)
        .ok_or_else(|| snap_err("`device_traces` is not a list"))?
        .collect();
    let events = *traces.get(opts.device).ok_or_else(|| {
        snap_err(format!(
            "no device_traces[{}] (the snapshot has {} device(s))",
            opts.device,
            traces.len()
        ))
    })?;
    let events: Vec<Handle> = p
        .elements(events)
        .ok_or_else(|| snap_err(format!("device_traces[{}] is not a list", opts.device)))?
        .collect();

    let mut b = Builder::new(opts);
    let mut next = match events.first() {
        Some(&e) => Some(raw_event(p, e, 0)?),
        None => None,
    };
    for index in 0..events.len() {
        let raw = next.take().expect("decoded one ahead");
        next = match events.get(index + 1) {
            Some(&e) => Some(raw_event(p, e, index + 1)?),
            None => None,
        };
        let next_is_free_of = |addr: i64| {
            next.as_ref().is_some_and(|n| {
                n.action == Some(b"free_requested".as_slice()) && n.addr == Some(addr)
            })
        };
        b.event(index as u64, &raw, next_is_free_of)?;
    }

    // Blocks active at snapshot time that no live trace allocation explains were live
    // before recording began.
    let segments = p
        .get(root, "segments")
        .ok_or_else(|| snap_err("no `segments` key"))?;
    let segments = p
        .elements(segments)
        .ok_or_else(|| snap_err("`segments` is not a list"))?;
    // Each segment, blocks list and block is its own object in a real snapshot. A pickle
    // may refer to one object many times (memo references, two bytes each): listing one
    // segment 30,000 times would make a 100 KB file describe millions of blocks. Every
    // object is visited once, so the work is bounded by the objects the file holds.
    let mut seen: HashSet<Handle> = HashSet::new();
    let mut once = |h: Handle, what: &dyn Fn() -> String| {
        // Only containers are objects; equal small values (ints, None) are not shared.
        let object = p.pairs(h).is_some() || p.elements(h).is_some();
        if !object || seen.insert(h) {
            Ok(())
        } else {
            Err(snap_err(format!(
                "{} is the same object as one listed before it (a pickle memo reference): a snapshot lists each segment and block once",
                what()
            )))
        }
    };
    for (si, seg) in segments.enumerate() {
        once(seg, &|| format!("segments[{si}]"))?;
        let int = |h: Handle, k: &str| p.get(h, k).and_then(|v| p.as_int(v));
        if int(seg, "device").unwrap_or(0) != opts.device as i64 {
            continue;
        }
        let stream = int(seg, "stream").unwrap_or(0);
        let Some(blocks_h) = p.get(seg, "blocks").filter(|&v| p.elements(v).is_some()) else {
            return Err(snap_err(format!("segments[{si}] has no `blocks` list")));
        };
        once(blocks_h, &|| format!("segments[{si}].blocks"))?;
        let blocks = p.elements(blocks_h).expect("checked to be a list");
        for (bi, blk) in blocks.enumerate() {
            once(blk, &|| format!("segments[{si}].blocks[{bi}]"))?;
            let state = p.get(blk, "state").and_then(|v| p.as_str(v)).unwrap_or("");
            if !state.starts_with("active") {
                continue;
            }
            let field = |k: &str| {
                int(blk, k).ok_or_else(|| {
                    snap_err(format!("segments[{si}].blocks[{bi}] has no integer `{k}`"))
                })
            };
            let addr = field("address")?;
            let req = match int(blk, "requested_size") {
                Some(r) => r,
                None => field("size")?,
            };
            if !b.live.contains_key(&addr) {
                let stream = b.stream_index(stream);
                b.add_static(req.max(0) as u64, stream);
            }
        }
    }

    b.trace.meta = TraceMeta {
        name: opts.name.clone(),
        source: "pytorch-snapshot".into(),
        description: format!(
            "torch.cuda.memory._snapshot() device {}, {} raw events",
            opts.device,
            events.len()
        ),
    };
    if b.clamped_times > 0 {
        tracing::warn!(
            count = b.clamped_times,
            "snapshot timestamps went backwards; clamped to keep time monotonic"
        );
    }
    Ok(b.trace)
}

/// Device addresses are not attacker-chosen keys and SipHash costs ~20% of an import:
/// a multiplicative (Fibonacci) hash of the 256-byte-aligned address is enough.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_i64(&mut self, i: i64) {
        self.0 = (i as u64 >> 8 ^ i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type AddrMap<V> = HashMap<i64, V, BuildHasherDefault<AddrHasher>>;

struct Builder<'o> {
    opts: &'o SnapshotOptions,
    trace: Trace,
    // Invariant: live[addr] = (tensor id, requested bytes) of the trace allocation at addr.
    live: AddrMap<TensorId>,
    // Raw stream handle -> dense index; 0 always maps to 0.
    streams: AddrMap<StreamId>,
    markers: HashSet<i64, BuildHasherDefault<AddrHasher>>,
    next_id: TensorId,
    t0: Option<i64>,
    last_t: u64,
    clamped_times: u64,
}

impl<'o> Builder<'o> {
    fn new(opts: &'o SnapshotOptions) -> Self {
        let mut streams = AddrMap::default();
        streams.insert(0, 0);
        Builder {
            opts,
            trace: Trace::default(),
            live: AddrMap::default(),
            streams,
            markers: HashSet::default(),
            next_id: 0,
            t0: None,
            last_t: 0,
            clamped_times: 0,
        }
    }

    fn stream_index(&mut self, raw: i64) -> StreamId {
        let n = self.streams.len() as StreamId;
        *self.streams.entry(raw).or_insert(n)
    }

    fn add_static(&mut self, bytes: u64, stream: StreamId) -> TensorId {
        let id = self.next_id;
        self.next_id += 1;
        self.trace
            .static_blocks
            .push(StaticBlock { id, bytes, stream });
        id
    }

    fn push(&mut self, time_us: u64, kind: EventKind) {
        self.trace.events.push(Event { time_us, kind });
    }

    fn event(
        &mut self,
        index: u64,
        raw: &RawEvent<'_>,
        next_is_free_of: impl Fn(i64) -> bool,
    ) -> Result<(), TraceError> {
        let missing = |k: &str| TraceError::SnapshotEvent {
            index,
            what: format!("no integer `{k}`"),
        };
        let action = raw.action.ok_or_else(|| TraceError::SnapshotEvent {
            index,
            what: "no string `action`".into(),
        })?;
        let action = std::str::from_utf8(action).unwrap_or("");
        let t_raw = raw.time_us.unwrap_or(0);
        let t0 = *self.t0.get_or_insert(t_raw);
        let mut t = (t_raw - t0).max(0) as u64;
        if t < self.last_t {
            self.clamped_times += 1;
            t = self.last_t;
        }
        self.last_t = t;
        let size = |r: &RawEvent<'_>| -> Result<u64, TraceError> {
            let s = r.size.ok_or_else(|| missing("size"))?;
            u64::try_from(s).map_err(|_| TraceError::SnapshotEvent {
                index,
                what: format!("negative size {s}"),
            })
        };
        match action {
            "alloc" => {
                let addr = raw.addr.ok_or_else(|| missing("addr"))?;
                let bytes = size(raw)?;
                let stream = self.stream_index(raw.stream.unwrap_or(0));
                if self.live.contains_key(&addr) || self.markers.contains(&addr) {
                    return Err(TraceError::SnapshotEvent {
                        index,
                        what: format!("alloc at 0x{addr:x}, which is already allocated"),
                    });
                }
                let is_marker =
                    self.opts.iteration_marker_bytes == Some(bytes) && next_is_free_of(addr);
                if is_marker {
                    self.push(t, EventKind::IterationBoundary);
                    if !self.opts.keep_marker_allocs {
                        self.markers.insert(addr);
                        return Ok(());
                    }
                }
                let id = self.next_id;
                self.next_id += 1;
                self.live.insert(addr, id);
                self.push(t, EventKind::Alloc { id, bytes, stream });
            }
            "free_requested" => {
                raw.addr.ok_or_else(|| missing("addr"))?;
            }
            "free_completed" => {
                let addr = raw.addr.ok_or_else(|| missing("addr"))?;
                if self.markers.remove(&addr) {
                    return Ok(());
                }
                let id = match self.live.remove(&addr) {
                    Some(id) => id,
                    None => {
                        // Live before recording began: a static block, freed now.
                        let bytes = size(raw)?;
                        let stream = self.stream_index(raw.stream.unwrap_or(0));
                        self.add_static(bytes, stream)
                    }
                };
                self.push(t, EventKind::Free { id });
            }
            "segment_alloc" | "segment_map" | "segment_free" | "segment_unmap" => {
                let bytes = size(raw)?;
                self.trace.source_segments.push(SourceSegmentEvent {
                    before_event: self.trace.events.len() as u64,
                    bytes,
                    alloc: action == "segment_alloc" || action == "segment_map",
                });
            }
            _ => {} // oom, snapshot, and actions of newer PyTorch versions
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a snapshot pickle with CPython's layout (protocol 4) from a tiny writer.
    fn pickle_snapshot(events: &[(&str, i64, i64)], blocks: &[(i64, i64, &str)]) -> Vec<u8> {
        fn s(out: &mut Vec<u8>, x: &str) {
            out.push(0x8c);
            out.push(x.len() as u8);
            out.extend_from_slice(x.as_bytes());
        }
        fn i(out: &mut Vec<u8>, x: i64) {
            out.push(0x8a);
            out.push(8);
            out.extend_from_slice(&x.to_le_bytes());
        }
        let mut o = vec![0x80, 4, b'}', b'('];
        s(&mut o, "device_traces");
        o.extend_from_slice(b"]]("); // outer list, inner list, MARK
        for (t, (action, addr, size)) in events.iter().enumerate() {
            o.extend_from_slice(b"}(");
            for (k, v) in [
                ("addr", *addr),
                ("size", *size),
                ("stream", 0),
                ("time_us", 1000 + t as i64),
            ] {
                s(&mut o, k);
                i(&mut o, v);
            }
            s(&mut o, "action");
            s(&mut o, action);
            s(&mut o, "frames"); // unknown/ignored key
            o.push(b']');
            o.push(b'u');
        }
        o.extend_from_slice(b"ea"); // fill the inner list, append it to the outer
        s(&mut o, "segments");
        o.extend_from_slice(b"]}(");
        s(&mut o, "device");
        i(&mut o, 0);
        s(&mut o, "stream");
        i(&mut o, 0);
        s(&mut o, "blocks");
        o.extend_from_slice(b"](");
        for (addr, req, state) in blocks {
            o.extend_from_slice(b"}(");
            s(&mut o, "address");
            i(&mut o, *addr);
            s(&mut o, "requested_size");
            i(&mut o, *req);
            s(&mut o, "state");
            s(&mut o, state);
            o.push(b'u');
        }
        o.extend_from_slice(b"euau.");
        o
    }

    #[test]
    fn converts_events_markers_and_static_blocks() {
        let m = DEFAULT_MARKER_BYTES as i64;
        let data = pickle_snapshot(
            &[
                ("alloc", 0x100, m),
                ("free_requested", 0x100, m),
                ("free_completed", 0x100, m),
                ("segment_alloc", 0x200, 2 << 20),
                ("alloc", 0x200, 1000),
                ("alloc", 0x300, 2000),
                ("free_requested", 0x200, 1000),
                ("free_completed", 0x200, 1000),
                ("free_completed", 0x900, 512), // static block freed during the trace
                ("alloc", 0x200, 3000),         // address reuse: a new tensor
                ("alloc", 0x100, m),
                ("free_requested", 0x100, m),
                ("free_completed", 0x100, m),
            ],
            &[
                (0x300, 2000, "active_allocated"),
                (0x200, 3000, "active_allocated"),
                (0x700, 64, "active_allocated"),
                (0x800, 99, "inactive"),
            ],
        );
        let t = import_snapshot(&data, &SnapshotOptions::default()).unwrap();
        t.validate().unwrap();
        assert_eq!(t.iterations(), 1);
        let kinds: Vec<_> = t.events.iter().map(|e| e.kind).collect();
        assert!(matches!(kinds[0], EventKind::IterationBoundary));
        assert!(matches!(kinds[1], EventKind::Alloc { bytes: 1000, .. }));
        assert!(matches!(kinds[5], EventKind::Alloc { bytes: 3000, .. }));
        assert!(matches!(kinds[6], EventKind::IterationBoundary));
        // Static: the 512 B block freed in the trace, and the 64 B block at 0x700.
        let mut st: Vec<u64> = t.static_blocks.iter().map(|b| b.bytes).collect();
        st.sort();
        assert_eq!(st, vec![64, 512]);
        assert_eq!(t.source_segments.len(), 1);
        assert_eq!(t.source_segments[0].before_event, 1);
    }

    #[test]
    fn markers_can_be_disabled_or_kept() {
        let m = DEFAULT_MARKER_BYTES as i64;
        let data = pickle_snapshot(
            &[
                ("alloc", 0x100, m),
                ("free_requested", 0x100, m),
                ("free_completed", 0x100, m),
            ],
            &[],
        );
        let off = SnapshotOptions {
            iteration_marker_bytes: None,
            ..Default::default()
        };
        let t = import_snapshot(&data, &off).unwrap();
        assert_eq!((t.boundaries(), t.events.len()), (0, 2));
        let keep = SnapshotOptions {
            keep_marker_allocs: true,
            ..Default::default()
        };
        let t = import_snapshot(&data, &keep).unwrap();
        assert_eq!((t.boundaries(), t.events.len()), (1, 3));
    }

    #[test]
    fn a_marker_sized_tensor_that_lives_is_not_a_marker() {
        let m = DEFAULT_MARKER_BYTES as i64;
        let data = pickle_snapshot(
            &[
                ("alloc", 0x100, m),
                ("alloc", 0x200, 8),
                ("free_completed", 0x100, m),
            ],
            &[],
        );
        let t = import_snapshot(&data, &SnapshotOptions::default()).unwrap();
        assert_eq!(t.boundaries(), 0);
    }

    #[test]
    fn bad_events_name_their_index() {
        let data = pickle_snapshot(&[("alloc", 0x100, 8), ("alloc", 0x100, 8)], &[]);
        let e = import_snapshot(&data, &SnapshotOptions::default()).unwrap_err();
        assert!(e.to_string().starts_with("snapshot event 1:"), "{e}");
        let data = pickle_snapshot(&[("alloc", 0x100, -5)], &[]);
        let e = import_snapshot(&data, &SnapshotOptions::default()).unwrap_err();
        assert!(e.to_string().contains("event 0: negative size"), "{e}");
    }

    #[test]
    fn not_a_snapshot_is_a_clear_error() {
        // pickle.dumps([1], 4)
        let e = import_snapshot(b"\x80\x04]\x94K\x01a.", &SnapshotOptions::default()).unwrap_err();
        assert!(e.to_string().contains("top level is a list"), "{e}");
    }
}
