//! The online path: the allocator's events into the forecaster, forecasts into advice.
//! See the module docs of `predictive` for the whole loop.
//!
//! Costs (measured in docs/predictive.md with `cargo bench --bench alloc_free`):
//! - per `allocate` / `deallocate`: one branch on `Allocator::online`, one store into
//!   the buffer, one add and one compare;
//! - per `CHUNK` (16) events, about half a step (out of line): the chunk goes to the
//!   forecast service's queue (an 80-byte copy, only if the queue has room; never
//!   blocks) and one atomic load says whether a new forecast was published; only then
//!   is it read (a seqlock copy of ~60 values) and planned. While the service is
//!   behind (its queue full), every `BEHIND` (256) events instead, dropped unsent.
//!   Inline (`forecast_thread:false`) the featurizer and the forecaster run here
//!   instead (~2 us per closed step with the LSTM).
//!
//! Freshness: a step reaches the forecaster as soon as its events are handed over,
//! and its forecast is read at the next hand-over, so a forecast is at most a step or
//! two old when it is acted on. A forecast is worth something only within its horizon
//! (5 steps): handed over 256 events at a time, a real job's forecasts arrived after
//! the rises they foresaw and drove nothing (docs/predictive.md, "In a real job").

use std::sync::Arc;

use memcast_predictor::forecaster::{encode_alloc, encode_free, Code, Forecaster, BOUNDARY};
use memcast_predictor::service::CHUNK;
use memcast_predictor::{Engine, EventChunk, Forecast, ForecastService};
use memcast_trace::features::StepConfig;

use crate::backend::{DeviceBackend, StreamId};
use crate::config::AllocConfig;
use crate::error::AllocError;
use crate::policy::{GrowthPolicy, ReactiveGrowth};
use crate::pool::Allocator;

use super::plan::{ForecastGrowth, ForecastPolicy, State, Target};

/// Events buffered while the forecast service is behind (its queue was full at the
/// last hand-over): the allocator then flushes every `BEHIND` events and drops them
/// unsent, as the full queue would have, until the queue has room again. A flush costs
/// the allocating thread a call and a few loads: a service that cannot keep up gets
/// stale events either way, and the allocator stops paying for freshness it cannot
/// have (the `alloc_free` bench, whose rate no service keeps up with).
const BEHIND: usize = 256;

/// Where the engine runs.
enum Mode {
    /// On the allocator's thread; `latest` is its last forecast, `version` counts them.
    Inline {
        engine: Box<Engine>,
        latest: Box<Option<Forecast>>,
        version: u64,
    },
    /// On the forecast service's thread.
    Thread(ForecastService),
}

/// The online path of one allocator (boxed in `Allocator::online`).
pub struct OnlinePath {
    /// Event codes since the last hand-over; `live` is the allocator's live bytes at
    /// the first of them.
    // Invariant: len < limit between calls (a full buffer is handed over at once).
    events: [Code; BEHIND],
    len: usize,
    live: u64,
    /// Events per hand-over: `CHUNK`, or `BEHIND` while the service is behind.
    // Invariant: limit == CHUNK or (thread mode and limit == BEHIND).
    limit: usize,
    mode: Mode,
    /// The publication version last read.
    seen: u64,
    forecaster: &'static str,
    horizon: usize,
    policy: ForecastPolicy,
    /// The stream of the last flush (advice goes to it).
    stream: StreamId,
    /// Chunks handed over.
    pub chunks: u64,
}

impl std::fmt::Debug for OnlinePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnlinePath")
            .field("forecaster", &self.forecaster)
            .field("horizon", &self.horizon)
            .field("chunks", &self.chunks)
            .finish_non_exhaustive()
    }
}

impl OnlinePath {
    /// The online path over `forecaster`, and the growth policy that reads its
    /// forecasts (when `cfg.predictive_actions.grow`).
    pub(crate) fn new(
        cfg: &AllocConfig,
        forecaster: Box<dyn Forecaster>,
        reactive: ReactiveGrowth,
    ) -> Result<(Self, Box<dyn GrowthPolicy>), AllocError> {
        let name = forecaster.name();
        let horizon = forecaster.horizon();
        let engine = Engine::new(StepConfig::default(), forecaster);
        let mode = if cfg.forecast_thread {
            // 16,384 events of slack before the service drops any. Every forecast
            // is published (quantum 0), as inline every forecast is read: a forecast
            // sizes growth only within its horizon (`Target::until_allocs`), so a
            // steady forecast left unpublished (it once was, below a growth chunk of
            // change) let the target lapse and the misses grow reactively.
            Mode::Thread(
                ForecastService::start(engine, 16384 / CHUNK, 0)
                    .map_err(|e| AllocError::Config(format!("predictive mode: {e}")))?,
            )
        } else {
            Mode::Inline {
                engine: Box::new(engine),
                latest: Box::new(None),
                version: 0,
            }
        };
        let target = Arc::new(Target::default());
        let growth: Box<dyn GrowthPolicy> = if cfg.predictive_actions.grow {
            Box::new(ForecastGrowth {
                inner: reactive,
                target: target.clone(),
            })
        } else {
            Box::new(reactive)
        };
        let policy = ForecastPolicy {
            actions: cfg.predictive_actions,
            chunk: cfg.growth_initial,
            span_allocs: (horizon as u64) * u64::from(StepConfig::default().allocs_per_step),
            target,
        };
        Ok((
            OnlinePath {
                events: [0; BEHIND],
                len: 0,
                live: 0,
                limit: CHUNK,
                mode,
                seen: 0,
                forecaster: name,
                horizon,
                policy,
                stream: 0,
                chunks: 0,
            },
            growth,
        ))
    }

    pub fn forecaster(&self) -> &'static str {
        self.forecaster
    }
    pub fn horizon(&self) -> usize {
        self.horizon
    }

    /// Appends one event code; true when the buffer is full (the caller flushes).
    #[inline(always)]
    fn record(&mut self, code: Code) -> bool {
        let n = self.len;
        // The mask keeps the index in bounds without a check (n < limit <= BEHIND).
        self.events[n & (BEHIND - 1)] = code;
        self.len = n + 1;
        n + 1 == self.limit
    }

    /// Hands the buffered events to the engine (inline: runs it now) and empties the
    /// buffer.
    fn hand_over(&mut self) {
        let events = &self.events[..self.len];
        if events.is_empty() {
            return;
        }
        self.chunks += 1;
        match &mut self.mode {
            Mode::Inline {
                engine,
                latest,
                version,
            } => {
                engine.set_live(self.live);
                engine.feed(events, |f| {
                    **latest = Some(*f);
                    *version += 1;
                })
            }
            Mode::Thread(svc) => {
                if events.len() <= CHUNK {
                    let mut c = EventChunk {
                        live: self.live,
                        len: events.len(),
                        ..EventChunk::default()
                    };
                    c.events[..events.len()].copy_from_slice(events);
                    let sent = svc.submit(&c);
                    self.limit = if sent { CHUNK } else { BEHIND };
                } else {
                    // Behind: dropped unsent, as the full queue would drop them.
                    svc.skip(events);
                    self.limit = if svc.has_room() { CHUNK } else { BEHIND };
                }
            }
        }
        self.len = 0;
    }

    /// The latest forecast if one was published since the last call. Never blocks.
    fn take_new(&mut self) -> Option<Forecast> {
        match &self.mode {
            Mode::Inline {
                latest, version, ..
            } => {
                if *version == self.seen {
                    return None;
                }
                self.seen = *version;
                **latest
            }
            Mode::Thread(svc) => {
                let v = svc.version();
                if v == self.seen || v % 2 == 1 {
                    return None;
                }
                let f = svc.latest()?;
                self.seen = v;
                Some(f)
            }
        }
    }

    /// Counters of the forecast service (threaded mode), for statistics.
    pub fn service_stats(&self) -> Option<memcast_predictor::ServiceStats> {
        match &self.mode {
            Mode::Thread(s) => Some(s.stats()),
            Mode::Inline { .. } => None,
        }
    }
}

impl<B: DeviceBackend> Allocator<B> {
    /// An allocator in predictive mode over `forecaster` (replay's oracle, tests'
    /// adversaries), whatever `cfg.predictive` and `cfg.forecaster` say.
    pub fn with_forecaster(
        backend: B,
        cfg: AllocConfig,
        forecaster: Box<dyn Forecaster>,
    ) -> Result<Self, AllocError> {
        let mut cfg = cfg;
        cfg.predictive = false;
        if cfg.predictive_actions.presplit {
            // Runs of the next iteration's sizes kept ready: planned placement.
            cfg.placement = crate::config::Placement::Planned;
        }
        let mut a = Allocator::new(backend, cfg.clone())?;
        cfg.predictive = true;
        let (online, growth) =
            OnlinePath::new(&cfg, forecaster, ReactiveGrowth::from_config(&cfg))?;
        a.growth = growth;
        a.online = Some(Box::new(online));
        a.cfg = cfg;
        Ok(a)
    }

    /// [`Allocator::new`] for a configuration from the environment (`MEMCAST_ALLOC_CONF`):
    /// if predictive mode cannot start (a missing or corrupt model), logs a warning
    /// naming the problem and returns a reactive allocator instead, so that a job never
    /// fails to start over advice. Other configuration errors are still errors.
    pub fn new_or_reactive(backend: B, cfg: AllocConfig) -> Result<Self, AllocError> {
        if cfg.predictive {
            match super::forecaster_for(&cfg) {
                Ok(f) => return Self::with_forecaster(backend, cfg, f),
                Err(e) => {
                    tracing::warn!("{e}; running the reactive allocator instead");
                    let mut cfg = cfg;
                    cfg.predictive = false;
                    return Allocator::new(backend, cfg);
                }
            }
        }
        Allocator::new(backend, cfg)
    }

    /// Predictive mode's online path, if on.
    pub fn online(&self) -> Option<&OnlinePath> {
        self.online.as_deref()
    }

    /// An iteration boundary (a training step's end): the forecaster's steps restart
    /// here, so iterations line up phase by phase, and planned placement plans the
    /// next iteration. A no-op in reactive mode with best-fit placement. Call it
    /// once per iteration, between the last free of one and the first allocation of
    /// the next.
    pub fn iteration_boundary(&mut self) {
        self.plan_placement();
        let Some(o) = self.online.as_deref_mut() else {
            return;
        };
        o.record(BOUNDARY);
        let stream = o.stream;
        self.online_flush(stream);
    }

    /// Free bytes of `stream`'s pool as `Advice::EnsureFree` counts them (free extents
    /// and cached runs).
    fn pool_free(&self, stream: StreamId) -> u64 {
        match self.pools.get(stream as usize) {
            Some(Some(p)) => p.buddy.free_bytes() + p.cache.bytes(),
            _ => 0,
        }
    }

    /// The hot-path hook of `allocate`: records an allocation of `bytes`.
    #[inline(always)]
    pub(crate) fn online_alloc(&mut self, bytes: u64, stream: StreamId) {
        if let Some(o) = self.online.as_deref_mut() {
            if o.record(encode_alloc(bytes)) {
                self.online_flush(stream);
            }
        }
    }

    /// The hot-path hook of `deallocate`: records a free of `bytes` (requested).
    #[inline(always)]
    pub(crate) fn online_free(&mut self, bytes: u64, stream: StreamId) {
        if let Some(o) = self.online.as_deref_mut() {
            if o.record(encode_free(bytes)) {
                self.online_flush(stream);
            }
        }
    }

    /// A full chunk (or a boundary): hand it over, then act on a new forecast.
    #[cold]
    #[inline(never)]
    fn online_flush(&mut self, stream: StreamId) {
        let Some(o) = self.online.as_deref_mut() else {
            return;
        };
        o.stream = stream;
        o.hand_over();
        // The next events start at this live count (the engine re-aligns to it).
        o.live = self.stats.requested.current;
        let Some(f) = o.take_new() else {
            return;
        };
        self.stats.forecasts_used += 1;
        let s = &self.stats;
        let state = State {
            stream,
            growable: self.cfg.growable_segments && self.backend.supports_growable(),
            requested: s.requested.current,
            allocated: s.allocated.current,
            reserved: s.reserved.current,
            free: self.pool_free(stream),
            capacity: self.backend.capacity(),
            allocs: s.allocs,
        };
        let Some(advice) = self
            .online
            .as_deref()
            .and_then(|o| o.policy.plan(&f, &state))
        else {
            return;
        };
        tracing::debug!(
            ?advice,
            trust = f.trust,
            seen_rise = f.seen_rise,
            envelope = f.level_envelope,
            live = f.live_bytes,
            step = f.step_index,
            allocated = state.allocated,
            reserved = state.reserved,
            "predictive advice"
        );
        let calls = self.stats.device_allocs + self.stats.device_frees;
        let t0 = self.backend.stall_us();
        let r = self.apply_advice(advice);
        self.stats.advice_applied += 1;
        self.stats.ahead_device_calls += self.stats.device_allocs + self.stats.device_frees - calls;
        self.stats.ahead_device_us += self.backend.stall_us() - t0;
        if let Err(e) = r {
            // Advice is optional: a failure to follow it is logged, never returned.
            tracing::warn!("predictive mode: advice {advice:?} not followed: {e}");
        }
    }
}
