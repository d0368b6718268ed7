//! From a forecast to advice: the decisions of predictive mode without a budget.
//!
//! A forecast gives, for each of the next `H` steps, the bytes requested (`r_h`), freed
//! (`f_h`) and the step's peak rise (`p_h`, how far live bytes rise within the step).
//! The peak of live requested bytes over the horizon, relative to the live bytes `L`
//! when the forecast was made, is
//!
//! `rise = max(0, max_h (sum_{j<h} (r_j - f_j) + p_h))`
//!
//! and the memory the large-run segment needs beyond what is allocated now is
//! `need = max(0, L + rise - requested now) x large share x trust`: events after the
//! forecast's step already count in `requested now`, so they are not counted twice;
//! the large share is the part of the forecast demand above the size-class groups of
//! slab objects (small objects live in slab segments, which grow on their own). `trust` is how far this run's
//! earlier forecast rises came true (`Forecast::trust`, 0 until one horizon has
//! passed): a forecaster that over-forecasts (a seasonal copy rescaled by a new input
//! shape, say) loses the power to grow memory before it can grow much of it, and an
//! exact one earns it back within a few horizons. And `rise` is capped at the largest
//! rise the run has shown over one horizon so far (`Forecast::seen_rise`): growth ahead
//! moves forward in time the growth of rises like those already seen; a rise beyond
//! every earlier one (a new, larger input shape, or a forecast gone wrong: both
//! happen, and only the first is worth memory) is met at the miss, as the reactive
//! allocator meets it. Nor is a level above `Forecast::level_envelope`, the previous
//! iteration's peak of live bytes rescaled by this iteration's demand so far (after
//! the setup before a job's first boundary: the setup's peak, until this iteration
//! passes it): `need` counts at most `envelope - requested now`. A forecast can rise
//! no more than the run has risen and yet double a peak: predicting, from a point
//! where live bytes already hold an iteration's climb, the whole climb again. With `free = reserved - allocated`:
//! - **grow** (`Actions::grow`): if `need >= free + chunk`, [`Advice::EnsureFree`] for
//!   `need`, `chunk` being the reactive growth chunk (the device grows by at least a
//!   chunk either way). A shortfall of less than a chunk is left to the miss: growing
//!   for it ahead would save one device call at most and, when the forecast is wrong,
//!   hold a chunk no request uses;
//! - **release** (`Actions::release`): if `free > need + 2 chunk` (hysteresis: a
//!   reserve that just missed is not given back and taken again),
//!   [`Advice::TrimTail`] down to `need + chunk`: only the growable segment's free
//!   tail is unmapped, nothing is merged or moved, so releasing changes no placement.
//!
//! A forecast with a non-finite value is ignored whole; values are clamped to the
//! device capacity, so a lying forecaster can make the allocator hold memory (speed,
//! footprint), never fail a request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use memcast_predictor::Forecast;
use memcast_trace::features::CH_TOTAL;

use crate::backend::StreamId;
use crate::config::Actions;
use crate::policy::{Advice, GrowthPolicy, GrowthRequest, ReactiveGrowth};

/// What the last forecast said the horizon's peak needs, for [`ForecastGrowth`]:
/// device bytes allocated at the peak, valid until the allocator has served
/// `until_allocs` allocations (a forecast older than its horizon says nothing).
#[derive(Debug, Default)]
pub struct Target {
    pub bytes: AtomicU64,
    pub until_allocs: AtomicU64,
}

/// The allocator's state a plan reads.
#[derive(Debug, Clone, Copy)]
pub struct State {
    pub stream: StreamId,
    /// The allocator grows growable segments (else fixed ones: no growth ahead).
    pub growable: bool,
    pub requested: u64,
    pub allocated: u64,
    pub reserved: u64,
    /// Free bytes of the stream's pool as `Advice::EnsureFree` counts them (free
    /// extents and cached runs; not free slab slots).
    pub free: u64,
    pub capacity: u64,
    /// Allocations served so far (the allocator's clock).
    pub allocs: u64,
}

/// The forecast peak rise of live requested bytes over the horizon (see the module
/// docs), or `None` for a forecast with a non-finite value. O(horizon).
pub fn peak_rise(f: &Forecast, capacity: u64) -> Option<u64> {
    f.horizon_peak_rise(capacity as f64).map(|r| r as u64)
}

/// What a forecast says lies ahead of live bytes `live` (the same count the forecast's
/// `live_bytes` keeps): `(max(0, L + min(rise, seen rise) - live), trust)`, with trust
/// clamped to `[0, 1]` (0 if not finite); `None` for a forecast without a basis or with
/// a non-finite value. The need formula of the module docs, shared by the allocator's
/// plan and the predictive tiers; the plan also bounds it by the level envelope, the
/// tiers (whose figures were chosen without it) do not. O(horizon).
pub fn forecast_ahead(f: &Forecast, live: u64, capacity: u64) -> Option<(u64, f64)> {
    if !f.reference {
        return None;
    }
    // A rise beyond any this run has shown is not bet on ahead: the miss that meets
    // it grows reactively (see the module docs).
    let rise = peak_rise(f, capacity)?.min(f.seen_rise);
    let ahead = f.live_bytes.saturating_add(rise).saturating_sub(live);
    let trust = if f.trust.is_finite() {
        f.trust.clamp(0.0, 1.0)
    } else {
        0.0
    };
    Some((ahead, trust))
}

/// Turns forecasts into advice. See the module docs.
#[derive(Debug, Clone)]
pub struct ForecastPolicy {
    pub actions: Actions,
    /// The reactive growth chunk (bytes).
    pub chunk: u64,
    /// Allocations a forecast covers (horizon x allocations per step).
    pub span_allocs: u64,
    /// The forecast peak, published for [`ForecastGrowth`].
    pub target: Arc<Target>,
}

impl ForecastPolicy {
    /// The advice for forecast `f` in state `s` (at most one piece), or `None`. A
    /// forecast without a basis (`Forecast::reference`) drives nothing.
    pub fn plan(&self, f: &Forecast, s: &State) -> Option<Advice> {
        let (ahead, trust) = forecast_ahead(f, s.requested, s.capacity)?;
        // A peak above the previous iteration's, rescaled by this one's demand so far
        // (or the setup's, until passed), is not bet on either (see the module docs).
        let ahead = ahead.min(f.level_envelope.saturating_sub(s.requested));
        // Requests below `small_max` live in slab segments, which grow on their own:
        // the large segment is grown for the large share of the forecast demand.
        let n = f.horizon.min(f.bytes.len());
        let (total, small) = f.bytes[..n]
            .iter()
            .fold((0.0, 0.0), |(t, sm), b| (t + b[CH_TOTAL], sm + b[0]));
        let large_share = if total > 0.0 {
            ((total - small) / total).clamp(0.0, 1.0)
        } else {
            1.0
        };
        let need = ((ahead as f64) * large_share * trust).min(s.capacity as f64) as u64;
        tracing::trace!(
            step = f.step_index,
            live = f.live_bytes,
            envelope = f.level_envelope,
            seen_rise = f.seen_rise,
            trust = f.trust,
            need,
            requested = s.requested,
            reserved = s.reserved,
            "forecast read"
        );
        self.target
            .bytes
            .store(s.allocated.saturating_add(need), Ordering::Relaxed);
        self.target
            .until_allocs
            .store(s.allocs + self.span_allocs, Ordering::Relaxed);
        let free = s.free;
        if self.actions.grow && s.growable && need >= free.saturating_add(self.chunk) {
            return Some(Advice::EnsureFree {
                stream: s.stream,
                bytes: free + self.chunk,
            });
        }
        if self.actions.release && s.growable && free > need.saturating_add(2 * self.chunk) {
            return Some(Advice::TrimTail {
                stream: s.stream,
                keep_bytes: need + self.chunk,
            });
        }
        None
    }
}

/// The reactive growth schedule, raised at a miss to the forecast peak: a miss obtains
/// at least what the forecast says the horizon will hold, so the rise costs one device
/// call instead of one per chunk. Growth that follows advice (ahead of need) keeps the
/// reactive schedule: ahead of need the forecast moves growth earlier by a chunk at a
/// time, and only a request that missed makes it take the whole forecast peak.
pub struct ForecastGrowth {
    pub inner: ReactiveGrowth,
    pub target: Arc<Target>,
}

impl GrowthPolicy for ForecastGrowth {
    fn grow_bytes(&mut self, r: &GrowthRequest) -> u64 {
        let reactive = self.inner.grow_bytes(r);
        // Slabs grow in their own small chunks; fixed segments never take more than
        // the reactive schedule (a larger fixed segment is memory the OOM path cannot
        // give back while any block in it lives).
        if r.small || !r.growable || r.ahead {
            return reactive;
        }
        if r.allocs > self.target.until_allocs.load(Ordering::Relaxed) {
            return reactive;
        }
        // Memory the forecast peak needs beyond what is reserved now (the request is
        // one of the forecast allocations; the caller grows by its deficit at least).
        let target = self.target.bytes.load(Ordering::Relaxed);
        let want = target.saturating_sub(r.reserved).min(r.available);
        if want > reactive {
            tracing::debug!(
                reactive,
                want,
                target,
                reserved = r.reserved,
                allocated = r.allocated,
                "growth at a miss raised to the forecast peak"
            );
        }
        reactive.max(want)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memcast_predictor::MAX_HORIZON;
    use memcast_trace::features::{CHANNELS, CH_FREED, CH_PEAK};

    fn fc(steps: &[(f64, f64, f64)]) -> Forecast {
        let mut f = Forecast {
            horizon: steps.len(),
            reference: true,
            trust: 1.0,
            seen_rise: 1 << 40,
            live_bytes: 100,
            ..Forecast::default()
        };
        for (h, &(r, fr, p)) in steps.iter().enumerate() {
            let mut b = [0.0; CHANNELS];
            b[CH_TOTAL] = r;
            b[CH_FREED] = fr;
            b[CH_PEAK] = p;
            f.bytes[h] = b;
        }
        f
    }

    #[test]
    fn peak_rise_follows_the_trajectory() {
        // +10 net, then a step that rises 30 within itself, then a free of 50.
        let f = fc(&[(10.0, 0.0, 10.0), (30.0, 0.0, 30.0), (0.0, 50.0, 0.0)]);
        assert_eq!(peak_rise(&f, 1000), Some(40));
        // Falling demand: no rise.
        assert_eq!(peak_rise(&fc(&[(0.0, 20.0, 0.0)]), 1000), Some(0));
        // NaN anywhere: no forecast. Huge: clamped to the capacity.
        assert_eq!(peak_rise(&fc(&[(f64::NAN, 0.0, 0.0)]), 1000), None);
        assert_eq!(peak_rise(&fc(&[(1e300, 0.0, 1e300)]), 1000), Some(1000));
        assert!(fc(&[]).bytes.len() == MAX_HORIZON);
    }

    /// All actions, a chunk of 32, a forecast covering 80 allocations.
    fn policy() -> ForecastPolicy {
        ForecastPolicy {
            actions: Actions::all(),
            chunk: 32,
            span_allocs: 80,
            target: Arc::default(),
        }
    }

    /// 100 bytes live and allocated, 110 reserved, 10 free.
    fn state() -> State {
        State {
            stream: 0,
            growable: true,
            requested: 100,
            allocated: 100,
            reserved: 110,
            free: 10,
            capacity: 10_000,
            allocs: 7,
        }
    }

    #[test]
    fn a_forecast_above_the_level_envelope_grows_nothing() {
        let (p, s) = (policy(), state());
        let target = |p: &ForecastPolicy| p.target.bytes.load(Ordering::Relaxed);
        // 200 more bytes ahead, within a rise the run has shown, up to a level of 300.
        let up = fc(&[(200.0, 0.0, 200.0)]);
        assert!(p.plan(&up, &s).is_some());
        assert_eq!(target(&p), 300);
        // The previous iteration, rescaled, peaked at 140: 40 more at most, less than
        // a chunk beyond the 10 free: no growth ahead, and the miss grows to 140 at
        // most.
        let capped = Forecast {
            level_envelope: 140,
            ..up
        };
        assert_eq!(p.plan(&capped, &s), None);
        assert_eq!(target(&p), 140);
        // At or below live bytes already: nothing ahead at all.
        let below = Forecast {
            level_envelope: 90,
            ..up
        };
        assert_eq!(p.plan(&below, &s), None);
        assert_eq!(target(&p), 100);
    }

    #[test]
    fn plan_grows_before_a_rise_and_releases_after() {
        let (p, s) = (policy(), state());
        // 200 more bytes ahead, 10 free: grow a chunk now; the miss may take the rest
        // (the target: 100 allocated + 200).
        let grow = Some(Advice::EnsureFree {
            stream: 0,
            bytes: 42,
        });
        let target = |p: &ForecastPolicy| p.target.bytes.load(Ordering::Relaxed);
        let up = fc(&[(200.0, 0.0, 200.0)]);
        assert_eq!(p.plan(&up, &s), grow);
        assert_eq!(target(&p), 300);
        assert_eq!(p.target.until_allocs.load(Ordering::Relaxed), 87);
        // A shortfall of less than a chunk is left to the miss.
        assert_eq!(p.plan(&fc(&[(12.0, 0.0, 12.0)]), &s), None);
        assert_eq!(p.plan(&fc(&[(42.0, 0.0, 42.0)]), &s), grow);
        // 1000 free, nothing ahead: trim to one chunk.
        let idle = State {
            reserved: 1100,
            free: 1000,
            ..s
        };
        assert_eq!(
            p.plan(&fc(&[(0.0, 0.0, 0.0)]), &idle),
            Some(Advice::TrimTail {
                stream: 0,
                keep_bytes: 32
            })
        );
        // Within the hysteresis: nothing.
        let near = State {
            reserved: 150,
            free: 50,
            ..s
        };
        assert_eq!(p.plan(&fc(&[(0.0, 0.0, 0.0)]), &near), None);
        // Allocations since the forecast count once: 150 of the 200 are already live.
        let later = State {
            requested: 250,
            allocated: 250,
            reserved: 260,
            free: 10,
            ..s
        };
        assert_eq!(p.plan(&up, &later), grow);
        assert_eq!(target(&p), 300);
        // A rise never seen before counts only as far as the largest one seen.
        let unseen = Forecast {
            seen_rise: 120,
            ..up
        };
        assert_eq!(p.plan(&unseen, &s), grow);
        assert_eq!(target(&p), 220);
        // Half trusted: half the need.
        let half = Forecast { trust: 0.5, ..up };
        assert_eq!(p.plan(&half, &s), grow);
        assert_eq!(target(&p), 200);
        let little = Forecast { trust: 0.1, ..up };
        assert_eq!(p.plan(&little, &s), None);
        // A forecast without a basis drives nothing.
        let blind = Forecast {
            reference: false,
            ..up
        };
        assert_eq!(p.plan(&blind, &s), None);
        // Actions off: nothing.
        let off = ForecastPolicy {
            actions: Actions::none(),
            ..p
        };
        assert_eq!(off.plan(&up, &s), None);
    }
}
