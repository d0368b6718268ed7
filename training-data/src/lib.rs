//! `memcast-trace`: the step traces memcast learns from and replays.
//!
//! - `model`: events, static blocks, tensor metadata ([`Trace`], re-exported here).
//! - [`pickle`] + [`snapshot`]: import of PyTorch `torch.cuda.memory._snapshot()` pickles.
//! - [`native`]: the versioned binary format (optionally zstd); [`export`]: CSV / JSON Lines.
//! - [`io`]: [`io::load_trace`] reads any of them, detected by content, within the
//!   [`limits`] that keep memory proportional to what a file holds.
//! - [`output`]: writing every output file (symlinks followed, devices and FIFOs written
//!   in place, regular files through a temporary file and a rename).
//! - [`stats`]: summary statistics (`memcast trace stats`).
//! - [`synth`]: synthetic traces from computation graphs, with liveness analysis.
//! - [`features`]: the step featurizer, one implementation used offline and online.
//! - [`timeline`]: the GPU's timeline of a trace whose host ran ahead of it.

#![forbid(unsafe_code)]

pub mod bundled;
pub mod corpus;
mod error;
pub mod export;
pub mod features;
pub mod io;
pub mod json;
pub mod limits;
mod model;
pub mod native;
pub mod output;
pub mod pickle;
pub mod snapshot;
pub mod stats;
pub mod synth;
pub mod timeline;

pub use error::TraceError;
pub use model::{
    Event, EventKind, SourceSegmentEvent, StaticBlock, StreamId, TensorId, TensorMeta, Trace,
    TraceMeta,
};
