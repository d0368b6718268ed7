//! Training, burn-side forward and burn-record export (cargo feature `train`).

pub mod backend;
pub mod model;
pub mod trainer;

pub use backend::{train_with, BackendKind};
pub use model::LstmForecaster;
pub use trainer::{EpochReport, NoProgress, Progress, TrainOutcome};
