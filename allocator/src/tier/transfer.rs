//! The asynchronous transfer pipeline.
//!
//! Two streams of low priority (CUDA: a larger priority number), one per direction,
//! so that spills (device to host) and prefetches (host to device) overlap each other
//! and compute; each copy is followed by an event. A transfer's buffers stay reserved
//! until its event completes (dependency tracking): the manager never frees or reuses
//! the source or the destination of a copy in flight. If the tensor is freed, or a
//! spill is cancelled by an access, the transfer becomes an orphan that only releases
//! its buffers when it completes.
//!
//! Streams are FIFO, so per direction transfers complete in issue order: [`Pipeline::poll`]
//! only queries the oldest transfer of each direction until one is not done, O(1)
//! amortized per transfer.

use std::collections::VecDeque;

use crate::backend::{BackendError, DeviceBackend, EventId, MemRef, StreamId, StreamPriority};
use crate::pool::Allocation;

use super::handle::TensorHandle;
use super::staging::HostLoc;

/// Names one transfer (unique over the manager's life).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransferId(pub u64);

/// Which way the bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Device to host (spill).
    Out,
    /// Host to device (prefetch or fault).
    In,
}

/// What the manager does when a transfer completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Normal end: the tensor moves to the destination tier.
    Finish,
    /// Nobody needs the result (tensor freed, spill cancelled): release these.
    Release {
        device: Option<Allocation>,
        host: Option<HostLoc>,
    },
}

/// A completed transfer, handed back to the manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    pub id: TransferId,
    pub handle: TensorHandle,
    pub dir: Direction,
    pub bytes: u64,
    pub completion: Completion,
}

/// A transfer [`Pipeline::issue`] could not queue whole.
#[derive(Debug)]
pub struct IssueError {
    /// What failed (the first failure).
    pub source: BackendError,
    /// `Some(id)`: copies of it were queued and the device may still use its buffers:
    /// hand them to orphan `id` rather than releasing them. `None`: release them.
    pub orphan: Option<TransferId>,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    done: Done,
    event: EventId,
}

/// The pipeline. See the module docs.
#[derive(Debug)]
pub struct Pipeline {
    out_stream: StreamId,
    in_stream: StreamId,
    // Invariant: each queue is in issue order (ids increasing).
    out: VecDeque<InFlight>,
    inn: VecDeque<InFlight>,
    /// Orphans whose copies were queued with no event after them and whose stream
    /// could not be synchronized: they complete when a later transfer of their
    /// direction does, or when their stream synchronizes (`settle_stuck`).
    // Invariant: every completion here is `Completion::Release`.
    stuck: Vec<Done>,
    /// Stuck transfers found landed by a synchronization inside `issue`: handed back by
    /// the next `poll`, `wait` or `wait_all`.
    landed: Vec<Done>,
    next: u64,
    /// Bytes in flight per direction.
    pub out_bytes: u64,
    pub in_bytes: u64,
}

impl Pipeline {
    /// Creates the two low-priority streams.
    pub fn new<B: DeviceBackend + ?Sized>(backend: &mut B) -> Result<Self, BackendError> {
        let out_stream = backend.create_stream(StreamPriority::Low)?;
        let in_stream = backend.create_stream(StreamPriority::Low)?;
        Ok(Pipeline {
            out_stream,
            in_stream,
            out: VecDeque::new(),
            inn: VecDeque::new(),
            stuck: Vec::new(),
            landed: Vec::new(),
            next: 0,
            out_bytes: 0,
            in_bytes: 0,
        })
    }

    pub fn streams(&self) -> (StreamId, StreamId) {
        (self.out_stream, self.in_stream)
    }

    pub fn in_flight(&self) -> usize {
        self.out.len() + self.inn.len()
    }

    /// Queues the copies `parts` (`(dst, src, bytes)`, one transfer: a tensor whose
    /// host copy is in two ranges) for tensor `handle`, one event after the last.
    ///
    /// On error, [`IssueError::orphan`] says what became of the copies already queued
    /// (a first part queued before the second failed, or all of them before the event
    /// could not be recorded): `None` when nothing was queued or it was waited for,
    /// so the caller may release the buffers; `Some(id)` when the device may still
    /// read or write them: the transfer is then an orphan that the caller hands its
    /// buffers to ([`Pipeline::orphan`], [`Pipeline::adopt_device`]) instead of
    /// releasing them. Such an orphan completes with the event recorded after the
    /// queued parts. Where no event could be recorded and the stream could not be
    /// synchronized either, it is *stuck*: nothing says when its copies land but a
    /// later transfer on the same stream (streams run in order), so it completes when
    /// such a transfer does, or when [`Pipeline::settle_stuck`] synchronizes the
    /// stream; until then its buffers go to no one else.
    pub fn issue<B: DeviceBackend + ?Sized>(
        &mut self,
        backend: &mut B,
        dir: Direction,
        handle: TensorHandle,
        parts: &[(MemRef, MemRef, u64)],
    ) -> Result<TransferId, IssueError> {
        let stream = match dir {
            Direction::Out => self.out_stream,
            Direction::In => self.in_stream,
        };
        let nothing_queued = |source| IssueError {
            source,
            orphan: None,
        };
        let event = backend.create_event().map_err(nothing_queued)?;
        let mut queued = 0u64;
        let mut failure = None;
        for &(dst, src, n) in parts {
            if let Err(e) = backend.copy(dst, src, n, Some(stream)) {
                failure = Some(e);
                break;
            }
            queued += n;
        }
        let completion = match failure {
            None => Completion::Finish,
            Some(_) => Completion::Release {
                device: None,
                host: None,
            },
        };
        if queued == 0 {
            if let Some(e) = failure {
                let _ = backend.destroy_event(event);
                return Err(nothing_queued(e));
            }
        }
        let id = TransferId(self.next);
        self.next += 1;
        let done = Done {
            id,
            handle,
            dir,
            bytes: queued,
            completion,
        };
        if let Err(e) = backend.record_event(event, stream) {
            // The copies are queued but cannot be tracked: wait for them here so that
            // their buffers are safe to release.
            let _ = backend.destroy_event(event);
            let source = failure.unwrap_or(e);
            return match backend.synchronize_stream(stream) {
                Ok(()) => {
                    // Everything queued on the stream ran, stuck copies included.
                    land(&mut self.stuck, dir, TransferId(u64::MAX), &mut self.landed);
                    Err(nothing_queued(source))
                }
                Err(sync) => {
                    tracing::error!(
                        "transfer {id:?}: {source}; the stream could not be synchronized \
                         ({sync}): its {queued} bytes of buffers are held until a later \
                         copy on that stream completes"
                    );
                    self.stuck.push(Done {
                        completion: Completion::Release {
                            device: None,
                            host: None,
                        },
                        ..done
                    });
                    Err(IssueError {
                        source,
                        orphan: Some(id),
                    })
                }
            };
        }
        let f = InFlight { done, event };
        match dir {
            Direction::Out => {
                self.out.push_back(f);
                self.out_bytes += queued;
            }
            Direction::In => {
                self.inn.push_back(f);
                self.in_bytes += queued;
            }
        }
        match failure {
            None => Ok(id),
            Some(source) => Err(IssueError {
                source,
                orphan: Some(id),
            }),
        }
    }

    /// Transfers whose completion could not be observed (see [`Pipeline::issue`]) and
    /// that no later transfer on their stream has completed after yet.
    pub fn stuck(&self) -> usize {
        self.stuck.len()
    }

    /// Whether `id` is stuck (waiting for it is an error; it completes with a later
    /// transfer of its direction).
    pub fn is_stuck(&self, id: TransferId) -> bool {
        self.stuck.iter().any(|d| d.id == id)
    }

    /// Every transfer that names tensor `from` (in flight or stuck) names `to`.
    pub fn rehandle(&mut self, from: TensorHandle, to: TensorHandle) {
        for d in self.dones_mut().filter(|d| d.handle == from) {
            d.handle = to;
        }
    }

    /// Every transfer in flight and every stuck one.
    fn dones_mut(&mut self) -> impl Iterator<Item = &mut Done> {
        self.out
            .iter_mut()
            .chain(self.inn.iter_mut())
            .map(|f| &mut f.done)
            .chain(self.stuck.iter_mut())
    }

    /// Gives the host copy `host` of tensor `handle`, the source of a failed copy in
    /// whose queued part may still read it, to the last such orphan (it completes
    /// after the others: one stream, in order). False if there is none.
    pub fn adopt_host(&mut self, handle: TensorHandle, host: HostLoc) -> bool {
        let last = self
            .dones_mut()
            .filter(|d| {
                d.dir == Direction::In
                    && d.handle == handle
                    && matches!(d.completion, Completion::Release { host: None, .. })
            })
            .max_by_key(|d| d.id);
        match last {
            Some(Done {
                completion: Completion::Release { host: h, .. },
                ..
            }) => {
                *h = Some(host);
                true
            }
            _ => false,
        }
    }

    /// Stuck transfers of `dir` issued before `id`, which has completed: their copies
    /// ran before its (one stream, in order). Moved to `done`.
    fn landed_before(&mut self, dir: Direction, id: TransferId, done: &mut Vec<Done>) {
        land(&mut self.stuck, dir, id, done);
    }

    /// Synchronizes the streams of the stuck transfers; those of a stream that
    /// synchronizes are moved to `done`. The first failure is returned (its
    /// transfers stay stuck).
    pub fn settle_stuck<B: DeviceBackend + ?Sized>(
        &mut self,
        backend: &mut B,
        done: &mut Vec<Done>,
    ) -> Result<(), BackendError> {
        let mut first = Ok(());
        for (dir, stream) in [
            (Direction::Out, self.out_stream),
            (Direction::In, self.in_stream),
        ] {
            if !self.stuck.iter().any(|d| d.dir == dir) {
                continue;
            }
            match backend.synchronize_stream(stream) {
                Ok(()) => self.landed_before(dir, TransferId(u64::MAX), done),
                Err(e) => {
                    if first.is_ok() {
                        first = Err(e);
                    }
                }
            }
        }
        first
    }

    /// Makes transfer `id` an orphan that releases `completion`'s buffers when done.
    /// Returns false if no such transfer is in flight.
    pub fn orphan(&mut self, id: TransferId, completion: Completion) -> bool {
        match self.find_mut(id) {
            Some(d) => {
                d.completion = completion;
                true
            }
            None => false,
        }
    }

    fn find_mut(&mut self, id: TransferId) -> Option<&mut Done> {
        self.dones_mut().find(|d| d.id == id)
    }

    /// Gives the device block `device` to orphan `id` (released when it completes).
    /// Returns false if `id` is not an orphan in flight.
    pub fn adopt_device(&mut self, id: TransferId, device: Allocation) -> bool {
        if let Some(Done {
            completion: Completion::Release {
                device: d @ None, ..
            },
            ..
        }) = self.find_mut(id)
        {
            *d = Some(device);
            return true;
        }
        false
    }

    fn pop(&mut self, dir: Direction) -> Option<InFlight> {
        let f = match dir {
            Direction::Out => self.out.pop_front(),
            Direction::In => self.inn.pop_front(),
        }?;
        match dir {
            Direction::Out => self.out_bytes -= f.done.bytes,
            Direction::In => self.in_bytes -= f.done.bytes,
        }
        Some(f)
    }

    /// Completed transfers (non-blocking), oldest first per direction.
    pub fn poll<B: DeviceBackend + ?Sized>(
        &mut self,
        backend: &mut B,
        done: &mut Vec<Done>,
    ) -> Result<(), BackendError> {
        done.append(&mut self.landed);
        for dir in [Direction::Out, Direction::In] {
            loop {
                let front = match dir {
                    Direction::Out => self.out.front(),
                    Direction::In => self.inn.front(),
                };
                let Some(f) = front.copied() else { break };
                if !backend.query_event(f.event)? {
                    break;
                }
                self.pop(dir);
                let _ = backend.destroy_event(f.event);
                self.landed_before(dir, f.done.id, done);
                done.push(f.done);
            }
        }
        Ok(())
    }

    /// Blocks until transfer `id` and every earlier one of its direction completed
    /// (stream order); returns them all, oldest first. A transfer not in flight (already
    /// done) returns nothing; a stuck one is an error (no event says when it lands).
    pub fn wait<B: DeviceBackend + ?Sized>(
        &mut self,
        backend: &mut B,
        id: TransferId,
        done: &mut Vec<Done>,
    ) -> Result<(), BackendError> {
        done.append(&mut self.landed);
        let dir = if self.out.iter().any(|f| f.done.id == id) {
            Direction::Out
        } else if self.inn.iter().any(|f| f.done.id == id) {
            Direction::In
        } else if self.stuck.iter().any(|d| d.id == id) {
            return Err(BackendError::Invalid(format!(
                "transfer {id:?} cannot be waited for: its stream failed to synchronize"
            )));
        } else {
            return Ok(());
        };
        let event = match dir {
            Direction::Out => self.out.iter(),
            Direction::In => self.inn.iter(),
        }
        .find(|f| f.done.id == id)
        .map(|f| f.event)
        .expect("found above");
        backend.synchronize_event(event)?;
        while let Some(f) = self.pop(dir) {
            let _ = backend.destroy_event(f.event);
            self.landed_before(dir, f.done.id, done);
            done.push(f.done);
            if f.done.id == id {
                break;
            }
        }
        Ok(())
    }

    /// Every transfer in flight, spills first, each direction in issue order, then the
    /// stuck ones.
    pub fn iter(&self) -> impl Iterator<Item = &Done> {
        self.out
            .iter()
            .chain(self.inn.iter())
            .map(|f| &f.done)
            .chain(self.stuck.iter())
            .chain(self.landed.iter())
    }

    /// The oldest spill in flight, if any (what an out-of-memory path waits for first).
    pub fn oldest_out(&self) -> Option<TransferId> {
        self.out.front().map(|f| f.done.id)
    }

    /// Blocks until everything in flight completed.
    pub fn wait_all<B: DeviceBackend + ?Sized>(
        &mut self,
        backend: &mut B,
        done: &mut Vec<Done>,
    ) -> Result<(), BackendError> {
        done.append(&mut self.landed);
        for dir in [Direction::Out, Direction::In] {
            let last = match dir {
                Direction::Out => self.out.back(),
                Direction::In => self.inn.back(),
            };
            if let Some(f) = last.copied() {
                self.wait(backend, f.done.id, done)?;
            }
        }
        Ok(())
    }

    pub fn check_invariants(&self) -> Result<(), String> {
        for q in [&self.out, &self.inn] {
            if q.iter()
                .zip(q.iter().skip(1))
                .any(|(a, b)| a.done.id >= b.done.id)
            {
                return Err("transfer queue out of issue order".into());
            }
        }
        let ob: u64 = self.out.iter().map(|f| f.done.bytes).sum();
        let ib: u64 = self.inn.iter().map(|f| f.done.bytes).sum();
        if ob != self.out_bytes || ib != self.in_bytes {
            return Err(format!(
                "bytes in flight: out {ob} vs {}, in {ib} vs {}",
                self.out_bytes, self.in_bytes
            ));
        }
        if self
            .stuck
            .iter()
            .any(|d| d.completion == Completion::Finish)
        {
            return Err("a stuck transfer is not an orphan".into());
        }
        Ok(())
    }
}

/// Moves the transfers of `stuck` of direction `dir` issued before `id` to `done`.
/// O(stuck), nothing when none is stuck (the common case).
fn land(stuck: &mut Vec<Done>, dir: Direction, id: TransferId, done: &mut Vec<Done>) {
    if stuck.is_empty() {
        return;
    }
    let (landed, keep): (Vec<Done>, Vec<Done>) = std::mem::take(stuck)
        .into_iter()
        .partition(|d| d.dir == dir && d.id < id);
    *stuck = keep;
    done.extend(landed);
}
