//! Recomputation: the third place of a tensor, beside the device and the host.
//!
//! A tensor whose producer is known (its inputs, by handle, through
//! [`TierManager::set_recomputable`]) and whose recompute cost is given
//! (`TensorOpts::recompute_us > 0`) may be *dropped* instead of spilled: its device
//! memory is freed at once, no copy leaves the device and no host bytes are used; it
//! is then [`Place::Dropped`]. Its next access recomputes it on the device: its inputs
//! are brought to the device and pinned, device memory is allocated, the manager's
//! [`Producer`] writes the bytes, and the recompute time is charged on the compute
//! stream (the backend's clock advances by `recompute_us`) and counted as stall
//! (`TierStats::recompute_us`): a recompute runs on the compute stream, so unlike a
//! copy it cannot hide behind the link.
//!
//! A recompute needs its inputs and its own bytes on the device at once, as its
//! producer did; where the budget cannot hold them then (pinned tensors,
//! fragmentation), the access fails with out-of-memory like a fault that does not fit,
//! and the tensor stays dropped. Bytes are never lost; the rules that keep a dropped
//! tensor recomputable:
//! - a tensor is dropped only if a producer is set, none of its inputs is dropped and
//!   no tensor that has it as an input is dropped (recomputes are one op deep);
//! - an input freed by the caller while a dependent is dropped is kept, out of the
//!   caller's sight (a *retained* input: its handle is stale, the bytes stay where they
//!   are and may still be spilled), until its dropped dependents are recomputed, freed
//!   or no longer recomputable; its dependents that are not dropped stop being
//!   recomputable at the free;
//! - before an input is written, its dropped dependents are recomputed (they need it
//!   as it was), and stop being recomputable;
//! - a write to a tensor after the step it was declared recomputable in (its
//!   registration step, the producer's own) makes it no longer its producer's output:
//!   it stops being recomputable.
//!
//! The choice per victim ([`TierConfig::recompute`](super::TierConfig::recompute),
//! off by default; the predictive action `recompute` turns it on): a victim of the
//! watermark, the out-of-memory path or an iteration plan that may be dropped is
//! dropped when its expected recompute stall (its recompute time, plus the copy back
//! of each input off the device now, plus `miss x` that of each input on it, which
//! may have left by the recompute) is below the link time its spill is expected not
//! to hide: `(out + back) x miss` for a spill issued ahead of need, `out + back x miss` on the out-of-memory path
//! (where the caller waits for the copy out), `out` and `back` the measured copy times
//! of its tier, `miss` the share of returns so far that waited for the link (faults
//! and late prefetches over all returns, with one of each counted before the first,
//! so that it starts at one half).
//!
//! Cost: `may_drop` is O(inputs + dependents) hash lookups per candidate victim; a
//! recompute is one device allocation plus the producer's run; a free or a write of a
//! tensor with no dependents is one hash lookup; retaining an input waits for its
//! copies in flight.

use std::collections::{HashMap, HashSet};

use crate::backend::sim::CostModel;
use crate::backend::{BackendError, CopyKind, DeviceBackend, DevicePtr};

use super::handle::{Place, TensorHandle, TensorKey};
use super::manager::TierManager;
use super::spill::Candidate;
use super::TierError;

/// Makes a dropped tensor's bytes again: the op that produced it, run on its inputs.
pub trait Producer<B: DeviceBackend>: Send {
    /// Writes the `bytes` of tensor `h` at `dst`. Its inputs (as given to
    /// [`TierManager::set_recomputable`]) are on the device and pinned.
    fn run(
        &mut self,
        backend: &mut B,
        h: TensorHandle,
        dst: DevicePtr,
        bytes: u64,
    ) -> Result<(), BackendError>;
}

/// A producer that writes nothing, for replay: a trace gives a recompute time, not
/// contents (the simulated device holds none, and the host device's contents are
/// never read back in replay).
#[derive(Debug, Clone, Copy, Default)]
pub struct TimeOnly;

impl<B: DeviceBackend> Producer<B> for TimeOnly {
    fn run(
        &mut self,
        _: &mut B,
        _: TensorHandle,
        _: DevicePtr,
        _: u64,
    ) -> Result<(), BackendError> {
        Ok(())
    }
}

/// One recomputable tensor.
#[derive(Debug, Clone)]
struct Node {
    /// Its producer's inputs.
    // Invariant: registered, distinct, not the tensor itself; each lists the tensor in
    // `Recompute::dependents`.
    inputs: Vec<TensorHandle>,
    /// The step it was declared in, its registration step in replay (writes in it are
    /// its producer's).
    step: u64,
}

/// The manager's recompute state.
pub(crate) struct Recompute<B: DeviceBackend> {
    producer: Option<Box<dyn Producer<B>>>,
    // Invariant: every key is registered with `recompute_us > 0`.
    nodes: HashMap<TensorHandle, Node>,
    // Invariant: `dependents[i]` holds `d` iff `nodes[d].inputs` holds `i`; no empty list.
    dependents: HashMap<TensorHandle, Vec<TensorHandle>>,
    /// Inputs the caller freed, kept for their dropped dependents.
    // Invariant: registered, not in `nodes`, with dependents, every one of them dropped.
    retained: HashSet<TensorHandle>,
    /// Copy times of the sim's measured link (the cost rule): the H200's unless the
    /// manager's spill cost names others ([`super::spill::MigrationCost::cost_model`]).
    pub(crate) model: CostModel,
}

impl<B: DeviceBackend> Default for Recompute<B> {
    fn default() -> Self {
        Recompute {
            producer: None,
            nodes: HashMap::new(),
            dependents: HashMap::new(),
            retained: HashSet::new(),
            model: CostModel::default(),
        }
    }
}

impl<B: DeviceBackend> Recompute<B> {
    /// Unlinks `h`'s own node (its inputs no longer list it); the retained inputs left
    /// with no dependent go to `orphans`.
    fn forget(&mut self, h: TensorHandle, orphans: &mut Vec<TensorHandle>) {
        let Some(n) = self.nodes.remove(&h) else {
            return;
        };
        for i in n.inputs {
            if let Some(v) = self.dependents.get_mut(&i) {
                v.retain(|&d| d != h);
                if v.is_empty() {
                    self.dependents.remove(&i);
                    if self.retained.remove(&i) {
                        orphans.push(i);
                    }
                }
            }
        }
    }
    /// Inputs retained for dropped dependents.
    pub(crate) fn retained(&self) -> usize {
        self.retained.len()
    }
    pub(crate) fn is_retained(&self, h: TensorHandle) -> bool {
        self.retained.contains(&h)
    }
}

impl<B: DeviceBackend> TierManager<B> {
    /// Sets what recomputes dropped tensors. Without one nothing is dropped.
    pub fn set_producer(&mut self, p: Box<dyn Producer<B>>) {
        self.recompute.producer = Some(p);
    }

    /// Declares `h` recomputable from `inputs` (its producer's inputs, registered), in
    /// the step that registered it: writes in this step are its producer's, later ones
    /// make it not recomputable. `h` needs a recompute cost
    /// (`TensorOpts::recompute_us > 0`). Replaces an earlier declaration unless `h` is
    /// dropped now.
    pub fn set_recomputable(
        &mut self,
        h: TensorHandle,
        inputs: &[TensorHandle],
    ) -> Result<(), TierError> {
        let e = self.reg.get(h)?;
        let why = if e.recompute_us <= 0.0 {
            Some("it has no recompute cost")
        } else if matches!(e.place, Place::Dropped) {
            Some("it is dropped")
        } else if inputs.contains(&h) {
            Some("it is its own input")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(TierError::NotRecomputable { handle: h, why });
        }
        for &i in inputs {
            self.reg.get(i)?;
        }
        let mut ins = inputs.to_vec();
        ins.sort_unstable();
        ins.dedup();
        let step = self.step;
        self.forget_node(h)?;
        for &i in &ins {
            self.recompute.dependents.entry(i).or_default().push(h);
        }
        self.recompute.nodes.insert(h, Node { inputs: ins, step });
        Ok(())
    }

    /// Whether `h` is recomputable now (declared, with a producer to run).
    pub fn is_recomputable(&self, h: TensorHandle) -> bool {
        self.recompute.producer.is_some() && self.recompute.nodes.contains_key(&h)
    }

    /// Drops `h` (frees its device memory; its next access recomputes it). `Ok(false)`
    /// if it is not on the device, pinned in this step, has a copy in flight, or may
    /// not be dropped (see the module docs).
    pub fn drop_tensor(&mut self, h: TensorHandle) -> Result<bool, TierError> {
        self.poll()?;
        let e = self.reg.get(h)?;
        if e.step == self.step || e.reader.is_some() || !matches!(e.place, Place::Device { .. }) {
            return Ok(false);
        }
        self.start_drop(h)
    }

    /// Whether `h` may be dropped by the rules in the module docs (place aside).
    /// O(inputs + dependents).
    pub(crate) fn may_drop(&self, h: TensorHandle) -> bool {
        let r = &self.recompute;
        let Some(n) = r.nodes.get(&h) else {
            return false;
        };
        let dropped = |x: &TensorHandle| {
            self.reg
                .get(*x)
                .map_or(true, |e| matches!(e.place, Place::Dropped))
        };
        r.producer.is_some()
            && !n.inputs.iter().any(dropped)
            && !r.dependents.get(&h).is_some_and(|v| v.iter().any(dropped))
    }

    /// The cost rule (module docs): drop victim `c` rather than spill it?
    pub(crate) fn prefer_drop(&self, c: &Candidate, sync: bool) -> bool {
        if !self.cfg.recompute || !self.may_drop(c.handle) {
            return false;
        }
        let (out, back) = if c.warm {
            (CopyKind::DeviceToHostPinned, CopyKind::HostToDevicePinned)
        } else {
            (
                CopyKind::DeviceToHostPageable,
                CopyKind::HostToDevicePageable,
            )
        };
        let m = &self.recompute.model;
        let (out_us, back_us) = (m.copy_us(out, c.bytes), m.copy_us(back, c.bytes));
        let s = &self.stats;
        let misses = s.prefetch_misses();
        let miss = (misses + 1) as f64 / (misses + s.prefetch_hits + 2) as f64;
        let unhidden = if sync {
            out_us + back_us * miss
        } else {
            (out_us + back_us) * miss
        };
        // The recompute needs its inputs on the device: one off it now comes back
        // first; one on it may have left by then, and come back late as often as
        // returns do.
        let mut recompute = c.recompute_us;
        if let Some(n) = self.recompute.nodes.get(&c.handle) {
            for &i in &n.inputs {
                let Ok(e) = self.reg.get(i) else { continue };
                let fetch = m.copy_us(back, e.bytes);
                recompute += match e.place {
                    Place::Device { .. } | Place::PrefetchingIn { .. } => fetch * miss,
                    _ => fetch,
                };
                if recompute >= unhidden {
                    return false;
                }
            }
        }
        recompute < unhidden
    }

    /// The cost rule for `h` as a victim issued ahead of need (a planned spill).
    pub(crate) fn prefer_drop_tensor(&self, h: TensorHandle) -> Result<bool, TierError> {
        let e = self.reg.get(h)?;
        let c = Candidate {
            handle: h,
            bytes: e.bytes,
            history: e.history,
            recompute_us: e.recompute_us,
            recompute_prob: e.recompute_prob,
            warm: e.bytes <= self.staging.free_bytes(),
            persistent: e.persistent,
            next_use: f64::INFINITY,
        };
        Ok(self.prefer_drop(&c, false))
    }

    /// Drops `h`, on the device and not pinned, if the rules allow. Frees its memory now.
    pub(crate) fn start_drop(&mut self, h: TensorHandle) -> Result<bool, TierError> {
        if !self.may_drop(h) {
            return Ok(false);
        }
        let e = self.reg.get_mut(h)?;
        let (Place::Device { alloc }, None) = (e.place, e.reader) else {
            return Ok(false);
        };
        e.place = Place::Dropped;
        if e.prefetched_unused {
            e.prefetched_unused = false;
            self.stats.prefetch_wasted += 1;
        }
        self.stats.drops += 1;
        self.stats.dropped_bytes += alloc.size;
        self.alloc.deallocate(alloc, 0)?;
        Ok(true)
    }

    /// Recomputes dropped `h` on the device (its access): inputs in and pinned, device
    /// memory, the producer, the charge. On an error `h` stays dropped.
    pub(crate) fn recompute_in(&mut self, h: TensorHandle) -> Result<DevicePtr, TierError> {
        let inputs = match self.recompute.nodes.get(&h) {
            Some(n) => n.inputs.clone(),
            None => {
                return Err(TierError::Invariant(format!(
                    "tensor {h} is dropped but not recomputable"
                )))
            }
        };
        let step = self.step;
        for i in inputs {
            let e = self.reg.get_mut(i)?;
            let before = e.step;
            e.step = step;
            if let Err(err) = self.bring(i) {
                self.unpin(i, before);
                return Err(err);
            }
        }
        let (bytes, us) = {
            let e = self.reg.get(h)?;
            (e.bytes, e.recompute_us)
        };
        let alloc = self.device_alloc(bytes)?;
        let Some(mut p) = self.recompute.producer.take() else {
            self.alloc.deallocate(alloc, 0)?;
            return Err(TierError::Invariant(format!(
                "tensor {h} is dropped and no producer is set"
            )));
        };
        let r = p.run(self.alloc.backend_mut(), h, alloc.ptr, bytes);
        self.recompute.producer = Some(p);
        if let Err(source) = r {
            self.alloc.deallocate(alloc, 0)?;
            return Err(TierError::Transfer { handle: h, source });
        }
        // The producer's kernel on the compute stream: the clock moves, the caller waits.
        self.alloc.backend_mut().advance_us(us);
        self.stats.recomputes += 1;
        self.stats.recomputed_bytes += bytes;
        self.stats.recompute_us += us;
        self.reg.get_mut(h)?.place = Place::Device { alloc };
        // Inputs the caller freed were kept for this recompute only.
        let retained = self
            .recompute
            .nodes
            .get(&h)
            .is_some_and(|n| n.inputs.iter().any(|i| self.recompute.retained.contains(i)));
        if retained {
            self.forget_node(h)?;
        }
        Ok(alloc.ptr)
    }

    /// `h` stops being recomputable; retained inputs it alone held are released.
    fn forget_node(&mut self, h: TensorHandle) -> Result<(), TierError> {
        let mut orphans = Vec::new();
        self.recompute.forget(h, &mut orphans);
        for z in orphans {
            let e = self.reg.remove(z)?;
            self.release_entry(z, &e)?;
        }
        Ok(())
    }

    /// Before `h` is written: its dropped dependents are recomputed from it as it is,
    /// and stop being recomputable; written after its declaration step, `h` itself
    /// stops being recomputable.
    pub(crate) fn recompute_before_write(&mut self, h: TensorHandle) -> Result<(), TierError> {
        if let Some(deps) = self.recompute.dependents.get(&h).cloned() {
            for d in deps {
                if matches!(self.reg.get(d)?.place, Place::Dropped) {
                    self.recompute_in(d)?;
                    self.stats.early_recomputes += 1;
                }
                self.forget_node(d)?;
            }
        }
        if self
            .recompute
            .nodes
            .get(&h)
            .is_some_and(|n| n.step != self.step)
        {
            self.forget_node(h)?;
        }
        Ok(())
    }

    /// `h` is being freed by the caller: it stops being recomputable, and so do its
    /// dependents that are not dropped. With dropped dependents it is retained (moved
    /// to a handle of its own, its copies in flight waited for) and `Ok(true)` is
    /// returned: the caller's handle is then stale and nothing else is to be released.
    pub(crate) fn recompute_on_free(&mut self, h: TensorHandle) -> Result<bool, TierError> {
        self.forget_node(h)?;
        let Some(deps) = self.recompute.dependents.get(&h).cloned() else {
            return Ok(false);
        };
        let mut dropped = Vec::new();
        for d in deps {
            if matches!(self.reg.get(d)?.place, Place::Dropped) {
                dropped.push(d);
            } else {
                self.forget_node(d)?;
            }
        }
        if dropped.is_empty() {
            return Ok(false);
        }
        // Let its copies land; a stuck one cannot be waited for, and is told the new
        // handle instead.
        loop {
            let e = self.reg.get(h)?;
            match e.place.in_flight().or(e.reader) {
                Some(t) if !self.pipe.is_stuck(t) => self.wait_for(t)?,
                _ => break,
            }
        }
        let e = self.reg.remove(h)?;
        let z = self.reg.insert(e);
        self.pipe.rehandle(h, z);
        self.reg.get_mut(z)?.key = TensorKey::Persistent(z);
        let r = &mut self.recompute;
        r.dependents.remove(&h);
        for d in &dropped {
            if let Some(n) = r.nodes.get_mut(d) {
                for i in n.inputs.iter_mut().filter(|i| **i == h) {
                    *i = z;
                }
            }
        }
        r.dependents.insert(z, dropped);
        r.retained.insert(z);
        Ok(true)
    }

    /// Every tensor stops being recomputable and retained inputs are released
    /// (shutdown: nothing is recomputed any more).
    pub(crate) fn recompute_clear(&mut self) -> Result<(), TierError> {
        let r = &mut self.recompute;
        r.nodes.clear();
        r.dependents.clear();
        for z in std::mem::take(&mut r.retained) {
            let e = self.reg.remove(z)?;
            self.release_entry(z, &e)?;
        }
        Ok(())
    }

    /// The recompute invariants: a dropped tensor is recomputable by the rules; the
    /// node and dependent tables agree with each other and with the registry.
    pub(crate) fn check_recompute(&self) -> Result<(), String> {
        let r = &self.recompute;
        for (&h, n) in &r.nodes {
            let e = self
                .reg
                .get(h)
                .map_err(|_| format!("recompute node {h} is not registered"))?;
            if e.recompute_us <= 0.0 {
                return Err(format!("recompute node {h} has no recompute cost"));
            }
            for i in &n.inputs {
                if self.reg.get(*i).is_err() || *i == h {
                    return Err(format!("tensor {h}: input {i} is not a registered other"));
                }
                if !r.dependents.get(i).is_some_and(|v| v.contains(&h)) {
                    return Err(format!("tensor {h}: input {i} does not list it"));
                }
            }
        }
        for (i, v) in &r.dependents {
            if v.is_empty() {
                return Err(format!("tensor {i}: empty dependent list"));
            }
            for d in v {
                if !r.nodes.get(d).is_some_and(|n| n.inputs.contains(i)) {
                    return Err(format!("tensor {i} lists {d}, which does not take it"));
                }
            }
        }
        let dropped = |x: &TensorHandle| {
            self.reg
                .get(*x)
                .is_ok_and(|e| matches!(e.place, Place::Dropped))
        };
        for z in &r.retained {
            if self.reg.get(*z).is_err() || r.nodes.contains_key(z) {
                return Err(format!(
                    "retained input {z} is not registered or is recomputable"
                ));
            }
            if !r.dependents.get(z).is_some_and(|v| v.iter().all(dropped)) {
                return Err(format!(
                    "retained input {z} has a dependent that is not dropped"
                ));
            }
        }
        for (h, e) in self.reg.iter() {
            if !matches!(e.place, Place::Dropped) {
                continue;
            }
            let Some(n) = r.nodes.get(&h) else {
                return Err(format!("tensor {h} is dropped and not recomputable"));
            };
            if r.producer.is_none() {
                return Err(format!("tensor {h} is dropped and no producer is set"));
            }
            if n.inputs.iter().any(dropped) {
                return Err(format!("tensor {h} is dropped with a dropped input"));
            }
        }
        Ok(())
    }
}
