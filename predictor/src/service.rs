//! `ForecastService`: the online [`Engine`] (featurizer + forecaster) on its own thread
//! inside the allocator process.
//!
//! The allocator [`submit`](ForecastService::submit)s its events in fixed-size chunks
//! ([`EventChunk`], no heap) through a bounded queue (`try_send`: never blocks; a full
//! queue drops the chunk and counts it) and reads the latest [`Forecast`] with
//! [`latest`](ForecastService::latest), a seqlock read over atomics: it never takes a
//! lock and never waits for the service thread. A dropped chunk means the featurizer
//! misses those events: its live bytes and steps drift until the next iteration
//! boundary re-aligns the phases, forecasts degrade, the allocator never stalls.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use memcast_trace::features::CHANNELS;

use crate::config::MAX_HORIZON;
use crate::error::{PredictorError, Result};
use crate::forecaster::Engine;
use crate::infer::Forecast;

const SLOTS: usize = MAX_HORIZON * CHANNELS;

/// Events per chunk: the allocator buffers this many event codes and hands them over
/// at once (one queue operation per 32 events, ~1 ns an event).
pub const CHUNK: usize = 32;

/// A chunk of encoded events (see `forecaster`'s codes). `Copy`, fixed size.
#[derive(Debug, Clone, Copy)]
pub struct EventChunk {
    pub len: usize,
    pub events: [i64; CHUNK],
}

impl Default for EventChunk {
    fn default() -> Self {
        EventChunk {
            len: 0,
            events: [0; CHUNK],
        }
    }
}

impl EventChunk {
    pub fn as_slice(&self) -> &[i64] {
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
    horizon: AtomicU64,
    bytes: [AtomicU64; SLOTS],
}

impl Default for Published {
    fn default() -> Self {
        Published {
            seq: AtomicU64::new(0),
            step_index: AtomicU64::new(0),
            live_bytes: AtomicU64::new(0),
            reference: AtomicU64::new(0),
            trust: AtomicU64::new(0),
            seen_rise: AtomicU64::new(0),
            horizon: AtomicU64::new(0),
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
        self.horizon.store(f.horizon as u64, Ordering::Relaxed);
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
                horizon: self.horizon.load(Ordering::Relaxed) as usize,
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
    /// Forecasts published.
    pub forecasts: u64,
}

#[derive(Default)]
struct Shared {
    published: Published,
    submitted: AtomicU64,
    dropped: AtomicU64,
    processed: AtomicU64,
    forecasts: AtomicU64,
}

/// See the module docs.
pub struct ForecastService {
    tx: Option<SyncSender<EventChunk>>,
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
    forecaster: &'static str,
}

impl std::fmt::Debug for ForecastService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForecastService")
            .field("forecaster", &self.forecaster)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl ForecastService {
    /// Starts the service thread over `engine` with a queue of `capacity` chunks (>= 1).
    pub fn start(engine: Engine, capacity: usize) -> Result<Self> {
        if capacity == 0 {
            return Err(PredictorError::Config("queue capacity must be >= 1".into()));
        }
        let shared = Arc::new(Shared::default());
        let (tx, rx) = sync_channel(capacity);
        let s = shared.clone();
        let forecaster = engine.forecaster_name();
        let handle = std::thread::Builder::new()
            .name("memcast-forecast".into())
            .spawn(move || serve(engine, rx, s))
            .map_err(|e| {
                PredictorError::Config(format!("cannot start the forecast thread: {e}"))
            })?;
        Ok(Self {
            tx: Some(tx),
            shared,
            handle: Some(handle),
            forecaster,
        })
    }

    pub fn forecaster_name(&self) -> &'static str {
        self.forecaster
    }

    /// Queues a chunk without blocking. Returns false if it was dropped.
    pub fn submit(&self, chunk: EventChunk) -> bool {
        self.shared.submitted.fetch_add(1, Ordering::Relaxed);
        let ok = match &self.tx {
            Some(tx) => match tx.try_send(chunk) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
            },
            None => false,
        };
        if !ok {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
        }
        ok
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
            submitted: s.submitted.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed),
            processed: s.processed.load(Ordering::Relaxed),
            forecasts: s.forecasts.load(Ordering::Relaxed),
        }
    }

    /// Stops the thread after the queued chunks are done, and waits for it.
    pub fn shutdown(mut self) -> ServiceStats {
        self.stop_and_join();
        self.stats()
    }

    fn stop_and_join(&mut self) {
        self.tx = None; // disconnects: the thread's recv() ends after the queue drains
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for ForecastService {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

fn serve(mut engine: Engine, rx: Receiver<EventChunk>, shared: Arc<Shared>) {
    while let Ok(chunk) = rx.recv() {
        engine.feed(chunk.as_slice(), |f| {
            shared.published.write(f);
            shared.forecasts.fetch_add(1, Ordering::Relaxed);
        });
        shared.processed.fetch_add(1, Ordering::Relaxed);
    }
}
