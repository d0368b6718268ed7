//! The manager's side of prefetching: the registry as a prefetch policy sees it, and
//! running the policy after each operation within the prefetch headroom.

use crate::backend::DeviceBackend;

use super::handle::{Place, Registry, TensorHandle, TensorKey};
use super::manager::TierManager;
use super::prefetch::{PrefetchView, Residency};
use super::TierError;

impl<B: DeviceBackend> TierManager<B> {
    /// Headroom for prefetches: `prefetch_watermark x budget - device bytes in use`,
    /// counting spills in flight as still in use.
    fn prefetch_headroom(&self) -> u64 {
        let limit = (self.cfg.prefetch_watermark * self.cfg.budget as f64) as u64;
        limit.saturating_sub(self.alloc.stats().allocated.current)
    }

    pub(crate) fn run_prefetcher(&mut self) -> Result<(), TierError> {
        let headroom = self.prefetch_headroom();
        // Without headroom the policy is asked only for swap ahead's sake: which
        // predicted read it has no room for.
        let swap = self.swap_ready();
        if headroom == 0 && !swap {
            return Ok(());
        }
        let mut plan = std::mem::take(&mut self.plan);
        plan.clear();
        {
            let view = View {
                reg: &self.reg,
                ordinals: &self.ordinals,
            };
            self.prefetch.plan(&view, headroom, &mut plan);
        }
        if self.planner.is_some() {
            plan.retain(|&h| !self.plan_holds(h));
        }
        let mut r = Ok(());
        for &h in &plan {
            match self.start_prefetch(h) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
        }
        self.plan = plan;
        r?;
        if swap && self.swap_ready() {
            self.swap_ahead()?;
        }
        Ok(())
    }
}

impl<B: DeviceBackend> TierManager<B> {
    /// The registry as a prefetch policy sees it.
    pub(crate) fn view(&self) -> impl PrefetchView + '_ {
        View {
            reg: &self.reg,
            ordinals: &self.ordinals,
        }
    }
}

/// The registry as the prefetch policy sees it.
struct View<'a> {
    reg: &'a Registry,
    ordinals: &'a [TensorHandle],
}

impl PrefetchView for View<'_> {
    fn lookup(&self, key: TensorKey) -> Option<(TensorHandle, Residency, u64)> {
        let h = match key {
            TensorKey::Persistent(h) => h,
            TensorKey::Ordinal(n) => *self.ordinals.get(n as usize)?,
        };
        let e = self.reg.get(h).ok()?;
        let r = match e.place {
            Place::Device { .. } => Residency::Device,
            Place::Host { .. } => Residency::Host,
            Place::PrefetchingIn { .. } => Residency::Incoming,
            Place::SpillingOut { .. } => Residency::Outgoing,
            Place::Dropped => Residency::Dropped,
        };
        Some((h, r, e.bytes))
    }
}
