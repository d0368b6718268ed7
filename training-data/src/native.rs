//! The native trace format: versioned, compact, fast to load.
//!
//! Layout (all integers little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | magic `MEMCAST\0` |
//! | 8..10 | format version (currently [`VERSION`]) |
//! | 10..12 | flags: bit 0 = payload is zstd-compressed |
//! | 12..16 | CRC-32 of the uncompressed payload |
//! | 16..24 | stored payload length in bytes |
//! | 24.. | payload: [`postcard`] encoding of `Wire` |
//!
//! The payload is columnar so that varints stay short: times are deltas from the previous
//! event, ids are zigzag deltas from the previous id-carrying event (frees usually name a
//! recent allocation). See docs/trace-format.md for the measured size and load speed.

use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::TraceError;
use crate::limits::{decompressed_limit, MAX_ZSTD_RATIO};
use crate::model::{
    Event, EventKind, SourceSegmentEvent, StaticBlock, StreamId, TensorMeta, Trace, TraceMeta,
};

/// Current format version. Readers accept versions `1..=VERSION`.
pub const VERSION: u16 = 1;
const MAGIC: &[u8; 8] = b"MEMCAST\0";
const HEADER: usize = 24;
const FLAG_ZSTD: u16 = 1;

/// Whether `data` starts like a native trace.
pub fn is_native(data: &[u8]) -> bool {
    data.len() >= 8 && &data[..8] == MAGIC
}

/// Options for [`encode`] and [`save_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    /// zstd level (1..=22), or `None` for an uncompressed payload. Default `Some(9)`.
    pub zstd_level: Option<i32>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            zstd_level: Some(9),
        }
    }
}

const K_ALLOC: u8 = 0;
const K_FREE: u8 = 1;
const K_READ: u8 = 2;
const K_WRITE: u8 = 3;
const K_BOUNDARY: u8 = 4;

/// On-disk payload. Columns are parallel to the event list except where noted.
#[derive(Serialize, Deserialize)]
struct Wire {
    meta: TraceMeta,
    static_blocks: Vec<StaticBlock>,
    tensors: Vec<TensorMeta>,
    source_segments: Vec<SourceSegmentEvent>,
    /// One per event.
    kinds: Vec<u8>,
    /// One per event: time minus the previous event's time.
    dt_us: Vec<u64>,
    /// One per alloc/free/access: id minus the previous such event's id.
    did: Vec<i64>,
    /// One per alloc.
    bytes: Vec<u64>,
    /// One per alloc.
    streams: Vec<StreamId>,
}

fn to_wire(t: &Trace) -> Wire {
    let n = t.events.len();
    let mut w = Wire {
        meta: t.meta.clone(),
        static_blocks: t.static_blocks.clone(),
        tensors: t.tensors.clone(),
        source_segments: t.source_segments.clone(),
        kinds: Vec::with_capacity(n),
        dt_us: Vec::with_capacity(n),
        did: Vec::with_capacity(n),
        bytes: Vec::new(),
        streams: Vec::new(),
    };
    let (mut last_t, mut last_id) = (0u64, 0u64);
    for e in &t.events {
        w.dt_us.push(e.time_us.wrapping_sub(last_t));
        last_t = e.time_us;
        let id = match e.kind {
            EventKind::Alloc { id, bytes, stream } => {
                w.kinds.push(K_ALLOC);
                w.bytes.push(bytes);
                w.streams.push(stream);
                Some(id)
            }
            EventKind::Free { id } => {
                w.kinds.push(K_FREE);
                Some(id)
            }
            EventKind::Access { id, write } => {
                w.kinds.push(if write { K_WRITE } else { K_READ });
                Some(id)
            }
            EventKind::IterationBoundary => {
                w.kinds.push(K_BOUNDARY);
                None
            }
        };
        if let Some(id) = id {
            w.did.push(id.wrapping_sub(last_id) as i64);
            last_id = id;
        }
    }
    w
}

fn bad(what: impl Into<String>) -> TraceError {
    TraceError::Native { what: what.into() }
}

fn from_wire(w: Wire) -> Result<Trace, TraceError> {
    let n = w.kinds.len();
    if w.dt_us.len() != n {
        return Err(bad(format!("{} kinds but {} times", n, w.dt_us.len())));
    }
    let mut events = Vec::with_capacity(n);
    let (mut t, mut id) = (0u64, 0u64);
    let (mut di, mut ai) = (0usize, 0usize);
    for (i, (&k, &dt)) in w.kinds.iter().zip(&w.dt_us).enumerate() {
        t = t.wrapping_add(dt);
        let mut next_id = || -> Result<u64, TraceError> {
            let d = *w
                .did
                .get(di)
                .ok_or_else(|| bad(format!("event {i}: id column too short")))?;
            di += 1;
            id = id.wrapping_add(d as u64);
            Ok(id)
        };
        let kind = match k {
            K_ALLOC => {
                let id = next_id()?;
                let (bytes, stream) = match (w.bytes.get(ai), w.streams.get(ai)) {
                    (Some(&b), Some(&s)) => (b, s),
                    _ => return Err(bad(format!("event {i}: size column too short"))),
                };
                ai += 1;
                EventKind::Alloc { id, bytes, stream }
            }
            K_FREE => EventKind::Free { id: next_id()? },
            K_READ | K_WRITE => EventKind::Access {
                id: next_id()?,
                write: k == K_WRITE,
            },
            K_BOUNDARY => EventKind::IterationBoundary,
            other => return Err(bad(format!("event {i}: unknown event kind {other}"))),
        };
        events.push(Event { time_us: t, kind });
    }
    if di != w.did.len() || ai != w.bytes.len() {
        return Err(bad("columns are longer than the event list"));
    }
    Ok(Trace {
        meta: w.meta,
        static_blocks: w.static_blocks,
        events,
        tensors: w.tensors,
        source_segments: w.source_segments,
    })
}

/// Encodes a trace into the native format.
pub fn encode(t: &Trace, opts: WriteOptions) -> Result<Vec<u8>, TraceError> {
    let payload =
        postcard::to_allocvec(&to_wire(t)).map_err(|e| bad(format!("encoding failed: {e}")))?;
    let crc = crc32fast::hash(&payload);
    let (flags, stored) = match opts.zstd_level {
        Some(level) => (
            FLAG_ZSTD,
            zstd::bulk::compress(&payload, level).map_err(|e| bad(format!("zstd: {e}")))?,
        ),
        None => (0, payload),
    };
    let mut out = Vec::with_capacity(HEADER + stored.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&(stored.len() as u64).to_le_bytes());
    out.extend_from_slice(&stored);
    Ok(out)
}

/// Decodes a native trace. Errors name what is wrong (magic, version, length, checksum).
pub fn decode(data: &[u8]) -> Result<Trace, TraceError> {
    if data.len() < HEADER {
        return Err(bad(format!(
            "file is {} bytes, shorter than the {HEADER}-byte header",
            data.len()
        )));
    }
    if !is_native(data) {
        return Err(bad("bad magic (not a memcast trace)"));
    }
    let u16_at = |o: usize| u16::from_le_bytes([data[o], data[o + 1]]);
    let version = u16_at(8);
    if version == 0 {
        return Err(bad(
            "format version 0 at byte offset 8, which no memcast writes: the header is damaged",
        ));
    }
    if version > VERSION {
        return Err(bad(format!(
            "format version {version}; this memcast reads versions 1..={VERSION} (upgrade memcast)"
        )));
    }
    let flags = u16_at(10);
    if flags & !FLAG_ZSTD != 0 {
        return Err(bad(format!("unknown flags 0x{flags:04x} in the header")));
    }
    let crc = u32::from_le_bytes(data[12..16].try_into().expect("4 bytes"));
    let len = u64::from_le_bytes(data[16..24].try_into().expect("8 bytes"));
    let body = &data[HEADER..];
    if len != body.len() as u64 {
        return Err(bad(format!(
            "header says {len} payload bytes at offset {HEADER}, file has {} (truncated or padded)",
            body.len()
        )));
    }
    let decompressed;
    let payload: &[u8] = if flags & FLAG_ZSTD != 0 {
        decompressed = unzstd(body)?;
        &decompressed
    } else {
        body
    };
    let actual = crc32fast::hash(payload);
    if actual != crc {
        return Err(bad(format!(
            "checksum mismatch (stored {crc:08x}, computed {actual:08x}): the file is damaged"
        )));
    }
    // Decoded through a deserializer kept in hand, so that an error can say how far it
    // read (the slice flavor's remainder).
    let mut de = postcard::Deserializer::from_bytes(payload);
    let wire = match <Wire as serde::Deserialize>::deserialize(&mut de) {
        Ok(w) => w,
        Err(e) => {
            let at = payload.len() - de.finalize().map_or(0, |rest| rest.len());
            let place = if flags & FLAG_ZSTD != 0 {
                format!(
                    "byte {at} of the {} decompressed payload bytes",
                    payload.len()
                )
            } else {
                format!("payload byte {at} (file offset {})", HEADER + at)
            };
            return Err(bad(format!(
                "payload does not decode, stopped at {place}: {e} (the checksum matches: \
                 written by another program or version)"
            )));
        }
    };
    from_wire(wire)
}

/// Decompresses the zstd payload, no further than the size its frame header declares and
/// [`MAX_ZSTD_RATIO`] times its compressed size.
fn unzstd(body: &[u8]) -> Result<Vec<u8>, TraceError> {
    let limit = decompressed_limit(body.len() as u64, MAX_ZSTD_RATIO);
    let over = |what: String| {
        TraceError::Limit {
        what: format!(
            "the zstd payload at offset {HEADER} ({} bytes) {what}, over {MAX_ZSTD_RATIO} times its size (limit MAX_ZSTD_RATIO; real traces expand about 10 times)",
            body.len()
        ),
    }
    };
    let declared = zstd::zstd_safe::get_frame_content_size(body).ok().flatten();
    if let Some(d) = declared.filter(|&d| d > limit) {
        return Err(over(format!("declares {d} bytes")));
    }
    let cap = declared.unwrap_or(limit);
    let damaged =
        |e: std::io::Error| bad(format!("zstd payload at offset {HEADER} is damaged: {e}"));
    let mut out = Vec::with_capacity(cap.min(limit) as usize);
    zstd::stream::read::Decoder::with_buffer(body)
        .map_err(damaged)?
        .take(cap + 1)
        .read_to_end(&mut out)
        .map_err(damaged)?;
    match declared {
        Some(d) if out.len() as u64 > d => Err(bad(format!(
            "zstd payload at offset {HEADER} is damaged: it holds more than the {d} bytes its frame declares"
        ))),
        Some(d) if (out.len() as u64) < d => Err(bad(format!(
            "zstd payload at offset {HEADER} is damaged: it holds {} of the {d} bytes its frame declares",
            out.len()
        ))),
        None if out.len() as u64 > limit => Err(over(format!("expands to more than {limit} bytes"))),
        _ => Ok(out),
    }
}

/// Writes `trace` to `path` with the default options.
pub fn save(trace: &Trace, path: &Path) -> Result<(), TraceError> {
    save_with(trace, path, WriteOptions::default())
}

/// Writes `trace` to `path` through [`crate::output`]: atomically for a regular file
/// (temporary file, then rename), in place for a device or FIFO, through symlinks.
pub fn save_with(trace: &Trace, path: &Path, opts: WriteOptions) -> Result<(), TraceError> {
    let data = encode(trace, opts)?;
    crate::output::write_bytes(path, &data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Trace {
        let ev = |time_us, kind| Event { time_us, kind };
        Trace {
            meta: TraceMeta {
                name: "t".into(),
                source: "test".into(),
                description: String::new(),
            },
            static_blocks: vec![StaticBlock {
                id: 0,
                bytes: 4096,
                stream: 0,
            }],
            events: vec![
                ev(0, EventKind::IterationBoundary),
                ev(
                    5,
                    EventKind::Alloc {
                        id: 1,
                        bytes: 1000,
                        stream: 1,
                    },
                ),
                ev(7, EventKind::Access { id: 1, write: true }),
                ev(
                    9,
                    EventKind::Access {
                        id: 0,
                        write: false,
                    },
                ),
                ev(9, EventKind::Free { id: 1 }),
                ev(20, EventKind::Free { id: 0 }),
                ev(21, EventKind::IterationBoundary),
            ],
            tensors: vec![TensorMeta {
                id: 1,
                size: 1000,
                producer: Some("mm".into()),
                ..Default::default()
            }],
            source_segments: vec![SourceSegmentEvent {
                before_event: 1,
                bytes: 2 << 20,
                alloc: true,
            }],
        }
    }

    #[test]
    fn round_trips_with_and_without_zstd() {
        let t = sample();
        for level in [None, Some(1), Some(19)] {
            let data = encode(&t, WriteOptions { zstd_level: level }).unwrap();
            assert_eq!(decode(&data).unwrap(), t);
        }
    }

    #[test]
    fn damage_is_detected_with_a_clear_error() {
        let data = encode(&sample(), WriteOptions { zstd_level: None }).unwrap();
        let msg = |d: &[u8]| decode(d).unwrap_err().to_string();
        assert!(msg(&data[..10]).contains("shorter than the 24-byte header"));
        assert!(msg(&data[..data.len() - 1]).contains("truncated"));
        let mut d = data.clone();
        d[0] = b'X';
        assert!(msg(&d).contains("bad magic"));
        let mut d = data.clone();
        d[8] = 9;
        assert!(msg(&d).contains("format version 9"));
        let mut d = data.clone();
        let last = d.len() - 1;
        d[last] ^= 0x40;
        assert!(msg(&d).contains("checksum mismatch"));
        // A payload whose checksum matches but which does not decode: the error says
        // how far decoding read (cut short after 5 bytes, header fixed up to match: here
        // the start of a string at byte 3 that it could not take).
        for level in [None, Some(3)] {
            let payload = postcard::to_allocvec(&to_wire(&sample())).unwrap();
            let cut = &payload[..5];
            let stored = match level {
                Some(l) => zstd::bulk::compress(cut, l).unwrap(),
                None => cut.to_vec(),
            };
            let mut d = data[..HEADER].to_vec();
            d[10..12].copy_from_slice(&(if level.is_some() { FLAG_ZSTD } else { 0 }).to_le_bytes());
            d[12..16].copy_from_slice(&crc32fast::hash(cut).to_le_bytes());
            d[16..24].copy_from_slice(&(stored.len() as u64).to_le_bytes());
            d.extend_from_slice(&stored);
            let m = msg(&d);
            let want = if level.is_some() {
                "stopped at byte 3 of the 5 decompressed payload bytes"
            } else {
                "stopped at payload byte 3 (file offset 27)"
            };
            assert!(m.contains(want), "{m}");
        }
        // Every single-byte corruption is an error or a faithful decode, never a panic.
        for i in 0..data.len() {
            let mut d = data.clone();
            d[i] = d[i].wrapping_add(1);
            let _ = decode(&d);
        }
    }
}
