//! The crate's error type: every variant says what is wrong and where.

use std::path::PathBuf;

/// Errors from reading, writing or checking traces.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The pickle stream itself is malformed (offset in bytes from the stream start).
    #[error("pickle: {what} at byte offset {offset}")]
    Pickle { offset: u64, what: String },
    /// The pickle is well formed but is not a PyTorch memory snapshot we understand.
    #[error("snapshot: {what}")]
    Snapshot { what: String },
    /// A snapshot event that makes no sense (index into `device_traces[0]`).
    #[error("snapshot event {index}: {what}")]
    SnapshotEvent { index: u64, what: String },
    /// A native trace file that is not one, is damaged, or is from a newer version.
    #[error("native trace: {what}")]
    Native { what: String },
    /// A trace that breaks the model's invariants (index into `Trace::events`).
    #[error("trace event {index}: {what}")]
    Invalid { index: u64, what: String },
    /// Bad parameters for a synthetic trace or the featurizer.
    #[error("invalid parameter: {0}")]
    Param(String),
}

impl TraceError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TraceError::Io {
            path: path.into(),
            source,
        }
    }
}
