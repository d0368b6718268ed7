//! Predictive mode: the allocator feeds what it does to a forecaster and acts on the
//! forecast ahead of need. A policy over the core, never a fork of it.
//!
//! The online path ([`online`]):
//! 1. every `allocate` and `deallocate`, and every [`Allocator::iteration_boundary`]
//!    (replay calls it at the trace's markers; a framework once per training step),
//!    appends one event code to a fixed chunk (one store and one compare on the hot
//!    path);
//! 2. a full chunk (`CHUNK`, 16 events, in both modes) goes to the online [`Engine`]: the same
//!    `StepFeaturizer` the trainer reads traces with, then the forecaster, either on
//!    the `ForecastService` thread (default: the allocation path only hands the chunk
//!    over, never waits) or inline (`forecast_thread:false`, deterministic: replay
//!    but under `ReplayOptions::real_time`);
//! 3. after handing a chunk over, the allocator reads the latest forecast without
//!    blocking (a seqlock over atomics; one atomic load when nothing new was
//!    published) and turns it into [`Advice`] through [`plan::ForecastPolicy`]: grow
//!    before a forecast rise, release a reserve the horizon will not need. The growth
//!    policy at a miss ([`plan::ForecastGrowth`]) also reads it, so that the one device
//!    call a miss makes covers the forecast peak.
//!
//! Under a device budget the tiers act on the same forecasts (`tier::predictive`).
//!
//! Forecasts are advice: a forecast that is missing, late, absurd or NaN can cost speed
//! (device calls, memory held), never an allocation error the reactive allocator would
//! not have had, and never corruption. Advice the allocator cannot follow (out of
//! memory) is dropped; non-finite forecasts are ignored.
//!
//! [`Allocator::iteration_boundary`]: crate::Allocator::iteration_boundary
//! [`Engine`]: memcast_predictor::Engine
//! [`Advice`]: crate::policy::Advice

pub mod online;
pub mod plan;

use memcast_predictor::forecaster::{Forecaster, LstmForecaster, NoForecaster, SeasonalForecaster};
use memcast_predictor::{artifact, MAX_HORIZON};

use crate::config::{AllocConfig, ForecasterKind};
use crate::error::AllocError;

pub use memcast_predictor::forecaster::OracleForecaster;

/// The forecaster `cfg` names (`lstm` loads `cfg.model` or the default model).
/// A missing or corrupt model is an error naming the file and the problem.
pub fn forecaster_for(cfg: &AllocConfig) -> Result<Box<dyn Forecaster>, AllocError> {
    let horizon = horizon_of(cfg, None);
    Ok(match cfg.forecaster {
        ForecasterKind::None => Box::new(NoForecaster),
        ForecasterKind::Seasonal => Box::new(SeasonalForecaster { horizon }),
        ForecasterKind::Lstm => {
            let model = match &cfg.model {
                None => artifact::default_model().map_err(|e| {
                    AllocError::Config(format!("predictive mode: the default model: {e}"))
                })?,
                Some(path) => artifact::load_model(std::path::Path::new(path)).map_err(|e| {
                    AllocError::Config(format!(
                        "predictive mode: model {}",
                        crate::config::named(path, &e)
                    ))
                })?,
            };
            let trained = model.weights().config.model.horizon;
            let h = horizon_of(cfg, Some(trained));
            Box::new(LstmForecaster::new(model).with_horizon(h).ok_or_else(|| {
                AllocError::Config(format!(
                    "predictive mode: horizon {h} beyond the {trained} steps the model forecasts"
                ))
            })?)
        }
    })
}

/// Steps forecast ahead: `cfg.horizon`, else the model's (`model_horizon`), else 5.
pub fn horizon_of(cfg: &AllocConfig, model_horizon: Option<usize>) -> usize {
    match cfg.horizon {
        0 => model_horizon.unwrap_or(5),
        h => h as usize,
    }
    .clamp(1, MAX_HORIZON)
}
