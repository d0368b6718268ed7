//! Loading traces from files, whatever their format.

use std::io::Read;
use std::path::Path;

use crate::error::TraceError;
use crate::limits::{decompressed_limit, MAX_XZ_RATIO};
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
    let data = std::fs::read(path).map_err(|e| TraceError::io(path, e))?;
    if !data.starts_with(XZ_MAGIC) {
        return Ok(data);
    }
    unxz(&data).map_err(|e| TraceError::InFile {
        path: path.to_path_buf(),
        err: Box::new(e),
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
