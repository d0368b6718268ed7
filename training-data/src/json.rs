//! The JSON trace document: a [`Trace`] as JSON, for writers that cannot produce the
//! native format (`memcast_torch`'s `Offload.write_trace`, written in Python).
//!
//! ```json
//! {"format": "memcast-trace", "version": 1, "trace": {
//!   "meta": {"name": "run", "source": "memcast-torch:offload", "description": ""},
//!   "static_blocks": [{"id": 1, "bytes": 4096, "stream": 0}],
//!   "events": [{"time_us": 0, "kind": "IterationBoundary"},
//!              {"time_us": 0, "kind": {"Alloc": {"id": 2, "bytes": 512, "stream": 0}}},
//!              {"time_us": 9, "kind": {"Access": {"id": 2, "write": false}}},
//!              {"time_us": 9, "kind": {"Free": {"id": 2}}}],
//!   "tensors": [{"id": 2, "size": 512, "producer": "b0.fwd", "consumers": ["b0.bwd"],
//!                "alloc_event": 1, "free_event": 3, "recompute_us": 120}],
//!   "source_segments": []}}
//! ```
//!
//! `trace` is the model's own serde form (`model.rs`); `tensors` and `source_segments`
//! may be left out (empty). Every command reads the document where it reads a trace
//! (detected by its first non-blank byte, `{`), and `memcast trace import DOC -o
//! X.mctrace` converts it. A malformed document is an error naming the line, the
//! column and the byte offset; an inconsistent trace (a free of a tensor that is not
//! live) names the event index, as for every format.

use serde::Deserialize;

use crate::error::TraceError;
use crate::model::{Event, SourceSegmentEvent, StaticBlock, TensorMeta, Trace, TraceMeta};

/// The `format` field's value.
pub const FORMAT: &str = "memcast-trace";
/// The document version this memcast reads.
pub const VERSION: u32 = 1;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc {
    format: String,
    version: u32,
    trace: Body,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    #[serde(default)]
    meta: TraceMeta,
    #[serde(default)]
    static_blocks: Vec<StaticBlock>,
    events: Vec<Event>,
    #[serde(default)]
    tensors: Vec<TensorMeta>,
    #[serde(default)]
    source_segments: Vec<SourceSegmentEvent>,
}

/// Whether `data` looks like a JSON document (its first non-blank byte, after a UTF-8
/// byte-order mark if any, is `{`).
pub fn is_json(data: &[u8]) -> bool {
    without_bom(data).iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// `data` without a leading UTF-8 byte-order mark (some editors write one; JSON
/// parsers refuse it).
fn without_bom(data: &[u8]) -> &[u8] {
    data.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(data)
}

/// Decodes a JSON trace document (not validated: [`crate::io::load_trace`] does that).
pub fn decode(data: &[u8]) -> Result<Trace, TraceError> {
    let bom = data.len() - without_bom(data).len();
    let data = &data[bom..];
    let doc: Doc = serde_json::from_slice(data).map_err(|e| TraceError::Json {
        what: e.to_string(),
        // In the file: after the byte-order mark.
        offset: bom as u64 + byte_offset(data, e.line(), e.column()),
    })?;
    if doc.format != FORMAT {
        return Err(TraceError::Json {
            what: format!("\"format\" is {:?}, not {FORMAT:?}", doc.format),
            offset: 0,
        });
    }
    if doc.version != VERSION {
        return Err(TraceError::Json {
            what: format!(
                "document version {}; this memcast reads version {VERSION}",
                doc.version
            ),
            offset: 0,
        });
    }
    let b = doc.trace;
    Ok(Trace {
        meta: b.meta,
        static_blocks: b.static_blocks,
        events: b.events,
        tensors: b.tensors,
        source_segments: b.source_segments,
    })
}

/// The byte offset of serde_json's 1-based line and column (column 0: the line's start).
fn byte_offset(data: &[u8], line: usize, column: usize) -> u64 {
    let mut off = 0usize;
    for _ in 1..line.max(1) {
        match data[off..].iter().position(|&b| b == b'\n') {
            Some(p) => off += p + 1,
            None => return data.len() as u64,
        }
    }
    (off + column.saturating_sub(1)).min(data.len()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"format": "memcast-trace", "version": 1, "trace": {
      "meta": {"name": "t", "source": "test", "description": ""},
      "static_blocks": [{"id": 1, "bytes": 4096, "stream": 0}],
      "events": [{"time_us": 0, "kind": "IterationBoundary"},
                 {"time_us": 0, "kind": {"Alloc": {"id": 2, "bytes": 512, "stream": 0}}},
                 {"time_us": 9, "kind": {"Access": {"id": 2, "write": false}}},
                 {"time_us": 9, "kind": {"Free": {"id": 2}}},
                 {"time_us": 9, "kind": "IterationBoundary"}],
      "tensors": [{"id": 2, "size": 512, "producer": "b0.fwd", "consumers": ["b0.bwd"],
                   "alloc_event": 1, "free_event": 3, "recompute_us": 120}]}}"#;

    #[test]
    fn a_document_decodes_to_the_trace_it_describes() {
        assert!(is_json(b"  \n{"));
        let t = decode(GOOD.as_bytes()).unwrap();
        t.validate().unwrap();
        assert_eq!(t.static_bytes(), 4096);
        assert_eq!(t.events.len(), 5);
        assert_eq!(t.iterations(), 1);
        assert_eq!(t.tensors[0].recompute_us, Some(120));
        // The model's serde form round-trips through the document.
        let doc = serde_json::json!({"format": FORMAT, "version": VERSION, "trace": t});
        assert_eq!(decode(doc.to_string().as_bytes()).unwrap(), t);
        // A UTF-8 byte-order mark before the document is read past (it was "unknown
        // format"), and an error's offset counts it.
        let bom = [&b"\xEF\xBB\xBF"[..], GOOD.as_bytes()].concat();
        assert!(is_json(&bom));
        assert_eq!(decode(&bom).unwrap(), t);
        let bad = [&b"\xEF\xBB\xBF"[..], b"{\"format\": x}"].concat();
        match decode(&bad).unwrap_err() {
            TraceError::Json { offset, .. } => assert_eq!(offset, 3 + 11),
            e => panic!("{e}"),
        }
    }

    #[test]
    fn bad_documents_name_the_offset_or_the_field() {
        let e = decode(GOOD.replace("\"Free\"", "\"Fre\"").as_bytes())
            .unwrap_err()
            .to_string();
        let at = GOOD.find("\"Free\"").unwrap() as u64;
        assert!(
            e.contains("unknown variant") && e.contains("byte offset"),
            "{e}"
        );
        let off: u64 = e
            .rsplit("byte offset ")
            .next()
            .unwrap()
            .trim_end_matches(')')
            .parse()
            .unwrap();
        assert!(off >= at && off < at + 12, "{e} (Free at {at})");
        let e = decode(&GOOD.as_bytes()[..100]).unwrap_err().to_string();
        assert!(e.contains("EOF") && e.contains("byte offset 99"), "{e}");
        let e = decode(GOOD.replace("\"version\": 1", "\"version\": 2").as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("version 2"), "{e}");
        let e = decode(GOOD.replace("memcast-trace", "other").as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"other\""), "{e}");
        let e = decode(b"{\"format\": \"memcast-trace\"}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing field"), "{e}");
    }

    /// Unknown fields are refused at every level of the document, not only its top: a
    /// misspelt optional field (`recompute_s` for `recompute_us`) would otherwise be
    /// read as absent.
    #[test]
    fn unknown_fields_are_refused_inside_the_trace_too() {
        for (from, to) in [
            ("\"recompute_us\": 120", "\"recompute_s\": 120"),
            ("\"write\": false", "\"write\": false, \"x\": 1"),
            (
                "{\"time_us\": 0, \"kind\": \"Iter",
                "{\"time_us\": 0, \"at\": 1, \"kind\": \"Iter",
            ),
            ("\"stream\": 0}]", "\"stream\": 0, \"x\": 1}]"),
            ("\"description\": \"\"", "\"description\": \"\", \"x\": 1"),
        ] {
            let doc = GOOD.replacen(from, to, 1);
            assert_ne!(doc, GOOD, "{from}");
            let e = decode(doc.as_bytes()).unwrap_err().to_string();
            assert!(e.contains("unknown field"), "{to}: {e}");
        }
        let doc = GOOD.replace("\"source_segments\"", "\"x\"");
        let doc = doc.replace("120}]}}", "120}], \"source_segments\": [{\"before_event\": 1, \"bytes\": 2, \"alloc\": true, \"x\": 0}]}}");
        let e = decode(doc.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("unknown field"), "{e}");
    }
}
