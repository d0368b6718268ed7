//! Loading traces from files, whatever their format.

use std::io::Read;
use std::path::Path;

use crate::error::TraceError;
use crate::limits::{decompressed_limit, MAX_STREAM_BYTES, MAX_XZ_RATIO, SNIFF_BYTES};
use crate::model::Trace;
use crate::native;
use crate::snapshot::{self, SnapshotOptions};

const XZ_MAGIC: &[u8] = &[0xfd, b'7', b'z', b'X', b'Z', 0];

/// The formats [`load_trace`] recognises by their first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Native,
    PytorchSnapshot,
    /// A JSON trace document (`crate::json`).
    Json,
}

/// Loads a PyTorch snapshot pickle (plain or `.xz`) or a native trace, detected by
/// content, with default import options (trace name from the file name).
pub fn load_trace(path: &Path) -> Result<Trace, TraceError> {
    load_trace_with(path, &SnapshotOptions::default())
}

/// Like [`load_trace`], with explicit snapshot options (`opts.name` empty = file name).
/// Every trace loaded is checked ([`Trace::validate`]) before it is returned, so each
/// consumer sees only well-formed traces; an inconsistent one is an error naming the file
/// and the event index.
pub fn load_trace_with(path: &Path, opts: &SnapshotOptions) -> Result<Trace, TraceError> {
    let trace = decode_file(path, opts)?;
    trace.validate().map_err(|e| TraceError::InFile {
        path: path.to_path_buf(),
        err: Box::new(e),
    })?;
    Ok(trace)
}

/// Reads and decodes a file, whatever its format.
fn decode_file(path: &Path, opts: &SnapshotOptions) -> Result<Trace, TraceError> {
    let data = read_maybe_xz(path)?;
    let with_path = |e: TraceError| match e {
        TraceError::Io { .. } => e,
        other => TraceError::InFile {
            path: path.to_path_buf(),
            err: Box::new(other),
        },
    };
    match detect(&data) {
        Some(Format::Native) => native::decode(&data).map_err(with_path),
        Some(Format::Json) => {
            let mut t = crate::json::decode(&data).map_err(with_path)?;
            if t.meta.name.is_empty() {
                t.meta.name = trace_name(path);
            }
            Ok(t)
        }
        Some(Format::PytorchSnapshot) => {
            let mut opts = opts.clone();
            if opts.name.is_empty() {
                opts.name = trace_name(path);
            }
            snapshot::import_snapshot(&data, &opts).map_err(with_path)
        }
        None if data.is_empty() => Err(with_path(TraceError::Snapshot {
            what: "the file is empty (0 bytes), not a trace".into(),
        })),
        None => Err(with_path(TraceError::Snapshot {
            what:
                "unknown format: neither a memcast trace, a JSON trace document, a pickle, nor xz"
                    .into(),
        })),
    }
}

/// Detects the format from the first bytes.
pub fn detect(data: &[u8]) -> Option<Format> {
    if native::is_native(data) {
        Some(Format::Native)
    } else if data.first() == Some(&0x80) {
        Some(Format::PytorchSnapshot)
    } else if crate::json::is_json(data) {
        Some(Format::Json)
    } else {
        None
    }
}

/// Reads a file, transparently decompressing xz. The decompressed size is bounded by
/// [`MAX_XZ_RATIO`] times the compressed size, and an xz stream whose first bytes are
/// neither a native trace, a JSON trace document nor a pickle is refused before it is
/// decompressed further.
pub fn read_maybe_xz(path: &Path) -> Result<Vec<u8>, TraceError> {
    let data = read_sniffed(path)?;
    if !data.starts_with(XZ_MAGIC) {
        return Ok(data);
    }
    unxz(&data).map_err(|e| TraceError::InFile {
        path: path.to_path_buf(),
        err: Box::new(e),
    })
}

/// Reads a trace file whose first [`SNIFF_BYTES`] name a format memcast reads (xz, or
/// one [`detect`] knows); of any other only those bytes are read and returned, which
/// [`detect`] then refuses. A source that is not a regular file (a pipe, a device)
/// stops at [`MAX_STREAM_BYTES`]: `/dev/zero` is refused at once, not read until memory
/// runs out.
fn read_sniffed(path: &Path) -> Result<Vec<u8>, TraceError> {
    let io = |e| TraceError::io(path, e);
    let mut f = std::fs::File::open(path).map_err(io)?;
    let regular = f.metadata().map_err(io)?.is_file();
    let mut data = vec![0u8; SNIFF_BYTES];
    let mut n = 0;
    while n < data.len() {
        match f.read(&mut data[n..]).map_err(io)? {
            0 => break,
            k => n += k,
        }
    }
    data.truncate(n);
    // White space alone so far may still open a JSON document.
    let blank = data.iter().all(u8::is_ascii_whitespace);
    if !(data.starts_with(XZ_MAGIC) || detect(&data).is_some() || blank) {
        return Ok(data);
    }
    if regular {
        f.read_to_end(&mut data).map_err(io)?;
    } else {
        (&mut f)
            .take(MAX_STREAM_BYTES + 1 - data.len() as u64)
            .read_to_end(&mut data)
            .map_err(io)?;
        if data.len() as u64 > MAX_STREAM_BYTES {
            return Err(TraceError::InFile {
                path: path.to_path_buf(),
                err: Box::new(TraceError::Limit {
                    what: format!(
                        "not a regular file, and longer than {MAX_STREAM_BYTES} bytes (limit MAX_STREAM_BYTES)"
                    ),
                }),
            });
        }
    }
    Ok(data)
}

/// Reads at most `limit` bytes of `path`: a longer file, or an endless source (a pipe,
/// a device), is an error of kind `InvalidData` saying so, once `limit + 1` bytes are
/// read. For the settings and weights files memcast reads whole
/// ([`MAX_TEXT_FILE_BYTES`](crate::limits::MAX_TEXT_FILE_BYTES),
/// [`MAX_WEIGHTS_BYTES`](crate::limits::MAX_WEIGHTS_BYTES)).
pub fn read_bounded(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    std::fs::File::open(path)?
        .take(limit + 1)
        .read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("longer than {limit} bytes, more than a file of this kind holds"),
        ));
    }
    Ok(out)
}

/// [`read_bounded`] of a UTF-8 text file (not UTF-8: `InvalidData`).
pub fn read_bounded_text(path: &Path, limit: u64) -> std::io::Result<String> {
    String::from_utf8(read_bounded(path, limit)?).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

/// Decompresses an xz stream within the limits of [`read_maybe_xz`].
fn unxz(data: &[u8]) -> Result<Vec<u8>, TraceError> {
    // Where: how far decompression got, against the compressed size.
    let damaged = |e: std::io::Error, at: usize| {
        TraceError::Xz {
        what: format!(
            "the stream ({} bytes compressed) is damaged or cut short after {at} decompressed bytes: {e}",
            data.len()
        ),
    }
    };
    let limit = decompressed_limit(data.len() as u64, MAX_XZ_RATIO);
    let mut dec = liblzma::read::XzDecoder::new(data).take(limit + 1);
    // The first bytes say whether the content is worth decompressing at all.
    let mut out = vec![0u8; 8];
    let mut head = 0;
    while head < out.len() {
        match dec.read(&mut out[head..]).map_err(|e| damaged(e, head))? {
            0 => break,
            n => head += n,
        }
    }
    out.truncate(head);
    if detect(&out).is_none() {
        return Err(TraceError::Snapshot {
            what: if out.is_empty() {
                "the xz stream holds no data".into()
            } else {
                "the xz stream holds neither a memcast trace, a JSON trace document nor a pickle (its first bytes)".into()
            },
        });
    }
    if let Err(e) = dec.read_to_end(&mut out) {
        return Err(damaged(e, out.len()));
    }
    if out.len() as u64 > limit {
        return Err(TraceError::Limit {
            what: format!(
                "the xz stream of {} bytes expands to more than {limit} bytes, over {MAX_XZ_RATIO} times its size (limit MAX_XZ_RATIO; real snapshots expand about 30 times)",
                data.len()
            ),
        });
    }
    Ok(out)
}

/// A trace's name from its file name: `x.snapshot.pickle.xz` -> `x`.
pub fn trace_name(path: &Path) -> String {
    let mut name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    for ext in [
        ".xz",
        ".pickle",
        ".pkl",
        ".snapshot",
        ".mctrace",
        ".json",
        ".trace",
    ] {
        if let Some(s) = name.strip_suffix(ext) {
            name = s.to_string();
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An endless source whose first bytes name no format is refused after them, not
    /// read until memory runs out; a file longer than its kind's bound is an error once
    /// the bound is passed.
    #[cfg(unix)]
    #[test]
    fn endless_or_oversized_input_is_refused_without_reading_it_all() {
        let e = load_trace(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(
            e.contains("/dev/zero") && e.contains("unknown format"),
            "{e}"
        );
        let e = read_bounded(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("longer than 1048576 bytes"), "{e}");
        let dir = std::env::temp_dir().join(format!("memcast-io-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("t.txt");
        std::fs::write(&f, "0123456789").unwrap();
        assert_eq!(read_bounded_text(&f, 10).unwrap(), "0123456789");
        assert!(read_bounded(&f, 9).is_err());
        // A JSON document behind more white space than the first bytes read is read.
        let mut padded = vec![b' '; 2 * SNIFF_BYTES];
        padded.extend_from_slice(
            br#"{"format": "memcast-trace", "version": 1, "trace": {"meta": {"name": "t", "source": "x", "description": ""}, "static_blocks": [], "events": [{"time_us": 0, "kind": "IterationBoundary"}, {"time_us": 1, "kind": {"Alloc": {"id": 1, "bytes": 1024, "stream": 0}}}, {"time_us": 2, "kind": {"Free": {"id": 1}}}]}}"#,
        );
        let g = dir.join("t.json");
        std::fs::write(&g, padded).unwrap();
        assert_eq!(load_trace(&g).unwrap().events.len(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names_from_paths() {
        let n = |p: &str| trace_name(Path::new(p));
        assert_eq!(
            n("/a/gpt2_generate_dynamic.snapshot.pickle.xz"),
            "gpt2_generate_dynamic"
        );
        assert_eq!(n("r.mctrace"), "r");
    }

    #[test]
    fn unknown_and_missing_files_are_clear_errors() {
        let dir = std::env::temp_dir().join(format!("memcast-io-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("junk.bin");
        std::fs::write(&f, b"hello").unwrap();
        let e = load_trace(&f).unwrap_err().to_string();
        assert!(
            e.contains("junk.bin") && e.contains("unknown format"),
            "{e}"
        );
        let e = load_trace(&dir.join("missing")).unwrap_err().to_string();
        assert!(e.contains("missing"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_xz_json_document_loads_and_other_xz_content_names_the_formats() {
        use std::io::Write;
        let xz = |data: &[u8]| {
            let mut enc = liblzma::write::XzEncoder::new(Vec::new(), 6);
            enc.write_all(data).unwrap();
            enc.finish().unwrap()
        };
        let dir = std::env::temp_dir().join(format!("memcast-io-xz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("run.trace.json.xz");
        let doc = br#"{"format": "memcast-trace", "version": 1, "trace": {"events": [
            {"time_us": 0, "kind": "IterationBoundary"},
            {"time_us": 0, "kind": {"Alloc": {"id": 2, "bytes": 512, "stream": 0}}},
            {"time_us": 9, "kind": {"Free": {"id": 2}}},
            {"time_us": 9, "kind": "IterationBoundary"}]}}"#;
        std::fs::write(&f, xz(doc)).unwrap();
        let t = load_trace(&f).unwrap();
        assert_eq!((t.events.len(), t.meta.name.as_str()), (4, "run"));
        let g = dir.join("junk.xz");
        std::fs::write(&g, xz(b"hello, world")).unwrap();
        let e = load_trace(&g).unwrap_err().to_string();
        assert!(
            e.contains("junk.xz") && e.contains("JSON trace document"),
            "{e}"
        );
        // Cut short: named as a damaged xz stream, with how far it got.
        let whole = xz(doc);
        let h = dir.join("cut.trace.json.xz");
        std::fs::write(&h, &whole[..whole.len() - 20]).unwrap();
        let e = load_trace(&h).unwrap_err().to_string();
        assert!(
            e.contains("cut.trace.json.xz: xz: the stream (")
                && e.contains("damaged or cut short after"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
