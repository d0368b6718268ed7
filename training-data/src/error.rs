//! The crate's error type: every variant says what is wrong and where.

use std::path::PathBuf;

/// Errors from reading, writing or checking traces.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    // The message includes the cause (and is not marked `#[source]`) so that both
    // `to_string()` and anyhow's `{:#}` chains print it exactly once.
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
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
    /// An xz-compressed input whose stream is damaged or truncated.
    #[error("xz: {what}")]
    Xz { what: String },
    /// A JSON trace document that is malformed or not one (`json.rs`).
    #[error("json trace: {what} (byte offset {offset})")]
    Json { what: String, offset: u64 },
    /// A trace that breaks the model's invariants (index into `Trace::events`).
    #[error("trace event {index}: {what}")]
    Invalid { index: u64, what: String },
    /// A static block that breaks them (index into `Trace::static_blocks`).
    #[error("static block {index}: {what}")]
    InvalidStatic { index: u64, what: String },
    /// An input that reaches one of the limits of [`crate::limits`] (named in `what`).
    #[error("limit reached: {what}")]
    Limit { what: String },
    /// Any of the above, in a named file.
    #[error("{path}: {err}")]
    InFile { path: PathBuf, err: Box<TraceError> },
    /// Bad parameters for a synthetic trace or the featurizer.
    #[error("invalid parameter: {0}")]
    Param(String),
}

impl TraceError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TraceError::Io {
            path: path.into(),
            err: source,
        }
    }
}
