//! Copies in two ranges of the pinned pool (`StagingPool::alloc(bytes, true)`): the
//! bytes come back from both, and a failure of either part leaves the tensor where it
//! was. On [`Deferred`](super::deferred::Deferred), as the integrity tests.

use crate::backend::layers::FailSwitch;

use super::handle::Place;
use super::manager::TierManager;
use super::tests::{manager_with_pool, pattern, put, read, TestBackend};
use super::{TensorHandle, TierError};

const KIB: u64 = 1 << 10;

/// A 256 KiB pinned pool filled by four 64 KiB spills, the first and third freed: two
/// 64 KiB holes, not next to each other (128 KiB free, no range of 128 KiB); and a
/// 128 KiB tensor on the device, which only both holes can hold. The four, and it.
fn scattered_pool() -> (
    TierManager<TestBackend>,
    FailSwitch,
    Vec<TensorHandle>,
    TensorHandle,
) {
    let (mut m, switch) = manager_with_pool(1, 256 << 10);
    let hs: Vec<_> = (0..4).map(|i| put(&mut m, i, 64 * KIB)).collect();
    m.end_step();
    for &h in &hs {
        assert!(m.spill(h).unwrap());
    }
    m.synchronize().unwrap();
    assert_eq!(m.stats().spills_warm, 4, "the four fill the pool");
    m.free(hs[0]).unwrap();
    m.free(hs[2]).unwrap();
    let big = put(&mut m, 9, 128 * KIB);
    m.end_step();
    (m, switch, hs, big)
}

/// A 128 KiB tensor registered and written after a failed copy in of `big`, whose
/// queued part still writes the block it holds: both read back their own bytes (the
/// test backend panics if the new tensor is placed where the queued copy writes).
fn next_tensor_and_big_keep_their_bytes(m: &mut TierManager<TestBackend>, big: TensorHandle) {
    let next = put(m, 11, 128 * KIB);
    m.end_step();
    assert_eq!(read(m, next).unwrap(), pattern(11, 128 * KIB));
    assert_eq!(read(m, big).unwrap(), pattern(9, 128 * KIB));
    m.check_invariants().unwrap();
}

/// A copy the pinned pool has room for only in two ranges goes there in two parts,
/// not to pageable memory, and its bytes come back intact.
#[test]
fn a_copy_the_pool_holds_only_in_two_ranges_is_split_over_them() {
    let (mut m, _, hs, big) = scattered_pool();
    assert!(m.spill(big).unwrap());
    m.synchronize().unwrap();
    let s = m.stats();
    assert_eq!((s.spills_warm, s.spills_cold), (5, 0), "{s:?}");
    assert_eq!(s.pageable_copied_bytes, 0);
    m.check_invariants().unwrap();
    // Another tensor written where `big` was, so that its bytes can only come back
    // from the two host ranges.
    let _over = put(&mut m, 10, 128 * KIB);
    m.end_step();
    assert_eq!(read(&mut m, big).unwrap(), pattern(9, 128 * KIB));
    assert_eq!(read(&mut m, hs[1]).unwrap(), pattern(1, 64 * KIB));
    assert_eq!(read(&mut m, hs[3]).unwrap(), pattern(3, 64 * KIB));
    m.check_invariants().unwrap();
}

/// A copy in two parts whose second part fails, out and back in: the tensor stays
/// where it was; the first part, queued, keeps its buffers (the pool's ranges out, the
/// device block in) until it lands, and they are released then.
#[test]
fn a_split_copy_whose_second_part_fails_leaves_the_tensor_in_place() {
    let (mut m, switch, _, big) = scattered_pool();
    let free = m.staging.free_bytes();
    switch.fail_copies_after(1, 1);
    assert!(!m.spill(big).unwrap(), "the second part failed");
    assert!(matches!(m.place(big).unwrap(), Place::Device { .. }));
    assert_eq!(m.stats().transfer_failures, 1);
    m.check_invariants().unwrap();
    m.synchronize().unwrap();
    assert_eq!(
        m.staging.free_bytes(),
        free,
        "both ranges given back once it landed"
    );
    m.check_invariants().unwrap();
    assert!(m.spill(big).unwrap());
    m.synchronize().unwrap();
    m.check_invariants().unwrap();
    let _over = put(&mut m, 10, 128 * KIB);
    m.end_step();
    let device = m.alloc.stats().allocated.current;
    switch.fail_copies_after(1, 1);
    let e = m.access(big, false).unwrap_err();
    assert!(matches!(e, TierError::Transfer { .. }), "{e}");
    assert!(matches!(m.place(big).unwrap(), Place::Host { .. }));
    m.check_invariants().unwrap();
    m.synchronize().unwrap();
    assert_eq!(m.alloc.stats().allocated.current, device, "the block freed");
    m.check_invariants().unwrap();
    m.end_step();
    assert_eq!(read(&mut m, big).unwrap(), pattern(9, 128 * KIB));
    m.check_invariants().unwrap();
}

/// The buffers of a copy whose first part is queued go to no one else before it lands,
/// with its stream held (a query never runs it): a failed copy out keeps the pool's
/// ranges, a failed copy in keeps its device block, which the next tensor does not get
/// (the test backend panics on a write to memory a queued copy still writes).
#[test]
fn a_split_copy_whose_second_part_fails_keeps_its_buffers_until_it_lands() {
    let (mut m, switch, _, big) = scattered_pool();
    let out_stream = m.pipe.streams().0;
    m.alloc.backend_mut().inner.hold_on_query = Some(out_stream);
    let free = m.staging.free_bytes();
    switch.fail_copies_after(1, 1);
    assert!(!m.spill(big).unwrap());
    m.poll().unwrap();
    assert_eq!(m.staging.free_bytes(), free - 128 * KIB, "both ranges held");
    m.check_invariants().unwrap();
    m.synchronize().unwrap();
    assert_eq!(m.staging.free_bytes(), free, "given back once it landed");
    m.alloc.backend_mut().inner.hold_on_query = None;
    assert!(m.spill(big).unwrap());
    m.synchronize().unwrap();
    let _over = put(&mut m, 10, 128 * KIB);
    m.end_step();
    let in_stream = m.pipe.streams().1;
    m.alloc.backend_mut().inner.hold_on_query = Some(in_stream);
    let device = m.alloc.stats().allocated.current;
    switch.fail_copies_after(1, 1);
    assert!(m.access(big, false).is_err());
    m.poll().unwrap();
    assert_eq!(
        m.alloc.stats().allocated.current,
        device + 128 * KIB,
        "the block its first part writes is held"
    );
    m.check_invariants().unwrap();
    next_tensor_and_big_keep_their_bytes(&mut m, big);
}

/// Where the event after a queued first part cannot be recorded and the stream cannot
/// be synchronized, nothing says when the copy lands (the transfer is stuck): its
/// buffers are held, not released to the pool or the allocator, and the manager goes
/// on consistent. Out: the pool's ranges and, once the tensor is freed, its device
/// block; in: the device block. (When they are released: `stuck_tests`.)
#[test]
fn a_queued_copy_that_cannot_be_tracked_or_waited_for_holds_its_buffers() {
    let (mut m, switch, _, big) = scattered_pool();
    let free = m.staging.free_bytes();
    let allocated = m.alloc.stats().allocated.current;
    switch.fail_copies_after(1, 1);
    switch.fail_next_records(1);
    switch.fail_next_stream_syncs(1);
    assert!(!m.spill(big).unwrap());
    assert_eq!(m.pipe.stuck(), 1);
    switch.fail_next_stream_syncs(1);
    m.synchronize().unwrap();
    assert_eq!(
        m.staging.free_bytes(),
        free - 128 * KIB,
        "the copy's two ranges held while the stream fails"
    );
    m.check_invariants().unwrap();
    assert!(
        !m.spill(big).unwrap(),
        "a tensor read by a stuck copy is not spilled"
    );
    assert_eq!(read(&mut m, big).unwrap(), pattern(9, 128 * KIB));
    m.free(big).unwrap();
    assert_eq!(
        m.alloc.stats().allocated.current,
        allocated,
        "its device block goes to the stuck copy, which reads it"
    );
    m.check_invariants().unwrap();

    // In: a tensor in two ranges of the pool (the holes of a new scattered pool).
    let (mut m, switch, _, big) = scattered_pool();
    assert!(m.spill(big).unwrap());
    m.synchronize().unwrap();
    let _over = put(&mut m, 10, 128 * KIB);
    m.end_step();
    let device = m.alloc.stats().allocated.current;
    switch.fail_copies_after(1, 1);
    switch.fail_next_records(1);
    switch.fail_next_stream_syncs(1);
    let e = m.access(big, false).unwrap_err();
    assert!(matches!(e, TierError::Transfer { .. }), "{e}");
    switch.fail_next_stream_syncs(1);
    m.synchronize().unwrap();
    assert_eq!(m.alloc.stats().allocated.current, device + 128 * KIB);
    m.check_invariants().unwrap();
    next_tensor_and_big_keep_their_bytes(&mut m, big);
}
