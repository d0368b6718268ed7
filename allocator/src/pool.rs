//! The allocator: per-stream buddy pools, slabs and run caches over a device backend.
//!
//! Shape of one [`Allocator`]:
//! - one `StreamPool` per stream: its buddy trees (segments), its slabs' partial
//!   lists, its cache of freed runs. Memory freed on a stream is reused by that stream
//!   at once (stream order makes it safe) and by no other until it is back on the
//!   device; an allocation used on other streams (`record_stream`) is freed only when
//!   events recorded on those streams complete.
//! - a record table: one entry per allocation handle (generation-checked), so a free
//!   is O(1) and a stale or forged handle is an error, not corruption.
//!
//! Conservation equation (checked by [`Allocator::check_invariants`]):
//! `reserved == buddy_free + cached + slab_free + pending + allocated`, where `allocated`
//! is the rounded size of live allocations, `cached` the bytes of freed runs waiting
//! in the caches, `slab_free` the free slots of live slabs and `pending` the bytes of
//! frees waiting on other streams' events.
//!
//! The hot paths (costs measured in docs/allocator.md): a small request pops a slot of
//! the class's current slab; a large request that repeats a freed size pops a cached
//! run; both are a few array accesses. A miss carves a run from the buddy trees; only a
//! miss there calls the device.

use serde::Serialize;

use crate::backend::{DeviceBackend, DevicePtr, EventId, StreamId, StreamPriority};
use crate::buddy::BuddyPool;
use crate::config::{AllocConfig, Coalesce, Release};
use crate::error::AllocError;
use crate::fxmap;
pub(crate) use crate::fxmap::FxMap;
use crate::pages::PageMap;
use crate::policy::{
    GrowthPolicy, KeepUntilOom, ReactiveGrowth, ReleaseImmediately, ReleasePolicy,
};
pub(crate) use crate::record::{RecState, Record};
use crate::run_cache::RunCache;
use crate::slab::{SizeClasses, Slab};
use crate::stats::AllocStats;
pub(crate) use crate::table::Table;

/// Owner tags of Used buddy nodes: a record id, or a slab id with this bit.
pub(crate) const SLAB_TAG: u32 = 1 << 31;

/// A live allocation. `Copy`, so that misuse (double free, stale handle) can be
/// reported instead of prevented by the type system: the allocator checks every handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Allocation {
    pub ptr: DevicePtr,
    /// Requested bytes.
    pub size: u64,
    pub(crate) id: u32,
    pub(crate) gen: std::num::NonZeroU32,
}

/// Slot of a length in `StreamPool::recent`.
#[inline]
fn recent_slot(len: u64) -> usize {
    ((len >> 8).wrapping_mul(fxmap::K) >> 58) as usize
}

/// A free record id of `records` (a reused one, else a new vacant record): what
/// `Allocator::reserve_record` does, for callers that hold a pool borrowed.
#[inline]
fn reserve(records: &mut Table<Record>, free_records: &mut Vec<u32>) -> u32 {
    match free_records.pop() {
        Some(id) => id,
        None => {
            records.push(Record::vacant());
            (records.len() - 1) as u32
        }
    }
}

#[cold]
fn wrong_stream(ptr: DevicePtr, owner: StreamId, given: StreamId) -> AllocError {
    AllocError::WrongStream { ptr, owner, given }
}

/// Allocations until the next latency sample: `every`, or (sampling off) as many as a
/// countdown holds.
fn sample_countdown(every: u32) -> u32 {
    if every > 0 {
        every
    } else {
        u32::MAX
    }
}

/// One stream's memory.
#[derive(Debug)]
pub(crate) struct StreamPool {
    pub buddy: BuddyPool,
    /// Per size class: slabs with free slots and live objects (the last is used first).
    pub partial: Vec<Vec<u32>>,
    /// Per size class: up to `slab_spares` empty slabs kept back, so that a class whose
    /// live count hovers around a slab boundary does not carve and free a slab every
    /// few operations (a carve walks a buddy tree of up to 31 levels in a growable
    /// segment: ~0.4 us, 12-20% of the small-object path with one spare).
    // Invariant: every slab in spares[c] is live, empty, and on no partial list.
    pub spares: Vec<Vec<u32>>,
    /// Freed runs by exact length (deferred coalescing), records in state Cached.
    pub cache: RunCache,
    /// Lengths freed recently (direct-mapped by a hash of the length), and the share of
    /// large requests that repeated one (x256, decayed): the cache is used only while
    /// requests repeat (>= 1/4), so a workload of never-repeating sizes does not pay for
    /// caching and coalescing every run twice.
    pub recent: [u64; 64],
    pub repeat_score: u32,
    /// The growable segments (large runs, small slabs), when the backend has them and
    /// the config asks.
    pub growable: [Option<u32>; 2],
    /// Bytes of device memory this pool holds (released pages excluded).
    pub reserved: u64,
    /// The pages of the large-run growable segment whose memory was given back while
    /// free (page release, `pages.rs`).
    pub pages: PageMap,
}

#[derive(Debug)]
pub(crate) struct PendingFree {
    pub rec: u32,
    pub events: Vec<EventId>,
}

/// The memcast allocator over backend `B`. See the module docs.
pub struct Allocator<B: DeviceBackend> {
    pub(crate) backend: B,
    pub(crate) cfg: AllocConfig,
    pub(crate) growth: Box<dyn GrowthPolicy>,
    pub(crate) release: Box<dyn ReleasePolicy>,
    /// `release.active()`, read once: a policy that never releases outside of an OOM
    /// costs a free nothing (no segment look, no virtual call).
    pub(crate) release_active: bool,
    pub(crate) classes: SizeClasses,
    /// Per stream id: its pool, once used. A `Vec`, not a [`Table`]: stream ids come
    /// from callers, so every index is checked.
    pub(crate) pools: Vec<Option<StreamPool>>,
    pub(crate) streams: u32,
    pub(crate) records: Table<Record>,
    pub(crate) free_records: Vec<u32>,
    pub(crate) slabs: Table<Slab>,
    pub(crate) free_slabs: Vec<u32>,
    pub(crate) pending: Vec<PendingFree>,
    pub(crate) pending_bytes: u64,
    pub(crate) stats: AllocStats,
    /// Allocations left until the next latency sample.
    pub(crate) sample: u32,
    /// Per record used on other streams (`Record::has_uses`): the streams (bit s =
    /// stream s; bit 63 = streams >= 63). Rare, so kept out of the record table.
    pub(crate) uses: FxMap<u32, u64>,
    /// `max_request` (when set) capped at the largest size a record holds: a large
    /// request above it leaves the hot path (which then checks the device's capacity).
    pub(crate) request_cap: u64,
    /// True while advice is being applied (growth then is ahead of need).
    pub(crate) in_advice: bool,
    /// Predictive mode's online path (`None`: reactive, and the hot paths pay one
    /// untaken branch).
    pub(crate) online: Option<Box<crate::predictive::online::OnlinePath>>,
    /// Planned placement's log and plans (`None`: best fit alone, and the large-run
    /// paths pay one untaken branch).
    pub(crate) placement: Option<Box<crate::placement::Placement>>,
}

impl<B: DeviceBackend> std::fmt::Debug for Allocator<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("backend", &self.backend.name())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<B: DeviceBackend> Allocator<B> {
    /// An allocator with the policies the config describes: reactive, or predictive
    /// mode's over the forecaster `cfg` names when `cfg.predictive` (an error if its
    /// model cannot be loaded; see [`Allocator::new_or_reactive`]).
    pub fn new(backend: B, cfg: AllocConfig) -> Result<Self, AllocError> {
        if cfg.predictive {
            let f = crate::predictive::forecaster_for(&cfg)?;
            return Self::with_forecaster(backend, cfg, f);
        }
        let growth = Box::new(ReactiveGrowth::from_config(&cfg));
        let release: Box<dyn ReleasePolicy> = match cfg.release {
            Release::OnOom => Box::new(KeepUntilOom),
            Release::Immediate => Box::new(ReleaseImmediately),
        };
        Self::with_policies(backend, cfg, growth, release)
    }

    /// An allocator with caller-chosen policies (predictive mode plugs in here).
    pub fn with_policies(
        backend: B,
        cfg: AllocConfig,
        growth: Box<dyn GrowthPolicy>,
        release: Box<dyn ReleasePolicy>,
    ) -> Result<Self, AllocError> {
        cfg.validate()?;
        // Every segment is a whole number of granules: one larger than the device makes
        // every first allocation fail, far from the setting that caused it.
        if cfg.segment_granule > backend.capacity() {
            return Err(AllocError::Config(format!(
                "segment_granule {} is larger than the device's {} bytes ({}): no segment could be made",
                cfg.segment_granule,
                backend.capacity(),
                backend.name()
            )));
        }
        let classes = SizeClasses::new(cfg.min_block, cfg.small_max, cfg.classes_per_doubling);
        let placement = crate::placement::for_config(&cfg, classes.small_max())?;
        Ok(Allocator {
            backend,
            classes,
            growth,
            release_active: release.active(),
            release,
            pools: Vec::new(),
            streams: 1,
            records: Table::default(),
            free_records: Vec::new(),
            slabs: Table::default(),
            free_slabs: Vec::new(),
            pending: Vec::new(),
            pending_bytes: 0,
            stats: AllocStats::default(),
            sample: sample_countdown(cfg.latency_sample_every),
            uses: FxMap::default(),
            request_cap: if cfg.max_request > 0 {
                cfg.max_request.min(crate::record::MAX_SIZE)
            } else {
                crate::record::MAX_SIZE
            },
            in_advice: false,
            online: None,
            placement,
            cfg,
        })
    }

    pub fn config(&self) -> &AllocConfig {
        &self.cfg
    }
    pub fn stats(&self) -> &AllocStats {
        &self.stats
    }
    pub fn backend(&self) -> &B {
        &self.backend
    }
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }
    /// The backend back (segments still held stay allocated on it).
    pub fn into_backend(self) -> B {
        self.backend
    }

    /// A new stream on the backend, known to the allocator.
    pub fn create_stream(&mut self, priority: StreamPriority) -> Result<StreamId, AllocError> {
        let s = self.backend.create_stream(priority)?;
        // Records keep the stream in 16 bits.
        if s > u16::MAX as u32 {
            return Err(AllocError::TooManyStreams(s));
        }
        self.streams = self.streams.max(s + 1);
        Ok(s)
    }

    /// Stream `stream`'s pool, created on first use. The hot case is two loads and
    /// a compare; creation is out of line.
    #[inline]
    pub(crate) fn pool_mut(&mut self, stream: StreamId) -> Result<&mut StreamPool, AllocError> {
        if !matches!(self.pools.get(stream as usize), Some(Some(_))) {
            self.create_pool(stream)?;
        }
        Ok(self.pools[stream as usize].as_mut().expect("pool created"))
    }

    #[cold]
    #[inline(never)]
    fn create_pool(&mut self, stream: StreamId) -> Result<(), AllocError> {
        if stream >= self.streams {
            return Err(AllocError::UnknownStream(stream));
        }
        let i = stream as usize;
        if i >= self.pools.len() {
            self.pools.resize_with(i + 1, || None);
        }
        let nclasses = self.classes.len();
        let min_block = self.cfg.min_block;
        let best_fit = self.cfg.best_fit;
        self.pools[i].get_or_insert_with(|| StreamPool {
            buddy: {
                let mut b = BuddyPool::new(min_block);
                b.set_best_fit(best_fit);
                // Built on the first `deallocate_ptr` (`ensure_run_index`).
                b.set_run_index(false, []);
                b
            },
            partial: vec![Vec::new(); nclasses],
            spares: vec![Vec::new(); nclasses],
            cache: RunCache::default(),
            recent: [0; 64],
            repeat_score: 256,
            growable: [None, None],
            reserved: 0,
            pages: PageMap::default(),
        });
        Ok(())
    }

    /// A free record id (state Free, its generation kept) for the caller to fill.
    #[inline]
    pub(crate) fn reserve_record(&mut self) -> u32 {
        reserve(&mut self.records, &mut self.free_records)
    }

    /// A record holding `r`, under the next generation of its id (a stale handle to
    /// the id's previous life no longer matches).
    pub(crate) fn new_record(&mut self, r: Record) -> u32 {
        let id = self.reserve_record();
        let rec = &mut self.records[id];
        let gen = crate::record::next_gen(rec.gen);
        *rec = r;
        rec.gen = gen;
        id
    }

    pub(crate) fn handle(&self, id: u32) -> Allocation {
        let r = &self.records[id];
        Allocation {
            ptr: DevicePtr(r.ptr),
            size: r.requested(),
            id,
            gen: r.gen,
        }
    }

    /// The countdown ran out: restarts it; true if this allocation is to be timed.
    #[cold]
    fn restart_sampling(&mut self) -> bool {
        self.sample = sample_countdown(self.cfg.latency_sample_every);
        self.cfg.latency_sample_every > 0
    }

    /// Allocates `bytes` for use on `stream`. Aligned to `min_block` (256 B).
    ///
    /// Hot path (~150 instructions for a slab slot or a cached run, measured with
    /// callgrind in docs/allocator.md): a zero check, the pending-frees check, the
    /// sampling countdown, one pool lookup, the pop, the statistics. Everything that
    /// can fail or call the device is out of line.
    pub fn allocate(&mut self, bytes: u64, stream: StreamId) -> Result<Allocation, AllocError> {
        if bytes == 0 {
            return Err(AllocError::ZeroSize);
        }
        if !self.pending.is_empty() {
            self.process_pending(false)?;
        }
        // A countdown to the next sampled allocation (no division, one branch per call).
        self.sample -= 1;
        let timed = self.sample == 0 && self.restart_sampling();
        let t0 = timed.then(std::time::Instant::now);
        let r = if bytes < self.classes.small_max() {
            self.alloc_small(bytes, stream)
        } else {
            self.alloc_large(bytes, stream)
        };
        match r {
            Ok(id) => {
                let a = self.served(id, bytes);
                if let Some(t0) = t0 {
                    self.stats.latency.record(t0.elapsed().as_nanos() as u64);
                }
                self.online_alloc(bytes, stream);
                self.debug_check();
                Ok(a)
            }
            Err(e) => {
                self.count_failure(&e);
                Err(e)
            }
        }
    }

    /// The handle of record `id`, just made for a request of `bytes`, with the request
    /// counted. The paths return the record id; the handle is built once, here.
    #[inline(always)]
    pub(crate) fn served(&mut self, id: u32, bytes: u64) -> Allocation {
        let (a, size) = (self.handle(id), self.records[id].size());
        let st = &mut self.stats;
        st.allocs += 1;
        st.requested.add(bytes);
        st.allocated.add(size);
        if st.requested.current == st.requested.peak {
            st.internal_waste_at_peak = st.allocated.current - st.requested.current;
        }
        a
    }

    #[cold]
    fn count_failure(&mut self, e: &AllocError) {
        if matches!(e, AllocError::OutOfMemory { .. }) {
            self.stats.ooms += 1;
        }
        self.debug_check();
    }

    /// The largest request the device can take: `max_request` (if set) capped by the
    /// backend's capacity. Read on the paths that may call the device.
    #[inline]
    pub(crate) fn check_size(&self, bytes: u64) -> Result<(), AllocError> {
        // Records hold sizes up to MAX_SIZE (1 TiB).
        let cap = if self.cfg.max_request > 0 {
            self.cfg.max_request.min(self.backend.capacity())
        } else {
            self.backend.capacity()
        }
        .min(crate::record::MAX_SIZE);
        if bytes > cap {
            return Err(AllocError::TooLarge {
                requested: bytes,
                capacity: cap,
            });
        }
        Ok(())
    }

    /// A run for `bytes`; returns the record's id. Hot cases, one pool lookup and no
    /// device call: a cached run of exactly this length (deferred coalescing), or room
    /// in the stream's placement index. Everything else is `alloc_large_slow`.
    #[inline]
    fn alloc_large(&mut self, bytes: u64, stream: StreamId) -> Result<u32, AllocError> {
        if self.placement.is_some() {
            return self.alloc_large_planned(bytes, stream);
        }
        self.alloc_large_best_fit(bytes, stream)
    }

    /// `alloc_large` by best fit: the cache, then the placement index, then the slow
    /// path.
    #[inline]
    pub(crate) fn alloc_large_best_fit(
        &mut self,
        bytes: u64,
        stream: StreamId,
    ) -> Result<u32, AllocError> {
        // A mask, not `next_multiple_of` (a 64-bit division, ~9% of a large alloc):
        // `validate` makes min_block a power of two. Wrapping: a request within
        // `min_block` of `u64::MAX` wraps to 0 here, and is over `request_cap`, so it
        // leaves for `alloc_large_slow`, which refuses it as too large.
        let len = bytes.wrapping_add(self.cfg.min_block - 1) & !(self.cfg.min_block - 1);
        let scan = self.cfg.run_scan;
        let over_max = bytes > self.request_cap;
        let Some(Some(pool)) = self.pools.get_mut(stream as usize) else {
            return self.alloc_large_slow(bytes, len, stream, false);
        };
        let repeat = pool.recent[recent_slot(len)] == len;
        pool.repeat_score =
            pool.repeat_score - pool.repeat_score / 16 + if repeat { 16 } else { 0 };
        if over_max {
            return self.alloc_large_slow(bytes, len, stream, false);
        }
        if let Some(id) = pool.cache.take(&mut self.records, len) {
            self.records[id].revive(bytes);
            self.stats.cache_hits += 1;
            return Ok(id);
        }
        // A miss coalesces the cache first, so that placement sees every free byte
        // (measured: placing around cached runs costs up to +25% reserved). On the
        // resnet50 trace that is one miss in five; the carve after it stays here.
        let mut pool = pool;
        if pool.cache.runs() > 0 {
            self.flush_cache(stream)?;
            pool = self.pools[stream as usize].as_mut().expect("pool");
        }
        if let Some(spot) = pool.buddy.find_run(len, scan, false) {
            // The record id comes first so that the run's nodes carry it.
            let id = reserve(&mut self.records, &mut self.free_records);
            let (run, base) = pool.buddy.carve_at(spot, len, id);
            // Page release: one load and a compare of the pool at hand unless pages of
            // it are released; pages that cannot be backed undo the carve (out of
            // memory: a miss; any other device error: the caller's).
            if pool.pages.count != 0 {
                let backed = self.back_or_miss(stream, &run, len);
                if !matches!(backed, Ok(true)) {
                    self.free_records.push(id);
                    backed?;
                    return self.alloc_large_slow(bytes, len, stream, false);
                }
            }
            self.records[id].make_run(base, run, bytes, len, stream);
            return Ok(id);
        }
        self.alloc_large_slow(bytes, len, stream, true)
    }

    /// `alloc_large` without room at hand (or without a pool, or above `max_request`):
    /// checks the size, coalesces the cache, then finds room the way `obtain_run` does
    /// (waiting for pending frees, growing), without searching the placement index
    /// again when `searched` (the caller has just searched it, the cache coalesced).
    #[cold]
    #[inline(never)]
    fn alloc_large_slow(
        &mut self,
        bytes: u64,
        len: u64,
        stream: StreamId,
        searched: bool,
    ) -> Result<u32, AllocError> {
        self.check_size(bytes)?;
        if self.pool_mut(stream)?.cache.runs() > 0 {
            self.flush_cache(stream)?;
        }
        let id = self.reserve_record();
        let found = if searched {
            self.obtain_run_after_miss(stream, len, id, false)
        } else {
            self.obtain_run(stream, len, id, false)
        };
        let run = match found {
            Ok(run) => run,
            Err(e) => {
                self.free_records.push(id);
                return Err(e);
            }
        };
        let base = self.pools[stream as usize]
            .as_ref()
            .expect("pool")
            .buddy
            .segs[run.seg]
            .base;
        self.records[id].make_run(base, run, bytes, len, stream);
        Ok(id)
    }

    /// Validates a handle; returns its record id. Hot: one record read and three
    /// compares; naming what is wrong is out of line.
    #[inline]
    fn check_handle(&self, a: &Allocation) -> Result<u32, AllocError> {
        match self.records.get(a.id) {
            Some(r) if r.gen == a.gen && r.state == RecState::Live && r.ptr == a.ptr.0 => Ok(a.id),
            _ => Err(self.handle_error(a)),
        }
    }

    /// What is wrong with handle `a` (which `check_handle` refused).
    #[cold]
    #[inline(never)]
    fn handle_error(&self, a: &Allocation) -> AllocError {
        let Some(r) = self.records.get(a.id) else {
            return AllocError::UnknownAllocation {
                what: format!("handle {} at {}", a.id, a.ptr),
            };
        };
        if r.gen != a.gen || r.state != RecState::Live {
            if r.ptr == a.ptr.0 || r.state != RecState::Live {
                return AllocError::DoubleFree { ptr: a.ptr };
            }
            return AllocError::UnknownAllocation {
                what: format!("stale handle {} at {}", a.id, a.ptr),
            };
        }
        AllocError::UnknownAllocation {
            what: format!("handle {} names {}, not {}", a.id, DevicePtr(r.ptr), a.ptr),
        }
    }

    /// Frees `a`, which must have been allocated on `stream`. O(1) for slab objects and
    /// (with deferred coalescing) for runs.
    pub fn deallocate(&mut self, a: Allocation, stream: StreamId) -> Result<(), AllocError> {
        let id = self.check_handle(&a)?;
        let r = &self.records[id];
        let (owner, requested, size, uses) = (r.stream(), r.requested(), r.size(), r.has_uses());
        if owner != stream {
            return Err(wrong_stream(a.ptr, owner, stream));
        }
        self.stats.frees += 1;
        self.stats.requested.sub(requested);
        self.stats.allocated.sub(size);
        if uses {
            self.defer_free(id)?;
        } else {
            self.release_record(id)?;
        }
        self.online_free(requested, stream);
        self.debug_check();
        Ok(())
    }

    /// Declares that `a` is also used by work on `stream`: when freed, its memory is
    /// reused only after that work completes (an event recorded at free time).
    pub fn record_stream(&mut self, a: &Allocation, stream: StreamId) -> Result<(), AllocError> {
        let id = self.check_handle(a)?;
        if stream >= self.streams {
            return Err(AllocError::UnknownStream(stream));
        }
        let r = &mut self.records[id];
        if r.stream() != stream {
            r.set_uses(true);
            *self.uses.entry(id).or_default() |= 1u64 << stream.min(63);
        }
        Ok(())
    }

    /// Returns a freed record's memory to its slab, its stream's cache, or its tree.
    #[inline(always)]
    pub(crate) fn release_record(&mut self, id: u32) -> Result<(), AllocError> {
        let r = &self.records[id];
        if r.slab() {
            self.free_slot(id, r.seg_or_slab);
            return Ok(());
        }
        let (stream, size, (seg, blk)) = (r.stream(), r.size(), r.seg_blk());
        let pool = self.pools[stream as usize]
            .as_mut()
            .expect("pool of a live record");
        pool.recent[recent_slot(size)] = size;
        // A run next to free memory is merged at once: caching it would keep a hole
        // smaller than the merge makes, and a later larger request would grow the
        // device instead (placement around cached runs).
        if let Some(p) = self.placement.as_deref_mut() {
            p.freed(stream, id);
        }
        // No caching while a plan serves the stream (a cached run is a used block
        // where the plan wants free space).
        let deferred = self.cfg.coalesce == Coalesce::Deferred
            && self.placement.as_deref().is_none_or(|p| p.caches(stream))
            && pool.repeat_score >= 64
            && !pool.buddy.run_has_free_neighbour(seg, blk);
        if deferred {
            self.records[id].state = RecState::Cached;
            pool.cache.push(&mut self.records, id);
            let over = pool.cache.runs() > self.cfg.cache_max_runs
                || pool.cache.bytes() as f64 > self.cfg.cache_max_fraction * pool.reserved as f64;
            if over {
                self.flush_cache(stream)?;
            }
        } else {
            pool.buddy.free_run_blk(seg, blk, size);
            self.records[id].state = RecState::Free;
            self.free_records.push(id);
            self.maybe_release_segment(stream, seg)?;
        }
        Ok(())
    }

    /// Frees every cached run of `stream` into its buddy trees (the coalescing step of
    /// deferred coalescing), then applies the release policy to emptied segments.
    pub(crate) fn flush_cache(&mut self, stream: StreamId) -> Result<(), AllocError> {
        let Some(pool) = self.pools.get_mut(stream as usize).and_then(|p| p.as_mut()) else {
            return Ok(());
        };
        if pool.cache.runs() == 0 {
            return Ok(());
        }
        self.stats.cache_flushes += 1;
        // Segments left empty, for the release policy (none looked at without one).
        let mut segs = Vec::new();
        let watch = self.release_active;
        let free_records = &mut self.free_records;
        let buddy = &mut pool.buddy;
        pool.cache.drain(&mut self.records, |records, id| {
            let r = &mut records[id];
            let (seg, blk) = r.seg_blk();
            buddy.free_run_blk(seg, blk, r.size());
            r.state = RecState::Free;
            free_records.push(id);
            if watch && buddy.segs[r.seg_or_slab].used == 0 {
                segs.push(r.seg_or_slab);
            }
        });
        for seg in segs {
            self.maybe_release_segment(stream, seg)?;
        }
        Ok(())
    }

    /// Bytes of free memory and the largest free block, over all streams: the inputs
    /// of fragmentation (free includes cached runs and free slab slots).
    pub fn free_and_largest(&self) -> (u64, u64) {
        let mut largest = 0;
        for p in self.pools.iter().flatten() {
            largest = largest.max(p.buddy.largest_free_block());
            largest = largest.max(p.cache.largest(&self.records));
        }
        (self.stats.free_bytes(), largest)
    }

    /// Fragmentation now: `1 - largest free block / free bytes` (0 when nothing is free).
    pub fn fragmentation(&self) -> f64 {
        let (free, largest) = self.free_and_largest();
        if free == 0 {
            0.0
        } else {
            1.0 - (largest.min(free) as f64 / free as f64)
        }
    }

    #[inline]
    pub(crate) fn debug_check(&self) {
        #[cfg(feature = "check-invariants")]
        if let Err(e) = self.check_invariants() {
            panic!("memcast allocator invariant violated: {e}");
        }
    }
}
