//! Allocator configuration: a serde struct with documented defaults, and the
//! `MEMCAST_ALLOC_CONF` environment string (`key:value,key:value`, like PyTorch's
//! `PYTORCH_CUDA_ALLOC_CONF`). Sizes accept `B`, `K`/`KiB`, `M`/`MiB`, `G`/`GiB`.
//!
//! Every default below was chosen by measurement on the shared traces; docs/allocator.md
//! has the numbers behind them.

use serde::{Deserialize, Serialize};

use crate::error::AllocError;

/// When free blocks are merged back with their buddies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Coalesce {
    /// Merge on every free (no cache of freed runs).
    Immediate,
    /// Keep freed runs whole in a per-stream cache keyed by size (reused as they are by
    /// a request of the same rounded size, O(1)); merge them all on the first request
    /// the cache cannot serve exactly (so placement always sees every free byte), or
    /// when it holds more than `cache_max_runs` runs or `cache_max_fraction` of
    /// reserved bytes.
    Deferred,
}

/// When the whole free pages inside a growable large-run segment give their physical
/// memory back (page release, docs/allocator.md "Page release").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PageRelease {
    /// Never: a free block keeps its pages until the segment's tail is released.
    Off,
    /// When the device is out of memory (and on `empty_cache`), with the caches and the
    /// free tails: what the out-of-memory retry gives back then includes every whole
    /// free page inside the segments.
    OnOom,
    /// Whenever the device would otherwise have to provide memory beyond the peak
    /// reserved so far: reserved memory stays at the peak of the pages that hold data,
    /// at the cost of device calls (unmap, after waiting for the pool's stream, and map)
    /// as the pages in use move. Under best fit they move every iteration; with
    /// `Placement::Planned` (or a placement profile) they stop once a plan that fits the
    /// peak places a repeating loop.
    Peak,
}

/// When completely free segments go back to the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Release {
    /// Keep them (PyTorch's default); released only to retry after an out-of-memory.
    OnOom,
    /// Release a segment as soon as it is completely free (after coalescing).
    Immediate,
}

/// Where large runs go (see `placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Best fit (or buddy order, `best_fit:false`) at each request: the past only.
    BestFit,
    /// The offsets the last iteration's plan gives (learned at
    /// `Allocator::iteration_boundary`), best fit where it has none or its range is
    /// taken.
    Planned,
}

/// The allocator's knobs. `AllocConfig::default()` is what `memcast` uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AllocConfig {
    /// Minimum block and alignment of every allocation, bytes (power of two >= 256).
    pub min_block: u64,
    /// Requests below this go to size-class slabs; larger ones to the buddy runs.
    pub small_max: u64,
    /// Size classes per power of two for slab objects (1, 2, 4 or 8); 4 bounds the
    /// rounding waste at 25% (mean ~10%) of small objects' bytes.
    pub classes_per_doubling: u32,
    /// Minimum bytes of one slab.
    pub slab_min_bytes: u64,
    /// Objects per slab, at least (a slab is `max(slab_min_bytes, objects x class)`
    /// rounded up to the minimum block).
    pub slab_objects: u64,
    /// Empty slabs kept per size class (and stream) instead of going back to the buddy
    /// tree: churn near a slab boundary would otherwise carve and free a slab every
    /// few operations. They are given back by `coalesce`, `empty_cache` and on OOM.
    pub slab_spares: u32,
    /// Device segments are multiples of this (the GPU page: 2 MiB).
    pub segment_granule: u64,
    /// Use one growable (virtually contiguous) segment per stream when the backend
    /// supports it, instead of fixed segments.
    pub growable_segments: bool,
    /// When the whole pages (`segment_granule`) inside free blocks of a growable
    /// large-run segment give their physical memory back; a released page is backed
    /// again when a run is placed over it. Placement is the same whatever the setting;
    /// only how much physical memory stands behind the free blocks changes. Needs a
    /// backend with `supports_page_release` (sim, host, cuda) and best-fit placement.
    pub page_release: PageRelease,
    /// Growth schedule: a new segment (or growth) is at least
    /// `clamp(reserved * (growth_factor - 1), growth_initial, growth_cap)` bytes, and at
    /// least the deficit of the request that missed, rounded up to the granule.
    pub growth_initial: u64,
    pub growth_factor: f64,
    pub growth_cap: u64,
    /// A miss within this many allocations of the previous growth is part of a burst
    /// and grows by the schedule (halved per burst); an isolated one by its deficit
    /// only. `u64::MAX` = always the schedule (classic doubling with factor 2).
    pub growth_burst_window: u64,
    /// Growth chunk of the small-object (slab) segments, at least the deficit; 0 = the
    /// same schedule as the large-run segments. 8 MiB: the smallest that costs no
    /// device allocation on any shared trace (docs/allocator.md).
    pub growth_small_chunk: u64,
    /// Deferred or immediate coalescing of freed runs.
    pub coalesce: Coalesce,
    /// Deferred coalescing: merge the cache when it holds more runs than this.
    pub cache_max_runs: u64,
    /// Deferred coalescing: merge the cache when it holds more than this fraction of
    /// reserved bytes.
    pub cache_max_fraction: f64,
    /// Release policy for completely free segments.
    pub release: Release,
    /// Where a run goes: best fit over coalesced free extents (`true`), or the classic
    /// buddy choice, the smallest free block of a sufficient order (`false`).
    pub best_fit: bool,
    /// Large runs by best fit alone, or planned from the last iteration
    /// (`placement:best_fit|planned`; docs/allocator.md).
    pub placement: Placement,
    /// A recorded run of the same job (a trace file) whose plan places every large
    /// run from the first allocation on (`placement_profile:PATH`; implies
    /// `placement:planned`).
    pub placement_profile: Option<String>,
    /// Buddy placement only: how many free blocks of the floor order are tried for a run that straddles two
    /// buddies before splitting a larger block (a bounded best-fit search).
    pub run_scan: u32,
    /// Sample the allocation latency histogram every N allocations (0 = off). A timed
    /// allocation costs ~50 ns more on the development machine (two clock reads): every
    /// 64th added ~0.8 ns (~2%) to a bench alloc+free pair, every 1024th adds 0.05 ns.
    pub latency_sample_every: u32,
    /// Upper bound on one request, bytes (0 = the device capacity).
    pub max_request: u64,
    /// Predictive mode: the allocator feeds its allocations, frees and iteration
    /// boundaries to a forecaster and acts on its forecasts (see `predictive`).
    /// Default false (reactive).
    pub predictive: bool,
    /// Predictive mode: which forecaster (`lstm`, `seasonal`, `none`). Default `lstm`.
    pub forecaster: ForecasterKind,
    /// Predictive mode: the LSTM artifact directory or `.safetensors` file; `None` =
    /// the default model compiled into the library.
    pub model: Option<String>,
    /// Predictive mode: steps forecast ahead (0 = the model's; at most 8).
    pub horizon: u32,
    /// Predictive mode: which actions the forecast drives.
    pub predictive_actions: Actions,
    /// Predictive mode: run the forecaster on its own thread (`true`, the default: the
    /// allocation path only hands over chunks of events) or inline at each chunk
    /// (`false`: deterministic, what replay uses unless it runs in real time).
    pub forecast_thread: bool,
}

/// Which forecaster predictive mode runs (the oracle is replay-only and chosen there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ForecasterKind {
    /// The embedded LSTM (`model`, or the default model).
    #[default]
    Lstm,
    /// The featurizer's copy-and-rescale base, no learning.
    Seasonal,
    /// No forecast: predictive bookkeeping with reactive behaviour (for ablation).
    None,
}

impl std::str::FromStr for ForecasterKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lstm" => Ok(ForecasterKind::Lstm),
            "seasonal" => Ok(ForecasterKind::Seasonal),
            "none" => Ok(ForecasterKind::None),
            _ => Err(format!("unknown forecaster {s:?} (lstm, seasonal, none)")),
        }
    }
}

/// The actions a forecast drives in predictive mode, each switchable for ablation.
/// In a conf string: `predictive_actions:grow+release` (`+`-separated; `all`; `none`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Actions {
    /// Grow before a forecast rise (off the request path), and size growth at a miss
    /// by the forecast peak.
    pub grow: bool,
    /// Keep runs of the forecast sizes ready: planned placement (`placement:planned`,
    /// docs/allocator.md), which lays out each large run of the next iteration at an
    /// offset chosen for the whole iteration's requests, exact to the byte, so that
    /// they are served without splitting or merging around them and survive every
    /// cache flush. Its forecast of the next iteration is the last one of the run, or,
    /// with the oracle forecaster in replay, the trace's true future (a profile of the
    /// whole trace). The LSTM's per-group forecast gives no exact sizes, so it does not
    /// drive this action.
    #[serde(default)]
    pub presplit: bool,
    /// Give free memory back after a peak when the forecast says the horizon will not
    /// need it.
    pub release: bool,
    /// Under a budget (tiers): spill ahead of a forecast peak, victims by next use.
    pub spill: bool,
    /// Under a budget (tiers): prefetch spilled tensors as early as forecast free
    /// memory allows, predict the reads of an iteration longer than the previous one,
    /// and in the first iteration follow the reads that bring tensors back.
    pub prefetch: bool,
    /// Under a budget (tiers): carry out an iteration plan (which tensors leave, when,
    /// and when they come back) built from the previous iteration's trajectory.
    pub plan: bool,
    /// Under a budget (tiers): drop a victim whose producer and recompute cost are known
    /// instead of spilling it when recomputing it is cheaper than the link time its
    /// spill would not hide, and plan drops for gaps too short to hide their copies.
    pub recompute: bool,
}

impl Default for Actions {
    /// `grow`, `spill`, `prefetch`, `plan` and `recompute`; `presplit` is off (planned
    /// placement learned in the run changes little and costs host time on the
    /// allocation path: docs/predictive.md, docs/allocator.md); `release` is off (like
    /// PyTorch, memory is kept once obtained unless asked: see docs/predictive.md for
    /// what release costs). `plan` was chosen on the corpus's validation split (mean
    /// stall overhead at 60% of peak: 0.591 with it, 0.614 without; docs/predictive.md).
    /// `recompute` acts only on traces that give producers and recompute costs, which
    /// the corpus does not (its replays are the same with it); it was chosen on the
    /// synthetic BERT and MobileNet presets at 60% (geometric mean stall overhead 3.25
    /// without it, 2.70 with it; docs/predictive.md).
    fn default() -> Self {
        Actions {
            grow: true,
            presplit: false,
            release: false,
            spill: true,
            prefetch: true,
            plan: true,
            recompute: true,
        }
    }
}

impl Actions {
    pub const NAMES: [&'static str; 7] = [
        "grow",
        "presplit",
        "release",
        "spill",
        "prefetch",
        "plan",
        "recompute",
    ];

    pub fn none() -> Self {
        Actions {
            grow: false,
            presplit: false,
            release: false,
            spill: false,
            prefetch: false,
            plan: false,
            recompute: false,
        }
    }
    pub fn all() -> Self {
        Actions {
            grow: true,
            presplit: true,
            release: true,
            spill: true,
            prefetch: true,
            plan: true,
            recompute: true,
        }
    }
    /// `grow+release`, `all`, `none`.
    pub fn parse(s: &str) -> Result<Self, AllocError> {
        let mut a = Actions::none();
        for w in s.split(['+', '|']).map(str::trim) {
            match w {
                "" => {
                    return Err(AllocError::Config(format!(
                        "predictive_actions: {s:?} names an empty action (join names with +; none for no action)"
                    )))
                }
                "all" => a = Actions::all(),
                "none" => {}
                "grow" => a.grow = true,
                "presplit" => a.presplit = true,
                "release" => a.release = true,
                "spill" => a.spill = true,
                "prefetch" => a.prefetch = true,
                "plan" => a.plan = true,
                "recompute" => a.recompute = true,
                _ => {
                    return Err(AllocError::Config(format!(
                        "predictive_actions: unknown action {w:?} (grow, presplit, release, spill, prefetch, plan, recompute, all, none)"
                    )))
                }
            }
        }
        Ok(a)
    }
    /// The `+`-joined names of the actions on (`none` if none).
    pub fn label(&self) -> String {
        let on = [
            self.grow,
            self.presplit,
            self.release,
            self.spill,
            self.prefetch,
            self.plan,
            self.recompute,
        ];
        let v: Vec<&str> = Self::NAMES
            .iter()
            .zip(on)
            .filter(|(_, o)| *o)
            .map(|(n, _)| *n)
            .collect();
        if v.is_empty() {
            "none".into()
        } else {
            v.join("+")
        }
    }
}

impl Default for AllocConfig {
    fn default() -> Self {
        AllocConfig {
            min_block: 256,
            small_max: 64 << 10,
            classes_per_doubling: 4,
            slab_min_bytes: 64 << 10,
            slab_objects: 8,
            slab_spares: 4,
            segment_granule: 2 << 20,
            growable_segments: true,
            page_release: PageRelease::OnOom,
            growth_initial: 32 << 20,
            growth_factor: 1.0,
            growth_cap: 1 << 30,
            growth_burst_window: u64::MAX,
            growth_small_chunk: 8 << 20,
            coalesce: Coalesce::Deferred,
            cache_max_runs: 4096,
            cache_max_fraction: 0.5,
            release: Release::OnOom,
            best_fit: true,
            placement: Placement::BestFit,
            placement_profile: None,
            run_scan: 16,
            latency_sample_every: 1024,
            max_request: 0,
            predictive: false,
            forecaster: ForecasterKind::Lstm,
            model: None,
            horizon: 0,
            predictive_actions: Actions::default(),
            forecast_thread: true,
        }
    }
}

/// The keys a conf string may set.
pub const KEYS: [&str; 30] = [
    "min_block",
    "small_max",
    "classes_per_doubling",
    "slab_min_bytes",
    "slab_objects",
    "slab_spares",
    "segment_granule",
    "growable_segments",
    "page_release",
    "growth_initial",
    "growth_factor",
    "growth_cap",
    "growth_burst_window",
    "growth_small_chunk",
    "coalesce",
    "cache_max_runs",
    "cache_max_fraction",
    "release",
    "best_fit",
    "placement",
    "placement_profile",
    "run_scan",
    "latency_sample_every",
    "max_request",
    "predictive",
    "forecaster",
    "model",
    "horizon",
    "predictive_actions",
    "forecast_thread",
];

/// The keys only predictive mode reads (`predictive` itself switches it on).
pub const PREDICTIVE_KEYS: [&str; 5] = [
    "forecaster",
    "model",
    "horizon",
    "predictive_actions",
    "forecast_thread",
];

/// `path: error`, where `error` does not already begin with `path` (file errors name
/// their file): a path said once.
pub(crate) fn named(path: &str, e: &impl std::fmt::Display) -> String {
    let e = e.to_string();
    if e.starts_with(path) {
        e
    } else {
        format!("{path}: {e}")
    }
}

/// Parses `12345`, `2M`, `2MiB`, `1.5G`, `64K`, `1e9` into bytes (units are powers of
/// 1024). A count of bytes must be whole: `1.5` alone is refused (`1.5K` is 1536); sizes
/// of 2^64 bytes or more are refused rather than saturated.
pub fn parse_bytes(s: &str) -> Result<u64, AllocError> {
    let t = s.trim();
    // The unit is the trailing run of letters, so `1e9` is a number without a unit.
    let split = t
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_ascii_alphabetic())
        .last()
        .map_or(t.len(), |(i, _)| i);
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        "p" | "pb" | "pib" => 1 << 50,
        _ => {
            return Err(AllocError::Config(format!(
                "{s:?}: unknown unit {unit:?} (B, K, M, G, T or P; KiB, MB and the like also work)"
            )))
        }
    };
    let too_large = || {
        AllocError::Config(format!(
            "{s:?} is 2^64 bytes or more, beyond any size memcast can count"
        ))
    };
    // A whole number is counted exactly (through f64, 2^64 - 1 would round to 2^64).
    if let Ok(n) = num.trim().parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(too_large);
    }
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| AllocError::Config(format!("{s:?} is not a size (e.g. 4096, 512K, 1.5G)")))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(AllocError::Config(format!(
            "{s:?}: a size must be a finite number >= 0"
        )));
    }
    let bytes = v * mult as f64;
    if bytes >= 18_446_744_073_709_551_616.0 {
        return Err(too_large());
    }
    if mult == 1 && v.fract() != 0.0 {
        return Err(AllocError::Config(format!(
            "{s:?}: a count of bytes must be whole (or give a unit: 1.5K)"
        )));
    }
    Ok(bytes.round() as u64)
}

impl AllocConfig {
    /// Reads `MEMCAST_ALLOC_CONF` over the defaults (unset = defaults).
    pub fn from_env() -> Result<Self, AllocError> {
        match std::env::var("MEMCAST_ALLOC_CONF") {
            Ok(s) => Self::default().with_conf_string(&s),
            Err(_) => Ok(Self::default()),
        }
    }

    /// Applies a `key:value,key:value` string over `self`, then validates.
    pub fn with_conf_string(mut self, conf: &str) -> Result<Self, AllocError> {
        let mut seen = std::collections::HashSet::new();
        for item in conf.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = item
                .split_once(':')
                .ok_or_else(|| AllocError::Config(format!("expected key:value, got {item:?}")))?;
            let (k, v) = (k.trim(), v.trim());
            if !seen.insert(k) {
                return Err(AllocError::Config(format!(
                    "{k} is given twice (in {conf:?}): give each key once"
                )));
            }
            if v.is_empty() {
                return Err(AllocError::Config(format!("{k}: no value (in {item:?})")));
            }
            let parse_bytes = |v: &str| -> Result<u64, AllocError> {
                parse_bytes(v).map_err(|e| match e {
                    AllocError::Config(m) => AllocError::Config(format!("{k}: {m}")),
                    e => e,
                })
            };
            let num = |v: &str| -> Result<f64, AllocError> {
                v.parse::<f64>()
                    .map_err(|_| AllocError::Config(format!("{k}: bad number {v:?}")))
            };
            let boolean = |v: &str| -> Result<bool, AllocError> {
                match v {
                    "true" | "True" | "1" => Ok(true),
                    "false" | "False" | "0" => Ok(false),
                    _ => Err(AllocError::Config(format!(
                        "{k}: expected a bool, got {v:?}"
                    ))),
                }
            };
            let int = |v: &str| -> Result<u64, AllocError> {
                v.parse::<u64>()
                    .map_err(|_| AllocError::Config(format!("{k}: bad integer {v:?}")))
            };
            // A 32-bit field: a value beyond it is an error, not cut to its low bits.
            let int32 = |v: &str| -> Result<u32, AllocError> {
                u32::try_from(int(v)?).map_err(|_| {
                    AllocError::Config(format!(
                        "{k}: {v} is above the most it takes ({})",
                        u32::MAX
                    ))
                })
            };
            match k {
                "min_block" => self.min_block = parse_bytes(v)?,
                "small_max" => self.small_max = parse_bytes(v)?,
                "classes_per_doubling" => self.classes_per_doubling = int32(v)?,
                "slab_min_bytes" => self.slab_min_bytes = parse_bytes(v)?,
                "slab_objects" => self.slab_objects = int(v)?,
                "slab_spares" => self.slab_spares = int32(v)?,
                "segment_granule" => self.segment_granule = parse_bytes(v)?,
                "growable_segments" => self.growable_segments = boolean(v)?,
                "page_release" => {
                    self.page_release = match v {
                        "off" => PageRelease::Off,
                        "on_oom" => PageRelease::OnOom,
                        "peak" => PageRelease::Peak,
                        _ => return Err(AllocError::Config(format!("{k}: off|on_oom|peak"))),
                    }
                }
                "growth_initial" => self.growth_initial = parse_bytes(v)?,
                "growth_factor" => self.growth_factor = num(v)?,
                "growth_cap" => self.growth_cap = parse_bytes(v)?,
                "growth_burst_window" => self.growth_burst_window = int(v)?,
                "growth_small_chunk" => self.growth_small_chunk = parse_bytes(v)?,
                "placement" => {
                    self.placement = match v {
                        "best_fit" => Placement::BestFit,
                        "planned" => Placement::Planned,
                        _ => return Err(AllocError::Config(format!("{k}: best_fit|planned"))),
                    }
                }
                "placement_profile" => {
                    self.placement_profile = (!v.is_empty()).then(|| v.to_string());
                    if self.placement_profile.is_some() {
                        self.placement = Placement::Planned;
                    }
                }
                "coalesce" => {
                    self.coalesce = match v {
                        "immediate" => Coalesce::Immediate,
                        "deferred" => Coalesce::Deferred,
                        _ => return Err(AllocError::Config(format!("{k}: immediate|deferred"))),
                    }
                }
                "cache_max_runs" => self.cache_max_runs = int(v)?,
                "cache_max_fraction" => self.cache_max_fraction = num(v)?,
                "release" => {
                    self.release = match v {
                        "on_oom" => Release::OnOom,
                        "immediate" => Release::Immediate,
                        _ => return Err(AllocError::Config(format!("{k}: on_oom|immediate"))),
                    }
                }
                "best_fit" => self.best_fit = boolean(v)?,
                "run_scan" => self.run_scan = int32(v)?,
                "latency_sample_every" => self.latency_sample_every = int32(v)?,
                "max_request" => self.max_request = parse_bytes(v)?,
                "predictive" => self.predictive = boolean(v)?,
                "forecaster" => self.forecaster = v.parse().map_err(AllocError::Config)?,
                "model" => self.model = Some(v.to_string()),
                "horizon" => self.horizon = int32(v)?,
                "predictive_actions" => self.predictive_actions = Actions::parse(v)?,
                "forecast_thread" => self.forecast_thread = boolean(v)?,
                _ => {
                    return Err(AllocError::Config(format!(
                        "unknown key {k:?} (valid: {})",
                        KEYS.join(", ")
                    )))
                }
            }
        }
        self.validate()?;
        Ok(self)
    }

    /// Checks the values make sense together.
    pub fn validate(&self) -> Result<(), AllocError> {
        let bad = |m: String| Err(AllocError::Config(m));
        if !self.min_block.is_power_of_two() || self.min_block < 256 {
            return bad(format!(
                "min_block {} must be a power of two >= 256",
                self.min_block
            ));
        }
        if !self.segment_granule.is_power_of_two() {
            return bad(format!(
                "segment_granule {} must be a power of two",
                self.segment_granule
            ));
        }
        if self.segment_granule < self.min_block {
            return bad(format!(
                "min_block {} is larger than segment_granule {}: a block cannot exceed the segment it is cut from (raise segment_granule as well, or lower min_block)",
                self.min_block, self.segment_granule
            ));
        }
        if self.small_max > self.segment_granule {
            return bad(format!(
                "small_max {} must not exceed segment_granule {}",
                self.small_max, self.segment_granule
            ));
        }
        if ![1, 2, 4, 8].contains(&self.classes_per_doubling) {
            return bad("classes_per_doubling must be 1, 2, 4 or 8".into());
        }
        if self.slab_objects == 0 {
            return bad("slab_objects must be >= 1".into());
        }
        if !(self.growth_factor >= 1.0 && self.growth_factor.is_finite()) {
            return bad(format!("growth_factor {} must be >= 1", self.growth_factor));
        }
        if self.growth_cap < self.growth_initial {
            return bad(format!(
                "growth_cap {} must be >= growth_initial {} (default 32M)",
                self.growth_cap, self.growth_initial
            ));
        }
        if !(0.0..=1.0).contains(&self.cache_max_fraction) {
            return bad("cache_max_fraction must be within [0, 1]".into());
        }
        if self.horizon as usize > memcast_predictor::MAX_HORIZON {
            return bad(format!(
                "horizon {} above the most any model forecasts ({})",
                self.horizon,
                memcast_predictor::MAX_HORIZON
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conf_string_overrides_defaults() {
        let c = AllocConfig::default()
            .with_conf_string(
                "small_max:512K, growth_factor:1.5,coalesce:immediate,growable_segments:true",
            )
            .unwrap();
        assert_eq!(c.small_max, 512 << 10);
        assert_eq!(c.growth_factor, 1.5);
        assert_eq!(c.coalesce, Coalesce::Immediate);
        assert!(c.growable_segments);
        assert!(AllocConfig::default().with_conf_string("nope:1").is_err());
        assert!(AllocConfig::default()
            .with_conf_string("min_block:100")
            .is_err());
        assert!(AllocConfig::default()
            .with_conf_string("small_max")
            .is_err());
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 << 29);
        assert!(parse_bytes("-1M").is_err());
        assert_eq!(parse_bytes("1e9").unwrap(), 1_000_000_000);
        assert!(parse_bytes("1e308")
            .unwrap_err()
            .to_string()
            .contains("2^64"));
        assert!(parse_bytes("1.5")
            .unwrap_err()
            .to_string()
            .contains("whole"));
        assert!(parse_bytes("3Q")
            .unwrap_err()
            .to_string()
            .contains("unknown unit"));
    }

    #[test]
    fn conf_string_mistakes_name_the_key() {
        let e = |conf: &str| {
            AllocConfig::default()
                .with_conf_string(conf)
                .unwrap_err()
                .to_string()
        };
        assert!(
            e("min_block:512,growth_initial:abc").contains("growth_initial: \"abc\": unknown unit")
        );
        let whole = e("growth_cap:1.5");
        assert!(
            whole.contains("growth_cap: \"1.5\": a count of bytes must be whole"),
            "{whole}"
        );
        assert!(e("growth_cap:,min_block:512").contains("growth_cap: no value"));
        assert!(e("min_block:512,min_block:1K").contains("min_block is given twice"));
        for bad in ["predictive_actions:+", "predictive_actions:grow++spill"] {
            assert!(
                e(bad).contains("names an empty action"),
                "{bad}: {}",
                e(bad)
            );
        }
        let c = AllocConfig::default()
            .with_conf_string("predictive_actions:none")
            .unwrap();
        assert_eq!(c.predictive_actions, Actions::none());
        // A 32-bit key given more than it holds is an error, not its low bits (it read
        // horizon:4294967301 as 5).
        for key in [
            "horizon",
            "run_scan",
            "latency_sample_every",
            "slab_spares",
            "classes_per_doubling",
        ] {
            let m = e(&format!("{key}:4294967301"));
            assert!(
                m.contains(&format!("{key}: 4294967301 is above the most it takes")),
                "{m}"
            );
        }
        assert!(
            e("growth_cap:2M").contains("growth_cap 2097152 must be >= growth_initial 33554432"),
            "{}",
            e("growth_cap:2M")
        );
    }

    #[test]
    fn predictive_keys_are_keys() {
        for k in PREDICTIVE_KEYS {
            assert!(KEYS.contains(&k), "{k}");
        }
    }

    #[test]
    fn config_round_trips_through_json() {
        let c = AllocConfig::default();
        let j = serde_json::to_string(&c).unwrap();
        let back: AllocConfig = serde_json::from_str(&j).unwrap();
        assert_eq!(c, back);
    }
}
