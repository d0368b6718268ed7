//! Recording a run as a memcast trace (`.mctrace`, the native format `memcast train`
//! and `memcast replay` read).
//!
//! Every allocation and free that reaches the library is an event; `memcast_step` is an
//! iteration boundary. Allocations live when recording starts (parameters, optimizer
//! state) become the trace's static blocks. Times are microseconds since the start.
//! Zero-size allocations (PyTorch makes them: empty tensors) are recorded as the 1-byte
//! blocks memcast gives them: a trace has no zero-size tensor (replay refuses one), and
//! a replay must count the allocations the job's allocator counted, or its forecaster
//! cuts steps elsewhere than the job's did.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use memcast_trace::{Event, EventKind, StaticBlock, Trace};

/// A live allocation as the library tracks it: (requested bytes, stream, tensor id).
pub type Live = HashMap<u64, (u64, u32, u64)>;

#[derive(Debug)]
pub struct Recorder {
    start: Instant,
    static_blocks: Vec<StaticBlock>,
    events: Vec<Event>,
    last_us: u64,
}

impl Recorder {
    /// Starts a recording; what is live now becomes static blocks.
    pub fn start(live: &Live) -> Self {
        let mut static_blocks: Vec<StaticBlock> = live
            .values()
            .map(|&(bytes, stream, id)| StaticBlock {
                id,
                bytes: bytes.max(1),
                stream,
            })
            .collect();
        static_blocks.sort_by_key(|b| b.id);
        Recorder {
            start: Instant::now(),
            static_blocks,
            events: Vec::new(),
            last_us: 0,
        }
    }

    fn now(&mut self) -> u64 {
        // Monotonic and never decreasing (the trace's invariant).
        let t = (self.start.elapsed().as_micros() as u64).max(self.last_us);
        self.last_us = t;
        t
    }

    /// An allocation of `bytes` requested bytes (0 recorded as 1, see the module docs).
    pub fn alloc(&mut self, id: u64, bytes: u64, stream: u32) {
        let time_us = self.now();
        self.events.push(Event {
            time_us,
            kind: EventKind::Alloc {
                id,
                bytes: bytes.max(1),
                stream,
            },
        });
    }

    /// The free of tensor `id`.
    pub fn free(&mut self, id: u64) {
        let time_us = self.now();
        self.events.push(Event {
            time_us,
            kind: EventKind::Free { id },
        });
    }

    pub fn boundary(&mut self) {
        let time_us = self.now();
        self.events.push(Event {
            time_us,
            kind: EventKind::IterationBoundary,
        });
    }

    pub fn events(&self) -> usize {
        self.events.len()
    }

    /// The trace (validated) written to `path`.
    pub fn finish(self, path: &Path, device: i32) -> Result<Trace, memcast_trace::TraceError> {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().trim_end_matches(".mctrace").to_string())
            .unwrap_or_else(|| "memcast_torch".into());
        let mut trace = Trace {
            static_blocks: self.static_blocks,
            events: self.events,
            ..Default::default()
        };
        trace.meta.name = name;
        trace.meta.source = "memcast-torch".into();
        trace.meta.description = format!(
            "recorded by memcast_torch on CUDA device {device}: every allocation and free \
             PyTorch made through memcast; iteration boundaries from memcast_torch.step()"
        );
        trace.validate()?;
        memcast_trace::native::save(&trace, path)?;
        Ok(trace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recording_round_trips_through_the_native_format() {
        let mut live = Live::new();
        live.insert(0x1000, (4096, 0, 1));
        live.insert(0x2000, (0, 0, 9));
        let mut r = Recorder::start(&live);
        r.alloc(2, 512, 0);
        r.alloc(3, 0, 0);
        r.boundary();
        r.free(2);
        r.free(3);
        r.free(9);
        r.free(1);
        let dir = std::env::temp_dir().join(format!("memcast-torch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.mctrace");
        let t = r.finish(&path, 0).unwrap();
        let back = memcast_trace::io::load_trace(&path).unwrap();
        assert_eq!(back.static_blocks, t.static_blocks);
        assert_eq!(back.events, t.events);
        assert_eq!(back.meta.name, "run");
        // Zero-size tensors are the 1-byte blocks memcast gave them; it replays.
        assert_eq!(back.static_blocks.len(), 2);
        assert_eq!(back.static_blocks[1].bytes, 1);
        assert_eq!(back.events.len(), 7);
        assert!(matches!(
            back.events[1].kind,
            EventKind::Alloc { bytes: 1, .. }
        ));
        memcast_alloc::replay::replay(&back, &Default::default()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_free_of_an_unknown_tensor_is_refused_at_finish() {
        let mut r = Recorder::start(&Live::new());
        r.free(7);
        let path = std::env::temp_dir().join("memcast-torch-bad.mctrace");
        assert!(r.finish(&path, 0).is_err());
    }
}
