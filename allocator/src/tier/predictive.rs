//! Predictive tiers: the tier manager acts on a demand forecast and on predicted next
//! uses; the mechanisms (staging pool, pipeline, watermarks, the out-of-memory path)
//! stay the reactive ones.
//!
//! - **Demand**: the manager feeds its *logical* events (a registration's bytes, a
//!   free's bytes, iteration boundaries: not the allocator's, which include prefetch
//!   and fault traffic) to an online [`Engine`] of its own and keeps its latest
//!   forecast. From it, the device memory the horizon needs:
//!   `need = allocated + max(0, L + rise - live) x trust`, with `rise` the forecast
//!   peak rise over the horizon (capped at the largest rise seen), `L` the logical live
//!   bytes when the forecast was made and `live` those now (see
//!   `predictive::plan` for the same formula without a budget).
//! - **Spill ahead** (`Actions::spill`): when `need` passes `high_watermark x budget`
//!   and no spill is in flight (the device-to-host link is idle), spills start now,
//!   down to `low_watermark x budget`, instead of when an allocation meets the
//!   watermark: the copies run while compute goes on.
//! - **Victims by next use** (`Actions::spill`): [`FarthestNextUse`](super::spill::FarthestNextUse)
//!   spills first the tensors whose next access, as the previous iteration's sequence
//!   predicts it, is farthest (Belady's choice on the predicted future).
//! - **Prefetch as soon as memory frees** (`Actions::prefetch`): the prefetcher also
//!   runs after every free, not only after registrations and accesses, so spilled
//!   tensors start back as early as free memory allows.
//!
//! The oracle forecaster knows the true future *demand*; next uses come from the
//! previous iteration for every forecaster (exact on static graphs).
//!
//! [`Engine`]: memcast_predictor::Engine

use memcast_predictor::forecaster::{encode_alloc, encode_free, Code, Forecaster, BOUNDARY};
use memcast_predictor::{Engine, Forecast};
use memcast_trace::features::StepConfig;

use crate::backend::DeviceBackend;
use crate::config::Actions;

use super::manager::TierManager;
use super::TierError;

/// The demand forecast a predictive tier manager keeps.
pub struct Demand {
    engine: Engine,
    latest: Option<Forecast>,
    fresh: bool,
    pub actions: Actions,
    /// Spill batches started ahead of need.
    pub ahead_spills: u64,
}

impl std::fmt::Debug for Demand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Demand")
            .field("forecaster", &self.engine.forecaster_name())
            .field("actions", &self.actions)
            .finish_non_exhaustive()
    }
}

impl Demand {
    pub fn new(forecaster: Box<dyn Forecaster>, actions: Actions) -> Self {
        Demand {
            engine: Engine::new(StepConfig::default(), forecaster),
            latest: None,
            fresh: false,
            actions,
            ahead_spills: 0,
        }
    }

    pub fn forecaster_name(&self) -> &'static str {
        self.engine.forecaster_name()
    }

    fn feed(&mut self, code: Code) {
        let (latest, fresh) = (&mut self.latest, &mut self.fresh);
        self.engine.feed(&[code], |f| {
            *latest = Some(*f);
            *fresh = true;
        });
    }
}

impl<B: DeviceBackend> TierManager<B> {
    /// Turns on predictive tiers over `forecaster` (see the module docs). The spill
    /// policy is the caller's choice (`FarthestNextUse` for victims by next use).
    pub fn set_demand(&mut self, demand: Demand) {
        self.demand = Some(Box::new(demand));
    }

    pub fn demand(&self) -> Option<&Demand> {
        self.demand.as_deref()
    }

    /// A registration of `bytes` (hook of `register`).
    pub(crate) fn demand_alloc(&mut self, bytes: u64) -> Result<(), TierError> {
        self.logical += bytes;
        if let Some(d) = self.demand.as_deref_mut() {
            d.feed(encode_alloc(bytes));
            self.act_on_forecast()?;
        }
        Ok(())
    }

    /// A free of `bytes` (hook of `free`).
    pub(crate) fn demand_free(&mut self, bytes: u64) -> Result<(), TierError> {
        self.logical -= bytes;
        let Some(d) = self.demand.as_deref_mut() else {
            return Ok(());
        };
        d.feed(encode_free(bytes));
        let prefetch = d.actions.prefetch;
        self.act_on_forecast()?;
        if prefetch {
            self.run_prefetcher()?;
        }
        Ok(())
    }

    /// An iteration boundary (hook of `iteration_boundary`).
    pub(crate) fn demand_boundary(&mut self) -> Result<(), TierError> {
        if let Some(d) = self.demand.as_deref_mut() {
            d.feed(BOUNDARY);
            self.act_on_forecast()?;
        }
        Ok(())
    }

    /// Spills ahead of a forecast peak (see the module docs). Cost: O(horizon) per new
    /// forecast; a spill batch (O(tensors log tensors)) only when one starts.
    fn act_on_forecast(&mut self) -> Result<(), TierError> {
        let Some(d) = self.demand.as_deref_mut() else {
            return Ok(());
        };
        if !d.fresh || !d.actions.spill {
            return Ok(());
        }
        d.fresh = false;
        let Some(f) = d.latest else {
            return Ok(());
        };
        if self.pipe.oldest_out().is_some() {
            return Ok(());
        }
        let budget = self.cfg.budget as f64;
        let Some((ahead, trust)) =
            crate::predictive::plan::forecast_ahead(&f, self.logical, self.cfg.budget)
        else {
            return Ok(());
        };
        let allocated = self.alloc.stats().allocated.current;
        let need = allocated as f64 + ahead as f64 * trust;
        if need <= self.cfg.high_watermark * budget {
            return Ok(());
        }
        let target = (need - self.cfg.low_watermark * budget) as u64;
        let target = target.saturating_sub(self.releasing);
        if target == 0 {
            return Ok(());
        }
        let issued = self.spill_batch(target, false, false)?;
        if issued > 0 {
            let d = self.demand.as_deref_mut().expect("demand");
            d.ahead_spills += 1;
        }
        Ok(())
    }
}
