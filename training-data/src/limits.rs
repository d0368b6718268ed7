//! The limits the importers enforce, so that memory and time stay proportional to what
//! an input file really holds. A small file cannot ask for gigabytes: decompression stops
//! at a bound derived from the compressed size, and a snapshot cannot list one object
//! (a pickle memo reference) many times over. Each limit is far above what real traces
//! reach (figures in docs/trace-format.md, "Limits"); reaching one is an error naming it.

/// Largest ratio of decompressed to compressed bytes accepted in an xz input (`.xz`).
///
/// Real PyTorch snapshot pickles compress about 30x with xz (the shared traces: 28x and
/// 29x); a stream that expands 1024x holds mostly repetition that no snapshot has, such
/// as a run of zeros.
pub const MAX_XZ_RATIO: u64 = 1024;

/// Largest ratio of decompressed to compressed bytes accepted in a native trace's zstd
/// payload.
///
/// The columnar payload compresses 6x to 11x (the bundled traces, the synthetic
/// families at level 19); 1024x leaves two orders of magnitude.
pub const MAX_ZSTD_RATIO: u64 = 1024;

/// Decompressed bytes always accepted, whatever the ratio: tiny inputs (an empty trace
/// compresses to a few bytes) must not trip the ratio limit, and 1 MiB costs nothing.
pub const MIN_DECOMPRESSED_LIMIT: u64 = 1 << 20;

/// The decompression limit for `compressed` input bytes at `ratio`.
pub fn decompressed_limit(compressed: u64, ratio: u64) -> u64 {
    compressed.saturating_mul(ratio).max(MIN_DECOMPRESSED_LIMIT)
}

/// Most events a synthetic trace may hold (`memcast trace gen`), checked as it is
/// generated, after each iteration.
///
/// Generation holds the whole program in memory, about 200 bytes per event at its
/// peak, so this keeps it near 2 GB. The largest recorded trace (`gpt2_generate_dynamic`,
/// 442,675 events) is 22 times smaller; the training presets stay below 2 million events
/// at the largest iteration counts anyone replays.
pub const MAX_SYNTH_EVENTS: u64 = 10_000_000;

/// Most bytes one allocation, or all live tensors together, may hold in a trace
/// (1 PiB), checked by [`crate::model::Trace::validate`].
///
/// The largest GPU memory today is 141 GB (H200), and the largest peak of requested
/// bytes among the bundled and corpus traces is 17.4 GB (`gat_dyngraph`); a size near
/// `u64::MAX` is corrupt input. Bounding sizes and their live sum here keeps every sum
/// and rounding of sizes downstream (the replays' live, requested and reserved bytes,
/// rounding up to a block size) far from overflowing, so that such a trace is refused
/// by name instead of replayed with wrapped figures.
pub const MAX_TRACE_BYTES: u64 = 1 << 50;

/// Bytes of a trace file read before its format is known: its first bytes must name a
/// format memcast reads, or nothing more is read. 4 KiB covers a JSON document's
/// leading white space.
pub const SNIFF_BYTES: usize = 4096;

/// Most bytes read from a trace source that is not a regular file (a pipe, a device),
/// which has no size to check: an endless stream is an error, not memory exhausted.
/// 16 GiB is over 300 times the largest snapshot pickle here (45 MiB, GPT-2
/// generation, decompressed).
pub const MAX_STREAM_BYTES: u64 = 16 << 30;

/// Most bytes of a settings or text file read (a corpus manifest, a placement plan, a
/// model's configuration or normalisation, a cost model): the largest real ones are a
/// few KiB.
pub const MAX_TEXT_FILE_BYTES: u64 = 64 << 20;

/// Most bytes of a model's weights file read: the default model's are 33 KB, and a
/// model 30,000 times larger is still read.
pub const MAX_WEIGHTS_BYTES: u64 = 1 << 30;
