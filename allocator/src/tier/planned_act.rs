//! Carrying out an iteration plan (see [`super`]): the pending spills that can go and
//! the due prefetches that fit, after each logged operation.

use crate::backend::DeviceBackend;
use crate::tier::handle::{Place, TensorHandle, TensorKey};
use crate::tier::manager::TierManager;
use crate::tier::prefetch::PrefetchView;
use crate::tier::TierError;

use super::Planner;

impl<B: DeviceBackend> TierManager<B> {
    /// Issues the pending spills that can go and the due prefetches that fit.
    pub(crate) fn plan_act(&mut self) -> Result<(), TierError> {
        let Some(mut p) = self.planner.take() else {
            return Ok(());
        };
        let r = self.plan_act_with(&mut p);
        self.planner = Some(p);
        r
    }

    fn plan_act_with(&mut self, p: &mut Planner) -> Result<(), TierError> {
        self.plan_spills_with(p)?;
        self.plan_prefetch_with(p)
    }

    fn plan_spills_with(&mut self, p: &mut Planner) -> Result<(), TierError> {
        if !p.pending_spills.is_empty() {
            let mut keep = Vec::new();
            for d in std::mem::take(&mut p.pending_spills) {
                let (key, bytes, drop) = (d.key, d.bytes, d.drop);
                let Some(h) = self.resolve(key) else {
                    p.stats.skipped += 1;
                    continue;
                };
                let e = self.reg.get(h)?;
                if e.bytes != bytes {
                    p.stats.skipped += 1;
                    continue;
                }
                match e.place {
                    Place::Device { .. } if e.step == self.step || e.reader.is_some() => {
                        keep.push(d);
                    }
                    Place::Device { .. } => {
                        // A spill that cannot start (no host memory, no room in the
                        // pinned pool under `early_spills_pinned`, a failed copy) is
                        // dropped, not retried at every operation.
                        if drop {
                            // Only if the tensor may be dropped now (else skipped).
                            if self.start_drop(h)? {
                                p.stats.drops += 1;
                            } else {
                                p.stats.skipped += 1;
                            }
                        } else if self.prefer_drop_tensor(h)? {
                            // The per-victim cost rule holds for the plan's victims too.
                            if self.start_drop(h)? {
                                p.stats.drops += 1;
                            } else {
                                p.stats.skipped += 1;
                            }
                        } else if self.start_spill(h, true)? {
                            p.stats.spills += 1;
                            if !p.passed.contains(&d.mv) {
                                p.held.insert(key);
                            }
                        } else {
                            p.stats.skipped += 1;
                        }
                    }
                    _ => p.stats.skipped += 1,
                }
            }
            p.pending_spills = keep;
        }
        Ok(())
    }

    fn plan_prefetch_with(&mut self, p: &mut Planner) -> Result<(), TierError> {
        // Deferred wrapped moves are due as soon as the link in is idle with nothing of
        // the plan left to bring back before them: every other move's prefetch point
        // reached, nothing due, no copy in (in the optimizer's step, if the backward's
        // copies are done by then), else from the next iteration's start. Cost: O(1)
        // while a condition fails; at each operation at which all hold, a scan of the
        // wrapped moves not due yet.
        //
        // Past the end of the trajectory the plan came from, the link in is idle
        // because the plan has nothing more to say, not because this iteration is
        // ending: the wrapped moves wait for the next iteration's start.
        if !p.wrapped.is_empty()
            && p.due.is_empty()
            && p.next_prefetch == p.by_prefetch.len()
            && self.pipe.in_bytes == 0
            && !p.past_end()
        {
            let plan = &p.plan;
            // The operation just logged (`record`'s position).
            let pos = p.cur.ops.len().saturating_sub(1);
            let (held, due) = (&mut p.held, &mut p.due);
            p.wrapped.retain(|&i| {
                let m = &plan.moves[i];
                if m.prefetch_at > pos || !held.remove(&m.key) {
                    // Not spilled yet (or skipped): looked at again.
                    return true;
                }
                due.push((m.key, m.bytes));
                false
            });
        }
        if !p.due.is_empty() {
            // The plan kept its trajectory under the cap; the high watermark leaves the
            // room a late or early copy needs.
            let limit = (self.cfg.high_watermark * self.cfg.budget as f64) as u64;
            let mut i = 0;
            while i < p.due.len() {
                let (key, bytes) = p.due[i];
                let Some(h) = self.resolve(key) else {
                    p.due.remove(i);
                    continue;
                };
                let e = self.reg.get(h)?;
                match e.place {
                    Place::Host { .. } if e.bytes == bytes => {
                        let allocated = self.alloc.stats().allocated.current;
                        if allocated + bytes > limit || !self.start_prefetch(h)? {
                            // In plan order: wait for room.
                            break;
                        }
                        p.stats.prefetches += 1;
                        p.held.remove(&key);
                        p.due.remove(i);
                    }
                    // Still on its way out, or its spill still waits to start (a pin):
                    // keep it due, to bring it back once it is out.
                    Place::SpillingOut { .. } => i += 1,
                    Place::Device { .. } if p.pending_spills.iter().any(|d| d.key == key) => i += 1,
                    _ => {
                        p.due.remove(i);
                    }
                }
            }
        }
        Ok(())
    }

    /// The tensor a key names now.
    fn resolve(&self, key: TensorKey) -> Option<TensorHandle> {
        self.view().lookup(key).map(|(h, _, _)| h)
    }
}
