//! `memcast-predictor`: forecasts the next N steps of memory demand.
//!
//! - `infer`, [`weights`], [`service`], [`forecaster`]: embedded inference, always
//!   built, no burn: a plain-Rust incremental LSTM loaded from safetensors, the
//!   [`Forecaster`] trait with the LSTM, seasonal, oracle and no-forecast forecasters,
//!   the online [`Engine`] (featurizer + forecaster) and the `ForecastService` thread
//!   the allocator talks to without blocking.
//! - [`data`], [`norm`], [`eval`]: step series, normalisation, baselines and metrics.
//! - `train` (cargo feature `train`): the burn model, training, burn-record export.
//!
//! Step features come from `memcast_trace::features` (one featurizer, offline and online).

pub mod artifact;
mod config;
pub mod data;
mod error;
pub mod eval;
pub mod forecaster;
mod infer;
pub mod norm;
pub mod service;
#[cfg(feature = "train")]
pub mod train;
pub mod weights;

pub use config::{ArtifactConfig, ModelConfig, TrainConfig, MAX_HORIZON};
pub use error::{PredictorError, Result};
pub use forecaster::{Engine, Forecaster};
pub use infer::{EmbeddedLstm, Forecast, StepInput};
pub use service::{EventChunk, ForecastService, ServiceStats};
pub use weights::Weights;
