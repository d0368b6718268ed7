//! A host backend whose asynchronous copies run late, for the tier tests: it queues
//! copies per stream and runs them only when an event recorded after them is
//! synchronized (or, at random, queried; `hold_on_query` makes it
//! deterministic), and it panics if memory is freed, unmapped, read or written while
//! a queued copy still touches it.

use crate::backend::host::HostBackend;
use crate::backend::{
    forward_backend, BackendError, DeviceBackend, DevicePtr, EventId, HostPtr, MemRef, StreamId,
};

#[derive(Debug, Clone, Copy)]
struct Pending {
    dst: MemRef,
    src: MemRef,
    bytes: u64,
}

/// Host backend whose asynchronous copies run late. See the module docs.
pub(crate) struct Deferred {
    inner: HostBackend,
    /// Per stream: queued copies and how many ran since the stream was created.
    queues: Vec<(Vec<Pending>, u64)>,
    /// Per event: (stream, copies queued on it when recorded).
    events: std::collections::HashMap<u32, (u32, u64)>,
    rng: u64,
    /// Host buffers allocated and not yet freed.
    pub(crate) host_buffers: u64,
    /// `None`: a query runs the copies before its event at random. `Some(s)`: a query
    /// never runs stream `s`'s copies (they run only when something synchronizes, so
    /// a copy there stays in flight until it is waited for) and always runs the other
    /// streams' copies.
    pub(crate) hold_on_query: Option<StreamId>,
    /// Panic if dropped while a queued copy has not run (its memory would be freed
    /// under it): set by tests of code that must not let the backend go then.
    pub(crate) refuse_drop_while_queued: bool,
}

impl Drop for Deferred {
    fn drop(&mut self) {
        let queued = self.queues.iter().map(|(q, _)| q.len()).sum::<usize>();
        if self.refuse_drop_while_queued && queued > 0 && !std::thread::panicking() {
            panic!("backend dropped with {queued} queued copies, whose memory it frees");
        }
    }
}

fn addr(m: MemRef) -> u64 {
    match m {
        MemRef::Device(d) => d.0,
        MemRef::Host(h) => h.0,
    }
}

impl Deferred {
    pub(crate) fn new(capacity: u64, seed: u64) -> Self {
        Deferred {
            inner: HostBackend::new(capacity),
            queues: vec![(Vec::new(), 0)],
            events: Default::default(),
            rng: seed | 1,
            host_buffers: 0,
            hold_on_query: None,
            refuse_drop_while_queued: false,
        }
    }
    fn coin(&mut self) -> bool {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng.is_multiple_of(3)
    }
    /// Runs the copies of `stream` until `upto` of them ran.
    fn run(&mut self, stream: u32, upto: u64) -> Result<(), BackendError> {
        let (q, ran) = &mut self.queues[stream as usize];
        let n = (upto.saturating_sub(*ran) as usize).min(q.len());
        let batch: Vec<Pending> = q.drain(..n).collect();
        *ran += n as u64;
        for p in batch {
            self.inner.copy(p.dst, p.src, p.bytes, None)?;
        }
        Ok(())
    }
    fn run_all(&mut self) -> Result<(), BackendError> {
        for s in 0..self.queues.len() {
            let upto = self.queues[s].1 + self.queues[s].0.len() as u64;
            self.run(s as u32, upto)?;
        }
        Ok(())
    }
    /// Panics if a queued copy touches `[a, a+len)` (writes only, unless `any`).
    fn check_idle(&self, what: &str, a: u64, len: u64, any: bool) {
        for (q, _) in &self.queues {
            for p in q {
                let hit = |m: MemRef| addr(m) < a + len.max(1) && a < addr(m) + p.bytes;
                if hit(p.dst) || (any && hit(p.src)) {
                    panic!("{what} of [{a:#x}+{len}) while a queued copy {p:?} touches it");
                }
            }
        }
    }
}

impl DeviceBackend for Deferred {
    fn name(&self) -> &'static str {
        "host-deferred"
    }
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }
    fn used(&self) -> u64 {
        self.inner.used()
    }
    forward_backend!(self => mut: (DeferredView(self)); ref: (self.inner));
}

struct DeferredView<'a>(&'a mut Deferred);

impl DeferredView<'_> {
    fn copy(
        &mut self,
        dst: MemRef,
        src: MemRef,
        bytes: u64,
        stream: Option<StreamId>,
    ) -> Result<(), BackendError> {
        match stream {
            Some(s) if (s as usize) < self.0.queues.len() => {
                self.0.queues[s as usize]
                    .0
                    .push(Pending { dst, src, bytes });
                Ok(())
            }
            Some(s) => Err(BackendError::Invalid(format!("unknown stream {s}"))),
            None => {
                self.0.run_all()?;
                self.0.inner.copy(dst, src, bytes, None)
            }
        }
    }
    fn create_stream(
        &mut self,
        p: crate::backend::StreamPriority,
    ) -> Result<StreamId, BackendError> {
        let s = self.0.inner.create_stream(p)?;
        self.0
            .queues
            .resize_with(s as usize + 1, || (Vec::new(), 0));
        Ok(s)
    }
    fn record_event(&mut self, e: EventId, s: StreamId) -> Result<(), BackendError> {
        self.0.inner.record_event(e, s)?;
        let (q, ran) = &self.0.queues[s as usize];
        self.0.events.insert(e.0, (s, ran + q.len() as u64));
        Ok(())
    }
    fn query_event(&mut self, e: EventId) -> Result<bool, BackendError> {
        self.0.inner.query_event(e)?;
        let Some(&(s, upto)) = self.0.events.get(&e.0) else {
            return Ok(true);
        };
        if self.0.queues[s as usize].1 >= upto {
            return Ok(true);
        }
        let run = match self.0.hold_on_query {
            Some(held) => s != held,
            None => self.0.coin(),
        };
        if run {
            self.0.run(s, upto)?;
            return Ok(true);
        }
        Ok(false)
    }
    fn synchronize_event(&mut self, e: EventId) -> Result<(), BackendError> {
        self.0.inner.synchronize_event(e)?;
        if let Some(&(s, upto)) = self.0.events.get(&e.0) {
            self.0.run(s, upto)?;
        }
        Ok(())
    }
    fn synchronize_stream(&mut self, s: StreamId) -> Result<(), BackendError> {
        let upto = self.0.queues[s as usize].1 + self.0.queues[s as usize].0.len() as u64;
        self.0.run(s, upto)
    }
    fn destroy_event(&mut self, e: EventId) -> Result<(), BackendError> {
        self.0.events.remove(&e.0);
        self.0.inner.destroy_event(e)
    }
    fn deallocate_host(&mut self, p: HostPtr, bytes: u64) -> Result<(), BackendError> {
        self.0.check_idle("host free", p.0, bytes, true);
        self.0.inner.deallocate_host(p, bytes)?;
        self.0.host_buffers -= 1;
        Ok(())
    }
    fn allocate_host(&mut self, bytes: u64, pinned: bool) -> Result<HostPtr, BackendError> {
        let p = self.0.inner.allocate_host(bytes, pinned)?;
        self.0.host_buffers += 1;
        Ok(p)
    }
    fn deallocate(&mut self, p: DevicePtr, bytes: u64, s: StreamId) -> Result<(), BackendError> {
        self.0.check_idle("device free", p.0, bytes, true);
        self.0.inner.deallocate(p, bytes, s)
    }
    fn shrink(&mut self, base: DevicePtr, mapped: u64, release: u64) -> Result<(), BackendError> {
        self.0
            .check_idle("device unmap", base.0 + mapped - release, release, true);
        self.0.inner.shrink(base, mapped, release)
    }
    fn unmap_pages(
        &mut self,
        base: DevicePtr,
        off: u64,
        len: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        // The release waits for `stream` (its queued copies run); a copy queued on
        // another stream that still touches the pages is a bug of the caller.
        self.synchronize_stream(stream)?;
        self.0
            .check_idle("device page release", base.0 + off, len, true);
        self.0.inner.unmap_pages(base, off, len, stream)
    }
    fn release_growable(&mut self, base: DevicePtr, mapped: u64) -> Result<(), BackendError> {
        self.0.check_idle("device unmap", base.0, mapped, true);
        self.0.inner.release_growable(base, mapped)
    }
    fn write(&mut self, dst: MemRef, data: &[u8]) -> Result<(), BackendError> {
        // Overwriting the source of a copy in flight is caught by the checksums (a
        // stale host copy); overwriting its destination is a bug in itself.
        self.0
            .check_idle("write", addr(dst), data.len() as u64, false);
        self.0.inner.write(dst, data)
    }
    fn read(&mut self, src: MemRef, out: &mut [u8]) -> Result<(), BackendError> {
        self.0
            .check_idle("read", addr(src), out.len() as u64, false);
        self.0.inner.read(src, out)
    }
}

impl std::ops::Deref for DeferredView<'_> {
    type Target = HostBackend;
    fn deref(&self) -> &HostBackend {
        &self.0.inner
    }
}
impl std::ops::DerefMut for DeferredView<'_> {
    fn deref_mut(&mut self) -> &mut HostBackend {
        &mut self.0.inner
    }
}
