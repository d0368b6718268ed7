//! Errors of the predictor library. The CLI adds context with anyhow.

use std::path::PathBuf;

/// Everything that can go wrong loading, running or training a forecaster.
#[derive(Debug, thiserror::Error)]
pub enum PredictorError {
    // Messages include the cause (not marked `#[source]`) so anyhow's `{:#}` prints
    // it once, as memcast-trace does.
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{path}: invalid JSON: {err}")]
    Json {
        path: PathBuf,
        err: serde_json::Error,
    },
    #[error("{path}: corrupt weights: {what}")]
    Weights { path: PathBuf, what: String },
    #[error("weights do not match the config: {0}")]
    Mismatch(String),
    /// A tensor (named) holds a value that is not finite: a diverged training run, or
    /// damage.
    #[error("tensor {0} holds NaN or infinity")]
    NonFiniteWeights(String),
    #[error("normalisation statistics: {0}")]
    Norm(String),
    #[error("invalid config: {0}")]
    Config(String),
    #[error("features have width {got}, the model expects {expected}")]
    FeatureWidth { expected: usize, got: usize },
    #[error("feature {index} is not finite ({value})")]
    NonFinite { index: usize, value: f32 },
    #[error("no steps to work on: {0}")]
    Empty(String),
    #[error(transparent)]
    Trace(#[from] memcast_trace::TraceError),
    #[error("training failed: {0}")]
    Train(String),
}

pub type Result<T> = std::result::Result<T, PredictorError>;

/// Wraps an `std::io::Error` with the path it concerns.
pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> PredictorError + '_ {
    move |err| PredictorError::Io {
        path: path.to_path_buf(),
        err,
    }
}
