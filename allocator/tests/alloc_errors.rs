//! Bad input and device failures: typed errors, never a panic, and a consistent
//! allocator afterwards.

use memcast_alloc::backend::layers::{FailOnDemand, Limit};
use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::backend::{DevicePtr, StreamPriority};
use memcast_alloc::config::AllocConfig;
use memcast_alloc::{AllocError, Allocator};

const MIB: u64 = 1 << 20;

fn sim() -> Allocator<SimBackend> {
    Allocator::new(
        SimBackend::new(1 << 30, Default::default()),
        AllocConfig::default(),
    )
    .unwrap()
}

#[test]
fn bad_requests_are_typed_errors() {
    let mut a = sim();
    assert_eq!(a.allocate(0, 0), Err(AllocError::ZeroSize));
    assert!(matches!(
        a.allocate(2 << 30, 0),
        Err(AllocError::TooLarge { .. })
    ));
    assert!(matches!(
        a.allocate(100, 7),
        Err(AllocError::UnknownStream(7))
    ));
    a.check_invariants().unwrap();
}

/// Records hold sizes up to 1 TiB and streams up to 65,535: past either, a typed error
/// (on a device that could hold more), and the allocator goes on.
#[test]
fn limits_of_the_record_table_are_typed_errors() {
    const TIB: u64 = 1 << 40;
    let mut a = Allocator::new(
        SimBackend::new(4 * TIB, Default::default()),
        AllocConfig::default(),
    )
    .unwrap();
    match a.allocate(TIB + 1, 0) {
        Err(AllocError::TooLarge { capacity, .. }) => assert!(capacity <= TIB),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let x = a.allocate(3 * MIB, 0).unwrap();
    let mut streams = 1;
    let err = loop {
        match a.create_stream(StreamPriority::Normal) {
            Ok(_) => streams += 1,
            Err(e) => break e,
        }
        assert!(streams <= 1 << 16, "the 65537th stream was accepted");
    };
    assert!(matches!(err, AllocError::TooManyStreams(65536)), "{err}");
    assert_eq!(streams, 1 << 16);
    a.deallocate(x, 0).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn double_free_wrong_stream_and_foreign_pointers_are_refused() {
    let mut a = sim();
    let s1 = a.create_stream(StreamPriority::Normal).unwrap();
    for bytes in [100, 3 * MIB] {
        let x = a.allocate(bytes, 0).unwrap();
        assert!(
            matches!(a.deallocate(x, s1), Err(AllocError::WrongStream { owner: 0, given, .. }) if given == s1)
        );
        a.deallocate(x, 0).unwrap();
        assert!(matches!(
            a.deallocate(x, 0),
            Err(AllocError::DoubleFree { .. })
        ));
        assert!(matches!(
            a.deallocate_ptr(x.ptr, 0),
            Err(AllocError::DoubleFree { .. }) | Err(AllocError::UnknownAllocation { .. })
        ));
        a.check_invariants().unwrap();
    }
    let y = a.allocate(5 * MIB, 0).unwrap();
    // Never handed out: an arbitrary address, an interior pointer.
    assert!(matches!(
        a.deallocate_ptr(DevicePtr(12345), 0),
        Err(AllocError::UnknownAllocation { .. })
    ));
    assert!(matches!(
        a.deallocate_ptr(y.ptr.offset(256), 0),
        Err(AllocError::UnknownAllocation { .. })
    ));
    // A handle of another allocator.
    let mut b = sim();
    let z = b.allocate(64, 0).unwrap();
    assert!(a.deallocate(z, 0).is_err());
    a.check_invariants().unwrap();
    a.deallocate(y, 0).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn device_oom_is_recoverable_and_leaves_the_allocator_consistent() {
    let (fail, switch) = FailOnDemand::new(SimBackend::new(1 << 30, Default::default()));
    let mut a = Allocator::new(fail, AllocConfig::default()).unwrap();
    let keep = a.allocate(3 * MIB, 0).unwrap();
    let slab_warm = a.allocate(1000, 0).unwrap();
    switch.fail_all_allocs(true);
    // Needs new device memory: fails as out-of-memory, after one release-and-retry.
    let e = a.allocate(64 * MIB, 0).unwrap_err();
    assert!(matches!(e, AllocError::OutOfMemory { .. }), "{e}");
    assert_eq!(a.stats().ooms, 1);
    assert!(a.stats().oom_retries >= 1);
    a.check_invariants().unwrap();
    // Small requests still served from reserved memory (the slab made above).
    let small = a.allocate(1000, 0).unwrap();
    a.deallocate(slab_warm, 0).unwrap();
    switch.fail_all_allocs(false);
    let big = a.allocate(64 * MIB, 0).unwrap();
    for x in [keep, small, big] {
        a.deallocate(x, 0).unwrap();
    }
    a.check_invariants().unwrap();
}

#[test]
fn oom_releases_cached_memory_and_retries() {
    // A 64 MiB device: fill it, free, then ask for a different size that only fits
    // once the cached segments go back to the device.
    for growable in [false, true] {
        let cfg = AllocConfig {
            growable_segments: growable,
            ..AllocConfig::default()
        };
        let mut a = Allocator::new(Limit::new(SimBackend::h200(), 64 * MIB), cfg).unwrap();
        let xs: Vec<_> = (0..6).map(|_| a.allocate(10 * MIB, 0).unwrap()).collect();
        for x in xs {
            a.deallocate(x, 0).unwrap();
        }
        let y = a.allocate(60 * MIB, 0).unwrap();
        a.check_invariants().unwrap();
        a.deallocate(y, 0).unwrap();
        // More than the device: an error, not a panic.
        assert!(matches!(
            a.allocate(63 * MIB, 0)
                .map(|_| ())
                .and(a.allocate(10 * MIB, 0).map(|_| ())),
            Err(AllocError::OutOfMemory { .. })
        ));
        a.check_invariants().unwrap();
    }
}

#[test]
fn conf_string_errors_are_config_errors() {
    let e = AllocConfig::default()
        .with_conf_string("growth_factor:0.5")
        .unwrap_err();
    assert!(matches!(e, AllocError::Config(_)));
}

/// `lookup` answers the same before the run index exists (a record scan) and after the
/// first `deallocate_ptr` builds it.
#[test]
fn lookup_by_pointer_is_the_same_with_and_without_the_run_index() {
    let mut a = sim();
    let big: Vec<_> = (1..6)
        .map(|i| a.allocate(i * MIB + 512, 0).unwrap())
        .collect();
    let small = a.allocate(1000, 0).unwrap();
    a.deallocate(big[1], 0).unwrap();
    let probe = |a: &Allocator<SimBackend>| {
        let mut out = Vec::new();
        for x in big.iter().chain([&small]) {
            out.push(format!("{:?}", a.lookup(x.ptr)));
            out.push(format!("{:?}", a.lookup(x.ptr.offset(256))));
        }
        out.push(format!("{:?}", a.lookup(DevicePtr(12345))));
        out
    };
    let before = probe(&a);
    assert!(a.lookup(big[0].ptr).is_ok());
    assert!(a.lookup(big[0].ptr.offset(256)).is_err());
    assert!(a.lookup(big[1].ptr).is_err());
    assert_eq!(a.deallocate_ptr(big[2].ptr, 0).unwrap(), big[2].size);
    a.check_invariants().unwrap();
    let mut after = probe(&a);
    // big[2] is freed now: compare everything else.
    after[4] = before[4].clone();
    after[5] = before[5].clone();
    assert_eq!(before, after);
    for x in [big[0], big[3], big[4]] {
        assert_eq!(a.deallocate_ptr(x.ptr, 0).unwrap(), x.size);
    }
    a.deallocate(small, 0).unwrap();
    a.check_invariants().unwrap();
}
