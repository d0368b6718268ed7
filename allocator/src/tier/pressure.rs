//! Device memory pressure: watermark spills, the out-of-memory path, invariants.
//!
//! - Before each device allocation, if allocated device bytes plus the request would
//!   pass `high_watermark x budget` (spills in flight counted as still allocated, or
//!   with `TierConfig::spill_hysteresis` as gone), victims are spilled asynchronously
//!   until the bytes that will remain (spills in flight counted as gone) are at
//!   `low_watermark x budget`,
//!   or, with `TierConfig::early_spills_pinned` (the default), until the pinned pool
//!   has no room for another victim: nothing waits for these spills, and a copy to
//!   pageable memory would hold the host until done. Their device memory is released
//!   when their copies complete.
//! - If the allocation still fails (out of memory), the caller waits: first for spills
//!   already in flight (oldest first), then for new spills it issues and waits for at
//!   once, then for prefetches in flight (which make their tensors spillable) and for
//!   stuck copies to land (their streams synchronized, which frees the device blocks
//!   of stuck copies in), and finally also spills prefetched tensors not yet used.
//!   Before each wait, while the free bytes would hold the request, it first tries to
//!   open a block on the device ([`relocate`](super::relocate),
//!   `TierConfig::relocate`). Only when nothing can move does it return
//!   [`TierError::OutOfMemory`] with the bytes short.
//!
//! Cost: building the candidate list is O(tensors) and ordering it O(n log n); it runs
//! once per watermark crossing (a batch of spills), then, while that batch's copies are
//! in flight, at each allocation that still passes the mark (one with
//! `spill_hysteresis`, until the mark is crossed again), and per out-of-memory retry. While
//! the pinned pool is full (`early_spills_pinned`), allocations above the watermark pay
//! a compare; while it holds only small ranges, the candidate list (no sort once no
//! candidate fits).

use crate::backend::DeviceBackend;
use crate::error::AllocError;
use crate::pool::Allocation;

use super::handle::Place;
use super::manager::TierManager;
use super::spill::{Candidate, MigrationCost};
use super::transfer::{Completion, Direction};
use super::TierError;

impl<B: DeviceBackend> TierManager<B> {
    /// Device memory for `bytes`, spilling as needed. See the module docs.
    pub(crate) fn device_alloc(&mut self, bytes: u64) -> Result<Allocation, TierError> {
        self.poll()?;
        if bytes > self.cfg.budget {
            return Err(self.oom(bytes));
        }
        let budget = self.cfg.budget as f64;
        let allocated = self.alloc.stats().allocated.current;
        // A plan in charge replaces the watermark: its spills are queued in the order
        // they free memory, and more spills behind them would land no sooner (the
        // out-of-memory path below still waits for them, then spills if it must).
        // Where the plan does not cover (a position no gap covers, a move skipped on
        // a dynamic iteration, copies queued later than planned) only that path is
        // left. Measured with the watermark kept on as well: the same mean stall on
        // the corpus's validation split (0.591), GPT-2 5.56 -> 5.97, ResNet-50
        // 3.07 -> 3.42, `gpt2_dynbatch` 1.29 -> 1.19 (docs/predictive.md).
        let planned = self.planner.as_deref().is_some_and(|p| p.has_moves());
        // `spill_hysteresis`: spills in flight count as gone here too (a batch, then none
        // until the mark is crossed again, if the batch reached the low watermark); off,
        // each allocation above the mark while copies are in flight spills up to its own
        // size.
        debug_assert!(
            self.releasing <= allocated,
            "spills in flight above allocated"
        );
        let counted = if self.cfg.spill_hysteresis {
            allocated.saturating_sub(self.releasing)
        } else {
            allocated
        };
        if !planned && (counted + bytes) as f64 > self.cfg.high_watermark * budget {
            let keep = (self.cfg.low_watermark * budget) as u64;
            let target = (allocated + bytes)
                .saturating_sub(self.releasing)
                .saturating_sub(keep);
            if target > 0 {
                self.spill_batch(target, false, false)?;
            }
        }
        let mut stage = 0;
        let mut relocated = false;
        loop {
            match self.alloc.allocate(bytes, 0) {
                Ok(a) => return Ok(a),
                Err(AllocError::OutOfMemory { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            // Out of memory: make room, in order of increasing cost. With the free bytes
            // to hold the request, the layout refused it: moving one window's tensors on
            // the device costs less than any copy over the link. Tried again after each
            // wait below (what landed may leave room outside a window) until a round
            // opens its window; the retry after that round is served.
            if !relocated && self.relocate_window(bytes)? {
                relocated = true;
                continue;
            }
            let t0 = self.stats.transfer_stall_us;
            if let Some(id) = self.pipe.oldest_out() {
                self.wait_for(id)?;
                self.stats.oom_wait_out_us += self.stats.transfer_stall_us - t0;
                continue;
            }
            if stage == 0 {
                let issued = match self.spill_window(bytes, false)? {
                    0 => self.spill_batch(bytes, false, true)?,
                    n => n,
                };
                if issued > 0 {
                    self.stats.sync_spills += 1;
                    self.stats.oom_spilled_bytes += issued;
                    self.wait_spills()?;
                    self.stats.oom_spill_us += self.stats.transfer_stall_us - t0;
                    continue;
                }
                stage = 1;
            }
            if stage == 1 {
                // Prefetches in flight hold device memory: let them land, then they
                // (prefetched, unused) may be spilled like the rest.
                let mut waited = false;
                while self.pipe.in_bytes > 0 {
                    self.synchronize()?;
                    waited = true;
                }
                // A stuck copy in holds its device block until its stream
                // synchronizes, which `synchronize` tries: once here, where memory is
                // short, whether or not anything else was in flight.
                let stuck = self.pipe.stuck();
                if stuck > 0 {
                    self.synchronize()?;
                    waited |= self.pipe.stuck() < stuck;
                }
                self.stats.oom_wait_in_us += self.stats.transfer_stall_us - t0;
                stage = 2;
                if waited {
                    continue;
                }
            }
            if stage == 2 {
                let issued = match self.spill_window(bytes, true)? {
                    0 => self.spill_batch(bytes, true, true)?,
                    n => n,
                };
                if issued > 0 {
                    self.stats.sync_spills += 1;
                    self.stats.oom_spilled_bytes += issued;
                    self.wait_spills()?;
                    self.stats.oom_spill_us += self.stats.transfer_stall_us - t0;
                    stage = 0;
                    continue;
                }
            }
            return Err(self.oom(bytes));
        }
    }

    fn wait_spills(&mut self) -> Result<(), TierError> {
        while let Some(id) = self.pipe.oldest_out() {
            self.wait_for(id)?;
        }
        Ok(())
    }

    /// Issues spills of unpinned device tensors, in the spill policy's order, until
    /// `target` bytes are on their way out. `with_prefetched`: also tensors brought back
    /// by a prefetch and not used yet (last resort). With `TierConfig::recompute`, a
    /// victim the cost rule prefers to drop is dropped instead (its bytes freed now);
    /// `sync`: the caller waits for the copies out (the out-of-memory path), which the
    /// rule counts. Returns the bytes issued or freed.
    pub(crate) fn spill_batch(
        &mut self,
        target: u64,
        with_prefetched: bool,
        sync: bool,
    ) -> Result<u64, TierError> {
        // With `early_spills_pinned`, a batch nothing waits for spills only tensors the
        // pinned pool has room for: with a full pool it costs one compare, not the
        // candidate list and its sort at every allocation above the watermark.
        let pinned_only = !sync && self.cfg.early_spills_pinned;
        if pinned_only && self.staging.free_bytes() == 0 {
            self.stats.early_spills_refused += 1;
            return Ok(0);
        }
        let mut cands = self.candidates(with_prefetched);
        let n = cands.len();
        if pinned_only {
            cands.retain(|c| c.warm);
        }
        // A batch the pool turned away, wholly or in part, counts once: the tensors it
        // left out, and those `start_spill` refused once earlier ones took the room.
        let (refused0, left_out) = (self.stats.early_spills_refused, cands.len() < n);
        if cands.is_empty() {
            if left_out {
                self.stats.early_spills_refused += 1;
            }
            return Ok(0);
        }
        let now = self.alloc.backend().now_us();
        let mut order = self.spill.order(&cands, target, now, self.cost.as_ref());
        if self.cfg.protect_upcoming {
            // Tensors the prefetch policy expects soon go last (stable: the spill
            // policy's order holds within each group).
            let mut soon = Vec::new();
            self.prefetch.upcoming(&self.view(), &mut soon);
            if !soon.is_empty() {
                let soon: std::collections::HashSet<_> = soon.into_iter().collect();
                order.sort_by_key(|&i| cands.get(i).is_some_and(|c| soon.contains(&c.handle)));
            }
        }
        let mut issued = 0;
        for i in order {
            if issued >= target {
                break;
            }
            let Some(c) = cands.get(i) else { continue };
            issued += self.spill_or_drop(c, sync)?;
        }
        if pinned_only {
            let refused = left_out || self.stats.early_spills_refused > refused0;
            self.stats.early_spills_refused = refused0 + u64::from(refused && issued < target);
        }
        Ok(issued)
    }

    /// Spills (or drops, see [`TierManager::spill_batch`]) one candidate; the bytes
    /// moved (0 if it could not move).
    pub(crate) fn spill_or_drop(&mut self, c: &Candidate, sync: bool) -> Result<u64, TierError> {
        let moved = if self.prefer_drop(c, sync) {
            self.start_drop(c.handle)?
        } else {
            self.start_spill(c.handle, !sync)?
        };
        Ok(if moved { c.bytes } else { 0 })
    }

    /// The out-of-memory path by address (`TierConfig::oom_by_address`): when the
    /// allocator's large segments hold at least `bytes` free, the request failed for
    /// want of a contiguous block. Spills every tensor of the window of `bytes` whose
    /// candidates cost least to move (the migration cost), a window holding nothing
    /// else live (no pinned tensor, copy in flight or non-candidate); all of them or,
    /// if one cannot move, none counted (the caller falls back to the spill policy).
    /// Returns the bytes issued; 0: no window, or not fragmentation.
    ///
    /// Cost: the candidates (O(tensors)), a map by address, and the allocator's sweep
    /// over the blocks of its large segments (O(blocks)); only on out-of-memory retries.
    fn spill_window(&mut self, bytes: u64, with_prefetched: bool) -> Result<u64, TierError> {
        if !self.cfg.oom_by_address || self.alloc.large_free_bytes(0) < bytes {
            return Ok(0);
        }
        let cands = self.candidates(with_prefetched);
        let by_ptr = self.by_device_ptr(&cands);
        let cost = self.cost.as_ref();
        let Some(w) = self.alloc.cheapest_window(bytes, 0, |p| {
            by_ptr.get(&p.0).map(|&i| window_cost(cost, &cands[i]))
        }) else {
            return Ok(0);
        };
        let mut issued = 0;
        for p in &w.victims {
            let Some(&i) = by_ptr.get(&p.0) else {
                continue;
            };
            let c = cands[i];
            let moved = self.spill_or_drop(&c, true)?;
            if moved == 0 {
                // The window will not open this round: the policy's order follows.
                return Ok(0);
            }
            issued += moved;
        }
        if issued > 0 {
            self.stats.oom_windows += 1;
        }
        Ok(issued)
    }

    /// Each candidate's index in `cands` by its device address. O(candidates).
    pub(crate) fn by_device_ptr(
        &self,
        cands: &[Candidate],
    ) -> std::collections::HashMap<u64, usize> {
        cands
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some((self.reg.get(c.handle).ok()?.place.device()?.ptr.0, i)))
            .collect()
    }

    /// The spill candidates: unpinned device tensors with no copy in flight (and, with
    /// `with_prefetched`, those prefetched and not used yet). O(tensors).
    pub(crate) fn candidates(&self, with_prefetched: bool) -> Vec<Candidate> {
        let warm_free = self.staging.free_bytes();
        let step = self.step;
        let next_use = self.spill.reads_next_use();
        self.reg
            .iter()
            .filter(|(_, e)| {
                matches!(e.place, Place::Device { .. })
                    && e.step != step
                    && e.reader.is_none()
                    && (with_prefetched || !e.prefetched_unused)
            })
            .map(|(h, e)| Candidate {
                handle: h,
                bytes: e.bytes,
                history: e.history,
                recompute_us: e.recompute_us,
                recompute_prob: e.recompute_prob,
                warm: e.bytes <= warm_free,
                persistent: e.persistent,
                next_use: if next_use {
                    self.prefetch.next_use(e.key)
                } else {
                    f64::INFINITY
                },
            })
            .collect()
    }

    /// The out-of-memory error for a request of `bytes` that nothing more can serve.
    fn oom(&mut self, bytes: u64) -> TierError {
        self.stats.ooms += 1;
        let step = self.step;
        // Bytes that cannot move now: pinned tensors and anything with device memory
        // that is not a spill candidate.
        let in_use: u64 = self
            .reg
            .iter()
            .filter(|(_, e)| {
                e.place.device().is_some() && (e.step == step || e.place.in_flight().is_some())
            })
            .map(|(_, e)| e.bytes)
            .sum();
        let budget = self.cfg.budget;
        let short = (bytes + in_use).saturating_sub(budget);
        let detail = if short == 0 {
            let (free, largest) = self.alloc.free_and_largest();
            let reserved = self.alloc.stats().reserved.current;
            format!(
                " (fragmentation: {reserved} bytes reserved, {free} free in the allocator, \
                 largest free block {largest}, budget left unreserved {})",
                budget.saturating_sub(self.alloc.backend().used())
            )
        } else {
            String::new()
        };
        TierError::OutOfMemory {
            requested: bytes,
            in_use,
            budget,
            short: short.max(1),
            detail,
        }
    }

    /// Checks the manager's bookkeeping (and the allocator's, and the prefetch policy's).
    /// O(tensors + transfers + this iteration's ordinals).
    pub fn check_invariants(&self) -> Result<(), TierError> {
        let bad = |s: String| Err(TierError::Invariant(s));
        self.reg.check()?;
        self.staging
            .check_invariants()
            .map_err(TierError::Invariant)?;
        self.pipe.check_invariants().map_err(TierError::Invariant)?;
        self.prefetch
            .check_invariants()
            .map_err(TierError::Invariant)?;
        self.check_recompute().map_err(TierError::Invariant)?;
        self.alloc.check_invariants()?;
        let mut device = 0u64;
        let mut releasing = 0u64;
        let mut host = 0u64;
        // Bytes of the pinned pool held by tensors and by copies whose buffers are
        // released when they land: the manager owns the pool alone, so exactly those
        // in use.
        let mut warm = 0u64;
        let mut in_flight = std::collections::HashMap::new();
        for f in self.pipe.iter() {
            in_flight.insert(f.id, *f);
            if let Completion::Release {
                device: d,
                host: hl,
            } = f.completion
            {
                if let Some(a) = d {
                    device += a.size;
                }
                if let Some(hl) = hl {
                    host += hl.bytes();
                    warm += self.held_warm(&hl)?;
                }
            }
        }
        for (h, e) in self.reg.iter() {
            // Pinned by the current step: its kernel uses it, so it is on the device
            // and no copy of it is leaving.
            if e.step == self.step && !matches!(e.place, Place::Device { .. }) {
                return bad(format!(
                    "tensor {h}: pinned by step {} but at {:?}",
                    self.step, e.place
                ));
            }
            if let Some(t) = e.reader {
                let ok = in_flight.get(&t).is_some_and(|f| {
                    matches!(f.completion, Completion::Release { device: None, .. })
                });
                if !ok || !matches!(e.place, Place::Device { .. }) {
                    return bad(format!(
                        "tensor {h}: reader transfer {t:?} is not an orphan in flight"
                    ));
                }
            }
            if let Some(a) = e.place.device() {
                if a.size != e.bytes {
                    return bad(format!(
                        "tensor {h}: {} bytes, device block of {}",
                        e.bytes, a.size
                    ));
                }
                device += a.size;
            }
            if let Some(hl) = e.place.host() {
                host += hl.bytes();
                warm += self.held_warm(&hl)?;
            }
            if let Place::SpillingOut { transfer, .. } | Place::PrefetchingIn { transfer, .. } =
                e.place
            {
                let ok = in_flight.get(&transfer).is_some_and(|f| {
                    f.handle == h
                        && f.completion == Completion::Finish
                        && (f.dir == Direction::Out) == matches!(e.place, Place::SpillingOut { .. })
                });
                if !ok {
                    return bad(format!(
                        "tensor {h} at {:?}: its transfer is not in flight",
                        e.place
                    ));
                }
                if matches!(e.place, Place::SpillingOut { .. }) {
                    releasing += e.bytes;
                }
            }
        }
        for f in in_flight.values() {
            if f.completion == Completion::Finish && self.reg.get(f.handle).is_err() {
                return bad(format!(
                    "transfer {:?} finishes tensor {}, which is freed",
                    f.id, f.handle
                ));
            }
        }
        // Retained inputs were freed by the caller: not logical bytes.
        let logical: u64 = self
            .reg
            .iter()
            .filter(|(h, _)| !self.recompute.is_retained(*h))
            .map(|(_, e)| e.bytes)
            .sum();
        if logical != self.logical {
            return bad(format!(
                "logical bytes {} counted, {logical} registered",
                self.logical
            ));
        }
        let requested = self.alloc.stats().requested.current;
        if device != requested {
            return bad(format!("tensors and transfers hold {device} device bytes, allocator has {requested} requested"));
        }
        if releasing != self.releasing {
            return bad(format!(
                "releasing {} counted, {releasing} found",
                self.releasing
            ));
        }
        if host != self.stats.host_bytes {
            return bad(format!(
                "host bytes {} counted, {host} found",
                self.stats.host_bytes
            ));
        }
        let warm_used = self.staging.size() - self.staging.free_bytes();
        if warm_used != warm {
            return bad(format!(
                "staging has {warm_used} bytes in use, tensors and copies hold {warm}"
            ));
        }
        Ok(())
    }

    /// The pinned bytes `loc` holds (0 for pageable memory), checked against the pool.
    fn held_warm(&self, loc: &super::staging::HostLoc) -> Result<u64, TierError> {
        self.staging.check_loc(loc).map_err(TierError::Invariant)?;
        Ok(if loc.is_warm() { loc.bytes() } else { 0 })
    }
}

/// What spilling `c` costs in an out-of-memory window (`TierManager::spill_window`):
/// its round trip (`MigrationCost::cost_us`), and, for a tensor the prefetch policy
/// predicts to be read again `d` operations from now, that round trip again divided by
/// `1 + d`. A tensor read by the very next operation comes straight back, a fault on
/// the critical path: it costs about twice its trip; one read a thousand operations
/// later, about once (a prefetch has time to bring it back); one with no predicted read
/// (every tensor, with a spill policy that reads no next use: reactive tiers) exactly
/// once, as before. O(1).
///
/// Why: windows were chosen by the round trip alone, and where every tensor is read
/// again soon (generation: each token step reads the key/value caches the last one
/// made) the cheapest window held exactly those tensors: on the train split's
/// `gpt2_medium_generate_dynamic` at 60% the out-of-memory path spilled 103.7 GB and
/// 109.2 GB came back as faults (docs/predictive.md, "Out-of-memory windows by next
/// use").
fn window_cost(cost: &dyn MigrationCost, c: &Candidate) -> f64 {
    let trip = cost.cost_us(c);
    if c.next_use.is_finite() {
        trip + trip / (1.0 + c.next_use.max(0.0))
    } else {
        trip
    }
}
