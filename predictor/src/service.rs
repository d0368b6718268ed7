//! `ForecastService`: embedded inference on its own thread inside the allocator process.
//!
//! The allocator [`submit`](ForecastService::submit)s each step's [`StepInput`] through
//! a bounded queue (`try_send`: never blocks; a full queue drops the step and counts it)
//! and reads the latest [`Forecast`] with [`latest`](ForecastService::latest), a seqlock
//! read over atomics: it never takes a lock and never waits for the service thread.
//! A dropped step means the LSTM state skips it: forecasts degrade, the allocator never
//! stalls.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use memcast_trace::features::CHANNELS;

use crate::config::MAX_HORIZON;
use crate::error::{PredictorError, Result};
use crate::infer::{EmbeddedLstm, Forecast, StepInput};

const SLOTS: usize = MAX_HORIZON * CHANNELS;

/// The published forecast, as atomics so that concurrent reads are sound.
///
/// Invariant: `seq` is even when no write is in progress; a reader that sees the same
/// even `seq` before and after copying has a consistent snapshot.
struct Published {
    seq: AtomicU64,
    step_index: AtomicU64,
    horizon: AtomicU64,
    bytes: [AtomicU64; SLOTS],
}

impl Published {
    fn write(&self, f: &Forecast) {
        // Single writer (the service thread): odd while writing.
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.step_index.store(f.step_index, Ordering::Relaxed);
        self.horizon.store(f.horizon as u64, Ordering::Relaxed);
        for (i, slot) in self.bytes.iter().enumerate() {
            slot.store(
                f.bytes[i / CHANNELS][i % CHANNELS].to_bits(),
                Ordering::Relaxed,
            );
        }
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// O(SLOTS); retries a bounded number of times if a write overlaps, then gives up.
    fn read(&self) -> Option<Forecast> {
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

/// Counters of what happened to submitted steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceStats {
    pub submitted: u64,
    /// Dropped because the queue was full (or the service had stopped).
    pub dropped: u64,
    pub processed: u64,
    /// Inputs the model rejected (e.g. non-finite features).
    pub errors: u64,
}

struct Shared {
    published: Published,
    submitted: AtomicU64,
    dropped: AtomicU64,
    processed: AtomicU64,
    errors: AtomicU64,
    stop: AtomicBool,
}

/// See the module docs.
pub struct ForecastService {
    tx: Option<SyncSender<StepInput>>,
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
}

impl ForecastService {
    /// Starts the service thread with a queue of `capacity` steps (>= 1).
    pub fn start(model: EmbeddedLstm, capacity: usize) -> Result<Self> {
        if capacity == 0 {
            return Err(PredictorError::Config("queue capacity must be >= 1".into()));
        }
        let shared = Arc::new(Shared {
            published: Published {
                seq: AtomicU64::new(0),
                step_index: AtomicU64::new(0),
                horizon: AtomicU64::new(0),
                bytes: std::array::from_fn(|_| AtomicU64::new(0)),
            },
            submitted: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            processed: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let (tx, rx) = sync_channel(capacity);
        let s = shared.clone();
        let handle = std::thread::Builder::new()
            .name("memcast-forecast".into())
            .spawn(move || serve(model, rx, s))
            .map_err(|e| {
                PredictorError::Config(format!("cannot start the forecast thread: {e}"))
            })?;
        Ok(Self {
            tx: Some(tx),
            shared,
            handle: Some(handle),
        })
    }

    /// Queues a step without blocking. Returns false if it was dropped.
    pub fn submit(&self, input: StepInput) -> bool {
        self.shared.submitted.fetch_add(1, Ordering::Relaxed);
        let ok = match &self.tx {
            Some(tx) => match tx.try_send(input) {
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
            errors: s.errors.load(Ordering::Relaxed),
        }
    }

    /// Stops the thread after the queued steps are done, and waits for it.
    pub fn shutdown(mut self) -> ServiceStats {
        self.stop_and_join();
        self.stats()
    }

    fn stop_and_join(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
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

fn serve(mut model: EmbeddedLstm, rx: Receiver<StepInput>, shared: Arc<Shared>) {
    let mut f = Forecast::default();
    while let Ok(input) = rx.recv() {
        match model.forecast(&input, &mut f) {
            Ok(()) => shared.published.write(&f),
            Err(e) => {
                shared.errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("forecast service rejected step {}: {e}", input.step_index);
            }
        }
        shared.processed.fetch_add(1, Ordering::Relaxed);
    }
}
