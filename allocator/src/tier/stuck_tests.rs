//! Stuck transfers (`Pipeline::stuck`): copies queued with no event after them, on a
//! stream that could not be synchronized. Their buffers are released once a later
//! transfer on the same stream completes (streams run in order) or the stream
//! synchronizes at shutdown, and not before; a tensor read by one can still be freed.
//! On [`Deferred`](super::deferred::Deferred), which panics on memory freed or written
//! under a queued copy.

use crate::backend::layers::FailSwitch;

use super::handle::Place;
use super::manager::TierManager;
use super::tests::{
    manager, manager_with_pool, pattern, put, read, recomputable, Produced, TestBackend,
    TestProducer,
};
use super::{TensorHandle, TierError};

const KIB: u64 = 1 << 10;

/// The next copy fails to record its event and its stream fails to synchronize.
fn untrackable(switch: &FailSwitch) {
    switch.fail_next_records(1);
    switch.fail_next_stream_syncs(1);
}

/// A manager with a 256 KiB pool and two 64 KiB tensors `a` and `b` on the device, the
/// pool's free bytes, and the next copy set to get stuck (`untrackable`).
fn two_tensors_next_copy_untrackable() -> (
    TierManager<TestBackend>,
    FailSwitch,
    TensorHandle,
    TensorHandle,
    u64,
) {
    let (mut m, switch) = manager_with_pool(1, 256 * KIB);
    let a = put(&mut m, 1, 64 * KIB);
    let b = put(&mut m, 2, 64 * KIB);
    m.end_step();
    let free = m.staging.free_bytes();
    untrackable(&switch);
    (m, switch, a, b, free)
}

/// A stuck spill holds its pool range until a later spill on the same stream lands,
/// then gives it back; a stuck one left at shutdown is settled there when the stream
/// synchronizes, and is an error when it does not (the manager is then leaked, its
/// memory with it).
#[test]
fn a_stuck_copy_is_released_when_a_later_copy_on_its_stream_lands() {
    let (mut m, switch, a, b, free) = two_tensors_next_copy_untrackable();
    assert!(!m.spill(a).unwrap(), "its event could not be recorded");
    assert_eq!(m.pipe.stuck(), 1);
    switch.fail_next_stream_syncs(1);
    m.synchronize().unwrap();
    assert_eq!(m.staging.free_bytes(), free - 64 * KIB, "held while stuck");
    m.check_invariants().unwrap();
    assert!(m.spill(b).unwrap());
    m.synchronize().unwrap();
    assert_eq!(m.pipe.stuck(), 0, "landed before the later spill");
    assert_eq!(
        m.staging.free_bytes(),
        free - 64 * KIB,
        "a's range back, b's taken"
    );
    m.check_invariants().unwrap();
    assert!(
        m.spill(a).unwrap(),
        "a tensor no stuck copy reads spills again"
    );
    m.synchronize().unwrap();
    assert_eq!(read(&mut m, a).unwrap(), pattern(1, 64 * KIB));
    assert_eq!(read(&mut m, b).unwrap(), pattern(2, 64 * KIB));
    m.check_invariants().unwrap();

    // At shutdown: settled when the stream synchronizes.
    m.end_step();
    untrackable(&switch);
    assert!(!m.spill(a).unwrap());
    assert_eq!(m.pipe.stuck(), 1);
    m.shutdown().unwrap();

    // And an error, nothing given back, when it does not.
    let (mut m, switch) = manager_with_pool(1, 256 * KIB);
    let a = put(&mut m, 1, 64 * KIB);
    m.end_step();
    untrackable(&switch);
    assert!(!m.spill(a).unwrap());
    // Every synchronization of the stream fails from here on; the backend must not be
    // dropped (it frees its memory) while the stuck copy is queued.
    switch.fail_next_stream_syncs(u64::MAX);
    m.alloc.backend_mut().inner.refuse_drop_while_queued = true;
    let e = m.shutdown().unwrap_err();
    assert!(matches!(e, TierError::Stuck { transfers: 1, .. }), "{e}");
}

/// A stream that synchronizes later lands its stuck copies: inside the next failed
/// issue (its event not recorded, the stream synchronized), or in `synchronize`.
#[test]
fn a_stuck_copy_lands_when_its_stream_synchronizes() {
    let (mut m, switch, a, b, free) = two_tensors_next_copy_untrackable();
    assert!(!m.spill(a).unwrap());
    switch.fail_next_records(1);
    assert!(
        !m.spill(b).unwrap(),
        "its event not recorded, the stream synchronized"
    );
    assert_eq!(m.pipe.stuck(), 0);
    m.poll().unwrap();
    assert_eq!(m.staging.free_bytes(), free, "a's range back");
    m.check_invariants().unwrap();
    untrackable(&switch);
    assert!(!m.spill(a).unwrap());
    assert_eq!(m.pipe.stuck(), 1);
    m.synchronize().unwrap();
    assert_eq!(m.pipe.stuck(), 0);
    assert_eq!(m.staging.free_bytes(), free);
    m.check_invariants().unwrap();
    assert!(m.spill(a).unwrap() && m.spill(b).unwrap());
    m.synchronize().unwrap();
    assert_eq!(read(&mut m, a).unwrap(), pattern(1, 64 * KIB));
    assert_eq!(read(&mut m, b).unwrap(), pattern(2, 64 * KIB));
}

/// A tensor on the host whose copy in got stuck, freed: its host buffer (here pageable
/// memory, which the test backend refuses to free under a queued copy) goes to the
/// stuck copy, and is freed once a later copy in lands.
#[test]
fn the_host_copy_a_stuck_copy_in_reads_is_freed_after_it_lands() {
    // A 64 KiB pool: the 256 KiB tensor goes to pageable memory.
    let (mut m, switch) = manager(1);
    let big = put(&mut m, 1, 256 * KIB);
    let other = put(&mut m, 2, 64 * KIB);
    m.end_step();
    assert!(m.spill(big).unwrap());
    assert!(m.spill(other).unwrap());
    m.synchronize().unwrap();
    m.end_step();
    assert!(matches!(m.place(big).unwrap(), Place::Host { .. }));
    let buffers = m.alloc.backend_mut().inner.host_buffers;
    untrackable(&switch);
    let e = m.access(big, false).unwrap_err();
    assert!(matches!(e, TierError::Transfer { .. }), "{e}");
    assert_eq!(m.pipe.stuck(), 1);
    m.free(big).unwrap();
    assert_eq!(
        m.alloc.backend_mut().inner.host_buffers,
        buffers,
        "the pageable buffer is still read"
    );
    m.check_invariants().unwrap();
    m.end_step();
    assert_eq!(read(&mut m, other).unwrap(), pattern(2, 64 * KIB));
    assert_eq!(m.pipe.stuck(), 0);
    assert_eq!(m.alloc.backend_mut().inner.host_buffers, buffers - 1);
    m.check_invariants().unwrap();
}

/// A tensor whose spill got stuck, freed while a dropped tensor needs it for its
/// recompute: the free succeeds (it used to wait for the stuck copy, an error every
/// time), the input is kept under a new handle that the stuck copy now names, and the
/// dropped tensor is recomputed from it.
#[test]
fn an_input_read_by_a_stuck_copy_is_kept_for_its_dropped_dependent() {
    let (mut m, switch) = manager(1);
    let produced = std::sync::Arc::new(std::sync::Mutex::new(Produced::default()));
    m.set_producer(Box::new(TestProducer(produced.clone())));
    let x = put(&mut m, 1, 64 * KIB);
    let (h, data) = recomputable(&mut m, &produced, &[x], 2, 128 * KIB, 100.0);
    m.end_step();
    assert!(m.drop_tensor(h).unwrap());
    untrackable(&switch);
    assert!(!m.spill(x).unwrap());
    assert_eq!(m.pipe.stuck(), 1);
    m.free(x).unwrap();
    m.check_invariants().unwrap();
    // A later spill lands the stuck one, which clears the kept input's reader.
    let y = put(&mut m, 3, 64 * KIB);
    m.end_step();
    assert!(m.spill(y).unwrap());
    m.synchronize().unwrap();
    assert_eq!(m.pipe.stuck(), 0);
    m.check_invariants().unwrap();
    m.end_step();
    assert_eq!(read(&mut m, h).unwrap(), data);
    assert_eq!(produced.lock().unwrap().runs, 1);
    m.check_invariants().unwrap();
}

/// A request that finds the device full while a stuck copy in holds a block: the
/// out-of-memory path synchronizes the stream, the copy lands, its block is freed and
/// the request is served (it was an out-of-memory error with the block held).
#[test]
fn the_out_of_memory_path_lands_a_stuck_copy_in() {
    let (mut m, switch) = manager(1);
    let big = put(&mut m, 1, 1 << 20);
    m.end_step();
    assert!(m.spill(big).unwrap());
    m.synchronize().unwrap();
    m.end_step();
    untrackable(&switch);
    let e = m.access(big, false).unwrap_err();
    assert!(matches!(e, TierError::Transfer { .. }), "{e}");
    assert_eq!(m.pipe.stuck(), 1);
    m.end_step();
    // 1.5 MiB of a 2 MiB budget: only with the stuck copy's 1 MiB block back.
    let h = put(&mut m, 2, 1536 * KIB);
    assert_eq!(m.pipe.stuck(), 0);
    m.check_invariants().unwrap();
    assert_eq!(read(&mut m, h).unwrap(), pattern(2, 1536 * KIB));
    m.free(h).unwrap();
    m.end_step();
    assert_eq!(read(&mut m, big).unwrap(), pattern(1, 1 << 20));
    m.check_invariants().unwrap();
}
