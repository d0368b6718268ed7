//! `ForecastService`: the online [`Engine`] (featurizer + forecaster) on its own thread
//! inside the allocator process.
//!
//! The allocator [`submit`](ForecastService::submit)s its events in fixed-size chunks
//! ([`EventChunk`], no heap) through a bounded lock-free queue (a push never blocks and
//! never makes a system call: the service thread polls, sleeping while the queue is
//! empty, and paces itself when behind, at most `BURST` chunks per `PACE`, so that it
//! takes a bounded share of a core however fast the allocator goes; a full queue drops
//! the chunk and counts it) and reads the latest
//! [`Forecast`] with [`latest`](ForecastService::latest), a seqlock read over atomics:
//! it never takes a lock and never waits for the service thread. A dropped chunk means
//! the featurizer misses those events: its live bytes are re-aligned at the next chunk
//! (`EventChunk::live`), but its steps are out of phase with the iteration until the
//! next iteration boundary, so the forecasts made in between are published without a
//! basis (`Forecast::reference` false: they drive nothing). What was lost travels with
//! the next chunk queued ([`Lost`]), so the thread applies it where it happened. The
//! allocator never stalls.
//!
//! Costs on the allocating thread, measured in docs/predictive.md: a push (a copy of
//! 88 bytes and a compare-and-swap) per 16 events, attempted only while the queue
//! has room (a full queue drops the chunk before any byte is copied; the allocator
//! then hands over every 256 events until it has room again, [`ForecastService::skip`]),
//! and a version load that stays in its cache while nothing new is published. With a
//! `quantum`, the service publishes a forecast only when its forecast peak of live
//! bytes moved by at least `quantum` bytes since the last publication (or its basis
//! changed). The allocator passes 0 (every forecast): a forecast drives growth only
//! within its horizon, so one left unpublished because it had not moved is a forecast
//! the allocator no longer has when the rise comes; reading each costs the allocating
//! thread a seqlock copy at most once per step the thread forecasts.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;

use memcast_trace::features::CHANNELS;

use crate::config::MAX_HORIZON;
use crate::error::{PredictorError, Result};
use crate::forecaster::{Code, Engine, BOUNDARY};
use crate::infer::Forecast;

const SLOTS: usize = MAX_HORIZON * CHANNELS;

/// Events per chunk: the allocator buffers this many 32-bit event codes (64 bytes) and
/// hands them over at once: about half a step (a step is 16 allocations and, in a
/// steady job, about as many frees). A forecast is worth something only within its
/// horizon of a few steps, so a step must reach the forecaster as it closes. With 256
/// (one queue operation per 256 events) a real job's forecasts arrived after the rises
/// they foresaw.
pub const CHUNK: usize = 16;

/// A chunk of encoded events (see `forecaster`'s codes). `Copy`, fixed size.
#[derive(Debug, Clone, Copy)]
pub struct EventChunk {
    /// Live requested bytes when the chunk's first event happened (the allocator's
    /// count): the engine re-aligns its own to it, so that chunks dropped under load
    /// cost forecast quality, never a drifting live-bytes figure.
    pub live: u64,
    pub len: usize,
    pub events: [Code; CHUNK],
    /// What was lost just before this chunk (set by [`ForecastService::submit`]):
    /// the loss travels with the next chunk the queue takes, so that the service
    /// thread applies it exactly where it happened, not when it first notices it.
    pub lost: Lost,
}

/// Chunks dropped since the last chunk queued: iteration boundaries that ended some
/// of them, and whether events were lost after the last of those boundaries (a gap:
/// the engine's steps are out of phase until the next boundary).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lost {
    pub boundaries: u32,
    pub gap: bool,
}

impl Lost {
    /// Records a dropped chunk's events. A boundary ending them closes whatever was
    /// lost before it (the next iteration starts in phase); events lost without one
    /// open a gap. O(1).
    pub fn add(&mut self, events: &[Code]) {
        if events.last() == Some(&BOUNDARY) {
            self.boundaries = self.boundaries.saturating_add(1);
            self.gap = false;
        } else if !events.is_empty() {
            self.gap = true;
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Lost::default()
    }
}

impl Default for EventChunk {
    fn default() -> Self {
        EventChunk {
            live: 0,
            len: 0,
            events: [0; CHUNK],
            lost: Lost::default(),
        }
    }
}

impl EventChunk {
    pub fn as_slice(&self) -> &[Code] {
        &self.events[..self.len.min(CHUNK)]
    }
}

/// The published forecast, as atomics so that concurrent reads are sound.
///
/// Invariant: `seq` is even when no write is in progress; a reader that sees the same
/// even `seq` before and after copying has a consistent snapshot.
pub struct Published {
    seq: AtomicU64,
    step_index: AtomicU64,
    live_bytes: AtomicU64,
    reference: AtomicU64,
    trust: AtomicU64,
    seen_rise: AtomicU64,
    level_envelope: AtomicU64,
    horizon: AtomicU64,
    /// `Forecast::peak`'s bits; [`NO_PEAK`] for `None`.
    peak: AtomicU64,
    bytes: [AtomicU64; SLOTS],
}

/// The bits `Published::peak` holds for a forecast without a peak of its own (a NaN
/// payload no arithmetic produces; a forecaster's NaN peak is published as NaN).
const NO_PEAK: u64 = 0x7ff8_dead_beef_0001;

impl Default for Published {
    fn default() -> Self {
        Published {
            seq: AtomicU64::new(0),
            step_index: AtomicU64::new(0),
            live_bytes: AtomicU64::new(0),
            reference: AtomicU64::new(0),
            trust: AtomicU64::new(0),
            seen_rise: AtomicU64::new(0),
            level_envelope: AtomicU64::new(u64::MAX),
            horizon: AtomicU64::new(0),
            peak: AtomicU64::new(NO_PEAK),
            bytes: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Published {
    /// Publishes `f`. Single writer only.
    pub fn write(&self, f: &Forecast) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.step_index.store(f.step_index, Ordering::Relaxed);
        self.live_bytes.store(f.live_bytes, Ordering::Relaxed);
        self.reference
            .store(u64::from(f.reference), Ordering::Relaxed);
        self.trust.store(f.trust.to_bits(), Ordering::Relaxed);
        self.seen_rise.store(f.seen_rise, Ordering::Relaxed);
        self.level_envelope
            .store(f.level_envelope, Ordering::Relaxed);
        self.horizon.store(f.horizon as u64, Ordering::Relaxed);
        let peak = match f.peak {
            None => NO_PEAK,
            Some(p) if p.to_bits() == NO_PEAK => f64::NAN.to_bits(),
            Some(p) => p.to_bits(),
        };
        self.peak.store(peak, Ordering::Relaxed);
        for (i, slot) in self.bytes.iter().enumerate() {
            slot.store(
                f.bytes[i / CHANNELS][i % CHANNELS].to_bits(),
                Ordering::Relaxed,
            );
        }
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// The sequence number: changes with every publication (0 = none yet). One load.
    #[inline]
    pub fn version(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// O(SLOTS); retries a bounded number of times if a write overlaps, then gives up.
    pub fn read(&self) -> Option<Forecast> {
        for _ in 0..64 {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 == 0 {
                return None; // nothing published yet
            }
            if s1 % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let mut f = Forecast {
                step_index: self.step_index.load(Ordering::Relaxed),
                live_bytes: self.live_bytes.load(Ordering::Relaxed),
                reference: self.reference.load(Ordering::Relaxed) != 0,
                trust: f64::from_bits(self.trust.load(Ordering::Relaxed)),
                seen_rise: self.seen_rise.load(Ordering::Relaxed),
                level_envelope: self.level_envelope.load(Ordering::Relaxed),
                horizon: self.horizon.load(Ordering::Relaxed) as usize,
                peak: match self.peak.load(Ordering::Relaxed) {
                    NO_PEAK => None,
                    bits => Some(f64::from_bits(bits)),
                },
                ..Forecast::default()
            };
            for (i, slot) in self.bytes.iter().enumerate() {
                f.bytes[i / CHANNELS][i % CHANNELS] = f64::from_bits(slot.load(Ordering::Relaxed));
            }
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s1 {
                return Some(f);
            }
        }
        None
    }
}

/// Counters of what happened to submitted chunks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceStats {
    pub submitted: u64,
    /// Dropped because the queue was full (or the service had stopped).
    pub dropped: u64,
    pub processed: u64,
    /// Forecasts made, and those published (see the module docs).
    pub forecasts: u64,
    pub published: u64,
    /// Iteration boundaries of dropped chunks the engine was still given (see
    /// [`ForecastService::submit`]).
    pub carried: u64,
}

/// What the service thread shares. The allocating thread writes nothing here but the
/// queue (its own counters live in [`ForecastService`]), so its hot lines are not
/// pulled back and forth.
struct Shared {
    queue: ArrayQueue<EventChunk>,
    published: Published,
    stop: AtomicBool,
    processed: AtomicU64,
    forecasts: AtomicU64,
    publications: AtomicU64,
    /// Boundaries of dropped chunks the engine was given.
    carried: AtomicU64,
    /// Boundaries lost after the last chunk queued, written at the stop.
    final_boundaries: AtomicU64,
}

/// See the module docs.
pub struct ForecastService {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
    forecaster: &'static str,
    submitted: u64,
    dropped: u64,
    /// Lost since the last chunk queued; handed over with the next one.
    lost: Lost,
}

impl std::fmt::Debug for ForecastService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForecastService")
            .field("forecaster", &self.forecaster)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// The service thread's sleep while its queue is empty: doubling from 50 us to 1 ms
/// (a forecast is then at most ~1 ms late; a training step takes tens of ms).
const IDLE_MIN: Duration = Duration::from_micros(50);
const IDLE_MAX: Duration = Duration::from_millis(1);

/// Chunks processed in one go, and the pause after a full burst: at most `BURST`
/// chunks (2,048 events, ~64 steps: ~140 us of LSTM) per `PACE`, a few percent of a
/// core. A real job hands over far fewer (a training step of tens of ms makes a few
/// thousand events); the `alloc_free` bench, 40 M events/s, many more: those the
/// queue cannot hold are dropped on the allocating thread.
const BURST: usize = 2048 / CHUNK;
const PACE: Duration = Duration::from_millis(5);

impl ForecastService {
    /// Starts the service thread over `engine` with a queue of `capacity` chunks (>= 1),
    /// publishing forecasts whose peak moved by `quantum` bytes or more (0: every one).
    pub fn start(engine: Engine, capacity: usize, quantum: u64) -> Result<Self> {
        if capacity == 0 {
            return Err(PredictorError::Config("queue capacity must be >= 1".into()));
        }
        let shared = Arc::new(Shared {
            queue: ArrayQueue::new(capacity),
            published: Published::default(),
            stop: AtomicBool::new(false),
            processed: AtomicU64::new(0),
            forecasts: AtomicU64::new(0),
            publications: AtomicU64::new(0),
            carried: AtomicU64::new(0),
            final_boundaries: AtomicU64::new(0),
        });
        let s = shared.clone();
        let forecaster = engine.forecaster_name();
        let handle = std::thread::Builder::new()
            .name("memcast-forecast".into())
            .spawn(move || serve(engine, s, quantum))
            .map_err(|e| {
                PredictorError::Config(format!("cannot start the forecast thread: {e}"))
            })?;
        Ok(Self {
            shared,
            handle: Some(handle),
            forecaster,
            submitted: 0,
            dropped: 0,
            lost: Lost::default(),
        })
    }

    pub fn forecaster_name(&self) -> &'static str {
        self.forecaster
    }

    /// Queues a chunk without blocking. Returns false if it was dropped. A dropped
    /// chunk whose last event is an iteration boundary (the allocator hands a chunk
    /// over at each boundary) still passes the boundary on: the engine is given one
    /// before its next chunk, so that under load it loses events, never the
    /// iterations its steps restart at.
    #[inline]
    pub fn submit(&mut self, chunk: &EventChunk) -> bool {
        self.submitted += 1;
        let q = &self.shared.queue;
        // Checked full before the copy: a drop copies nothing.
        let ok = self.handle.is_some()
            && !q.is_full()
            && q.push(EventChunk {
                lost: self.lost,
                ..*chunk
            })
            .is_ok();
        if ok {
            self.lost = Lost::default();
        } else {
            self.dropped += 1;
            self.lost.add(chunk.as_slice());
        }
        ok
    }

    /// Counts events the allocator dropped without offering them (it does while the
    /// queue is full) as one dropped chunk; a boundary ending them is carried, as
    /// [`submit`](Self::submit) carries a dropped chunk's.
    pub fn skip(&mut self, events: &[Code]) {
        self.submitted += 1;
        self.dropped += 1;
        self.lost.add(events);
    }

    /// Whether the queue has room for a chunk now (two atomic loads).
    #[inline]
    pub fn has_room(&self) -> bool {
        self.handle.is_some() && !self.shared.queue.is_full()
    }

    /// The publication's version (one atomic load): compare with the last one read to
    /// know whether a new forecast is there without copying it.
    #[inline]
    pub fn version(&self) -> u64 {
        self.shared.published.version()
    }

    /// The latest published forecast, if any. Never blocks.
    pub fn latest(&self) -> Option<Forecast> {
        self.shared.published.read()
    }

    pub fn stats(&self) -> ServiceStats {
        let s = &self.shared;
        ServiceStats {
            submitted: self.submitted,
            dropped: self.dropped,
            processed: s.processed.load(Ordering::Relaxed),
            forecasts: s.forecasts.load(Ordering::Relaxed),
            published: s.publications.load(Ordering::Relaxed),
            carried: s.carried.load(Ordering::Relaxed),
        }
    }

    /// Stops the thread after the queued chunks are done, and waits for it.
    pub fn shutdown(mut self) -> ServiceStats {
        self.stop_and_join();
        self.stats()
    }

    fn stop_and_join(&mut self) {
        // Boundaries lost after the last chunk queued: the thread feeds one after the
        // queue (the stop's release orders this store before its acquire).
        self.shared
            .final_boundaries
            .store(u64::from(self.lost.boundaries), Ordering::Relaxed);
        self.lost = Lost::default();
        self.shared.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

impl Drop for ForecastService {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

fn serve(mut engine: Engine, shared: Arc<Shared>, quantum: u64) {
    let mut idle = IDLE_MIN;
    // The last published forecast's peak of live bytes and basis.
    let mut last: Option<(f64, bool)> = None;
    let mut publish = |f: &Forecast| {
        shared.forecasts.fetch_add(1, Ordering::Relaxed);
        let peak = f.live_bytes as f64 + f.horizon_peak_rise(f64::MAX).unwrap_or(0.0);
        let moved = match last {
            None => true,
            Some((p, r)) => r != f.reference || (peak - p).abs() >= quantum as f64,
        };
        if moved {
            last = Some((peak, f.reference));
            shared.published.write(f);
            shared.publications.fetch_add(1, Ordering::Relaxed);
        }
    };
    loop {
        let stopping = shared.stop.load(Ordering::Acquire);
        let mut n = 0;
        while stopping || n < BURST {
            let Some(chunk) = shared.queue.pop() else {
                break;
            };
            // What was dropped just before this chunk: one boundary however many were
            // lost (the engine's steps restart at it), then, if events were lost after
            // the last of them, a gap until the next boundary.
            let lost = chunk.lost;
            if lost.boundaries > 0 {
                shared
                    .carried
                    .fetch_add(u64::from(lost.boundaries), Ordering::Relaxed);
                engine.set_live(chunk.live);
                engine.feed(&[BOUNDARY], &mut publish);
            }
            if lost.gap {
                engine.mark_gap();
            }
            n += 1;
            engine.set_live(chunk.live);
            engine.feed(chunk.as_slice(), &mut publish);
            shared.processed.fetch_add(1, Ordering::Relaxed);
        }
        if stopping {
            // Everything queued before the stop was seen is done; then the boundaries
            // lost after it.
            let b = shared.final_boundaries.load(Ordering::Relaxed);
            if b > 0 {
                shared.carried.fetch_add(b, Ordering::Relaxed);
                engine.feed(&[BOUNDARY], &mut publish);
            }
            return;
        }
        if n == BURST {
            // Behind: a burst, then a pause, so that the thread takes a bounded share
            // of a core whatever the allocation rate (the queue fills and the
            // allocating thread drops chunks before copying them).
            std::thread::park_timeout(PACE);
            idle = IDLE_MIN;
        } else if n > 0 {
            idle = IDLE_MIN;
        } else {
            std::thread::park_timeout(idle);
            idle = (idle * 2).min(IDLE_MAX);
        }
    }
}
