//! Trace replay: runs a [`Trace`] through an allocator policy and reports the metrics
//! defined below.
//!
//! The trace's static blocks (live before recording began) are allocated first, in
//! order; then every event: `Alloc` allocates, `Free` frees, `Access` and
//! `IterationBoundary` only advance the clock. On the `sim` device the clock follows the
//! trace's timestamps (compute time) plus the device calls' costs, so `device_time_us`
//! is the time the host spent blocked in device calls. The `pytorch` policy creates the
//! static blocks through a modelled warm-up iteration instead ([`warmup`]), as the
//! recorded process did.
//!
//! Metrics (one definition, used everywhere):
//! - `peak_requested_bytes`: max over time of live requested bytes, static included;
//! - `peak_reserved_bytes`: max over time of bytes obtained from the device;
//! - `reserved_overhead = peak_reserved / peak_requested - 1`;
//! - `max_fragmentation`: max of `1 - largest free block / free bytes`, sampled every
//!   256 events and at each new reserved peak, over instants where at least 1% of
//!   reserved bytes are free (below that the ratio measures noise, not fragmentation);
//!   `fragmentation_at_peak` is the value when reserved peaked;
//! - `events_per_sec`: events (static blocks included) over the wall time of the loop
//!   (under `ReplayOptions::real_time`, the trace's own pace).

pub mod cuda;
pub mod naive;
pub mod pytorch;
#[cfg(test)]
mod pytorch_fidelity;
mod run;
pub mod warmup;
pub mod workspace;

pub use run::{run, run_warm};

use memcast_trace::{EventKind, Trace};
use serde::{Deserialize, Serialize};

use crate::backend::host::HostBackend;
use crate::backend::sim::SimBackend;
use crate::backend::{DeviceBackend, StreamPriority};
use crate::config::AllocConfig;
use crate::error::AllocError;
use crate::pool::{Allocation, Allocator, FxMap};

/// Which allocator replays the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// This crate's allocator.
    Memcast,
    /// The emulation of PyTorch's CUDACachingAllocator ([`pytorch`]).
    Pytorch,
    /// One device allocation per request.
    Naive,
    /// This crate's allocator in predictive mode (forecaster: [`ReplayOptions::forecaster`]).
    Predictive,
}

impl Policy {
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Memcast => "memcast",
            Policy::Pytorch => "pytorch",
            Policy::Naive => "naive",
            Policy::Predictive => "predictive",
        }
    }
}

/// Which forecaster a predictive replay runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ReplayForecaster {
    /// The embedded LSTM (`config.model`, or the default model).
    #[default]
    Lstm,
    /// The featurizer's copy-and-rescale base.
    Seasonal,
    /// The trace's true future (the upper bound of any forecast).
    Oracle,
    /// No forecast.
    None,
}

impl std::str::FromStr for ReplayForecaster {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lstm" => Ok(Self::Lstm),
            "seasonal" => Ok(Self::Seasonal),
            "oracle" => Ok(Self::Oracle),
            "none" => Ok(Self::None),
            _ => Err(format!(
                "unknown forecaster {s:?} (lstm, seasonal, oracle, none)"
            )),
        }
    }
}

impl ReplayForecaster {
    /// The forecaster: the oracle over the event codes `future` yields (the stream its
    /// engine will see), the others as `cfg` configures them (`cfg.model`,
    /// `cfg.horizon`).
    pub fn build(
        self,
        cfg: &AllocConfig,
        future: impl FnOnce() -> Vec<memcast_predictor::forecaster::Code>,
    ) -> Result<Box<dyn memcast_predictor::Forecaster>, AllocError> {
        use crate::config::ForecasterKind;
        let kind = match self {
            Self::Oracle => {
                return Ok(Box::new(crate::predictive::OracleForecaster::from_events(
                    &future(),
                    memcast_trace::features::StepConfig::default(),
                    crate::predictive::horizon_of(cfg, None),
                )))
            }
            Self::Lstm => ForecasterKind::Lstm,
            Self::Seasonal => ForecasterKind::Seasonal,
            Self::None => ForecasterKind::None,
        };
        crate::predictive::forecaster_for(&AllocConfig {
            forecaster: kind,
            ..cfg.clone()
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Lstm => "lstm",
            Self::Seasonal => "seasonal",
            Self::Oracle => "oracle",
            Self::None => "none",
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "memcast" => Ok(Policy::Memcast),
            "pytorch" => Ok(Policy::Pytorch),
            "naive" => Ok(Policy::Naive),
            "predictive" => Ok(Policy::Predictive),
            _ => Err(format!(
                "unknown policy {s:?} (memcast, predictive, pytorch, naive)"
            )),
        }
    }
}

/// Which device backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Sim,
    Host,
    /// A real NVIDIA GPU (device 0) through the CUDA driver ([`cuda`]).
    Cuda,
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sim" => Ok(Device::Sim),
            "host" => Ok(Device::Host),
            "cuda" => Ok(Device::Cuda),
            _ => Err(format!("unknown device {s:?} (sim, host, cuda)")),
        }
    }
}

/// Replay settings.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub policy: Policy,
    pub device: Device,
    /// The `memcast` policy's configuration.
    pub config: AllocConfig,
    /// The `pytorch` policy's configuration.
    pub pytorch: pytorch::PytorchConfig,
    /// Device capacity for `sim` (default: an H200's 141 GiB).
    pub sim_capacity: u64,
    /// Device capacity for `host` (real memory, touched only when written); 0 = auto:
    /// 1.5 x the trace's peak requested bytes + 1 GiB (a reserve this machine can map).
    pub host_capacity: u64,
    /// Run `check_invariants()` every N events (0 = never). Tests use 1.
    pub check_every: u64,
    /// The `predictive` policy's forecaster.
    pub forecaster: ReplayForecaster,
    /// Record `ReplayReport::timeline` (reserved and requested bytes over time).
    pub timeline: bool,
    /// The simulated device's call costs (`Device::Sim`; beside the measured calls of
    /// `Device::Cuda`): the H200's by default. Its capacity is `sim_capacity`.
    pub costs: crate::backend::sim::CostModel,
    /// Replay at the trace's own pace: each event waits until its time since the first
    /// event has passed on the wall clock, and predictive mode keeps its forecast
    /// thread (`AllocConfig::forecast_thread`), so forecasts arrive as late as they
    /// would in the job. `false`: as fast as possible, the forecaster inline and in
    /// step (deterministic figures). A replay takes the trace's span.
    pub real_time: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            policy: Policy::Memcast,
            device: Device::Sim,
            config: AllocConfig::default(),
            pytorch: pytorch::PytorchConfig::default(),
            sim_capacity: crate::backend::sim::H200_CAPACITY,
            host_capacity: 0,
            check_every: 0,
            forecaster: ReplayForecaster::Lstm,
            timeline: false,
            costs: Default::default(),
            real_time: false,
        }
    }
}

/// What a replay measured. Serialized as the `--json` output of `memcast replay`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayReport {
    pub trace: String,
    pub policy: Policy,
    /// The forecaster of a predictive replay (`none` for the others).
    pub forecaster: &'static str,
    pub device: Device,
    /// Static blocks + trace events processed.
    pub events: u64,
    pub allocs: u64,
    pub frees: u64,
    pub static_blocks: u64,
    pub peak_requested_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub reserved_overhead: f64,
    /// Time-weighted mean of reserved bytes (weights: the trace's time between events).
    pub mean_reserved_bytes: f64,
    pub device_allocs: u64,
    pub device_frees: u64,
    /// Device calls made inside a request (the request waited for them), all of them
    /// and those after the first iteration (the trace's second boundary), and the host
    /// time they took; the rest were made ahead of need, following a forecast.
    pub critical_path_device_calls: u64,
    pub critical_path_device_calls_after_first_iteration: u64,
    pub critical_path_device_us: f64,
    pub ahead_device_calls: u64,
    /// Per iteration (from each boundary of the trace to the next): the device calls
    /// made (allocations and frees, ahead of need included), and the pages released
    /// or backed again under page release (0 for targets without it). How much work
    /// a repeating loop's steady state still costs.
    pub device_calls_per_iteration: Vec<u64>,
    pub pages_moved_per_iteration: Vec<u64>,
    pub max_fragmentation: f64,
    /// Time-weighted mean fragmentation over the sampled instants (the same instants
    /// and rule as `max_fragmentation`).
    pub mean_fragmentation: f64,
    pub fragmentation_at_peak: f64,
    pub events_per_sec: f64,
    pub wall_secs: f64,
    /// Host time blocked in device calls (sim: the cost model's, the H200's by default).
    pub device_time_us: f64,
    /// Rounded minus requested bytes when requested bytes peaked.
    pub internal_waste_at_peak: u64,
    /// Policy-specific counters (cache hits, slab allocations, ...).
    pub extra: serde_json::Value,
    /// With `ReplayOptions::timeline`: `[time us, requested bytes, reserved bytes]`
    /// every 256 events and at iteration boundaries.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<[f64; 3]>,
}

/// Replay errors: the allocator failed (e.g. out of memory) at a given event.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("event {index}")]
    Alloc {
        index: u64,
        #[source]
        source: AllocError,
    },
    /// Making static block `index` (of `Trace::static_blocks`, before any event) failed.
    #[error("static block {index} (id {id}, {bytes} bytes)")]
    StaticBlock {
        index: u64,
        id: u64,
        bytes: u64,
        #[source]
        source: AllocError,
    },
    #[error("event {index}: {what}")]
    Trace { index: u64, what: String },
    /// The allocator could not be made (its settings: a missing model, a profile that
    /// does not load, ...), before any event.
    #[error("setup")]
    Setup(#[source] AllocError),
    /// The device could not be opened (`--device cuda` without a driver, ...).
    #[error(transparent)]
    Device(crate::backend::BackendError),
    /// The allocator failed during the modelled warm-up ([`warmup`]) at trace event
    /// `index`.
    #[error("warm-up, event {index}")]
    Warmup {
        index: u64,
        #[source]
        source: AllocError,
    },
    /// `ReplayOptions::costs` is not a usable cost model (`CostModel::validate`).
    #[error("cost model: {0}")]
    Costs(String),
}

/// An allocator under replay: allocation by opaque handle, with the metrics.
pub trait ReplayTarget {
    type Handle: Copy;
    fn alloc(&mut self, bytes: u64, stream: u32) -> Result<Self::Handle, AllocError>;
    fn free(&mut self, h: Self::Handle, stream: u32) -> Result<(), AllocError>;
    fn create_stream(&mut self) -> Result<u32, AllocError>;
    fn reserved(&self) -> u64;
    fn peak_reserved(&self) -> u64;
    fn device_allocs(&self) -> u64;
    fn device_frees(&self) -> u64;
    /// `(free bytes, largest free block)` now.
    fn free_and_largest(&self) -> (u64, u64);
    fn device_time_us(&self) -> f64;
    fn advance_us(&mut self, us: f64);
    fn check(&self) -> Result<(), AllocError> {
        Ok(())
    }
    fn extra(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// An iteration boundary of the trace.
    fn iteration_boundary(&mut self) {}
    /// Device calls made ahead of need (following a forecast) and their host time.
    fn ahead(&self) -> (u64, f64) {
        (0, 0.0)
    }
    fn forecaster(&self) -> &'static str {
        "none"
    }
    /// Pages released plus pages backed again so far (page release).
    fn pages_moved(&self) -> u64 {
        0
    }
}

impl<B: DeviceBackend> ReplayTarget for Allocator<B> {
    type Handle = Allocation;
    fn alloc(&mut self, bytes: u64, stream: u32) -> Result<Allocation, AllocError> {
        self.allocate(bytes, stream)
    }
    fn free(&mut self, h: Allocation, stream: u32) -> Result<(), AllocError> {
        self.deallocate(h, stream)
    }
    fn create_stream(&mut self) -> Result<u32, AllocError> {
        Allocator::create_stream(self, StreamPriority::Normal)
    }
    fn reserved(&self) -> u64 {
        self.stats().reserved.current
    }
    fn peak_reserved(&self) -> u64 {
        self.stats().reserved.peak
    }
    fn device_allocs(&self) -> u64 {
        self.stats().device_allocs
    }
    fn device_frees(&self) -> u64 {
        self.stats().device_frees
    }
    fn free_and_largest(&self) -> (u64, u64) {
        Allocator::free_and_largest(self)
    }
    fn device_time_us(&self) -> f64 {
        self.backend().stall_us()
    }
    fn advance_us(&mut self, us: f64) {
        self.backend_mut().advance_us(us)
    }
    fn check(&self) -> Result<(), AllocError> {
        self.check_invariants()
    }
    fn iteration_boundary(&mut self) {
        Allocator::iteration_boundary(self)
    }
    fn ahead(&self) -> (u64, f64) {
        (
            self.stats().ahead_device_calls,
            self.stats().ahead_device_us,
        )
    }
    fn forecaster(&self) -> &'static str {
        self.online().map_or("none", |o| o.forecaster())
    }
    fn pages_moved(&self) -> u64 {
        self.stats().pages_released + self.stats().pages_backed
    }
    fn extra(&self) -> serde_json::Value {
        let s = self.stats();
        serde_json::json!({
            "internal_waste_at_peak": s.internal_waste_at_peak,
            "cache_hits": s.cache_hits,
            "cache_flushes": s.cache_flushes,
            "slab_allocs": s.slab_allocs,
            "slabs_carved": s.slabs_carved,
            "oom_retries": s.oom_retries,
            "alloc_latency_p50_ns": s.latency.quantile_ns(0.5),
            "alloc_latency_p99_ns": s.latency.quantile_ns(0.99),
            "forecasts_used": s.forecasts_used,
            "advice_applied": s.advice_applied,
            "ahead_device_us": s.ahead_device_us,
            "pages_released": s.pages_released,
            "pages_backed": s.pages_backed,
            "placement": self.placement_stats(),
            "config": self.config(),
        })
    }
}

/// Replays `trace` with `opts`.
pub fn replay(trace: &Trace, opts: &ReplayOptions) -> Result<ReplayReport, ReplayError> {
    opts.costs.validate().map_err(ReplayError::Costs)?;
    let mut o = opts.clone();
    if o.host_capacity == 0 {
        o.host_capacity = memcast_trace::stats::peaks(trace).requested / 2 * 3 + (1 << 30);
    }
    let opts = &o;
    let r = match (opts.policy, opts.device) {
        (_, Device::Cuda) => cuda::replay(trace, opts)?,
        (Policy::Memcast, Device::Sim) => {
            let b = SimBackend::new(opts.sim_capacity, opts.costs.clone());
            let a = Allocator::new(b, memcast_config(opts)).map_err(ReplayError::Setup)?;
            run(trace, a, opts)?
        }
        (Policy::Memcast, Device::Host) => {
            let a = Allocator::new(HostBackend::new(opts.host_capacity), memcast_config(opts))
                .map_err(ReplayError::Setup)?;
            run(trace, a, opts)?
        }
        (Policy::Predictive, Device::Sim) => {
            let b = SimBackend::new(opts.sim_capacity, opts.costs.clone());
            run(trace, predictive_allocator(trace, b, opts)?, opts)?
        }
        (Policy::Predictive, Device::Host) => {
            let b = HostBackend::new(opts.host_capacity);
            run(trace, predictive_allocator(trace, b, opts)?, opts)?
        }
        (Policy::Pytorch, Device::Sim) => {
            let b = SimBackend::new(opts.sim_capacity, opts.costs.clone());
            let emu = pytorch::PytorchEmu::new(b, opts.pytorch.clone());
            run_warm(trace, emu, opts, opts.pytorch.warmup_plan(trace).as_ref())?
        }
        (Policy::Pytorch, Device::Host) => {
            let b = HostBackend::new(opts.host_capacity);
            let emu = pytorch::PytorchEmu::new(b, opts.pytorch.clone());
            run_warm(trace, emu, opts, opts.pytorch.warmup_plan(trace).as_ref())?
        }
        (Policy::Naive, Device::Sim) => {
            let b = SimBackend::new(opts.sim_capacity, opts.costs.clone());
            run(trace, naive::Naive::new(b), opts)?
        }
        (Policy::Naive, Device::Host) => run(
            trace,
            naive::Naive::new(HostBackend::new(opts.host_capacity)),
            opts,
        )?,
    };
    Ok(r)
}

/// The settings of `Policy::Memcast`'s allocator: `opts.config`, which may switch
/// predictive mode on (`predictive:true`); then, as under `Policy::Predictive`, its
/// forecasts are made inline and in step unless the replay runs in real time, so that
/// a replay's figures do not depend on how fast a forecast thread ran.
pub(crate) fn memcast_config(opts: &ReplayOptions) -> AllocConfig {
    let mut cfg = opts.config.clone();
    cfg.forecast_thread &= opts.real_time;
    cfg
}

/// The allocator of a predictive replay: `opts.config` in predictive mode over
/// `opts.forecaster`; inline and in step (deterministic figures: every forecast is
/// read as soon as its step closes) unless the replay runs in real time
/// (`ReplayOptions::real_time`), where the forecast thread is kept as configured.
pub fn predictive_allocator<B: DeviceBackend>(
    trace: &Trace,
    backend: B,
    opts: &ReplayOptions,
) -> Result<Allocator<B>, ReplayError> {
    let fail = ReplayError::Setup;
    let mut cfg = opts.config.clone();
    cfg.predictive = true;
    cfg.forecast_thread &= opts.real_time;
    let forecaster = opts
        .forecaster
        .build(&cfg, || allocator_events(trace))
        .map_err(fail)?;
    let presplit = cfg.predictive_actions.presplit;
    let mut a = Allocator::with_forecaster(backend, cfg, forecaster).map_err(fail)?;
    if presplit && opts.forecaster == ReplayForecaster::Oracle {
        // The oracle's forecast of every iteration: the trace itself, exact.
        a.set_placement_profile(trace).map_err(fail)?;
    }
    Ok(a)
}

/// The event codes a replay's allocator records, in order: the static blocks'
/// allocations, then the trace's allocations, frees and boundaries (what the oracle
/// reads as the true future). Zero-byte tensors are left out: the replay never hands
/// them to the allocator.
pub fn allocator_events(trace: &Trace) -> Vec<memcast_predictor::forecaster::Code> {
    trace_codes(trace, true)
}

/// The trace's allocations (static blocks first), frees and boundaries as event codes;
/// with `skip_empty`, without zero-byte tensors (which a tier manager never registers).
/// A free of a tensor never allocated is left out.
pub fn trace_codes(trace: &Trace, skip_empty: bool) -> Vec<memcast_predictor::forecaster::Code> {
    use memcast_predictor::forecaster::{encode_alloc, encode_free, BOUNDARY};
    let mut sizes: FxMap<u64, u64> = FxMap::default();
    let mut out = Vec::with_capacity(trace.static_blocks.len() + trace.events.len());
    let alloc = |id: u64, bytes: u64, sizes: &mut FxMap<u64, u64>, out: &mut Vec<_>| {
        if bytes > 0 || !skip_empty {
            sizes.insert(id, bytes);
            out.push(encode_alloc(bytes));
        }
    };
    for b in &trace.static_blocks {
        alloc(b.id, b.bytes, &mut sizes, &mut out);
    }
    for e in &trace.events {
        match e.kind {
            EventKind::Alloc { id, bytes, .. } => alloc(id, bytes, &mut sizes, &mut out),
            EventKind::Free { id } => {
                if let Some(b) = sizes.remove(&id) {
                    out.push(encode_free(b));
                }
            }
            EventKind::IterationBoundary => out.push(BOUNDARY),
            EventKind::Access { .. } => {}
        }
    }
    out
}
