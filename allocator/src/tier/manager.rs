//! [`TierManager`]: tensors by handle over the device allocator and the host tiers.
//!
//! The caller registers a tensor (device memory is allocated and the tensor counts as
//! written), accesses it (`access` returns device memory, faulting the tensor in
//! synchronously if it is on the host: a counted stall), and frees it. In between, the
//! manager spills tensors to the host when device use passes the high watermark and
//! prefetches them back as the prefetch policy says. Steps: tensors accessed in the
//! current step are pinned on the device until [`TierManager::end_step`] (a kernel
//! needs all its operands at once).
//!
//! Conservation (checked by [`TierManager::check_invariants`]):
//! `allocator requested bytes == sum of device bytes of live tensors + device bytes of
//! orphaned transfers`, and every tensor is in exactly one [`Place`].

use crate::backend::{DeviceBackend, DevicePtr};
use crate::pool::{Allocation, Allocator};

use super::handle::{Entry, Place, Registry, TensorHandle, TensorKey, MAX_K};
use super::prefetch::{PrefetchPolicy, PreviousIterationOrder};
use super::schedule::OpUse;
use super::spill::{LinkCost, LruK, MigrationCost, SpillPolicy};
use super::staging::{HostLoc, StagingPool};
pub use super::stats::TierStats;
use super::transfer::{Completion, Direction, Done, Pipeline};
use super::{TierConfig, TierError};

/// How a tensor is registered.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TensorOpts {
    /// Lives across iterations (parameters, optimizer state).
    pub persistent: bool,
    /// Recompute cost in microseconds (0 = not recomputable).
    pub recompute_us: f64,
    /// Probability that the caller recomputes it instead of fetching it.
    pub recompute_prob: f64,
}

/// The tiering mechanism. See the module docs.
pub struct TierManager<B: DeviceBackend> {
    pub(crate) alloc: Allocator<B>,
    pub(crate) cfg: TierConfig,
    pub(crate) reg: Registry,
    pub(crate) staging: StagingPool,
    pub(crate) pipe: Pipeline,
    pub(crate) spill: Box<dyn SpillPolicy>,
    pub(crate) cost: Box<dyn MigrationCost>,
    pub(crate) prefetch: Box<dyn PrefetchPolicy>,
    pub(crate) stats: TierStats,
    /// Current step: tensors with `entry.step == step` are pinned.
    pub(crate) step: u64,
    /// Non-persistent tensors registered this iteration, by ordinal.
    pub(crate) ordinals: Vec<TensorHandle>,
    /// Device bytes (requested) that in-flight spills will release.
    // Invariant: == sum of SpillingOut tensors' bytes.
    pub(crate) releasing: u64,
    pub(crate) done: Vec<Done>,
    pub(crate) plan: Vec<TensorHandle>,
    /// Predictive tiers' demand forecast (`None`: reactive).
    pub(crate) demand: Option<Box<super::predictive::Demand>>,
    /// Planned tiers' iteration plan (`None`: no plan).
    pub(crate) planner: Option<Box<super::planned::Planner>>,
    /// Bytes of every registered tensor, wherever it is.
    // Invariant: == sum of the registry's bytes.
    pub(crate) logical: u64,
    /// Which tensors are recomputable, and what recomputes them.
    pub(crate) recompute: super::recompute::Recompute<B>,
    /// The predicted read swap ahead last found nothing to spill for (`tier::swap`):
    /// not tried again until another is wanted.
    pub(crate) swap_tried: Option<TensorHandle>,
}

impl<B: DeviceBackend> std::fmt::Debug for TierManager<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TierManager")
            .field("tensors", &self.reg.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<B: DeviceBackend> TierManager<B> {
    /// A manager with the reactive policies (LRU-K over link cost, previous-iteration
    /// prefetch). Allocates the pinned staging pool now (costly: do it once).
    pub fn new(alloc: Allocator<B>, cfg: TierConfig) -> Result<Self, TierError> {
        let spill = Box::new(LruK { k: cfg.lru_k });
        let prefetch = Box::new(PreviousIterationOrder::new(cfg.prefetch_window));
        Self::with_policies(alloc, cfg, spill, Box::new(LinkCost::default()), prefetch)
    }

    /// A manager with caller-chosen policies (predictive mode plugs in here).
    pub fn with_policies(
        mut alloc: Allocator<B>,
        cfg: TierConfig,
        spill: Box<dyn SpillPolicy>,
        cost: Box<dyn MigrationCost>,
        prefetch: Box<dyn PrefetchPolicy>,
    ) -> Result<Self, TierError> {
        cfg.validate()?;
        let staging =
            StagingPool::new(alloc.backend_mut(), cfg.staging_bytes).map_err(|source| {
                TierError::Staging {
                    bytes: cfg.staging_bytes,
                    source,
                }
            })?;
        let pipe = Pipeline::new(alloc.backend_mut())?;
        // The drop-or-spill rule prices copies as the spill cost does, where it says how.
        let mut recompute = super::recompute::Recompute::default();
        if let Some(m) = cost.cost_model() {
            recompute.model = m.clone();
        }
        Ok(TierManager {
            alloc,
            cfg,
            reg: Registry::default(),
            staging,
            pipe,
            spill,
            cost,
            prefetch,
            stats: TierStats::default(),
            step: 1,
            ordinals: Vec::new(),
            releasing: 0,
            done: Vec::new(),
            plan: Vec::new(),
            demand: None,
            planner: None,
            logical: 0,
            recompute,
            swap_tried: None,
        })
    }

    pub fn config(&self) -> &TierConfig {
        &self.cfg
    }
    pub fn stats(&self) -> &TierStats {
        &self.stats
    }
    pub fn allocator(&self) -> &Allocator<B> {
        &self.alloc
    }
    pub fn backend(&self) -> &B {
        self.alloc.backend()
    }
    pub fn backend_mut(&mut self) -> &mut B {
        self.alloc.backend_mut()
    }
    pub fn staging(&self) -> &StagingPool {
        &self.staging
    }
    /// Tensors registered and not freed by the caller.
    pub fn len(&self) -> usize {
        self.reg.len() - self.recompute.retained()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Where a tensor is now.
    pub fn place(&self, h: TensorHandle) -> Result<Place, TierError> {
        Ok(self.reg.get(h)?.place)
    }
    pub fn bytes(&self, h: TensorHandle) -> Result<u64, TierError> {
        Ok(self.reg.get(h)?.bytes)
    }

    /// Registers a tensor of `bytes` (> 0): allocates device memory (spilling others if
    /// needed) and counts as a write access in the current step.
    pub fn register(&mut self, bytes: u64, opts: TensorOpts) -> Result<TensorHandle, TierError> {
        if bytes == 0 {
            return Err(TierError::Alloc(crate::error::AllocError::ZeroSize));
        }
        let alloc = self.device_alloc(bytes)?;
        let now = self.alloc.backend().now_us();
        let key_ordinal = self.ordinals.len() as u32;
        let mut e = Entry {
            bytes,
            place: Place::Device { alloc },
            key: TensorKey::Ordinal(key_ordinal),
            persistent: opts.persistent,
            history: [f64::NEG_INFINITY; MAX_K],
            recompute_us: opts.recompute_us.max(0.0),
            recompute_prob: opts.recompute_prob.clamp(0.0, 1.0),
            step: 0,
            prefetched_unused: false,
            prefetch_blocked: false,
            reader: None,
        };
        e.touch(now, self.step);
        let h = self.reg.insert(e);
        let key = if opts.persistent {
            TensorKey::Persistent(h)
        } else {
            self.ordinals.push(h);
            TensorKey::Ordinal(key_ordinal)
        };
        self.reg.get_mut(h)?.key = key;
        self.prefetch.on_alloc(key, bytes);
        self.demand_alloc(bytes)?;
        self.plan_op(h, key, bytes, OpUse::Alloc)?;
        self.run_prefetcher()?;
        self.debug_check();
        Ok(h)
    }

    /// Makes `h` device-resident and returns its device address; the tensor is pinned
    /// until the step ends. A tensor on the host is fetched synchronously (a stall); a
    /// prefetch in flight is waited for; a spill in flight is cancelled; a dropped one
    /// is recomputed (a stall). A write first recomputes the dropped tensors that take
    /// `h` as an input (see [`super::recompute`]).
    pub fn access(&mut self, h: TensorHandle, write: bool) -> Result<DevicePtr, TierError> {
        self.poll()?;
        let stall0 = self.stats.transfer_stall_us;
        let step = self.step;
        let e = self.reg.get_mut(h)?;
        // Pin first: nothing below may choose it as a victim. A failed access unpins
        // it again (the tensor stays where it was, unused by this step).
        let unpinned = e.step;
        e.step = step;
        // Away from the device or only just back (told to the prefetch policy).
        let returned =
            e.prefetched_unused || !matches!(e.place, Place::Device { .. } | Place::Dropped);
        let r = self.bring(h).and_then(|p| {
            if write {
                self.recompute_before_write(h)?;
            }
            Ok(p)
        });
        let ptr = match r {
            Ok(p) => p,
            Err(err) => {
                self.unpin(h, unpinned);
                return Err(err);
            }
        };
        self.stats.access_stall_us += self.stats.transfer_stall_us - stall0;
        let now = self.alloc.backend().now_us();
        let e = self.reg.get_mut(h)?;
        e.touch(now, step);
        let key = e.key;
        self.stats.accesses += 1;
        // A plan with moves in charge knows the iteration: the stream of returns
        // (`tier::stream`) stands in for that knowledge, so it follows none of them.
        if returned && !self.planner.as_deref().is_some_and(|p| p.has_moves()) {
            self.prefetch.on_returned(key);
        }
        self.prefetch.on_access(key);
        let bytes = self.reg.get(h)?.bytes;
        self.plan_op(h, key, bytes, OpUse::Access)?;
        self.run_prefetcher()?;
        self.debug_check();
        Ok(ptr)
    }

    /// Makes `h` (pinned by the caller) device-resident wherever it is: cancels a spill
    /// in flight, waits for a prefetch, faults it in from the host, recomputes it if
    /// dropped. On an error the tensor stays where it was.
    pub(crate) fn bring(&mut self, h: TensorHandle) -> Result<DevicePtr, TierError> {
        let e = self.reg.get_mut(h)?;
        let place = e.place;
        Ok(match place {
            Place::Device { alloc } => {
                if e.prefetched_unused {
                    if e.prefetch_blocked {
                        self.stats.prefetch_blocked += 1;
                    } else {
                        self.stats.prefetch_hits += 1;
                    }
                    e.prefetched_unused = false;
                }
                alloc.ptr
            }
            Place::SpillingOut {
                alloc,
                host,
                transfer,
            } => {
                // The device copy is still authoritative: keep it, drop the host copy
                // once the copy that writes it completes.
                e.place = Place::Device { alloc };
                e.reader = Some(transfer);
                let bytes = e.bytes;
                self.pipe.orphan(
                    transfer,
                    Completion::Release {
                        device: None,
                        host: Some(host),
                    },
                );
                self.releasing -= bytes;
                self.stats.cancelled_spills += 1;
                alloc.ptr
            }
            Place::PrefetchingIn {
                alloc, transfer, ..
            } => {
                self.stats.prefetch_late += 1;
                let t0 = self.stats.transfer_stall_us;
                self.wait_for(transfer)?;
                self.stats.late_prefetch_us += self.stats.transfer_stall_us - t0;
                alloc.ptr
            }
            Place::Host { host } => {
                let bytes = e.bytes;
                let t0 = self.stats.transfer_stall_us;
                let p = self.fault_in(h, bytes, host)?;
                self.stats.fault_us += self.stats.transfer_stall_us - t0;
                p
            }
            Place::Dropped => self.recompute_in(h)?,
        })
    }

    /// Restores the step of a tensor whose access failed (if it is still on the device
    /// the pin does no harm; elsewhere it would claim a kernel uses it).
    pub(crate) fn unpin(&mut self, h: TensorHandle, step: u64) {
        if let Ok(e) = self.reg.get_mut(h) {
            if !matches!(e.place, Place::Device { .. }) {
                e.step = step;
            }
        }
    }

    /// Frees a tensor wherever it is. Buffers of a copy in flight are released when the
    /// copy completes. Dropped tensors that take it as an input keep it, out of the
    /// caller's sight, until they are recomputed (see [`super::recompute`]).
    pub fn free(&mut self, h: TensorHandle) -> Result<(), TierError> {
        let (key, bytes, unused) = {
            let e = self.reg.get(h)?;
            (e.key, e.bytes, e.prefetched_unused)
        };
        if !self.recompute_on_free(h)? {
            let e = self.reg.remove(h)?;
            self.release_entry(h, &e)?;
        }
        self.prefetch.on_free(key, bytes);
        if unused {
            self.stats.prefetch_wasted += 1;
        }
        self.demand_free(bytes)?;
        self.plan_op(h, key, bytes, OpUse::Free)
    }

    /// Gives back the memory of removed entry `e` (of `h`) wherever it is. Buffers of a
    /// copy in flight are released when the copy completes.
    pub(crate) fn release_entry(&mut self, h: TensorHandle, e: &Entry) -> Result<(), TierError> {
        match e.place {
            // A cancelled spill still reads it: the transfer frees it when done.
            Place::Device { alloc }
                if e.reader.is_some_and(|t| self.pipe.adopt_device(t, alloc)) => {}
            Place::Device { alloc } => self.alloc.deallocate(alloc, 0)?,
            // A failed copy in whose queued part still reads it: released when it lands.
            Place::Host { host } if self.pipe.adopt_host(h, host) => {}
            Place::Host { host } => self.release_host(host)?,
            Place::Dropped => {}
            Place::SpillingOut {
                alloc,
                host,
                transfer,
            }
            | Place::PrefetchingIn {
                alloc,
                host,
                transfer,
            } => {
                if matches!(e.place, Place::SpillingOut { .. }) {
                    self.releasing -= alloc.size;
                }
                let orphaned = self.pipe.orphan(
                    transfer,
                    Completion::Release {
                        device: Some(alloc),
                        host: Some(host),
                    },
                );
                if !orphaned {
                    return Err(TierError::Invariant(format!(
                        "tensor {h} names transfer {transfer:?}, which is not in flight"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Waits for every transfer, frees every tensor, gives the pinned pool back and
    /// returns the allocator (whose segments the caller may then release). A stuck
    /// transfer whose stream still cannot be synchronized is an error
    /// ([`TierError::Stuck`]), and the manager, its pool and its allocator (with the
    /// backend) are leaked, not dropped: the device may still use their memory.
    pub fn shutdown(mut self) -> Result<Allocator<B>, TierError> {
        self.synchronize()?;
        self.recompute_clear()?;
        let live: Vec<TensorHandle> = self.reg.iter().map(|(h, _)| h).collect();
        for h in live {
            self.free(h)?;
        }
        self.synchronize()?;
        let mut done = std::mem::take(&mut self.done);
        let r = self.pipe.settle_stuck(self.alloc.backend_mut(), &mut done);
        let r2 = self.finish_all(&mut done);
        if let Err(source) = r {
            let transfers = self.pipe.stuck();
            // Dropping the manager would drop the backend, whose memory (the pool, the
            // segments) the stuck copies may still use: it is leaked instead.
            std::mem::forget(self);
            return Err(TierError::Stuck { transfers, source });
        }
        r2?;
        self.staging.destroy(self.alloc.backend_mut())?;
        Ok(self.alloc)
    }

    /// Ends the current step: its tensors are no longer pinned.
    pub fn end_step(&mut self) {
        self.step += 1;
    }

    /// An iteration boundary: the prefetcher's sequence restarts, ordinals restart, and
    /// the allocator sees the boundary too (its planned placement and online path).
    pub fn iteration_boundary(&mut self) -> Result<(), TierError> {
        self.alloc.iteration_boundary();
        self.end_step();
        self.prefetch.on_iteration();
        self.plan_boundary();
        self.ordinals.clear();
        self.demand_boundary()?;
        self.plan_act()?;
        self.run_prefetcher()
    }

    /// Starts spilling `h` to the host (asynchronously). `Ok(false)` if it is not on the
    /// device, pinned in this step, or a copy of it is in flight. The caller asked for
    /// this spill, so `TierConfig::early_spills_pinned` does not apply: with the pinned
    /// pool full it goes to pageable memory, and the copy holds the host until done.
    pub fn spill(&mut self, h: TensorHandle) -> Result<bool, TierError> {
        self.poll()?;
        let e = self.reg.get(h)?;
        if e.step == self.step || e.reader.is_some() || !matches!(e.place, Place::Device { .. }) {
            return Ok(false);
        }
        self.start_spill(h, false)
    }

    /// Starts bringing `h` back to the device (asynchronously) if there is room without
    /// spilling anything. `Ok(false)` if it is not on the host or there is no room.
    pub fn prefetch(&mut self, h: TensorHandle) -> Result<bool, TierError> {
        self.poll()?;
        self.start_prefetch(h)
    }

    /// Processes completed transfers (non-blocking).
    pub fn poll(&mut self) -> Result<(), TierError> {
        let mut done = std::mem::take(&mut self.done);
        let r = self.pipe.poll(self.alloc.backend_mut(), &mut done);
        let r2 = self.finish_all(&mut done);
        self.done = done;
        r?;
        r2
    }

    /// Waits for every transfer in flight and processes it.
    pub fn synchronize(&mut self) -> Result<(), TierError> {
        let mut done = std::mem::take(&mut self.done);
        let t0 = self.alloc.backend().now_us();
        let r = self.pipe.wait_all(self.alloc.backend_mut(), &mut done);
        if r.is_ok() && self.pipe.stuck() > 0 {
            // A stream that synchronizes now lands its stuck copies; one that still
            // fails keeps them stuck (their buffers held), which is no error here.
            let _ = self.pipe.settle_stuck(self.alloc.backend_mut(), &mut done);
        }
        self.stats.transfer_stall_us += self.alloc.backend().now_us() - t0;
        let r2 = self.finish_all(&mut done);
        self.done = done;
        r?;
        r2
    }

    /// Blocks until transfer `id` (and earlier ones of its direction) completed.
    pub(crate) fn wait_for(&mut self, id: super::transfer::TransferId) -> Result<(), TierError> {
        let mut done = std::mem::take(&mut self.done);
        let t0 = self.alloc.backend().now_us();
        let r = self.pipe.wait(self.alloc.backend_mut(), id, &mut done);
        self.stats.transfer_stall_us += self.alloc.backend().now_us() - t0;
        let r2 = self.finish_all(&mut done);
        self.done = done;
        r?;
        r2
    }

    fn finish_all(&mut self, done: &mut Vec<Done>) -> Result<(), TierError> {
        let mut first_err = None;
        for d in done.drain(..) {
            if let Err(e) = self.finish(d) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// A transfer completed: move the tensor to its destination or release an orphan.
    fn finish(&mut self, d: Done) -> Result<(), TierError> {
        match d.completion {
            Completion::Release { device, host } => {
                if let Ok(e) = self.reg.get_mut(d.handle) {
                    if e.reader == Some(d.id) {
                        e.reader = None;
                    }
                }
                if let Some(a) = device {
                    self.alloc.deallocate(a, 0)?;
                }
                if let Some(hl) = host {
                    self.release_host(hl)?;
                }
            }
            Completion::Finish => {
                let e = self.reg.get_mut(d.handle)?;
                match (d.dir, e.place) {
                    (Direction::Out, Place::SpillingOut { alloc, host, .. }) => {
                        e.place = Place::Host { host };
                        self.releasing -= alloc.size;
                        self.alloc.deallocate(alloc, 0)?;
                    }
                    (Direction::In, Place::PrefetchingIn { alloc, host, .. }) => {
                        e.place = Place::Device { alloc };
                        self.release_host(host)?;
                    }
                    (dir, place) => {
                        return Err(TierError::Invariant(format!(
                            "transfer {:?} ({dir:?}) of {} finished with the tensor at {place:?}",
                            d.id, d.handle
                        )))
                    }
                }
            }
        }
        Ok(())
    }

    /// Spills `h` (on the device, not pinned): host buffer, copy, state. On failure the
    /// tensor stays on the device and `Ok(false)` is returned (failure counted).
    ///
    /// `early`: nothing waits for this spill (a watermark batch, a spill ahead of a
    /// forecast, a planned move): with `TierConfig::early_spills_pinned` it goes only
    /// to the pinned pool and is not issued when the pool has no room for it.
    pub(crate) fn start_spill(&mut self, h: TensorHandle, early: bool) -> Result<bool, TierError> {
        let pinned_only = early && self.cfg.early_spills_pinned;
        let e = self.reg.get(h)?;
        let (Place::Device { alloc }, bytes, unused) = (e.place, e.bytes, e.prefetched_unused)
        else {
            return Ok(false);
        };
        if e.reader.is_some() {
            return Ok(false);
        }
        let host = if pinned_only {
            // One range only: a split would let early spills take the room scattered
            // between ranges, which the spills that must go now then lack.
            match self.pinned_alloc(bytes, false) {
                Some(l) => l,
                None => {
                    self.stats.early_spills_refused += 1;
                    return Ok(false);
                }
            }
        } else {
            match self.host_alloc(bytes, !early) {
                Ok(l) => l,
                Err(_) => return Ok(false),
            }
        };
        let r = self.issue_copy(Direction::Out, h, alloc.ptr, host, bytes);
        let transfer = match r {
            Ok(t) => t,
            Err(e) => {
                self.stats.transfer_failures += 1;
                match e.orphan {
                    // Part of the copy is queued: the host range stays with it, and
                    // the device block, the copy's source, stays out of reach as a
                    // cancelled spill's does (`reader`).
                    Some(id) => {
                        self.orphan_buffers(id, None, Some(host))?;
                        self.reg.get_mut(h)?.reader = Some(id);
                    }
                    None => self.release_host(host)?,
                }
                return Ok(false);
            }
        };
        let e = self.reg.get_mut(h)?;
        e.place = Place::SpillingOut {
            alloc,
            host,
            transfer,
        };
        if unused {
            e.prefetched_unused = false;
            self.stats.prefetch_wasted += 1;
        }
        self.releasing += alloc.size;
        self.stats.spills += 1;
        self.stats.spilled_bytes += bytes;
        if host.is_warm() {
            self.stats.spills_warm += 1;
        } else {
            self.stats.spills_cold += 1;
        }
        Ok(true)
    }

    /// Prefetches `h` (on the host) if device memory is available without spilling.
    pub(crate) fn start_prefetch(&mut self, h: TensorHandle) -> Result<bool, TierError> {
        let e = self.reg.get(h)?;
        let (Place::Host { host }, bytes) = (e.place, e.bytes) else {
            return Ok(false);
        };
        let alloc = match self.alloc.allocate(bytes, 0) {
            Ok(a) => a,
            Err(crate::error::AllocError::OutOfMemory { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let r = self.issue_copy(Direction::In, h, alloc.ptr, host, bytes);
        match r {
            Ok(transfer) => {
                let e = self.reg.get_mut(h)?;
                e.place = Place::PrefetchingIn {
                    alloc,
                    host,
                    transfer,
                };
                e.prefetched_unused = true;
                e.prefetch_blocked = !host.is_warm();
                self.stats.prefetches += 1;
                self.stats.prefetched_bytes += bytes;
                Ok(true)
            }
            Err(e) => {
                self.stats.transfer_failures += 1;
                self.release_copy_target(e.orphan, alloc)?;
                Ok(false)
            }
        }
    }

    /// Synchronous fetch of a tensor on the host (an access fault). On a failed copy the
    /// tensor stays on the host and the error is returned.
    fn fault_in(
        &mut self,
        h: TensorHandle,
        bytes: u64,
        host: HostLoc,
    ) -> Result<DevicePtr, TierError> {
        self.stats.faults += 1;
        self.stats.fault_bytes += bytes;
        let alloc = self.device_alloc(bytes)?;
        let r = self.issue_copy(Direction::In, h, alloc.ptr, host, bytes);
        let transfer = match r {
            Ok(t) => t,
            Err(e) => {
                self.stats.transfer_failures += 1;
                self.release_copy_target(e.orphan, alloc)?;
                return Err(TierError::Transfer {
                    handle: h,
                    source: e.source,
                });
            }
        };
        self.reg.get_mut(h)?.place = Place::PrefetchingIn {
            alloc,
            host,
            transfer,
        };
        self.wait_for(transfer)?;
        Ok(alloc.ptr)
    }

    /// With the `check-invariants` feature: check after every public operation.
    #[inline]
    fn debug_check(&self) {
        #[cfg(feature = "check-invariants")]
        if let Err(e) = self.check_invariants() {
            panic!("memcast tier invariant violated: {e}");
        }
    }

    /// Device address of a tensor that is on the device now (no movement).
    pub fn device_ptr(&self, h: TensorHandle) -> Result<Option<DevicePtr>, TierError> {
        Ok(self.reg.get(h)?.place.device().map(|a: Allocation| a.ptr))
    }
}
