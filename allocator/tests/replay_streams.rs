//! A trace's stream ids come from its file (a JSON trace document names them freely):
//! a stream past the 16 bits memcast's records keep is an error naming the stream and
//! the event under every policy, made before any stream is created (a stream of
//! `u32::MAX` asked of the PyTorch or naive target would be 4 billion streams).

use memcast_alloc::replay::{replay, Policy, ReplayOptions};
use memcast_trace::{Event, EventKind, Trace};

#[test]
fn a_stream_past_16_bits_is_an_error_under_every_policy() {
    let stream = 1 << 20;
    let t = Trace {
        events: vec![
            Event {
                time_us: 0,
                kind: EventKind::IterationBoundary,
            },
            Event {
                time_us: 1,
                kind: EventKind::Alloc {
                    id: 1,
                    bytes: 512,
                    stream,
                },
            },
            Event {
                time_us: 2,
                kind: EventKind::Free { id: 1 },
            },
            Event {
                time_us: 2,
                kind: EventKind::IterationBoundary,
            },
        ],
        ..Default::default()
    };
    t.validate().unwrap();
    for policy in [Policy::Memcast, Policy::Pytorch, Policy::Naive] {
        let opts = ReplayOptions {
            policy,
            ..Default::default()
        };
        let err = replay(&t, &opts).expect_err("stream 2^20");
        let e = format!(
            "{err}: {}",
            std::error::Error::source(&err).map_or(String::new(), |s| s.to_string())
        );
        assert!(
            e.contains(&format!("stream {stream} is beyond")) && e.contains("event 1"),
            "{policy:?}: {e}"
        );
    }
}
