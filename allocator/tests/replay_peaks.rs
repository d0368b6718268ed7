//! Peak requested bytes: the replay's report, `TraceStats` and the replay's sizing all
//! count the same bytes, frees of static blocks included.

use memcast_alloc::replay::{replay, ReplayOptions};
use memcast_trace::stats::{peaks, TraceStats};
use memcast_trace::{Event, EventKind, StaticBlock, Trace};

fn check(t: &Trace) {
    let stats = TraceStats::compute(t).unwrap();
    let r = replay(t, &ReplayOptions::default()).unwrap();
    assert_eq!(
        r.peak_requested_bytes, stats.peak_requested_bytes,
        "{}",
        t.meta.name
    );
    assert_eq!(
        peaks(t).requested,
        stats.peak_requested_bytes,
        "{}",
        t.meta.name
    );
}

/// A static block freed early, then more allocated than was ever live with it: the
/// peak is after its free, and lower than the static bytes plus every later block.
#[test]
fn a_freed_static_block_is_not_live_any_more() {
    let ev = |time_us, kind| Event { time_us, kind };
    let alloc = |id, bytes| EventKind::Alloc {
        id,
        bytes,
        stream: 0,
    };
    let t = Trace {
        static_blocks: vec![StaticBlock {
            id: 100,
            bytes: 64 << 20,
            stream: 0,
        }],
        events: vec![
            ev(0, EventKind::IterationBoundary),
            ev(1, alloc(1, 8 << 20)),
            ev(2, EventKind::Free { id: 100 }),
            ev(3, alloc(2, 32 << 20)),
            ev(4, alloc(3, 40 << 20)),
            ev(5, EventKind::Free { id: 1 }),
            ev(9, EventKind::IterationBoundary),
        ],
        ..Default::default()
    };
    check(&t);
    assert_eq!(peaks(&t).requested, 80 << 20);
}

#[test]
fn bundled_traces_agree() {
    for b in memcast_trace::bundled::ALL
        .iter()
        .filter(|b| b.name != "gpt2_generate_dynamic")
    {
        check(&b.load().unwrap());
    }
}
