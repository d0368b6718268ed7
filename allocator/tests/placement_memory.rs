//! Planned placement's memory on hostile use: an unknown stream id, a profile naming a
//! huge stream id, and a program that never calls `iteration_boundary` cost the log no
//! memory in proportion (each measured by the process's resident set, so they live in
//! a test binary of their own).

use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::{AllocConfig, AllocError, Allocator};
use memcast_trace::{Event, EventKind, Trace};

const MIB: u64 = 1 << 20;

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn one_alloc(stream: u32) -> Trace {
    let mut t = Trace::default();
    t.events.push(Event {
        time_us: 0,
        kind: EventKind::Alloc {
            id: 1,
            bytes: MIB,
            stream,
        },
    });
    t
}

#[test]
fn an_unknown_stream_is_an_error_not_a_huge_log() {
    let cfg = AllocConfig::default()
        .with_conf_string("placement:planned")
        .unwrap();
    let mut a = Allocator::new(SimBackend::h200(), cfg).unwrap();
    let before = rss_bytes();
    let t = std::time::Instant::now();
    let e = a.allocate(MIB, 1_000_000).unwrap_err();
    let grew = rss_bytes().saturating_sub(before);
    eprintln!("{e} after {:?}, rss +{} MiB", t.elapsed(), grew >> 20);
    assert!(matches!(e, AllocError::UnknownStream(_)), "{e}");
    assert!(
        grew < 32 * MIB,
        "an unknown stream id cost {} MiB",
        grew >> 20
    );
}

#[test]
fn a_profile_with_a_huge_stream_id_costs_no_memory() {
    let mut a = Allocator::new(SimBackend::h200(), AllocConfig::default()).unwrap();
    let t = one_alloc(1_000_000);
    let before = rss_bytes();
    a.set_placement_profile(&t).unwrap();
    let grew = rss_bytes().saturating_sub(before);
    eprintln!("rss +{} MiB", grew >> 20);
    assert!(
        grew < 32 * MIB,
        "a profile stream id cost {} MiB",
        grew >> 20
    );
}

#[test]
fn without_boundaries_the_log_does_not_grow() {
    let cfg = AllocConfig::default()
        .with_conf_string("placement:planned")
        .unwrap();
    let mut a = Allocator::new(SimBackend::h200(), cfg).unwrap();
    let warm = a.allocate(MIB, 0).unwrap();
    a.deallocate(warm, 0).unwrap();
    let before = rss_bytes();
    for _ in 0..2_000_000 {
        let x = a.allocate(MIB, 0).unwrap();
        a.deallocate(x, 0).unwrap();
    }
    let grew = rss_bytes().saturating_sub(before);
    eprintln!("rss +{} MiB", grew >> 20);
    assert!(
        grew < 16 * MIB,
        "2M large alloc/free pairs without a boundary: +{} MiB",
        grew >> 20
    );
}
