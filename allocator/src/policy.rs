//! Policies: the decisions the allocator's mechanisms leave open.
//!
//! The mechanisms (buddy trees, slabs, caches, segments) are structs in `pool.rs`; every
//! choice that a forecast could improve goes through a trait here, so that predictive
//! mode is a different policy object, never a fork of the core:
//!
//! - [`GrowthPolicy`]: how much device memory to obtain when a request finds no room;
//! - [`ReleasePolicy`]: whether a completely free segment (or the free tail of a
//!   growable one) goes back to the device;
//! - [`Advice`] (applied with `Allocator::apply_advice`): what a forecaster asks for
//!   ahead of time — grow before a predicted peak, pre-split blocks of predicted sizes,
//!   release memory a predicted trough will not need. Advice is only advice: the
//!   allocator checks it and does only what is safe.
//!
//! The reactive defaults ([`ReactiveGrowth`], [`KeepUntilOom`]) know only the past.

use serde::{Deserialize, Serialize};

use crate::backend::StreamId;

/// What the allocator knows when it must obtain memory.
#[derive(Debug, Clone, Copy)]
pub struct GrowthRequest {
    pub stream: StreamId,
    /// The request that missed (rounded).
    pub request: u64,
    /// Bytes the device must add for the request to fit (`request` for a new fixed
    /// segment; less when a growable segment's free tail already covers part of it).
    pub deficit: u64,
    /// Reserved and allocated bytes now (all streams).
    pub reserved: u64,
    pub allocated: u64,
    /// Highest reserved so far.
    pub peak_reserved: u64,
    /// Allocations served so far (a clock for the policy).
    pub allocs: u64,
    /// Device granularity; the answer is rounded up to it.
    pub granule: u64,
    /// Device bytes still available.
    pub available: u64,
    /// True for a growable segment's growth, false for a new fixed segment.
    pub growable: bool,
    /// True if the memory is for small-object slabs (the small segments), false for
    /// large runs.
    pub small: bool,
    /// True when the growth follows advice (ahead of need), false at a miss.
    pub ahead: bool,
}

/// Decides how many bytes to obtain from the device for a miss.
pub trait GrowthPolicy: Send {
    /// Bytes to add (>= `deficit`; rounded up to the granule and capped at `available`
    /// by the caller).
    fn grow_bytes(&mut self, r: &GrowthRequest) -> u64;
}

/// The reactive schedule. A miss obtains at least its deficit (rounded to the granule).
/// Misses come in bursts (the first forward pass of a job, a new larger input shape);
/// within a burst — a miss less than `burst_window` allocations after the previous one —
/// the growth is at least `chunk = clamp(reserved * (factor - 1), initial, cap)`, so a
/// burst of small misses costs few device calls; the chunk halves with every new burst,
/// so that later growth (near the job's true peak) overshoots less. An isolated miss
/// gets exactly its deficit. `factor = 2, burst_window = u64::MAX` is the classic
/// doubling; docs/allocator.md has the measurements behind the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ReactiveGrowth {
    pub initial: u64,
    pub factor: f64,
    pub cap: u64,
    pub burst_window: u64,
    /// Chunk of the small-object (slab) segments (`None` = the large runs' schedule).
    /// Slab segments grow in small steps and their growth is not worth a large chunk:
    /// with 32 MiB, most of the last chunk stayed unused at the peak
    /// (docs/allocator.md measures 2, 4, 8, 16 and 32 MiB).
    #[serde(default)]
    pub small_chunk: Option<u64>,
    /// State: allocation clock at the last growth, and bursts seen.
    #[serde(skip)]
    pub last: Option<u64>,
    #[serde(skip)]
    pub bursts: u32,
}

impl ReactiveGrowth {
    pub fn new(initial: u64, factor: f64, cap: u64, burst_window: u64) -> Self {
        ReactiveGrowth {
            initial,
            factor,
            cap,
            burst_window,
            small_chunk: None,
            last: None,
            bursts: 0,
        }
    }

    /// The schedule an [`AllocConfig`](crate::AllocConfig) describes.
    pub fn from_config(cfg: &crate::AllocConfig) -> Self {
        ReactiveGrowth::new(
            cfg.growth_initial,
            cfg.growth_factor,
            cfg.growth_cap,
            cfg.growth_burst_window,
        )
        .small_chunk((cfg.growth_small_chunk > 0).then_some(cfg.growth_small_chunk))
    }

    /// Sets the chunk of the small-object segments (see the field).
    pub fn small_chunk(mut self, bytes: Option<u64>) -> Self {
        self.small_chunk = bytes;
        self
    }
}

impl GrowthPolicy for ReactiveGrowth {
    fn grow_bytes(&mut self, r: &GrowthRequest) -> u64 {
        let in_burst =
            matches!(self.last, Some(l) if r.allocs.saturating_sub(l) <= self.burst_window);
        if !in_burst {
            self.bursts = self.bursts.saturating_add(1);
        }
        self.last = Some(r.allocs);
        if !in_burst && self.burst_window != u64::MAX {
            return r.deficit;
        }
        let sched = ((r.reserved as f64) * (self.factor - 1.0)) as u64;
        let mut chunk = sched.clamp(self.initial, self.cap.max(self.initial));
        if r.small {
            if let Some(c) = self.small_chunk {
                chunk = c;
            }
        }
        let halvings = self.bursts.saturating_sub(1).min(63);
        r.deficit.max(chunk >> halvings)
    }
}

/// A segment the release policy is asked about.
#[derive(Debug, Clone, Copy)]
pub struct SegmentView {
    pub stream: StreamId,
    pub bytes: u64,
    pub growable: bool,
    /// Reserved bytes (all streams) and the peak so far.
    pub reserved: u64,
    pub peak_reserved: u64,
}

/// Decides whether free device memory goes back to the device outside of an OOM.
pub trait ReleasePolicy: Send {
    /// A fixed segment became completely free (or a growable one has `bytes` free at
    /// its end): release it now?
    fn release(&mut self, seg: &SegmentView) -> bool;
    /// False if this policy never releases outside of an OOM (the allocator then skips
    /// building the view on every free). Read once, when the allocator is built: it must
    /// not change over the policy's life.
    fn active(&self) -> bool {
        true
    }
}

/// Keep everything (PyTorch's behaviour): memory goes back only when an allocation
/// would otherwise fail.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeepUntilOom;

impl ReleasePolicy for KeepUntilOom {
    fn release(&mut self, _seg: &SegmentView) -> bool {
        false
    }
    fn active(&self) -> bool {
        false
    }
}

/// Release every completely free segment at once (smallest footprint, most device
/// calls).
#[derive(Debug, Clone, Copy, Default)]
pub struct ReleaseImmediately;

impl ReleasePolicy for ReleaseImmediately {
    fn release(&mut self, _seg: &SegmentView) -> bool {
        true
    }
}

/// What a forecaster may ask of the allocator. All of it is optional to obey.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Advice {
    /// Make sure `stream` has at least `bytes` of free reserved memory (grow now, off
    /// the critical path, instead of at the miss).
    EnsureFree { stream: StreamId, bytes: u64 },
    /// Pre-split `count` blocks of `bytes` (rounded) for `stream` and keep them ready in
    /// its cache, so that the predicted requests are served in O(1).
    PreSplit {
        stream: StreamId,
        bytes: u64,
        count: u32,
    },
    /// Release free device memory of `stream` beyond `keep_bytes` of free reserve.
    Trim { stream: StreamId, keep_bytes: u64 },
    /// Unmap the free tail of `stream`'s growable segment for large runs beyond
    /// `keep_bytes`, and nothing else: no cache is merged, no slab returned, so no
    /// later placement changes (the tail is used last; see `extents`).
    TrimTail { stream: StreamId, keep_bytes: u64 },
}
