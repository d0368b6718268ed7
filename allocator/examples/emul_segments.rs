//! Development helper: where the PyTorch emulation obtains its segments, next to where
//! the recording allocator obtained its own (`Trace::source_segments`).
//!
//! `cargo run --release -p memcast-alloc --example emul_segments -- TRACE [--all]`
//!
//! Prints the emulation's reserved bytes when the recording starts (after the modelled
//! warm-up), its peak, and per recorded iteration the segments each side obtained
//! (MiB). Environment: `LAYOUT=1` also prints the emulation's segments when the
//! recording starts; `SHOW_MIB=X` every recorded request of at least X MiB with the
//! segments then holding a block of its size; `WORKSPACES=` one of
//! `PytorchConfig::workspaces.at`'s values. PyTorch's reserved bytes at the recording's start are not in a trace; the
//! segments it obtained while recording are.

use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::replay::pytorch::{PytorchConfig, PytorchEmu};
use memcast_alloc::replay::{run_warm, ReplayOptions, ReplayTarget};
use memcast_alloc::AllocError;
use memcast_trace::EventKind;
use std::cell::RefCell;
use std::rc::Rc;

/// `println!` that stops quietly when stdout is closed (`| head`).
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write;
        if writeln!(std::io::stdout(), $($t)*).is_err() {
            std::process::exit(0);
        }
    }};
}

const MIB: f64 = (1u64 << 20) as f64;

/// `(iteration, bytes)` of each new segment, and the reserved bytes at the first
/// iteration boundary (when the recording starts).
type Log = Rc<RefCell<(Vec<(i64, u64)>, Option<u64>)>>;

/// The emulation, logging each new segment with the iteration it was made in (`-1`:
/// before the recording).
struct Logged {
    emu: PytorchEmu<SimBackend>,
    iteration: i64,
    out: Log,
    /// The trace's index of each `Alloc` event, and how many were replayed so far
    /// (valid for traces replayed without a modelled warm-up).
    alloc_events: Vec<u64>,
    allocs: usize,
    /// `(event index, bytes)` of each segment the emulation obtained.
    at: Rc<RefCell<Vec<(u64, u64)>>>,
}

impl Logged {
    fn note(&mut self, before: u64) {
        let now = self.emu.reserved();
        if now > before {
            self.out.borrow_mut().0.push((self.iteration, now - before));
            let ev = self
                .alloc_events
                .get(self.allocs)
                .copied()
                .unwrap_or(u64::MAX);
            self.at.borrow_mut().push((ev, now - before));
        }
    }
}

impl ReplayTarget for Logged {
    type Handle = (u32, u64);
    fn alloc(&mut self, bytes: u64, stream: u32) -> Result<(u32, u64), AllocError> {
        let before = self.emu.reserved();
        let h = self.emu.alloc(bytes, stream)?;
        if let Some(min) = std::env::var("SHOW_MIB")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
        {
            if bytes as f64 / MIB >= min && self.iteration >= 0 {
                let live = self.emu.segments();
                let holding: Vec<String> = live
                    .iter()
                    .filter(|s| {
                        s.blocks.iter().any(|&(b, a)| {
                            a && b >= bytes.next_multiple_of(512) && b < bytes + (1 << 20)
                        })
                    })
                    .map(|s| format!("{:.0}", s.size as f64 / MIB))
                    .collect();
                out!(
                    "  it {} alloc {:.1} MiB; reserved {:.0}; segments holding a block of this size: {}",
                    self.iteration,
                    bytes as f64 / MIB,
                    self.emu.reserved() as f64 / MIB,
                    holding.join(" ")
                );
            }
        }
        self.note(before);
        self.allocs += 1;
        Ok(h)
    }
    fn free(&mut self, h: (u32, u64), stream: u32) -> Result<(), AllocError> {
        self.emu.free(h, stream)
    }
    fn create_stream(&mut self) -> Result<u32, AllocError> {
        self.emu.create_stream()
    }
    fn reserved(&self) -> u64 {
        self.emu.reserved()
    }
    fn peak_reserved(&self) -> u64 {
        self.emu.peak_reserved()
    }
    fn device_allocs(&self) -> u64 {
        self.emu.device_allocs()
    }
    fn device_frees(&self) -> u64 {
        self.emu.device_frees()
    }
    fn free_and_largest(&self) -> (u64, u64) {
        self.emu.free_and_largest()
    }
    fn device_time_us(&self) -> f64 {
        self.emu.device_time_us()
    }
    fn advance_us(&mut self, us: f64) {
        self.emu.advance_us(us)
    }
    fn iteration_boundary(&mut self) {
        let mut o = self.out.borrow_mut();
        if o.1.is_none() {
            o.1 = Some(self.emu.reserved());
            if std::env::var_os("LAYOUT").is_some() {
                for seg in self.emu.segments() {
                    let blocks: Vec<String> = seg
                        .blocks
                        .iter()
                        .map(|&(b, a)| format!("{:.2}{}", b as f64 / MIB, if a { "*" } else { "" }))
                        .collect();
                    out!(
                        "  start segment {:>8.2} MiB: {}",
                        seg.size as f64 / MIB,
                        blocks.join(" ")
                    );
                }
            }
        }
        self.iteration += 1;
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.first().ok_or("usage: emul_segments TRACE [--all]")?;
    let all = args.iter().any(|a| a == "--all");
    let trace = memcast_trace::io::load_trace(std::path::Path::new(path))?;
    let opts = ReplayOptions::default();
    let mut cfg = PytorchConfig::default();
    if let Ok(w) = std::env::var("WORKSPACES") {
        cfg.workspaces.at = serde_json::from_value(serde_json::json!(w))?;
    }
    let plan = cfg.warmup_plan(&trace);
    let emu = PytorchEmu::new(SimBackend::new(opts.sim_capacity, Default::default()), cfg);
    let out = Rc::new(RefCell::new((Vec::new(), None)));
    let at = Rc::new(RefCell::new(Vec::new()));
    let t = Logged {
        emu,
        iteration: -1,
        out: out.clone(),
        alloc_events: (0..trace.events.len() as u64)
            .filter(|&i| matches!(trace.events[i as usize].kind, EventKind::Alloc { .. }))
            .collect(),
        allocs: 0,
        at: at.clone(),
    };
    let r = run_warm(&trace, t, &opts, plan.as_ref())?;
    let (log, start) = out.take();
    // The recording's segments per iteration (the boundary count before each).
    let mut bounds = Vec::new();
    for (i, e) in trace.events.iter().enumerate() {
        if matches!(e.kind, EventKind::IterationBoundary) {
            bounds.push(i as u64);
        }
    }
    let iteration_of = |ev: u64| bounds.iter().filter(|&&b| b < ev).count() as i64 - 1;
    let src: Vec<(i64, u64)> = trace
        .source_segments
        .iter()
        .filter(|s| s.alloc)
        .map(|s| (iteration_of(s.before_event), s.bytes))
        .collect();
    let start = start.unwrap_or(0);
    let sum = |v: &[(i64, u64)], it: i64| v.iter().filter(|s| s.0 == it).map(|s| s.1).sum::<u64>();
    out!(
        "{}: emulation reserved at recording start {:.0} MiB, peak {:.0} MiB; segments obtained while recording: emulation {:.0} MiB ({}), source {:.0} MiB ({})",
        trace.meta.name,
        start as f64 / MIB,
        r.peak_reserved_bytes as f64 / MIB,
        log.iter().filter(|s| s.0 >= 0).map(|s| s.1).sum::<u64>() as f64 / MIB,
        log.iter().filter(|s| s.0 >= 0).count(),
        src.iter().map(|s| s.1).sum::<u64>() as f64 / MIB,
        src.len(),
    );
    if std::env::var_os("FIRST_DIFF").is_some() && plan.is_none() && trace.static_blocks.is_empty()
    {
        // Each segment either side obtained, by the event whose request made it, up to
        // the first few on which the two differ (a trace replayed with no modelled
        // warm-up and no static blocks: every allocation is an event of the trace; a
        // segment PyTorch made for a dropped marker shows as "only source").
        let emu_at = at.borrow();
        let src_at: Vec<(u64, u64)> = trace
            .source_segments
            .iter()
            .filter(|s| s.alloc)
            .map(|s| (s.before_event, s.bytes))
            .collect();
        let (mut i, mut j, mut shown) = (0, 0, 0);
        while (i < emu_at.len() || j < src_at.len()) && shown < 8 {
            let (e, s) = (emu_at.get(i), src_at.get(j));
            if e == s {
                i += 1;
                j += 1;
                continue;
            }
            let request = |ev: u64| match trace.events.get(ev as usize).map(|e| &e.kind) {
                Some(EventKind::Alloc { bytes, .. }) => *bytes as f64 / MIB,
                _ => f64::NAN,
            };
            let take_e = match (e, s) {
                (Some(e), Some(s)) => e.0 <= s.0,
                (Some(_), None) => true,
                _ => false,
            };
            let (side, (ev, bytes)) = if take_e {
                i += 1;
                ("emulation", *e.unwrap())
            } else {
                j += 1;
                ("source", *s.unwrap())
            };
            out!(
                "  only {side}: a {:.2} MiB segment at event {ev} (iteration {}, a request of {:.3} MiB)",
                bytes as f64 / MIB,
                iteration_of(ev),
                request(ev)
            );
            shown += 1;
        }
    }
    let last = bounds.len() as i64;
    for it in -1..last {
        let (e, s) = (sum(&log, it), sum(&src, it));
        if e == 0 && s == 0 {
            continue;
        }
        let list = |v: &[(i64, u64)]| {
            let mut sizes: Vec<String> = v
                .iter()
                .filter(|x| x.0 == it)
                .map(|x| format!("{:.0}", x.1 as f64 / MIB))
                .collect();
            if !all && sizes.len() > 12 {
                let n = sizes.len();
                sizes.truncate(12);
                sizes.push(format!("... ({n})"));
            }
            sizes.join(" ")
        };
        out!(
            "  iteration {it:>3}: emulation {:>8.0} MiB [{}] | source {:>8.0} MiB [{}]",
            e as f64 / MIB,
            list(&log),
            s as f64 / MIB,
            list(&src)
        );
    }
    Ok(())
}
