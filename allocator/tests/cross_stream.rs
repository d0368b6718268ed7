//! Cross-stream frees wait for their events: memory an allocation shared with another
//! stream (`record_stream`) is not handed out again before the event recorded at its
//! free completes.
//!
//! The `sim` and `host` backends complete events at once (no work runs on their
//! streams), so the tests run over [`Held`], a layer over `sim` whose events stay
//! pending until the test releases them (or the host waits for one, as
//! `cudaEventSynchronize` would).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use memcast_alloc::backend::sim::SimBackend;
use memcast_alloc::backend::{
    forward_backend, BackendError, DeviceBackend, EventId, StreamId, StreamPriority,
};
use memcast_alloc::config::AllocConfig;
use memcast_alloc::{Allocation, Allocator};

const MIB: u64 = 1 << 20;

#[derive(Debug, Default)]
struct HoldState {
    /// Events recorded from now on stay pending.
    holding: bool,
    pending: HashSet<u32>,
    /// Pending events the host waited for (`synchronize_event`).
    waited: u32,
}

struct Held {
    inner: SimBackend,
    state: Arc<Mutex<HoldState>>,
}

impl Held {
    fn new(inner: SimBackend) -> (Self, Arc<Mutex<HoldState>>) {
        let state = Arc::new(Mutex::new(HoldState::default()));
        (
            Held {
                inner,
                state: state.clone(),
            },
            state,
        )
    }
}

impl DeviceBackend for Held {
    fn name(&self) -> &'static str {
        "held"
    }
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }
    fn used(&self) -> u64 {
        self.inner.used()
    }
    fn granularity(&self) -> u64 {
        self.inner.granularity()
    }
    forward_backend!(self => mut: (HeldView(self)); ref: (self.inner));
}

struct HeldView<'a>(&'a mut Held);

impl HeldView<'_> {
    fn record_event(&mut self, event: EventId, stream: StreamId) -> Result<(), BackendError> {
        self.0.inner.record_event(event, stream)?;
        let mut s = self.0.state.lock().unwrap();
        if s.holding {
            s.pending.insert(event.0);
        }
        Ok(())
    }
    fn query_event(&mut self, event: EventId) -> Result<bool, BackendError> {
        let done = self.0.inner.query_event(event)?;
        Ok(done && !self.0.state.lock().unwrap().pending.contains(&event.0))
    }
    fn synchronize_event(&mut self, event: EventId) -> Result<(), BackendError> {
        self.0.inner.synchronize_event(event)?;
        let mut s = self.0.state.lock().unwrap();
        if s.pending.remove(&event.0) {
            s.waited += 1;
        }
        Ok(())
    }
    fn destroy_event(&mut self, event: EventId) -> Result<(), BackendError> {
        let pending = self.0.state.lock().unwrap().pending.contains(&event.0);
        assert!(!pending, "event {} destroyed while pending", event.0);
        self.0.inner.destroy_event(event)
    }
}

impl std::ops::Deref for HeldView<'_> {
    type Target = SimBackend;
    fn deref(&self) -> &SimBackend {
        &self.0.inner
    }
}
impl std::ops::DerefMut for HeldView<'_> {
    fn deref_mut(&mut self) -> &mut SimBackend {
        &mut self.0.inner
    }
}

fn overlaps(a: &Allocation, b: &Allocation) -> bool {
    a.ptr.0 < b.ptr.0 + b.size && b.ptr.0 < a.ptr.0 + a.size
}

fn held() -> (Allocator<Held>, Arc<Mutex<HoldState>>, StreamId) {
    let (b, state) = Held::new(SimBackend::new(1 << 30, Default::default()));
    let mut a = Allocator::new(b, AllocConfig::default()).unwrap();
    let s1 = a.create_stream(StreamPriority::Normal).unwrap();
    (a, state, s1)
}

/// A large block and a small one, each used on a second stream and freed while that
/// stream's event is pending: while memory is at hand (a warm-up left some free), no
/// allocation overlaps them and none waits; once the event completes, the same size on
/// the same stream gets the memory back.
#[test]
fn memory_freed_while_its_event_is_pending_is_not_reused() {
    for bytes in [4 * MIB, 1000] {
        let (mut a, state, s1) = held();
        let warm: Vec<Allocation> = (0..12).map(|_| a.allocate(bytes, 0).unwrap()).collect();
        let x = a.allocate(bytes, 0).unwrap();
        for w in warm {
            a.deallocate(w, 0).unwrap();
        }
        a.record_stream(&x, s1).unwrap();
        state.lock().unwrap().holding = true;
        a.deallocate(x, 0).unwrap();
        assert_eq!(a.stats().deferred_frees, 1);
        assert_eq!(state.lock().unwrap().pending.len(), 1);
        a.check_invariants().unwrap();
        // While pending: the same size again and again (without the deferral, the
        // first of them would be `x`'s memory: the most recently freed run or slot).
        let mut got = Vec::new();
        for k in 0..24 {
            let y = a.allocate(bytes, 0).unwrap();
            let st = state.lock().unwrap();
            assert!(
                !overlaps(&y, &x) || st.pending.is_empty(),
                "{bytes} B: allocation {k} at {} reuses the memory of {} before its event completed",
                y.ptr,
                x.ptr
            );
            assert_eq!(
                st.waited, 0,
                "{bytes} B: allocation {k} waited with memory at hand"
            );
            drop(st);
            got.push(y);
            if k % 2 == 1 {
                a.deallocate(got.swap_remove(0), 0).unwrap();
            }
            a.check_invariants().unwrap();
        }
        assert_eq!(
            state.lock().unwrap().pending.len(),
            1,
            "the event was forgotten"
        );
        for y in got.drain(..) {
            a.deallocate(y, 0).unwrap();
        }
        // The event completes: `x`'s memory is free again. Allocations of the same size
        // on stream 0 reach it before the allocator needs any new device memory (where
        // placement puts the first of them is its own choice).
        {
            let mut st = state.lock().unwrap();
            st.pending.clear();
            st.holding = false;
        }
        let reserved = a.stats().reserved.current;
        let mut again = Vec::new();
        let reused = loop {
            let z = a.allocate(bytes, 0).unwrap();
            let hit = overlaps(&z, &x);
            again.push(z);
            if hit || a.stats().reserved.current > reserved {
                break hit;
            }
        };
        assert!(
            reused && a.stats().reserved.current == reserved,
            "{bytes} B: freed memory not reused once its event completed ({} allocations)",
            again.len()
        );
        for z in again {
            a.deallocate(z, 0).unwrap();
        }
        a.empty_cache().unwrap();
        a.check_invariants().unwrap();
        assert_eq!(a.stats().reserved.current, 0);
    }
}

/// With nothing else to give, the allocator waits for the event (the host blocks, as on
/// a GPU) instead of reusing the memory early; `coalesce` waits too.
#[test]
fn a_request_that_needs_the_pending_memory_waits_for_its_event() {
    // A device with room for one 600 MiB block only.
    let (b, state) = Held::new(SimBackend::new(1 << 30, Default::default()));
    let mut a = Allocator::new(b, AllocConfig::default()).unwrap();
    let s1 = a.create_stream(StreamPriority::Normal).unwrap();
    let x = a.allocate(600 * MIB, 0).unwrap();
    a.record_stream(&x, s1).unwrap();
    state.lock().unwrap().holding = true;
    a.deallocate(x, 0).unwrap();
    let y = a.allocate(600 * MIB, 0).unwrap();
    let st = state.lock().unwrap();
    assert!(
        st.pending.is_empty(),
        "memory handed out while its event was pending"
    );
    assert_eq!(st.waited, 1);
    drop(st);
    assert_eq!(y.ptr, x.ptr);
    a.deallocate(y, 0).unwrap();
    // coalesce waits for pending frees.
    let x = a.allocate(8 * MIB, 0).unwrap();
    a.record_stream(&x, s1).unwrap();
    a.deallocate(x, 0).unwrap();
    assert_eq!(state.lock().unwrap().pending.len(), 1);
    a.coalesce().unwrap();
    assert_eq!(state.lock().unwrap().waited, 2);
    a.check_invariants().unwrap();
}
