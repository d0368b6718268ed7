//! `memcast-alloc`: a GPU memory allocator for deep learning, and the tools to compare
//! it with PyTorch's.
//!
//! - [`backend`]: the [`DeviceBackend`] trait (segments, copies,
//!   streams, events, time) with the `host` and `sim` backends and composable adaptors;
//! - `buddy`: segments as buddy trees (power-of-two blocks as index-linked nodes, runs
//!   of blocks for non-power-of-two requests); large segments keep no tree;
//! - [`extents`]: the placement index (blocks in address order, best fit over the free
//!   ones in TLSF bins);
//! - `slab`: size classes and slabs for small objects;
//! - `pool` + `maint` + `record` + `run_cache`: the [`Allocator`] (per-stream pools,
//!   caches of freed runs, growth, release) and its record table;
//! - [`placement`]: planned placement (the last iteration's plan of where large runs
//!   go);
//! - [`policy`]: the decisions a forecaster can take over (growth, release, advice);
//! - [`predictive`]: predictive mode: the online path from the allocator's events to
//!   the forecaster, and from its forecasts to advice;
//! - [`stats`]: what it counts; [`config`]: its knobs and `MEMCAST_ALLOC_CONF`;
//! - `shared`: a thread-safe wrapper ([`SharedAllocator`]);
//! - [`replay`]: trace replay through `memcast`, a PyTorch emulation, and `naive`.
//!
//! See docs/allocator.md for the design, the measurements and how to reproduce them.
//!
//! # Where `unsafe` lives
//!
//! Only where it must, each block with a `// SAFETY:` comment naming the invariant that
//! makes it sound:
//! - `table`: the unchecked `u32` index of the allocator's tables (ids only the
//!   allocator makes; a caller's handle is checked before it indexes anything);
//! - [`backend::host`]: the host backend's heap regions (allocation, copies within
//!   checked ranges);
//! - the CUDA backend ([`backend::cuda`] and its `cuda_host`, `cuda_vmm`,
//!   `cuda_kernels` modules): driver calls through `cudarc`'s raw API.
//!
//! Everything else, the allocator's logic included, is safe code; a handle, stream or
//! pointer a caller supplies is checked and refused with an [`AllocError`].

pub mod backend;
mod buddy;
mod check;
pub mod config;
mod error;
pub mod extents;
mod fxmap;
mod lookup;
mod maint;
mod pages;
pub mod placement;
pub mod policy;
mod pool;
pub mod predictive;
mod record;
pub mod replay;
mod run_cache;
mod shared;
mod slab;
mod small;
pub mod stats;
mod table;
pub mod tier;
mod window;

pub use backend::{DeviceBackend, DevicePtr, StreamId};
pub use config::AllocConfig;
pub use error::AllocError;
pub use pool::{Allocation, Allocator};
pub use shared::SharedAllocator;
pub use stats::AllocStats;
pub use window::Window;
