//! The crate's error types: every variant says what is wrong and with which values.

use crate::backend::{BackendError, DevicePtr, StreamId};

/// Errors from the allocator. None of them leaves the allocator inconsistent: after any
/// `Err`, `check_invariants()` holds and every live allocation is still valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// A request for zero bytes.
    #[error("zero-size allocation")]
    ZeroSize,
    /// A request larger than the device can ever hold (capacity or configured cap).
    #[error("request of {requested} bytes exceeds the largest the allocator takes, {capacity} bytes (the device capacity, or max_request where that is lower)")]
    TooLarge { requested: u64, capacity: u64 },
    /// The device (or a budget layer) refused memory, even after the allocator released
    /// its caches and retried. Every live allocation is unchanged (free memory may have been
    /// given back to the device).
    #[error("out of memory: {requested} bytes on stream {stream} (reserved {reserved}, allocated {allocated})")]
    OutOfMemory {
        requested: u64,
        stream: StreamId,
        reserved: u64,
        allocated: u64,
        #[source]
        source: BackendError,
    },
    /// A handle or pointer that this allocator never handed out (or from another allocator).
    #[error("unknown allocation {what}")]
    UnknownAllocation { what: String },
    /// A handle whose allocation was already freed.
    #[error("double free of allocation at {ptr}")]
    DoubleFree { ptr: DevicePtr },
    /// Freed on a stream other than the one it was allocated on (use `record_stream` to
    /// share an allocation across streams; free it on its own stream).
    #[error("allocation at {ptr} belongs to stream {owner}, freed on stream {given}")]
    WrongStream {
        ptr: DevicePtr,
        owner: StreamId,
        given: StreamId,
    },
    /// A stream id the backend does not know.
    #[error("unknown stream {0}")]
    UnknownStream(StreamId),
    /// The backend made a stream beyond the 65,536 the allocator can tell apart.
    #[error("stream {0} is beyond the 65536 streams memcast supports")]
    TooManyStreams(StreamId),
    /// Any other backend failure (not out of memory).
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A malformed `MEMCAST_ALLOC_CONF` string or configuration value.
    #[error("configuration: {0}")]
    Config(String),
    /// `check_invariants()` found the allocator's bookkeeping broken (a bug).
    #[error("invariant violated: {0}")]
    Invariant(String),
}
